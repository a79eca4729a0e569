package bench

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestWorkloadsVerify runs every workload at toy size on every in-process system (RabbitMQ
// needs a server and is left to the driver and TestRabbitWorkloadsVerify; warren-amqp's AMQP
// server runs in this process, so it is here) and requires the verification to pass: nothing
// lost, nothing duplicated, the order kept where the system promises it.
func TestWorkloadsVerify(t *testing.T) {
	sz := QuickSizes()
	sz.W1, sz.W2, sz.W3 = 5000, 5000, 5000
	sz.S2Messages = 2000
	cases, err := CaseIDs(MemoryWorkloads, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, system := range SuiteSystems(false) {
		if NeedsRabbit(system) {
			continue
		}
		for _, c := range cases {
			verifyCase(t, system, c, sz)
		}
	}
}

// rabbitEnv names the variable that points the tests at a RabbitMQ, as in contrib/rabbitmq's
// tests; CI sets it after starting one (rabbitmq.sh).
const rabbitEnv = "WARREN_RABBITMQ_URL"

// TestRabbitWorkloadsVerify runs the workloads at toy size on the systems that talk to
// RabbitMQ, when $WARREN_RABBITMQ_URL says where one is (else it skips; set, the node must be
// reachable).
func TestRabbitWorkloadsVerify(t *testing.T) {
	needRabbit(t)
	sz := QuickSizes()
	sz.W1, sz.W2, sz.W3, sz.S2Messages = 2000, 2000, 2000, 1000
	sz.W4Queue, sz.W4Requeue, sz.S1Measure, sz.S1Batch = 2000, 200, 1000, 250
	cases, err := CaseIDs("W1,W2,W3,W4,S1/1k,S2/10,S2/10kq", true)
	if err != nil {
		t.Fatal(err)
	}
	for _, system := range Systems() {
		if !NeedsRabbit(system) || specs[system].Durable {
			continue
		}
		for _, c := range cases {
			verifyCase(t, system, c, sz)
		}
	}
}

// needRabbit points the bench at the RabbitMQ that $WARREN_RABBITMQ_URL names, or skips the
// test when it is not set; set, the node must be reachable.
func needRabbit(t *testing.T) {
	t.Helper()
	url := os.Getenv(rabbitEnv)
	if url == "" {
		t.Skipf("%s is not set: no RabbitMQ to run the systems that need one against (./rabbitmq.sh start, then %s=%s)", rabbitEnv, rabbitEnv, RabbitURL)
	}
	RabbitURL = url
	if err := ProbeRabbit(); err != nil {
		t.Fatalf("%s is set: RabbitMQ must be reachable there: %v", rabbitEnv, err)
	}
}

// TestDurableWorkloadsVerify runs the durable suite's workloads at toy size on the durable
// systems that need no server (each warren sync policy and JetStream's file storage), and, on
// warren's durable broker, the in-memory suite's other workloads too.
func TestDurableWorkloadsVerify(t *testing.T) {
	toy := QuickSizes()
	toy.W1, toy.W2, toy.W3, toy.S2Messages = 2000, 2000, 2000, 1000
	toy.D1, toy.D2 = 64*20, 4000
	toy.W4Queue, toy.W4Requeue, toy.S1Measure, toy.S1Batch = 2000, 200, 1000, 250
	// An fsync per publish (a single publisher under SyncAlways) costs 0.1–1 ms: fewer there.
	synced := toy
	synced.W1, synced.D1 = 300, 64*5
	cases, err := CaseIDs(DurableWorkloads, true)
	if err != nil {
		t.Fatal(err)
	}
	more, err := CaseIDs("W2,W3,W4,S1/1k,S2/10", true)
	if err != nil {
		t.Fatal(err)
	}
	for _, system := range SuiteSystems(true) {
		if NeedsRabbit(system) {
			continue
		}
		sz := toy
		if system == "warren-durable-always" || system == "nats-jetstream-file-sync" {
			sz = synced
		}
		for _, c := range cases {
			verifyCase(t, system, c, sz)
		}
		if system == "warren-durable-never" {
			for _, c := range more {
				verifyCase(t, system, c, sz)
			}
		}
	}
}

// verifyCase runs case c on system at sizes sz and requires the verification to pass, or the
// n/a its spec gives.
func verifyCase(t *testing.T, system string, c Case, sz Sizes) {
	t.Helper()
	spec, err := Lookup(system)
	if err != nil {
		t.Fatal(err)
	}
	t.Run(system+"/"+c.ID, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		t0 := time.Now()
		r := Run(ctx, system, c, sz)
		if why, na := spec.NA[c.Workload]; na {
			if r.Skipped != why {
				t.Fatalf("want n/a (%s), got %+v", why, r)
			}
			return
		}
		t.Logf("%s %s: %d msgs in %s, metrics %v, notes %v", system, c.ID, r.Messages, time.Since(t0).Round(time.Millisecond), r.Metrics, r.Notes)
		if !r.OK {
			t.Fatalf("%s: %+v", r.Error, r)
		}
		if r.Messages == 0 || len(r.Metrics) == 0 {
			t.Fatalf("nothing measured: %+v", r)
		}
		if c.Workload == "W4" && system != "watermill-gochannel" && r.Metrics["order_original"] != 1 {
			t.Logf("%s: order after requeue not original (%v)", system, r.Notes)
		}
	})
}

// TestChanMinBaselines checks what the report relies on: chan-min is the in-memory suite's
// first system (its baseline), and chan-min-unbounded takes every message of the run with
// nobody receiving, whatever the workload's bound.
func TestChanMinBaselines(t *testing.T) {
	if got := SuiteSystems(false); len(got) < 3 || got[0] != "chan-min" || got[1] != "chan-min-unbounded" || got[2] != "chan" {
		t.Fatalf("in-memory suite %v: want chan-min, chan-min-unbounded, chan first", got)
	}
	spec, err := Lookup("chan-min-unbounded")
	if err != nil {
		t.Fatal(err)
	}
	sys, err := spec.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	const n = 10_000
	if err := sys.DeclareQueue("q", Config{Capacity: 4096, Messages: n}); err != nil {
		t.Fatal(err)
	}
	p, err := sys.Producer()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- publishSeq(p, "q", 0, n) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("publishing %d messages with nobody receiving blocked: the buffer is bounded", n)
	}
}

func TestTopicKeysMatchOnePattern(t *testing.T) {
	for i := range 30 {
		for j := range 30 {
			if got, want := topicMatch(TopicPattern(j), TopicKey(i)), i == j; got != want {
				t.Fatalf("pattern %q, key %q: match %v, want %v", TopicPattern(j), TopicKey(i), got, want)
			}
		}
	}
	if natsPattern("a.1.#") != "a.1.>" || natsPattern("*.1") != "*.1" {
		t.Fatal("natsPattern")
	}
}

// topicMatch is a naive AMQP topic matcher for the test.
func topicMatch(pattern, key string) bool {
	return match(split(pattern), split(key))
}

func split(s string) []string {
	var out []string
	start := 0
	for i := range len(s) {
		if s[i] == '.' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

func match(p, k []string) bool {
	if len(p) == 0 {
		return len(k) == 0
	}
	if p[0] == "#" {
		for i := 0; i <= len(k); i++ {
			if match(p[1:], k[i:]) {
				return true
			}
		}
		return false
	}
	if len(k) == 0 {
		return false
	}
	return (p[0] == "*" || p[0] == k[0]) && match(p[1:], k[1:])
}

func TestCheckerAndOrder(t *testing.T) {
	c := newChecker(130)
	for _, s := range []uint64{0, 5, 129, 5, 200} {
		c.mark(s)
	}
	if c.dups.Load() != 1 || c.bad.Load() != 1 || c.missing() != 127 {
		t.Fatalf("dups %d bad %d missing %d", c.dups.Load(), c.bad.Load(), c.missing())
	}
	o := newOrder(2)
	for _, s := range []uint64{0, 1, 3, 2, 4, 2} {
		o.see(s)
	}
	if o.violations != 1 {
		t.Fatalf("violations %d", o.violations)
	}
}

// TestRecoverySteps runs -recovery's steps at toy size in this process: a backlog filled and
// closed, opened again and drained (every message back once, in order; the segments gone), and
// a queue held at a steady depth.
func TestRecoverySteps(t *testing.T) {
	const n = 3000
	dir := t.TempDir()
	fill := fillClosed(t, dir, n, SyncNever)
	if fill.Metrics["backlog_disk_bytes"] < n*BodySize {
		t.Fatalf("the log holds %v bytes for %d messages of %d bytes", fill.Metrics["backlog_disk_bytes"], n, BodySize)
	}
	open := RunOpen(t.Context(), "recovery/open-clean", dir, n, SyncNever)
	t.Logf("open: %v", open.Metrics)
	if !open.OK {
		t.Fatalf("open: %+v", open)
	}
	if open.Metrics["released_disk_files"] != 1 || open.Metrics["open_ms"] <= 0 {
		t.Fatalf("open: %v", open.Metrics)
	}
	steady := RunSteady(t.Context(), t.TempDir(), 1000, 5000)
	t.Logf("steady: %v", steady.Metrics)
	if !steady.OK || steady.Metrics["disk_max_bytes"] <= 0 || steady.Metrics["live_bytes"] <= 0 {
		t.Fatalf("steady: %+v", steady)
	}
}

// TestBacklogSteps runs -backlog's steps at toy size in this process, on the systems that need
// no server: each system's fill and drain with its readings, W1 on an empty queue and into the
// backlog; warren-durable's open after a clean Close (recovery's steps, under SyncInterval)
// with the heap read.
func TestBacklogSteps(t *testing.T) {
	for _, s := range BacklogSystems {
		if !NeedsRabbit(s.Spec) {
			checkBacklogSteps(t, s.Name)
		}
	}

	const n = 3000
	dir := t.TempDir()
	fill := fillClosed(t, dir, n, SyncInterval)
	open := RunOpen(t.Context(), "backlog/open-clean", dir, n, SyncInterval)
	if !open.OK || open.Metrics["open_heap_live_bytes"] <= 0 || open.Metrics["drain_peak_rss_bytes"] <= 0 || open.Metrics["open_budget_used_bytes"] < n*BodySize {
		t.Fatalf("open: %+v", open)
	}
	// The open measures the broker as the fill left it: its messages cost what they cost when
	// published (a listener, say, would add a Message to each).
	if o, f := open.Metrics["open_budget_used_bytes"], fill.Metrics["fill_budget_used_bytes"]; o > f {
		t.Fatalf("the memory budget counts %v bytes after the open, %v after the fill", o, f)
	}
}

// TestRabbitBacklogSteps runs -backlog's steps at toy size on rabbitmq-durable, when
// $WARREN_RABBITMQ_URL says where rabbitmq.sh's node is: the readings are the node's (its
// beam.smp's RSS and bytes written, its data directory).
func TestRabbitBacklogSteps(t *testing.T) {
	needRabbit(t)
	for _, s := range BacklogSystems {
		if NeedsRabbit(s.Spec) {
			checkBacklogSteps(t, s.Name)
		}
	}
}

// checkBacklogSteps runs the backlog steps that are a bench case on system at toy size, and
// checks their readings: the fill and the drain with memory, disk and bytes written, W1 on an
// empty queue and into the backlog.
func checkBacklogSteps(t *testing.T, system string) {
	t.Helper()
	const n, w1 = 3000, 2000
	spec, err := BacklogSpec(system)
	if err != nil {
		t.Fatal(err)
	}
	info, err := Lookup(spec)
	if err != nil {
		t.Fatal(err)
	}
	r := RunBacklog(t.Context(), system, BacklogFillDrain, n, w1)
	t.Logf("%s: %v", system, r.Metrics)
	if !r.OK || r.System != system || r.Messages != n {
		t.Fatalf("%s: %+v", system, r)
	}
	m := r.Metrics
	if m["full_rss_bytes"] <= 0 || m["drain_peak_rss_bytes"] <= 0 || m["drain_rate"] <= 0 {
		t.Fatalf("%s: memory or drain not read: %v", system, m)
	}
	// The heap is read where the messages are in this process.
	if _, ok := m["full_heap_live_bytes"]; ok == info.ClientOnly || !info.ClientOnly && m["drain_peak_heap_live_bytes"] <= 0 {
		t.Fatalf("%s: the heap read %v, in this process %v: %v", system, ok, !info.ClientOnly, m)
	}
	if m["total_wchar_bytes"] < m["fill_wchar_bytes"] {
		t.Fatalf("%s: the fill and the drain wrote less than the fill: %v", system, m)
	}
	// A warren broker counts at least every body in its memory budget.
	if used, ok := m["full_budget_used_bytes"]; ok != strings.HasPrefix(system, "warren-") || ok && (used < n*BodySize || m["budget_limit_bytes"] <= 0) {
		t.Fatalf("%s: the memory budget read %v, used %v, limit %v", system, ok, used, m["budget_limit_bytes"])
	}
	if info.Durable {
		// Every body went to disk: at least the body bytes were written, and held at the
		// full backlog.
		if m["fill_wchar_bytes"] < n*BodySize || m["full_disk_bytes"]-m["start_disk_bytes"] < n*BodySize {
			t.Fatalf("%s: the fill wrote %v bytes and the disk grew by %v for %d bodies of %d bytes", system, m["fill_wchar_bytes"], m["full_disk_bytes"]-m["start_disk_bytes"], n, BodySize)
		}
	} else if _, ok := m["full_disk_bytes"]; ok || m["fill_wchar_bytes"] >= n*BodySize {
		t.Fatalf("%s: in memory, yet disk or writes: %v", system, m)
	}

	for _, step := range []string{BacklogW1Empty, BacklogW1Full} {
		r := RunBacklog(t.Context(), system, step, n, w1)
		t.Logf("%s %s: %v", system, step, r.Metrics)
		want := w1
		if step == BacklogW1Full {
			want += n
		}
		if !r.OK || r.Messages != want || r.Metrics["rate"] <= 0 || r.Metrics["peak_rss_bytes"] <= 0 {
			t.Fatalf("%s %s: %+v", system, step, r)
		}
		// A client of the node reports the node's RSS, which holds the messages.
		if _, ok := r.Metrics["node_peak_rss_bytes"]; ok != info.ClientOnly {
			t.Fatalf("%s %s: the node's RSS read %v, a client of the node %v", system, step, ok, info.ClientOnly)
		}
	}
}

// TestReadIO checks the parsing of /proc/<pid>/io, and that a write counts in wchar.
func TestReadIO(t *testing.T) {
	before, err := readIO("/proc/self/io")
	if err != nil {
		t.Skipf("no /proc/self/io here: %v", err)
	}
	if err := os.WriteFile(t.TempDir()+"/x", make([]byte, 1<<16), 0o644); err != nil {
		t.Fatal(err)
	}
	after, err := readIO("/proc/self/io")
	if err != nil {
		t.Fatal(err)
	}
	if d := after.minus(before); d.wchar < 1<<16 {
		t.Fatalf("wrote 64 KiB, wchar grew by %d", d.wchar)
	}
}

// fillClosed fills a backlog of n messages in dir under the sync policy named sync (RunFill)
// and closes the broker.
func fillClosed(t *testing.T, dir string, n int, sync string) Result {
	t.Helper()
	fill, b := RunFill(dir, n, sync)
	if !fill.OK || b == nil {
		t.Fatalf("fill: %+v", fill)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	return fill
}

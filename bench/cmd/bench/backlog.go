package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warrenmq/warren/bench"
)

// -backlog: what a backlog of N persistent messages in one durable queue costs each system
// (bench/backlog.go). Every step runs in a child process of its own:
//
//   - fill-drain, every system: fill the queue, read the heap, RSS, disk and bytes written at
//     the full backlog, drain it (every message once, in order), sampling the heap and RSS.
//   - warren-durable's open, after a clean Close and after SIGKILL: -recovery's fill and open
//     steps (recovery.go) under the backlog's sync policy and size.
//   - every system's W1 on an empty queue, and W1 into the full backlog.

// backlogTimeout is a -backlog child's default limit: a slow peer fills and drains 10M
// messages in one child.
const backlogTimeout = 2 * time.Hour

func backlogDefaultSystems() string {
	var names []string
	for _, s := range bench.BacklogSystems {
		names = append(names, s.Name)
	}
	return strings.Join(names, ",")
}

func backlogChild(o options) int {
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	// A RabbitMQ queue must not expire while the child fills it (publishing is no use).
	bench.RabbitQueueExpires = o.timeout + time.Minute
	stop, err := startProfiles(o) // the whole step's
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer stop()
	printResult(bench.RunBacklog(ctx, o.system, o.step, o.backlogN, o.backlogW1))
	return 0
}

// backlogStep runs one step of the fill-drain or W1 kind on system in a child.
func backlogStep(o options, system, step string) bench.Result {
	args := []string{"-child", "-backlog", "-system", system, "-step", step,
		"-n", strconv.Itoa(o.backlogN), "-backlog-w1", strconv.Itoa(o.backlogW1),
		"-timeout", o.timeout.String(), "-rabbit-window", strconv.Itoa(bench.RabbitConfirmWindow)}
	if bench.DurableDir != "" {
		args = append(args, "-dir", bench.DurableDir)
	}
	return childStep(o, args, system, "backlog/"+step, false)
}

// The open variants of warren-durable's backlog: openVariants' first two.
var backlogOpens = openVariants[:2]

// backlogSession is one run of the driver: its machine, command and sizes.
type backlogSession struct {
	Machine  machine  `json:"machine"`
	Command  string   `json:"command"`
	Elapsed  float64  `json:"elapsed_seconds"`
	Runs     int      `json:"runs"`
	Messages int      `json:"messages"`
	BodySize int      `json:"body_bytes"` // each message's body
	W1       int      `json:"w1_messages"`
	Systems  []string `json:"systems"`
	// Skipped: system → why it was not run (RabbitMQ not reachable).
	Skipped map[string]string `json:"skipped,omitempty"`
}

type backlogReport struct {
	Sessions []backlogSession `json:"sessions"`
	// Results: every step's result; the metric backlog_messages is the session's N.
	Results []bench.Result `json:"results"`
	// Medians: N → system → case → metric → median over the runs (of cases whose runs all
	// passed).
	Medians map[string]map[string]map[string]map[string]float64 `json:"medians"`
}

func backlogParent(o options) error {
	if o.quick {
		unlessSet("runs", &o.runs, 1)
		unlessSet("n", &o.backlogN, 20_000)
		unlessSet("backlog-w1", &o.backlogW1, 20_000)
	}
	if o.runs < 1 || o.backlogN < 1 || o.backlogW1 < 1 {
		return errors.New("-runs, -n and -backlog-w1 must be at least 1")
	}
	if o.systems == "" {
		o.systems = backlogDefaultSystems()
	}
	var systems []string
	for s := range strings.SplitSeq(o.systems, ",") {
		s = strings.TrimSpace(s)
		if _, err := bench.BacklogSpec(s); err != nil {
			return err
		}
		if o.quick && !flagSet("systems") && bench.NeedsRabbit(s) {
			continue // a quick run needs no RabbitMQ unless asked
		}
		systems = append(systems, s)
	}
	sess := backlogSession{Machine: describeMachine(), Command: strings.TrimSpace("go run ./cmd/bench " + strings.Join(os.Args[1:], " ")),
		Runs: o.runs, Messages: o.backlogN, BodySize: bench.BodySize, W1: o.backlogW1, Systems: systems, Skipped: map[string]string{}}
	sess.Machine.TempFS = tempFS()
	if slices.ContainsFunc(systems, bench.NeedsRabbit) {
		if err := bench.ProbeRabbit(); err != nil {
			for _, s := range slices.DeleteFunc(slices.Clone(systems), func(s string) bool { return !bench.NeedsRabbit(s) }) {
				sess.Skipped[s] = fmt.Sprintf("cannot connect to %s (%v); start one with ./rabbitmq.sh install && ./rabbitmq.sh start", bench.RabbitURL, err)
				fmt.Fprintf(os.Stderr, "%s: skipped — %s\n", s, sess.Skipped[s])
			}
			systems = slices.DeleteFunc(systems, bench.NeedsRabbit)
		} else {
			sess.Machine.RabbitMQ = rabbitVersion()
		}
	}
	var rep backlogReport
	start := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[%s] "+format+"\n", append([]any{time.Since(start).Round(time.Second)}, args...)...)
	}
	add := func(r bench.Result) {
		if r.Metrics == nil { // a child that failed to start measured nothing
			r.Metrics = map[string]float64{}
		}
		r.Metrics["backlog_messages"] = float64(o.backlogN)
		rep.Results = append(rep.Results, r)
	}
	// The open steps are -recovery's, at the backlog's size and sync policy.
	ro := o
	ro.recoveryN, ro.sync = o.backlogN, bench.SyncInterval
	for run := 1; run <= o.runs; run++ {
		for _, s := range systems {
			t0 := time.Now()
			r := backlogStep(o, s, bench.BacklogFillDrain)
			add(r)
			logf("run %d/%d %s fill-drain: %s (%.0fs)", run, o.runs, s, backlogSummary(r), time.Since(t0).Seconds())
			if s == "warren-durable" {
				for _, v := range backlogOpens {
					dir, err := os.MkdirTemp(bench.DurableDir, "warren-bench-backlog-")
					if err != nil {
						return err
					}
					t0 := time.Now()
					fill := recoveryStep(ro, "fill", "backlog/fill-"+v.name, dir, nil, v.name == "crash")
					add(fill)
					if fill.OK {
						open := recoveryStep(ro, "open", "backlog/open-"+v.name, dir, nil, false)
						add(open)
						logf("run %d/%d %s open (%s): %s (%.0fs)", run, o.runs, s, v.name, backlogSummary(open), time.Since(t0).Seconds())
					} else {
						logf("run %d/%d %s fill (%s): %s", run, o.runs, s, v.name, backlogSummary(fill))
					}
					if err := os.RemoveAll(dir); err != nil {
						return err
					}
				}
			}
			for _, step := range []string{bench.BacklogW1Empty, bench.BacklogW1Full} {
				t0 := time.Now()
				r := backlogStep(o, s, step)
				add(r)
				logf("run %d/%d %s %s: %s (%.0fs)", run, o.runs, s, step, backlogSummary(r), time.Since(t0).Seconds())
			}
		}
	}
	sess.Elapsed = time.Since(start).Seconds()
	sess.Machine.LoadEnd = loadAvg()
	rep.Sessions = append(rep.Sessions, sess)
	return rep.write(o)
}

// backlogRerender renders backlog.md again from backlog.json files (-backlog -from a,b): their
// sessions together; a later file's results replace an earlier one's of the same size,
// system and case.
func backlogRerender(o options) error {
	var rep backlogReport
	for path := range strings.SplitSeq(o.from, ",") {
		var next backlogReport
		if err := readJSON(path, &next); err != nil {
			return err
		}
		type id struct {
			n            float64
			system, kase string
		}
		replaced := map[id]bool{}
		for _, r := range next.Results {
			replaced[id{r.Metrics["backlog_messages"], r.System, r.Case}] = true
		}
		rep.Results = slices.DeleteFunc(rep.Results, func(r bench.Result) bool {
			return replaced[id{r.Metrics["backlog_messages"], r.System, r.Case}]
		})
		rep.Results = append(rep.Results, next.Results...)
		rep.Sessions = append(rep.Sessions, next.Sessions...)
	}
	return rep.write(o)
}

// group is the results of one size, system and case.
type group struct {
	n            int
	system, kase string
}

func (rep *backlogReport) groups() map[group][]bench.Result {
	g := map[group][]bench.Result{}
	for _, r := range rep.Results {
		k := group{int(r.Metrics["backlog_messages"]), r.System, r.Case}
		g[k] = append(g[k], r)
	}
	return g
}

// write computes the medians and writes backlog.md and backlog.json into o.out.
func (rep *backlogReport) write(o options) error {
	rep.Medians = map[string]map[string]map[string]map[string]float64{}
	for k, rs := range rep.groups() {
		med := metricMedians(rs)
		if med == nil {
			continue
		}
		n := strconv.Itoa(k.n)
		if rep.Medians[n] == nil {
			rep.Medians[n] = map[string]map[string]map[string]float64{}
		}
		if rep.Medians[n][k.system] == nil {
			rep.Medians[n][k.system] = map[string]map[string]float64{}
		}
		rep.Medians[n][k.system][k.kase] = med
	}
	return writeReport(o.out, "backlog", rep.markdown(), rep)
}

func backlogSummary(r bench.Result) string {
	return summaryOf(r, "publish_rate", "rate", "full_heap_live_bytes", "full_rss_bytes", "full_disk_bytes", "fill_wa", "total_wa", "drain_rate", "drain_peak_rss_bytes", "open_ms", "open_heap_live_bytes", "open_rss_bytes")
}

// backlogCell formats one metric of a group: the median, with the runs' range for a rate
// measured more than once; FAIL or skipped where that is what happened; "—" where the metric
// was not measured.
func backlogCell(rs []bench.Result, metric string, f func(float64) string) string {
	if len(rs) == 0 {
		return "—"
	}
	for _, r := range rs {
		switch {
		case r.Skipped != "":
			return "skipped"
		case !r.OK:
			return "FAIL: " + strings.ReplaceAll(r.Error, "|", "/")
		}
	}
	var vs []float64
	for _, r := range rs {
		if v, ok := r.Metrics[metric]; ok {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return "—"
	}
	text := f(median(vs))
	if len(vs) > 1 && strings.HasSuffix(metric, "rate") {
		text += fmt.Sprintf(" (%s–%s)", f(slices.Min(vs)), f(slices.Max(vs)))
	}
	return text
}

// perMsg formats bytes with the bytes per message of a backlog of n.
func perMsg(n int) func(float64) string {
	return func(v float64) string { return fmt.Sprintf("%s (%.0f B/msg)", fmtMB(v), v/float64(n)) }
}

// ofBodies formats bytes with their ratio to the body bytes of n messages of size bytes.
func ofBodies(n, size int) func(float64) string {
	return func(v float64) string {
		return fmt.Sprintf("%s (%.2f×)", fmtBytes(v), v/float64(n*size))
	}
}

func fmtX(v float64) string { return fmt.Sprintf("%.2f×", v) }

func fmtPerMsg(v float64) string { return fmt.Sprintf("%.0f B", v) }

func fmtInt(v float64) string { return fmt.Sprintf("%.0f", v) }

func (rep *backlogReport) markdown() string {
	var b strings.Builder
	b.WriteString("## A deep backlog in one durable queue: memory, disk, bytes written\n\n")
	for _, s := range rep.Sessions {
		m := s.Machine
		fmt.Fprintf(&b, "- `%s`: %d × %d-byte messages, %d run(s) of each step, each step a fresh process, %s in all. %s. Machine: %d CPUs (%s), %s RAM, %s, %s. Data directories in %s. Load average (1, 5, 15 min) at the start %s, at the end %s.", s.Command, s.Messages, s.BodySize, s.Runs,
			time.Duration(s.Elapsed*float64(time.Second)).Round(time.Second), m.Date, m.CPUs, m.CPU, m.RAM, m.Kernel, m.Go, m.TempFS, m.LoadStart, m.LoadEnd)
		if m.RabbitMQ != "" {
			fmt.Fprintf(&b, " RabbitMQ %s.", m.RabbitMQ)
		}
		for _, sys := range slices.Sorted(maps.Keys(s.Skipped)) {
			fmt.Fprintf(&b, " **%s skipped**: %s.", sys, s.Skipped[sys])
		}
		b.WriteString("\n")
	}
	b.WriteString("\nThe machine is shared with other work (see the load averages): rates are noisy. Rates are medians over the runs with the range in parentheses; the rest are medians. Per message: the growth of the heap or the RSS from just before the fill to the full backlog, over N; for the open, the whole process's, over N.\n\n")
	b.WriteString(backlogMethod)

	g := rep.groups()
	var sizes []int
	for k := range g {
		if !slices.Contains(sizes, k.n) {
			sizes = append(sizes, k.n)
		}
	}
	slices.Sort(sizes)
	for _, n := range sizes {
		var systems []string
		for _, s := range bench.BacklogSystems {
			if len(g[group{n, s.Name, "backlog/" + bench.BacklogFillDrain}]) > 0 {
				systems = append(systems, s.Name)
			}
		}
		sess := rep.session(n)
		fmt.Fprintf(&b, "### %s messages of %d bytes\n\n", fmtCount(n), sess.BodySize)
		if len(systems) > 0 {
			fmt.Fprintf(&b, "#### Fill, full backlog, drain (one process per system)\n\n| %d × %d B |", n, sess.BodySize)
			for _, s := range systems {
				fmt.Fprintf(&b, " %s |", s)
			}
			b.WriteString("\n|---|")
			for range systems {
				b.WriteString("---:|")
			}
			b.WriteString("\n")
			for _, rw := range []struct {
				label, metric string
				f             func(float64) string
			}{
				{"fill, msg/s", "publish_rate", fmtRate},
				{"Go heap live at the full backlog, after a GC", "full_heap_live_bytes", fmtMB},
				{"… its growth over the fill, per message", "full_heap_per_msg", fmtPerMsg},
				{"RSS at the full backlog (RabbitMQ: beam.smp)", "full_rss_bytes", fmtMB},
				{"… its growth over the fill, per message", "full_rss_per_msg", fmtPerMsg},
				{"warren's memory budget: what it counts the backlog as (Broker.Memory's Used)", "full_budget_used_bytes", perMsg(n)},
				{"… the budget's limit (the default: 40% of the memory the process may use)", "budget_limit_bytes", fmtMB},
				{"… times its alarm was set (publishes waited)", "budget_alarms", fmtInt},
				{"disk at the full backlog (÷ body bytes)", "full_disk_bytes", ofBodies(n, sess.BodySize)},
				{"bytes written (wchar) ÷ body bytes: fill", "fill_wa", fmtX},
				{"bytes written (wchar) ÷ body bytes: fill + drain", "total_wa", fmtX},
				{"storage writes (write_bytes) ÷ body bytes: fill", "fill_storage_wa", fmtX},
				{"storage writes (write_bytes) ÷ body bytes: fill + drain", "total_storage_wa", fmtX},
				{"drain (consume + ack each), msg/s", "drain_rate", fmtRate},
				{"Go heap live, peak during the drain", "drain_peak_heap_live_bytes", fmtMB},
				{"RSS, peak during the drain", "drain_peak_rss_bytes", fmtMB},
				{"disk after the drain", "drained_disk_bytes", fmtBytes},
			} {
				fmt.Fprintf(&b, "| %s |", rw.label)
				for _, s := range systems {
					fmt.Fprintf(&b, " %s |", backlogCell(g[group{n, s, "backlog/" + bench.BacklogFillDrain}], rw.metric, rw.f))
				}
				b.WriteString("\n")
			}
			b.WriteString("\n")
		}

		if len(g[group{n, "warren-durable", "backlog/fill-clean"}]) > 0 {
			b.WriteString("#### warren-durable: Open of the full backlog in a fresh process\n\n| |")
			for _, v := range backlogOpens {
				fmt.Fprintf(&b, " %s |", v.title)
			}
			b.WriteString("\n|---|---:|---:|\n")
			for _, rw := range []struct {
				label, step, metric string
				f                   func(float64) string
			}{
				{"fill (PublishBatch of 256, SyncInterval(100ms)), msg/s", "fill", "fill_rate", fmtRate},
				{"Open until the queue's Len() is the backlog", "open", "open_ms", fmtMs},
				{"Go heap live after the Open, after a GC", "open", "open_heap_live_bytes", perMsg(n)},
				{"RSS right after the Open", "open", "open_rss_bytes", perMsg(n)},
				{"memory budget's Used after the Open", "open", "open_budget_used_bytes", perMsg(n)},
				{"drain after the Open, msg/s", "open", "drain_rate", fmtRate},
				{"Go heap live, peak during that drain", "open", "drain_peak_heap_live_bytes", fmtMB},
				{"RSS, peak during that drain", "open", "drain_peak_rss_bytes", fmtMB},
				{"repairs at the Open (Broker.Recovery: ends cut, stretches skipped, queues damaged)", "open", "repaired_events", fmtInt},
			} {
				fmt.Fprintf(&b, "| %s |", rw.label)
				for _, v := range backlogOpens {
					fmt.Fprintf(&b, " %s |", backlogCell(g[group{n, "warren-durable", "backlog/" + rw.step + "-" + v.name}], rw.metric, rw.f))
				}
				b.WriteString("\n")
			}
			b.WriteString("\n")
		}

		var w1 []string
		for _, s := range bench.BacklogSystems {
			if len(g[group{n, s.Name, "backlog/" + bench.BacklogW1Empty}]) > 0 {
				w1 = append(w1, s.Name)
			}
		}
		if len(w1) > 0 {
			fmt.Fprintf(&b, "#### Publish into the backlog: W1 (1 → 1) for %s more messages\n\n| | W1 on an empty queue | W1 into the %s backlog | into ÷ empty | peak RSS, empty · into (RabbitMQ: beam.smp) |\n|---|---:|---:|---:|---:|\n", fmtCount(sess.W1), fmtCount(n))
			for _, s := range w1 {
				empty, full := g[group{n, s, "backlog/" + bench.BacklogW1Empty}], g[group{n, s, "backlog/" + bench.BacklogW1Full}]
				ratio := "—"
				me, ok1 := rep.median(n, s, "backlog/"+bench.BacklogW1Empty, "rate")
				mf, ok2 := rep.median(n, s, "backlog/"+bench.BacklogW1Full, "rate")
				if ok1 && ok2 {
					ratio = fmt.Sprintf("%.2f", mf/me)
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %s · %s |\n", s, backlogCell(empty, "rate", fmtRate), backlogCell(full, "rate", fmtRate), ratio,
					backlogCell(empty, "peak_rss_bytes", fmtMB), backlogCell(full, "peak_rss_bytes", fmtMB))
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("### Setup of each system\n\nAs the bench defines the systems for its other workloads; in the fill, warren publishes with `PublishBatch` of 256 (Method, above).\n\n")
	for _, s := range bench.BacklogSystems {
		spec, err := bench.Lookup(s.Spec)
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "- **%s** (the bench's `%s` system): %s.\n", s.Name, s.Spec, spec.Setup)
	}
	b.WriteString("\n")
	return b.String()
}

// median is the median of a metric of a group whose runs all passed.
func (rep *backlogReport) median(n int, system, kase, metric string) (float64, bool) {
	v, ok := rep.Medians[strconv.Itoa(n)][system][kase][metric]
	return v, ok
}

// session is the last session of backlog size n: its W1 and body sizes.
func (rep *backlogReport) session(n int) backlogSession {
	var last backlogSession
	for _, s := range rep.Sessions {
		if s.Messages == n {
			last = s
		}
	}
	return last
}

const backlogMethod = `Method. One durable queue; N persistent messages of 128 bytes, sequence numbers 0 … N−1, published with nobody consuming, then drained by one consumer (prefetch 256, an ack per message) that checks every message arrives once and in order. warren publishes with ` + "`PublishBatch`" + ` of 256 (warren-durable: ` + "`warren.Open(dir, WithSync(SyncInterval(100ms)))`" + `, a durable queue, ` + "`Persistent: true`" + `; warren-memory: ` + "`warren.New()`" + `, nothing on disk); JetStream and RabbitMQ with their asynchronous confirms, at most 4000 unconfirmed, all confirmed before the fill ends (JetStream: a ` + "`FileStorage`" + ` stream with ` + "`WorkQueuePolicy`" + ` and one durable pull consumer; RabbitMQ: a durable classic queue with the node's default queue version, no ` + "`x-queue-version`" + ` argument, and ` + "`DeliveryMode`" + ` 2; RabbitMQ 3.10's default is version 1, ` + "`classic_queue.default_version`" + ` being unset, and a queue's ` + "`backing_queue_status`" + ` then reports ` + "`{version,1}`" + `: its messages, smaller than ` + "`queue_index_embed_msgs_below`" + ` (4096 B), are kept in the queue index).

- **Go heap live**: runtime/metrics' ` + "`/gc/heap/live:bytes`" + ` right after a ` + "`runtime.GC()`" + `, for the systems in the bench's process (warren, the embedded JetStream server and its in-process client); RabbitMQ's messages are in another process (—).
- **RSS**: VmRSS of the process that holds the messages: the bench's child, or for RabbitMQ the node's ` + "`beam.smp`" + ` (its pid file, checked to name a beam.smp). Peaks during the drain are sampled every 100 ms.
- **Disk**: the bytes of the regular files under the system's data directory (warren: its log's segments; JetStream: its store directory; RabbitMQ: the node's whole ` + "`RABBITMQ_MNESIA_BASE`" + `, which holds a little more than this queue).
- **Bytes written**: deltas of the same process's ` + "`/proc/<pid>/io`" + `, from the start of the fill to the full backlog (fill) and to the end of the drain (fill + drain; read once the process has written nothing for 300 ms, at most 3 s after the last ack), over the body bytes published (N × 128). ` + "`wchar`" + ` counts every write(2) of the process, to files, pipes and sockets alike: for RabbitMQ it includes the frames the node sends the client over TCP (confirms, deliveries); warren and the embedded JetStream write nothing but their files (the in-process client is a pipe in memory). ` + "`write_bytes`" + ` counts what reached the storage layer (page-cache pages dirtied, whole 4 KiB pages; what was deleted before being written back is not subtracted).
- **Open** (warren-durable): -recovery's steps at this size and sync policy: one process fills the log and closes the broker (or is killed with SIGKILL after its last confirm), another times ` + "`warren.Open`" + ` until the queue's ` + "`Len()`" + ` is N, reads the RSS, collects and reads the heap after the first delivery, then drains and checks the queue. The open installs no listener: a broker with one keeps a whole ` + "`Message`" + ` beside each message; ` + "`Broker.Recovery`" + ` says what it repaired.
- **Publish into the backlog**: W1 (one publisher with deferred confirms, at most 4000 unconfirmed; one consumer, prefetch 256, an ack each) for the W1 messages, timed from the first publish until all are confirmed and as many have been consumed; on an empty queue, and with the queue holding the full backlog first (filled as above, then a GC), so that the consumer takes the backlog's head while the publisher appends. The rest of the backlog is then drained and checked too. Peak RSS: over the whole step, the backlog's fill included, of the process that holds the messages: the child's ` + "`VmHWM`" + `, RabbitMQ's node sampled every 100 ms.

`

package bench

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/warrenmq/warren"
)

// The backlog measurement (cmd/bench -backlog): what a deep backlog in one durable queue costs
// each system, in memory (the Go heap and the process's RSS), on disk, and in bytes written,
// and how fast it fills and drains. Each step runs in a fresh process: the fill and the drain
// of one system in one process (runBacklog with a probe); for warren-durable also the open
// of a filled log after a clean Close and after SIGKILL (recovery.go's steps); for every
// system W1 on an empty queue against W1 into a full backlog (runStream with a backlog).

// BacklogSystems are the -backlog mode's systems, in report order, each with the registered
// system it runs: warren-durable is the durable suite's SyncInterval(100 ms) system, and
// warren-memory is warren.New().
var BacklogSystems = []struct{ Name, Spec string }{
	{"warren-durable", "warren-durable-interval"},
	{"warren-memory", "warren"},
	{"nats-jetstream-file", "nats-jetstream-file"},
	{"rabbitmq-durable", "rabbitmq-durable"},
}

// The steps of the -backlog mode that run as a bench case (the open steps are recovery.go's).
const (
	BacklogFillDrain = "fill-drain" // fill the backlog, then drain it, with the probe's readings
	BacklogW1Empty   = "w1-empty"   // W1 on an empty queue
	BacklogW1Full    = "w1-backlog" // W1 into the full backlog, then the rest drained
)

// BacklogSample is how often the drain samples the heap and the RSS for their peaks.
const BacklogSample = 100 * time.Millisecond

// BacklogSpec is the registered system that the -backlog mode's system name runs.
func BacklogSpec(name string) (string, error) {
	for _, s := range BacklogSystems {
		if s.Name == name {
			return s.Spec, nil
		}
	}
	var names []string
	for _, s := range BacklogSystems {
		names = append(names, s.Name)
	}
	return "", fmt.Errorf("unknown backlog system %q (known: %v)", name, names)
}

// RunBacklog runs one step of the -backlog mode (BacklogFillDrain, BacklogW1Empty,
// BacklogW1Full) on system (a name of BacklogSystems) in this process: a backlog of n
// messages; w1 messages through W1. The result's case is "backlog/<step>" and its metric
// backlog_messages is n.
func RunBacklog(ctx context.Context, system, step string, n, w1 int) Result {
	r := Result{System: system, Case: "backlog/" + step, Metrics: map[string]float64{}}
	spec, err := BacklogSpec(system)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	sz := FullSizes()
	sz.W1 = w1
	c := Case{ID: r.Case}
	switch step {
	case BacklogFillDrain:
		c.Workload, c.Depth = "backlog", n
	case BacklogW1Empty:
		c.Workload = "W1"
	case BacklogW1Full:
		c.Workload, c.Depth = "W1", n
	default:
		r.Error = fmt.Sprintf("unknown backlog step %q", step)
		return r
	}
	// The peak RSS of the process that holds the messages: this one's (VmHWM), or for a client
	// of the RabbitMQ node the node's, sampled.
	var node *peaks
	if s, err := Lookup(spec); err == nil && s.ClientOnly && step != BacklogFillDrain {
		p, err := newProbe(s, nil)
		if err != nil {
			r.Error = err.Error()
			return r
		}
		node = watch(p)
	}
	r = Run(ctx, spec, c, sz)
	r.System = system
	r.Metrics["backlog_messages"] = float64(n)
	r.Metrics["peak_rss_bytes"] = float64(r.PeakRSS)
	if node != nil {
		node.stop(&r, "node")
		r.Metrics["peak_rss_bytes"] = r.Metrics["node_peak_rss_bytes"]
	}
	return r
}

// probe reads the resources of the process that holds a system's messages, this one (warren,
// embedded JetStream) or the RabbitMQ node, and the system's data directory.
type probe struct {
	pid  int                        // 0: this process
	disk func() (int64, int, error) // the data directory's bytes and files; nil: the system keeps none
	io0  ioCounters                 // at the start of the fill
	// budget is a warren broker's memory budget (Broker.Memory): what the broker counts its
	// messages as taking, against its limit; nil for the other systems.
	budget func() warren.MemoryStats
}

// newProbe is the probe of system sys: for a client of the RabbitMQ node (spec.ClientOnly),
// the node's process and its data directory; else this process and the system's directory.
func newProbe(spec Spec, sys System) (*probe, error) {
	if spec.ClientOnly {
		pid, err := RabbitPID()
		if err != nil {
			return nil, err
		}
		data := RabbitDataDir()
		return &probe{pid: pid, disk: func() (int64, int, error) { return DirUsage(data) }}, nil
	}
	p := &probe{}
	if du, ok := sys.(DiskUser); ok && spec.Durable {
		p.disk = du.DiskUsage
	}
	if ws, ok := sys.(*warrenSys); ok {
		p.budget = ws.b.Memory
	}
	return p, nil
}

// putBudget records a warren broker's memory budget as metrics: prefix_budget_used_bytes,
// what the broker counts its messages as taking; budget_limit_bytes, its limit (0: none); and
// budget_alarms, how often the alarm was set (publishes waited) since the broker started.
func putBudget(r *Result, prefix string, m warren.MemoryStats) {
	r.Metrics[prefix+"_budget_used_bytes"] = float64(m.Used)
	r.Metrics["budget_limit_bytes"] = float64(m.Limit)
	r.Metrics["budget_alarms"] = float64(m.Alarms)
}

func (p *probe) proc(file string) string {
	if p.pid == 0 {
		return "/proc/self/" + file
	}
	return fmt.Sprintf("/proc/%d/%s", p.pid, file)
}

// rss is the process's resident set size now (VmRSS).
func (p *probe) rss() int64 {
	n, _ := procStatusBytes(p.proc("status"), "VmRSS:")
	return n
}

// putDisk records the data directory's bytes as metric name (nothing for a system without one).
func (p *probe) putDisk(r *Result, name string) error {
	if p.disk == nil {
		return nil
	}
	bytes, _, err := p.disk()
	if err != nil {
		return err
	}
	r.Metrics[name] = float64(bytes)
	return nil
}

// start records the readings before the fill: the bytes written so far, the heap (after a
// collection) and the RSS, from which the fill's growth is reckoned, and the directory's
// size (a RabbitMQ node's holds more than this run's queue).
func (p *probe) start(r *Result) error {
	var err error
	if p.io0, err = readIO(p.proc("io")); err != nil {
		return err
	}
	if p.pid == 0 {
		runtime.GC()
		r.Metrics["start_heap_live_bytes"] = float64(HeapLive())
	}
	r.Metrics["start_rss_bytes"] = float64(p.rss())
	return p.putDisk(r, "start_disk_bytes")
}

// putIO records the bytes written since start as metrics prefix_wchar_bytes,
// prefix_write_bytes and prefix_cancelled_write_bytes, and wchar's and write_bytes' ratios to
// the body bytes (prefix_wa, prefix_storage_wa).
func (p *probe) putIO(r *Result, prefix string, bodies int) error {
	now, err := readIO(p.proc("io"))
	if err != nil {
		return err
	}
	d := now.minus(p.io0)
	r.Metrics[prefix+"_wchar_bytes"] = float64(d.wchar)
	r.Metrics[prefix+"_write_bytes"] = float64(d.writeBytes)
	r.Metrics[prefix+"_cancelled_write_bytes"] = float64(d.cancelled)
	r.Metrics[prefix+"_wa"] = float64(d.wchar) / float64(bodies*BodySize)
	r.Metrics[prefix+"_storage_wa"] = float64(d.writeBytes) / float64(bodies*BodySize)
	return nil
}

// full records the readings at the full backlog: the bytes the fill wrote, then, after a
// collection, the Go heap's live bytes (a system in this process), the RSS, their growth
// since start per message, a warren broker's memory budget, and the disk.
func (p *probe) full(r *Result, n int) error {
	if err := p.putIO(r, "fill", n); err != nil {
		return err
	}
	m := r.Metrics
	if p.pid == 0 {
		runtime.GC()
		m["full_heap_live_bytes"] = float64(HeapLive())
		m["full_heap_per_msg"] = (m["full_heap_live_bytes"] - m["start_heap_live_bytes"]) / float64(n)
	}
	m["full_rss_bytes"] = float64(p.rss())
	m["full_rss_per_msg"] = (m["full_rss_bytes"] - m["start_rss_bytes"]) / float64(n)
	if p.budget != nil {
		putBudget(r, "full", p.budget())
	}
	return p.putDisk(r, "full_disk_bytes")
}

// drained records the readings after the drain: the bytes the fill and the drain wrote
// together, and the disk. A system may write the last acks after it has delivered the last
// message (warren within its log's flush delay, RabbitMQ its queue index's journal): it waits
// until the process has written nothing for backlogQuiet, or backlogSettle has passed.
func (p *probe) drained(r *Result, n int) error {
	if p.disk == nil { // nothing to wait for in memory
		return p.putIO(r, "total", n)
	}
	t0 := time.Now()
	last, err := readIO(p.proc("io"))
	if err != nil {
		return err
	}
	for quiet := time.Now(); time.Since(quiet) < backlogQuiet && time.Since(t0) < backlogSettle; {
		time.Sleep(BacklogSample)
		now, err := readIO(p.proc("io"))
		if err != nil {
			return err
		}
		if now != last {
			last, quiet = now, time.Now()
		}
	}
	r.Metrics["settle_ms"] = float64(time.Since(t0).Milliseconds())
	if err := p.putIO(r, "total", n); err != nil {
		return err
	}
	return p.putDisk(r, "drained_disk_bytes")
}

// How long drained waits for the writes after the drain to end.
const (
	backlogQuiet  = 300 * time.Millisecond
	backlogSettle = 3 * time.Second
)

// HeapLive is the Go heap's live bytes as of the last collection (runtime/metrics'
// /gc/heap/live:bytes: the marked objects; a runtime.GC just before makes it the live heap now).
func HeapLive() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// peaks samples a process's RSS, and the Go heap's live bytes when the process is this one,
// every BacklogSample until stop, keeping the largest.
type peaks struct {
	p       *probe
	done    chan struct{}
	stopped chan struct{}

	mu        sync.Mutex // guards rss and heap
	rss, heap int64
}

// watch starts sampling p (nil: this process).
func watch(p *probe) *peaks {
	if p == nil {
		p = &probe{}
	}
	w := &peaks{p: p, done: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(w.stopped)
		t := time.NewTicker(BacklogSample)
		defer t.Stop()
		for {
			w.sample()
			select {
			case <-w.done:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

func (w *peaks) sample() {
	rss := w.p.rss()
	var heap int64
	if w.p.pid == 0 {
		heap = int64(HeapLive())
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rss, w.heap = max(w.rss, rss), max(w.heap, heap)
}

// stop ends the sampling, samples once more and records the peaks as metrics
// prefix_peak_rss_bytes and (this process) prefix_peak_heap_live_bytes.
func (w *peaks) stop(r *Result, prefix string) {
	close(w.done)
	<-w.stopped
	w.sample()
	w.mu.Lock()
	defer w.mu.Unlock()
	r.Metrics[prefix+"_peak_rss_bytes"] = float64(w.rss)
	if w.p.pid == 0 {
		r.Metrics[prefix+"_peak_heap_live_bytes"] = float64(w.heap)
	}
}

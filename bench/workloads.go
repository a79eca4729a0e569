package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Sizes are the message counts of the workloads.
type Sizes struct {
	W1, W2, W3         int // messages
	W2Producers        int // and as many consumers
	W1W2Window         int // the channels' capacity and warren-block's MaxLength in W1 and W2
	Prefetch           int // W1, W2, W3
	W4Queue, W4Requeue int
	S1Measure, S1Batch int // messages measured at each depth, in batches
	S2Messages         int
	D1, D2, D3         int // messages
	D1Producers        int // D1's publishers, each waiting for every confirm
	D1Consumers        int
	Stall              time.Duration // no progress for this long fails the run
}

// FullSizes are the sizes.
func FullSizes() Sizes {
	return Sizes{
		W1: 1_000_000, W2: 1_000_000, W3: 1_000_000, W2Producers: 4, W1W2Window: 4096, Prefetch: 256,
		W4Queue: 100_000, W4Requeue: 10_000,
		S1Measure: 100_000, S1Batch: 1000,
		S2Messages: 200_000,
		D1:         256_000, D1Producers: 64, D1Consumers: 1, D2: 1_000_000, D3: 1_000_000,
		Stall: 60 * time.Second,
	}
}

// QuickSizes are toy sizes for a smoke run and the tests.
func QuickSizes() Sizes {
	return Sizes{
		W1: 20_000, W2: 20_000, W3: 20_000, W2Producers: 4, W1W2Window: 4096, Prefetch: 256,
		W4Queue: 5000, W4Requeue: 1000,
		S1Measure: 2000, S1Batch: 500,
		S2Messages: 5000,
		D1:         6400, D1Producers: 64, D1Consumers: 1, D2: 20_000, D3: 20_000,
		Stall: 20 * time.Second,
	}
}

// Case is one measurement: a workload and its parameter.
type Case struct {
	ID       string // "W1", "S1/1M", "S2/10k", "S2/10kq"
	Workload string // "W1" … "S2"
	Title    string
	Depth    int // S1: backlog depth (before the quick scaling)
	Bindings int // S2
	Queues   int // S2
	Batch    int // D2: messages per PublishBatch
}

// Cases are every measurement, in report order. quick scales S1's depths and S2's bindings
// down to toy sizes.
func Cases(quick bool) []Case {
	d := func(full, small int) int {
		if quick {
			return small
		}
		return full
	}
	return []Case{
		{ID: "W1", Workload: "W1", Title: "W1 handoff: 1 producer, 1 consumer, ack each"},
		{ID: "W2", Workload: "W2", Title: "W2 fan-in: 4 producers, 4 consumers, prefetch 256"},
		{ID: "W3", Workload: "W3", Title: "W3 backlog: publish all, then drain"},
		{ID: "W4", Workload: "W4", Title: "W4 requeue: 10k unacked returned into 100k"},
		{ID: "S1/1k", Workload: "S1", Title: "S1 depth 1k", Depth: d(1_000, 100)},
		{ID: "S1/100k", Workload: "S1", Title: "S1 depth 100k", Depth: d(100_000, 1_000)},
		{ID: "S1/1M", Workload: "S1", Title: "S1 depth 1M", Depth: d(1_000_000, 5_000)},
		{ID: "S1/10M", Workload: "S1", Title: "S1 depth 10M", Depth: d(10_000_000, 10_000)},
		{ID: "S2/10", Workload: "S2", Title: "S2 10 bindings, 10 queues", Bindings: 10, Queues: 10},
		{ID: "S2/10k", Workload: "S2", Title: "S2 10k bindings, 100 queues", Bindings: d(10_000, 500), Queues: 100},
		{ID: "S2/100k", Workload: "S2", Title: "S2 100k bindings, 100 queues", Bindings: d(100_000, 2_000), Queues: 100},
		{ID: "S2/10kq", Workload: "S2", Title: "S2 10k queues, one binding each", Bindings: d(10_000, 500), Queues: d(10_000, 500)},
		{ID: "D1", Workload: "D1", Title: "D1 group commit: 64 publishers, each waiting for every confirm; 1 consumer"},
		{ID: "D2/64", Workload: "D2", Title: "D2 batch publish: 1 publisher, batches of 64; 1 consumer", Batch: 64},
		{ID: "D2/256", Workload: "D2", Title: "D2 batch publish: 1 publisher, batches of 256; 1 consumer", Batch: 256},
		{ID: "D3", Workload: "D3", Title: "D3 confirm each: 1 publisher waiting for every confirm; 1 consumer"},
	}
}

// MemoryWorkloads and DurableWorkloads are the workloads each suite runs by default: the
// in-memory comparison, and the durable systems' (cmd/bench -durable).
const (
	MemoryWorkloads  = "W1,W2,W3,W4,S1,S2"
	DurableWorkloads = "W1,D1,D2,D3"
)

// LookupCase finds a case by ID.
func LookupCase(id string, quick bool) (Case, error) {
	for _, c := range Cases(quick) {
		if c.ID == id {
			return c, nil
		}
	}
	return Case{}, fmt.Errorf("unknown case %q", id)
}

// Result is what one run of one case on one system measured.
type Result struct {
	System        string             `json:"system"`
	Case          string             `json:"case"`
	Messages      int                `json:"messages"`
	Metrics       map[string]float64 `json:"metrics"`
	PeakRSS       int64              `json:"peak_rss_bytes"`
	Lost          int64              `json:"lost"`
	Duplicates    int64              `json:"duplicates"`
	OutOfOrder    int64              `json:"out_of_order"`
	OrderPromised bool               `json:"order_promised"`
	OK            bool               `json:"ok"`
	Error         string             `json:"error,omitempty"`
	Skipped       string             `json:"skipped,omitempty"`
	Notes         []string           `json:"notes,omitempty"`
}

// Verified says whether no message was lost or duplicated, and the order held where the
// system promises it.
func (r *Result) verdict() {
	r.OK = r.Error == "" && r.Lost == 0 && r.Duplicates == 0 && (!r.OrderPromised || r.OutOfOrder == 0)
	if r.Error == "" && !r.OK {
		r.Error = fmt.Sprintf("verification failed: %d lost, %d duplicated, %d out of order", r.Lost, r.Duplicates, r.OutOfOrder)
	}
}

// Run opens the named system, runs one case on it, verifies and closes it.
func Run(ctx context.Context, system string, c Case, sz Sizes) Result {
	r := Result{System: system, Case: c.ID, Metrics: map[string]float64{}}
	spec, err := Lookup(system)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.OrderPromised = spec.Ordered
	if why, ok := spec.NA[c.Workload]; ok {
		r.Skipped = why
		return r
	}
	sys, err := spec.Open()
	if err != nil {
		if errors.Is(err, ErrSkip) {
			r.Skipped = err.Error()
		} else {
			r.Error = "open: " + err.Error()
		}
		return r
	}
	switch c.Workload {
	case "W1":
		err = runStream(ctx, sys, &r, streamShape{n: sz.W1, producers: 1, consumers: 1, prefetch: sz.Prefetch, window: sz.W1W2Window, backlog: c.Depth}, sz)
		if !spec.Acks {
			r.Notes = append(r.Notes, "no acknowledgements")
		}
	case "W2":
		err = runStream(ctx, sys, &r, streamShape{n: sz.W2, producers: sz.W2Producers, consumers: sz.W2Producers, prefetch: sz.Prefetch, window: sz.W1W2Window}, sz)
	case "D1":
		err = runStream(ctx, sys, &r, streamShape{n: sz.D1, producers: sz.D1Producers, consumers: sz.D1Consumers, prefetch: sz.Prefetch, window: sz.W1W2Window, confirmEach: true}, sz)
	case "D2":
		err = runBatch(ctx, sys, &r, sz.D2, c.Batch, sz)
	case "D3":
		err = runStream(ctx, sys, &r, streamShape{n: sz.D3, producers: 1, consumers: 1, prefetch: sz.Prefetch, window: sz.W1W2Window, confirmEach: true}, sz)
	case "W3":
		err = runBacklog(ctx, sys, &r, backlogShape{n: sz.W3}, sz)
	case "backlog": // cmd/bench -backlog (backlog.go)
		var p *probe
		if p, err = newProbe(spec, sys); err == nil {
			err = runBacklog(ctx, sys, &r, backlogShape{n: c.Depth, batch: RecoveryFillBatch, probe: p}, sz)
		}
	case "W4":
		err = runRequeue(ctx, sys, &r, sz)
	case "S1":
		err = runDepth(ctx, sys, &r, c.Depth, sz)
	case "S2":
		tr, ok := sys.(TopicRouter)
		if !ok {
			err = ErrUnsupported
			break
		}
		err = runTopic(ctx, tr, &r, c.Bindings, c.Queues, sz)
	default:
		err = fmt.Errorf("unknown workload %q", c.Workload)
	}
	r.PeakRSS = PeakRSS()
	if err != nil {
		r.Error = err.Error()
	}
	if du, ok := sys.(DiskUser); ok && err == nil && spec.Durable {
		if b, f, derr := du.DiskUsage(); derr == nil {
			r.Metrics["disk_bytes_end"], r.Metrics["disk_files_end"] = float64(b), float64(f)
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- sys.Close() }()
	select {
	case err := <-closed:
		if err != nil && r.Error == "" {
			r.Notes = append(r.Notes, "close: "+err.Error())
		}
	case <-time.After(time.Minute):
		r.Notes = append(r.Notes, "close did not return within a minute")
	}
	r.verdict()
	return r
}

var errDone = errors.New("done")

// wait waits for wg, or returns early when ctx ends with a cause other than errDone (a stall
// or a failure: goroutines blocked in a publish are left behind; the process is a child that
// exits).
func wait(ctx context.Context, wg *sync.WaitGroup) error {
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		if err := context.Cause(ctx); !errors.Is(err, errDone) {
			return err
		}
		<-ch
		return nil
	}
}

// streamShape is the shape of a streaming workload.
type streamShape struct {
	n                    int // messages
	producers, consumers int
	prefetch             int // per consumer
	window               int // the channels' capacity
	confirmEach          bool
	batch                int // > 0: the producer publishes with PublishBatch, this many at a time
	// backlog > 0: the queue holds this many messages before the timed phase, and the
	// consumers take them first (the time ends once n have been received and every
	// publish is confirmed; the rest of the backlog is then drained and checked too).
	backlog int
}

// producer opens a producer for st: one whose every publish waits for its confirm
// (SyncProducer) when st asks for that and the system has one.
func (st streamShape) producer(sys System) (Producer, error) {
	if sp, ok := sys.(SyncProducerSystem); ok && st.confirmEach {
		return sp.SyncProducer()
	}
	return sys.Producer()
}

// runStream is W1 (1 producer, 1 consumer), W2 (P producers, P consumers) and D1 (64
// producers each waiting for every confirm, 1 consumer): every producer publishes its share
// while every consumer receives and acknowledges each delivery, from the first publish to the
// last acknowledgement. With a backlog, the queue is filled first (fillSeq, then a
// collection, as S1 does) with the sequence numbers below the producers'.
func runStream(ctx context.Context, sys System, r *Result, st streamShape, sz Sizes) error {
	const q = "stream"
	n, producers, consumers, prefetch := st.n, st.producers, st.consumers, st.prefetch
	total := st.backlog + n
	if err := sys.DeclareQueue(q, Config{Capacity: st.window, Messages: n, MaxUnacked: prefetch * consumers}); err != nil {
		return err
	}
	cons := make([]Consumer, consumers)
	for i := range cons {
		c, err := sys.Consumer(q, prefetch)
		if err != nil {
			return err
		}
		defer c.Close()
		cons[i] = c
	}
	prods := make([]Producer, producers)
	for i := range prods {
		p, err := st.producer(sys)
		if err != nil {
			return err
		}
		defer p.Close()
		prods[i] = p
	}
	var batcher BatchPublisher
	if st.batch > 0 {
		bp, ok := prods[0].(BatchPublisher)
		if !ok || producers != 1 {
			return ErrUnsupported
		}
		batcher = bp
	}
	if st.backlog > 0 {
		if err := fillSeq(prods[0], q, 0, st.backlog, RecoveryFillBatch); err != nil {
			return fmt.Errorf("backlog: %w", err)
		}
		runtime.GC()
	}
	r.Messages = total
	chk := newChecker(total)
	ords := make([]*order, consumers)
	for i := range ords {
		ords[i] = newOrder(producers)
	}
	var received atomic.Int64
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := watchdog(ctx, cancel, &received, sz.Stall, func() error {
		return fmt.Errorf("stalled: %d of %d received", received.Load(), total)
	})
	defer stop()
	reached := make(chan struct{}) // closed once the consumers have received n

	ph := begin()
	var pwg, cwg sync.WaitGroup
	for i, p := range prods {
		pwg.Go(func() {
			if batcher != nil {
				bodies := make([][]byte, 0, st.batch)
				for s := 0; s < n; s += st.batch {
					bodies = bodies[:0]
					for j := s; j < min(n, s+st.batch); j++ {
						bodies = append(bodies, NewBody(uint64(st.backlog+j)))
					}
					if err := batcher.PublishBatch(q, bodies); err != nil {
						cancel(fmt.Errorf("publish batch: %w", err))
						return
					}
				}
			}
			for s := i; s < n && batcher == nil; s += producers {
				if err := p.Publish(q, NewBody(uint64(st.backlog+s))); err != nil {
					cancel(fmt.Errorf("publish: %w", err))
					return
				}
			}
			if err := p.Flush(); err != nil {
				cancel(fmt.Errorf("flush: %w", err))
			}
		})
	}
	for i, c := range cons {
		cwg.Go(func() {
			o := ords[i]
			for {
				d, err := c.Next(ctx)
				if err != nil {
					if received.Load() < int64(total) {
						cancel(fmt.Errorf("receive: %w", err))
					}
					return
				}
				seq := SeqOf(d.Body)
				chk.mark(seq)
				o.see(seq)
				if err := c.Ack(d); err != nil {
					cancel(fmt.Errorf("ack: %w", err))
					return
				}
				got := received.Add(1)
				if got == int64(n) {
					close(reached)
				}
				if got == int64(total) {
					cancel(errDone)
					return
				}
			}
		})
	}
	select {
	case <-reached:
	case <-ctx.Done():
		if err := context.Cause(ctx); !errors.Is(err, errDone) {
			return err
		}
	}
	if err := wait(ctx, &pwg); err != nil {
		return err
	}
	elapsed, mallocs := ph.end()
	if err := wait(ctx, &cwg); err != nil { // the rest of the backlog
		return err
	}
	if err := context.Cause(ctx); err != nil && !errors.Is(err, errDone) {
		return err
	}
	r.Metrics["rate"] = float64(n) / elapsed.Seconds()
	r.Metrics["ns_per_msg"] = float64(elapsed.Nanoseconds()) / float64(n)
	r.Metrics["allocs_per_msg"] = allocsPerMsg(mallocs, n, n)
	r.Lost, r.Duplicates = chk.missing(), chk.dups.Load()+chk.bad.Load()
	for _, o := range ords {
		r.OutOfOrder += o.violations
	}
	return nil
}

// runBatch is D2: one producer publishes n messages with PublishBatch, batch at a time, while
// one consumer receives and acknowledges each; from the first publish to the last ack.
func runBatch(ctx context.Context, sys System, r *Result, n, batch int, sz Sizes) error {
	return runStream(ctx, sys, r, streamShape{n: n, producers: 1, consumers: 1, prefetch: sz.Prefetch, window: sz.W1W2Window, batch: batch}, sz)
}

// allocsPerMsg is the allocations per message net of the bodies the workload allocated.
func allocsPerMsg(mallocs uint64, bodies, msgs int) float64 {
	return (float64(mallocs) - float64(bodies)) / float64(msgs)
}

// receiver is a consumer that receives with a stall watchdog of its own.
type receiver struct {
	c        Consumer
	ctx      context.Context
	cancel   context.CancelCauseFunc
	progress atomic.Int64
	stop     func()
}

// newReceiver opens a consumer of q with prefetch, whose receptions fail once none has come for
// stall; what names it in that failure. close stops the watchdog and closes the consumer.
func newReceiver(ctx context.Context, sys System, q string, prefetch int, stall time.Duration, what string) (*receiver, error) {
	c, err := sys.Consumer(q, prefetch)
	if err != nil {
		return nil, err
	}
	rc := &receiver{c: c}
	rc.ctx, rc.cancel = context.WithCancelCause(ctx)
	rc.stop = watchdog(rc.ctx, rc.cancel, &rc.progress, stall, func() error {
		return fmt.Errorf("stalled: %d received (%s)", rc.progress.Load(), what)
	})
	return rc, nil
}

func (rc *receiver) next() (Delivery, error) {
	d, err := rc.c.Next(rc.ctx)
	if err != nil {
		return d, fmt.Errorf("receive: %w", err)
	}
	rc.progress.Add(1)
	return d, nil
}

// take receives the next delivery, records its sequence number in chk and o, and acks it.
func (rc *receiver) take(chk *checker, o *order) error {
	d, err := rc.next()
	if err != nil {
		return err
	}
	seq := SeqOf(d.Body)
	chk.mark(seq)
	o.see(seq)
	if err := rc.c.Ack(d); err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	return nil
}

func (rc *receiver) close() {
	rc.stop()
	rc.cancel(nil)
	rc.c.Close()
}

// openProducer declares q with cfg and opens a producer; the caller closes it.
func openProducer(sys System, q string, cfg Config) (Producer, error) {
	if err := sys.DeclareQueue(q, cfg); err != nil {
		return nil, err
	}
	return sys.Producer()
}

// fillSeq publishes the messages with sequence numbers from to to-1 to q, batch at a time with
// PublishBatch where p has it (warren), else one by one with p's Publish (the peers'
// asynchronous confirms), then flushes.
func fillSeq(p Producer, q string, from, to, batch int) error {
	bp, ok := p.(BatchPublisher)
	if !ok || batch <= 0 {
		return publishSeq(p, q, from, to)
	}
	bodies := make([][]byte, 0, batch)
	for s := from; s < to; s += batch {
		bodies = bodies[:0]
		for j := s; j < min(to, s+batch); j++ {
			bodies = append(bodies, NewBody(uint64(j)))
		}
		if err := bp.PublishBatch(q, bodies); err != nil {
			return fmt.Errorf("publish batch: %w", err)
		}
	}
	return p.Flush()
}

// publishSeq publishes the messages with sequence numbers from to to-1 to q, then flushes.
func publishSeq(p Producer, q string, from, to int) error {
	for s := from; s < to; s++ {
		if err := p.Publish(q, NewBody(uint64(s))); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	if err := p.Flush(); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	return nil
}

// backlogShape is what runBacklog fills and drains: W3's backlog, or the -backlog mode's
// (backlog.go).
type backlogShape struct {
	n     int
	batch int    // > 0: fill with PublishBatch of batch where the producer has it (fillSeq)
	probe *probe // the -backlog mode's readings of memory, disk and bytes written; nil in W3
}

// runBacklog is W3: publish every message with nobody consuming, then drain with one
// consumer, acknowledging each. Both phases are timed apart; the peak RSS is the process's.
// With a probe, it also reads the bytes written in each phase, the heap, RSS and disk at the
// full backlog and after the drain, and the peaks of the heap and RSS during the drain.
func runBacklog(ctx context.Context, sys System, r *Result, sh backlogShape, sz Sizes) error {
	const q = "backlog"
	n := sh.n
	r.Messages = n
	p, err := openProducer(sys, q, Config{Capacity: n, Messages: n, MaxUnacked: sz.Prefetch})
	if err != nil {
		return err
	}
	defer p.Close()
	if sh.probe != nil {
		if err := sh.probe.start(r); err != nil {
			return err
		}
	}
	ph := begin()
	if err := fillSeq(p, q, 0, n, sh.batch); err != nil {
		return err
	}
	pubDur, pubMallocs := ph.end()
	r.Metrics["publish_rate"] = float64(n) / pubDur.Seconds()
	r.Metrics["publish_ns"] = float64(pubDur.Nanoseconds()) / float64(n)
	r.Metrics["publish_allocs_per_msg"] = allocsPerMsg(pubMallocs, n, n)
	r.Metrics["rss_backlog_bytes"] = float64(CurrentRSS())
	if srv, ok := sys.(interface{ ServerRSS() (int64, bool) }); ok {
		if b, ok := srv.ServerRSS(); ok {
			r.Metrics["server_rss_bytes"] = float64(b)
		}
	}

	if sh.probe != nil {
		if err := sh.probe.full(r, n); err != nil {
			return err
		}
	}

	rc, err := newReceiver(ctx, sys, q, sz.Prefetch, sz.Stall, "drain")
	if err != nil {
		return err
	}
	defer rc.close()
	chk, o := newChecker(n), newOrder(1)
	var pk *peaks
	if sh.probe != nil {
		pk = watch(sh.probe)
	}
	ph = begin()
	for range n {
		if err := rc.take(chk, o); err != nil {
			if pk != nil {
				pk.stop(r, "drain")
			}
			return err
		}
	}
	drainDur, drainMallocs := ph.end()
	if sh.probe != nil {
		pk.stop(r, "drain")
		if err := sh.probe.drained(r, n); err != nil {
			return err
		}
	}
	r.Metrics["drain_rate"] = float64(n) / drainDur.Seconds()
	r.Metrics["drain_ns"] = float64(drainDur.Nanoseconds()) / float64(n)
	r.Metrics["drain_allocs_per_msg"] = allocsPerMsg(drainMallocs, 0, n)
	r.Lost, r.Duplicates, r.OutOfOrder = chk.missing(), chk.dups.Load()+chk.bad.Load(), o.violations
	return nil
}

// runRequeue is W4: a queue of W4Queue messages; one consumer (prefetch W4Requeue) takes the
// first W4Requeue and holds them unacknowledged, then returns them the way the system offers
// and receives until each has come back. The time is from the return to the last of them
// received again; then everything is drained and the order of all deliveries after the
// return is compared with the original order.
func runRequeue(ctx context.Context, sys System, r *Result, sz Sizes) error {
	const q = "requeue"
	n, k := sz.W4Queue, sz.W4Requeue
	r.Messages = n
	p, err := openProducer(sys, q, Config{Capacity: n, Messages: n, MaxUnacked: k})
	if err != nil {
		return err
	}
	defer p.Close()
	if err := publishSeq(p, q, 0, n); err != nil {
		return err
	}
	rc, err := newReceiver(ctx, sys, q, k, sz.Stall, "requeue")
	if err != nil {
		return err
	}
	defer rc.close()
	c := rc.c
	held := make([]Delivery, 0, k)
	for len(held) < k {
		d, err := rc.next()
		if err != nil {
			return err
		}
		held = append(held, d)
	}
	ph := begin()
	if err := c.Requeue(held); err != nil {
		return fmt.Errorf("requeue: %w", err)
	}
	after := make([]uint64, 0, n)
	var pending []Delivery
	for back := 0; back < k; {
		d, err := rc.next()
		if err != nil {
			return err
		}
		seq := SeqOf(d.Body)
		after = append(after, seq)
		if seq < uint64(k) {
			back++
		}
		pending = append(pending, d)
	}
	dur, mallocs := ph.end()
	for _, d := range pending {
		if err := c.Ack(d); err != nil {
			return fmt.Errorf("ack: %w", err)
		}
	}
	for len(after) < n {
		d, err := rc.next()
		if err != nil {
			return err
		}
		after = append(after, SeqOf(d.Body))
		if err := c.Ack(d); err != nil {
			return fmt.Errorf("ack: %w", err)
		}
	}
	chk := newChecker(n)
	original := true
	var moved int64
	for i, seq := range after {
		chk.mark(seq)
		if seq != uint64(i) {
			original = false
			moved++
		}
	}
	r.Metrics["requeue_ms"] = float64(dur.Microseconds()) / 1000
	r.Metrics["requeue_ms_per_1k"] = r.Metrics["requeue_ms"] / (float64(k) / 1000)
	r.Metrics["requeue_rate"] = float64(k) / dur.Seconds()
	r.Metrics["requeue_allocs_per_msg"] = allocsPerMsg(mallocs, 0, k)
	r.Metrics["order_original"] = b2f(original)
	r.Metrics["positions_changed"] = float64(moved)
	r.Lost, r.Duplicates = chk.missing(), chk.dups.Load()+chk.bad.Load()
	// The order after a requeue is what W4 reports, not a failure of delivery: a system that
	// promises order for fresh messages may still redeliver returned ones elsewhere.
	r.OrderPromised = false
	if !original {
		r.Notes = append(r.Notes, fmt.Sprintf("after the return, %d of %d deliveries were not at their original position", moved, n))
	}
	return nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// S1CollectFirst makes S1 collect the heap after filling the backlog, before the timed phase.
var S1CollectFirst = true

// runDepth is S1: a backlog of depth messages, then, in batches, publish a batch (timed) and
// consume and acknowledge a batch from the head (timed), so the depth stays between depth
// and depth + batch. Then everything left is drained and checked.
func runDepth(ctx context.Context, sys System, r *Result, depth int, sz Sizes) error {
	const q = "depth"
	k, b := sz.S1Measure, sz.S1Batch
	total := depth + k
	r.Messages = total
	p, err := openProducer(sys, q, Config{Capacity: total + b, Messages: total, MaxUnacked: b})
	if err != nil {
		return err
	}
	defer p.Close()
	if err := publishSeq(p, q, 0, depth); err != nil {
		return err
	}
	// Start the measured phase from a collected heap, for every system alike: what is timed
	// is the per-message work at this depth, not a collection the fill happened to leave
	// running (which lands in some runs' 100k-message window and not in others').
	if S1CollectFirst {
		runtime.GC()
	}
	rc, err := newReceiver(ctx, sys, q, b, sz.Stall, "depth")
	if err != nil {
		return err
	}
	defer rc.close()
	chk, o := newChecker(total), newOrder(1)
	var pubDur, conDur time.Duration
	var pubMallocs, conMallocs uint64
	next := depth
	for done := 0; done < k; done += b {
		ph := begin()
		if err := publishSeq(p, q, next, next+b); err != nil {
			return err
		}
		next += b
		d, m := ph.end()
		pubDur, pubMallocs = pubDur+d, pubMallocs+m
		ph = begin()
		for range b {
			if err := rc.take(chk, o); err != nil {
				return err
			}
		}
		d, m = ph.end()
		conDur, conMallocs = conDur+d, conMallocs+m
	}
	measured := next - depth
	for range total - measured {
		if err := rc.take(chk, o); err != nil {
			return err
		}
	}
	r.Metrics["publish_ns"] = float64(pubDur.Nanoseconds()) / float64(measured)
	r.Metrics["consume_ns"] = float64(conDur.Nanoseconds()) / float64(measured)
	r.Metrics["total_ns"] = r.Metrics["publish_ns"] + r.Metrics["consume_ns"]
	r.Metrics["rate"] = 1e9 / r.Metrics["total_ns"]
	r.Metrics["publish_allocs_per_msg"] = allocsPerMsg(pubMallocs, measured, measured)
	r.Metrics["consume_allocs_per_msg"] = allocsPerMsg(conMallocs, 0, measured)
	r.Lost, r.Duplicates, r.OutOfOrder = chk.missing(), chk.dups.Load()+chk.bad.Load(), o.violations
	return nil
}

// TopicPattern is binding i's pattern in S2: three shapes, each matched by exactly one key.
func TopicPattern(i int) string {
	switch i % 3 {
	case 0:
		return "stock." + strconv.Itoa(i) + ".*"
	case 1:
		return "*." + strconv.Itoa(i)
	default:
		return "a." + strconv.Itoa(i) + ".#"
	}
}

// TopicKey is a routing key that matches binding i's pattern and no other.
func TopicKey(i int) string {
	switch i % 3 {
	case 0:
		return "stock." + strconv.Itoa(i) + ".x"
	case 1:
		return "z." + strconv.Itoa(i)
	default:
		return "a." + strconv.Itoa(i) + ".b"
	}
}

// topicTarget is the binding message s is routed through: a stride that visits every binding.
func topicTarget(s, bindings int) int { return int(uint64(s) * 7919 % uint64(bindings)) }

// runTopic is S2: a topic exchange with the given bindings over the given queues; every
// message's key matches exactly one binding. The time is publishing every message until the
// system confirms it routed (warren: Publish returns; NATS: a flush round trip; RabbitMQ:
// publisher confirms). Then each queue is drained and checked: every message in the queue
// its binding leads to, in order.
func runTopic(_ context.Context, tr TopicRouter, r *Result, bindings, queues int, sz Sizes) error {
	m := sz.S2Messages
	r.Messages = m
	patterns := make([]string, bindings)
	keys := make([]string, bindings)
	for i := range bindings {
		patterns[i], keys[i] = TopicPattern(i), TopicKey(i)
	}
	if err := tr.SetupTopic(patterns, queues); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	perBinding := make([]int, bindings)
	for s := range m {
		perBinding[topicTarget(s, bindings)]++
	}
	ph := begin()
	for s := range m {
		if err := tr.PublishTopic(keys[topicTarget(s, bindings)], NewBody(uint64(s))); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	if err := tr.FlushTopic(); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	dur, mallocs := ph.end()
	r.Metrics["route_ns"] = float64(dur.Nanoseconds()) / float64(m)
	r.Metrics["rate"] = float64(m) / dur.Seconds()
	r.Metrics["allocs_per_msg"] = allocsPerMsg(mallocs, m, m)
	lists, err := tr.DrainTopic(perBinding, queues)
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	chk := newChecker(m)
	var misrouted int64
	for li, list := range lists {
		o := newOrder(1)
		for _, seq := range list {
			chk.mark(seq)
			o.see(seq)
			t := topicTarget(int(seq), bindings)
			if (len(lists) == bindings && t != li) || (len(lists) != bindings && t%queues != li) {
				misrouted++
			}
		}
		r.OutOfOrder += o.violations
	}
	r.Lost, r.Duplicates = chk.missing(), chk.dups.Load()+chk.bad.Load()
	if misrouted > 0 {
		return fmt.Errorf("%d messages in the wrong queue", misrouted)
	}
	return nil
}

// SortedMetricNames lists a result's metrics, for stable output.
func SortedMetricNames(m map[string]float64) []string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// CaseIDs lists case IDs matching a comma-separated filter of workloads or case IDs ("" or
// "all": every case).
func CaseIDs(filter string, quick bool) ([]Case, error) {
	all := Cases(quick)
	if filter == "" || filter == "all" {
		return all, nil
	}
	var out []Case
	for f := range strings.SplitSeq(filter, ",") {
		f = strings.TrimSpace(f)
		found := false
		for _, c := range all {
			if c.ID == f || c.Workload == f {
				if !slices.ContainsFunc(out, func(o Case) bool { return o.ID == c.ID }) {
					out = append(out, c)
				}
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown workload or case %q", f)
		}
	}
	return out, nil
}

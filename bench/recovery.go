package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenmq/warren"
)

// The recovery measurement (cmd/bench -recovery): a backlog in one durable queue of a durable
// warren broker; how long Open takes to give it back after a clean Close and after the
// publishing process was killed; and how many bytes the log keeps on disk against the
// messages it holds: at the full backlog, once it is drained, and while a queue is held at a
// steady depth with messages flowing through it. Each step runs in a process of its own (the
// driver's -child), so that an open reads the log as a restarted process would.

// RecoveryQueue is the durable queue that holds the backlog.
const RecoveryQueue = "backlog"

// RecoveryFillBatch is how many messages FillBacklog publishes per PublishBatch.
const RecoveryFillBatch = 256

// The sync policies the recovery steps run under, by name: -recovery's SyncNever, and the
// -backlog mode's SyncInterval, warren-durable-interval's policy.
const (
	SyncNever    = "never"
	SyncInterval = "interval"
)

// syncPolicy is the policy named name.
func syncPolicy(name string) (warren.SyncPolicy, error) {
	switch name {
	case SyncNever:
		return warren.SyncNever, nil
	case SyncInterval:
		return warren.SyncInterval(WarrenSyncInterval), nil
	}
	return warren.SyncPolicy{}, fmt.Errorf("unknown sync policy %q (want %s or %s)", name, SyncNever, SyncInterval)
}

// fillBacklog opens a durable broker on dir under the sync policy named sync (SyncNever or
// SyncInterval: either way a publish is confirmed once written to the OS, which is what a
// process kill cannot take), declares the durable queue and publishes n persistent messages
// with sequence numbers 0 … n-1, returning once every one is confirmed, with the broker
// still open. r gets the fill's rate, the broker's memory budget and the log's size on disk at
// the full backlog.
func fillBacklog(dir string, n int, sync string, r *Result) (*warren.Broker, error) {
	r.Messages = n
	policy, err := syncPolicy(sync)
	if err != nil {
		return nil, err
	}
	b, err := warren.Open(dir, warren.WithSync(policy))
	if err != nil {
		return nil, err
	}
	if _, err := b.DeclareQueue(RecoveryQueue, warren.Durable()); err != nil {
		b.Close()
		return nil, err
	}
	t0 := time.Now()
	if err := publishBatches(b, RecoveryQueue, 0, n, RecoveryFillBatch); err != nil {
		b.Close()
		return nil, err
	}
	d := time.Since(t0)
	r.Metrics["fill_rate"] = float64(n) / d.Seconds()
	putBudget(r, "fill", b.Memory())
	if err := putDisk(r, dir, "backlog"); err != nil {
		b.Close()
		return nil, err
	}
	r.Metrics["backlog_disk_bytes_per_msg"] = r.Metrics["backlog_disk_bytes"] / float64(n)
	r.Metrics["backlog_body_bytes"] = float64(n * BodySize)
	return b, nil
}

// RunFill is fillBacklog as a verified result (case "recovery/fill"); the broker is nil when
// the fill failed.
func RunFill(dir string, n int, sync string) (Result, *warren.Broker) {
	r := Result{System: "warren-durable", Case: "recovery/fill", Metrics: map[string]float64{}}
	b, err := fillBacklog(dir, n, sync, &r)
	if err != nil {
		r.Error = err.Error()
	}
	r.PeakRSS = PeakRSS()
	r.verdict()
	return r, b
}

// RunOpen is openBacklog as a verified result of case c ("recovery/open-clean", …).
func RunOpen(ctx context.Context, c, dir string, want int, sync string) Result {
	r := Result{System: "warren-durable", Case: c, Metrics: map[string]float64{}}
	if err := openBacklog(ctx, dir, want, sync, &r); err != nil {
		r.Error = err.Error()
	}
	r.PeakRSS = PeakRSS()
	r.verdict()
	return r
}

// RunSteady is steady as a verified result (case "recovery/steady/<depth>").
func RunSteady(ctx context.Context, dir string, depth, through int) Result {
	r := Result{System: "warren-durable", Case: fmt.Sprintf("recovery/steady/%d", depth), Metrics: map[string]float64{}}
	if err := steady(ctx, dir, depth, through, &r); err != nil {
		r.Error = err.Error()
	}
	r.PeakRSS = PeakRSS()
	r.verdict()
	return r
}

// publishBatches publishes persistent messages from … to-1 to queue q, batch at a time.
func publishBatches(b *warren.Broker, q string, from, to, batch int) error {
	ps := make([]warren.Publishing, 0, batch)
	for s := from; s < to; s += batch {
		ps = ps[:0]
		for j := s; j < min(to, s+batch); j++ {
			ps = append(ps, warren.Publishing{Key: q, Message: warren.Message{Body: NewBody(uint64(j)), Persistent: true}})
		}
		if err := b.PublishBatch(context.Background(), ps); err != nil {
			return err
		}
	}
	return nil
}

// putDisk records the log's bytes and segments in dir as metrics prefix_disk_bytes and
// prefix_disk_files.
func putDisk(r *Result, dir, prefix string) error {
	bytes, files, err := WALUsage(dir)
	if err != nil {
		return err
	}
	r.Metrics[prefix+"_disk_bytes"], r.Metrics[prefix+"_disk_files"] = float64(bytes), float64(files)
	return nil
}

// openBacklog times warren.Open on dir, under the sync policy named sync, until the broker is
// usable: the durable queue is there and holds want messages (open_ms, then the RSS), and
// until a consumer has its first delivery (first_delivery_ms). After a collection it reads
// the live heap, then drains the queue with one consumer (prefetch 256, an ack each),
// checking that every message comes back once and in order, and sampling the peaks of the
// heap and the RSS; then it measures the log's disk use: right after the drain, once the
// released segments are gone (or after a few seconds), and after Close.
func openBacklog(ctx context.Context, dir string, want int, sync string, r *Result) error {
	r.Messages = want
	r.OrderPromised = true
	policy, err := syncPolicy(sync)
	if err != nil {
		return err
	}
	t0 := time.Now()
	// No listener: a broker with one keeps a whole Message beside every message (message.go's
	// envelope), which would weigh on the open's time and memory; Broker.Recovery says what
	// was repaired.
	b, err := warren.Open(dir, warren.WithSync(policy))
	if err != nil {
		return err
	}
	defer b.Close()
	q, err := b.Queue(RecoveryQueue)
	if err != nil {
		return fmt.Errorf("after open: %w", err)
	}
	n := q.Len()
	open := time.Since(t0)
	r.Metrics["open_ms"] = float64(open.Microseconds()) / 1000
	r.Metrics["open_rss_bytes"] = float64(CurrentRSS())
	rec := b.Recovery()
	r.Metrics["repaired_events"] = float64(len(rec.Cut) + len(rec.Skipped) + len(rec.Queues))
	if rec.Checkpoint {
		r.Metrics["open_from_checkpoint"] = 1
	}
	putBudget(r, "open", b.Memory())
	if n != want {
		return fmt.Errorf("after open the queue holds %d messages, want %d", n, want)
	}
	c, err := q.Consume(ctx, warren.Prefetch(256))
	if err != nil {
		return err
	}
	defer c.Cancel()
	chk, o := newChecker(want), newOrder(1)
	var t1 time.Time
	var pk *peaks
	defer func() {
		if pk != nil {
			pk.stop(r, "drain")
		}
	}()
	for i := range want {
		var d warren.Delivery
		var ok bool
		select {
		case d, ok = <-c.Deliveries():
		case <-ctx.Done():
			return fmt.Errorf("drain: %d of %d: %w", i, want, context.Cause(ctx))
		}
		if !ok {
			return fmt.Errorf("drain: consumer ended after %d of %d: %v", i, want, c.Err())
		}
		if i == 0 {
			r.Metrics["first_delivery_ms"] = float64(time.Since(t0).Microseconds()) / 1000
			// The heap as the open left it (less the prefetched deliveries), collected
			// outside the timings.
			runtime.GC()
			r.Metrics["open_heap_live_bytes"] = float64(HeapLive())
			pk = watch(nil)
			t1 = time.Now()
		}
		seq := SeqOf(d.Message.Body)
		chk.mark(seq)
		o.see(seq)
		if err := d.Ack(); err != nil {
			return err
		}
	}
	r.Metrics["drain_rate"] = float64(want) / time.Since(t1).Seconds()
	pk.stop(r, "drain")
	pk = nil
	r.Lost, r.Duplicates, r.OutOfOrder = chk.missing(), chk.dups.Load()+chk.bad.Load(), o.violations
	if err := putDisk(r, dir, "drained"); err != nil {
		return err
	}
	// Segments go once the acks that free them are written (within the log's 1 ms flush
	// delay) and the log writes again: wait for the count to settle.
	t2 := time.Now()
	deadline := t2.Add(5 * time.Second)
	var files int
	for {
		_, files, err = WALUsage(dir)
		if err != nil {
			return err
		}
		if files <= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.Metrics["release_ms"] = float64(time.Since(t2).Microseconds()) / 1000
	if err := putDisk(r, dir, "released"); err != nil {
		return err
	}
	c.Cancel()
	b.Close()
	return putDisk(r, dir, "closed")
}

// steady holds a durable queue of a broker opened on dir (SyncInterval(100 ms)) at a depth
// between depth and depth + 1000 while through messages flow through it: publish 1000 (one
// PublishBatch), then consume and ack 1000 from the head, and again. A sampler reads the
// log's size on disk when the flow starts, every 20 ms, and when it ends. Live bytes are the
// messages the queue holds times the bytes a message's record takes on disk, measured at the
// end of the fill (the log then holds nothing but the fill's records and the queue's
// declaration); a message is live from its publish to its ack (delivered and not yet acked,
// it still is).
func steady(ctx context.Context, dir string, depth, through int, r *Result) error {
	const batch = 1000
	r.Messages = depth + through
	r.OrderPromised = true
	b, err := warren.Open(dir, warren.WithSync(warren.SyncInterval(100*time.Millisecond)))
	if err != nil {
		return err
	}
	defer b.Close()
	q, err := b.DeclareQueue(RecoveryQueue, warren.Durable())
	if err != nil {
		return err
	}
	if err := publishBatches(b, RecoveryQueue, 0, depth, RecoveryFillBatch); err != nil {
		return err
	}
	// The fill's last records may wait for the flush timer (declaration records do not):
	// PublishBatch returned, so they are written.
	fillBytes, _, err := WALUsage(dir)
	if err != nil {
		return err
	}
	perMsg := float64(fillBytes) / float64(depth)
	r.Metrics["record_bytes_per_msg"] = perMsg

	var (
		mu              sync.Mutex
		maxBytes, sum   int64
		maxFiles, count int
		maxRatio        float64
		live            atomic.Int64
	)
	live.Store(int64(depth))
	sample := func() error {
		bytes, files, err := WALUsage(dir)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		maxBytes, maxFiles = max(maxBytes, bytes), max(maxFiles, files)
		sum += bytes
		count++
		maxRatio = max(maxRatio, float64(bytes)/(float64(live.Load())*perMsg))
		return nil
	}
	stop := make(chan struct{})
	sampled := make(chan error, 1)
	go func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			if err := sample(); err != nil {
				sampled <- err
				return
			}
			select {
			case <-stop:
				sampled <- nil
				return
			case <-t.C:
			}
		}
	}()
	c, err := q.Consume(ctx, warren.Prefetch(batch))
	if err != nil {
		return err
	}
	defer c.Cancel()
	chk, o := newChecker(depth+through), newOrder(1)
	// take checks a delivery (every message once, in order) and acks it.
	take := func(d warren.Delivery, ok bool) error {
		if !ok {
			return fmt.Errorf("consumer ended: %v", c.Err())
		}
		seq := SeqOf(d.Message.Body)
		chk.mark(seq)
		o.see(seq)
		return d.Ack()
	}
	t0 := time.Now()
	next := depth
	for next < depth+through {
		if err := publishBatches(b, RecoveryQueue, next, next+batch, batch); err != nil {
			return err
		}
		live.Add(batch)
		next += batch
		for range batch {
			var d warren.Delivery
			var ok bool
			select {
			case d, ok = <-c.Deliveries():
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			if err := take(d, ok); err != nil {
				return err
			}
			live.Add(-1)
		}
	}
	elapsed := time.Since(t0)
	close(stop)
	if err := <-sampled; err != nil {
		return err
	}
	if err := sample(); err != nil { // the end of the flow
		return err
	}
	endBytes, endFiles, err := WALUsage(dir)
	if err != nil {
		return err
	}
	liveBytes := float64(depth) * perMsg
	mu.Lock()
	defer mu.Unlock()
	r.Metrics["steady_rate"] = float64(through) / elapsed.Seconds()
	r.Metrics["live_bytes"] = liveBytes
	r.Metrics["live_body_bytes"] = float64(depth * BodySize)
	r.Metrics["disk_max_bytes"] = float64(maxBytes)
	r.Metrics["disk_mean_bytes"] = float64(sum) / float64(count)
	r.Metrics["disk_end_bytes"] = float64(endBytes)
	r.Metrics["disk_max_files"] = float64(maxFiles)
	r.Metrics["disk_end_files"] = float64(endFiles)
	r.Metrics["disk_max_over_live"] = maxRatio
	r.Metrics["disk_mean_over_live"] = r.Metrics["disk_mean_bytes"] / liveBytes
	r.Metrics["samples"] = float64(count)
	// What is left in the queue is the depth: drain it too, so that every message is checked.
	for range depth {
		select {
		case d, ok := <-c.Deliveries():
			if err := take(d, ok); err != nil {
				return err
			}
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	r.Lost, r.Duplicates, r.OutOfOrder = chk.missing(), chk.dups.Load()+chk.bad.Load(), o.violations
	return nil
}

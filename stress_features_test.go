package warren_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warrenmq/warren"
)

// TestStressFeatures runs the consumer features under real concurrency: a priority queue
// (MaxPriority(3), messages of priorities 0..4), once plain and once with a single active
// consumer. Producers publish while consumer goroutines start consumers with random options —
// AutoAck or manual acknowledgement, prefetch, consumer priority, sometimes a selector,
// sometimes an ack timeout of a few milliseconds — that ack, nack, reject (into a dead-letter
// queue), hold deliveries and settle them later (one by one or with AckUpTo), recover, and end
// by Cancel or by their context after a random number of deliveries; and a Queue.Serve pool runs
// for the first two thirds of the run, its handler acking, failing, rejecting, panicking, or
// settling the delivery itself.
//
// Every message must be finally settled exactly once: acked, received by an AutoAck consumer,
// or rejected and then found in the dead-letter queue exactly once. The delivery counts a
// message is received with must be exactly 0, 1, …, r-1 for its r receptions, in any order
// (every reception that did not settle it returned it redelivered; an ack timeout does so
// asynchronously, so the order in which receptions are recorded is not the order of delivery).
// With a single active consumer, no consumer may receive while another one that has received is
// still active.
//
// The seed is that of TestStress (-warren.stressseed or $WARREN_STRESS_SEED).
func TestStressFeatures(t *testing.T) {
	n := 50_000
	if testing.Short() {
		n = 10_000
	}
	seed := stressSeed(t)
	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Minute)
	}
	t.Run("priority", func(t *testing.T) {
		runStressFeatures(t, seed, n, false, time.Until(deadline)/3)
	})
	t.Run("priority single active", func(t *testing.T) {
		runStressFeatures(t, seed+1, n, true, time.Until(deadline)/2)
	})
}

const (
	featProducers = 8
	featConsumers = 6
)

// featPriority is the priority message id is published with: 0..4, on a queue whose maximum
// is 3.
func featPriority(id int) uint8 { return uint8(mix(uint64(id), 0x9e37) % 5) }

// featID parses a message body, without allocating (selectors run it under the queue lock);
// -1 if it is not a decimal id.
func featID(body []byte) int {
	if len(body) == 0 {
		return -1
	}
	id := 0
	for _, c := range body {
		if c < '0' || c > '9' {
			return -1
		}
		id = id*10 + int(c-'0')
	}
	return id
}

// featHolder is one consumer (or Serve pool) of the single-active-consumer check.
type featHolder struct {
	received atomic.Bool // it has received a delivery, so it has been the active consumer
	stopped  func() bool // it is no longer active; a false answer must be true to the library
}

type featStress struct {
	t    *testing.T
	seed uint64
	n    int
	sac  bool
	q    *warren.Queue
	ctx  context.Context // the run's; it ends when the run is over, stopping every consumer

	recv     []atomic.Int32  // receptions per id
	counts   []atomic.Uint64 // bit k: a reception with DeliveryCount k (k < 64)
	settled  []atomic.Int32  // final settlements per id
	rejected []atomic.Bool   // the final settlement was a reject (dead-lettered)
	nSettled atomic.Int64
	done     chan struct{} // closed when every id is settled
	errs     atomic.Int32

	holdersMu sync.Mutex
	holders   map[*featHolder]struct{}

	// Counters for the log.
	acks, upTos, autoAcks, nacks, rejects, recovers, cancels, ctxEnds, timeouts, lateSettles, idles,
	selectors, serveRuns, serveAcks, serveSelfAcks, serveFails, serveRejects, panics, panicEvents, bigCounts atomic.Int64
}

func (s *featStress) errorf(format string, args ...any) {
	if s.errs.Add(1) <= 20 {
		s.t.Errorf(format, args...)
	}
}

// received records a reception of d by h (nil for the final drain) and checks it.
func (s *featStress) received(d warren.Delivery, h *featHolder) int {
	id := featID(d.Message.Body)
	if id < 0 || id >= s.n {
		s.errorf("delivery with body %q", d.Message.Body)
		return -1
	}
	s.recv[id].Add(1)
	if dc := d.DeliveryCount; dc < 0 || dc >= 64 {
		s.bigCounts.Add(1)
	} else if old := s.counts[id].Or(1 << dc); old&(1<<dc) != 0 {
		s.errorf("id %d received twice with DeliveryCount %d", id, dc)
	}
	if d.Redelivered != (d.DeliveryCount > 0) {
		s.errorf("id %d: Redelivered=%t with DeliveryCount=%d", id, d.Redelivered, d.DeliveryCount)
	}
	if p := featPriority(id); d.Message.Priority != p {
		s.errorf("id %d: Priority %d, published with %d", id, d.Message.Priority, p)
	}
	if s.sac && h != nil {
		s.checkSingleActive(h, id)
	}
	return id
}

// checkSingleActive checks, as h receives, that no other consumer that has received is still
// active. A consumer that has received was active, and one not stopped is still active; if h is
// itself still active after the check, both were active at once.
func (s *featStress) checkSingleActive(h *featHolder, id int) {
	h.received.Store(true)
	others := 0
	s.holdersMu.Lock()
	for o := range s.holders {
		if o != h && o.received.Load() && !o.stopped() {
			others++
		}
	}
	s.holdersMu.Unlock()
	if others > 0 && !h.stopped() {
		s.errorf("single active consumer: id %d received while %d other consumers that received are active", id, others)
	}
}

func (s *featStress) register(h *featHolder) {
	s.holdersMu.Lock()
	s.holders[h] = struct{}{}
	s.holdersMu.Unlock()
}

func (s *featStress) unregister(h *featHolder) {
	s.holdersMu.Lock()
	delete(s.holders, h)
	s.holdersMu.Unlock()
}

// settle records the final settlement of id.
func (s *featStress) settle(id int, rejected bool) {
	if id < 0 {
		return
	}
	if n := s.settled[id].Add(1); n != 1 {
		s.errorf("id %d settled %d times (received %d times)", id, n, s.recv[id].Load())
	}
	if rejected {
		s.rejected[id].Store(true)
	}
	if s.nSettled.Add(1) == int64(s.n) {
		close(s.done)
	}
}

// settleErr accounts for a settlement's error: nil settled; ErrAlreadySettled is allowed when
// an ack timeout or the end of the run may have taken the delivery back.
func (s *featStress) settleErr(what string, id int, err error, timeout time.Duration) bool {
	switch {
	case err == nil:
		return true
	case (timeout > 0 || s.ctx.Err() != nil) && errors.Is(err, warren.ErrAlreadySettled):
		s.lateSettles.Add(1)
	default:
		s.errorf("id %d: %s = %v, want nil", id, what, err)
	}
	return false
}

// ack records a successful ack of id.
func (s *featStress) ack(id int) {
	s.acks.Add(1)
	s.settle(id, false)
}

// countUpTo counts a successful AckUpTo, for the log.
func (s *featStress) countUpTo() { s.upTos.Add(1) }

// ackDelivery acks d, received as id, and records the ack if it settled d (see settleErr).
func (s *featStress) ackDelivery(d warren.Delivery, id int, timeout time.Duration) {
	if s.settleErr("Ack()", id, d.Ack(), timeout) {
		s.ack(id)
	}
}

func runStressFeatures(t *testing.T, seed uint64, n int, sac bool, watchdog time.Duration) {
	leak := goleak.IgnoreCurrent()
	b := warren.New()
	defer b.Close()
	s := &featStress{
		t: t, seed: seed, n: n, sac: sac,
		recv: make([]atomic.Int32, n), counts: make([]atomic.Uint64, n), settled: make([]atomic.Int32, n),
		rejected: make([]atomic.Bool, n), done: make(chan struct{}), holders: map[*featHolder]struct{}{},
	}
	dlq, err := b.DeclareQueue("dlq")
	require.NoError(t, err)
	opts := []warren.QueueOption{warren.MaxPriority(3), warren.DeadLetter("", "dlq")}
	if sac {
		opts = append(opts, warren.SingleActiveConsumer())
	}
	s.q, err = b.DeclareQueue("q", opts...)
	require.NoError(t, err)
	stopListening := b.Listen(func(e warren.Event) {
		if e.Kind == warren.EventHandlerPanicked {
			s.panicEvents.Add(1)
		}
	})
	defer stopListening()
	spans := checkSpans(t, b) // every message's events, under real concurrency (events.go)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	s.ctx = ctx
	start := time.Now()
	var wg sync.WaitGroup
	for p := range featProducers {
		wg.Go(func() {
			for id := p; id < n; id += featProducers {
				msg := warren.Message{Body: strconv.AppendInt(nil, int64(id), 10), Priority: featPriority(id)}
				if err := b.Publish(ctx, "", "q", msg); err != nil {
					if ctx.Err() == nil {
						s.errorf("Publish(%d) = %v, want nil", id, err)
					}
					return
				}
				if id%128 == p {
					runtime.Gosched()
				}
			}
		})
	}
	for w := range featConsumers {
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			for !s.over(ctx) {
				s.incarnation(ctx, rng)
			}
		})
	}
	wg.Go(func() { s.serve(ctx, &wg, rand.New(rand.NewPCG(seed, featConsumers))) })

	select {
	case <-s.done:
	case <-time.After(watchdog):
		s.errorf("watchdog after %v: settled %d of %d; Len()=%d Unacked()=%d ConsumerCount()=%d, dead letters %d; goroutines in %s",
			time.Since(start), s.nSettled.Load(), n, s.q.Len(), s.q.Unacked(), s.q.ConsumerCount(), dlq.Len(), dumpStacks(t))
	}
	settledIn := time.Since(start)
	stop()
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(max(watchdog/4, 10*time.Second)):
		s.errorf("goroutines still running after the run was stopped; goroutines in %s", dumpStacks(t))
		require.NoError(t, b.Close())
		<-finished
	}

	// The final drain: nothing should be left, ready or outstanding.
	drained := 0
	for {
		d, err := s.q.Get(context.Background())
		if err != nil {
			if !errors.Is(err, warren.ErrEmpty) {
				s.errorf("final drain: Get() = %v", err)
			}
			break
		}
		drained++
		id := s.received(d, nil)
		if err := d.Ack(); err != nil {
			s.errorf("final drain: Ack() = %v", err)
		} else {
			s.settle(id, false)
		}
	}
	if drained > 0 {
		s.errorf("final drain found %d messages in the queue", drained)
	}
	if n := s.q.Len(); n != 0 {
		s.errorf("Len() = %d after the drain, want 0", n)
	}
	if n := s.q.Unacked(); n != 0 {
		s.errorf("Unacked() = %d after the drain, want 0", n)
	}
	if n := s.q.ConsumerCount(); n != 0 {
		s.errorf("ConsumerCount() = %d at the end, want 0", n)
	}

	// The dead letters: exactly the rejected ids, once each.
	dead := make([]int, n)
	for {
		d, err := dlq.Get(context.Background(), warren.AutoAck())
		if err != nil {
			if !errors.Is(err, warren.ErrEmpty) {
				s.errorf("dead letters: Get() = %v", err)
			}
			break
		}
		id := featID(d.Message.Body)
		if id < 0 || id >= n {
			s.errorf("dead letter with body %q", d.Message.Body)
			continue
		}
		if dead[id]++; dead[id] == 2 {
			s.errorf("id %d dead-lettered more than once", id)
		}
		if r := d.Message.Headers["x-first-death-reason"]; r != "rejected" {
			s.errorf("id %d dead-lettered with x-first-death-reason %v, want rejected", id, r)
		}
	}

	// Everything was acked in the end, so every span of events is closed.
	if open := spans.openSpans(); len(open) > 0 {
		s.errorf("%d messages whose events say they are still in a queue, e.g. %v", len(open), open[:min(len(open), 5)])
	}

	lost, dup, mismatch, redeliveries := 0, 0, 0, 0
	for id := range n {
		switch k := s.settled[id].Load(); {
		case k == 0:
			if lost++; lost <= 10 {
				s.errorf("id %d never settled (received %d times, dead-lettered %d times)", id, s.recv[id].Load(), dead[id])
			}
		case k > 1:
			dup++
		}
		if r := s.rejected[id].Load(); r != (dead[id] > 0) {
			if mismatch++; mismatch <= 10 {
				s.errorf("id %d: rejected %t but dead-lettered %d times", id, r, dead[id])
			}
		}
		r := int(s.recv[id].Load())
		redeliveries += r - 1
		if want := uint64(1)<<r - 1; r < 64 && s.counts[id].Load() != want {
			s.errorf("id %d: received %d times with delivery counts %b, want 0..%d once each", id, r, s.counts[id].Load(), r-1)
		}
	}
	if lost > 0 || dup > 0 || mismatch > 0 {
		s.errorf("%d ids lost, %d settled more than once, %d dead-letter mismatches, of %d", lost, dup, mismatch, n)
	}
	if p, e := s.panics.Load(), s.panicEvents.Load(); p != e {
		s.errorf("%d handler panics, %d EventHandlerPanicked events", p, e)
	}
	t.Logf("%d messages settled in %v: %d redeliveries (%d counts over 63); consumers: %d acks, %d AckUpTo, %d auto-acked, %d nacks, %d rejects, %d recovers, %d cancels, %d context ends, %d ack timeouts, %d settlements too late, %d selective, %d idle ends; serve: %d runs, %d acks, %d self-acks, %d failures, %d rejects, %d panics",
		n, settledIn, redeliveries, s.bigCounts.Load(), s.acks.Load(), s.upTos.Load(), s.autoAcks.Load(), s.nacks.Load(), s.rejects.Load(),
		s.recovers.Load(), s.cancels.Load(), s.ctxEnds.Load(), s.timeouts.Load(), s.lateSettles.Load(), s.selectors.Load(), s.idles.Load(),
		s.serveRuns.Load(), s.serveAcks.Load(), s.serveSelfAcks.Load(), s.serveFails.Load(), s.serveRejects.Load(), s.panics.Load())

	stopListening()
	require.NoError(t, b.Close())
	goleak.VerifyNone(t, leak)
}

// over reports whether the run is over: every message settled, or stopped.
func (s *featStress) over(ctx context.Context) bool {
	select {
	case <-s.done:
		return true
	case <-ctx.Done():
		return true
	default:
		return false
	}
}

// incarnation runs one consumer with random options for a random number of deliveries.
func (s *featStress) incarnation(ctx context.Context, rng *rand.Rand) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	autoAck := rng.IntN(4) == 0
	prefetch := 1 + rng.IntN(8)
	opts := []warren.ConsumeOption{warren.Prefetch(prefetch), warren.ConsumerPriority(rng.IntN(3))}
	if autoAck {
		opts = append(opts, warren.AutoAck())
	}
	var (
		sel   func(*warren.Message) bool
		idle  *time.Timer
		idleC <-chan time.Time
	)
	idleFor := time.Duration(1+rng.IntN(5)) * time.Millisecond
	if rng.IntN(3) == 0 {
		k := 2 + rng.IntN(3)
		r := rng.IntN(k)
		sel = func(m *warren.Message) bool { return featID(m.Body)%k == r }
		opts = append(opts, warren.Selector(sel))
		// A selective consumer may wait for messages that are not there (with a single active
		// consumer, it holds the queue up meanwhile): it ends when idle.
		idle = time.NewTimer(idleFor)
		defer idle.Stop()
		idleC = idle.C
		s.selectors.Add(1)
	}
	var timeout time.Duration
	stall := false
	if !autoAck && rng.IntN(4) == 0 {
		timeout = time.Duration(2+rng.IntN(8)) * time.Millisecond
		opts = append(opts, warren.AckTimeout(timeout))
		// Half of these keep what they hold while they wait, until the timeout takes it back.
		stall = rng.IntN(2) == 0
	}
	c, err := s.q.Consume(cctx, opts...)
	if err != nil {
		if ctx.Err() == nil {
			s.errorf("Consume() = %v, want nil", err)
		}
		return
	}
	h := &featHolder{stopped: func() bool { return c.Err() != nil }}
	s.register(h)
	defer s.unregister(h)

	// held are deliveries received and not yet settled, in tag order; they are settled before
	// the consumer waits, so that the credit they block is not what the rest of the run needs
	// (unless the consumer stalls: then its ack timeout takes them back).
	held := &stressHeld{c: c, l: s, rng: rng}
	flush := func() {
		switch {
		case len(held.ds) == 0:
		case timeout == 0 && ctx.Err() == nil && rng.IntN(2) == 0:
			// Without an ack timeout nothing takes the held deliveries back (until the run
			// is over), so AckUpTo, whose tag 0 covers exactly what is held, settles them all.
			held.flush()
		default:
			held.settleEach(func(d warren.Delivery, id int) { s.ackDelivery(d, id, timeout) })
		}
	}
	flushBeforeWait := flush
	if stall {
		flushBeforeWait = nil
	}

	exit, timedOut := false, false
receive:
	for range 1 + rng.IntN(300) {
		d, got := stressReceive(ctx, c, s.done, idleC, flushBeforeWait)
		switch got {
		case stressIdle:
			s.idles.Add(1)
			break receive
		case stressOver:
			exit = true
			break receive
		case stressClosed:
			if ctx.Err() != nil {
				exit = true // the run is over: its context has ended the consumer
				break receive
			}
			// Only an ack timeout ends a consumer from outside in this test.
			if err := c.Err(); timeout == 0 || !errors.Is(err, warren.ErrAckTimeout) {
				s.errorf("Deliveries() closed under an active consumer: Err() = %v (ack timeout %v)", err, timeout)
			}
			s.timeouts.Add(1)
			timedOut = true
			break receive
		}
		if idle != nil {
			idle.Reset(idleFor)
		}
		id := s.received(d, h)
		if sel != nil && !sel(&d.Message) {
			s.errorf("selective consumer received id %d, which its selector refuses", id)
		}
		if autoAck {
			s.autoAcks.Add(1)
			s.settle(id, false)
			continue
		}
		switch r := rng.IntN(100); {
		case r < 8:
			if s.settleErr("Nack()", id, d.Nack(), timeout) {
				s.nacks.Add(1)
			}
		case r < 11:
			if s.settleErr("Reject()", id, d.Reject(), timeout) {
				s.rejects.Add(1)
				s.settle(id, true)
			}
		case r < 13:
			held.recoverAll() // everything held goes back, d with it
			s.recovers.Add(1)
		case r < 40:
			held.hold(d, id)
		default:
			s.ackDelivery(d, id, timeout)
		}
	}

	switch {
	case exit:
		// The run is over (or stopped): what is held goes back with the context.
		cancel()
		<-c.Done()
		s.checkStopped(c, timeout)
	case timedOut:
		// Everything held has gone back: settling it fails.
		flush()
	case rng.IntN(3) == 0:
		// End by the context: what is held goes back redelivered.
		cancel()
		<-c.Done()
		if err := c.Err(); err != context.Canceled && (timeout == 0 || !errors.Is(err, warren.ErrAckTimeout)) {
			s.errorf("Err() after the context ended = %v, want context.Canceled", err)
		}
		s.checkStopped(c, timeout)
		s.ctxEnds.Add(1)
	default:
		// End by Cancel: what is buffered goes back unchanged, what is held stays settle-able.
		if err := c.Cancel(); err != nil {
			s.errorf("Cancel() = %v, want nil", err)
		}
		// Unless an ack timeout or the end of the run (which ends every consumer's context)
		// came first.
		if err := c.Err(); err != warren.ErrCancelled && (timeout == 0 || !errors.Is(err, warren.ErrAckTimeout)) &&
			(ctx.Err() == nil || err != context.Canceled) {
			s.errorf("Err() after Cancel = %v, want ErrCancelled", err)
		}
		s.checkStopped(c, timeout)
		if rng.IntN(4) == 0 {
			held.settleEach(func(d warren.Delivery, id int) {
				if s.settleErr("Nack() after Cancel", id, d.Nack(), timeout) {
					s.nacks.Add(1)
				}
			})
		}
		flush()
		s.cancels.Add(1)
	}
}

// checkStopped checks that a stopped consumer's Deliveries is closed and empty.
func (s *featStress) checkStopped(c *warren.Consumer, timeout time.Duration) {
	select {
	case d, ok := <-c.Deliveries():
		if ok {
			s.errorf("Deliveries() yielded id %q after the consumer stopped (Err() = %v, ack timeout %v)", d.Message.Body, c.Err(), timeout)
		}
	default:
		s.errorf("Deliveries() not closed after the consumer stopped (Err() = %v)", c.Err())
	}
}

var errFeatTransient = errors.New("transient failure")

// serve runs Queue.Serve pools one after another, each for a random number of deliveries, until
// two thirds of the messages are settled.
func (s *featStress) serve(ctx context.Context, wg *sync.WaitGroup, rng *rand.Rand) {
	for !s.over(ctx) && s.nSettled.Load() < int64(s.n)*2/3 {
		workers := 1 + rng.IntN(4)
		opts := []warren.ServeOption{warren.Workers(workers), warren.ConsumerPriority(rng.IntN(3))}
		if rng.IntN(2) == 0 {
			opts = append(opts, warren.Prefetch(workers+rng.IntN(8)))
		}
		limit := int64(20 + rng.IntN(400))
		sctx, scancel := context.WithCancel(ctx)
		wg.Go(func() {
			select {
			case <-s.done:
			case <-sctx.Done():
			}
			scancel()
		})
		h := &featHolder{stopped: func() bool { return sctx.Err() != nil }}
		s.register(h)
		var handled atomic.Int64
		err := s.q.Serve(sctx, func(_ context.Context, d warren.Delivery) error {
			if handled.Add(1) == limit {
				scancel() // the pool stops gracefully: this result still applies
			}
			return s.handle(d, h)
		}, opts...)
		scancel()
		s.unregister(h)
		if err != nil {
			s.errorf("Serve() = %v, want nil", err)
		}
		s.serveRuns.Add(1)
	}
}

// handle is the Serve handler. Its outcome is a function of the message and its delivery
// count, so that a message that failed has another outcome on its next delivery.
func (s *featStress) handle(d warren.Delivery, h *featHolder) error {
	id := s.received(d, h)
	if id < 0 {
		return nil
	}
	switch r := mix(s.seed^uint64(id), uint64(d.DeliveryCount)) % 100; {
	case r < 5:
		// The handler settles the delivery itself; Serve leaves it alone, whatever it returns.
		if err := d.Ack(); err != nil {
			s.errorf("id %d: Ack() in the handler = %v, want nil", id, err)
		} else {
			s.serveSelfAcks.Add(1)
			s.settle(id, false)
		}
		if r < 2 {
			return errFeatTransient
		}
		return nil
	case r < 70:
		// Serve acks it; without an ack timeout nothing can take it back first.
		s.serveAcks.Add(1)
		s.settle(id, false)
		return nil
	case r < 90:
		s.serveFails.Add(1)
		return fmt.Errorf("id %d: %w", id, errFeatTransient)
	case r < 96:
		s.serveRejects.Add(1)
		s.settle(id, true)
		return warren.Permanent(fmt.Errorf("id %d: cannot be processed", id))
	case r < 97:
		s.panics.Add(1)
		panic(fmt.Sprintf("handler panic on id %d", id))
	default:
		s.serveFails.Add(1)
		return errFeatTransient
	}
}

package warren_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warrenmq/warren"
)

// TestStressScale is the reliability suite's stress test: 16 producers and 16 consumer
// goroutines on one work queue with everything that can take a message out of it switched on,
// at scale (WARREN_STRESS_N=1000000 for the long run, scripts/stress-long).
//
// Topology. Producers publish through the direct exchange "in" with routing key "kept" or, for
// one id in ten, "lost"; both keys lead to the work queue, which has a queue TTL, a delivery
// limit of 3, a length limit with the Block policy (the producers' backpressure), and the
// dead-letter exchange "dlx", which routes only "kept" to the dead-letter queue "dlq". Some
// messages carry their own TTL: "0" for one id in a thousand, 1 to 20 ms for one in fifty (which
// expire in the backlog and are dead-lettered "expired"). Every 300 to 700 ms the consumers
// pause for 20 to 80 ms, and every eighth time for longer than the queue's TTL of 1 s, so that
// backlogs build up and expire. One id in 997 is poison: every
// consumer fails it, until the delivery limit dead-letters it. Dead letters of "lost" messages
// route nowhere and are dropped (dlx-no-route). The dead-letter queue has no dead-letter
// exchange, a length limit of 500 (drop-head) and a TTL of 200 ms, and its two drainers pause
// now and then, so some dead letters are dropped or expire there.
//
// Consumers. Each of the 16 goroutines runs consumers one after another with a random prefetch
// for a random number of deliveries, acking most (one by one or with AckUpTo), nacking,
// rejecting (dead-lettered "rejected"), recovering, and ending by Cancel or by the end of their
// context; between them it takes a few messages with Get, abandoning some to the end of the Get's
// context. A quarter of the goroutines alternate with Queue.Serve pools (1 to 4 workers, half with
// a Backoff) whose handler acks, fails, rejects or panics as a function of the message and its
// delivery count.
//
// Accounting. Every published id must end exactly once: acked in the work queue, or dropped
// there (dlx-no-route), or dead-lettered and then acked, dropped (maxlen) or expired in the
// dead-letter queue. Two independent views must agree id by id: the test's own, from the results
// of its calls (Ack, AckUpTo, Reject and Serve results; Gets and receptions from the DLQ), and the
// events' (a listener counting terminal events per queue and id, by the "id" header that
// dead-letter copies keep). Besides: every reception has DeliveryCount 0, 1, … once each and never
// above the delivery limit, Redelivered says whether it is above 0; a rejected id is
// dead-lettered "rejected" and only those; a poison id never acked; a "lost" id never reaches
// the DLQ; what the DLQ receives has the x-death of its reason. At the end both queues are empty
// with nothing unacked, the span checker (checkSpans, helpers_test.go) saw no broken span and
// none is open, every publish was evented once, the work queue's Stats counters match the
// events, and after Close no goroutine is left (goleak).
//
// Size: $WARREN_STRESS_N or -warren.stressn; default 100,000, 20,000 with -short. Seed:
// -warren.stressseed or $WARREN_STRESS_SEED (shared with TestStress). A stall watchdog (no id
// settled for 60 s, $WARREN_STRESS_STALL to change) or the test's deadline stops the run and
// dumps every goroutine's stack to a file.
func TestStressScale(t *testing.T) {
	n := scMessages(t)
	seed := stressSeed(t)
	runStressScale(t, seed, n)
}

var scNFlag = flag.Int("warren.stressn", 0, "messages of TestStressScale; 0: 100000, 20000 with -short (also $WARREN_STRESS_N)")

// scMessages returns the size of the run: the flag, the environment, or the default.
func scMessages(t *testing.T) int {
	t.Helper()
	n := *scNFlag
	if s := os.Getenv("WARREN_STRESS_N"); n == 0 && s != "" {
		v, err := strconv.Atoi(s)
		require.NoError(t, err, "WARREN_STRESS_N")
		n = v
	}
	if n <= 0 {
		n = 100_000
		if testing.Short() {
			n = 20_000
		}
	}
	return n
}

const (
	scProducers   = 16
	scConsumers   = 16
	scDrainers    = 2
	scLimit       = 3 // the work queue's delivery limit
	scWorkMaxLen  = 5_000
	scWorkTTL     = time.Second
	scDLQMaxLen   = 500
	scDLQTTL      = 200 * time.Millisecond
	scPoisonEvery = 997
)

// scLost reports whether id is published with routing key "lost": its dead letters route nowhere.
func scLost(id int) bool { return id%10 == 0 }

// scPoison reports whether every consumer fails id.
func scPoison(id int) bool { return id%scPoisonEvery == 0 }

// scExpiration is id's own TTL, "" for none.
func scExpiration(id int) string {
	switch {
	case id%1000 == 1:
		return "0"
	case id%50 == 7:
		return strconv.Itoa(1 + int(mix(uint64(id), 0x5eed)%20))
	}
	return ""
}

// Death reasons, as codes in the per-id arrays.
var scReasons = []warren.Reason{"", warren.ReasonRejected, warren.ReasonExpired, warren.ReasonDeliveryLimit, warren.ReasonMaxLen, "other"}

func scReason(r warren.Reason) uint32 {
	for i, s := range scReasons {
		if s == r && i > 0 {
			return uint32(i)
		}
	}
	return uint32(len(scReasons) - 1)
}

// scLedger is the run's state: per id, what the test saw through its calls and what the events
// said; its checks run as things happen, from many goroutines.
type scLedger struct {
	t    *testing.T
	n    int
	seed uint64

	// The test's own view.
	recv      []atomic.Int32  // receptions from the work queue
	counts    []atomic.Uint64 // bit k: a reception with DeliveryCount k
	acked     []atomic.Int32  // successful acks (and Serve handler nils) in the work queue
	rejected  []atomic.Bool   // a successful Reject (or Permanent result) in the work queue
	dlqRecv   []atomic.Int32  // receptions from the DLQ
	dlqAcked  []atomic.Int32  // successful acks in the DLQ
	dlqReason []atomic.Uint32 // the death reason the DLQ's copy carried

	// The events' view.
	evWorkEnd    []atomic.Int32  // terminal events in the work queue
	evWorkAcked  []atomic.Int32  // of which Acked
	evWorkReason []atomic.Uint32 // the death reason, for DeadLettered and Dropped(dlx-…)
	evWorkDrop   []atomic.Bool   // the work queue's terminal was Dropped (dlx-no-route)
	evDLQEnd     []atomic.Int32  // terminal events in the DLQ
	evDLQAcked   []atomic.Int32  // of which Acked

	brakeUntil atomic.Int64 // consumers of the work queue pause until then (UnixNano)

	finals atomic.Int64  // ids ended for good
	done   chan struct{} // closed when finals reaches n
	errs   atomic.Int32

	// Counters for the log.
	published, acks, upTos, nacks, rejects, recovers, cancels, ctxEnds, nGets, getAbandons,
	serveRuns, serveAcks, serveFails, serveRejects, panics, dlqAcks, dlqNacks, dlqPauses, brakes atomic.Int64
	workAcked, workOther  atomic.Int64
	workDead, workDropped [6]atomic.Int64 // by death reason: dead-lettered, dropped (dlx-no-route)
	dlqEnds               [3]atomic.Int64 // acked, dropped, expired
}

func newScLedger(t *testing.T, seed uint64, n int) *scLedger {
	return &scLedger{
		t: t, n: n, seed: seed, done: make(chan struct{}),
		recv: make([]atomic.Int32, n), counts: make([]atomic.Uint64, n), acked: make([]atomic.Int32, n),
		rejected: make([]atomic.Bool, n), dlqRecv: make([]atomic.Int32, n), dlqAcked: make([]atomic.Int32, n),
		dlqReason: make([]atomic.Uint32, n), evWorkEnd: make([]atomic.Int32, n), evWorkAcked: make([]atomic.Int32, n),
		evWorkReason: make([]atomic.Uint32, n), evWorkDrop: make([]atomic.Bool, n), evDLQEnd: make([]atomic.Int32, n),
		evDLQAcked: make([]atomic.Int32, n),
	}
}

func (l *scLedger) errorf(format string, args ...any) {
	l.t.Helper()
	if l.errs.Add(1) <= 30 {
		l.t.Errorf(format, args...)
	}
}

// final records that id ended for good.
func (l *scLedger) final() {
	if l.finals.Add(1) == int64(l.n) {
		close(l.done)
	}
}

// brake pauses a consumer of the work queue while a brake is on; false if the run is over.
func (l *scLedger) brake(ctx context.Context) bool {
	until := l.brakeUntil.Load()
	if d := time.Until(time.Unix(0, until)); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return false
		case <-l.done:
			return false
		}
	}
	return true
}

// braking puts the brakes on the work queue's consumers now and then, so that a backlog builds
// up: messages with a TTL of a few milliseconds expire in it, and now and then, with a brake
// longer than the queue's TTL, a whole backlog does, and piles up in the DLQ. Producers meanwhile
// wait for room (the Block policy).
func (l *scLedger) braking(ctx context.Context, rng *rand.Rand) {
	for i := 1; ; i++ {
		select {
		case <-time.After(time.Duration(300+rng.IntN(400)) * time.Millisecond):
		case <-ctx.Done():
			return
		case <-l.done:
			return
		}
		d := time.Duration(20+rng.IntN(60)) * time.Millisecond
		if i%8 == 2 {
			d = scWorkTTL + time.Duration(100+rng.IntN(200))*time.Millisecond
		}
		l.brakes.Add(1)
		l.brakeUntil.Store(time.Now().Add(d).UnixNano())
	}
}

func (l *scLedger) over(ctx context.Context) bool {
	select {
	case <-l.done:
		return true
	case <-ctx.Done():
		return true
	default:
		return false
	}
}

// idOf returns the id a message was published with, from its "id" header; -1 if it has none.
func (l *scLedger) idOf(m *warren.Message) int {
	id, ok := m.Headers["id"].(int64)
	if !ok || id < 0 || id >= int64(l.n) {
		l.errorf("message without a valid id header: body %q, headers %v", m.Body, m.Headers)
		return -1
	}
	if string(m.Body) != strconv.FormatInt(id, 10) {
		l.errorf("id %d: body %q", id, m.Body)
	}
	return int(id)
}

// received checks a delivery from the work queue and records it.
func (l *scLedger) received(d warren.Delivery) int {
	id := l.idOf(&d.Message)
	if id < 0 {
		return -1
	}
	l.recv[id].Add(1)
	dc := d.DeliveryCount
	switch {
	case dc < 0 || dc > scLimit:
		l.errorf("id %d received with DeliveryCount %d, above the delivery limit %d", id, dc, scLimit)
	case l.counts[id].Or(1<<dc)&(1<<dc) != 0:
		l.errorf("id %d received twice with DeliveryCount %d", id, dc)
	}
	if d.Redelivered != (dc > 0) {
		l.errorf("id %d: Redelivered=%t with DeliveryCount=%d", id, d.Redelivered, dc)
	}
	if n := l.acked[id].Load(); n != 0 {
		l.errorf("id %d received again after it was acked", id)
	}
	if d.Message.Expiration != scExpiration(id) {
		l.errorf("id %d: Expiration %q, published with %q", id, d.Message.Expiration, scExpiration(id))
	}
	return id
}

// ack records a successful ack in the work queue.
func (l *scLedger) ack(id int) {
	if id < 0 {
		return
	}
	if scPoison(id) {
		l.errorf("poison id %d acked", id)
	}
	if n := l.acked[id].Add(1); n != 1 {
		l.errorf("id %d acked %d times in the work queue", id, n)
	}
	l.acks.Add(1)
	l.final()
}

// countUpTo counts a successful AckUpTo, for the log.
func (l *scLedger) countUpTo() { l.upTos.Add(1) }

func (l *scLedger) reject(id int) {
	if id >= 0 {
		l.rejected[id].Store(true)
		l.rejects.Add(1)
	}
}

// listen is the events' view: terminal events of the work queue and the DLQ, per id.
func (l *scLedger) listen(e warren.Event) {
	switch e.Kind {
	case warren.EventPublished:
		l.published.Add(1)
		return
	case warren.EventAcked, warren.EventDeadLettered, warren.EventDropped, warren.EventExpired:
	default:
		return
	}
	if e.Queue != "work" && e.Queue != "dlq" {
		l.errorf("event %s in queue %q", e.Kind, e.Queue)
		return
	}
	id := l.idOf(e.Message)
	if id < 0 {
		return
	}
	if e.Queue == "work" {
		if n := l.evWorkEnd[id].Add(1); n != 1 {
			l.errorf("id %d: %d terminal events in the work queue, the last %s(%s)", id, n, e.Kind, e.Reason)
		}
		switch {
		case e.Kind == warren.EventAcked:
			l.evWorkAcked[id].Add(1)
			l.workAcked.Add(1)
		case e.Kind == warren.EventDeadLettered:
			r := scReason(e.Reason)
			l.evWorkReason[id].Store(r)
			l.workDead[r].Add(1)
			if scLost(id) {
				l.errorf("id %d, published with key lost, dead-lettered (%s) into a queue", id, e.Reason)
			}
		case e.Kind == warren.EventDropped && e.Reason == warren.ReasonDLXNoRoute:
			last, _ := e.Message.Headers["x-last-death-reason"].(string)
			r := scReason(warren.Reason(last))
			l.evWorkReason[id].Store(r)
			l.evWorkDrop[id].Store(true)
			l.workDropped[r].Add(1)
			if !scLost(id) {
				l.errorf("id %d, published with key kept, dropped: dead letter routed nowhere", id)
			}
			l.final()
		default:
			l.errorf("id %d: unexpected terminal event %s(%s) in the work queue", id, e.Kind, e.Reason)
			l.workOther.Add(1)
			l.final()
		}
		return
	}
	if n := l.evDLQEnd[id].Add(1); n != 1 {
		l.errorf("id %d: %d terminal events in the DLQ, the last %s(%s)", id, n, e.Kind, e.Reason)
	}
	switch {
	case e.Kind == warren.EventAcked:
		l.evDLQAcked[id].Add(1)
		l.dlqEnds[0].Add(1)
	case e.Kind == warren.EventDropped && e.Reason == warren.ReasonMaxLen:
		l.dlqEnds[1].Add(1)
		l.final()
	case e.Kind == warren.EventExpired:
		l.dlqEnds[2].Add(1)
		l.final()
	default:
		l.errorf("id %d: unexpected terminal event %s(%s) in the DLQ", id, e.Kind, e.Reason)
		l.final()
	}
}

func runStressScale(t *testing.T, seed uint64, n int) {
	leak := goleak.IgnoreCurrent()
	b := warren.New()
	defer b.Close()
	l := newScLedger(t, seed, n)
	stopListening := b.Listen(l.listen)
	defer stopListening()
	spans := checkSpans(t, b) // the span invariant, event by event (events.go)

	// The topology.
	_, err := b.DeclareExchange("in", warren.ExchangeDirect)
	require.NoError(t, err)
	_, err = b.DeclareExchange("dlx", warren.ExchangeDirect)
	require.NoError(t, err)
	work, err := b.DeclareQueue("work", warren.MessageTTL(scWorkTTL), warren.DeadLetter("dlx", ""),
		warren.DeliveryLimit(scLimit), warren.MaxLength(scWorkMaxLen), warren.Overflow(warren.Block))
	require.NoError(t, err)
	dlq, err := b.DeclareQueue("dlq", warren.MaxLength(scDLQMaxLen), warren.MessageTTL(scDLQTTL))
	require.NoError(t, err)
	require.NoError(t, b.Bind("work", "in", "kept", nil))
	require.NoError(t, b.Bind("work", "in", "lost", nil))
	require.NoError(t, b.Bind("dlq", "dlx", "kept", nil))

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	start := time.Now()
	var publishedIn atomic.Int64
	var producing atomic.Int32
	producing.Store(scProducers)
	for p := range scProducers {
		wg.Go(func() {
			defer func() {
				if producing.Add(-1) == 0 {
					publishedIn.Store(int64(time.Since(start)))
				}
			}()
			for id := p; id < n; id += scProducers {
				key := "kept"
				if scLost(id) {
					key = "lost"
				}
				msg := warren.Message{Body: strconv.AppendInt(nil, int64(id), 10), Headers: warren.Table{"id": int64(id)},
					Expiration: scExpiration(id)}
				if err := b.Publish(ctx, "in", key, msg, warren.Mandatory()); err != nil {
					if ctx.Err() == nil {
						l.errorf("Publish(%d) = %v, want nil", id, err)
					}
					return
				}
				if id%256 == p {
					runtime.Gosched()
				}
			}
		})
	}
	for w := range scConsumers {
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			for !l.over(ctx) {
				if w%4 == 0 && rng.IntN(3) == 0 {
					l.serve(ctx, work, rng)
					continue
				}
				if rng.IntN(4) == 0 {
					l.gets(ctx, work, rng)
				}
				l.incarnation(ctx, work, rng)
			}
		})
	}
	wg.Go(func() { l.braking(ctx, rand.New(rand.NewPCG(seed, scConsumers+scDrainers))) })
	for w := range scDrainers {
		rng := rand.New(rand.NewPCG(seed, uint64(scConsumers+w)))
		wg.Go(func() {
			for !l.over(ctx) {
				l.drain(ctx, dlq, rng)
			}
		})
	}

	// Wait for every id to end, or for the watchdog: no progress for stall, or the test's
	// deadline near.
	stall := 60 * time.Second
	if s := os.Getenv("WARREN_STRESS_STALL"); s != "" {
		d, err := time.ParseDuration(s)
		require.NoError(t, err, "WARREN_STRESS_STALL")
		stall = d
	}
	var deadline <-chan time.Time
	if dl, ok := t.Deadline(); ok {
		timer := time.NewTimer(time.Until(dl) * 9 / 10)
		defer timer.Stop()
		deadline = timer.C
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last, lastAt := int64(-1), time.Now()
wait:
	for {
		select {
		case <-l.done:
			break wait
		case <-tick.C:
			if f := l.finals.Load(); f != last {
				last, lastAt = f, time.Now()
				continue
			}
			if time.Since(lastAt) < stall {
				continue
			}
			l.errorf("watchdog: no id ended for %v: %s; goroutines in %s", stall, l.state(work, dlq, start), dumpStacks(t))
			break wait
		case <-deadline:
			l.errorf("watchdog: the test's deadline is near: %s; goroutines in %s", l.state(work, dlq, start), dumpStacks(t))
			break wait
		}
	}
	endedIn := time.Since(start)
	stop()
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		l.errorf("goroutines still running 30 s after the run was stopped; goroutines in %s", dumpStacks(t))
		require.NoError(t, b.Close())
		<-finished
	}
	idle, cancelIdle := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelIdle()
	if err := b.WaitIdle(idle); err != nil {
		l.errorf("WaitIdle after the run: %v; %s", err, l.state(work, dlq, start))
	}

	// Both queues empty, and their counters what the events said.
	for _, q := range []*warren.Queue{work, dlq} {
		s := q.Stats()
		if s.Ready != 0 || s.Unacked != 0 || s.Delayed != 0 || s.Consumers != 0 {
			l.errorf("queue %s at the end: Ready %d, Unacked %d, Delayed %d, Consumers %d; want all 0", q.Name(), s.Ready, s.Unacked, s.Delayed, s.Consumers)
		}
	}
	var evDead, evDropped int64
	for r := range scReasons {
		evDead += l.workDead[r].Load()
		evDropped += l.workDropped[r].Load()
	}
	evExpired := l.workDead[scReason(warren.ReasonExpired)].Load() + l.workDropped[scReason(warren.ReasonExpired)].Load()
	ws, want := work.Stats(), warren.QueueStats{Enqueued: uint64(n), Acked: uint64(l.workAcked.Load()), Rejected: uint64(l.rejects.Load()),
		Expired: uint64(evExpired), DeadLettered: uint64(evDead), Dropped: uint64(evDropped + l.workOther.Load())}
	if ws.Enqueued != want.Enqueued || ws.Acked != want.Acked || ws.Rejected != want.Rejected || ws.Expired != want.Expired ||
		ws.DeadLettered != want.DeadLettered || ws.Dropped != want.Dropped {
		l.errorf("work queue Stats: Enqueued %d, Acked %d, Rejected %d, Expired %d, DeadLettered %d, Dropped %d; want (from the events and rejects) %d, %d, %d, %d, %d, %d",
			ws.Enqueued, ws.Acked, ws.Rejected, ws.Expired, ws.DeadLettered, ws.Dropped,
			want.Enqueued, want.Acked, want.Rejected, want.Expired, want.DeadLettered, want.Dropped)
	}
	ds := dlq.Stats()
	if ds.Enqueued != uint64(evDead) || ds.Acked != uint64(l.dlqEnds[0].Load()) || ds.Dropped != uint64(l.dlqEnds[1].Load()) ||
		ds.Expired != uint64(l.dlqEnds[2].Load()) || ds.DeadLettered != 0 {
		l.errorf("DLQ Stats: Enqueued %d, Acked %d, Dropped %d, Expired %d, DeadLettered %d; want (from the events) %d, %d, %d, %d, 0",
			ds.Enqueued, ds.Acked, ds.Dropped, ds.Expired, ds.DeadLettered, evDead, l.dlqEnds[0].Load(), l.dlqEnds[1].Load(), l.dlqEnds[2].Load())
	}

	require.NoError(t, b.Close())
	l.verify()
	if p := l.published.Load(); p != int64(n) {
		l.errorf("%d EventPublished, want %d", p, n)
	}
	if open := spans.openSpans(); len(open) > 0 {
		l.errorf("%d messages whose events say they are still in a queue, e.g. %v", len(open), open[:min(len(open), 5)])
	}
	if errs := spans.errors(); len(errs) > 0 {
		l.errorf("%d events break the span invariant, e.g. %v", len(errs), errs[:min(len(errs), 5)])
	}
	t.Logf("%d messages (%d producers, %d consumer goroutines) published in %v, all ended in %v", n, scProducers, scConsumers,
		time.Duration(publishedIn.Load()), endedIn)
	t.Logf("work queue: %d acked; dead-lettered %s; dropped (dlx-no-route) %s; DLQ: %d acked, %d dropped (maxlen), %d expired",
		l.workAcked.Load(), scByReason(&l.workDead), scByReason(&l.workDropped), l.dlqEnds[0].Load(), l.dlqEnds[1].Load(), l.dlqEnds[2].Load())
	t.Logf("consumers: %d acks, %d AckUpTo, %d nacks, %d rejects, %d recovers, %d cancels, %d context ends, %d gets (%d abandoned); serve: %d runs, %d acks, %d failures, %d rejects, %d panics; DLQ: %d acks, %d nacks, %d pauses; %d brakes",
		l.acks.Load(), l.upTos.Load(), l.nacks.Load(), l.rejects.Load(), l.recovers.Load(), l.cancels.Load(), l.ctxEnds.Load(), l.nGets.Load(), l.getAbandons.Load(),
		l.serveRuns.Load(), l.serveAcks.Load(), l.serveFails.Load(), l.serveRejects.Load(), l.panics.Load(), l.dlqAcks.Load(), l.dlqNacks.Load(), l.dlqPauses.Load(), l.brakes.Load())

	stopListening()
	goleak.VerifyNone(t, leak)
}

// state describes the run, for the watchdog.
func (l *scLedger) state(work, dlq *warren.Queue, start time.Time) string {
	return fmt.Sprintf("after %v %d of %d ids ended; work Len()=%d Unacked()=%d ConsumerCount()=%d; dlq Len()=%d Unacked()=%d",
		time.Since(start), l.finals.Load(), l.n, work.Len(), work.Unacked(), work.ConsumerCount(), dlq.Len(), dlq.Unacked())
}

// verify compares, id by id, the test's view with the events'.
func (l *scLedger) verify() {
	bad := 0
	report := func(id int, format string, args ...any) {
		if bad++; bad <= 20 {
			l.errorf("id %d: %s (received %d times with counts %b, acked %d, rejected %t, DLQ received %d acked %d; events: work %d terminal (%d acked, reason %q, dropped %t), DLQ %d terminal (%d acked))",
				id, fmt.Sprintf(format, args...), l.recv[id].Load(), l.counts[id].Load(), l.acked[id].Load(), l.rejected[id].Load(),
				l.dlqRecv[id].Load(), l.dlqAcked[id].Load(), l.evWorkEnd[id].Load(), l.evWorkAcked[id].Load(),
				scReasons[l.evWorkReason[id].Load()], l.evWorkDrop[id].Load(), l.evDLQEnd[id].Load(), l.evDLQAcked[id].Load())
		}
	}
	for id := range l.n {
		reason := scReasons[l.evWorkReason[id].Load()]
		dead := reason != "" && !l.evWorkDrop[id].Load() // dead-lettered into the DLQ
		switch {
		case l.evWorkEnd[id].Load() != 1:
			report(id, "%d terminal events in the work queue, want 1", l.evWorkEnd[id].Load())
		case l.acked[id].Load() != l.evWorkAcked[id].Load():
			report(id, "acked %d times, evented as acked %d times", l.acked[id].Load(), l.evWorkAcked[id].Load())
		case l.rejected[id].Load() != (reason == warren.ReasonRejected):
			report(id, "rejected %t, yet its death reason is %q", l.rejected[id].Load(), reason)
		case scPoison(id) && reason != warren.ReasonDeliveryLimit && reason != warren.ReasonExpired:
			report(id, "poison, yet it ended %q", reason)
		case dead && l.evDLQEnd[id].Load() != 1:
			report(id, "dead-lettered, with %d terminal events in the DLQ, want 1", l.evDLQEnd[id].Load())
		case !dead && (l.evDLQEnd[id].Load() != 0 || l.dlqRecv[id].Load() != 0):
			report(id, "not dead-lettered, yet in the DLQ")
		case l.dlqAcked[id].Load() != l.evDLQAcked[id].Load():
			report(id, "acked %d times in the DLQ, evented as acked there %d times", l.dlqAcked[id].Load(), l.evDLQAcked[id].Load())
		case l.dlqRecv[id].Load() > 0 && scReasons[l.dlqReason[id].Load()] != reason:
			report(id, "the DLQ's copy says it died %q, the events %q", scReasons[l.dlqReason[id].Load()], reason)
		}
		r := l.recv[id].Load()
		if want := uint64(1)<<r - 1; l.counts[id].Load() != want {
			report(id, "received %d times with delivery counts %b, want 0..%d once each", r, l.counts[id].Load(), r-1)
		}
	}
	if f := l.finals.Load(); f != int64(l.n) {
		l.errorf("%d ids ended for good, want %d", f, l.n)
	}
	if bad > 0 {
		l.errorf("%d of %d ids not accounted for exactly once", bad, l.n)
	}
}

// incarnation runs one consumer of the work queue for a random number of deliveries.
func (l *scLedger) incarnation(ctx context.Context, q *warren.Queue, rng *rand.Rand) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c, prefetch := stressConsume(ctx, cctx, q, l, rng, false)
	if c == nil {
		return
	}
	upTo := rng.IntN(4) == 0
	held := &stressHeld{c: c, l: l, rng: rng, max: 1 + rng.IntN(prefetch)}

	for range 1 + rng.IntN(400) {
		if !l.brake(ctx) {
			break
		}
		d, got := stressReceive(ctx, c, l.done, nil, held.flush)
		if got == stressOver {
			break
		}
		if got == stressClosed {
			if ctx.Err() == nil {
				l.errorf("Deliveries() closed under an active consumer: Err() = %v", c.Err())
			}
			return
		}
		id := l.received(d)
		switch r := rng.IntN(200); {
		case id >= 0 && scPoison(id) || r < 8: // 4%
			if err := d.Nack(); err != nil {
				l.errorf("Nack() = %v, want nil", err)
			}
			l.nacks.Add(1)
		case r < 12: // 2%
			if err := d.Reject(); err != nil {
				l.errorf("Reject() = %v, want nil", err)
			} else {
				l.reject(id)
			}
		case r < 13:
			held.recoverAll() // everything held goes back, d with it
			l.recovers.Add(1)
		default:
			held.ack(d, id, upTo)
		}
	}

	if l.over(ctx) {
		return // the run is over: the context ends the consumer, held deliveries go back
	}
	if rng.IntN(4) == 0 {
		// End by the context: what is held goes back redelivered, asynchronously.
		cancel()
		<-c.Done()
		if err := c.Err(); err != context.Canceled {
			l.errorf("Err() after the context ended = %v, want context.Canceled", err)
		}
		l.ctxEnds.Add(1)
		return
	}
	// End by Cancel: what is buffered goes back unchanged, what is held stays settle-able.
	if err := c.Cancel(); err != nil {
		l.errorf("Cancel() = %v, want nil", err)
	}
	if d, ok := <-c.Deliveries(); ok {
		l.errorf("Deliveries() yielded a delivery (%q) after Cancel returned", d.Message.Body)
	}
	if err := c.Err(); err != warren.ErrCancelled && (ctx.Err() == nil || err != context.Canceled) {
		l.errorf("Err() after Cancel = %v, want ErrCancelled", err) // unless the run ended first
	}
	if rng.IntN(3) == 0 {
		held.settleEach(func(d warren.Delivery, id int) {
			if err := d.Reject(); err != nil {
				l.errorf("Reject() after Cancel = %v, want nil", err)
			} else {
				l.reject(id)
			}
		})
	}
	held.flush()
	l.cancels.Add(1)
}

// gets takes a few messages from the work queue with Get: acking, nacking, rejecting, or
// abandoning them to the end of the Get context.
func (l *scLedger) gets(ctx context.Context, q *warren.Queue, rng *rand.Rand) {
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range 1 + rng.IntN(8) {
		if !l.brake(ctx) {
			return
		}
		d, err := q.Get(gctx)
		if err != nil {
			if !errors.Is(err, warren.ErrEmpty) && ctx.Err() == nil {
				l.errorf("Get() = %v, want nil or ErrEmpty", err)
			}
			return
		}
		l.nGets.Add(1)
		id := l.received(d)
		switch r := rng.IntN(20); {
		case id >= 0 && scPoison(id) || r == 0:
			if err := d.Nack(); err != nil {
				l.errorf("Get delivery: Nack() = %v, want nil", err)
			}
			l.nacks.Add(1)
		case r == 1:
			l.getAbandons.Add(1) // returned, redelivered, when gctx ends
		case r == 2:
			if err := d.Reject(); err != nil {
				l.errorf("Get delivery: Reject() = %v, want nil", err)
			} else {
				l.reject(id)
			}
		default:
			if err := d.Ack(); err != nil {
				l.errorf("Get delivery: Ack() = %v, want nil", err)
			} else {
				l.ack(id)
			}
		}
	}
}

var errScTransient = errors.New("transient failure")

// serve runs a Serve pool on the work queue until it has handled a random number of deliveries.
func (l *scLedger) serve(ctx context.Context, q *warren.Queue, rng *rand.Rand) {
	workers := 1 + rng.IntN(4)
	opts := []warren.ServeOption{warren.Workers(workers)}
	if rng.IntN(2) == 0 {
		opts = append(opts, warren.Prefetch(workers+rng.IntN(16)))
	}
	if rng.IntN(2) == 0 {
		opts = append(opts, warren.Backoff(time.Millisecond, 4*time.Millisecond))
	}
	limit := int64(20 + rng.IntN(300))
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // the run may be over before the limit: every id ended
		select {
		case <-l.done:
			cancel()
		case <-sctx.Done():
		}
	}()
	var handled atomic.Int64
	err := q.Serve(sctx, func(_ context.Context, d warren.Delivery) error {
		if handled.Add(1) == limit {
			cancel() // Serve stops gracefully: this result still applies
		}
		id := l.received(d)
		if id < 0 {
			return nil
		}
		l.brake(ctx)
		switch r := mix(l.seed^uint64(id), uint64(d.DeliveryCount)) % 1000; {
		case scPoison(id) || r < 70:
			l.serveFails.Add(1)
			return fmt.Errorf("id %d: %w", id, errScTransient)
		case r < 100:
			l.serveRejects.Add(1)
			l.reject(id)
			return warren.Permanent(fmt.Errorf("id %d: cannot be processed", id))
		case r < 105:
			l.panics.Add(1)
			panic(fmt.Sprintf("handler panic on id %d", id))
		default:
			l.serveAcks.Add(1)
			l.ack(id) // Serve acks it; nothing can take it back first
			return nil
		}
	}, opts...)
	if err != nil {
		l.errorf("Serve() = %v, want nil", err)
	}
	l.serveRuns.Add(1)
}

// drain runs one consumer of the DLQ: it acks what it receives (nacking a few), and pauses now
// and then so that dead letters pile up and some are dropped or expire.
func (l *scLedger) drain(ctx context.Context, q *warren.Queue, rng *rand.Rand) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c, err := q.Consume(cctx, warren.Prefetch(1+rng.IntN(64)))
	if err != nil {
		if ctx.Err() == nil {
			l.errorf("DLQ: Consume() = %v, want nil", err)
		}
		return
	}
	for range 1 + rng.IntN(2000) {
		var d warren.Delivery
		var ok bool
		select {
		case d, ok = <-c.Deliveries():
		case <-l.done:
			return
		case <-ctx.Done():
			return
		}
		if !ok {
			if ctx.Err() == nil {
				l.errorf("DLQ: Deliveries() closed under an active consumer: Err() = %v", c.Err())
			}
			return
		}
		id := l.idOf(&d.Message)
		if id < 0 {
			continue
		}
		l.dlqRecv[id].Add(1)
		deaths := d.Message.Deaths()
		if len(deaths) != 1 || deaths[0].Queue != "work" || deaths[0].Count != 1 {
			l.errorf("DLQ: id %d with deaths %+v, want one from the work queue", id, deaths)
		} else {
			r := scReason(deaths[0].Reason)
			if old := l.dlqReason[id].Swap(r); old != 0 && old != r {
				l.errorf("DLQ: id %d received dead-lettered %q, before %q", id, scReasons[r], scReasons[old])
			}
			if exp := scExpiration(id); deaths[0].OriginalExpiration != exp {
				l.errorf("DLQ: id %d: original-expiration %q, published with %q", id, deaths[0].OriginalExpiration, exp)
			}
		}
		if d.Message.Expiration != "" {
			l.errorf("DLQ: id %d: a dead letter with Expiration %q", id, d.Message.Expiration)
		}
		if rng.IntN(20) == 0 {
			if err := d.Nack(); err != nil {
				l.errorf("DLQ: Nack() = %v, want nil", err)
			}
			l.dlqNacks.Add(1)
		} else if err := d.Ack(); err != nil {
			l.errorf("DLQ: Ack() = %v, want nil", err)
		} else {
			if n := l.dlqAcked[id].Add(1); n != 1 {
				l.errorf("DLQ: id %d acked %d times", id, n)
			}
			l.dlqAcks.Add(1)
			l.final()
		}
		if rng.IntN(500) == 0 {
			// A pause: the dead letters pile up, some over the length limit, some past the TTL.
			l.dlqPauses.Add(1)
			select {
			case <-time.After(time.Duration(50+rng.IntN(250)) * time.Millisecond):
			case <-ctx.Done():
			case <-l.done:
			}
		}
	}
	if rng.IntN(2) == 0 {
		cancel()
		<-c.Done()
	} else if err := c.Cancel(); err != nil {
		l.errorf("DLQ: Cancel() = %v, want nil", err)
	}
}

// scByReason renders counts by death reason.
func scByReason(c *[6]atomic.Int64) string {
	var parts []string
	for r := 1; r < len(scReasons); r++ {
		parts = append(parts, fmt.Sprintf("%d %s", c[r].Load(), scReasons[r]))
	}
	return strings.Join(parts, ", ")
}

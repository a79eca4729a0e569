package warren_test

import (
	"context"
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

// Stress test of the core paths: real producers and consumers run concurrently, so it cannot
// live in a synctest bubble; goleak checks instead that Close left no goroutine behind. What the
// stress tests share is in stress_consumer_test.go and helpers_test.go.

// stressLedger follows every message of one queue: how often it was received and acked. Its
// checks run as deliveries arrive, from many goroutines.
type stressLedger struct {
	t     *testing.T
	queue string
	recv  []atomic.Int32 // receptions per id
	acks  []atomic.Int32 // successful acks per id
	acked atomic.Int64   // successful acks in all
	done  chan struct{}  // closed when every id has been acked
	errs  atomic.Int32
	// unlimited: a third of the consumers have unlimited prefetch (stressConsume).
	unlimited bool

	// Counters for the log.
	nacks, recovers, cancels, ctxEnds, bigCtxEnds, gets, getAbandons, upTos atomic.Int64
}

func newStressLedger(t *testing.T, queue string, n int) *stressLedger {
	return &stressLedger{t: t, queue: queue, recv: make([]atomic.Int32, n), acks: make([]atomic.Int32, n), done: make(chan struct{})}
}

// errorf reports a failure; only the first few, so that a broken invariant does not flood.
func (l *stressLedger) errorf(format string, args ...any) {
	if l.errs.Add(1) <= 20 {
		l.t.Errorf("queue %s: "+format, append([]any{l.queue}, args...)...)
	}
}

// received checks a delivery against the history of its message and records it. The message
// was received prev times before; each of those receptions ended in a Nack, a Recover or the end
// of its owner's context, each of which returns it redelivered with the count one higher. A
// message buffered but never received goes back unchanged, so the count must equal prev.
func (l *stressLedger) received(d warren.Delivery) int {
	id, err := strconv.Atoi(string(d.Message.Body))
	if err != nil || id < 0 || id >= len(l.recv) {
		l.errorf("delivery with body %q", d.Message.Body)
		return -1
	}
	prev := int(l.recv[id].Add(1)) - 1
	if n := l.acks[id].Load(); n != 0 {
		l.errorf("id %d delivered again after it was acked (reception %d, DeliveryCount %d)", id, prev+1, d.DeliveryCount)
	}
	if d.DeliveryCount != prev || d.Redelivered != (prev > 0) {
		l.errorf("id %d reception %d: Redelivered=%t DeliveryCount=%d, want %t %d", id, prev+1, d.Redelivered, d.DeliveryCount, prev > 0, prev)
	}
	return id
}

// ack records a successful acknowledgement.
func (l *stressLedger) ack(id int) {
	if id < 0 {
		return
	}
	if n := l.acks[id].Add(1); n != 1 {
		l.errorf("id %d acked %d times", id, n)
	}
	if l.acked.Add(1) == int64(len(l.acks)) {
		close(l.done)
	}
}

// countUpTo counts a successful AckUpTo, for the log.
func (l *stressLedger) countUpTo() { l.upTos.Add(1) }

// verify checks the final state: every id acked exactly once.
func (l *stressLedger) verify() {
	lost, dup, redeliveries := 0, 0, 0
	for id := range l.acks {
		switch n := l.acks[id].Load(); {
		case n == 0:
			if lost++; lost <= 10 {
				l.errorf("id %d never acked (received %d times)", id, l.recv[id].Load())
			}
		case n > 1:
			dup++
		}
		redeliveries += int(l.recv[id].Load()) - 1
	}
	if lost > 0 || dup > 0 {
		l.errorf("%d ids lost, %d acked more than once, of %d", lost, dup, len(l.acks))
	}
	l.t.Logf("queue %s: %d messages, %d redeliveries, %d nacks, %d recovers, %d cancels, %d context ends (%d returning over 256), %d gets (%d abandoned), %d AckUpTo",
		l.queue, len(l.acks), redeliveries, l.nacks.Load(), l.recovers.Load(), l.cancels.Load(), l.ctxEnds.Load(), l.bigCtxEnds.Load(),
		l.gets.Load(), l.getAbandons.Load(), l.upTos.Load())
}

type stressConfig struct {
	producers int
	consumers int // per queue
	messages  int // published; each queue receives every one
	fanout    bool
	unlimited bool // a third of the consumers have unlimited prefetch
}

func TestStress(t *testing.T) {
	n := 200_000
	if testing.Short() {
		n = 20_000
	}
	seed := stressSeed(t)
	t.Run("one queue", func(t *testing.T) {
		runStress(t, seed, stressConfig{producers: 8, consumers: 8, messages: n})
	})
	t.Run("fanout to two queues", func(t *testing.T) {
		runStress(t, seed+1, stressConfig{producers: 8, consumers: 8, messages: n, fanout: true})
	})
	t.Run("unlimited prefetch", func(t *testing.T) {
		runStress(t, seed+2, stressConfig{producers: 8, consumers: 8, messages: n / 2, unlimited: true})
	})
}

func runStress(t *testing.T, seed uint64, cfg stressConfig) {
	leak := goleak.IgnoreCurrent()
	b := warren.New()

	var (
		queues  []*warren.Queue
		ledgers []*stressLedger
		publish func(ctx context.Context, p int, msg warren.Message) error
	)
	if cfg.fanout {
		x, err := b.DeclareExchange("fan", warren.ExchangeFanout)
		require.NoError(t, err)
		for _, name := range []string{"a", "b"} {
			q, err := b.DeclareQueue(name)
			require.NoError(t, err)
			require.NoError(t, b.Bind(name, "fan", "", nil))
			queues = append(queues, q)
		}
		publish = func(ctx context.Context, p int, msg warren.Message) error {
			if p%2 == 0 {
				return x.Publish(ctx, "", msg, warren.Mandatory())
			}
			return b.Publish(ctx, "fan", "", msg, warren.Mandatory())
		}
	} else {
		q, err := b.DeclareQueue("q")
		require.NoError(t, err)
		queues = append(queues, q)
		publish = func(ctx context.Context, p int, msg warren.Message) error {
			return b.Publish(ctx, "", "q", msg, warren.Mandatory())
		}
	}
	for _, q := range queues {
		l := newStressLedger(t, q.Name(), cfg.messages)
		l.unlimited = cfg.unlimited
		ledgers = append(ledgers, l)
	}

	// ctx ends the run early if the watchdog fires.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	var producing atomic.Int32
	var published atomic.Int64 // nanoseconds from start until the last producer finished
	producing.Store(int32(cfg.producers))
	start := time.Now()
	for p := range cfg.producers {
		wg.Go(func() {
			defer func() {
				if producing.Add(-1) == 0 {
					published.Store(int64(time.Since(start)))
				}
			}()
			for id := p; id < cfg.messages; id += cfg.producers {
				if err := publish(ctx, p, warren.Message{Body: strconv.AppendInt(nil, int64(id), 10)}); err != nil {
					if ctx.Err() == nil {
						ledgers[0].errorf("Publish(%d) = %v, want nil", id, err)
					}
					return
				}
				if id%256 == 0 {
					runtime.Gosched()
				}
			}
		})
	}
	for qi, q := range queues {
		for w := range cfg.consumers {
			rng := rand.New(rand.NewPCG(seed, uint64(qi*cfg.consumers+w)))
			upTo := w%4 == 3 // a quarter of the workers settle with AckUpTo
			wg.Go(func() { stressWorker(ctx, q, ledgers[qi], rng, upTo) })
		}
	}

	// Wait for every message to be acked, or for the watchdog.
	watchdog := time.NewTimer(45 * time.Second)
	defer watchdog.Stop()
	for _, l := range ledgers {
		select {
		case <-l.done:
		case <-watchdog.C:
			for qi, q := range queues {
				t.Errorf("watchdog: queue %s after %v: acked %d of %d, Len()=%d Unacked()=%d ConsumerCount()=%d",
					q.Name(), time.Since(start), ledgers[qi].acked.Load(), cfg.messages, q.Len(), q.Unacked(), q.ConsumerCount())
			}
			stop()
		}
		if ctx.Err() != nil {
			break
		}
	}
	if ctx.Err() != nil {
		// Stop everything that may still wait for a delivery.
		require.NoError(t, b.Close())
	}
	wg.Wait()
	t.Logf("%d producers, %d consumers per queue, %d queues, %d messages each: published in %v, all acked in %v",
		cfg.producers, cfg.consumers, len(queues), cfg.messages, time.Duration(published.Load()), time.Since(start))

	if ctx.Err() == nil {
		for _, q := range queues {
			if n := q.Unacked(); n != 0 {
				t.Errorf("queue %s: Unacked() = %d, want 0", q.Name(), n)
			}
			if n := q.Len(); n != 0 {
				t.Errorf("queue %s: Len() = %d, want 0", q.Name(), n)
			}
			if n := q.ConsumerCount(); n != 0 {
				t.Errorf("queue %s: ConsumerCount() = %d, want 0", q.Name(), n)
			}
		}
	}
	for _, l := range ledgers {
		l.verify()
	}
	require.NoError(t, b.Close())
	goleak.VerifyNone(t, leak)
}

// stressWorker consumes from q until every message of the ledger has been acked, in
// incarnations: each a consumer with a random prefetch that receives a random number of
// deliveries, mostly acking, sometimes nacking or recovering, and ends by Cancel or by the end of
// its context. Between incarnations it sometimes takes a few messages with Get.
//
// Only the worker receives from its consumer, and it ends its consumers itself, so every
// delivery it receives is either settled by it or returned redelivered: the ledger's checks
// are exact.
func stressWorker(ctx context.Context, q *warren.Queue, l *stressLedger, rng *rand.Rand, upTo bool) {
	for {
		select {
		case <-l.done:
			return
		case <-ctx.Done():
			return
		default:
		}
		if rng.IntN(8) == 0 {
			stressGets(ctx, q, l, rng)
		}
		stressIncarnation(ctx, q, l, rng, upTo)
	}
}

func stressIncarnation(ctx context.Context, q *warren.Queue, l *stressLedger, rng *rand.Rand, upTo bool) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c, prefetch := stressConsume(ctx, cctx, q, l, rng, l.unlimited)
	if c == nil {
		return
	}
	life := 1 + rng.IntN(1500)
	held := &stressHeld{c: c, l: l, rng: rng, max: 1 + rng.IntN(prefetch)}

	for range life {
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
		case r < 10: // 5%
			if err := d.Nack(); err != nil {
				l.errorf("Nack() = %v, want nil", err)
			}
			l.nacks.Add(1)
		case r < 11:
			held.recoverAll() // everything held goes back, d with it
			l.recovers.Add(1)
		default:
			held.ack(d, id, upTo)
		}
	}

	if ctx.Err() != nil {
		return
	}
	if rng.IntN(4) == 0 || len(held.ds) > 256 && rng.IntN(2) == 0 {
		// End by the context: what is held goes back redelivered, asynchronously (in chunks
		// when it is much).
		if len(held.ds) > 256 {
			l.bigCtxEnds.Add(1)
		}
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
	select {
	case d, ok := <-c.Deliveries():
		if ok {
			l.errorf("Deliveries() yielded a delivery (%q) after Cancel returned", d.Message.Body)
		}
	default:
		l.errorf("Deliveries() not closed after Cancel returned")
	}
	if err := c.Err(); err != warren.ErrCancelled {
		l.errorf("Err() after Cancel = %v, want ErrCancelled", err)
	}
	held.flush()
	l.cancels.Add(1)
}

// stressGets takes a few messages with Get, acking, nacking, or abandoning them to the end of
// the Get context.
func stressGets(ctx context.Context, q *warren.Queue, l *stressLedger, rng *rand.Rand) {
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range 1 + rng.IntN(8) {
		d, err := q.Get(gctx)
		if err != nil {
			if err != warren.ErrEmpty && ctx.Err() == nil {
				l.errorf("Get() = %v, want nil or ErrEmpty", err)
			}
			return
		}
		l.gets.Add(1)
		id := l.received(d)
		switch r := rng.IntN(20); {
		case r == 0:
			if err := d.Nack(); err != nil {
				l.errorf("Get delivery: Nack() = %v, want nil", err)
			}
			l.nacks.Add(1)
		case r == 1:
			l.getAbandons.Add(1) // returned when gctx ends
		default:
			if err := d.Ack(); err != nil {
				l.errorf("Get delivery: Ack() = %v, want nil", err)
			} else {
				l.ack(id)
			}
		}
	}
}

package warren_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of idleness (idle.go): WaitIdle waits through everything still to happen — handlers,
// retries, delays, TTLs, ack timeouts, deletions to come — and not for what is merely held;
// WaitEmpty waits for a queue to drain; Outstanding lists what is out.

// TestWaitIdleRetryThenDeadLetterFlow: a handler fails a job; each failure waits an hour in a
// retry queue (a TTL whose dead-letter exchange leads back), and the third sends it to a parking
// queue. WaitIdle carries the test through the three virtual hours with no sleeps.
func TestWaitIdleRetryThenDeadLetterFlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := warren.New()
		defer b.Close()
		work, err := b.DeclareQueue("work", warren.DeadLetter("", "retry"))
		require.NoError(t, err)
		_, err = b.DeclareQueue("retry", warren.MessageTTL(time.Hour), warren.DeadLetter("", "work"))
		require.NoError(t, err)
		parked, err := b.DeclareQueue("parked")
		require.NoError(t, err)

		ctx, cancel := context.WithCancel(t.Context())
		served := make(chan error, 1)
		attempts := 0
		go func() {
			served <- work.Serve(ctx, func(ctx context.Context, d warren.Delivery) error {
				attempts++
				failures := 0
				for _, death := range d.Message.Deaths() {
					if death.Queue == "work" && death.Reason == warren.ReasonRejected {
						failures = int(death.Count)
					}
				}
				if failures < 2 {
					return warren.Permanent(errors.New("downstream unavailable"))
				}
				return b.Publish(ctx, "", "parked", d.Message)
			})
		}()

		synctest.Wait() // Serve's consumer is in place
		start := time.Now()
		require.NoError(t, b.Publish(t.Context(), "", "work", warren.Message{Body: []byte("job")}))
		require.NoError(t, b.WaitIdle(t.Context()))

		require.Equal(t, 3, attempts, "the first try and two retries")
		require.Equal(t, 2*time.Hour, time.Since(start), "two hour-long waits in the retry queue, in virtual time")
		require.Equal(t, 1, parked.Len())
		require.Zero(t, work.Len())
		d, err := parked.Get(t.Context(), warren.AutoAck())
		require.NoError(t, err)
		require.Equal(t, "job", string(d.Message.Body))
		st := work.Stats()
		require.Equal(t, uint64(3), st.Enqueued)
		require.Equal(t, uint64(2), st.Rejected)
		require.Equal(t, uint64(1), st.Acked)

		cancel()
		require.NoError(t, <-served)
	})
}

// TestWaitIdleBackoffThenDeliveryLimit: Serve's Backoff keeps a failing message hidden between
// attempts; past the delivery limit it is dead-lettered. WaitIdle waits through the delays.
func TestWaitIdleBackoffThenDeliveryLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := warren.New()
		defer b.Close()
		q, err := b.DeclareQueue("q", warren.DeliveryLimit(2), warren.DeadLetter("", "dlq"))
		require.NoError(t, err)
		dlq, err := b.DeclareQueue("dlq")
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() {
			_ = q.Serve(ctx, func(context.Context, warren.Delivery) error { return errors.New("no") },
				warren.Backoff(time.Minute, time.Hour))
		}()
		synctest.Wait()
		start := time.Now()
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("x")}))
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Equal(t, 3*time.Minute, time.Since(start), "backoff 1 min, then 2 min")
		require.Equal(t, 1, dlq.Len())
		for m := range dlq.Browse() {
			require.Equal(t, warren.ReasonDeliveryLimit, m.Deaths()[0].Reason)
		}
		require.Equal(t, uint64(3), q.Stats().Delivered, "the first try and two retries")
	})
}

// TestWaitIdleStartedDuringEmit: a WaitIdle that begins while another goroutine is emitting a
// queue's events (here a listener that takes 200 ms over one event) returns when the emitting
// ends, not at its own deadline: the emitter tells waiters after its flush, not only before.
func TestWaitIdleStartedDuringEmit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		declare(t, b, "q")
		stop := b.Listen(func(e warren.Event) {
			if e.Kind == warren.EventEnqueued {
				time.Sleep(200 * time.Millisecond)
			}
		})
		defer stop()
		start := time.Now()
		go func() { _ = b.Publish(t.Context(), "", "q", warren.Message{}) }()
		synctest.Wait() // the publisher is in the listener
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		require.NoError(t, b.WaitIdle(ctx))
		require.Equal(t, 200*time.Millisecond, time.Since(start), "WaitIdle returned when the listener did")
	})
}

// TestWaitIdleWaitsForEndedOwners: when the context owning a consumer's or a Get's deliveries
// ends, they go back on another goroutine; WaitIdle returns only once they are back.
func TestWaitIdleWaitsForEndedOwners(t *testing.T) {
	for round := range 50 { // the return races WaitIdle: without the wait it loses nearly always
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 12)
		ctx, cancel := context.WithCancel(t.Context())
		c, err := q.Consume(ctx, warren.Prefetch(10))
		require.NoError(t, err)
		receive(t, c, 10)
		gctx, gcancel := context.WithCancel(t.Context())
		for range 2 {
			_, err := q.Get(gctx)
			require.NoError(t, err)
		}
		cancel()
		gcancel()
		require.NoError(t, b.WaitIdle(t.Context()))
		st := q.Stats()
		require.Equal(t, [3]int{12, 0, 0}, [3]int{st.Ready, st.Unacked, st.Consumers},
			"round %d: ready, unacked, consumers after WaitIdle", round)
		b.Close()
	}
}

// TestWaitEmpty: a service drains a queue before it stops: WaitEmpty returns once nothing is
// ready, delayed or outstanding — here when the last of ten 10 ms jobs is acked, the one that
// failed once included after its 1 s backoff — and then Serve stops with nothing to put back.
// It fails with the queue's end when the queue goes, and with ctx's error at its deadline.
func TestWaitEmpty(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "jobs")
		publishN(t, b, q, 10)
		failed := false
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- q.Serve(ctx, func(_ context.Context, d warren.Delivery) error {
				time.Sleep(10 * time.Millisecond)
				if string(d.Message.Body) == "3" && !failed {
					failed = true
					return errors.New("once")
				}
				return nil
			}, warren.Backoff(time.Second, time.Second))
		}()
		start := time.Now()
		require.NoError(t, q.WaitEmpty(t.Context()))
		require.Equal(t, time.Second+50*time.Millisecond, time.Since(start),
			"job 3 fails at 40 ms; its retry, due at 1.04 s, takes 10 ms")
		st := q.Stats()
		require.Equal(t, [4]uint64{10, 0, 0, 11}, [4]uint64{st.Acked, uint64(st.Ready), uint64(st.Unacked), st.Delivered})
		cancel()
		require.NoError(t, <-done)

		short, cancelShort := context.WithTimeout(t.Context(), time.Minute)
		defer cancelShort()
		publishN(t, b, q, 1)
		require.ErrorIs(t, q.WaitEmpty(short), context.DeadlineExceeded, "nobody consumes")
		go func() {
			time.Sleep(time.Hour)
			deleteQueue(t, b, "jobs")
		}()
		require.ErrorIs(t, q.WaitEmpty(t.Context()), warren.ErrQueueDeleted)
	})
}

// ---------------------------------------------------------------------------------------------
// WaitIdle's edge cases.

// An idle broker, a queue with no consumers, and deliveries held by a plain consumer (no ack
// timeout) or a Get do not make WaitIdle wait.
func TestWaitIdleReturnsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		start := time.Now()
		require.NoError(t, b.WaitIdle(t.Context()), "a new broker")
		q := declare(t, b, "q")
		publishN(t, b, q, 5)
		require.NoError(t, b.WaitIdle(t.Context()), "ready messages, no consumer")
		c, err := q.Consume(t.Context(), warren.Prefetch(2))
		require.NoError(t, err)
		held := receive(t, c, 1) // one received, one buffered
		_, err = q.Get(t.Context())
		require.NoError(t, err)
		require.Equal(t, 2, q.Len())

		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		require.NoError(t, b.WaitIdle(ctx), "deliveries held by a plain consumer and a Get")
		require.Zero(t, time.Since(start), "no virtual time passed")
		require.Equal(t, 3, q.Unacked())
		require.NoError(t, held[0].Ack())
	})
}

// WaitIdle waits for a Serve pool to handle everything.
func TestWaitIdleServePool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		var mu sync.Mutex
		var handled []string
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() {
			done <- q.Serve(ctx, func(ctx context.Context, d warren.Delivery) error {
				time.Sleep(10 * time.Second) // slow work
				mu.Lock()
				handled = append(handled, string(d.Message.Body))
				mu.Unlock()
				return nil
			}, warren.Workers(2))
		}()
		synctest.Wait()
		start := time.Now()
		publishN(t, b, q, 5)
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Equal(t, 30*time.Second, time.Since(start), "5 messages, 2 workers, 10s each")
		mu.Lock()
		require.ElementsMatch(t, []string{"0", "1", "2", "3", "4"}, handled)
		mu.Unlock()
		st := q.Stats()
		require.Equal(t, uint64(5), st.Acked)
		require.Zero(t, st.Unacked)
		cancel()
		require.NoError(t, <-done)
	})
}

// WaitIdle waits through NackWithDelay, DeliverAfter and TTLs in virtual time, and returns
// ctx.Err() when ctx ends first.
func TestWaitIdleTimers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		dlq := declare(t, b, "dlq")
		ttl := declare(t, b, "ttl", warren.DeadLetter("", "dlq"))

		start := time.Now()
		publish(t, b, "q", "n")
		d, err := q.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, d.NackWithDelay(time.Hour))
		require.Zero(t, q.Len())
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Equal(t, time.Hour, time.Since(start), "the nack's delay")
		require.Equal(t, 1, q.Len())

		start = time.Now()
		publish(t, b, "q", "a", warren.DeliverAfter(30*time.Minute))
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Equal(t, 30*time.Minute, time.Since(start), "the publish's delay")
		require.Equal(t, []string{"n", "a"}, browse(q))

		start = time.Now()
		require.NoError(t, b.Publish(t.Context(), "", "ttl", warren.Message{Body: []byte("t"), Expiration: "5000"}))
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Equal(t, 5*time.Second, time.Since(start), "the TTL")
		require.Zero(t, ttl.Len())
		require.Equal(t, []string{"t"}, browse(dlq), "expired and dead-lettered before WaitIdle returned")

		// ctx ends first.
		start = time.Now()
		publish(t, b, "q", "slow", warren.DeliverAfter(time.Hour))
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		require.ErrorIs(t, b.WaitIdle(ctx), context.DeadlineExceeded)
		require.Equal(t, time.Minute, time.Since(start))
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Equal(t, time.Hour, time.Since(start))
	})
}

// A plain consumer with an ack timeout keeps the broker busy while it holds a delivery: WaitIdle
// returns once the timeout has ended the consumer and the delivery is back.
func TestWaitIdleAckTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		c, err := q.Consume(t.Context(), warren.AckTimeout(10*time.Second), warren.Prefetch(1))
		require.NoError(t, err)
		start := time.Now()
		publish(t, b, "q", "m")
		d := receive(t, c, 1)
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Equal(t, 10*time.Second, time.Since(start), "until the ack timeout")
		require.ErrorIs(t, c.Err(), warren.ErrAckTimeout)
		require.Equal(t, 1, q.Len(), "the delivery is back")
		require.ErrorIs(t, d[0].Ack(), warren.ErrAlreadySettled)
	})
}

// TestWaitIdleWaitsForDeleteByAge: a queue whose Delete policy's age threshold will delete it
// keeps WaitIdle waiting until it has (its messages are dropped then).
func TestWaitIdleWaitsForDeleteByAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		declare(t, b, "q", warren.WithAlerts(warren.Alerts{Age: time.Second, Policy: warren.Delete}))
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("m")}))
		start := time.Now()
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Greater(t, time.Since(start), time.Second)
		_, err := b.Queue("q")
		require.ErrorIs(t, err, warren.ErrNotFound)
	})
}

// TestWaitIdleWaitsForQueueExpiry: an unused queue with ready messages and an expiry will be
// deleted; WaitIdle waits for it. An empty one does not hold it up.
func TestWaitIdleWaitsForQueueExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		declare(t, b, "empty", warren.Expires(time.Hour))
		declare(t, b, "q", warren.Expires(time.Minute))
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("m")}))
		start := time.Now()
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Equal(t, time.Minute, time.Since(start))
		_, err := b.Queue("empty")
		require.NoError(t, err, "not waited for")
	})
}

// TestWaitIdleNotHeldUpByReaders: a goroutine polling Len (a metrics scraper, a polling
// assertion) changes nothing, so it must not keep WaitIdle from seeing the broker idle.
func TestWaitIdleNotHeldUpByReaders(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	for _, n := range []string{"a", "b", "c", "d"} {
		declare(t, b, n)
	}
	require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("m")}))
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			q.Len()
			q.Stats()
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := b.WaitIdle(ctx)
	stop.Store(true)
	<-done
	require.NoError(t, err)
}

// ---------------------------------------------------------------------------------------------
// Outstanding.

// Outstanding lists the consumers' deliveries, received or buffered, consumer by consumer in the
// order they started and each in tag order, then the Gets in tag order; settled ones disappear.
func TestOutstanding(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	publishN(t, b, q, 12) // "0".."11"

	type row struct {
		Body, Consumer string
		Tag            uint64
		Redelivered    bool
		Count          int
	}
	list := func() []row {
		var out []row
		for d := range q.Outstanding() {
			out = append(out, row{string(d.Message.Body), d.ConsumerTag, d.DeliveryTag, d.Redelivered, d.DeliveryCount})
		}
		return out
	}
	require.Empty(t, list())

	g, err := q.Get(t.Context()) // "0", tag 1
	require.NoError(t, err)
	require.NoError(t, g.Nack())
	g0, err := q.Get(t.Context()) // "0" again, tag 2
	require.NoError(t, err)
	zed, err := q.Consume(t.Context(), warren.ConsumerTag("zed"), warren.Prefetch(3)) // "1" "2" "3"
	require.NoError(t, err)
	abc, err := q.Consume(t.Context(), warren.ConsumerTag("abc"), warren.Prefetch(2)) // "4" "5"
	require.NoError(t, err)
	g6, err := q.Get(t.Context()) // tag 3
	require.NoError(t, err)
	g7, err := q.Get(t.Context()) // tag 4
	require.NoError(t, err)
	g8, err := q.Get(t.Context()) // tag 5
	require.NoError(t, err)
	require.Equal(t, []string{"6", "7", "8"}, []string{string(g6.Message.Body), string(g7.Message.Body), string(g8.Message.Body)})
	zd := receive(t, zed, 1) // "1" received; "2" and "3" buffered

	require.Equal(t, []row{
		{"1", "zed", 1, false, 0}, {"2", "zed", 2, false, 0}, {"3", "zed", 3, false, 0},
		{"4", "abc", 1, false, 0}, {"5", "abc", 2, false, 0},
		{"0", "", 2, true, 1}, {"6", "", 3, false, 0}, {"7", "", 4, false, 0}, {"8", "", 5, false, 0},
	}, list())
	require.Equal(t, q.Unacked(), len(list()))
	for d := range q.Outstanding() {
		if d.ConsumerTag == "zed" && d.DeliveryTag == 1 {
			require.Equal(t, zd[0].Message, *d.Message, "the message itself")
		}
	}

	// Settle some: they disappear; a nacked one comes back redelivered under a new tag.
	require.NoError(t, zd[0].Ack())  // zed then takes "9" (tag 4)
	require.NoError(t, g0.Ack())     // gone
	require.NoError(t, g7.Ack())     // gone
	zd = receive(t, zed, 1)          // "2"
	require.NoError(t, zd[0].Nack()) // back at the head: zed takes it again (tag 5), abc has no credit
	require.Equal(t, "3", picture(receive(t, zed, 1)))
	require.Equal(t, []row{
		{"3", "zed", 3, false, 0}, {"9", "zed", 4, false, 0}, {"2", "zed", 5, true, 1},
		{"4", "abc", 1, false, 0}, {"5", "abc", 2, false, 0},
		{"6", "", 3, false, 0}, {"8", "", 5, false, 0},
	}, list())
	require.Equal(t, q.Unacked(), len(list()))

	zr := receive(t, zed, 2)        // "9" (tag 4) and "2" (tag 5)
	require.NoError(t, zr[0].Ack()) // settled between two outstanding ones; zed takes "10" (tag 6)
	require.Equal(t, "4 5", picture(receive(t, abc, 2)))
	require.NoError(t, abc.AckUpTo(0)) // abc then takes "11" (tag 3)
	require.NoError(t, g6.Ack())
	require.NoError(t, g8.Ack())
	rows := list()
	require.Equal(t, []row{
		{"3", "zed", 3, false, 0}, {"2", "zed", 5, true, 1}, {"10", "zed", 6, false, 0},
		{"11", "abc", 3, false, 0},
	}, rows, "zed's tag 4, abc's first two and the Gets settled")
	require.Equal(t, q.Unacked(), len(rows))

	// Many Gets, some settled: the rest in tag order.
	gq := declare(t, b, "gets")
	publishN(t, b, gq, 40)
	var want []uint64
	for i := range 40 {
		d, err := gq.Get(t.Context())
		require.NoError(t, err)
		if i%7 == 3 {
			require.NoError(t, d.Ack())
			continue
		}
		want = append(want, d.DeliveryTag)
	}
	var tags []uint64
	for d := range gq.Outstanding() {
		require.Empty(t, d.ConsumerTag)
		tags = append(tags, d.DeliveryTag)
	}
	require.Equal(t, want, tags)
}

// A Get made with a context that never ends is outstanding like any other Get: Outstanding
// lists it, as Unacked counts it.
func TestOutstandingGetWithoutDone(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	publishN(t, b, q, 3)
	g1, err := q.Get(t.Context())
	require.NoError(t, err)
	g2, err := q.Get(context.Background())
	require.NoError(t, err)
	g3, err := q.Get(t.Context())
	require.NoError(t, err)
	require.Equal(t, 3, q.Unacked())
	var tags []uint64
	for d := range q.Outstanding() {
		tags = append(tags, d.DeliveryTag)
	}
	require.Equal(t, []uint64{g1.DeliveryTag, g2.DeliveryTag, g3.DeliveryTag}, tags,
		"the Get made with context.Background is outstanding too")
}

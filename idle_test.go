package warren_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

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
			served <- work.Serve(ctx, func(ctx context.Context, d *warren.Delivery) error {
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
				return b.Publish(ctx, "", "parked", *d.Message)
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
			_ = q.Serve(ctx, func(context.Context, *warren.Delivery) error { return errors.New("no") },
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
			done <- q.Serve(ctx, func(_ context.Context, d *warren.Delivery) error {
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

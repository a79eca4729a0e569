package warren_test

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of AutoAck consumers (consumer.go's feed; feeder.go to come): a feeder goroutine takes
// each message for its consumer and puts back what it holds when the consumer ends — its
// context, a single-active takeover, a deletion — before anything else is dispatched.

func TestAutoAckConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		c, err := q.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(3))
		require.NoError(t, err)
		publishN(t, b, q, 5)
		synctest.Wait() // the feeder goroutine fills the channel (2) and holds one more
		require.Equal(t, 2, q.Len(), "an AutoAck consumer takes at most its prefetch")
		ds := receive(t, c, 2)
		require.Equal(t, "0 1", bodies(ds))
		require.ErrorIs(t, ds[0].Ack(), warren.ErrUnknownDelivery, "auto-acked: nothing to settle")
		require.Equal(t, 0, q.Unacked())
		synctest.Wait()
		require.Equal(t, 2, len(c.Deliveries()), "the feeder refilled the buffer")

		// Cancel: what is buffered and what the feeder holds go back unchanged.
		require.NoError(t, c.Cancel())
		_, open := <-c.Deliveries()
		require.False(t, open)
		require.Equal(t, "2 3 4", drain(t, q))
	})
}

// TestAutoAckDoneAfterReturn: when the context of an AutoAck consumer ends, everything it held
// — the delivery waiting unread in its channel and the message its feeder took for the next
// send — is back in the queue by the time Done is closed. (A regression test: Done used to close
// before the feeder put them back, so Len right after <-Done could be 1 instead of 3; with -race
// on about the first run, hence the repetition.)
func TestAutoAckDoneAfterReturn(t *testing.T) {
	for i := 0; i < 500 && !t.Failed(); i++ {
		synctest.Test(t, func(t *testing.T) {
			b := newBroker(t)
			q := declare(t, b, "q")
			publishN(t, b, q, 3)
			ctx, cancel := context.WithCancel(t.Context())
			c, err := q.Consume(ctx, warren.Prefetch(2), warren.AutoAck())
			require.NoError(t, err)
			synctest.Wait() // "0" buffered in the channel, "1" held by the feeder, "2" ready
			require.Equal(t, 1, q.Len())
			cancel()
			<-c.Done()
			require.Equal(t, 3, q.Len(), "run %d: ready right after Done closed", i)
		})
	}
}

// TestContextEndAutoAckReturnsBeforeDispatch: when a context owning an AutoAck consumer and a
// Get ends, the AutoAck consumer's messages — the one its feeder holds and the one buffered in
// its channel, both earlier in the queue — are back before anything is dispatched, so a push
// consumer receives "0", not the Get's "2*". The feeder puts them back on its own goroutine;
// dispatch waits for it (Queue.leaving). (A regression test: reap dispatched at once.)
func TestContextEndAutoAckReturnsBeforeDispatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 4)
		ctx, cancel := context.WithCancel(t.Context())
		_, err := q.Consume(ctx, warren.AutoAck(), warren.Prefetch(2))
		require.NoError(t, err)
		synctest.Wait()     // "0" buffered in the channel, "1" held by the feeder, "2" and "3" ready
		_, err = q.Get(ctx) // "2", owned by ctx too
		require.NoError(t, err)
		push, err := q.Consume(t.Context(), warren.Prefetch(1))
		require.NoError(t, err)
		require.NoError(t, receive(t, push, 1)[0].Ack()) // "3": the push consumer has credit again
		cancel()
		synctest.Wait()
		require.Equal(t, "0", picture(receive(t, push, 1)), "the head of what the context returned")
	})
}

// TestSingleActiveAutoAckContextEnd: on a single-active-consumer queue whose active consumer
// is an AutoAck one, when its context ends, everything it held — the message its feeder holds
// and those buffered in its channel — is back in its place before the next consumer receives
// (SingleActiveConsumer's doc). (A regression test, found while deciding what the model can
// cover: orphanLocked only told the feeder to stop, and the feeder put its messages back later,
// on its own goroutine, while reap had already dispatched to the consumer removeConsumerLocked
// activated, which received "2 3 0 1".)
func TestSingleActiveAutoAckContextEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.SingleActiveConsumer())
		publishN(t, b, q, 4)
		ctx, cancel := context.WithCancel(t.Context())
		auto, err := q.Consume(ctx, warren.AutoAck(), warren.Prefetch(2))
		require.NoError(t, err)
		synctest.Wait() // "0" buffered in the channel, "1" held by the feeder, "2" and "3" ready
		require.Equal(t, 2, q.Len())
		next, err := q.Consume(t.Context(), warren.Prefetch(10)) // waits its turn
		require.NoError(t, err)
		cancel()
		<-auto.Done()
		synctest.Wait()
		require.Equal(t, "0 1 2 3", picture(receive(t, next, 4)), "what the next active consumer receives")
	})
}

// A single-active-consumer queue whose active consumer is AutoAck: when its context ends, what
// its feeder held and had buffered is back in place before the next consumer receives.
func TestSingleActiveAutoAckFailoverKeepsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "sac", warren.SingleActiveConsumer())
		ctxA, cancelA := context.WithCancel(t.Context())
		_, err := q.Consume(ctxA, warren.AutoAck(), warren.Prefetch(3))
		require.NoError(t, err)
		next, err := q.Consume(t.Context(), warren.Prefetch(10))
		require.NoError(t, err)
		publishN(t, b, q, 5)
		synctest.Wait()
		cancelA()
		synctest.Wait()
		require.Equal(t, "0 1 2 3 4", picture(receive(t, next, 5)))
	})
}

// The same with an AutoAck successor, which takes messages itself rather than being dispatched
// to: it too waits until the old feeder has put back what it held.
func TestSingleActiveAutoAckToAutoAckFailoverKeepsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "sac", warren.SingleActiveConsumer())
		ctxA, cancelA := context.WithCancel(t.Context())
		_, err := q.Consume(ctxA, warren.AutoAck(), warren.Prefetch(3))
		require.NoError(t, err)
		next, err := q.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(10))
		require.NoError(t, err)
		publishN(t, b, q, 5)
		synctest.Wait()
		cancelA()
		synctest.Wait()
		require.Equal(t, "0 1 2 3 4", picture(receive(t, next, 5)))
	})
}

// TestDeleteQueueStopsAutoAckConsumers: when DeleteQueue returns, an AutoAck consumer has
// stopped as a push consumer has (and as after Cancel or Close): Deliveries closed, nothing of
// the deleted queue left in it. The queue's end returns the feeders to join; DeleteQueue must
// join them. The feeder's exit races with the caller, so the test repeats.
func TestDeleteQueueStopsAutoAckConsumers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		const rounds = 100
		open := 0
		for range rounds {
			q := declare(t, b, "q")
			push, err := q.Consume(t.Context(), warren.Prefetch(1))
			require.NoError(t, err)
			auto, err := q.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(1))
			require.NoError(t, err)
			publishN(t, b, q, 4)
			synctest.Wait()

			deleteQueue(t, b, "q")
			assertStopped(t, push, warren.ErrQueueDeleted)
			assert.ErrorIs(t, auto.Err(), warren.ErrQueueDeleted)
			select {
			case _, ok := <-auto.Deliveries():
				if ok {
					open++
				}
			default:
				open++
			}
			synctest.Wait()
		}
		if open > 0 {
			t.Errorf("in %d of %d rounds an AutoAck consumer's Deliveries() was not closed when DeleteQueue returned (still buffering a message of the deleted queue, or feeder not yet exited)", open, rounds)
		}
	})
}

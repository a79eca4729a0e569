package warren_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Regression tests for dispatch edge cases a review of the consumer features found.

// A fresh message at the top priority lands below a selector's cursor once the cursor has moved
// into a lower priority: the consumer must still see it (cursors are per priority rank).
func TestSelectorSeesFreshTopPriorityMessage(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "pq", warren.MaxPriority(2))
	c, err := q.Consume(t.Context(), warren.Selector(func(m *warren.Message) bool { return string(m.Body) == "want" }))
	require.NoError(t, err)
	require.NoError(t, b.Publish(t.Context(), "", "pq", warren.Message{Body: []byte("skip"), Priority: 0}))
	require.NoError(t, b.Publish(t.Context(), "", "pq", warren.Message{Body: []byte("want"), Priority: 2}))
	require.Len(t, c.Deliveries(), 1, "a selective consumer with credit did not get the top-priority message it accepts")
}

// A selector sees each message once while it stays ready, also when publishes alternate between
// priorities: publishing at a higher priority must not make it re-examine the lower ones.
func TestSelectorExaminesEachMessageOnceAcrossPriorities(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "pq", warren.MaxPriority(2))
	calls := 0 // the selector runs under the queue lock, on the publisher's goroutine here
	_, err := q.Consume(t.Context(), warren.Selector(func(*warren.Message) bool { calls++; return false }))
	require.NoError(t, err)
	const n = 1000
	for i := range 2 * n {
		require.NoError(t, b.Publish(t.Context(), "", "pq", warren.Message{Body: fmt.Append(nil, i), Priority: uint8(i / n)}))
	}
	require.Equal(t, 2*n, calls, "selector calls for %d messages", 2*n)
}

// MaxPriority(255) has 256 ranks: a selector scan over all of them must end.
func TestSelectorOnMaxPriority255(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "pq", warren.MaxPriority(255))
	c, err := q.Consume(t.Context(), warren.Selector(func(m *warren.Message) bool { return m.Priority == 0 }))
	require.NoError(t, err)
	for _, p := range []uint8{255, 0, 7} {
		require.NoError(t, b.Publish(t.Context(), "", "pq", warren.Message{Body: []byte{p}, Priority: p}))
	}
	d := <-c.Deliveries()
	require.Equal(t, []byte{0}, d.Message.Body)
	require.Equal(t, 2, q.Len())
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

// A huge ack timeout means "practically never": it must not overflow the delivery's deadline and
// so disarm the queue's timer for everything else.
func TestHugeAckTimeoutKeepsTimerWorking(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		c, err := q.Consume(t.Context(), warren.Prefetch(1), warren.AckTimeout(time.Duration(math.MaxInt64)))
		require.NoError(t, err)
		publishN(t, b, q, 1)
		receive(t, c, 1)
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("ttl"), Expiration: "1000"}))
		time.Sleep(2 * time.Second)
		synctest.Wait()
		require.Equal(t, 0, q.Len(), "a message with a 1 s TTL did not expire")
		require.NoError(t, c.Err())
	})
}

// A high-priority AutoAck consumer with room takes a whole publish burst; the lower-priority
// consumer receives nothing while it has room (R2.3).
func TestHighPriorityAutoAckConsumerTakesBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		hi, err := q.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(10), warren.ConsumerPriority(1))
		require.NoError(t, err)
		lo, err := q.Consume(t.Context(), warren.Prefetch(10))
		require.NoError(t, err)
		synctest.Wait() // the feeder is parked, idle
		publishN(t, b, q, 5)
		synctest.Wait()
		require.Empty(t, lo.Deliveries(), "the low-priority consumer received while the high-priority one had room")
		require.Equal(t, "0 1 2 3 4", picture(receive(t, hi, 5)))
	})
}

// The consumers of an exclusive queue end with ErrQueueDeleted when the owner ends, whichever
// of the queue's and the consumers' context callbacks runs first.
func TestExclusiveQueueConsumersEndWithQueueDeleted(t *testing.T) {
	b := newBroker(t)
	for i := range 100 {
		ctx, cancel := context.WithCancel(t.Context())
		q := declare(t, b, "", warren.ExclusiveTo(ctx))
		c, err := q.Consume(ctx)
		require.NoError(t, err)
		cancel()
		<-c.Done()
		require.ErrorIs(t, c.Err(), warren.ErrQueueDeleted, "round %d", i)
		_, err = b.Queue(q.Name())
		require.ErrorIs(t, err, warren.ErrNotFound, "round %d: the queue outlived its owner", i)
	}
}

// An immediate publish never waits, not even on a full queue with the Block policy.
func TestImmediateNeverBlocks(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q", warren.MaxLength(1), warren.Overflow(warren.Block))
	publishN(t, b, q, 1)
	err := b.Publish(t.Context(), "", "q", warren.Message{}, warren.Immediate())
	require.ErrorIs(t, err, warren.ErrQueueFull)
}

// A listener that panics is logged, not propagated: the publisher or handler that caused the
// event carries on.
func TestPanickingListenerIsContained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		stop := b.Listen(func(warren.Event) { panic("listener bug") })
		defer stop()
		require.NotPanics(t, func() { stop := b.Listen(nil); stop() })
		q := declare(t, b, "q")
		publishN(t, b, q, 1)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- q.Serve(ctx, func(context.Context, *warren.Delivery) error { panic("handler bug") },
				warren.Backoff(time.Hour, time.Hour)) // one attempt, then hidden for an hour
		}()
		synctest.Wait()
		cancel()
		require.NoError(t, <-done)
		time.Sleep(time.Hour)
		synctest.Wait()
		require.Equal(t, 1, q.Len(), "the failed message is back in the queue")
	})
}

// TestNewConsumerJoinsEndOfRotation: three consumers with free credit have received messages 1–3
// in turn; a fourth subscribes; message 4 goes to the first consumer, not the newcomer, and the
// newcomer's turn comes after the other three's, as in RabbitMQ. Both dispatch paths (the plain
// one, and the general one, taken here because a lower-priority consumer exists), with prefetch 1
// (each message acked, so credit is free again) and with a large prefetch.
func TestNewConsumerJoinsEndOfRotation(t *testing.T) {
	for _, general := range []bool{false, true} {
		for _, prefetch := range []int{1, 64} {
			t.Run(fmt.Sprintf("general=%t/prefetch=%d", general, prefetch), func(t *testing.T) {
				b := newBroker(t)
				q := declare(t, b, "q")
				opts := []warren.ConsumeOption{warren.Prefetch(prefetch), warren.ConsumerPriority(1)}
				if general {
					_, err := q.Consume(t.Context(), warren.ConsumerPriority(0)) // receives only when the others cannot
					require.NoError(t, err)
				}
				var cs []*warren.Consumer
				got := map[string]string{} // message → consumer
				take := func() {
					t.Helper()
					for _, c := range cs {
						select {
						case d := <-c.Deliveries():
							got[string(d.Message.Body)] = c.Tag()
							if prefetch == 1 {
								require.NoError(t, d.Ack())
							}
						default:
						}
					}
				}
				publish := func(body string) {
					t.Helper()
					require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte(body)}))
					take()
				}
				for _, tag := range []string{"A", "B", "C"} {
					c, err := q.Consume(t.Context(), append(opts, warren.ConsumerTag(tag))...)
					require.NoError(t, err)
					cs = append(cs, c)
				}
				for _, m := range []string{"1", "2", "3"} {
					publish(m)
				}
				require.Equal(t, map[string]string{"1": "A", "2": "B", "3": "C"}, got)
				d, err := q.Consume(t.Context(), append(opts, warren.ConsumerTag("D"))...)
				require.NoError(t, err)
				cs = append(cs, d)
				for _, m := range []string{"4", "5", "6", "7", "8"} {
					publish(m)
				}
				require.Equal(t, map[string]string{"1": "A", "2": "B", "3": "C", "4": "A", "5": "B", "6": "C", "7": "D", "8": "A"}, got)
			})
		}
	}
}

package warren_test

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of consumers (consumer.go): Consume and Prefetch, consumer tags, Cancel, Close, Done and
// Err, the end of a consumer's context, exclusive consumers and ack timeouts. Which consumer
// receives which message is in dispatch_test.go, settling deliveries in delivery_test.go,
// AutoAck consumers in feeder_test.go.

func TestPrefetchBoundsOutstandingDeliveries(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	c, err := q.Consume(t.Context(), warren.Prefetch(2))
	require.NoError(t, err)
	publishN(t, b, q, 5)
	require.Equal(t, 2, len(c.Deliveries()), "buffered for the consumer")
	require.Equal(t, 3, q.Len())
	require.Equal(t, 2, q.Unacked())

	ds := receive(t, c, 2)
	require.Equal(t, 0, len(c.Deliveries()), "received deliveries still count against prefetch")
	require.NoError(t, ds[0].Ack())
	require.Equal(t, 1, len(c.Deliveries()), "an ack frees one unit of credit")
	require.Equal(t, "2", bodies(receive(t, c, 1)))
	require.NoError(t, ds[1].Nack())
	require.Equal(t, "1", bodies(receive(t, c, 1)), "the nacked message comes back first")
}

func TestConsumerTags(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	c1, err := q.Consume(t.Context())
	require.NoError(t, err)
	c2, err := q.Consume(t.Context())
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(c1.Tag(), "amq.ctag-"), c1.Tag())
	require.NotEqual(t, c1.Tag(), c2.Tag())

	named, err := q.Consume(t.Context(), warren.ConsumerTag("mine"))
	require.NoError(t, err)
	_, err = q.Consume(t.Context(), warren.ConsumerTag("mine"))
	require.ErrorIs(t, err, warren.ErrPreconditionFailed)
	require.NoError(t, named.Cancel())
	_, err = q.Consume(t.Context(), warren.ConsumerTag("mine"))
	require.NoError(t, err, "a cancelled consumer's tag is free again")
}

func TestCancelLeavesReceivedDeliveriesSettleable(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	c, err := q.Consume(t.Context(), warren.Prefetch(3))
	require.NoError(t, err)
	publishN(t, b, q, 3)
	ds := receive(t, c, 1) // 0 received; 1 and 2 buffered
	require.NoError(t, c.Cancel())
	require.NoError(t, c.Cancel(), "Cancel is idempotent")
	require.ErrorIs(t, c.Err(), warren.ErrCancelled)
	_, open := <-c.Deliveries()
	require.False(t, open, "Deliveries is closed by the time Cancel returns")
	require.Equal(t, 1, q.Unacked())
	require.Equal(t, "1 2", drain(t, q), "buffered deliveries went back unchanged")
	require.NoError(t, ds[0].Ack(), "a received delivery stays settle-able after Cancel")
	require.Equal(t, 0, q.Unacked())
}

func TestConsumerContextEndReportsCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		ctx, cancel := context.WithCancel(t.Context())
		c, err := q.Consume(ctx)
		require.NoError(t, err)
		require.NoError(t, c.Err())
		cancel()
		<-c.Done()
		require.ErrorIs(t, c.Err(), context.Canceled)
		_, open := <-c.Deliveries()
		require.False(t, open)
		require.Equal(t, 0, q.ConsumerCount())
	})
}

// TestConsumerClose: Close ends a consumer as the end of its context would, synchronously: by the
// time it returns, what it received is back redelivered and what was buffered is back unchanged,
// in their places, Done is closed and Err says ErrCancelled. Also after Cancel, for an AutoAck
// consumer, and after the queue is gone.
func TestConsumerClose(t *testing.T) {
	for round := range 20 { // outside a bubble: nothing may be left for another goroutine to do
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 6)
		c, err := q.Consume(t.Context(), warren.Prefetch(4))
		require.NoError(t, err)
		got := receive(t, c, 2) // "0", "1" received; "2", "3" buffered
		require.NoError(t, c.Close())
		st := q.Stats()
		require.Equal(t, [3]int{6, 0, 0}, [3]int{st.Ready, st.Unacked, st.Consumers}, "round %d: ready, unacked, consumers", round)
		require.ErrorIs(t, got[0].Ack(), warren.ErrAlreadySettled)
		require.ErrorIs(t, c.Err(), warren.ErrCancelled)
		_, open := <-c.Deliveries()
		require.False(t, open)
		select {
		case <-c.Done():
		default:
			t.Fatal("Done open after Close")
		}
		var again []string
		for m := range q.Browse() {
			again = append(again, string(m.Body))
		}
		require.Equal(t, []string{"0", "1", "2", "3", "4", "5"}, again, "back in their places")
		d, err := q.Get(t.Context())
		require.NoError(t, err)
		require.True(t, d.Redelivered, "received: redelivered")
		require.NoError(t, d.Nack())
		require.NoError(t, c.Close(), "idempotent")
		b.Close()
	}

	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 3)
		c, err := q.Consume(t.Context(), warren.Prefetch(2))
		require.NoError(t, err)
		held := receive(t, c, 1)
		require.NoError(t, c.Cancel())
		select {
		case <-c.Done():
			t.Fatal("Done closed after Cancel while the consumer holds a delivery")
		default:
		}
		require.NoError(t, c.Close())
		require.Equal(t, 3, q.Len(), "the received delivery is back")
		require.ErrorIs(t, held[0].Ack(), warren.ErrAlreadySettled)

		auto, err := q.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(3))
		require.NoError(t, err)
		synctest.Wait() // its feeder has taken what fits
		require.NoError(t, auto.Close())
		require.Equal(t, 3, q.Len(), "an AutoAck consumer's unread messages are back")

		gone, err := q.Consume(t.Context())
		require.NoError(t, err)
		deleteQueue(t, b, "q")
		require.NoError(t, gone.Close(), "after the queue was deleted")
		require.ErrorIs(t, gone.Err(), warren.ErrQueueDeleted, "Err keeps the first reason")
	})
}

// TestDoneAfterCancel: after Cancel, Done is closed once the consumer holds nothing: at once if
// it held nothing, else when its last delivery is settled, or when its context ends and they are
// back.
func TestDoneAfterCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 3)
		closed := func(c *warren.Consumer) bool {
			select {
			case <-c.Done():
				return true
			default:
				return false
			}
		}
		idle, err := q.Consume(t.Context())
		require.NoError(t, err)
		require.NoError(t, idle.Cancel())
		require.True(t, closed(idle), "holding nothing")

		c, err := q.Consume(t.Context(), warren.Prefetch(2))
		require.NoError(t, err)
		ds := receive(t, c, 2)
		require.NoError(t, c.Cancel())
		require.False(t, closed(c))
		require.NoError(t, ds[0].Ack())
		require.False(t, closed(c), "one still held")
		require.NoError(t, ds[1].Nack())
		require.True(t, closed(c), "the last one settled")

		ctx, cancel := context.WithCancel(t.Context())
		c2, err := q.Consume(ctx, warren.Prefetch(1))
		require.NoError(t, err)
		receive(t, c2, 1)
		require.NoError(t, c2.Cancel())
		require.False(t, closed(c2))
		cancel()
		<-c2.Done()
		require.Equal(t, 2, q.Len(), "the held delivery is back when Done closes")
	})
}

// ---------------------------------------------------------------------------------------------
// Exclusive consumers (R2.5).

// TestExclusiveConsumerRefusesOthers: while an exclusive consumer is active every other
// consume fails with ErrAccessRefused; Get is not a consume and still works; once it cancels,
// others may consume and nothing takes over by itself.
func TestExclusiveConsumerRefusesOthers(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	c, err := q.Consume(t.Context(), warren.Exclusive(), warren.Prefetch(1))
	require.NoError(t, err)
	_, err = q.Consume(t.Context())
	require.ErrorIs(t, err, warren.ErrAccessRefused, "a plain consume beside an exclusive consumer")
	_, err = q.Consume(t.Context(), warren.Exclusive())
	require.ErrorIs(t, err, warren.ErrAccessRefused, "a second exclusive consume")
	_, err = q.Consume(t.Context(), warren.AutoAck())
	require.ErrorIs(t, err, warren.ErrAccessRefused, "an auto-ack consume")
	_, err = q.Consume(t.Context(), warren.ConsumerPriority(100))
	require.ErrorIs(t, err, warren.ErrAccessRefused, "a higher-priority consume")
	require.Equal(t, 1, q.ConsumerCount(), "refused consumers leave no trace")

	publishN(t, b, q, 2)
	require.Equal(t, "0", bodies(receive(t, c, 1)))
	d, err := q.Get(t.Context())
	require.NoError(t, err, "Get is not a consume")
	require.Equal(t, "1", string(d.Message.Body))
	require.NoError(t, d.Ack())

	require.NoError(t, c.Cancel())
	require.Equal(t, 0, q.ConsumerCount())
	c2, err := q.Consume(t.Context(), warren.Prefetch(5))
	require.NoError(t, err, "exclusivity ends with the consumer")
	c3, err := q.Consume(t.Context(), warren.Prefetch(5))
	require.NoError(t, err)
	publishRange(t, b, q, 2, 4)
	require.Equal(t, "2", bodies(buffered(t, c2)))
	require.Equal(t, "3", bodies(buffered(t, c3)))
}

// TestExclusiveConsumerEndsWithContext: exclusivity also ends when the exclusive consumer's
// context ends.
func TestExclusiveConsumerEndsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		c, err := q.Consume(ctx, warren.Exclusive())
		require.NoError(t, err)
		_, err = q.Consume(t.Context())
		require.ErrorIs(t, err, warren.ErrAccessRefused)
		cancel()
		synctest.Wait()
		require.True(t, isClosed(c.Done()))
		c2, err := q.Consume(t.Context(), warren.Exclusive())
		require.NoError(t, err, "a new exclusive consumer once the old one's context ended")
		publishN(t, b, q, 1)
		require.Equal(t, "0", bodies(buffered(t, c2)))
	})
}

// TestExclusiveConsumerNeedsIdleQueue: an exclusive consume fails on a queue with consumers
// (push or auto-ack) and on a single-active-consumer queue, even one without consumers.
func TestExclusiveConsumerNeedsIdleQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		c, err := q.Consume(t.Context())
		require.NoError(t, err)
		_, err = q.Consume(t.Context(), warren.Exclusive())
		require.ErrorIs(t, err, warren.ErrAccessRefused, "the queue has a consumer")
		require.Equal(t, 1, q.ConsumerCount())
		require.NoError(t, c.Cancel())

		feeder, err := q.Consume(t.Context(), warren.AutoAck())
		require.NoError(t, err)
		_, err = q.Consume(t.Context(), warren.Exclusive())
		require.ErrorIs(t, err, warren.ErrAccessRefused, "the queue has an auto-ack consumer")
		require.NoError(t, feeder.Cancel())

		_, err = q.Consume(t.Context(), warren.Exclusive())
		require.NoError(t, err, "no consumers left")

		sac := declare(t, b, "sac", warren.SingleActiveConsumer())
		_, err = sac.Consume(t.Context(), warren.Exclusive())
		require.ErrorIs(t, err, warren.ErrAccessRefused, "exclusive on a single active consumer queue")
		require.Equal(t, 0, sac.ConsumerCount())
		_, err = sac.Consume(t.Context())
		require.NoError(t, err)
		_, err = sac.Consume(t.Context(), warren.Exclusive())
		require.ErrorIs(t, err, warren.ErrAccessRefused)
	})
}

// ---------------------------------------------------------------------------------------------
// Ack timeouts (R2.8).

// TestAckTimeoutEndsConsumer: a delivery unsettled for the ack timeout ends its consumer;
// received deliveries come back redelivered, buffered unread ones unchanged, in place.
func TestAckTimeoutEndsConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		c, err := q.Consume(t.Context(), warren.AckTimeout(30*time.Second), warren.Prefetch(3))
		require.NoError(t, err)
		publishN(t, b, q, 5)
		ds := receive(t, c, 2)
		require.Equal(t, "0 1", picture(ds))
		require.NoError(t, ds[0].Ack())
		require.Equal(t, 2, len(c.Deliveries()), "2 and 3 buffered, unread")

		time.Sleep(30*time.Second - time.Millisecond)
		synctest.Wait()
		require.NoError(t, c.Err(), "not yet")
		require.False(t, isClosed(c.Done()))
		time.Sleep(time.Millisecond)
		synctest.Wait()
		require.ErrorIs(t, c.Err(), warren.ErrAckTimeout)
		require.ErrorIs(t, c.Err(), warren.ErrPreconditionFailed)
		assertStopped(t, c, warren.ErrAckTimeout)
		require.ErrorIs(t, ds[1].Ack(), warren.ErrAlreadySettled, "a late ack")
		require.Equal(t, 0, q.Unacked())
		require.Equal(t, 0, q.ConsumerCount())
		back := getAll(t, q)
		require.Equal(t, "1* 2 3 4", picture(back))
		require.Equal(t, []int{1, 0, 0, 0}, deliveryCounts(back))
	})
}

// TestAckTimeoutCountsBufferedDeliveries: deliveries never received count too.
func TestAckTimeoutCountsBufferedDeliveries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		c, err := q.Consume(t.Context(), warren.AckTimeout(10*time.Second), warren.Prefetch(2))
		require.NoError(t, err)
		publishN(t, b, q, 3)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		assertStopped(t, c, warren.ErrAckTimeout)
		back := getAll(t, q)
		require.Equal(t, "0 1 2", picture(back))
		require.Equal(t, []int{0, 0, 0}, deliveryCounts(back))
	})
}

// TestAckTimeoutNotHitWhenAckedInTime: a consumer that settles each delivery within the
// timeout is never ended, however long it runs.
func TestAckTimeoutNotHitWhenAckedInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		c, err := q.Consume(t.Context(), warren.AckTimeout(30*time.Second), warren.Prefetch(1))
		require.NoError(t, err)
		for i := range 10 {
			publish(t, b, q.Name(), strconv.Itoa(i))
			ds := receive(t, c, 1)
			time.Sleep(20 * time.Second)
			require.NoError(t, ds[0].Ack(), "delivery %d", i)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		require.NoError(t, c.Err())
		require.False(t, isClosed(c.Done()))
		publish(t, b, q.Name(), "10")
		require.Equal(t, "10", bodies(buffered(t, c)))
	})
}

// TestAckTimeoutQueueArgument: "x-consumer-timeout" is the default ack timeout of the
// queue's manual-ack consumers; AckTimeout overrides it, and AckTimeout(0) turns it off.
func TestAckTimeoutQueueArgument(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		for _, v := range []any{int32(0), int32(-1), "10000", 1.5} {
			_, err := b.DeclareQueue("bad", warren.Arguments(warren.Table{"x-consumer-timeout": v}))
			require.ErrorIs(t, err, warren.ErrPreconditionFailed, "x-consumer-timeout %v (%T)", v, v)
		}
		q := declare(t, b, "q", warren.Arguments(warren.Table{"x-consumer-timeout": int32(10000)}))
		dflt, err := q.Consume(t.Context(), warren.Prefetch(1))
		require.NoError(t, err)
		longer, err := q.Consume(t.Context(), warren.Prefetch(1), warren.AckTimeout(20*time.Second))
		require.NoError(t, err)
		none, err := q.Consume(t.Context(), warren.Prefetch(1), warren.AckTimeout(0))
		require.NoError(t, err)
		publishN(t, b, q, 3) // one each, round-robin, left unread

		time.Sleep(10*time.Second - time.Millisecond)
		synctest.Wait()
		require.NoError(t, dflt.Err())
		time.Sleep(time.Millisecond)
		synctest.Wait()
		assertStopped(t, dflt, warren.ErrAckTimeout)
		require.NoError(t, longer.Err())
		time.Sleep(10 * time.Second)
		synctest.Wait()
		assertStopped(t, longer, warren.ErrAckTimeout)
		time.Sleep(time.Hour)
		synctest.Wait()
		require.NoError(t, none.Err(), "AckTimeout(0): no timeout")
		require.Equal(t, "0 1", picture(getAll(t, q)))
		require.Equal(t, "2", bodies(buffered(t, none)))

		feeder, err := q.Consume(t.Context(), warren.AutoAck())
		require.NoError(t, err, "the queue's default does not apply to auto-ack consumers")
		require.NoError(t, feeder.Cancel())
	})
}

// TestConsumerTimeoutGetLetsGoOfItsContext: a Get delivery the consumer timeout takes back no
// longer watches the Get's context (its watch was left registered until the context ended).
func TestConsumerTimeoutGetLetsGoOfItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.Arguments(warren.Table{"x-consumer-timeout": int32(10_000)}))
		publishN(t, b, q, 1)
		ctx := &watchedCtx{Context: t.Context()}
		_, err := q.Get(ctx)
		require.NoError(t, err)
		require.Equal(t, int32(1), ctx.live.Load(), "the Get's context is watched while it owns the delivery")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		require.Equal(t, [2]int{1, 0}, [2]int{q.Len(), q.Unacked()}, "back at 10 s")
		require.Zero(t, ctx.live.Load(), "and no longer watched")
	})
}

// watchedCtx counts the callbacks context.AfterFunc registered on it that are still live. It
// carries no values: so context.AfterFunc does not see through it to the context it wraps, and
// registers with its AfterFunc method.
type watchedCtx struct {
	context.Context
	live atomic.Int32
}

func (c *watchedCtx) Value(any) any { return nil }

func (c *watchedCtx) AfterFunc(f func()) func() bool {
	c.live.Add(1)
	stop := context.AfterFunc(c.Context, f)
	return func() bool {
		stopped := stop()
		if stopped {
			c.live.Add(-1)
		}
		return stopped
	}
}

// TestConsumerTimeoutAppliesToGet: the queue's "x-consumer-timeout" applies to Get deliveries
// too, as RabbitMQ (up to 4.2) applies it to basic.get: one held past it goes back to its place,
// redelivered, and settling it afterwards fails with ErrAlreadySettled; one settled in time, an
// auto-acked one, and one from a queue without the argument are left alone.
func TestConsumerTimeoutAppliesToGet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.Arguments(warren.Table{"x-consumer-timeout": int32(10_000)}))
		plain := declare(t, b, "plain")
		publishN(t, b, q, 4)
		publishN(t, b, plain, 1)
		held, err := q.Get(t.Context())
		require.NoError(t, err)
		inTime, err := q.Get(t.Context())
		require.NoError(t, err)
		_, err = q.Get(t.Context(), warren.AutoAck())
		require.NoError(t, err)
		other, err := plain.Get(t.Context())
		require.NoError(t, err)

		time.Sleep(9 * time.Second)
		require.NoError(t, inTime.Ack())
		time.Sleep(time.Second - time.Millisecond)
		synctest.Wait()
		require.Equal(t, 1, q.Unacked(), "not yet")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		require.Equal(t, [2]int{2, 0}, [2]int{q.Len(), q.Unacked()}, "back at 10 s")
		require.ErrorIs(t, held.Ack(), warren.ErrAlreadySettled)
		again, err := q.Get(t.Context())
		require.NoError(t, err)
		require.Equal(t, "0", string(again.Message.Body), "in its place")
		require.True(t, again.Redelivered)
		require.Equal(t, 1, again.DeliveryCount)
		require.NoError(t, again.Ack())

		time.Sleep(time.Hour)
		require.NoError(t, other.Ack(), "no consumer timeout on that queue")
	})
}

// TestAckTimeoutDeliveryLimit: each ack timeout counts as a return, so the delivery limit
// bounds a message that hangs every consumer.
func TestAckTimeoutDeliveryLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		main, dead := deadTopology(t, b, warren.DeliveryLimit(1))
		publishN(t, b, main, 1)
		for round := range 2 {
			c, err := main.Consume(t.Context(), warren.AckTimeout(10*time.Second))
			require.NoError(t, err)
			ds := receive(t, c, 1)
			require.Equal(t, round, ds[0].DeliveryCount)
			time.Sleep(10 * time.Second)
			synctest.Wait()
			assertStopped(t, c, warren.ErrAckTimeout)
		}
		require.Equal(t, 0, main.Len())
		ds := getAll(t, dead)
		require.Equal(t, "0", bodies(ds))
		require.Equal(t, "delivery_limit", xDeath(t, ds[0])[0]["reason"])
	})
}

// TestAckTimeoutAutoAckInvalid: an ack timeout needs manual acknowledgement.
func TestAckTimeoutAutoAckInvalid(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	_, err := q.Consume(t.Context(), warren.AutoAck(), warren.AckTimeout(time.Second))
	require.ErrorIs(t, err, warren.ErrInvalidArgument)
	require.Equal(t, 0, q.ConsumerCount())
}

// TestAckTimeoutSingleActiveTakeover: on a single-active-consumer queue the next consumer
// takes over when the active one times out, and receives in queue order.
func TestAckTimeoutSingleActiveTakeover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.SingleActiveConsumer())
		c1, err := q.Consume(t.Context(), warren.Prefetch(2), warren.AckTimeout(10*time.Second))
		require.NoError(t, err)
		c2, err := q.Consume(t.Context(), warren.Prefetch(10))
		require.NoError(t, err)
		publishN(t, b, q, 4)
		require.Equal(t, "0", picture(receive(t, c1, 1)))
		require.Equal(t, 0, len(c2.Deliveries()))
		time.Sleep(10 * time.Second)
		synctest.Wait()
		assertStopped(t, c1, warren.ErrAckTimeout)
		require.Equal(t, 1, q.ConsumerCount())
		got := buffered(t, c2)
		require.Equal(t, "0* 1 2 3", picture(got))
		require.Equal(t, []int{1, 0, 0, 0}, deliveryCounts(got))
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

// Prefetch(0) is unlimited: the consumer holds any number of deliveries unsettled, and takes
// messages as fast as the application receives them: its credit is room in its channel, of
// UnlimitedBuffer slots here. What it has no room for stays in the queue; a timer dispatches once the
// application made room by receiving, a settlement does at once. Stopped, what its channel
// buffers goes back unchanged; what it received stays (Cancel) or comes back redelivered (its
// context ends), each to its place.
func TestUnlimitedPrefetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 50)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		c, err := q.Consume(ctx, warren.Prefetch(0))
		require.NoError(t, err)
		require.Len(t, c.Deliveries(), warren.UnlimitedBuffer)
		require.Equal(t, 50-warren.UnlimitedBuffer, q.Len(), "what has no room stays in the queue")

		// Receiving without settling: more come, by the timer, however many are unsettled.
		var got []warren.Delivery
		for range 100 {
			got = append(got, buffered(t, c)...)
			time.Sleep(time.Millisecond)
			if len(got) >= 30 {
				break
			}
		}
		require.GreaterOrEqual(t, len(got), 30, "after 100 ms")
		require.Equal(t, "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19", bodies(got[:20]))
		require.Len(t, c.Deliveries(), warren.UnlimitedBuffer, "the last sleep let the timer fill it")
		require.Equal(t, len(got)+warren.UnlimitedBuffer, q.Unacked())
		// ... and while the application does not receive, nothing more leaves the queue.
		time.Sleep(time.Minute)
		require.Equal(t, 50-len(got)-warren.UnlimitedBuffer, q.Len())

		// A settlement dispatches at once into room made by receiving.
		more := buffered(t, c)
		require.Empty(t, c.Deliveries())
		require.NoError(t, more[0].Ack())
		require.Len(t, c.Deliveries(), warren.UnlimitedBuffer, "no time passed")
		got = append(got, more[1:]...)

		// AckUpTo(0) settles what was received, not what is buffered.
		require.NoError(t, c.AckUpTo(0))
		require.Equal(t, warren.UnlimitedBuffer, q.Unacked())
		received := len(got) + 1

		// Cancel: what is buffered goes back unchanged; one received stays, settle-able.
		d := receive(t, c, 1)[0]
		received++
		require.NoError(t, c.Cancel())
		require.Equal(t, 1, q.Unacked())
		require.NoError(t, d.Ack())
		assertStopped(t, c, warren.ErrCancelled)
		ds := getAll(t, q)
		require.Len(t, ds, 50-received)
		for _, d := range ds {
			require.False(t, d.Redelivered, "unreceived goes back unchanged")
		}
		require.Equal(t, strconv.Itoa(received), string(ds[0].Message.Body), "in queue order")

		// The end of its context: received come back redelivered, the rest unchanged, all in
		// their places.
		publishN(t, b, q, 30)
		ctx2, cancel2 := context.WithCancel(t.Context())
		c2, err := q.Consume(ctx2, warren.Prefetch(0))
		require.NoError(t, err)
		require.Equal(t, "0 1", bodies(receive(t, c2, 2)))
		cancel2()
		<-c2.Done()
		require.Equal(t, "0* 1* 2 3 4 5 6 7 8 9", picture(getAll(t, q)[:10]))
	})
}

// TestConsumers lists a queue's consumers in the order they started, with what each is and
// holds: active, waiting its turn on a single-active-consumer queue, and stopped while still
// holding a delivery; gone once it holds nothing; none after the queue is deleted.
func TestConsumers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		sac := declare(t, b, "sac", warren.SingleActiveConsumer())
		publishN(t, b, sac, 5)
		first, err := sac.Consume(t.Context(), warren.ConsumerTag("first"), warren.Prefetch(3),
			warren.AckTimeout(time.Minute))
		require.NoError(t, err)
		_, err = sac.Consume(t.Context(), warren.ConsumerTag("second"), warren.ConsumerPriority(2))
		require.NoError(t, err)
		got := receive(t, first, 3)

		cs := sac.Consumers()
		require.Len(t, cs, 2)
		require.Equal(t, warren.ConsumerInfo{Tag: "first", Status: "active", Prefetch: 3,
			AckTimeout: time.Minute, Unacked: 3}, cs[0])
		require.Equal(t, warren.ConsumerInfo{Tag: "second", Status: "waiting", Prefetch: warren.DefaultPrefetch,
			Priority: 2}, cs[1])

		// Cancelled with a delivery still received: stopped, holding it; the next is active.
		require.NoError(t, got[0].Ack())
		require.NoError(t, first.Cancel())
		synctest.Wait()
		cs = sac.Consumers()
		require.Len(t, cs, 2)
		require.Equal(t, "first", cs[0].Tag)
		require.Equal(t, "stopped", cs[0].Status)
		require.Equal(t, 2, cs[0].Unacked)
		require.Equal(t, "active", cs[1].Status)
		require.Equal(t, 2, cs[1].Unacked, "the two messages still ready, buffered for second")

		ackAll(t, got[1:])
		<-first.Done()
		cs = sac.Consumers()
		require.Len(t, cs, 1, "a stopped consumer holding nothing is gone")
		require.Equal(t, "second", cs[0].Tag)

		other := declare(t, b, "other")
		_, err = other.Consume(t.Context(), warren.ConsumerTag("auto"), warren.AutoAck(), warren.Exclusive())
		require.NoError(t, err)
		served := declare(t, b, "served")
		ctx, stop := context.WithCancel(t.Context())
		go func() { _ = served.Serve(ctx, func(context.Context, warren.Delivery) error { return nil }) }()
		synctest.Wait()
		cs = served.Consumers()
		require.Len(t, cs, 1)
		require.True(t, cs[0].Served)
		stop()
		synctest.Wait()
		sel, err := declare(t, b, "sel").Consume(t.Context(), warren.Prefetch(0),
			warren.Selector(func(*warren.Message) bool { return true }))
		require.NoError(t, err)
		cs = declare(t, b, "sel").Consumers()
		require.Equal(t, []warren.ConsumerInfo{{Tag: sel.Tag(), Status: "active", Selector: true}}, cs,
			"unlimited prefetch is 0")
		cs = other.Consumers()
		require.Len(t, cs, 1)
		require.True(t, cs[0].AutoAck)
		require.True(t, cs[0].Exclusive)

		deleteQueue(t, b, "sac")
		require.Empty(t, sac.Consumers(), "a deleted queue has no consumers")
	})
}

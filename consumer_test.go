package warren_test

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

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

func TestRoundRobinAmongConsumers(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	var cs []*warren.Consumer
	for range 3 {
		c, err := q.Consume(t.Context(), warren.Prefetch(10))
		require.NoError(t, err)
		cs = append(cs, c)
	}
	publishN(t, b, q, 9)
	require.Equal(t, "0 3 6", bodies(receive(t, cs[0], 3)))
	require.Equal(t, "1 4 7", bodies(receive(t, cs[1], 3)))
	require.Equal(t, "2 5 8", bodies(receive(t, cs[2], 3)))
}

func TestRoundRobinSkipsConsumersWithoutCredit(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	full, err := q.Consume(t.Context(), warren.Prefetch(1))
	require.NoError(t, err)
	free, err := q.Consume(t.Context(), warren.Prefetch(10))
	require.NoError(t, err)
	publishN(t, b, q, 4)
	require.Equal(t, "0", bodies(receive(t, full, 1)))
	require.Equal(t, "1 2 3", bodies(receive(t, free, 3)))
}

func TestDeliveryFields(t *testing.T) {
	b := newBroker(t)
	_, err := b.DeclareExchange("fan", warren.ExchangeFanout)
	require.NoError(t, err)
	q1, q2 := declare(t, b, "q1"), declare(t, b, "q2")
	require.NoError(t, b.Bind("q1", "fan", "", nil))
	require.NoError(t, b.Bind("q2", "fan", "", nil))
	body := []byte("shared")
	msg := warren.Message{Body: body, ContentType: "text/plain", MessageID: "m-1", Headers: warren.Table{"h": int32(1)}}
	require.NoError(t, b.Publish(t.Context(), "fan", "rk", msg))

	c, err := q1.Consume(t.Context(), warren.ConsumerTag("ctag"))
	require.NoError(t, err)
	d1 := receive(t, c, 1)[0]
	d2, err := q2.Get(t.Context())
	require.NoError(t, err)

	require.Equal(t, "fan", d1.Exchange)
	require.Equal(t, "rk", d1.RoutingKey)
	require.Equal(t, "ctag", d1.ConsumerTag)
	require.Equal(t, uint64(1), d1.DeliveryTag)
	require.False(t, d1.Redelivered)
	require.Equal(t, 0, d1.DeliveryCount)
	require.Equal(t, msg.ContentType, d1.Message.ContentType)
	require.Equal(t, msg.MessageID, d1.Message.MessageID)
	require.Same(t, d1.Message, d2.Message, "one message shared by every queue it reached")
	require.Same(t, &body[0], &d1.Message.Body[0], "the body is not copied")
	require.Empty(t, d2.ConsumerTag)
	require.Equal(t, uint64(1), d2.DeliveryTag)
}

func TestDeliveryTagsGrowPerConsumer(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	c, err := q.Consume(t.Context(), warren.Prefetch(3))
	require.NoError(t, err)
	publishN(t, b, q, 2)
	ds := receive(t, c, 2)
	require.NoError(t, ds[0].Nack()) // redelivered with a fresh tag
	again := receive(t, c, 1)[0]
	require.Equal(t, []uint64{1, 2, 3}, []uint64{ds[0].DeliveryTag, ds[1].DeliveryTag, again.DeliveryTag})
	require.Equal(t, "0", string(again.Message.Body))
	require.True(t, again.Redelivered)
	require.Equal(t, 1, again.DeliveryCount)
}

func TestGetReportsMessageCountAndOwnsDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 3)
		ctx, cancel := context.WithCancel(t.Context())
		d, err := q.Get(ctx)
		require.NoError(t, err)
		require.Equal(t, "0", string(d.Message.Body))
		require.Equal(t, 2, d.MessageCount, "ready messages left after this one")
		require.Equal(t, 1, q.Unacked())

		cancel() // the Get's owner ends: the delivery goes back, redelivered
		synctest.Wait()
		require.ErrorIs(t, d.Ack(), warren.ErrAlreadySettled)
		require.Equal(t, 0, q.Unacked())
		require.Equal(t, "0* 1 2", drain(t, q))

		_, err = q.Get(t.Context())
		require.ErrorIs(t, err, warren.ErrEmpty)
	})
}

func TestRejectDropsTheMessage(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	publishN(t, b, q, 2)
	d, err := q.Get(t.Context())
	require.NoError(t, err)
	require.NoError(t, d.Reject())
	require.Equal(t, 1, q.Len())
	require.Equal(t, 0, q.Unacked())
	require.Equal(t, "1", drain(t, q))
}

func TestPurgeRemovesOnlyReadyMessages(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	publishN(t, b, q, 4)
	d, err := q.Get(t.Context())
	require.NoError(t, err)
	n, err := b.Purge("q")
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, 0, q.Len())
	require.NoError(t, d.Nack(), "an unacked delivery survives a purge and can come back")
	require.Equal(t, "0*", drain(t, q))
}

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

func TestAutoAckGet(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	publishN(t, b, q, 1)
	d, err := q.Get(t.Context(), warren.AutoAck())
	require.NoError(t, err)
	require.Equal(t, 0, q.Unacked())
	require.Equal(t, 0, q.Len())
	require.ErrorIs(t, d.Nack(), warren.ErrUnknownDelivery)
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

func TestAutoDeleteQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "tmp", warren.AutoDelete())
		publishN(t, b, q, 1)
		d, err := q.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, d.Ack())
		_, err = b.Queue("tmp")
		require.NoError(t, err, "a queue that never had a consumer is not auto-deleted")

		c1, err := q.Consume(t.Context())
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		c2, err := q.Consume(ctx)
		require.NoError(t, err)
		require.NoError(t, c1.Cancel())
		_, err = b.Queue("tmp")
		require.NoError(t, err, "one consumer left")
		cancel()
		<-c2.Done()
		synctest.Wait()
		_, err = b.Queue("tmp")
		require.ErrorIs(t, err, warren.ErrNotFound, "deleted with its last consumer")
		_, err = q.Get(t.Context())
		require.ErrorIs(t, err, warren.ErrNotFound)
	})
}

// TestSettleAfterQueueDeleted: RabbitMQ accepts an ack, nack or reject of a delivery whose queue
// was deleted, as a no-op; so does warren, once per delivery, for consumer and Get deliveries and
// for the UpTo forms, while the consumer's Err says why it ended. Once the broker has closed,
// settling fails with ErrClosed.
func TestSettleAfterQueueDeleted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 5)
		c, err := q.Consume(t.Context(), warren.Prefetch(3))
		require.NoError(t, err)
		ds := receive(t, c, 3)
		g, err := q.Get(t.Context())
		require.NoError(t, err)
		require.Equal(t, 1, deleteQueue(t, b, "q"), "one message was still ready")

		require.NoError(t, ds[0].Ack(), "the handler did its work: no failure")
		require.ErrorIs(t, ds[0].Ack(), warren.ErrAlreadySettled, "but only once")
		require.NoError(t, ds[1].Reject())
		require.NoError(t, c.NackUpTo(ds[2].DeliveryTag))
		require.ErrorIs(t, ds[2].Nack(), warren.ErrAlreadySettled)
		require.NoError(t, g.NackWithDelay(time.Minute))
		require.ErrorIs(t, c.Err(), warren.ErrQueueDeleted)
		st := q.Stats()
		require.Equal(t, uint64(0), st.Acked+st.Nacked+st.Rejected, "nothing was settled in a queue that is gone")

		q2 := declare(t, b, "q2")
		publishN(t, b, q2, 1)
		d, err := q2.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, b.Close())
		require.ErrorIs(t, d.Ack(), warren.ErrClosed)
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

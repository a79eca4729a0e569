package warren_test

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of queues (queue.go): Get, Purge and Browse, and auto-delete queues, which go when their
// last consumer does.

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

// Browse yields the ready messages in delivery order without consuming them — returned ones in
// their places, priorities honoured, outstanding and expired ones left out — and stops when told.
func TestQueueBrowse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.MaxPriority(2))
		for i, p := range []uint8{0, 0, 2, 0} {
			m := warren.Message{Body: []byte{'0' + byte(i)}, Priority: p}
			if i == 3 {
				m.Expiration = "1000"
			}
			require.NoError(t, b.Publish(t.Context(), "", "q", m))
		}
		d, err := q.Get(t.Context()) // "2", the highest priority
		require.NoError(t, err)
		held, err := q.Get(t.Context()) // "0"
		require.NoError(t, err)
		require.NoError(t, d.Nack())
		browse := func() string {
			var s []byte
			for m := range q.Browse() {
				s = append(s, m.Body...)
			}
			return string(s)
		}
		require.Equal(t, "213", browse(), "\"0\" is outstanding; \"2\" is back in its place")
		require.Equal(t, 3, q.Len(), "browsing consumes nothing")
		var first []string
		for m := range q.Browse() {
			first = append(first, string(m.Body))
			break
		}
		require.Equal(t, []string{"2"}, first)
		time.Sleep(time.Second)
		require.Equal(t, "21", browse(), "the expired message is not shown")
		require.NoError(t, held.Nack())
		require.Equal(t, "201", browse())
		deleteQueue(t, b, "q")
		require.Empty(t, slices.Collect(q.Browse()), "a deleted queue yields nothing")
	})
}

// ---------------------------------------------------------------------------------------------
// Auto-delete queues (R6.11).

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

// TestAutoDeleteNeedsAConsumerFirst: a queue that never had a consumer is not auto-deleted,
// however it is used.
func TestAutoDeleteNeedsAConsumerFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "tmp", warren.AutoDelete())
		publishN(t, b, q, 2)
		d, err := q.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, d.Ack())
		_, err = q.Purge()
		require.NoError(t, err)
		time.Sleep(time.Hour)
		synctest.Wait()
		require.True(t, queueExists(t, b, "tmp"))
	})
}

// TestAutoDeleteOnLastCancel: an auto-delete queue stays while a consumer remains and goes
// when the last one cancels.
func TestAutoDeleteOnLastCancel(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "tmp", warren.AutoDelete())
	c1, err := q.Consume(t.Context())
	require.NoError(t, err)
	c2, err := q.Consume(t.Context())
	require.NoError(t, err)
	require.NoError(t, c1.Cancel())
	require.True(t, queueExists(t, b, "tmp"), "a consumer remains")
	publishN(t, b, q, 1)
	require.Equal(t, "0", bodies(buffered(t, c2)))
	require.NoError(t, c2.Cancel())
	require.False(t, queueExists(t, b, "tmp"), "deleted when its last consumer cancels")
	_, err = q.Get(t.Context())
	require.ErrorIs(t, err, warren.ErrNotFound)
}

// TestAutoDeleteOnLastContextEnd: an auto-delete queue goes when its last consumer's context
// ends.
func TestAutoDeleteOnLastContextEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "tmp", warren.AutoDelete())
		ctx1, cancel1 := context.WithCancel(t.Context())
		defer cancel1()
		ctx2, cancel2 := context.WithCancel(t.Context())
		defer cancel2()
		_, err := q.Consume(ctx1)
		require.NoError(t, err)
		c2, err := q.Consume(ctx2)
		require.NoError(t, err)
		cancel1()
		synctest.Wait()
		require.True(t, queueExists(t, b, "tmp"), "a consumer remains")
		require.Equal(t, 1, q.ConsumerCount())
		cancel2()
		synctest.Wait()
		require.True(t, isClosed(c2.Done()))
		require.False(t, queueExists(t, b, "tmp"))
	})
}

// TestAutoDeleteSingleActiveWaiting: on a single-active-consumer auto-delete queue, a waiting
// consumer keeps the queue when the active one goes.
func TestAutoDeleteSingleActiveWaiting(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "tmp", warren.AutoDelete(), warren.SingleActiveConsumer())
	c1, err := q.Consume(t.Context())
	require.NoError(t, err)
	c2, err := q.Consume(t.Context())
	require.NoError(t, err)
	require.NoError(t, c1.Cancel())
	require.True(t, queueExists(t, b, "tmp"))
	publishN(t, b, q, 1)
	require.Equal(t, "0", bodies(buffered(t, c2)))
	require.NoError(t, c2.Cancel())
	require.False(t, queueExists(t, b, "tmp"))
}

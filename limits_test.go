package warren_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// TestDropHead: max-length 3, drop-head with a DLX: the DLQ gets the oldest first, reason maxlen
// (R5.2, R4.9).
func TestDropHead(t *testing.T) {
	b := newBroker(t)
	main, dead := deadTopology(t, b, warren.MaxLength(3))
	publishN(t, b, main, 5)
	require.Equal(t, 3, main.Len())
	ds := getAll(t, dead)
	require.Equal(t, "0 1", bodies(ds))
	for _, d := range ds {
		require.Equal(t, "maxlen", xDeath(t, d)[0]["reason"])
	}
	require.Equal(t, "2 3 4", bodies(getAll(t, main)))
}

// TestDropHeadAfterRequeue: the length check also runs after a requeue, and the requeued
// message, being at the head, is the one dropped (R5.2).
func TestDropHeadAfterRequeue(t *testing.T) {
	b := newBroker(t)
	main, dead := deadTopology(t, b, warren.MaxLength(2))
	publishN(t, b, main, 2)
	d, err := main.Get(t.Context()) // 0 out: 1 ready
	require.NoError(t, err)
	require.NoError(t, b.Publish(t.Context(), "", "main", warren.Message{Body: []byte("2")})) // 1 2 ready: at the limit
	require.NoError(t, d.Nack())
	require.Equal(t, "0", bodies(getAll(t, dead)), "the requeued head is dropped")
	require.Equal(t, "1 2", bodies(getAll(t, main)))
}

// TestMaxLengthCountsReadyOnly: unacknowledged messages do not count (R5.1).
func TestMaxLengthCountsReadyOnly(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q", warren.MaxLength(1), warren.Overflow(warren.RejectPublish))
	c, err := q.Consume(t.Context(), warren.Prefetch(5))
	require.NoError(t, err)
	publishN(t, b, q, 5)
	require.Equal(t, 5, q.Unacked(), "a consumer with credit takes them all")
	require.Equal(t, 5, len(c.Deliveries()))
}

// TestRejectPublish: a full reject-publish queue refuses the message with ErrQueueFull and is
// left unchanged; other queues the message routed to still take it (R5.3).
func TestRejectPublish(t *testing.T) {
	b := newBroker(t)
	_, err := b.DeclareExchange("fan", warren.ExchangeFanout)
	require.NoError(t, err)
	full := declare(t, b, "full", warren.MaxLength(3), warren.Overflow(warren.RejectPublish))
	other := declare(t, b, "other")
	require.NoError(t, b.Bind("full", "fan", "", nil))
	require.NoError(t, b.Bind("other", "fan", "", nil))
	for i := range 3 {
		require.NoError(t, b.Publish(t.Context(), "fan", "", warren.Message{Body: fmt.Append(nil, i)}))
	}
	err = b.Publish(t.Context(), "fan", "", warren.Message{Body: []byte("3")})
	require.ErrorIs(t, err, warren.ErrQueueFull)
	require.Equal(t, "0 1 2", bodies(getAll(t, full)), "unchanged")
	require.Equal(t, "0 1 2 3", bodies(getAll(t, other)), "the other queue took it")
	require.NoError(t, b.Publish(t.Context(), "fan", "", warren.Message{Body: []byte("4")}), "room again")
}

// TestRejectPublishDLX: the refused message is also dead-lettered, reason maxlen (R5.3).
func TestRejectPublishDLX(t *testing.T) {
	b := newBroker(t)
	main, dead := deadTopology(t, b, warren.MaxLength(1), warren.Overflow(warren.RejectPublishDLX))
	publishN(t, b, main, 1)
	err := b.Publish(t.Context(), "", "main", warren.Message{Body: []byte("refused")})
	require.ErrorIs(t, err, warren.ErrQueueFull)
	ds := getAll(t, dead)
	require.Equal(t, "refused", bodies(ds))
	require.Equal(t, "maxlen", xDeath(t, ds[0])[0]["reason"])
	require.Equal(t, "0", bodies(getAll(t, main)))
}

// TestMaxLengthBytes counts body bytes of ready messages; a body larger than the limit is
// enqueued and dropped at once with everything ahead of it (R5.1, R5.2).
func TestMaxLengthBytes(t *testing.T) {
	b := newBroker(t)
	main, dead := deadTopology(t, b, warren.MaxLengthBytes(10))
	for _, body := range []string{"aaaa", "bbbb", "cc"} { // 10 bytes: at the limit
		require.NoError(t, b.Publish(t.Context(), "", "main", warren.Message{Body: []byte(body)}))
	}
	require.Equal(t, 0, dead.Len())
	require.NoError(t, b.Publish(t.Context(), "", "main", warren.Message{Body: []byte("d")}))
	require.Equal(t, "aaaa", bodies(getAll(t, dead)))
	require.NoError(t, b.Publish(t.Context(), "", "main", warren.Message{Body: []byte("0123456789X")}))
	require.Equal(t, "bbbb cc d 0123456789X", bodies(getAll(t, dead)))
	require.Equal(t, 0, main.Len())
}

// TestMaxLengthZero: drop-head with max-length 0 delivers to a consumer that can take the
// message at once, and drops it otherwise (R5.4).
func TestMaxLengthZero(t *testing.T) {
	b := newBroker(t)
	main, dead := deadTopology(t, b, warren.MaxLength(0))
	publishN(t, b, main, 1)
	require.Equal(t, "0", bodies(getAll(t, dead)))
	c, err := main.Consume(t.Context(), warren.Prefetch(1))
	require.NoError(t, err)
	publishN(t, b, main, 2)
	require.Equal(t, "0", bodies(receive(t, c, 1)))
	require.Equal(t, "1", bodies(getAll(t, dead)))
}

// TestBlock: with the Block policy a full queue makes Publish wait until a consumer makes room
// (here by acking, which frees credit for the next message), or until its context ends.
func TestBlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.MaxLength(2), warren.Overflow(warren.Block))
		c, err := q.Consume(t.Context(), warren.Prefetch(1))
		require.NoError(t, err)
		publishN(t, b, q, 3) // 0 to the consumer, 1 2 ready: full
		published := make(chan error, 1)
		go func() { published <- b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("3")}) }()
		synctest.Wait()
		select {
		case err := <-published:
			t.Fatalf("Publish returned %v on a full Block queue", err)
		default:
		}
		d := receive(t, c, 1)[0]
		require.NoError(t, d.Ack()) // 1 goes to the consumer: room
		require.NoError(t, <-published)
		require.Equal(t, 2, q.Len())

		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start := time.Now()
		err = b.Publish(ctx, "", "q", warren.Message{Body: []byte("4")})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, time.Second, time.Since(start))
		require.Equal(t, 2, q.Len(), "nothing enqueued")
	})
}

// TestBlockedPublisherSeesDeletion: deleting a queue wakes its blocked publishers.
func TestBlockedPublisherSeesDeletion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.MaxLength(1), warren.Overflow(warren.Block))
		publishN(t, b, q, 1)
		published := make(chan error, 1)
		go func() {
			published <- b.Publish(t.Context(), "", "q", warren.Message{}, warren.Mandatory())
		}()
		synctest.Wait()
		deleteQueue(t, b, "q")
		require.ErrorIs(t, <-published, warren.ErrUnroutable, "the queue it waited for is gone")
	})
}

// TestDeliveryLimit: with limit 2 a message is delivered at most 3 times; its third return
// dead-letters it with reason delivery_limit (R1.10: the count after the return must exceed the
// limit). Every return counts: nack, context end.
func TestDeliveryLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		main, dead := deadTopology(t, b, warren.DeliveryLimit(2))
		publishN(t, b, main, 1)

		d, err := main.Get(t.Context())
		require.NoError(t, err)
		require.Equal(t, 0, d.DeliveryCount)
		require.NoError(t, d.Nack()) // return 1

		ctx, cancel := context.WithCancel(t.Context())
		d, err = main.Get(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, d.DeliveryCount)
		cancel() // return 2
		synctest.Wait()

		d, err = main.Get(t.Context())
		require.NoError(t, err)
		require.Equal(t, 2, d.DeliveryCount)
		require.NoError(t, d.Nack()) // return 3: over the limit
		require.Equal(t, 0, main.Len())
		ds := getAll(t, dead)
		require.Equal(t, "0", bodies(ds))
		require.Equal(t, "delivery_limit", xDeath(t, ds[0])[0]["reason"])
	})
}

// TestQueueExpires: a queue unused for its expiry is deleted with its messages, which are not
// dead-lettered; publishing is not a use; a Get, a declaration and a consumer are (R3.8).
func TestQueueExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		_, dead := deadTopology(t, b)
		q := declare(t, b, "tmp", warren.Expires(10*time.Second), warren.DeadLetter("e-dead", ""))
		for range 3 {
			time.Sleep(9 * time.Second)
			publishN(t, b, q, 1) // not a use
		}
		synctest.Wait()
		_, err := b.Queue("tmp")
		require.ErrorIs(t, err, warren.ErrNotFound, "expired 10 s after its declaration")
		require.Equal(t, 0, dead.Len(), "an expired queue's messages are not dead-lettered")

		q = declare(t, b, "tmp", warren.Expires(10*time.Second))
		time.Sleep(9 * time.Second)
		_, err = q.Get(t.Context())
		require.ErrorIs(t, err, warren.ErrEmpty) // a use
		time.Sleep(9 * time.Second)
		_, err = b.DeclareQueue("tmp", warren.Expires(10*time.Second)) // a use
		require.NoError(t, err)
		time.Sleep(9 * time.Second)
		c, err := q.Consume(t.Context())
		require.NoError(t, err)
		time.Sleep(time.Hour) // a queue with a consumer does not expire
		synctest.Wait()
		_, err = b.Queue("tmp") // a use too
		require.NoError(t, err)
		require.NoError(t, c.Cancel()) // the clock restarts when the last consumer goes
		time.Sleep(9 * time.Second)
		synctest.Wait()
		_, err = b.Queue("tmp")
		require.NoError(t, err)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		_, err = b.Queue("tmp")
		require.ErrorIs(t, err, warren.ErrNotFound)
	})
}

func TestLimitArguments(t *testing.T) {
	b := newBroker(t)
	bad := []warren.Table{
		{"x-max-length": int64(-1)}, {"x-max-length": "3"}, {"x-max-length-bytes": 1.5},
		{"x-overflow": "drop-tail"}, {"x-overflow": 1}, {"x-delivery-limit": int64(-2)},
		{"x-expires": int64(0)}, {"x-expires": int64(-5)}, {"x-expires": int64(1 << 32)},
	}
	for _, args := range bad {
		_, err := b.DeclareQueue("q", warren.Arguments(args))
		require.ErrorIs(t, err, warren.ErrPreconditionFailed, "%v", args)
	}
	for _, opt := range []warren.QueueOption{warren.MaxLength(-1), warren.MaxLengthBytes(-1), warren.DeliveryLimit(-1)} {
		_, err := b.DeclareQueue("q", opt)
		require.ErrorIs(t, err, warren.ErrInvalidArgument)
	}
	q, err := b.DeclareQueue("q", warren.MaxLength(3), warren.Overflow(warren.RejectPublish))
	require.NoError(t, err)
	same, err := b.DeclareQueue("q", warren.Arguments(warren.Table{"x-max-length": int16(3), "x-overflow": "reject-publish"}))
	require.NoError(t, err)
	require.Same(t, q, same)
	_, err = b.DeclareQueue("q", warren.MaxLength(4), warren.Overflow(warren.RejectPublish))
	require.ErrorIs(t, err, warren.ErrPreconditionFailed)
	_, err = b.DeclareQueue("d", warren.Arguments(warren.Table{"x-delivery-limit": int64(-1)}))
	require.NoError(t, err, "-1 means no limit, as in RabbitMQ 4")
}

// TestDeadLetterIntoFullBlockQueue: a dead letter never waits for room: into a full Block queue
// it is dropped, and the Reject that caused it returns.
func TestDeadLetterIntoFullBlockQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		_, err := b.DeclareExchange("e-dead", warren.ExchangeFanout)
		require.NoError(t, err)
		dead := declare(t, b, "dead", warren.MaxLength(1), warren.Overflow(warren.Block))
		require.NoError(t, b.Bind("dead", "e-dead", "", nil))
		main := declare(t, b, "main", warren.DeadLetter("e-dead", ""))
		publishN(t, b, dead, 1)
		publishN(t, b, main, 2)
		for range 2 {
			d, err := main.Get(t.Context())
			require.NoError(t, err)
			require.NoError(t, d.Reject())
		}
		require.Equal(t, 1, dead.Len())
		require.Equal(t, 0, main.Len())
	})
}

// TestBlockRefusesBodyOverByteLimit: a body larger than a Block queue's byte limit can never
// fit, so it is refused at once (ErrQueueFull) rather than waiting for the publisher's context.
func TestBlockRefusesBodyOverByteLimit(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q", warren.MaxLengthBytes(4), warren.Overflow(warren.Block))
	err := b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("12345")})
	require.ErrorIs(t, err, warren.ErrQueueFull)
	require.Zero(t, q.Len())
	require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("1234")}), "one that fits")
}

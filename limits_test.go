package warren_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of length limits (x-max-length, x-max-length-bytes; queue.go) and the overflow policies
// drop-head, reject-publish, reject-publish-dlx and block.

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

// TestWhileBlocked: a publish told of its waits hears true as it starts waiting for room and
// false as it stops, whether it got room or its context ended; a publish that does not wait
// hears nothing.
func TestWhileBlocked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.MaxLength(1), warren.Overflow(warren.Block))
		var told []bool
		tell := warren.WhileBlocked(func(blocked bool) { told = append(told, blocked) })
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("0")}, tell))
		require.Empty(t, told, "room at once: no wait")

		published := make(chan error, 1)
		go func() { published <- b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("1")}, tell) }()
		synctest.Wait()
		require.Equal(t, []bool{true}, told, "waiting")
		d, err := q.Get(t.Context(), warren.AutoAck())
		require.NoError(t, err)
		require.Equal(t, "0", string(d.Message.Body))
		require.NoError(t, <-published)
		require.Equal(t, []bool{true, false}, told, "room")

		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		require.ErrorIs(t, b.Publish(ctx, "", "q", warren.Message{Body: []byte("2")}, tell), context.DeadlineExceeded)
		require.Equal(t, []bool{true, false, true, false}, told, "waited until its ctx ended")
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

// TestBlockPublishWaitsForBytes: a publisher waiting for room in a Block queue that is full by
// its byte limit (MaxLengthBytes) but not by its length waits, and goes in once its body fits.
// Found by FuzzQueueArguments: Queue.unlock woke the first blocked publisher whenever there was
// room for an empty message, so the publisher's own unlock woke it at once, it found no room for
// its body and waited again, allocating a channel each time, until its context ended — burning a
// core meanwhile, forever with a context that never ends, and in a synctest bubble stopping
// virtual time. Here a 2-byte message waits for 20 ms of real time behind 3 ready bytes of a
// 4-byte queue: it must return the context's error having allocated next to nothing (a spinning
// publisher allocates hundreds of thousands of channels); then, in virtual time, one waits until
// the 3 bytes are taken, and goes in.
func TestBlockPublishWaitsForBytes(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q", warren.MaxLengthBytes(4), warren.Overflow(warren.Block))
	require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("abc")}))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := b.Publish(ctx, "", "q", warren.Message{Body: []byte("xy")})
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, 1, q.Len())
	require.Less(t, after.Mallocs-before.Mallocs, uint64(10_000), "allocations while one publisher waited 20 ms for room")

	synctest.Test(t, func(t *testing.T) {
		b := warren.New()
		defer b.Close()
		q := declare(t, b, "q", warren.MaxLengthBytes(4), warren.Overflow(warren.Block))
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("abc")}))
		published := make(chan error, 1)
		go func() { published <- b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("xy")}) }()
		time.Sleep(time.Hour)
		synctest.Wait()
		require.Empty(t, published, "a publisher went in without room")
		d, err := q.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, d.Ack())
		synctest.Wait()
		require.NoError(t, <-published)
		require.Equal(t, 1, q.Len())
	})
}

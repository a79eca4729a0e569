package warren_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of priority queues (MaxPriority, x-max-priority; the ready set in queue.go and its scan
// in dispatch.go): delivery by priority and FIFO within a level, returns to their places in
// their levels, drop-head and TTLs on a priority queue, and selectors over the levels. The
// argument's validation is in arguments_test.go, consumer priorities in dispatch_test.go.

// msgWithPriority is a message with a priority.
func msgWithPriority(s string, p uint8) warren.Message {
	return warren.Message{Body: []byte(s), Priority: p}
}

// TestPriorityQueueOrder: with max priority 5, priorities [none,0,5,10,none] come out as
// 5, 10, none, 0, none (R7.2).
func TestPriorityQueueOrder(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "pq", warren.MaxPriority(5))
	for _, m := range []warren.Message{msg("none1"), msgWithPriority("p0", 0), msgWithPriority("p5", 5), msgWithPriority("p10", 10), msg("none2")} {
		publishMsg(t, b, q.Name(), m)
	}
	require.Equal(t, 5, q.Len())
	require.Equal(t, "p5 p10 none1 p0 none2", bodies(getAll(t, q)))
}

// TestPriorityQueueFIFOWithinLevel: messages of one priority keep their order, for Get and
// for a consumer.
func TestPriorityQueueFIFOWithinLevel(t *testing.T) {
	b := newBroker(t)
	prios := []uint8{1, 3, 1, 3, 2, 1, 0, 2}
	const want = "1 3 4 7 0 2 5 6"
	q := declare(t, b, "pq", warren.MaxPriority(3))
	for i, p := range prios {
		publishMsg(t, b, q.Name(), msgWithPriority(strconv.Itoa(i), p))
	}
	require.Equal(t, want, bodies(getAll(t, q)))

	for i, p := range prios {
		publishMsg(t, b, q.Name(), msgWithPriority(strconv.Itoa(i), p))
	}
	c, err := q.Consume(t.Context(), warren.Prefetch(1))
	require.NoError(t, err)
	var got []warren.Delivery
	for range prios {
		ds := receive(t, c, 1)
		got = append(got, ds...)
		require.NoError(t, ds[0].Ack())
	}
	require.Equal(t, want, bodies(got))
}

// TestPriorityQueueNackKeepsPosition: a nacked message goes back to its original position
// within its level: ahead of later messages of its level, behind higher levels.
func TestPriorityQueueNackKeepsPosition(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "pq", warren.MaxPriority(5))
	for _, m := range []warren.Message{msgWithPriority("a", 3), msgWithPriority("b", 1), msgWithPriority("c", 3), msgWithPriority("d", 1)} {
		publishMsg(t, b, q.Name(), m)
	}
	var got []warren.Delivery
	for range 3 {
		d, err := q.Get(t.Context())
		require.NoError(t, err)
		got = append(got, d)
	}
	require.Equal(t, "a c b", bodies(got))
	require.NoError(t, got[2].Nack()) // b
	require.NoError(t, got[1].Nack()) // c
	require.NoError(t, got[0].Nack()) // a
	publishMsg(t, b, q.Name(), msgWithPriority("e", 3))
	publishMsg(t, b, q.Name(), msgWithPriority("f", 1))
	require.Equal(t, "a* c* e b* d f", picture(getAll(t, q)))
}

// TestPriorityQueueContextEndKeepsOrder: what a consumer held comes back, when its context
// ends, to its places in its levels.
func TestPriorityQueueContextEndKeepsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "pq", warren.MaxPriority(5))
		for i, p := range []uint8{0, 2, 1, 2, 0} {
			publishMsg(t, b, q.Name(), msgWithPriority(strconv.Itoa(i), p))
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		c, err := q.Consume(ctx, warren.Prefetch(3))
		require.NoError(t, err)
		require.Equal(t, "1 3 2", bodies(receive(t, c, 3)), "highest first")
		publishMsg(t, b, q.Name(), msgWithPriority("5", 2))
		publishMsg(t, b, q.Name(), msgWithPriority("6", 1))
		cancel()
		synctest.Wait()
		require.Equal(t, "1* 3* 5 2* 6 0 4", drain(t, q))
	})
}

// TestPriorityQueueDropHead: drop-head drops the head of a priority queue, which is its
// highest-priority message (R5.2, R7.3).
func TestPriorityQueueDropHead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		main, dead := deadTopology(t, b, warren.MaxPriority(5), warren.MaxLength(2))
		publishMsg(t, b, main.Name(), msgWithPriority("a", 1))
		publishMsg(t, b, main.Name(), msgWithPriority("b", 5))
		publishMsg(t, b, main.Name(), msgWithPriority("c", 3))
		synctest.Wait()
		ds := getAll(t, dead)
		require.Equal(t, "b", bodies(ds), "the highest-priority head is dropped")
		require.Equal(t, "maxlen", xDeath(t, ds[0])[0]["reason"])
		publishMsg(t, b, main.Name(), msgWithPriority("d", 0))
		synctest.Wait()
		require.Equal(t, "c", bodies(getAll(t, dead)))
		require.Equal(t, "a d", bodies(getAll(t, main)))
	})
}

// TestPriorityQueueTTL: messages of a priority queue expire at their deadlines, whatever
// their level, and are dead-lettered "expired".
func TestPriorityQueueTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		main, dead := deadTopology(t, b, warren.MaxPriority(5))
		publishMsg(t, b, main.Name(), warren.Message{Body: []byte("low"), Priority: 1, Expiration: "1000"})
		publishMsg(t, b, main.Name(), warren.Message{Body: []byte("high"), Priority: 5})
		publishMsg(t, b, main.Name(), warren.Message{Body: []byte("mid"), Priority: 3, Expiration: "2000"})
		publishMsg(t, b, main.Name(), warren.Message{Body: []byte("high2"), Priority: 5, Expiration: "5000"})
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		require.Equal(t, 3, main.Len())
		ds := getAll(t, dead)
		require.Equal(t, "low", bodies(ds))
		require.Equal(t, "expired", xDeath(t, ds[0])[0]["reason"])
		time.Sleep(time.Second)
		synctest.Wait()
		require.Equal(t, "mid", bodies(getAll(t, dead)))
		require.Equal(t, "high high2", bodies(getAll(t, main)))
	})
}

// TestPriorityIgnoredWithoutMaxPriority: without a maximum priority (or with maximum 0) a
// queue ignores message priorities.
func TestPriorityIgnoredWithoutMaxPriority(t *testing.T) {
	b := newBroker(t)
	for _, q := range []*warren.Queue{
		declare(t, b, "plain"),
		declare(t, b, "zero", warren.Arguments(warren.Table{"x-max-priority": int32(0)})),
	} {
		for i, p := range []uint8{0, 9, 5, 255, 1} {
			publishMsg(t, b, q.Name(), msgWithPriority(strconv.Itoa(i), p))
		}
		require.Equal(t, "0 1 2 3 4", bodies(getAll(t, q)), q.Name())
	}
}

// ---------------------------------------------------------------------------------------------
// Selectors on a priority queue.

// TestSelectorOnPriorityQueue: a selective consumer of a priority queue receives the
// highest-priority message it accepts, also one that arrived ahead of its cursor.
func TestSelectorOnPriorityQueue(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "pq", warren.MaxPriority(5))
	send := func(body, kind string, p uint8) {
		t.Helper()
		publishMsg(t, b, q.Name(), warren.Message{Body: []byte(body), Priority: p, Headers: warren.Table{"kind": kind}})
	}
	send("0", "b", 5)
	s, err := q.Consume(t.Context(), warren.Prefetch(1), kindIs("a"))
	require.NoError(t, err)
	send("1", "a", 1)
	send("2", "a", 1)
	send("3", "a", 5) // ahead of the cursor, which is past 1
	send("4", "a", 3)
	// Each ack gives s credit for one more: it must take the highest-priority "a" each time.
	var got []warren.Delivery
	for range 4 {
		ds := buffered(t, s)
		if len(ds) == 0 {
			break
		}
		got = append(got, ds...)
		ackAll(t, ds)
	}
	left := bodies(getAll(t, q))
	require.Equal(t, "1 3 4 2", bodies(got), "left ready: %q", left)
	require.Equal(t, "0", left)
}

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

// TestSelectorSeesFreshTopPriority: on a priority queue, a consumer with a selector that has
// looked at a ready message of a lower priority receives a message it accepts published
// afterwards at the top priority. (A regression test, found by TestModel: with one cursor per
// consumer, the cursor was then past the top level's keys, and readySet.push lowered
// readySet.floor, which moves cursors back, only for a fresh message of rank 1 and up, not for
// rank 0, whose key is its bare sequence id; "x" stayed ready although the consumer had credit,
// and beside other consumers it went to the wrong one.)
func TestSelectorSeesFreshTopPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.MaxPriority(1))
		pub := func(body string, p uint8) {
			t.Helper()
			require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte(body), Priority: p}))
		}
		pub("a", 0) // rank 1: the selector rejects it, and its cursor moves past rank 0
		c, err := q.Consume(t.Context(), warren.Selector(func(m *warren.Message) bool { return string(m.Body) == "x" }))
		require.NoError(t, err)
		pub("x", 1) // rank 0, ahead of "a"
		require.Equal(t, 1, len(c.Deliveries()), "the consumer accepts x and has credit; Len %d", q.Len())
		require.Equal(t, "x", picture(receive(t, c, 1)))
		require.Equal(t, 1, q.Len())
	})
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

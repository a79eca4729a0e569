package warren_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Consumer features (issue 4): exclusive consumers, single active consumer, consumer
// priorities, priority queues, selectors, exclusive and auto-delete queues, ack timeouts and
// immediate publishing.

// ---------------------------------------------------------------------------------------------
// 1. Exclusive consumers (R2.5)

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
// 2. Single active consumer (R2.4)

// TestSingleActiveOnlyFirstReceives: only the first consumer receives, even at its prefetch
// limit; the waiting one stays idle and is counted.
func TestSingleActiveOnlyFirstReceives(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q", warren.SingleActiveConsumer())
	first, err := q.Consume(t.Context(), warren.Prefetch(1))
	require.NoError(t, err)
	second, err := q.Consume(t.Context(), warren.Prefetch(10))
	require.NoError(t, err)
	require.Equal(t, 2, q.ConsumerCount(), "the waiting consumer counts")
	publishN(t, b, q, 5)
	require.Equal(t, 1, len(first.Deliveries()))
	require.Equal(t, 0, len(second.Deliveries()), "idle while the active one is at its prefetch")
	require.Equal(t, 4, q.Len())
	for want := range 5 {
		ds := receive(t, first, 1)
		require.Equal(t, strconv.Itoa(want), bodies(ds))
		require.NoError(t, ds[0].Ack())
		require.Equal(t, 0, len(second.Deliveries()))
	}
	require.Equal(t, 0, q.Len())
}

// TestSingleActiveFailoverOrder: consumer 1 (prefetch 3) takes 0,1,2, acks 0 (3 is then
// buffered for it, unread) and holds 1,2; its context ends; consumer 2, already waiting,
// receives 1*,2* (delivery count 1) and then 3,4,5,6 in queue order. Consumer 2 reads four of
// them and cancels: the two it had not read go back unchanged and consumer 3 takes over.
func TestSingleActiveFailoverOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.SingleActiveConsumer())
		ctx1, cancel1 := context.WithCancel(t.Context())
		defer cancel1()
		c1, err := q.Consume(ctx1, warren.Prefetch(3))
		require.NoError(t, err)
		c2, err := q.Consume(t.Context(), warren.Prefetch(10))
		require.NoError(t, err)
		c3, err := q.Consume(t.Context(), warren.Prefetch(10))
		require.NoError(t, err)
		require.Equal(t, 3, q.ConsumerCount())

		publishN(t, b, q, 7)
		held := receive(t, c1, 3)
		require.Equal(t, "0 1 2", picture(held))
		require.NoError(t, held[0].Ack())
		require.Equal(t, 1, len(c1.Deliveries()), "3 is buffered for consumer 1")
		require.Equal(t, 0, len(c2.Deliveries()))

		cancel1()
		synctest.Wait()
		assertStopped(t, c1, context.Canceled)
		require.ErrorIs(t, held[1].Ack(), warren.ErrAlreadySettled)
		require.Equal(t, 2, q.ConsumerCount())
		require.Equal(t, 6, len(c2.Deliveries()))
		got := receive(t, c2, 4)
		require.Equal(t, "1* 2* 3 4", picture(got))
		require.Equal(t, []int{1, 1, 0, 0}, deliveryCounts(got))
		require.Equal(t, 0, len(c3.Deliveries()), "consumer 3 still waits")

		require.NoError(t, c2.Cancel())
		require.ErrorIs(t, c2.Err(), warren.ErrCancelled)
		require.Equal(t, 1, q.ConsumerCount())
		took := buffered(t, c3)
		require.Equal(t, "5 6", picture(took), "buffered unread deliveries of a cancelled consumer go back unchanged")
		require.Equal(t, []int{0, 0}, deliveryCounts(took))
		ackAll(t, got) // received before Cancel: still settle-able
		publish(t, b, q.Name(), "7")
		require.Equal(t, "7", bodies(buffered(t, c3)))
	})
}

// TestSingleActiveWaitingOrder: waiting consumers take over by priority, then arrival; a
// higher-priority newcomer does not displace the active consumer.
func TestSingleActiveWaitingOrder(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q", warren.SingleActiveConsumer())
	type reg struct {
		tag      string
		priority int
	}
	regs := []reg{{"first", 0}, {"a", 0}, {"low", -1}, {"b", 0}, {"high", 5}, {"c", 0}}
	cs := map[string]*warren.Consumer{}
	for _, r := range regs {
		c, err := q.Consume(t.Context(), warren.ConsumerTag(r.tag), warren.ConsumerPriority(r.priority), warren.Prefetch(10))
		require.NoError(t, err)
		cs[r.tag] = c
	}
	n := 0
	// who publishes one message and returns the tag of the one consumer that received it.
	who := func() string {
		t.Helper()
		publish(t, b, q.Name(), strconv.Itoa(n))
		n++
		var got []string
		for tag, c := range cs {
			if len(c.Deliveries()) > 0 {
				ackAll(t, buffered(t, c))
				got = append(got, tag)
			}
		}
		require.Len(t, got, 1, "exactly one consumer receives: %v", got)
		return got[0]
	}
	require.Equal(t, "first", who())
	require.Equal(t, "first", who(), "a waiting higher-priority consumer does not displace the active one")
	active := "first"
	for _, next := range []string{"high", "a", "b", "c", "low"} {
		require.NoError(t, cs[active].Cancel())
		delete(cs, active)
		require.Equal(t, len(cs), q.ConsumerCount())
		active = who()
		require.Equal(t, next, active, "after %d deliveries", n)
	}
}

// TestSingleActiveTagUniqueness: consumer tags are unique among active and waiting consumers.
func TestSingleActiveTagUniqueness(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q", warren.SingleActiveConsumer())
	one, err := q.Consume(t.Context(), warren.ConsumerTag("one"))
	require.NoError(t, err)
	two, err := q.Consume(t.Context(), warren.ConsumerTag("two"))
	require.NoError(t, err)
	_, err = q.Consume(t.Context(), warren.ConsumerTag("two"))
	require.ErrorIs(t, err, warren.ErrPreconditionFailed, "the tag of a waiting consumer")
	_, err = q.Consume(t.Context(), warren.ConsumerTag("one"))
	require.ErrorIs(t, err, warren.ErrPreconditionFailed, "the tag of the active consumer")
	require.Equal(t, 2, q.ConsumerCount())

	require.NoError(t, two.Cancel()) // a waiting consumer leaves; the active one is undisturbed
	require.Equal(t, 1, q.ConsumerCount())
	_, err = q.Consume(t.Context(), warren.ConsumerTag("two"))
	require.NoError(t, err, "the tag is free again")
	publishN(t, b, q, 1)
	require.Equal(t, "0", bodies(buffered(t, one)))
}

// ---------------------------------------------------------------------------------------------
// 3. Consumer priorities (R2.3, Q8.8)

// TestConsumerPriorityHighTakesAll: a higher-priority consumer with credit takes every
// message; the lower one receives only while the higher one is at its prefetch; an ack on the
// higher one makes it receive again, ahead of the lower one.
func TestConsumerPriorityHighTakesAll(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	low, err := q.Consume(t.Context(), warren.Prefetch(2)) // first, priority 0
	require.NoError(t, err)
	high, err := q.Consume(t.Context(), warren.Prefetch(3), warren.ConsumerPriority(10))
	require.NoError(t, err)

	publishRange(t, b, q, 0, 3)
	require.Equal(t, 0, len(low.Deliveries()), "starved while the higher one has credit")
	hs := buffered(t, high)
	require.Equal(t, "0 1 2", bodies(hs))

	publishRange(t, b, q, 3, 5)
	ls := buffered(t, low)
	require.Equal(t, "3 4", bodies(ls), "the higher one is at its prefetch")

	publishRange(t, b, q, 5, 7)
	require.Equal(t, 2, q.Len(), "both are at their prefetch")
	require.NoError(t, hs[0].Ack())
	require.Equal(t, "5", bodies(buffered(t, high)), "an ack on the higher one makes it receive")
	require.Equal(t, 0, len(low.Deliveries()))
	require.NoError(t, ls[0].Ack())
	require.Equal(t, "6", bodies(buffered(t, low)))

	require.NoError(t, ls[1].Ack()) // the lower one has credit again
	require.NoError(t, hs[1].Ack())
	publishRange(t, b, q, 7, 8)
	require.Equal(t, "7", bodies(buffered(t, high)), "the higher one has credit: it takes it")
	require.Equal(t, 0, len(low.Deliveries()))
	publishRange(t, b, q, 8, 9)
	require.Equal(t, "8", bodies(buffered(t, low)))
	require.Equal(t, 0, len(high.Deliveries()))
}

// TestConsumerPriorityRoundRobinWithinLevel: consumers of one priority alternate; the lower
// level receives only when both are full.
func TestConsumerPriorityRoundRobinWithinLevel(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	low, err := q.Consume(t.Context(), warren.Prefetch(10), warren.ConsumerPriority(1))
	require.NoError(t, err)
	x, err := q.Consume(t.Context(), warren.Prefetch(3), warren.ConsumerPriority(5))
	require.NoError(t, err)
	y, err := q.Consume(t.Context(), warren.Prefetch(3), warren.ConsumerPriority(5))
	require.NoError(t, err)
	publishRange(t, b, q, 0, 6)
	xs, ys := buffered(t, x), buffered(t, y)
	require.Equal(t, "0 2 4", bodies(xs))
	require.Equal(t, "1 3 5", bodies(ys))
	require.Equal(t, 0, len(low.Deliveries()))
	publishRange(t, b, q, 6, 8)
	require.Equal(t, "6 7", bodies(buffered(t, low)))

	ackAll(t, xs)
	ackAll(t, ys)
	publishRange(t, b, q, 8, 12)
	require.Equal(t, "8 10", bodies(buffered(t, x)))
	require.Equal(t, "9 11", bodies(buffered(t, y)))
	require.Equal(t, 0, len(low.Deliveries()))
}

// TestConsumerPriorityNegative: negative priorities rank below the default 0, and among
// themselves by value.
func TestConsumerPriorityNegative(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	lowest, err := q.Consume(t.Context(), warren.Prefetch(10), warren.ConsumerPriority(-10))
	require.NoError(t, err)
	neg, err := q.Consume(t.Context(), warren.Prefetch(2), warren.ConsumerPriority(-5))
	require.NoError(t, err)
	zero, err := q.Consume(t.Context(), warren.Prefetch(2))
	require.NoError(t, err)
	publishRange(t, b, q, 0, 7)
	require.Equal(t, "0 1", bodies(buffered(t, zero)))
	require.Equal(t, "2 3", bodies(buffered(t, neg)))
	require.Equal(t, "4 5 6", bodies(buffered(t, lowest)))
}

// TestConsumerPriorityAutoAckAbovePush: an auto-ack consumer (a feeder goroutine) of a
// higher priority takes everything while it has room; the push consumer gets the rest.
func TestConsumerPriorityAutoAckAbovePush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		push, err := q.Consume(t.Context(), warren.Prefetch(10))
		require.NoError(t, err)
		feeder, err := q.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(2), warren.ConsumerPriority(5))
		require.NoError(t, err)
		synctest.Wait() // the feeder is idle
		for i := range 4 {
			publish(t, b, q.Name(), strconv.Itoa(i))
			synctest.Wait()
		}
		// The feeder holds two: one buffered, one it is handing over.
		require.Equal(t, "2 3", bodies(buffered(t, push)))
		require.Equal(t, "0", bodies(receive(t, feeder, 1)))
		synctest.Wait()
		require.Equal(t, "1", bodies(receive(t, feeder, 1)))
		synctest.Wait()
		publish(t, b, q.Name(), "4")
		synctest.Wait()
		require.Equal(t, "4", bodies(receive(t, feeder, 1)), "the feeder has room again: it takes it")
		require.Equal(t, 0, len(push.Deliveries()))
	})
}

// TestConsumerPriorityPushAboveAutoAck: a push consumer of a higher priority takes
// everything while it has credit; the auto-ack consumer gets the rest.
func TestConsumerPriorityPushAboveAutoAck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		feeder, err := q.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(10))
		require.NoError(t, err)
		push, err := q.Consume(t.Context(), warren.Prefetch(2), warren.ConsumerPriority(5))
		require.NoError(t, err)
		synctest.Wait()
		for i := range 4 {
			publish(t, b, q.Name(), strconv.Itoa(i))
			synctest.Wait()
		}
		ps := buffered(t, push)
		require.Equal(t, "0 1", bodies(ps))
		require.Equal(t, "2 3", bodies(buffered(t, feeder)))
		require.NoError(t, ps[0].Ack())
		publish(t, b, q.Name(), "4")
		synctest.Wait()
		require.Equal(t, "4", bodies(buffered(t, push)))
		require.Equal(t, 0, len(feeder.Deliveries()))
	})
}

// TestConsumerPrioritySelectorFallsThrough: a message goes to a lower priority when no
// higher-priority consumer with credit accepts it (Q8.8).
func TestConsumerPrioritySelectorFallsThrough(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	low, err := q.Consume(t.Context(), warren.Prefetch(10))
	require.NoError(t, err)
	high, err := q.Consume(t.Context(), warren.Prefetch(10), warren.ConsumerPriority(5), kindIs("a"))
	require.NoError(t, err)
	for i, k := range []string{"a", "b", "a", "c", "a"} {
		publishMsg(t, b, q.Name(), msgOfKind(strconv.Itoa(i), k))
	}
	require.Equal(t, "0 2 4", bodies(buffered(t, high)))
	require.Equal(t, "1 3", bodies(buffered(t, low)))
}

// ---------------------------------------------------------------------------------------------
// 4. Priority queues (R7.1-R7.3)

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
	var got []*warren.Delivery
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
	var got []*warren.Delivery
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

// TestPriorityQueueArguments: "x-max-priority" must be an integer from 0 to 255
// (ErrPreconditionFailed); MaxPriority must be from 1 to 255 (ErrInvalidArgument); a
// redeclaration must have the same maximum.
func TestPriorityQueueArguments(t *testing.T) {
	b := newBroker(t)
	for _, v := range []any{int32(-1), int32(256), int64(1000), "5", 5.5, true} {
		_, err := b.DeclareQueue("bad", warren.Arguments(warren.Table{"x-max-priority": v}))
		require.ErrorIs(t, err, warren.ErrPreconditionFailed, "x-max-priority %v (%T)", v, v)
	}
	for _, n := range []int{0, -1, 256} {
		_, err := b.DeclareQueue("bad", warren.MaxPriority(n))
		require.ErrorIs(t, err, warren.ErrInvalidArgument, "MaxPriority(%d)", n)
	}
	require.False(t, queueExists(t, b, "bad"))

	declare(t, b, "p1", warren.MaxPriority(1))
	declare(t, b, "p255", warren.MaxPriority(255))
	declare(t, b, "a0", warren.Arguments(warren.Table{"x-max-priority": int32(0)}))
	declare(t, b, "a255", warren.Arguments(warren.Table{"x-max-priority": uint8(255)}))

	declare(t, b, "pq", warren.MaxPriority(5))
	_, err := b.DeclareQueue("pq", warren.MaxPriority(6))
	require.ErrorIs(t, err, warren.ErrPreconditionFailed, "another maximum")
	_, err = b.DeclareQueue("pq")
	require.ErrorIs(t, err, warren.ErrPreconditionFailed, "no maximum")
	_, err = b.DeclareQueue("pq", warren.MaxPriority(5))
	require.NoError(t, err)
	declare(t, b, "plain")
	_, err = b.DeclareQueue("plain", warren.MaxPriority(5))
	require.ErrorIs(t, err, warren.ErrPreconditionFailed, "a maximum on a queue without one")
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
// 5. Selectors (Q8.3, Q8.4)

// TestSelectorSplitKeepsOrder: two consumers split a queue by a header; each receives its
// messages in publication order, across acks and a backlog.
func TestSelectorSplitKeepsOrder(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	const kinds = "aabababbbaaab"
	var wantA, wantB []string
	for i, k := range kinds {
		publishMsg(t, b, q.Name(), msgOfKind(strconv.Itoa(i), string(k)))
		if k == 'a' {
			wantA = append(wantA, strconv.Itoa(i))
		} else {
			wantB = append(wantB, strconv.Itoa(i))
		}
	}
	as, err := q.Consume(t.Context(), warren.Prefetch(2), kindIs("a"))
	require.NoError(t, err)
	bs, err := q.Consume(t.Context(), warren.Prefetch(2), kindIs("b"))
	require.NoError(t, err)
	var gotA, gotB []string
	for range len(kinds) {
		for _, x := range []struct {
			c   *warren.Consumer
			got *[]string
		}{{as, &gotA}, {bs, &gotB}} {
			ds := buffered(t, x.c)
			for _, d := range ds {
				*x.got = append(*x.got, string(d.Message.Body))
			}
			ackAll(t, ds)
		}
	}
	require.Equal(t, strings.Join(wantA, " "), strings.Join(gotA, " "))
	require.Equal(t, strings.Join(wantB, " "), strings.Join(gotB, " "))
	require.Equal(t, 0, q.Len())
}

// TestSelectorSkippedMessagesKeepTheirPlace: messages a selective consumer skips stay ready,
// in order, for Get and for other consumers.
func TestSelectorSkippedMessagesKeepTheirPlace(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	s, err := q.Consume(t.Context(), warren.Prefetch(10), kindIs("a"))
	require.NoError(t, err)
	for i, k := range []string{"b", "a", "c", "a", "b"} {
		publishMsg(t, b, q.Name(), msgOfKind(strconv.Itoa(i), k))
	}
	require.Equal(t, "1 3", bodies(buffered(t, s)))
	require.Equal(t, 3, q.Len())
	d, err := q.Get(t.Context(), warren.AutoAck())
	require.NoError(t, err)
	require.Equal(t, "0", string(d.Message.Body))
	require.Equal(t, 2, d.MessageCount)
	plain, err := q.Consume(t.Context(), warren.Prefetch(10))
	require.NoError(t, err)
	require.Equal(t, "2 4", bodies(buffered(t, plain)))
}

// TestSelectorNackReturnsToPlace: a message a selective consumer nacks returns to its place,
// and it receives it again before later messages (its cursor moves back).
func TestSelectorNackReturnsToPlace(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	s, err := q.Consume(t.Context(), warren.Prefetch(2), kindIs("a"))
	require.NoError(t, err)
	for i, k := range []string{"a", "b", "a", "a", "a"} {
		publishMsg(t, b, q.Name(), msgOfKind(strconv.Itoa(i), k))
	}
	first := buffered(t, s)
	require.Equal(t, "0 2", bodies(first))
	require.NoError(t, first[0].Nack())
	again := buffered(t, s)
	require.Equal(t, "0*", picture(again), "the nacked message, not 3")
	require.NoError(t, first[1].Ack())
	require.Equal(t, "3", picture(buffered(t, s)))
	require.NoError(t, again[0].Ack())
	require.Equal(t, "4", picture(buffered(t, s)))
	require.Equal(t, "1", bodies(getAll(t, q)))
}

// TestSelectorNackSeenByOtherConsumer: a message returned ahead of another selective
// consumer's cursor is received by it before the later messages.
func TestSelectorNackSeenByOtherConsumer(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	s1, err := q.Consume(t.Context(), warren.Prefetch(1), kindIs("a"))
	require.NoError(t, err)
	s2, err := q.Consume(t.Context(), warren.Prefetch(1), kindIs("a"))
	require.NoError(t, err)
	for i, k := range []string{"b", "a", "a", "a", "b"} {
		publishMsg(t, b, q.Name(), msgOfKind(strconv.Itoa(i), k))
	}
	r1, r2 := receive(t, s1, 1), receive(t, s2, 1)
	require.Equal(t, "1", bodies(r1))
	require.Equal(t, "2", bodies(r2))
	require.NoError(t, s1.Cancel())
	require.NoError(t, r1[0].Nack())
	require.Equal(t, 0, len(s2.Deliveries()), "s2 is at its prefetch")
	require.NoError(t, r2[0].Ack())
	got := receive(t, s2, 1)
	require.Equal(t, "1*", picture(got), "the returned message comes before 3")
	require.NoError(t, got[0].Ack())
	require.Equal(t, "3", picture(buffered(t, s2)))
	require.Equal(t, "0 4", bodies(getAll(t, q)))
}

// TestSelectorBesidePlainConsumer: a selective consumer takes only what it accepts; a plain
// consumer beside it takes the rest, each in queue order.
func TestSelectorBesidePlainConsumer(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	plain, err := q.Consume(t.Context(), warren.Prefetch(2))
	require.NoError(t, err)
	for i, k := range []string{"b", "a", "b", "a", "b", "a"} {
		publishMsg(t, b, q.Name(), msgOfKind(strconv.Itoa(i), k))
	}
	sel, err := q.Consume(t.Context(), warren.Prefetch(10), kindIs("a"))
	require.NoError(t, err)
	require.Equal(t, "3 5", bodies(buffered(t, sel)))
	ps := buffered(t, plain)
	require.Equal(t, "0 1", bodies(ps))
	ackAll(t, ps)
	require.Equal(t, "2 4", bodies(buffered(t, plain)), "what the selective consumer skipped")
	require.Equal(t, 0, q.Len())
}

// TestSelectorPanicSkipsMessage: a selector that panics rejects the message (logged), and the
// broker carries on.
func TestSelectorPanicSkipsMessage(t *testing.T) {
	var log bytes.Buffer
	b := warren.New(warren.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	t.Cleanup(func() { b.Close() })
	q := declare(t, b, "q")
	s, err := q.Consume(t.Context(), warren.Prefetch(10), warren.Selector(func(m *warren.Message) bool {
		if m.Headers["kind"] == "boom" {
			panic("selector bug")
		}
		return true
	}))
	require.NoError(t, err)
	for i, k := range []string{"a", "boom", "a"} {
		publishMsg(t, b, q.Name(), msgOfKind(strconv.Itoa(i), k))
	}
	require.Equal(t, "0 2", bodies(buffered(t, s)))
	require.Equal(t, 1, q.Len())
	require.Contains(t, log.String(), "selector bug")
	d, err := q.Get(t.Context(), warren.AutoAck())
	require.NoError(t, err)
	require.Equal(t, "1", string(d.Message.Body))
	publishMsg(t, b, q.Name(), msgOfKind("3", "a"))
	require.Equal(t, "3", bodies(buffered(t, s)))
}

// TestSelectorNil: a nil selector is refused.
func TestSelectorNil(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	_, err := q.Consume(t.Context(), warren.Selector(nil))
	require.ErrorIs(t, err, warren.ErrInvalidArgument)
	require.Equal(t, 0, q.ConsumerCount())
}

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
	var got []*warren.Delivery
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

// ---------------------------------------------------------------------------------------------
// 6. Exclusive queues (R2.6)

// TestExclusiveQueueDeletedWithOwner: an exclusive queue is deleted when its owner context
// ends; its consumers stop with ErrQueueDeleted. A consumer's context must be the owner or share
// its Done channel, so both end at once: the scenario runs several rounds (alternating the owner
// and a WithValue child as the consumer's context) to catch an outcome that depends on which
// context callback runs first.
func TestExclusiveQueueDeletedWithOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		const rounds = 20
		var wrong []string
		for i := range rounds {
			owner, end := context.WithCancel(t.Context())
			q := declare(t, b, "ex", warren.ExclusiveTo(owner)) // the name is free again each round
			ctx := owner
			if i%2 == 1 {
				ctx = context.WithValue(owner, ctxKey{}, i)
			}
			c, err := q.Consume(ctx, warren.Prefetch(1))
			require.NoError(t, err)
			publishN(t, b, q, 3) // publishing is no use of the queue: any context may
			require.Equal(t, 2, q.Len())
			ds := receive(t, c, 1)
			end()
			synctest.Wait()
			require.False(t, queueExists(t, b, "ex"))
			require.True(t, isClosed(c.Done()))
			select {
			case _, ok := <-c.Deliveries():
				require.False(t, ok, "Deliveries closed")
			default:
				t.Fatal("Deliveries not closed")
			}
			require.NoError(t, ds[0].Ack(), "a no-op")
			if !errors.Is(c.Err(), warren.ErrQueueDeleted) {
				wrong = append(wrong, fmt.Sprintf("round %d: Err() = %v", i, c.Err()))
			}
		}
		require.Empty(t, wrong, "%d of %d rounds: the consumer's Err() does not wrap ErrQueueDeleted", len(wrong), rounds)
	})
}

// TestExclusiveQueueUseAfterOwnerEnded: once an exclusive queue is deleted with its owner,
// using it fails with ErrNotFound, as for any deleted queue ([Queue]: "After the queue is
// deleted its methods return an error wrapping ErrNotFound"), whichever context is used.
func TestExclusiveQueueUseAfterOwnerEnded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		owner, end := context.WithCancel(t.Context())
		defer end()
		q := declare(t, b, "ex", warren.ExclusiveTo(owner))
		end()
		synctest.Wait()
		require.False(t, queueExists(t, b, "ex"))
		_, err := q.Consume(t.Context())
		require.ErrorIs(t, err, warren.ErrNotFound, "Consume")
		_, err = q.Purge()
		require.ErrorIs(t, err, warren.ErrNotFound, "Purge")
		_, err = q.Get(t.Context())
		require.ErrorIs(t, err, warren.ErrNotFound, "Get")
	})
}

// TestExclusiveQueueDeletedWithOwnerNoConsumer: without consumers too, the queue goes with its
// owner.
func TestExclusiveQueueDeletedWithOwnerNoConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		owner, end := context.WithCancel(t.Context())
		defer end()
		q := declare(t, b, "ex", warren.ExclusiveTo(owner))
		publishN(t, b, q, 2)
		d, err := q.Get(owner)
		require.NoError(t, err)
		end()
		synctest.Wait()
		require.False(t, queueExists(t, b, "ex"))
		require.NoError(t, d.Ack(), "a no-op")
	})
}

type ctxKey struct{}

// TestExclusiveQueueOwnerOnly: only the owner, or a context sharing its Done channel, may
// consume from, get from or redeclare an exclusive queue.
func TestExclusiveQueueOwnerOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		owner, end := context.WithCancel(t.Context())
		defer end()
		q := declare(t, b, "ex", warren.ExclusiveTo(owner))
		publishN(t, b, q, 2)

		other := t.Context()
		child, cancelChild := context.WithCancel(owner)
		defer cancelChild()
		for name, ctx := range map[string]context.Context{"another context": other, "a cancellable child": child} {
			_, err := q.Consume(ctx)
			require.ErrorIs(t, err, warren.ErrResourceLocked, "Consume from %s", name)
			_, err = q.Get(ctx)
			require.ErrorIs(t, err, warren.ErrResourceLocked, "Get from %s", name)
		}
		require.Equal(t, 0, q.ConsumerCount())
		require.Equal(t, 2, q.Len())

		valued := context.WithValue(owner, ctxKey{}, "v")
		d, err := q.Get(valued)
		require.NoError(t, err, "a WithValue child shares the owner's Done channel")
		require.Equal(t, "0", string(d.Message.Body))
		require.NoError(t, d.Ack())
		c, err := q.Consume(valued)
		require.NoError(t, err)
		require.Equal(t, "1", bodies(buffered(t, c)))

		_, err = b.DeclareQueue("ex")
		require.ErrorIs(t, err, warren.ErrResourceLocked, "redeclared without an owner")
		_, err = b.DeclareQueue("ex", warren.ExclusiveTo(other))
		require.ErrorIs(t, err, warren.ErrResourceLocked, "redeclared with another owner")
		_, err = b.DeclareQueue("ex", warren.ExclusiveTo(child))
		require.ErrorIs(t, err, warren.ErrResourceLocked, "redeclared with a cancellable child")
		again, err := b.DeclareQueue("ex", warren.ExclusiveTo(owner))
		require.NoError(t, err)
		require.Same(t, q, again)
		again, err = b.DeclareQueue("ex", warren.ExclusiveTo(valued))
		require.NoError(t, err)
		require.Same(t, q, again)

		done, cancel := context.WithCancel(t.Context())
		cancel()
		_, err = b.DeclareQueue("ex2", warren.ExclusiveTo(done))
		require.ErrorIs(t, err, context.Canceled, "an owner already done")
		require.False(t, queueExists(t, b, "ex2"))
	})
}

// ---------------------------------------------------------------------------------------------
// 7. Auto-delete queues (R6.11)

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

// ---------------------------------------------------------------------------------------------
// 8. Ack timeout (R2.8)

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

// ---------------------------------------------------------------------------------------------
// 9. Immediate publish (Q8.7)

// TestImmediateWithoutConsumers: an immediate publish that no consumer takes fails with
// ErrNoConsumers and leaves nothing behind.
func TestImmediateWithoutConsumers(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	err := b.Publish(t.Context(), "", "q", msg("x"), warren.Immediate())
	require.ErrorIs(t, err, warren.ErrNoConsumers)
	require.Equal(t, 0, q.Len())
	_, err = b.DeclareExchange("fan", warren.ExchangeFanout)
	require.NoError(t, err)
	require.NoError(t, b.Bind("q", "fan", "", nil))
	err = b.Publish(t.Context(), "fan", "", msg("x"), warren.Immediate())
	require.ErrorIs(t, err, warren.ErrNoConsumers)
	require.Equal(t, 0, q.Len())
}

// TestImmediateConsumerWithoutCredit: a consumer at its prefetch cannot take an immediate
// message; it is never in the queue.
func TestImmediateConsumerWithoutCredit(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	c, err := q.Consume(t.Context(), warren.Prefetch(1))
	require.NoError(t, err)
	publish(t, b, q.Name(), "0")
	err = b.Publish(t.Context(), "", "q", msg("1"), warren.Immediate())
	require.ErrorIs(t, err, warren.ErrNoConsumers)
	require.Equal(t, 0, q.Len())
	ds := receive(t, c, 1)
	require.NoError(t, ds[0].Ack())
	require.Equal(t, 0, len(c.Deliveries()), "1 was never in the queue")
}

// TestImmediateBehindBacklog: with messages ready ahead of it, an immediate message is not
// taken.
func TestImmediateBehindBacklog(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	c, err := q.Consume(t.Context(), warren.Prefetch(1))
	require.NoError(t, err)
	publishRange(t, b, q, 0, 2)
	require.Equal(t, 1, q.Len())
	err = b.Publish(t.Context(), "", "q", msg("2"), warren.Immediate())
	require.ErrorIs(t, err, warren.ErrNoConsumers)
	require.Equal(t, 1, q.Len())
	ds := receive(t, c, 1)
	require.NoError(t, ds[0].Ack())
	ds = receive(t, c, 1)
	require.Equal(t, "1", bodies(ds))
	require.NoError(t, ds[0].Ack())
	require.Equal(t, 0, len(c.Deliveries()))
	require.Equal(t, 0, q.Len())
}

// TestImmediateNotForWaitingOrRefusingConsumers: neither a waiting single-active consumer
// nor a selective consumer that does not accept the message takes an immediate message, credit
// or not.
func TestImmediateNotForWaitingOrRefusingConsumers(t *testing.T) {
	b := newBroker(t)
	sac := declare(t, b, "sac", warren.SingleActiveConsumer())
	active, err := sac.Consume(t.Context(), warren.Prefetch(1))
	require.NoError(t, err)
	waiting, err := sac.Consume(t.Context(), warren.Prefetch(10))
	require.NoError(t, err)
	publish(t, b, sac.Name(), "0")
	err = b.Publish(t.Context(), "", "sac", msg("1"), warren.Immediate())
	require.ErrorIs(t, err, warren.ErrNoConsumers, "the active consumer is full; the waiting one does not count")
	require.Equal(t, 0, sac.Len())
	require.Equal(t, 0, len(waiting.Deliveries()))
	require.Equal(t, "0", bodies(buffered(t, active)))

	q := declare(t, b, "q")
	s, err := q.Consume(t.Context(), warren.Prefetch(10), kindIs("a"))
	require.NoError(t, err)
	err = b.Publish(t.Context(), "", "q", msgOfKind("b", "b"), warren.Immediate())
	require.ErrorIs(t, err, warren.ErrNoConsumers, "the selector refuses it")
	require.Equal(t, 0, q.Len())
	require.NoError(t, b.Publish(t.Context(), "", "q", msgOfKind("a", "a"), warren.Immediate()))
	require.Equal(t, "a", bodies(buffered(t, s)))
}

// TestImmediateTakenByConsumer: a consumer with credit takes an immediate message at once.
func TestImmediateTakenByConsumer(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	c, err := q.Consume(t.Context(), warren.Prefetch(5))
	require.NoError(t, err)
	require.NoError(t, b.Publish(t.Context(), "", "q", msg("0"), warren.Immediate()))
	require.Equal(t, "0", bodies(buffered(t, c)))
	require.Equal(t, 0, q.Len())
	require.Equal(t, 1, q.Unacked())
}

// TestImmediateFanout: routed to several queues, an immediate message goes only to those
// with a consumer that takes it at once, and the publish succeeds if any did.
func TestImmediateFanout(t *testing.T) {
	b := newBroker(t)
	_, err := b.DeclareExchange("fan", warren.ExchangeFanout)
	require.NoError(t, err)
	free, full, empty := declare(t, b, "free"), declare(t, b, "full"), declare(t, b, "empty")
	for _, q := range []string{"free", "full", "empty"} {
		require.NoError(t, b.Bind(q, "fan", "", nil))
	}
	fc, err := free.Consume(t.Context(), warren.Prefetch(5))
	require.NoError(t, err)
	uc, err := full.Consume(t.Context(), warren.Prefetch(1))
	require.NoError(t, err)
	publish(t, b, full.Name(), "x")

	require.NoError(t, b.Publish(t.Context(), "fan", "", msg("m"), warren.Immediate()))
	require.Equal(t, "m", bodies(buffered(t, fc)))
	require.Equal(t, "x", bodies(buffered(t, uc)))
	require.Equal(t, 0, full.Len())
	require.Equal(t, 0, empty.Len())
}

// TestImmediateWithDelay: Immediate and DeliverAfter contradict each other.
func TestImmediateWithDelay(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	_, err := q.Consume(t.Context())
	require.NoError(t, err)
	err = b.Publish(t.Context(), "", "q", msg("x"), warren.Immediate(), warren.DeliverAfter(time.Second))
	require.ErrorIs(t, err, warren.ErrInvalidArgument)
	require.Equal(t, 0, q.Len())
	require.Equal(t, 0, q.Unacked())
}

// TestImmediateAutoAckConsumer: an idle auto-ack consumer takes an immediate message; one
// busy handing over a message cannot.
func TestImmediateAutoAckConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		c, err := q.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(1)) // no buffer: it holds one at a time
		require.NoError(t, err)
		synctest.Wait()
		require.NoError(t, b.Publish(t.Context(), "", "q", msg("0"), warren.Immediate()))
		synctest.Wait() // the feeder is blocked handing 0 over
		err = b.Publish(t.Context(), "", "q", msg("1"), warren.Immediate())
		require.ErrorIs(t, err, warren.ErrNoConsumers)
		require.Equal(t, "0", bodies(receive(t, c, 1)))
		synctest.Wait()
		require.Equal(t, 0, q.Len())
		require.NoError(t, b.Publish(t.Context(), "", "q", msg("2"), warren.Immediate()))
		synctest.Wait()
		require.Equal(t, "2", bodies(receive(t, c, 1)))
	})
}

package warren_test

import (
	"bytes"
	"context"
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

// Tests of dispatch (dispatch.go): which consumer receives which message — round robin among
// consumers with credit, a single active consumer and its successors, consumer priorities,
// selectors, and immediate publishes, which a consumer takes at once or not at all. Priority
// queues are in priority_test.go, AutoAck consumers' feeders in feeder_test.go.

// ---------------------------------------------------------------------------------------------
// Round robin among consumers with credit.

// msgOfKind is a message with a "kind" header, for selectors.
func msgOfKind(s, kind string) warren.Message {
	return warren.Message{Body: []byte(s), Headers: warren.Table{"kind": kind}}
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

// ---------------------------------------------------------------------------------------------
// Single active consumer (R2.4).

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
// Consumer priorities (R2.3, Q8.8).

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
// Selectors (Q8.3, Q8.4).

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

// ---------------------------------------------------------------------------------------------
// Immediate publishes (Q8.7).

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

// An immediate publish never waits, not even on a full queue with the Block policy.
func TestImmediateNeverBlocks(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q", warren.MaxLength(1), warren.Overflow(warren.Block))
	publishN(t, b, q, 1)
	err := b.Publish(t.Context(), "", "q", warren.Message{}, warren.Immediate())
	require.ErrorIs(t, err, warren.ErrQueueFull)
}

package warren_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of issue 5's observability: alerts and their Cycle and Delete policies, Stats,
// Outstanding and the edge cases of WaitIdle.

// eventBodies returns the bodies of the events' messages, in order.
func eventBodies(evs []warren.Event) []string {
	out := make([]string, 0, len(evs))
	for _, e := range evs {
		out = append(out, string(e.Message.Body))
	}
	return out
}

// ---------------------------------------------------------------------------------------------
// 1. Alerts fire once per crossing, with the repeat gap respected.

// The Messages threshold alerts when ready messages go from below to at-or-above it: once, not
// again while over, not for a new crossing within the default repeat gap (1 minute), and again
// for a crossing after it. The Alert policy does nothing else: the queue keeps growing.
func TestAlertMessagesOncePerCrossing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		log := recordEvents(t, b)
		q := declare(t, b, "q", warren.WithAlerts(warren.Alerts{Messages: 3}))
		alerts := func() []warren.Event { return log.alerts(warren.AlertMessages) }

		publishN(t, b, q, 2)
		require.Empty(t, alerts(), "2 ready, below 3")
		publishN(t, b, q, 1)
		require.Len(t, alerts(), 1, "3 ready: the crossing to at-or-above alerts")
		e := alerts()[0]
		require.Equal(t, "q", e.Queue)
		require.Equal(t, warren.AlertMessages, e.Reason)
		require.Equal(t, int64(3), e.Value)
		require.Equal(t, int64(3), e.Limit)
		require.Nil(t, e.Message, "a count alert names no message")

		publishN(t, b, q, 3)
		require.Len(t, alerts(), 1, "more while over is no crossing")
		require.Equal(t, 6, q.Len(), "the Alert policy only alerts")

		for q.Len() > 2 {
			take(t, q)
		}
		publish(t, b, "q", "x")
		require.Len(t, alerts(), 1, "a second crossing at once is within the repeat gap")

		time.Sleep(59 * time.Second)
		take(t, q)
		publish(t, b, "q", "y")
		require.Equal(t, 3, q.Len())
		require.Len(t, alerts(), 1, "a crossing 59s after the alert is within the default 1-minute gap")

		time.Sleep(2 * time.Second)
		publish(t, b, "q", "z")
		require.Len(t, alerts(), 1, "past the gap, but still over: no crossing, no alert")

		take(t, q)
		take(t, q)
		require.Equal(t, 2, q.Len())
		publish(t, b, "q", "w")
		require.Len(t, alerts(), 2, "a crossing 61s after the last alert")
		require.Equal(t, int64(3), alerts()[1].Value)
		require.Len(t, log.of(warren.EventAlert, ""), 2, "no alert of another kind")
	})
}

// The Bytes threshold, with a RepeatGap of its own: at-or-above counts, the gap is the one given.
func TestAlertBytesOncePerCrossing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		log := recordEvents(t, b)
		q := declare(t, b, "q", warren.WithAlerts(warren.Alerts{Bytes: 10, RepeatGap: 10 * time.Second}))
		alerts := func() []warren.Event { return log.alerts(warren.AlertBytes) }
		five := "aaaaa"

		publish(t, b, "q", five)
		require.Empty(t, alerts())
		publish(t, b, "q", five)
		require.Len(t, alerts(), 1, "10 bytes of 10: at the threshold alerts")
		require.Equal(t, int64(10), alerts()[0].Value)
		require.Equal(t, int64(10), alerts()[0].Limit)
		require.Equal(t, "q", alerts()[0].Queue)
		publish(t, b, "q", five)
		require.Len(t, alerts(), 1, "15 bytes: still over")

		take(t, q)
		take(t, q)
		require.Equal(t, int64(5), q.Stats().Bytes)
		publish(t, b, "q", five)
		require.Len(t, alerts(), 1, "crossing again at once: within the gap")

		time.Sleep(9 * time.Second)
		take(t, q)
		publish(t, b, "q", five)
		require.Len(t, alerts(), 1, "9s after: within the 10s gap")

		time.Sleep(2 * time.Second)
		take(t, q)
		publish(t, b, "q", five)
		require.Len(t, alerts(), 2, "11s after: past the gap")
		require.Equal(t, int64(10), alerts()[1].Value)
		require.Len(t, log.of(warren.EventAlert, ""), 2)
	})
}

// MessageSize is checked per arriving message: each message at-or-above the size is a crossing of
// its own, but alerts still keep the repeat gap.
func TestAlertMessageSizePerMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		log := recordEvents(t, b)
		declare(t, b, "q", warren.WithAlerts(warren.Alerts{MessageSize: 100}))
		alerts := func() []warren.Event { return log.alerts(warren.AlertMessageSize) }
		body := func(c byte, n int) string { return string(filled(c, n)) }

		publish(t, b, "q", body('a', 99))
		require.Empty(t, alerts(), "99 bytes: below")
		publish(t, b, "q", body('b', 100))
		require.Len(t, alerts(), 1, "100 bytes: at the threshold")
		e := alerts()[0]
		require.Equal(t, "q", e.Queue)
		require.Equal(t, int64(100), e.Value)
		require.Equal(t, int64(100), e.Limit)
		require.NotNil(t, e.Message, "a size alert names the message")
		require.Equal(t, body('b', 100), string(e.Message.Body))

		publish(t, b, "q", body('c', 200))
		publish(t, b, "q", body('d', 10))
		publish(t, b, "q", body('e', 300))
		require.Len(t, alerts(), 1, "big messages within the gap do not alert")

		time.Sleep(time.Minute + time.Second)
		publish(t, b, "q", body('f', 150))
		require.Len(t, alerts(), 2, "after the gap a big message alerts, though the one before was big too")
		require.Equal(t, int64(150), alerts()[1].Value)
		require.Equal(t, body('f', 150), string(alerts()[1].Message.Body))
		publish(t, b, "q", body('g', 150))
		require.Len(t, alerts(), 2, "and the next within the gap does not")
		require.Len(t, log.of(warren.EventAlert, ""), 2, "message size is not a count or bytes alert")
	})
}

func filled(c byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = c
	}
	return out
}

// Age is checked on the queue's timer: an unconsumed message makes the alert fire once it is
// older than Age, with no call into the broker, exactly once however long it stays. Crossings
// after that keep the repeat gap.
func TestAlertAgeOnTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		log := recordEvents(t, b)
		q := declare(t, b, "q", warren.WithAlerts(warren.Alerts{Age: 10 * time.Second}))
		alerts := func() []warren.Event { return log.alerts(warren.AlertAge) }

		publish(t, b, "q", "old")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		require.Empty(t, alerts(), "exactly Age old is not above Age")
		require.Equal(t, 1, q.Len()) // a critical section, which checks age, at exactly Age
		synctest.Wait()
		require.Empty(t, alerts(), "exactly Age old is not above Age, checked in a critical section")
		time.Sleep(time.Millisecond) // no call into the broker: the timer alerts
		synctest.Wait()
		require.Len(t, alerts(), 1, "the timer fires the alert once the message is older than Age")
		e := alerts()[0]
		require.Equal(t, "q", e.Queue)
		require.Equal(t, int64(10*time.Second), e.Limit)
		require.Greater(t, e.Value, e.Limit)
		require.LessOrEqual(t, e.Value, int64(10*time.Second+time.Millisecond), "the age when the timer fired")
		time.Sleep(time.Hour)
		synctest.Wait()
		require.Len(t, alerts(), 1, "exactly once while it stays over")

		// A new crossing, long after the gap: alerts.
		require.Equal(t, "old", take(t, q))
		publish(t, b, "q", "second")
		time.Sleep(11 * time.Second)
		synctest.Wait()
		require.Len(t, alerts(), 2, "a new message crossing, past the gap")
		second := time.Now().Add(-time.Second) // about when it fired

		// Within the gap: none.
		require.Equal(t, "second", take(t, q))
		publish(t, b, "q", "third")
		time.Sleep(11 * time.Second)
		synctest.Wait()
		require.Len(t, alerts(), 2, "a crossing within the gap of the last alert")

		// Past the gap again: one more.
		time.Sleep(time.Until(second.Add(time.Minute)))
		require.Equal(t, "third", take(t, q))
		publish(t, b, "q", "fourth")
		time.Sleep(11 * time.Second)
		synctest.Wait()
		require.Len(t, alerts(), 3)
		require.Len(t, log.of(warren.EventAlert, ""), 3)
	})
}

// A huge age threshold, up to the largest Duration, means practically never: the time the
// oldest message passes it must not overflow the queue's clock, which would arm the queue's one
// timer about 292 years out and never re-arm it sooner. A 20 ms TTL and a 10 ms delay beside
// it are on time, and the threshold neither alerts nor deletes.
func TestAlertHugeAgeKeepsTimersOnTime(t *testing.T) {
	for _, tc := range []struct {
		name   string
		alerts warren.Alerts
	}{
		{"Age MaxInt64-1, Delete", warren.Alerts{Age: math.MaxInt64 - 1, Policy: warren.Delete}},
		// Unfixed, this one overflowed to a due time in the past: the timer fired again and
		// again at once, and virtual time never moved on.
		{"Age MaxInt64", warren.Alerts{Age: math.MaxInt64}},
		{"Age 1<<62, RepeatGap MaxInt64", warren.Alerts{Age: 1 << 62, RepeatGap: math.MaxInt64}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				log := recordEvents(t, b)
				q := declare(t, b, "q", warren.WithAlerts(tc.alerts))
				publish(t, b, "q", "old") // its age is what the threshold watches
				time.Sleep(time.Millisecond)
				start := time.Now()
				publish(t, b, "q", "soon", warren.DeliverAfter(10*time.Millisecond))
				require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("short"), Expiration: "20"}))
				require.Equal(t, []string{"old", "short"}, browse(q))

				time.Sleep(10 * time.Millisecond)
				synctest.Wait()
				require.Equal(t, []string{"old", "soon", "short"}, browse(q), "%+v: a 10 ms delay at %v", tc.alerts, time.Since(start))
				time.Sleep(10 * time.Millisecond)
				synctest.Wait()
				require.Equal(t, []string{"old", "soon"}, browse(q), "%+v: a 20 ms TTL at %v", tc.alerts, time.Since(start))

				time.Sleep(time.Hour)
				synctest.Wait()
				require.Equal(t, []string{"old", "soon"}, browse(q))
				require.Empty(t, log.alerts(warren.AlertAge))
			})
		})
	}
}

// Negative thresholds, a negative gap or an unknown policy fail the declaration.
func TestAlertInvalid(t *testing.T) {
	b := newBroker(t)
	for i, a := range []warren.Alerts{
		{Messages: -1},
		{Bytes: -1},
		{Age: -time.Second},
		{MessageSize: -1},
		{Messages: 1, RepeatGap: -time.Second},
		{Messages: 1, Policy: warren.Delete + 1},
	} {
		name := fmt.Sprintf("bad%d", i)
		_, err := b.DeclareQueue(name, warren.WithAlerts(a))
		require.ErrorIs(t, err, warren.ErrInvalidArgument, "%+v", a)
		_, err = b.Queue(name)
		require.ErrorIs(t, err, warren.ErrNotFound, "%+v: no queue declared", a)
	}
	_, err := b.DeclareQueue("zero", warren.WithAlerts(warren.Alerts{}))
	require.NoError(t, err, "zero thresholds check nothing")
}

// ---------------------------------------------------------------------------------------------
// 2. The Cycle policy.

// With consumers attached, a Cycle queue keeps at most Messages ready by dropping the oldest
// ready message, dead-lettered "maxlen" in order; what its consumer holds is untouched.
func TestCycleMessagesWithConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		log := recordEvents(t, b)
		q := declare(t, b, "q", warren.WithAlerts(warren.Alerts{Messages: 3, Policy: warren.Cycle}),
			warren.DeadLetter("", "dlq"))
		dlq := declare(t, b, "dlq")
		c, err := q.Consume(t.Context(), warren.Prefetch(2), warren.ConsumerTag("slow"))
		require.NoError(t, err)
		publishN(t, b, q, 2)
		first := receive(t, c, 1) // "0" received, "1" buffered
		for i := 2; i < 10; i++ {
			publish(t, b, "q", strconv.Itoa(i))
			require.LessOrEqual(t, q.Len(), 3, "after publishing %d", i)
		}
		require.Equal(t, []string{"7", "8", "9"}, browse(q), "the newest three stay")
		require.Equal(t, []string{"2", "3", "4", "5", "6"}, browse(dlq), "the oldest ready, dropped in order")
		for m := range dlq.Browse() {
			deaths := m.Deaths()
			require.Len(t, deaths, 1)
			require.Equal(t, warren.ReasonMaxLen, deaths[0].Reason)
			require.Equal(t, "q", deaths[0].Queue)
		}
		dead := log.of(warren.EventDeadLettered, "q")
		require.Equal(t, []string{"2", "3", "4", "5", "6"}, eventBodies(dead))
		for _, e := range dead {
			require.Equal(t, warren.ReasonMaxLen, e.Reason)
		}
		require.Empty(t, log.of(warren.EventDropped, "q"))

		// The consumer's deliveries were not touched.
		require.Equal(t, 2, q.Unacked())
		second := receive(t, c, 1)
		require.Equal(t, "0 1", picture(append(first, second...)))
		require.NoError(t, first[0].Ack())
		require.NoError(t, second[0].Ack())
		require.Equal(t, "7 8", picture(receive(t, c, 2)), "then the head goes to the consumer")

		st := q.Stats()
		require.Equal(t, uint64(10), st.Enqueued)
		require.Equal(t, uint64(5), st.DeadLettered)
		require.Equal(t, uint64(0), st.Dropped)
		require.Equal(t, uint64(2), st.Acked)
	})
}

// Without a dead-letter exchange each message the Cycle policy drops is an EventDropped with
// Reason maxlen.
func TestCycleWithoutDLXDrops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		log := recordEvents(t, b)
		q := declare(t, b, "ring", warren.WithAlerts(warren.Alerts{Messages: 2, Policy: warren.Cycle}))
		c, err := q.Consume(t.Context(), warren.Prefetch(1))
		require.NoError(t, err)
		publishN(t, b, q, 7) // "0" to the consumer, 1..6 ready
		require.Equal(t, []string{"5", "6"}, browse(q))
		dropped := log.of(warren.EventDropped, "ring")
		require.Equal(t, []string{"1", "2", "3", "4"}, eventBodies(dropped))
		for _, e := range dropped {
			require.Equal(t, warren.ReasonMaxLen, e.Reason)
		}
		require.Equal(t, uint64(4), q.Stats().Dropped)
		d := receive(t, c, 1)
		require.Equal(t, "0", picture(d))
		require.NoError(t, d[0].Ack())
		require.Equal(t, "5", picture(receive(t, c, 1)))
	})
}

// Cycle on Bytes: ready bytes stay at most Bytes, the oldest ready dropped first.
func TestCycleBytesWithConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.WithAlerts(warren.Alerts{Bytes: 10, Policy: warren.Cycle}),
			warren.DeadLetter("", "dlq"))
		dlq := declare(t, b, "dlq")
		c, err := q.Consume(t.Context(), warren.Prefetch(1))
		require.NoError(t, err)
		for i := range 10 {
			publish(t, b, "q", fmt.Sprintf("b%03d", i)) // 4 bytes each
			require.LessOrEqual(t, q.Stats().Bytes, int64(10))
		}
		require.Equal(t, []string{"b008", "b009"}, browse(q), "two of four bytes fit in ten")
		require.Equal(t, int64(8), q.Stats().Bytes)
		require.Equal(t, []string{"b001", "b002", "b003", "b004", "b005", "b006", "b007"}, browse(dlq))
		for m := range dlq.Browse() {
			require.Equal(t, warren.ReasonMaxLen, m.Deaths()[0].Reason)
		}
		d := receive(t, c, 1)
		require.Equal(t, "b000", picture(d), "the outstanding one was not dropped")
		require.NoError(t, d[0].Ack())
	})
}

// ---------------------------------------------------------------------------------------------
// 3. The Delete policy.

// Crossing Messages (or Bytes) deletes a queue with the Delete policy: its consumers end with an
// error wrapping ErrQueueDeleted and ErrSlowConsumer that names the threshold, a running Serve
// returns it, a later Serve or Consume fails with it, the name is gone, every message it held is
// dropped with Reason queue-deleted, and publishers carry on.
func TestDeletePolicyOnCrossing(t *testing.T) {
	for _, tc := range []struct {
		name   warren.Reason
		alerts warren.Alerts
	}{
		{warren.AlertMessages, warren.Alerts{Messages: 3, Policy: warren.Delete}},
		{warren.AlertBytes, warren.Alerts{Bytes: 3, Policy: warren.Delete}},
	} {
		t.Run(string(tc.name), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				log := recordEvents(t, b)
				q := declare(t, b, "q", warren.WithAlerts(tc.alerts))
				_, err := b.DeclareExchange("fx", warren.ExchangeFanout)
				require.NoError(t, err)
				require.NoError(t, b.Bind("q", "fx", "", nil))

				c, err := q.Consume(t.Context(), warren.Prefetch(1), warren.ConsumerTag("plain"))
				require.NoError(t, err)
				served := make(chan error, 1)
				go func() {
					served <- q.Serve(t.Context(), func(ctx context.Context, d *warren.Delivery) error {
						<-ctx.Done() // a slow handler
						return context.Cause(ctx)
					}, warren.ConsumerTag("served"))
				}()
				synctest.Wait()
				publishN(t, b, q, 2) // "0" and "1": one to each consumer
				held := receive(t, c, 1)
				synctest.Wait() // the handler holds the other
				g, err := q.Get(t.Context())
				require.ErrorIs(t, err, warren.ErrEmpty)
				require.Nil(t, g)
				publish(t, b, "q", "2")
				g, err = q.Get(t.Context()) // held by a Get
				require.NoError(t, err)
				require.Equal(t, "2", string(g.Message.Body))
				publish(t, b, "q", "3")
				publish(t, b, "q", "4")
				require.Equal(t, 2, q.Len(), "below the threshold")
				require.False(t, isClosed(c.Done()))

				publish(t, b, "q", "5") // 3 ready (3 bytes): crosses
				synctest.Wait()

				// The consumers end.
				require.True(t, isClosed(c.Done()), "the consumer ended")
				_, open := <-c.Deliveries()
				require.False(t, open, "Deliveries closed")
				err = c.Err()
				require.ErrorIs(t, err, warren.ErrQueueDeleted)
				require.ErrorIs(t, err, warren.ErrSlowConsumer)
				require.ErrorIs(t, err, warren.ErrNotFound)
				require.Contains(t, err.Error(), tc.name, "the error says which threshold")
				select {
				case err := <-served:
					require.ErrorIs(t, err, warren.ErrQueueDeleted)
					require.ErrorIs(t, err, warren.ErrSlowConsumer)
				default:
					t.Fatal("Serve did not return")
				}
				err = q.Serve(t.Context(), func(context.Context, *warren.Delivery) error { return nil })
				require.ErrorIs(t, err, warren.ErrSlowConsumer, "a Serve on the deleted queue")
				require.ErrorIs(t, err, warren.ErrQueueDeleted)
				_, err = q.Consume(t.Context())
				require.ErrorIs(t, err, warren.ErrSlowConsumer)
				require.NoError(t, held[0].Ack(), "settling after the deletion: a no-op")
				require.NoError(t, g.Ack())

				// The queue is gone.
				_, err = b.Queue("q")
				require.ErrorIs(t, err, warren.ErrNotFound)
				deleted := log.of(warren.EventQueueDeleted, "q")
				require.Len(t, deleted, 1)
				require.Equal(t, warren.ReasonPolicy, deleted[0].Reason)
				require.ErrorIs(t, deleted[0].Err, warren.ErrSlowConsumer)
				require.Len(t, log.alerts(tc.name), 1)
				consumers := log.of(warren.EventConsumerDeleted, "q")
				require.Len(t, consumers, 2)
				for _, e := range consumers {
					require.ErrorIs(t, e.Err, warren.ErrSlowConsumer, e.Consumer)
				}

				// Every message it held, ready or unacked, dropped once.
				dropped := log.of(warren.EventDropped, "q")
				for _, e := range dropped {
					require.Equal(t, warren.ReasonQueueDeleted, e.Reason, string(e.Message.Body))
				}
				got := eventBodies(dropped)
				slices.Sort(got)
				require.Equal(t, []string{"0", "1", "2", "3", "4", "5"}, got)
				st := q.Stats()
				require.Zero(t, st.Ready)
				require.Zero(t, st.Unacked)
				require.Equal(t, uint64(6), st.Enqueued)
				require.Equal(t, uint64(6), st.Dropped, "every message that entered ended dropped")

				// A publisher carries on: its messages route nowhere.
				before := b.Stats().Unroutable
				for i := range 20 {
					require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("late")}))
					require.NoError(t, b.Publish(t.Context(), "fx", "", warren.Message{Body: []byte("late")}))
					err := b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("late")}, warren.Mandatory())
					require.ErrorIs(t, err, warren.ErrUnroutable, "publish %d", i)
				}
				require.Equal(t, before+60, b.Stats().Unroutable)
				require.NoError(t, b.WaitIdle(t.Context()))
			})
		})
	}
}

// Publishers racing the Delete policy's deletion neither hang nor fail, and every message the
// queue took ends with exactly one EventDropped (queue-deleted); one refused on arrival by the
// deleted queue has that event alone.
func TestDeletePolicyConcurrentPublishers(t *testing.T) {
	b := newBroker(t)
	log := recordEvents(t, b)
	q := declare(t, b, "q", warren.WithAlerts(warren.Alerts{Messages: 50, Policy: warren.Delete}))
	_, err := b.DeclareExchange("fx", warren.ExchangeFanout)
	require.NoError(t, err)
	require.NoError(t, b.Bind("q", "fx", "", nil))
	c, err := q.Consume(t.Context(), warren.Prefetch(5))
	require.NoError(t, err)

	var wg sync.WaitGroup
	errs := make(chan error, 8*300)
	for w := range 8 {
		wg.Go(func() {
			for i := range 300 {
				m := warren.Message{Body: fmt.Appendf(nil, "%d-%d", w, i)}
				if w%2 == 0 {
					errs <- b.Publish(context.Background(), "", "q", m)
				} else {
					errs <- b.Publish(context.Background(), "fx", "", m)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	<-c.Done()
	require.ErrorIs(t, c.Err(), warren.ErrSlowConsumer)
	_, err = b.Queue("q")
	require.ErrorIs(t, err, warren.ErrNotFound)
	require.NoError(t, b.WaitIdle(t.Context()))

	enqueued := map[*warren.Message]bool{}
	for _, e := range log.of(warren.EventEnqueued, "q") {
		enqueued[e.Message] = true
	}
	dropped := map[*warren.Message]int{}
	for _, e := range log.of(warren.EventDropped, "q") {
		require.Equal(t, warren.ReasonQueueDeleted, e.Reason)
		dropped[e.Message]++
	}
	for m := range enqueued {
		require.Equal(t, 1, dropped[m], "message %s: enqueued, then dropped once", m.Body)
	}
	for m, n := range dropped {
		require.Equal(t, 1, n, "message %s dropped once", m.Body)
	}
	require.GreaterOrEqual(t, len(enqueued), 50)
	require.Equal(t, uint64(len(enqueued)), q.Stats().Enqueued)
	require.Len(t, log.of(warren.EventQueueDeleted, "q"), 1)
}

// The Age threshold with the Delete policy deletes the queue on its timer, with no call into the
// broker.
func TestDeletePolicyOnAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		log := recordEvents(t, b)
		q := declare(t, b, "q", warren.WithAlerts(warren.Alerts{Age: 30 * time.Second, Policy: warren.Delete}))
		c, err := q.Consume(t.Context(), warren.Prefetch(1))
		require.NoError(t, err)
		publishN(t, b, q, 2) // "0" held, "1" ready
		time.Sleep(30 * time.Second)
		synctest.Wait()
		require.False(t, isClosed(c.Done()), "30s old is not over 30s")
		time.Sleep(time.Millisecond)
		synctest.Wait()

		require.True(t, isClosed(c.Done()), "the timer deleted the queue")
		err = c.Err()
		require.ErrorIs(t, err, warren.ErrQueueDeleted)
		require.ErrorIs(t, err, warren.ErrSlowConsumer)
		require.Contains(t, err.Error(), warren.AlertAge)
		deleted := log.of(warren.EventQueueDeleted, "q")
		require.Len(t, deleted, 1)
		require.Equal(t, warren.ReasonPolicy, deleted[0].Reason)
		dropped := log.of(warren.EventDropped, "q")
		require.ElementsMatch(t, []string{"0", "1"}, eventBodies(dropped))
		for _, e := range dropped {
			require.Equal(t, warren.ReasonQueueDeleted, e.Reason)
		}
		require.Len(t, log.alerts(warren.AlertAge), 1)
		_, err = b.Queue("q")
		require.ErrorIs(t, err, warren.ErrNotFound)
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("late")}))
	})
}

// A Get made with a context that never ends (context.Background) holds its message like any
// other: when the Delete policy deletes the queue, that message is dropped too, with its event.
func TestDeletePolicyDropsGetWithoutDone(t *testing.T) {
	b := newBroker(t)
	log := recordEvents(t, b)
	q := declare(t, b, "q", warren.WithAlerts(warren.Alerts{Messages: 2, Policy: warren.Delete}))
	publish(t, b, "q", "held")
	g, err := q.Get(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, q.Unacked())
	publish(t, b, "q", "a")
	publish(t, b, "q", "b") // 2 ready: deleted
	_, err = b.Queue("q")
	require.ErrorIs(t, err, warren.ErrNotFound)
	require.NoError(t, g.Ack(), "a no-op")

	dropped := log.of(warren.EventDropped, "q")
	require.ElementsMatch(t, []string{"held", "a", "b"}, eventBodies(dropped),
		"every message the queue held, the Get's included, is dropped with an event")
	st := q.Stats()
	require.Equal(t, uint64(3), st.Enqueued)
	require.Equal(t, uint64(3), st.Dropped, "every message that entered ended somewhere")
}

// Without a listener the Delete policy still deletes, and an alert is still logged as a warning.
func TestAlertWithoutListener(t *testing.T) {
	var log logBuffer
	b := warren.New(warren.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	t.Cleanup(func() { b.Close() })
	declare(t, b, "alerting", warren.WithAlerts(warren.Alerts{Messages: 2}))
	q := declare(t, b, "doomed", warren.WithAlerts(warren.Alerts{Messages: 2, Policy: warren.Delete}))
	c, err := q.Consume(t.Context(), warren.Prefetch(1))
	require.NoError(t, err)
	for range 3 {
		publish(t, b, "alerting", "m")
		publish(t, b, "doomed", "m")
	}
	_, err = b.Queue("doomed")
	require.ErrorIs(t, err, warren.ErrNotFound)
	<-c.Done()
	require.ErrorIs(t, c.Err(), warren.ErrSlowConsumer)
	out := log.String()
	require.Contains(t, out, "level=WARN")
	require.Contains(t, out, "queue=alerting")
	require.Contains(t, out, "threshold=messages")
}

// MessageSize alerts but never deletes, even with the Delete policy.
func TestDeletePolicyIgnoresMessageSize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		log := recordEvents(t, b)
		q := declare(t, b, "q", warren.WithAlerts(warren.Alerts{MessageSize: 4, Messages: 10, Policy: warren.Delete}))
		publish(t, b, "q", "large body")
		require.Len(t, log.alerts(warren.AlertMessageSize), 1)
		_, err := b.Queue("q")
		require.NoError(t, err)
		require.Equal(t, 1, q.Len())
	})
}

// ---------------------------------------------------------------------------------------------
// 4. Stats.

// Each counter counts its own path, and the gauges follow the queue.
func TestStatsCounters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.DeadLetter("", "dlq"))
		dlq := declare(t, b, "dlq")
		q2 := declare(t, b, "q2") // no dead-letter exchange

		require.Equal(t, warren.QueueStats{Queue: "q"}, q.Stats(), "a new queue")
		publishN(t, b, q, 4) // "0".."3"
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("ttl!"), Expiration: "1000"}))
		st := q.Stats()
		require.Equal(t, 5, st.Ready)
		require.Equal(t, int64(8), st.Bytes)
		require.Equal(t, uint64(5), st.Enqueued)

		require.Equal(t, "0", take(t, q))
		d, err := q.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, d.Nack())
		st = q.Stats()
		require.Equal(t, uint64(1), st.Acked)
		require.Equal(t, uint64(2), st.Delivered)
		require.Equal(t, uint64(1), st.Nacked)
		require.Equal(t, uint64(0), st.Redelivered)
		require.Equal(t, "1", take(t, q))
		st = q.Stats()
		require.Equal(t, uint64(3), st.Delivered)
		require.Equal(t, uint64(1), st.Redelivered)
		require.Equal(t, uint64(2), st.Acked)

		d, err = q.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, d.Reject())
		st = q.Stats()
		require.Equal(t, uint64(1), st.Rejected)
		require.Equal(t, uint64(1), st.DeadLettered)
		require.Equal(t, uint64(0), st.Dropped)

		held, err := q.Get(t.Context()) // "3"
		require.NoError(t, err)
		st = q.Stats()
		require.Equal(t, 1, st.Ready)
		require.Equal(t, 1, st.Unacked)
		require.Equal(t, int64(4), st.Bytes)

		time.Sleep(2 * time.Second)
		synctest.Wait()
		st = q.Stats()
		require.Equal(t, uint64(1), st.Expired)
		require.Equal(t, uint64(2), st.DeadLettered, "expired and dead-lettered")
		require.Zero(t, st.Ready)
		require.Zero(t, st.Bytes)
		require.Zero(t, st.OldestAge, "none ready")

		require.NoError(t, held.NackWithDelay(time.Minute))
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("later")}, warren.DeliverAfter(time.Minute)))
		st = q.Stats()
		require.Equal(t, 2, st.Delayed)
		require.Equal(t, uint64(2), st.Nacked, "NackWithDelay is a nack")
		require.Zero(t, st.Unacked)
		require.Zero(t, st.Ready)
		require.Equal(t, uint64(6), st.Enqueued)

		ctx, cancel := context.WithCancel(t.Context())
		c, err := q.Consume(ctx, warren.Prefetch(10))
		require.NoError(t, err)
		require.Equal(t, 1, q.Stats().Consumers)
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		ds := receive(t, c, 2)
		require.Equal(t, "3* later", picture(ds))
		for _, d := range ds {
			require.NoError(t, d.Ack())
		}
		require.NoError(t, c.Cancel())
		cancel()
		synctest.Wait()
		publishN(t, b, q, 3)
		n, err := q.Purge()
		require.NoError(t, err)
		require.Equal(t, 3, n)

		require.Equal(t, warren.QueueStats{
			Queue: "q", Enqueued: 9, Delivered: 7, Redelivered: 2, Acked: 4, Nacked: 2, Rejected: 1,
			Expired: 1, DeadLettered: 2, Dropped: 3,
		}, q.Stats())
		require.Equal(t, uint64(2), dlq.Stats().Enqueued)
		require.Equal(t, 2, dlq.Stats().Ready)

		// Without a dead-letter exchange: an expiry is Expired only, a reject is Dropped.
		require.NoError(t, b.Publish(t.Context(), "", "q2", warren.Message{Body: []byte("e"), Expiration: "1000"}))
		publish(t, b, "q2", "r")
		time.Sleep(2 * time.Second)
		synctest.Wait()
		d, err = q2.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, d.Reject())
		require.Equal(t, warren.QueueStats{
			Queue: "q2", Enqueued: 2, Delivered: 1, Rejected: 1, Expired: 1, Dropped: 1,
		}, q2.Stats())

		// Auto-acked Gets and AutoAck consumers' deliveries count as delivered and acked.
		publish(t, b, "q2", "a")
		_, err = q2.Get(t.Context(), warren.AutoAck())
		require.NoError(t, err)
		st = q2.Stats()
		require.Equal(t, uint64(2), st.Delivered)
		require.Equal(t, uint64(1), st.Acked)
		auto, err := q2.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(5))
		require.NoError(t, err)
		publishN(t, b, q2, 2)
		synctest.Wait()
		require.Len(t, receive(t, auto, 2), 2)
		require.NoError(t, auto.Cancel())
		synctest.Wait()
		st = q2.Stats()
		require.Equal(t, uint64(4), st.Delivered)
		require.Equal(t, uint64(3), st.Acked)

		// NackUpTo counts each delivery it returns.
		q3 := declare(t, b, "q3", warren.DeadLetter("missing", ""))
		c3, err := q3.Consume(t.Context(), warren.Prefetch(3))
		require.NoError(t, err)
		publishN(t, b, q3, 3)
		ds = receive(t, c3, 3)
		require.NoError(t, c3.NackUpTo(ds[2].DeliveryTag)) // all three back, and out again
		st = q3.Stats()
		require.Equal(t, uint64(3), st.Nacked)
		require.Equal(t, uint64(6), st.Delivered)
		require.Equal(t, uint64(3), st.Redelivered)
		// A dead letter whose exchange is missing is dropped, not dead-lettered.
		ds = receive(t, c3, 3)
		require.NoError(t, ds[0].Reject())
		st = q3.Stats()
		require.Equal(t, uint64(1), st.Rejected)
		require.Equal(t, uint64(0), st.DeadLettered)
		require.Equal(t, uint64(1), st.Dropped)
		require.NoError(t, ds[1].Ack())
		require.Equal(t, uint64(1), q3.Stats().Acked)
	})
}

// OldestAge is exact for a message that arrived into an empty queue, follows the oldest ready
// message, and is 0 when none is ready.
func TestStatsOldestAgeExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		require.Zero(t, q.Stats().OldestAge)
		publish(t, b, "q", "a")
		time.Sleep(5 * time.Second)
		require.Equal(t, 5*time.Second, q.Stats().OldestAge)
		publish(t, b, "q", "b")
		time.Sleep(2 * time.Second)
		require.Equal(t, 7*time.Second, q.Stats().OldestAge, "still the first one's age")
		require.Equal(t, "a", take(t, q))
		age := q.Stats().OldestAge
		require.GreaterOrEqual(t, age, 2*time.Second, "b has waited 2s")
		require.LessOrEqual(t, age, 7*time.Second)
		require.Equal(t, "b", take(t, q))
		require.Zero(t, q.Stats().OldestAge, "0 when empty")
		publish(t, b, "q", "c")
		time.Sleep(time.Second)
		require.Equal(t, time.Second, q.Stats().OldestAge, "exact again after the queue emptied")
	})
}

// With a consumer taking the first of several messages, OldestAge never under-estimates the
// oldest ready message's age; with an age threshold it is exact for every message.
func TestStatsOldestAgeWithConsumer(t *testing.T) {
	for _, withAge := range []bool{false, true} {
		t.Run(fmt.Sprintf("ageThreshold=%t", withAge), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				var opts []warren.QueueOption
				if withAge {
					opts = append(opts, warren.WithAlerts(warren.Alerts{Age: 24 * time.Hour}))
				}
				q := declare(t, b, "q", opts...)
				c, err := q.Consume(t.Context(), warren.Prefetch(1))
				require.NoError(t, err)
				start := time.Now()
				arrived := map[string]time.Time{}
				for i := range 4 {
					body := strconv.Itoa(i)
					arrived[body] = time.Now()
					publish(t, b, "q", body)
					time.Sleep(time.Duration(i+1) * time.Second)
				}
				check := func() {
					t.Helper()
					ready := browse(q)
					age := q.Stats().OldestAge
					if len(ready) == 0 {
						require.Zero(t, age)
						return
					}
					want := time.Since(arrived[ready[0]])
					require.GreaterOrEqual(t, age, want, "oldest ready %q", ready[0])
					require.LessOrEqual(t, age, time.Since(start))
					if withAge {
						require.Equal(t, want, age, "exact with an age threshold")
					}
				}
				check()
				for range 4 {
					d := receive(t, c, 1)
					time.Sleep(time.Second)
					check()
					require.NoError(t, d[0].Ack())
					check()
				}
				require.Zero(t, q.Stats().OldestAge)
			})
		})
	}
}

// Random arrivals, consumer takes and Gets over many more than 64 sequence ids: OldestAge never
// under-estimates the true age of the oldest ready message, is exact with an age threshold, and
// is 0 when nothing is ready.
func TestStatsOldestAgeRandom(t *testing.T) {
	seed := testSeed(t, "WARREN_STATS_SEED")
	for _, withAge := range []bool{false, true} {
		t.Run(fmt.Sprintf("ageThreshold=%t", withAge), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 5))
				b := newBroker(t)
				var opts []warren.QueueOption
				if withAge {
					opts = append(opts, warren.WithAlerts(warren.Alerts{Age: 1000 * time.Hour}))
				}
				q := declare(t, b, "q", opts...)
				c, err := q.Consume(t.Context(), warren.Prefetch(3))
				require.NoError(t, err)
				arrived := map[string]time.Time{}
				var held []*warren.Delivery
				next := 0
				for step := range 1500 {
					switch r := rng.IntN(10); {
					case r < 5:
						body := strconv.Itoa(next)
						next++
						arrived[body] = time.Now()
						publish(t, b, "q", body)
					case r < 7:
					recv:
						for {
							select {
							case d := <-c.Deliveries():
								held = append(held, d)
							default:
								break recv
							}
						}
						if len(held) > 0 {
							require.NoError(t, held[0].Ack())
							held = held[1:]
						}
					case r < 8:
						if d, err := q.Get(t.Context()); err == nil {
							require.NoError(t, d.Ack())
						}
					default:
						time.Sleep(time.Duration(rng.IntN(3000)) * time.Millisecond)
					}
					ready := browse(q)
					age := q.Stats().OldestAge
					if len(ready) == 0 {
						require.Zero(t, age, "step %d", step)
						continue
					}
					want := time.Since(arrived[ready[0]])
					require.GreaterOrEqual(t, age, want, "step %d: oldest ready %q", step, ready[0])
					if withAge {
						require.Equal(t, want, age, "step %d: exact with an age threshold", step)
					}
				}
			})
		})
	}
}

// A message published with DeliverAfter into an empty queue is, once visible, the oldest ready
// message: OldestAge must not report 0 (nothing ready) for it, nor under-estimate its age, and an
// age threshold must see it.
func TestStatsOldestAgeDelayedMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		log := recordEvents(t, b)
		q := declare(t, b, "q", warren.WithAlerts(warren.Alerts{Age: 10 * time.Second}))
		publish(t, b, "q", "later", warren.DeliverAfter(time.Minute))
		time.Sleep(time.Minute + 5*time.Second)
		synctest.Wait()
		require.Equal(t, []string{"later"}, browse(q))
		assert.GreaterOrEqual(t, q.Stats().OldestAge, 5*time.Second,
			"ready for 5s (in the queue for 65s), yet OldestAge says nothing is ready")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		assert.Len(t, log.alerts(warren.AlertAge), 1, "the message has been ready for 15s, over Age 10s")
	})
}

// b.Stats lists every queue sorted by name, counts the exchanges (6 predeclared) and the
// publishes that reached no queue.
func TestStatsBroker(t *testing.T) {
	b := newBroker(t)
	st := b.Stats()
	require.Equal(t, 6, st.Exchanges, "the predeclared exchanges")
	require.Empty(t, st.Queues)
	require.Zero(t, st.Unroutable)

	for _, name := range []string{"zeta", "alpha", "mid", "beta"} {
		declare(t, b, name)
	}
	_, err := b.DeclareExchange("x", warren.ExchangeDirect)
	require.NoError(t, err)
	require.NoError(t, b.Bind("mid", "x", "k", nil))
	publish(t, b, "alpha", "1")
	publish(t, b, "alpha", "2")
	require.NoError(t, b.Publish(t.Context(), "x", "k", warren.Message{Body: []byte("3")}))

	require.NoError(t, b.Publish(t.Context(), "", "nowhere", warren.Message{Body: []byte("u")}))
	require.NoError(t, b.Publish(t.Context(), "x", "other", warren.Message{Body: []byte("u")}))
	require.ErrorIs(t, b.Publish(t.Context(), "amq.direct", "k", warren.Message{Body: []byte("u")}, warren.Mandatory()),
		warren.ErrUnroutable)

	st = b.Stats()
	require.Equal(t, 7, st.Exchanges)
	require.Equal(t, uint64(3), st.Unroutable, "three publishes reached no queue")
	var names []string
	for _, qs := range st.Queues {
		names = append(names, qs.Queue)
	}
	require.Equal(t, []string{"alpha", "beta", "mid", "zeta"}, names)
	require.Equal(t, 2, st.Queues[0].Ready)
	require.Equal(t, uint64(2), st.Queues[0].Enqueued)
	require.Equal(t, 1, st.Queues[2].Ready)
	require.Zero(t, st.Queues[1].Ready)

	require.NoError(t, b.DeleteExchange("x"))
	require.Equal(t, 6, b.Stats().Exchanges)
}

// ---------------------------------------------------------------------------------------------
// 5. Outstanding.

// Outstanding lists the consumers' deliveries, received or buffered, consumer by consumer in the
// order they started and each in tag order, then the Gets in tag order; settled ones disappear.
func TestOutstanding(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	publishN(t, b, q, 12) // "0".."11"

	type row struct {
		Body, Consumer string
		Tag            uint64
		Redelivered    bool
		Count          int
	}
	list := func() []row {
		var out []row
		for d := range q.Outstanding() {
			out = append(out, row{string(d.Message.Body), d.ConsumerTag, d.DeliveryTag, d.Redelivered, d.DeliveryCount})
		}
		return out
	}
	require.Empty(t, list())

	g, err := q.Get(t.Context()) // "0", tag 1
	require.NoError(t, err)
	require.NoError(t, g.Nack())
	g0, err := q.Get(t.Context()) // "0" again, tag 2
	require.NoError(t, err)
	zed, err := q.Consume(t.Context(), warren.ConsumerTag("zed"), warren.Prefetch(3)) // "1" "2" "3"
	require.NoError(t, err)
	abc, err := q.Consume(t.Context(), warren.ConsumerTag("abc"), warren.Prefetch(2)) // "4" "5"
	require.NoError(t, err)
	g6, err := q.Get(t.Context()) // tag 3
	require.NoError(t, err)
	g7, err := q.Get(t.Context()) // tag 4
	require.NoError(t, err)
	g8, err := q.Get(t.Context()) // tag 5
	require.NoError(t, err)
	require.Equal(t, []string{"6", "7", "8"}, []string{string(g6.Message.Body), string(g7.Message.Body), string(g8.Message.Body)})
	zd := receive(t, zed, 1) // "1" received; "2" and "3" buffered

	require.Equal(t, []row{
		{"1", "zed", 1, false, 0}, {"2", "zed", 2, false, 0}, {"3", "zed", 3, false, 0},
		{"4", "abc", 1, false, 0}, {"5", "abc", 2, false, 0},
		{"0", "", 2, true, 1}, {"6", "", 3, false, 0}, {"7", "", 4, false, 0}, {"8", "", 5, false, 0},
	}, list())
	require.Equal(t, q.Unacked(), len(list()))
	for d := range q.Outstanding() {
		if d.ConsumerTag == "zed" && d.DeliveryTag == 1 {
			require.Same(t, zd[0].Message, d.Message, "the message itself, shared")
		}
	}

	// Settle some: they disappear; a nacked one comes back redelivered under a new tag.
	require.NoError(t, zd[0].Ack())  // zed then takes "9" (tag 4)
	require.NoError(t, g0.Ack())     // gone
	require.NoError(t, g7.Ack())     // gone
	zd = receive(t, zed, 1)          // "2"
	require.NoError(t, zd[0].Nack()) // back at the head: zed takes it again (tag 5), abc has no credit
	require.Equal(t, "3", picture(receive(t, zed, 1)))
	require.Equal(t, []row{
		{"3", "zed", 3, false, 0}, {"9", "zed", 4, false, 0}, {"2", "zed", 5, true, 1},
		{"4", "abc", 1, false, 0}, {"5", "abc", 2, false, 0},
		{"6", "", 3, false, 0}, {"8", "", 5, false, 0},
	}, list())
	require.Equal(t, q.Unacked(), len(list()))

	zr := receive(t, zed, 2)        // "9" (tag 4) and "2" (tag 5)
	require.NoError(t, zr[0].Ack()) // settled between two outstanding ones; zed takes "10" (tag 6)
	require.Equal(t, "4 5", picture(receive(t, abc, 2)))
	require.NoError(t, abc.AckUpTo(0)) // abc then takes "11" (tag 3)
	require.NoError(t, g6.Ack())
	require.NoError(t, g8.Ack())
	rows := list()
	require.Equal(t, []row{
		{"3", "zed", 3, false, 0}, {"2", "zed", 5, true, 1}, {"10", "zed", 6, false, 0},
		{"11", "abc", 3, false, 0},
	}, rows, "zed's tag 4, abc's first two and the Gets settled")
	require.Equal(t, q.Unacked(), len(rows))

	// Many Gets, some settled: the rest in tag order.
	gq := declare(t, b, "gets")
	publishN(t, b, gq, 40)
	var want []uint64
	for i := range 40 {
		d, err := gq.Get(t.Context())
		require.NoError(t, err)
		if i%7 == 3 {
			require.NoError(t, d.Ack())
			continue
		}
		want = append(want, d.DeliveryTag)
	}
	var tags []uint64
	for d := range gq.Outstanding() {
		require.Empty(t, d.ConsumerTag)
		tags = append(tags, d.DeliveryTag)
	}
	require.Equal(t, want, tags)
}

// A Get made with a context that never ends is outstanding like any other Get: Outstanding
// lists it, as Unacked counts it.
func TestOutstandingGetWithoutDone(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	publishN(t, b, q, 3)
	g1, err := q.Get(t.Context())
	require.NoError(t, err)
	g2, err := q.Get(context.Background())
	require.NoError(t, err)
	g3, err := q.Get(t.Context())
	require.NoError(t, err)
	require.Equal(t, 3, q.Unacked())
	var tags []uint64
	for d := range q.Outstanding() {
		tags = append(tags, d.DeliveryTag)
	}
	require.Equal(t, []uint64{g1.DeliveryTag, g2.DeliveryTag, g3.DeliveryTag}, tags,
		"the Get made with context.Background is outstanding too")
}

// ---------------------------------------------------------------------------------------------
// 6. WaitIdle's edge cases.

// An idle broker, a queue with no consumers, and deliveries held by a plain consumer (no ack
// timeout) or a Get do not make WaitIdle wait.
func TestWaitIdleReturnsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		start := time.Now()
		require.NoError(t, b.WaitIdle(t.Context()), "a new broker")
		q := declare(t, b, "q")
		publishN(t, b, q, 5)
		require.NoError(t, b.WaitIdle(t.Context()), "ready messages, no consumer")
		c, err := q.Consume(t.Context(), warren.Prefetch(2))
		require.NoError(t, err)
		held := receive(t, c, 1) // one received, one buffered
		_, err = q.Get(t.Context())
		require.NoError(t, err)
		require.Equal(t, 2, q.Len())

		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		require.NoError(t, b.WaitIdle(ctx), "deliveries held by a plain consumer and a Get")
		require.Zero(t, time.Since(start), "no virtual time passed")
		require.Equal(t, 3, q.Unacked())
		require.NoError(t, held[0].Ack())
	})
}

// WaitIdle waits for a Serve pool to handle everything.
func TestWaitIdleServePool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		var mu sync.Mutex
		var handled []string
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() {
			done <- q.Serve(ctx, func(ctx context.Context, d *warren.Delivery) error {
				time.Sleep(10 * time.Second) // slow work
				mu.Lock()
				handled = append(handled, string(d.Message.Body))
				mu.Unlock()
				return nil
			}, warren.Workers(2))
		}()
		synctest.Wait()
		start := time.Now()
		publishN(t, b, q, 5)
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Equal(t, 30*time.Second, time.Since(start), "5 messages, 2 workers, 10s each")
		mu.Lock()
		require.ElementsMatch(t, []string{"0", "1", "2", "3", "4"}, handled)
		mu.Unlock()
		st := q.Stats()
		require.Equal(t, uint64(5), st.Acked)
		require.Zero(t, st.Unacked)
		cancel()
		require.NoError(t, <-done)
	})
}

// WaitIdle waits through NackWithDelay, DeliverAfter and TTLs in virtual time, and returns
// ctx.Err() when ctx ends first.
func TestWaitIdleTimers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		dlq := declare(t, b, "dlq")
		ttl := declare(t, b, "ttl", warren.DeadLetter("", "dlq"))

		start := time.Now()
		publish(t, b, "q", "n")
		d, err := q.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, d.NackWithDelay(time.Hour))
		require.Zero(t, q.Len())
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Equal(t, time.Hour, time.Since(start), "the nack's delay")
		require.Equal(t, 1, q.Len())

		start = time.Now()
		publish(t, b, "q", "a", warren.DeliverAfter(30*time.Minute))
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Equal(t, 30*time.Minute, time.Since(start), "the publish's delay")
		require.Equal(t, []string{"n", "a"}, browse(q))

		start = time.Now()
		require.NoError(t, b.Publish(t.Context(), "", "ttl", warren.Message{Body: []byte("t"), Expiration: "5000"}))
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Equal(t, 5*time.Second, time.Since(start), "the TTL")
		require.Zero(t, ttl.Len())
		require.Equal(t, []string{"t"}, browse(dlq), "expired and dead-lettered before WaitIdle returned")

		// ctx ends first.
		start = time.Now()
		publish(t, b, "q", "slow", warren.DeliverAfter(time.Hour))
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		require.ErrorIs(t, b.WaitIdle(ctx), context.DeadlineExceeded)
		require.Equal(t, time.Minute, time.Since(start))
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Equal(t, time.Hour, time.Since(start))
	})
}

// A plain consumer with an ack timeout keeps the broker busy while it holds a delivery: WaitIdle
// returns once the timeout has ended the consumer and the delivery is back.
func TestWaitIdleAckTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		c, err := q.Consume(t.Context(), warren.AckTimeout(10*time.Second), warren.Prefetch(1))
		require.NoError(t, err)
		start := time.Now()
		publish(t, b, "q", "m")
		d := receive(t, c, 1)
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Equal(t, 10*time.Second, time.Since(start), "until the ack timeout")
		require.ErrorIs(t, c.Err(), warren.ErrAckTimeout)
		require.Equal(t, 1, q.Len(), "the delivery is back")
		require.ErrorIs(t, d[0].Ack(), warren.ErrAlreadySettled)
	})
}

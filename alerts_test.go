package warren_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of alerts (Alerts, WithAlerts; in stats.go, alerts.go to come): the thresholds —
// Messages, Bytes, MessageSize, Age — fire once per crossing with the repeat gap respected, and
// the policies Alert, Cycle and Delete act on a crossing. Stats are in stats_test.go,
// Outstanding and WaitIdle in idle_test.go.

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

// TestCycleBytesAlerts: under Cycle the crossing is seen before the ring drops back within the
// limit, so the Bytes threshold alerts (it used to be checked after the drop, and never fired).
func TestCycleBytesAlerts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		r := recordEvents(t, b)
		q := declare(t, b, "q", warren.WithAlerts(warren.Alerts{Bytes: 10, Policy: warren.Cycle}))
		for range 10 {
			require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("abcd")}))
		}
		st := q.Stats()
		require.LessOrEqual(t, st.Bytes, int64(10))
		require.Equal(t, uint64(8), st.Dropped)
		alerts := r.alerts(warren.AlertBytes)
		require.Len(t, alerts, 1, "one crossing within the repeat gap")
		require.Equal(t, int64(12), alerts[0].Value, "the bytes the ring is about to drop back from")
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
					served <- q.Serve(t.Context(), func(ctx context.Context, d warren.Delivery) error {
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
				require.Zero(t, g)
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
				err = q.Serve(t.Context(), func(context.Context, warren.Delivery) error { return nil })
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

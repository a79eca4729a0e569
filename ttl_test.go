package warren_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of expiry (ttl.go): per-message and per-queue message TTLs, expiry at the deadline
// wherever the message is, what happens to held messages, huge durations, and queue expiry
// (x-expires). The arguments' validation is in arguments_test.go.

// TestExpiryOfReadyAndHeldMessages: five messages with a per-message TTL into main; a consumer
// takes 0,1,2 and holds them past the TTL; 3 and 4 are dead-lettered at their deadline; then the
// consumer's context ends; dead holds 3,4,0,1,2, each with one x-death entry.
func TestExpiryOfReadyAndHeldMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		main, dead := deadTopology(t, b)
		ctx, cancel := context.WithCancel(t.Context())
		c, err := main.Consume(ctx, warren.Prefetch(3))
		require.NoError(t, err)
		start := time.Now()
		for i := range 5 {
			require.NoError(t, b.Publish(t.Context(), "", "main", warren.Message{
				Body: fmt.Append(nil, i), Expiration: "1000",
			}))
		}
		require.Equal(t, "0 1 2", bodies(receive(t, c, 3)))

		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		require.Equal(t, 0, dead.Len(), "nothing expires before its deadline")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		require.Equal(t, 2, dead.Len(), "3 and 4 dead-lettered at their deadline")
		require.Equal(t, 0, main.Len())
		require.Equal(t, time.Second, time.Since(start))

		time.Sleep(time.Minute) // held far past the TTL: nothing happens to unacked messages
		synctest.Wait()
		require.Equal(t, 2, dead.Len())
		cancel()
		<-c.Done()

		ds := getAll(t, dead)
		require.Equal(t, "3 4 0 1 2", bodies(ds))
		for _, d := range ds {
			deaths := xDeath(t, d)
			require.Len(t, deaths, 1, "%s", d.Message.Body)
			x := deaths[0]
			require.Equal(t, "main", x["queue"])
			require.Equal(t, "expired", x["reason"])
			require.Equal(t, int64(1), x["count"])
			require.Equal(t, "", x["exchange"], "published through the default exchange")
			require.Equal(t, []any{"main"}, x["routing-keys"])
			require.Equal(t, "1000", x["original-expiration"])
			require.Empty(t, d.Message.Expiration, "the dead-lettered copy has no expiration (R4.6)")
			require.Equal(t, "e-dead", d.Exchange)
			require.False(t, d.Redelivered, "a dead-lettered copy is a new message in its queue (R1.9)")
			require.Equal(t, "expired", d.Message.Headers["x-first-death-reason"])
		}
		require.Equal(t, 0, main.Len())
		require.Equal(t, 0, main.Unacked())
	})
}

// TestPreciseExpiry: a message expires at its deadline wherever it is in the queue, not only at
// the head (a deliberate difference from RabbitMQ's classic queues, R3.4).
func TestPreciseExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		main, dead := deadTopology(t, b)
		require.NoError(t, b.Publish(t.Context(), "", "main", warren.Message{Body: []byte("hour"), Expiration: "3600000"}))
		require.NoError(t, b.Publish(t.Context(), "", "main", warren.Message{Body: []byte("second"), Expiration: "1000"}))
		start := time.Now()
		time.Sleep(time.Second)
		synctest.Wait()
		require.Equal(t, "second", bodies(getAll(t, dead)))
		require.Equal(t, time.Second, time.Since(start))
		require.Equal(t, 1, main.Len())
		time.Sleep(time.Hour)
		synctest.Wait()
		require.Equal(t, "hour", bodies(getAll(t, dead)))
		require.Equal(t, 0, main.Len())
	})
}

// TestTTLLowerWins: the queue TTL and the message TTL, whichever is lower (R3.3).
func TestTTLLowerWins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		main, dead := deadTopology(t, b, warren.MessageTTL(2*time.Second))
		require.NoError(t, b.Publish(t.Context(), "", "main", warren.Message{Body: []byte("msg-1s"), Expiration: "1000"}))
		require.NoError(t, b.Publish(t.Context(), "", "main", warren.Message{Body: []byte("msg-5s"), Expiration: "5000"}))
		require.NoError(t, b.Publish(t.Context(), "", "main", warren.Message{Body: []byte("queue-2s")}))
		time.Sleep(time.Second)
		synctest.Wait()
		require.Equal(t, "msg-1s", bodies(getAll(t, dead)))
		time.Sleep(time.Second)
		synctest.Wait()
		ds := getAll(t, dead)
		require.Equal(t, "msg-5s queue-2s", bodies(ds))
		require.Equal(t, "5000", xDeath(t, ds[0])[0]["original-expiration"])
		require.NotContains(t, xDeath(t, ds[1])[0], "original-expiration", "TTL from the queue only")
		require.Equal(t, 0, main.Len())
	})
}

// TestDeadlineSurvivesRequeue: the deadline is fixed at enqueue; a nack does not renew it, and a
// message whose deadline passed while it was unacked expires when it comes back (R3.3, R3.6).
func TestDeadlineSurvivesRequeue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		main, dead := deadTopology(t, b, warren.MessageTTL(time.Second))
		publishN(t, b, main, 2)
		d0, err := main.Get(t.Context())
		require.NoError(t, err)
		time.Sleep(500 * time.Millisecond)
		require.NoError(t, d0.Nack())
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		require.Equal(t, "0 1", bodies(getAll(t, dead)), "the nacked message kept its deadline")

		publishN(t, b, main, 1)
		d, err := main.Get(t.Context())
		require.NoError(t, err)
		time.Sleep(2 * time.Second) // expires while unacked: nothing happens yet
		synctest.Wait()
		require.Equal(t, 0, dead.Len())
		require.NoError(t, d.Nack())
		require.Equal(t, 0, main.Len(), "expired on return instead of being redelivered")
		require.Equal(t, "0", bodies(getAll(t, dead)))
	})
}

// TestAckAfterDeadline: a consumer holding a message past its deadline may still ack it (R3.6).
func TestAckAfterDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		main, dead := deadTopology(t, b, warren.MessageTTL(time.Second))
		publishN(t, b, main, 1)
		d, err := main.Get(t.Context())
		require.NoError(t, err)
		time.Sleep(time.Hour)
		require.NoError(t, d.Ack())
		synctest.Wait()
		require.Equal(t, 0, dead.Len())
	})
}

// TestTTLZero: a message with TTL 0 is delivered only if a consumer can take it as it arrives;
// else it expires at once (R3.5).
func TestTTLZero(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []warren.QueueOption
		exp  string
	}{
		{"queue TTL 0", []warren.QueueOption{warren.MessageTTL(0)}, ""},
		{"expiration 0", nil, "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				main, dead := deadTopology(t, b, tc.opts...)
				require.NoError(t, b.Publish(t.Context(), "", "main", warren.Message{Body: []byte("nobody"), Expiration: tc.exp}))
				require.Equal(t, 0, main.Len())
				require.Equal(t, "nobody", bodies(getAll(t, dead)))

				c, err := main.Consume(t.Context(), warren.Prefetch(1))
				require.NoError(t, err)
				require.NoError(t, b.Publish(t.Context(), "", "main", warren.Message{Body: []byte("taken"), Expiration: tc.exp}))
				require.NoError(t, b.Publish(t.Context(), "", "main", warren.Message{Body: []byte("no credit"), Expiration: tc.exp}))
				ds := receive(t, c, 1)
				require.Equal(t, "taken", bodies(ds))
				require.Equal(t, "no credit", bodies(getAll(t, dead)))
				require.NoError(t, ds[0].Nack(), "a TTL-0 message that comes back expires (R3.5)")
				require.Equal(t, "taken", bodies(getAll(t, dead)))
				require.Equal(t, 0, main.Len())
			})
		})
	}
}

// TestExpiredIsNeverDelivered: a message whose deadline passed is not handed out even if the
// timer has not run yet.
func TestExpiredIsNeverDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		main, dead := deadTopology(t, b, warren.MessageTTL(time.Second))
		publishN(t, b, main, 3)
		time.Sleep(2 * time.Second) // no synctest.Wait: the timer goroutine may not have run
		_, err := main.Get(t.Context())
		require.ErrorIs(t, err, warren.ErrEmpty)
		synctest.Wait()
		require.Equal(t, "0 1 2", bodies(getAll(t, dead)), "in queue order")
	})
}

// TestExpiryWithoutDeadLetterExchangeDrops: no DLX, the message is dropped.
func TestExpiryWithoutDeadLetterExchangeDrops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.MessageTTL(time.Second))
		publishN(t, b, q, 2)
		time.Sleep(time.Second)
		synctest.Wait()
		require.Equal(t, 0, q.Len())
	})
}

func TestInvalidExpiration(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	for _, exp := range []string{"foobar", "10000foobar", "-1", "1.5", " 1", "4294967296", "+5"} {
		err := b.Publish(t.Context(), "", "q", warren.Message{Expiration: exp})
		require.ErrorIs(t, err, warren.ErrPreconditionFailed, "Expiration %q", exp)
	}
	require.Equal(t, 0, q.Len(), "an invalid expiration enqueues nothing")
	require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Expiration: "4294967295"}))
}

// TestTTLZeroToAutoAckConsumer: a waiting AutoAck consumer can take a TTL-0 message as it
// arrives, so it gets it (R3.5). (A regression test: its feeder only looked after the message
// had already expired.)
func TestTTLZeroToAutoAckConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		main, dead := deadTopology(t, b)
		c, err := main.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(10))
		require.NoError(t, err)
		for i := range 3 {
			synctest.Wait() // the feeder is waiting
			require.NoError(t, b.Publish(t.Context(), "", "main", warren.Message{Body: fmt.Append(nil, i), Expiration: "0"}))
		}
		synctest.Wait()
		require.Equal(t, "0 1 2", bodies(receive(t, c, 3)))
		require.Equal(t, 0, dead.Len())
	})
}

// TestExpireAfter: a per-message TTL given as a duration sets the Expiration property, in
// milliseconds, and expires the message as the property would; a duration RabbitMQ's property
// cannot carry is refused.
func TestExpireAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		dlq := declare(t, b, "dlq")
		q := declare(t, b, "q", warren.DeadLetter("", "dlq"))
		start := time.Now()
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("a"), Expiration: "60000"},
			warren.ExpireAfter(20*time.Millisecond)))
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("b")}, warren.ExpireAfter(time.Hour)))
		var first []string
		for m := range q.Browse() {
			first = append(first, m.Expiration)
		}
		require.Equal(t, []string{"20", "3600000"}, first, "the option sets Expiration, replacing the message's")
		d, err := dlq.Get(t.Context()) // nothing yet
		require.ErrorIs(t, err, warren.ErrEmpty, "%v", d)
		time.Sleep(20 * time.Millisecond)
		synctest.Wait()
		require.Equal(t, 1, dlq.Len(), "expired at 20 ms")
		require.Equal(t, 20*time.Millisecond, time.Since(start))
		d, err = dlq.Get(t.Context())
		require.NoError(t, err)
		require.Equal(t, "20", d.Message.Deaths()[0].OriginalExpiration)
		for _, bad := range []time.Duration{-time.Millisecond, 1500 * time.Microsecond, 1 << 32 * time.Millisecond} {
			err := b.Publish(t.Context(), "", "q", warren.Message{}, warren.ExpireAfter(bad))
			require.ErrorIs(t, err, warren.ErrInvalidArgument, "ExpireAfter(%v)", bad)
		}
		require.Equal(t, 1, q.Len(), "the refused publishes enqueued nothing")
	})

}

// TestHugeDelayKeepsTTLOnTime: a message delayed by a huge duration, up to the largest
// Duration, stays hidden practically forever, and its due time must not overflow the queue's
// clock: an overflowed, negative due time sorts first and arms the queue's one timer about 292
// years out, after which it is never re-armed sooner. A 20 ms TTL published after it still
// expires at 20 ms, and the delayed message is not promoted early.
func TestHugeDelayKeepsTTLOnTime(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration
		ttl   []warren.QueueOption // the queue's TTL, if any
		exp   string               // the short-lived message's Expiration
	}{
		{"MaxInt64, Expiration 20", math.MaxInt64, nil, "20"},
		{"MaxInt64-1, Expiration 20", math.MaxInt64 - 1, nil, "20"},
		{"MaxInt64-1µs, queue TTL 20 ms", math.MaxInt64 - time.Microsecond, []warren.QueueOption{warren.MessageTTL(20 * time.Millisecond)}, ""},
		{"1<<62, Expiration 20", 1 << 62, nil, "20"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				q := declare(t, b, "q", tc.ttl...)
				time.Sleep(time.Millisecond) // the queue's clock away from its start
				start := time.Now()
				require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("never")}, warren.DeliverAfter(tc.delay)))
				require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("short"), Expiration: tc.exp}))

				time.Sleep(20*time.Millisecond - time.Nanosecond)
				synctest.Wait()
				require.Equal(t, 1, q.Len(), "the short-lived message 1 ns before its deadline")
				time.Sleep(time.Nanosecond)
				synctest.Wait()
				require.Equal(t, 0, q.Len(), "DeliverAfter(%v) then a 20 ms TTL: still ready at %v", tc.delay, time.Since(start))
				require.Equal(t, uint64(1), q.Stats().Expired)

				time.Sleep(time.Hour)
				synctest.Wait()
				s := q.Stats()
				require.Equal(t, 1, s.Delayed, "DeliverAfter(%v) after an hour: hidden", tc.delay)
				require.Equal(t, 0, s.Ready)
			})
		})
	}
}

// A queue declared with an expiry and never touched again expires too: its declaration arms
// the timer (nothing else would).
func TestQueueExpiresUntouched(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		declare(t, b, "idle", warren.Expires(time.Second))
		listed := func() bool { // Broker.Queue would be a use
			return slices.ContainsFunc(slices.Collect(b.Queues()), func(q *warren.Queue) bool { return q.Name() == "idle" })
		}
		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		require.True(t, listed())
		time.Sleep(time.Millisecond)
		synctest.Wait()
		require.False(t, listed(), "expired 1 s after its declaration")
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

package warren_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of statistics (stats.go): Queue.Stats and Broker.Stats — the counters, the gauges and
// OldestAge — and their JSON form.

// TestStatsJSON: stats marshal with snake_case names and the oldest message's age as a duration
// a person can read, and read back to what they were; an admin API serves them as they are.
func TestStatsJSON(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 2)
		time.Sleep(1500 * time.Millisecond)
		d, err := q.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, d.Nack())

		st := q.Stats()
		require.Equal(t, 1500*time.Millisecond, st.OldestAge)
		data, err := json.Marshal(st)
		require.NoError(t, err)
		var fields map[string]any
		require.NoError(t, json.Unmarshal(data, &fields))
		require.Equal(t, map[string]any{
			"queue": "q", "ready": 2.0, "unacked": 0.0, "delayed": 0.0, "consumers": 0.0, "bytes": 2.0,
			"oldest_age": "1.5s", "enqueued": 2.0, "delivered": 1.0, "redelivered": 0.0, "acked": 0.0,
			"nacked": 1.0, "rejected": 0.0, "expired": 0.0, "dead_lettered": 0.0, "dropped": 0.0, "moved": 0.0,
		}, fields)
		var back warren.QueueStats
		require.NoError(t, json.Unmarshal(data, &back))
		require.Equal(t, st, back)

		data, err = json.Marshal(b.Stats())
		require.NoError(t, err)
		var broker map[string]any
		require.NoError(t, json.Unmarshal(data, &broker))
		require.Equal(t, 6.0, broker["exchanges"])
		require.Equal(t, 0.0, broker["unroutable"])
		require.Len(t, broker["queues"], 1)
		var bs warren.BrokerStats
		require.NoError(t, json.Unmarshal(data, &bs))
		require.Equal(t, b.Stats(), bs)

		require.Error(t, json.Unmarshal([]byte(`{"oldest_age": "soon"}`), &back))
	})
}

// ---------------------------------------------------------------------------------------------
// Counters and gauges.

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
// OldestAge.

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
				var held []warren.Delivery
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

// TestStatsOldestAgeOfReturnedMessage: with an age threshold every arrival is stamped and a
// delivery's stamp is kept while it is out (it used to be pruned against the ready messages
// alone), so a message nacked back after 15s has that age.
func TestStatsOldestAgeOfReturnedMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.WithAlerts(warren.Alerts{Age: time.Hour}))
		c, err := q.Consume(t.Context(), warren.Prefetch(1))
		require.NoError(t, err)
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("a")}))
		d := <-c.Deliveries()
		for i := range 200 { // enough arrivals to prune the stamps several times
			time.Sleep(50 * time.Millisecond)
			require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte{byte(i)}}))
		}
		time.Sleep(5 * time.Second)
		require.NoError(t, c.Cancel())
		require.NoError(t, d.Nack())
		require.Equal(t, 15*time.Second, q.Stats().OldestAge)
	})
}

// TestStatsOldestAgeOfMessageDeliveredOnArrival: a message delivered as it arrived is stamped
// by nothing; when it comes back its age counts from its return, not 0 forever.
func TestStatsOldestAgeOfMessageDeliveredOnArrival(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		c, err := q.Consume(t.Context(), warren.Prefetch(1))
		require.NoError(t, err)
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("a")}))
		d := <-c.Deliveries()
		time.Sleep(time.Hour)
		require.NoError(t, c.Cancel())
		require.NoError(t, d.Nack())
		time.Sleep(time.Minute)
		require.Equal(t, time.Minute, q.Stats().OldestAge)
	})
}

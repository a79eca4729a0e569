package warren_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// TestReturnedMessagesKeepTheirPlaces: publish 0..4; a consumer takes 0,1,2 without acking;
// whatever returns them, the queue is 0* 1* 2* 3 4 and a new consumer receives exactly that.
func TestReturnedMessagesKeepTheirPlaces(t *testing.T) {
	cases := []struct {
		name   string
		settle func(t *testing.T, cancel context.CancelFunc, c *warren.Consumer, ds []*warren.Delivery)
	}{
		{"context ends", func(t *testing.T, cancel context.CancelFunc, c *warren.Consumer, ds []*warren.Delivery) {
			cancel()
		}},
		// Cancel first, else c (with credit again) would take the nacked messages back at once.
		// Deliveries received before Cancel stay settle-able.
		{"nack 2 then 0 then 1", func(t *testing.T, cancel context.CancelFunc, c *warren.Consumer, ds []*warren.Delivery) {
			require.NoError(t, c.Cancel())
			require.NoError(t, ds[2].Nack())
			require.NoError(t, ds[0].Nack())
			require.NoError(t, ds[1].Nack())
		}},
		{"NackUpTo", func(t *testing.T, cancel context.CancelFunc, c *warren.Consumer, ds []*warren.Delivery) {
			require.NoError(t, c.Cancel())
			require.NoError(t, c.NackUpTo(ds[2].DeliveryTag))
		}},
		{"Recover", func(t *testing.T, cancel context.CancelFunc, c *warren.Consumer, ds []*warren.Delivery) {
			require.NoError(t, c.Cancel())
			require.NoError(t, c.Recover())
		}},
		{"cancel then context ends", func(t *testing.T, cancel context.CancelFunc, c *warren.Consumer, ds []*warren.Delivery) {
			require.NoError(t, c.Cancel())
			cancel()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				q := declare(t, b, "work")
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				c, err := q.Consume(ctx, warren.Prefetch(3))
				require.NoError(t, err)
				publishN(t, b, q, 5)
				ds := receive(t, c, 3)
				require.Equal(t, "0 1 2", picture(ds))
				tc.settle(t, cancel, c, ds)
				synctest.Wait()
				if tc.name == "context ends" || tc.name == "cancel then context ends" {
					for _, d := range ds {
						require.ErrorIs(t, d.Ack(), warren.ErrAlreadySettled)
					}
				}
				require.Equal(t, 5, q.Len())
				require.Equal(t, "0* 1* 2* 3 4", drain(t, q))
			})
		})
	}
}

// TestReturnedMessagesKeepTheirPlacesInterleaved: two consumers take alternate messages; both
// contexts end in either order; the queue is back in publication order with exactly the taken
// ones redelivered.
func TestReturnedMessagesKeepTheirPlacesInterleaved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "work")
		ctx1, cancel1 := context.WithCancel(t.Context())
		ctx2, cancel2 := context.WithCancel(t.Context())
		defer cancel1()
		defer cancel2()
		c1, err := q.Consume(ctx1, warren.Prefetch(2))
		require.NoError(t, err)
		c2, err := q.Consume(ctx2, warren.Prefetch(2))
		require.NoError(t, err)
		publishN(t, b, q, 6)
		require.Equal(t, "0 2", picture(receive(t, c1, 2)))
		require.Equal(t, "1 3", picture(receive(t, c2, 2)))
		cancel2()
		synctest.Wait()
		cancel1()
		synctest.Wait()
		require.Equal(t, "0* 1* 2* 3* 4 5", drain(t, q))
	})
}

// TestNackWithDelay: with delivery limit 2, a message nacked with a 30 s delay is redelivered
// 30 s later each time, and its third return dead-letters it (R1.10).
func TestNackWithDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		main, dead := deadTopology(t, b, warren.DeliveryLimit(2))
		c, err := main.Consume(t.Context(), warren.Prefetch(1))
		require.NoError(t, err)
		start := time.Now()
		publishN(t, b, main, 1)
		var at []time.Duration
		for range 3 {
			d := <-c.Deliveries()
			at = append(at, time.Since(start))
			require.NoError(t, d.NackWithDelay(30*time.Second))
			require.Equal(t, 0, main.Len(), "hidden while delayed")
		}
		require.Equal(t, []time.Duration{0, 30 * time.Second, 60 * time.Second}, at)
		ds := getAll(t, dead)
		require.Equal(t, "0", bodies(ds))
		require.Equal(t, "delivery_limit", xDeath(t, ds[0])[0]["reason"])
	})
}

// TestNackWithDelayKeepsPosition: when the delay has passed the message is back at its original
// position, ahead of what was published after it.
func TestNackWithDelayKeepsPosition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 3)
		d, err := q.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, d.NackWithDelay(10*time.Second))
		require.ErrorIs(t, d.Ack(), warren.ErrAlreadySettled)
		next, err := q.Get(t.Context(), warren.AutoAck())
		require.NoError(t, err)
		require.Equal(t, "1", string(next.Message.Body), "0 is hidden; 1 is next")
		publishN(t, b, q, 1) // "0" again, a new message behind 2
		time.Sleep(10 * time.Second)
		synctest.Wait()
		require.Equal(t, "0* 2 0", picture(getAll(t, q)))
	})
}

// TestDeliverAfter: a delayed publish is hidden until its delay passes, then delivered in its
// place.
func TestDeliverAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		c, err := q.Consume(t.Context(), warren.Prefetch(10))
		require.NoError(t, err)
		start := time.Now()
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("later")}, warren.DeliverAfter(time.Minute)))
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("now")}))
		require.Equal(t, "now", string((<-c.Deliveries()).Message.Body))
		d := <-c.Deliveries()
		require.Equal(t, "later", string(d.Message.Body))
		require.Equal(t, time.Minute, time.Since(start))
		require.False(t, d.Redelivered)
	})
}

// TestNackWithHugeDelay: a message nacked with a huge delay stays hidden practically forever,
// without overflowing its due time and so freezing the queue's timer: a DeliverAfter(10 ms)
// published after it is delivered at 10 ms.
func TestNackWithHugeDelay(t *testing.T) {
	for _, delay := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 - time.Microsecond, 1 << 62} {
		t.Run(fmt.Sprint(delay), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				q := declare(t, b, "q")
				publishN(t, b, q, 1)
				time.Sleep(time.Millisecond) // the queue's clock away from its start
				d, err := q.Get(t.Context())
				require.NoError(t, err)
				require.NoError(t, d.NackWithDelay(delay))
				c, err := q.Consume(t.Context(), warren.Prefetch(10))
				require.NoError(t, err)
				start := time.Now()
				require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("soon")}, warren.DeliverAfter(10*time.Millisecond)))

				time.Sleep(10*time.Millisecond - time.Nanosecond)
				synctest.Wait()
				require.Empty(t, c.Deliveries(), "1 ns before the delay passed")
				time.Sleep(time.Nanosecond)
				synctest.Wait()
				require.Len(t, c.Deliveries(), 1, "NackWithDelay(%v) then DeliverAfter(10ms): nothing delivered at %v", delay, time.Since(start))
				require.Equal(t, "soon", string((<-c.Deliveries()).Message.Body))

				time.Sleep(time.Hour)
				synctest.Wait()
				require.Empty(t, c.Deliveries(), "NackWithDelay(%v) delivered within an hour", delay)
				require.Equal(t, 1, q.Stats().Delayed)
			})
		})
	}
}

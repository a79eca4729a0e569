package warren_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of returns (requeue.go): whatever returns deliveries — a nack, a context's end, Cancel
// and its context, NackUpTo, Recover — they go back to their places, redelivered; every return
// counts towards the delivery limit; DeliverAfter hides a message until its delay has passed.
// NackWithDelay is in delivery_test.go.

// TestReturnedMessagesKeepTheirPlaces: publish 0..4; a consumer takes 0,1,2 without acking;
// whatever returns them, the queue is 0* 1* 2* 3 4 and a new consumer receives exactly that.
func TestReturnedMessagesKeepTheirPlaces(t *testing.T) {
	cases := []struct {
		name   string
		settle func(t *testing.T, cancel context.CancelFunc, c *warren.Consumer, ds []warren.Delivery)
	}{
		{"context ends", func(t *testing.T, cancel context.CancelFunc, c *warren.Consumer, ds []warren.Delivery) {
			cancel()
		}},
		// Cancel first, else c (with credit again) would take the nacked messages back at once.
		// Deliveries received before Cancel stay settle-able.
		{"nack 2 then 0 then 1", func(t *testing.T, cancel context.CancelFunc, c *warren.Consumer, ds []warren.Delivery) {
			require.NoError(t, c.Cancel())
			require.NoError(t, ds[2].Nack())
			require.NoError(t, ds[0].Nack())
			require.NoError(t, ds[1].Nack())
		}},
		{"NackUpTo", func(t *testing.T, cancel context.CancelFunc, c *warren.Consumer, ds []warren.Delivery) {
			require.NoError(t, c.Cancel())
			require.NoError(t, c.NackUpTo(ds[2].DeliveryTag))
		}},
		{"Recover", func(t *testing.T, cancel context.CancelFunc, c *warren.Consumer, ds []warren.Delivery) {
			require.NoError(t, c.Cancel())
			require.NoError(t, c.Recover())
		}},
		{"cancel then context ends", func(t *testing.T, cancel context.CancelFunc, c *warren.Consumer, ds []warren.Delivery) {
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

// TestGetContextEndOrder: when a context that owns several Get deliveries ends, all of them go
// back before anything is dispatched, so a consumer with credit receives the head of the queue
// (0*) and 1* stays ready. (A regression test: each delivery used to return and dispatch through
// its own AfterFunc goroutine, so the consumer got whichever the scheduler ran first, about 7
// runs in 8 1*; hence the repetition.)
func TestGetContextEndOrder(t *testing.T) {
	for i := range 20 {
		synctest.Test(t, func(t *testing.T) {
			b := newBroker(t)
			q := declare(t, b, "q")
			publishN(t, b, q, 2)
			gctx, gcancel := context.WithCancel(t.Context())
			for range 2 {
				_, err := q.Get(gctx)
				require.NoError(t, err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			c, err := q.Consume(ctx, warren.Prefetch(1))
			require.NoError(t, err)
			gcancel() // both Gets return; the consumer has credit for one
			synctest.Wait()
			require.Equal(t, "0*", picture(receive(t, c, 1)), "run %d: the consumer's delivery after the Get context ended", i)
			require.Equal(t, "1*", drain(t, q), "run %d: ready after", i)
		})
	}
}

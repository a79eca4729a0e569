package warren_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of deliveries and their settlement (consumer.go, requeue.go; delivery.go to come): the
// fields a Delivery carries, and every settlement verb — Ack, Nack, Reject, NackWithDelay, the
// UpTo forms — including settling twice, an unknown tag, a copy, and settling after the queue
// was deleted or the delivery went back. Recover is in requeue_test.go, with the other ways
// deliveries go back.

func TestDeliveryFields(t *testing.T) {
	b := newBroker(t)
	_, err := b.DeclareExchange("fan", warren.ExchangeFanout)
	require.NoError(t, err)
	q1, q2 := declare(t, b, "q1"), declare(t, b, "q2")
	require.NoError(t, b.Bind("q1", "fan", "", nil))
	require.NoError(t, b.Bind("q2", "fan", "", nil))
	body := []byte("shared")
	msg := warren.Message{Body: body, ContentType: "text/plain", MessageID: "m-1", Headers: warren.Table{"h": int32(1)}}
	require.NoError(t, b.Publish(t.Context(), "fan", "rk", msg))

	c, err := q1.Consume(t.Context(), warren.ConsumerTag("ctag"))
	require.NoError(t, err)
	d1 := receive(t, c, 1)[0]
	d2, err := q2.Get(t.Context())
	require.NoError(t, err)

	require.Equal(t, "fan", d1.Exchange)
	require.Equal(t, "rk", d1.RoutingKey)
	require.Equal(t, "ctag", d1.ConsumerTag)
	require.Equal(t, uint64(1), d1.DeliveryTag)
	require.False(t, d1.Redelivered)
	require.Equal(t, 0, d1.DeliveryCount)
	require.Equal(t, msg.ContentType, d1.Message.ContentType)
	require.Equal(t, msg.MessageID, d1.Message.MessageID)
	require.Equal(t, d1.Message, d2.Message, "one message, whichever queue it reached")
	require.Same(t, &body[0], &d1.Message.Body[0], "the body is not copied")
	require.Same(t, &body[0], &d2.Message.Body[0], "the body is not copied")
	require.Empty(t, d2.ConsumerTag)
	require.Equal(t, uint64(1), d2.DeliveryTag)
}

func TestDeliveryTagsGrowPerConsumer(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	c, err := q.Consume(t.Context(), warren.Prefetch(3))
	require.NoError(t, err)
	publishN(t, b, q, 2)
	ds := receive(t, c, 2)
	require.NoError(t, ds[0].Nack()) // redelivered with a fresh tag
	again := receive(t, c, 1)[0]
	require.Equal(t, []uint64{1, 2, 3}, []uint64{ds[0].DeliveryTag, ds[1].DeliveryTag, again.DeliveryTag})
	require.Equal(t, "0", string(again.Message.Body))
	require.True(t, again.Redelivered)
	require.Equal(t, 1, again.DeliveryCount)
}

func TestRejectDropsTheMessage(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	publishN(t, b, q, 2)
	d, err := q.Get(t.Context())
	require.NoError(t, err)
	require.NoError(t, d.Reject())
	require.Equal(t, 1, q.Len())
	require.Equal(t, 0, q.Unacked())
	require.Equal(t, "1", drain(t, q))
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

// ---------------------------------------------------------------------------------------------
// Settling twice, settling what is not yours to settle, and the UpTo forms.

func TestDoubleSettle(t *testing.T) {
	type settle struct {
		name string
		f    func(warren.Delivery) error
	}
	settles := []settle{
		{"Ack", (warren.Delivery).Ack},
		{"Nack", (warren.Delivery).Nack},
		{"Reject", (warren.Delivery).Reject},
	}
	for _, first := range settles {
		for _, second := range settles {
			t.Run(first.name+"/"+second.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					b := newBroker(t)
					q := declare(t, b, "q")
					publishN(t, b, q, 2)

					// A Get delivery.
					d, err := q.Get(t.Context())
					require.NoError(t, err)
					require.NoError(t, first.f(d), "first %s", first.name)
					wantLen := q.Len()
					err = second.f(d)
					assert.ErrorIs(t, err, warren.ErrAlreadySettled, "Get delivery: %s after %s = %v, want ErrAlreadySettled", second.name, first.name, err)
					assert.Equal(t, wantLen, q.Len())
					assert.Equal(t, 0, q.Unacked())
					_, err = q.Purge()
					require.NoError(t, err)

					// A consumer's delivery. Cancel first, so that a nacked message stays ready.
					publishN(t, b, q, 1)
					c, err := q.Consume(t.Context(), warren.Prefetch(1))
					require.NoError(t, err)
					d = receive(t, c, 1)[0]
					require.NoError(t, c.Cancel())
					require.NoError(t, first.f(d), "first %s", first.name)
					wantLen = q.Len()
					err = second.f(d)
					assert.ErrorIs(t, err, warren.ErrAlreadySettled, "consumer delivery: %s after %s = %v, want ErrAlreadySettled", second.name, first.name, err)
					assert.Equal(t, wantLen, q.Len())
					assert.Equal(t, 0, q.Unacked())
				})
			})
		}
	}
}

// TestSettleCopiedDelivery: a Delivery is a value, and a copy of it is the same delivery:
// settling the copy settles the original, and a second settlement through either is refused,
// without touching the consumer's credit. (Settling twice once drove the credit negative and
// then blocked dispatch on a full channel.)
func TestSettleCopiedDelivery(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	c, err := q.Consume(t.Context(), warren.Prefetch(1))
	require.NoError(t, err)
	publishN(t, b, q, 2)
	d := receive(t, c, 1)[0]
	cp := d
	require.NoError(t, cp.Ack())
	require.ErrorIs(t, d.Ack(), warren.ErrAlreadySettled)
	require.ErrorIs(t, cp.Nack(), warren.ErrAlreadySettled)
	require.Equal(t, 0, q.Len(), "the second message went to the consumer, whose credit is intact")
	require.Equal(t, 1, q.Unacked())
	require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{}), "dispatch does not block")
}

// TestSettleStaleDelivery: a queue reuses the record of a delivery once it is settled, for a
// later delivery; a Delivery of the earlier one is stale and settles nothing of the later one's,
// whichever settlement it tries, on a consumer and on Get.
func TestSettleStaleDelivery(t *testing.T) {
	settles := map[string]func(warren.Delivery) error{
		"Ack":           warren.Delivery.Ack,
		"Nack":          warren.Delivery.Nack,
		"Reject":        warren.Delivery.Reject,
		"NackWithDelay": func(d warren.Delivery) error { return d.NackWithDelay(time.Hour) },
	}
	for name, settle := range settles {
		t.Run(name, func(t *testing.T) {
			b := newBroker(t)
			q := declare(t, b, "q")
			c, err := q.Consume(t.Context(), warren.Prefetch(1))
			require.NoError(t, err)
			publishN(t, b, q, 1)
			old := receive(t, c, 1)[0]
			require.NoError(t, old.Ack())
			publishN(t, b, q, 1)
			cur := receive(t, c, 1)[0] // the same record as old's, most likely: at least, old's is free
			require.ErrorIs(t, settle(old), warren.ErrAlreadySettled)
			require.Equal(t, 1, q.Unacked(), "the later delivery is still outstanding")
			require.NoError(t, cur.Ack())
			require.NoError(t, c.Cancel())

			publishN(t, b, q, 1)
			got, err := q.Get(t.Context())
			require.NoError(t, err)
			require.NoError(t, got.Ack())
			publishN(t, b, q, 1)
			next, err := q.Get(t.Context())
			require.NoError(t, err)
			require.ErrorIs(t, settle(got), warren.ErrAlreadySettled)
			require.Equal(t, 1, q.Unacked(), "the later Get is still outstanding")
			require.NoError(t, next.Ack())
			require.Equal(t, 0, q.Unacked())
		})
	}
}

// TestSettleReturnedDelivery: a delivery that went back because its owner ended is settled.
func TestSettleReturnedDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 2)

		gctx, gcancel := context.WithCancel(t.Context())
		g, err := q.Get(gctx)
		require.NoError(t, err)
		cctx, ccancel := context.WithCancel(t.Context())
		c, err := q.Consume(cctx, warren.Prefetch(1))
		require.NoError(t, err)
		d := receive(t, c, 1)[0]
		gcancel()
		ccancel()
		synctest.Wait()
		require.Equal(t, 2, q.Len())
		for _, f := range []func() error{g.Ack, g.Nack, g.Reject, d.Ack, d.Nack, d.Reject} {
			assert.ErrorIs(t, f(), warren.ErrAlreadySettled)
		}
		assert.Equal(t, 2, q.Len())
		assert.Equal(t, 0, q.Unacked())
		assert.Equal(t, "0* 1*", drain(t, q))
	})
}

func TestSettleUnknownDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var zero warren.Delivery
		var nilD warren.Delivery
		for _, f := range []func() error{zero.Ack, zero.Nack, zero.Reject, nilD.Ack, nilD.Nack, nilD.Reject} {
			assert.ErrorIs(t, f(), warren.ErrUnknownDelivery)
		}

		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 3)

		d, err := q.Get(t.Context(), warren.AutoAck())
		require.NoError(t, err)
		for _, f := range []func() error{d.Ack, d.Nack, d.Reject} {
			assert.ErrorIs(t, f(), warren.ErrUnknownDelivery, "settling an AutoAck Get delivery")
		}
		assert.Equal(t, 2, q.Len(), "the auto-acked message did not come back")
		assert.Equal(t, 0, q.Unacked())

		c, err := q.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(1))
		require.NoError(t, err)
		synctest.Wait()
		d = <-c.Deliveries()
		for _, f := range []func() error{d.Ack, d.Nack, d.Reject} {
			assert.ErrorIs(t, f(), warren.ErrUnknownDelivery, "settling an AutoAck consumer delivery")
		}
		for _, f := range []func(uint64) error{c.AckUpTo, c.NackUpTo, c.RejectUpTo} {
			assert.ErrorIs(t, f(0), warren.ErrUnknownDelivery, "UpTo(0) on an AutoAck consumer")
			assert.ErrorIs(t, f(d.DeliveryTag), warren.ErrUnknownDelivery, "UpTo(tag) on an AutoAck consumer")
		}
		synctest.Wait()
		require.NoError(t, c.Cancel())
		assert.Equal(t, 1, q.Len(), "one buffered and unread message went back")
		assert.Equal(t, 0, q.Unacked())
	})
}

// upToOps are the consumer's multiple-settlement methods.
var upToOps = []struct {
	name string
	f    func(*warren.Consumer, uint64) error
}{
	{"AckUpTo", (*warren.Consumer).AckUpTo},
	{"NackUpTo", (*warren.Consumer).NackUpTo},
	{"RejectUpTo", (*warren.Consumer).RejectUpTo},
}

func TestUpToUnknownTag(t *testing.T) {
	for _, op := range upToOps {
		t.Run(op.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				q := declare(t, b, "q")
				c, err := q.Consume(t.Context(), warren.Prefetch(4))
				require.NoError(t, err)
				other, err := q.Consume(t.Context(), warren.Prefetch(4))
				require.NoError(t, err)
				publishN(t, b, q, 6)
				ds := receive(t, c, 3)                  // tags 1, 2, 3: messages 0, 2, 4
				require.Len(t, receive(t, other, 3), 3) // tags 1, 2, 3 of the other consumer
				require.NoError(t, ds[1].Ack())

				for _, tag := range []uint64{ds[1].DeliveryTag, 4, 99} {
					err := op.f(c, tag)
					assert.ErrorIs(t, err, warren.ErrUnknownDelivery, "%s(%d) = %v, want ErrUnknownDelivery", op.name, tag, err)
					assert.Equal(t, 5, q.Unacked(), "nothing settled by %s(%d)", op.name, tag)
					assert.Equal(t, 0, q.Len())
				}
				// Still outstanding, in particular the one below the settled tag.
				require.NoError(t, ds[0].Ack())
				require.NoError(t, ds[2].Ack())
			})
		})
	}
}

// TestUpToBufferedDeliveries: the UpTo methods cover only deliveries the application has
// received; those still buffered in the channel are not settled by tag 0 and are unknown by
// their own tag. Settling must not block (dispatch refills the channel) nor let anything acked
// come back.
func TestUpToBufferedDeliveries(t *testing.T) {
	for _, op := range upToOps {
		t.Run(op.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				q := declare(t, b, "q")
				c, err := q.Consume(t.Context(), warren.Prefetch(3))
				require.NoError(t, err)
				publishN(t, b, q, 5) // 0 1 2 buffered; 3 4 ready
				receive(t, c, 1)     // 0 received (tag 1); 1 2 buffered (tags 2, 3)

				for _, tag := range []uint64{2, 3} {
					err := op.f(c, tag)
					assert.ErrorIs(t, err, warren.ErrUnknownDelivery, "%s(%d) of a buffered delivery = %v, want ErrUnknownDelivery", op.name, tag, err)
				}
				assert.Equal(t, 3, q.Unacked(), "nothing settled")

				done := make(chan error, 1)
				go func() { done <- op.f(c, 0) }()
				synctest.Wait()
				select {
				case err := <-done:
					require.NoError(t, err, "%s(0)", op.name)
				default:
					// Dispatch is sending into the full channel under the queue lock. Read to
					// let it finish, so that the test can end.
					t.Errorf("%s(0) with buffered deliveries and more ready blocks", op.name)
					for range 3 {
						<-c.Deliveries()
					}
					require.NoError(t, <-done)
					return
				}
				// Only 0 was settled; the credit it freed took 3 (or, after a Nack, 0 again
				// goes back ahead of 3 and is redelivered).
				rest := picture(receive(t, c, 3))
				switch op.name {
				case "NackUpTo":
					assert.Equal(t, "1 2 0*", rest, "deliveries after %s(0)", op.name)
				default:
					assert.Equal(t, "1 2 3", rest, "deliveries after %s(0)", op.name)
				}
				require.NoError(t, op.f(c, 0))
				require.NoError(t, c.Cancel())
				// After a Nack everything came straight back to c, buffered; Cancel returns what is buffered.
				want := map[string]int{"AckUpTo": 1, "NackUpTo": 5, "RejectUpTo": 1}[op.name]
				assert.Equal(t, want, q.Len(), "Len() after %s(0), Cancel", op.name)
				assert.Equal(t, 0, q.Unacked(), "Unacked() after %s(0), Cancel", op.name)
			})
		})
	}
}

// TestUpToLeavesBufferedDeliveries: the UpTo methods cover only deliveries the application has
// received. Deliveries still buffered in the channel are not settled by tag 0 and cannot be
// named by their tag; they keep counting against prefetch, so the channel never overfills.
// (A regression test: UpTo once settled unread deliveries, which Cancel then put back and which
// let dispatch block on a full channel while holding the queue lock.)
func TestUpToLeavesBufferedDeliveries(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settle   func(c *warren.Consumer) error
		wantRest string // what the consumer then receives: a nacked 0 comes back to it, last
	}{
		{"AckUpTo(0)", func(c *warren.Consumer) error { return c.AckUpTo(0) }, "1 2"},
		{"NackUpTo(0)", func(c *warren.Consumer) error { return c.NackUpTo(0) }, "1 2 0*"},
		{"RejectUpTo(0)", func(c *warren.Consumer) error { return c.RejectUpTo(0) }, "1 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				q := declare(t, b, "q")
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				c, err := q.Consume(ctx, warren.Prefetch(3))
				require.NoError(t, err)
				publishN(t, b, q, 3)
				got := receive(t, c, 1) // 0 received; 1 and 2 buffered
				require.NoError(t, tc.settle(c))
				n := strings.Count(tc.wantRest, " ") + 1
				require.Equal(t, n, q.Unacked(), "%s settled buffered deliveries", tc.name)
				require.Equal(t, n, len(c.Deliveries()))
				require.ErrorIs(t, got[0].Ack(), warren.ErrAlreadySettled)
				// The buffered tags are unknown to UpTo until received.
				require.ErrorIs(t, c.AckUpTo(3), warren.ErrUnknownDelivery)
				require.Equal(t, n, q.Unacked(), "a failed AckUpTo settled something")
				rest := receive(t, c, n)
				require.Equal(t, tc.wantRest, picture(rest))
				require.NoError(t, c.AckUpTo(0))
				require.Equal(t, 0, q.Unacked())
			})
		})
	}
	t.Run("publish does not block after AckUpTo(0) with a full channel", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newBroker(t)
			q := declare(t, b, "q")
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			c, err := q.Consume(ctx, warren.Prefetch(1))
			require.NoError(t, err)
			publishN(t, b, q, 1) // buffered, unread: the channel (capacity 1) is full
			require.NoError(t, c.AckUpTo(0))
			require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("1")}))
			require.Equal(t, 1, q.Len(), "the second message waits: the consumer has no credit")
		})
	})
}

// TestSettleAfterQueueDeleted: RabbitMQ accepts an ack, nack or reject of a delivery whose queue
// was deleted, as a no-op; so does warren, once per delivery, for consumer and Get deliveries and
// for the UpTo forms, while the consumer's Err says why it ended. Once the broker has closed,
// settling fails with ErrClosed.
func TestSettleAfterQueueDeleted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 5)
		c, err := q.Consume(t.Context(), warren.Prefetch(3))
		require.NoError(t, err)
		ds := receive(t, c, 3)
		g, err := q.Get(t.Context())
		require.NoError(t, err)
		require.Equal(t, 1, deleteQueue(t, b, "q"), "one message was still ready")

		require.NoError(t, ds[0].Ack(), "the handler did its work: no failure")
		require.ErrorIs(t, ds[0].Ack(), warren.ErrAlreadySettled, "but only once")
		require.NoError(t, ds[1].Reject())
		require.NoError(t, c.NackUpTo(ds[2].DeliveryTag))
		require.ErrorIs(t, ds[2].Nack(), warren.ErrAlreadySettled)
		require.NoError(t, g.NackWithDelay(time.Minute))
		require.ErrorIs(t, c.Err(), warren.ErrQueueDeleted)
		st := q.Stats()
		require.Equal(t, uint64(0), st.Acked+st.Nacked+st.Rejected, "nothing was settled in a queue that is gone")

		q2 := declare(t, b, "q2")
		publishN(t, b, q2, 1)
		d, err := q2.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, b.Close())
		require.ErrorIs(t, d.Ack(), warren.ErrClosed)
	})
}

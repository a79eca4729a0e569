package warren_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of the broker (broker.go): Close — what it ends, that it waits, that it may race with
// every other call — and what is left to look up after it. Every Close test runs in a synctest
// bubble, and synctest.Test fails if a goroutine is left blocked when the test function
// returns: ending the bubble proves that Close left nothing behind. The errors of the broker's
// calls are in errors_test.go, declaration arguments in arguments_test.go.

func TestClosePushConsumers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := warren.New()
		q := declare(t, b, "q")
		c1, err := q.Consume(t.Context(), warren.Prefetch(2), warren.ConsumerTag("c1"))
		require.NoError(t, err)
		c2, err := q.Consume(t.Context(), warren.Prefetch(2), warren.ConsumerTag("c2"))
		require.NoError(t, err)
		cancelled, err := q.Consume(t.Context(), warren.Prefetch(1), warren.ConsumerTag("cancelled"))
		require.NoError(t, err)
		publishN(t, b, q, 8) // c1: 0 3, c2: 1 4, cancelled: 2; 5 6 7 ready
		d1 := receive(t, c1, 1)[0]
		held := receive(t, cancelled, 1)[0]
		require.NoError(t, cancelled.Cancel())
		require.Equal(t, 3, q.Len())
		require.Equal(t, 5, q.Unacked())

		require.NoError(t, b.Close())

		assertStopped(t, c1, warren.ErrClosed)
		assertStopped(t, c2, warren.ErrClosed)
		assert.True(t, cancelled.Err() == warren.ErrCancelled, "a consumer cancelled before Close keeps its reason: Err() = %v", cancelled.Err())
		for _, d := range []warren.Delivery{d1, held} {
			assert.ErrorIs(t, d.Ack(), warren.ErrClosed, "Ack of a delivery held across Close")
			assert.ErrorIs(t, d.Nack(), warren.ErrClosed, "Nack of a delivery held across Close")
		}
		assert.Equal(t, 0, q.Len())
		assert.Equal(t, 0, q.Unacked())
		assert.Equal(t, 0, q.ConsumerCount())
		for _, c := range []*warren.Consumer{c1, c2, cancelled} {
			assert.NoError(t, c.Cancel(), "Cancel after Close")
		}
	})
}

// TestCloseAutoAckConsumers: each AutoAck consumer has a feeder goroutine. Close must join them,
// so their channels are closed by the time it returns, whatever the feeder was doing.
func TestCloseAutoAckConsumers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := warren.New()
		idle := declare(t, b, "idle") // feeder waiting for a message
		busy := declare(t, b, "busy") // feeder blocked sending into a full channel
		read := declare(t, b, "read") // feeder fed, part of the buffer read
		waiting, err := idle.Consume(t.Context(), warren.AutoAck(), warren.ConsumerTag("idle"))
		require.NoError(t, err)
		blocked, err := busy.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(1), warren.ConsumerTag("busy"))
		require.NoError(t, err)
		reading, err := read.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(4), warren.ConsumerTag("read"))
		require.NoError(t, err)
		// Two AutoAck consumers on one queue, then a push consumer that takes the rest.
		other, err := read.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(2), warren.ConsumerTag("other"))
		require.NoError(t, err)
		publishN(t, b, busy, 3)
		publishN(t, b, read, 20)
		synctest.Wait()
		<-reading.Deliveries()
		<-reading.Deliveries()
		synctest.Wait()
		push, err := read.Consume(t.Context(), warren.ConsumerTag("push"))
		require.NoError(t, err)

		require.NoError(t, b.Close())

		for _, c := range []*warren.Consumer{waiting, blocked, reading, other, push} {
			assertStopped(t, c, warren.ErrClosed)
		}
		for _, q := range []*warren.Queue{idle, busy, read} {
			assert.Equal(t, 0, q.Len(), "queue %s: Len() after Close", q.Name())
			assert.Equal(t, 0, q.ConsumerCount(), "queue %s: ConsumerCount() after Close", q.Name())
		}
	})
}

func TestCloseOutstandingGets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := warren.New()
		q := declare(t, b, "q")
		publishN(t, b, q, 4)
		ctx, cancel := context.WithCancel(t.Context())
		g1, err := q.Get(ctx)
		require.NoError(t, err)
		g2, err := q.Get(t.Context())
		require.NoError(t, err)
		g3, err := q.Get(context.Background()) // an owner that never ends
		require.NoError(t, err)
		auto, err := q.Get(t.Context(), warren.AutoAck())
		require.NoError(t, err)
		require.Equal(t, 3, q.Unacked())

		require.NoError(t, b.Close())
		assert.Equal(t, 0, q.Unacked())
		assert.Equal(t, 0, q.Len())
		for _, d := range []warren.Delivery{g1, g2, g3, auto} {
			assert.ErrorIs(t, d.Ack(), warren.ErrClosed, "Ack of Get delivery %d after Close", d.DeliveryTag)
		}

		// The owner ending after Close returns nothing anywhere.
		cancel()
		synctest.Wait()
		assert.Equal(t, 0, q.Len())
		assert.Equal(t, 0, q.Unacked())
		for _, d := range []warren.Delivery{g1, g2, g3} {
			assert.ErrorIs(t, d.Nack(), warren.ErrClosed, "Nack of Get delivery %d after Close and owner end", d.DeliveryTag)
		}
	})
}

// TestCloseLiveConsumerContexts: consumers whose contexts are still live at Close, ending after
// it, at the same moment, or never.
func TestCloseLiveConsumerContexts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := warren.New()
		q := declare(t, b, "q")
		after, cancelAfter := context.WithCancel(t.Context())
		racing, cancelRacing := context.WithCancel(t.Context())
		type consumer struct {
			c      *warren.Consumer
			racing bool
		}
		var cs []consumer
		for _, ctx := range []context.Context{after, racing, context.Background()} {
			for _, opts := range [][]warren.ConsumeOption{{warren.Prefetch(2)}, {warren.AutoAck(), warren.Prefetch(2)}} {
				c, err := q.Consume(ctx, opts...)
				require.NoError(t, err)
				cs = append(cs, consumer{c, ctx == racing})
			}
		}
		publishN(t, b, q, 20)
		synctest.Wait()
		for _, c := range cs {
			<-c.c.Deliveries() // one received, unsettled for push consumers
		}

		// The context end runs on its own goroutine, which Close may beat or not.
		cancelRacing()
		require.NoError(t, b.Close())
		for _, c := range cs {
			if c.racing {
				err := c.c.Err()
				assert.True(t, err == warren.ErrClosed || err == context.Canceled, "racing consumer: Err() = %v, want ErrClosed or context.Canceled", err)
				synctest.Wait()
				assertStopped(t, c.c, err)
				continue
			}
			assertStopped(t, c.c, warren.ErrClosed)
		}

		// A context ending after Close changes nothing.
		cancelAfter()
		synctest.Wait()
		for _, c := range cs {
			if !c.racing {
				assert.True(t, c.c.Err() == warren.ErrClosed, "Err() after Close and context end = %v, want ErrClosed", c.c.Err())
			}
		}
		assert.Equal(t, 0, q.Len())
		assert.Equal(t, 0, q.Unacked())
	})
}

func TestCloseIdempotent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := warren.New()
		require.NoError(t, b.Close(), "Close of an empty broker")
		require.NoError(t, b.Close(), "second Close")

		b = warren.New()
		q := declare(t, b, "q")
		c, err := q.Consume(t.Context(), warren.AutoAck())
		require.NoError(t, err)
		publishN(t, b, q, 3)
		synctest.Wait()
		for i := range 3 {
			require.NoError(t, b.Close(), "Close #%d", i+1)
			assertStopped(t, c, warren.ErrClosed)
			_, err := b.DeclareQueue("q")
			assert.ErrorIs(t, err, warren.ErrClosed, "DeclareQueue after Close #%d", i+1)
		}
	})
}

// TestCloseConcurrentCallsWait: Close "waits for the broker's goroutines" and ends every
// consumer before it returns. A Close that loses the race to another Close must not return
// before the winner has finished.
func TestCloseConcurrentCallsWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		early := 0
		const rounds = 100
		for range rounds {
			b := warren.New()
			var cs []*warren.Consumer
			for i := range 50 {
				q := declare(t, b, fmt.Sprint(i))
				c, err := q.Consume(t.Context())
				require.NoError(t, err)
				cs = append(cs, c)
			}
			var wg sync.WaitGroup
			var bad atomic.Bool
			start := make(chan struct{})
			for range 2 {
				wg.Go(func() {
					<-start
					assert.NoError(t, b.Close())
					for _, c := range cs {
						if c.Err() == nil {
							bad.Store(true)
							return
						}
					}
				})
			}
			close(start)
			wg.Wait()
			if bad.Load() {
				early++
			}
		}
		if early > 0 {
			t.Errorf("in %d of %d rounds one of two concurrent Close calls returned while a consumer was still active (Err() == nil)", early, rounds)
		}
	})
}

// TestCloseConcurrentCallsWithConsume: two Close calls racing with AutoAck Consume calls: no
// panic, no race, no goroutine left. (A regression test: the losing Close used to wait on the
// broker's WaitGroup while the winner was still ending queues, and a Consume on a queue not yet
// ended added a feeder: "WaitGroup is reused before previous Wait has returned".)
func TestCloseConcurrentCallsWithConsume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for range 300 {
			closeRacingConsume(t, 2)
		}
	})
}

// TestCloseRacingConsume: one Close racing with AutoAck consumers that come and go; every feeder
// started before the queue ended is joined by Close, none starts after.
func TestCloseRacingConsume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for range 100 {
			closeRacingConsume(t, 1)
		}
	})
}

// closeRacingConsume runs closers concurrent Close calls against AutoAck consumers that come and
// go on 20 queues.
func closeRacingConsume(t *testing.T, closers int) {
	b := warren.New()
	var qs []*warren.Queue
	for i := range 20 {
		qs = append(qs, declare(t, b, fmt.Sprint(i)))
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range closers {
		wg.Go(func() {
			<-start
			assert.NoError(t, b.Close())
		})
	}
	for _, q := range qs {
		wg.Go(func() {
			<-start
			for {
				c, err := q.Consume(t.Context(), warren.AutoAck())
				if err != nil {
					assert.ErrorIs(t, err, warren.ErrClosed)
					return
				}
				assert.NoError(t, c.Cancel())
			}
		})
	}
	close(start)
	wg.Wait()
}

// TestCloseRacingCalls: one Close racing with every kind of call from many goroutines. Each
// goroutine runs until the broker refuses it with ErrClosed. Nothing may panic, and when the
// bubble ends no goroutine may be left.
func TestCloseRacingCalls(t *testing.T) {
	seed := testSeed(t, "WARREN_CLOSE_SEED")
	rounds := 40
	if testing.Short() {
		rounds = 10
	}
	for round := range rounds {
		synctest.Test(t, func(t *testing.T) {
			closeRacingCalls(t, rand.New(rand.NewPCG(seed, uint64(round))))
		})
	}
}

func closeRacingCalls(t *testing.T, rng *rand.Rand) {
	b := warren.New()
	q := declare(t, b, "q")
	_, err := b.DeclareExchange("x", warren.ExchangeFanout)
	require.NoError(t, err)
	require.NoError(t, b.Bind("q", "x", "", nil))
	publishN(t, b, q, rng.IntN(50))

	// expected are the errors a call may meet while the broker closes under it.
	expected := func(err error) bool {
		return err == nil || errors.Is(err, warren.ErrClosed) || errors.Is(err, warren.ErrEmpty) ||
			errors.Is(err, warren.ErrAlreadySettled) || errors.Is(err, context.Canceled)
	}
	check := func(call string, err error) bool {
		if !expected(err) {
			t.Errorf("%s during Close = %v", call, err)
		}
		return errors.Is(err, warren.ErrClosed)
	}

	var ops atomic.Int64
	closeAt := 1 + int64(rng.IntN(400))
	closing := make(chan struct{})
	var closeOnce sync.Once
	tick := func() {
		if ops.Add(1) == closeAt {
			closeOnce.Do(func() { close(closing) })
		}
	}

	var wg sync.WaitGroup
	// Publishers, through the broker and through an exchange handle.
	for p := range 3 {
		wg.Go(func() {
			x, err := b.Exchange("x")
			if check("Exchange", err) {
				return
			}
			for i := 0; ; i++ {
				tick()
				msg := warren.Message{Body: fmt.Append(nil, i)}
				if p == 0 {
					err = x.Publish(t.Context(), "", msg)
				} else {
					err = b.Publish(t.Context(), "", "q", msg)
				}
				if check("Publish", err) {
					return
				}
			}
		})
	}
	// Consumers that come and go: push and AutoAck, ended by Cancel or by their context.
	for w := range 4 {
		seed := rng.Uint64()
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, 0))
			for {
				tick()
				ctx, cancel := context.WithCancel(t.Context())
				var opts []warren.ConsumeOption
				if w%2 == 1 {
					opts = append(opts, warren.AutoAck())
				}
				c, err := q.Consume(ctx, append(opts, warren.Prefetch(1+rng.IntN(4)))...)
				if check("Consume", err) {
					cancel()
					return
				}
				for range rng.IntN(8) {
					d, ok := <-c.Deliveries()
					if !ok {
						break
					}
					if w%2 == 0 {
						switch rng.IntN(3) {
						case 0:
							check("Ack", d.Ack())
						case 1:
							check("Nack", d.Nack())
						default:
							check("AckUpTo", c.AckUpTo(d.DeliveryTag))
						}
					}
				}
				if rng.IntN(2) == 0 {
					check("Cancel", c.Cancel())
				}
				cancel()
				if c.Err() == warren.ErrClosed {
					return
				}
			}
		})
	}
	// A getter and a declarer.
	getSeed := rng.Uint64()
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(getSeed, 1))
		for {
			tick()
			ctx, cancel := context.WithCancel(t.Context())
			d, err := q.Get(ctx)
			if check("Get", err) {
				cancel()
				return
			}
			if err == nil && rng.IntN(2) == 0 {
				check("Ack", d.Ack())
			}
			cancel()
		}
	})
	wg.Go(func() {
		for i := 0; ; i++ {
			tick()
			name := fmt.Sprint("tmp", i%4)
			_, err := b.DeclareQueue(name)
			if check("DeclareQueue", err) {
				return
			}
			if check("Bind", b.Bind(name, "x", "", nil)) {
				return
			}
			if _, err := b.DeleteQueue(name); check("DeleteQueue", err) {
				return
			}
		}
	})

	<-closing
	require.NoError(t, b.Close())
	wg.Wait()
	require.NoError(t, b.Close())
}

func TestLookupsAfterClose(t *testing.T) {
	b := warren.New()
	declare(t, b, "q")
	require.NoError(t, b.Close())
	require.Empty(t, slices.Collect(b.Queues()))
	require.Empty(t, slices.Collect(b.Exchanges()))
}

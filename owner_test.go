package warren_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of owners (owner.go): NewOwner and As, WaitReleased, and exclusive queues (ExclusiveTo),
// which only their owner may use and which go when it ends.

// TestExclusiveQueueRefusesOthers: every call that uses an exclusive queue by name or handle —
// passive declare, bind, unbind, purge, delete, consume, get — is refused with ErrResourceLocked
// on behalf of anyone but its owner (RabbitMQ's 405 to another connection), refusing changes
// nothing, and anyone may still publish to it.
func TestExclusiveQueueRefusesOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		owner, end := warren.NewOwner(t.Context())
		defer end()
		q := declare(t, b, "ex", warren.ExclusiveTo(owner))
		require.True(t, q.Exclusive())
		require.False(t, declare(t, b, "plain").Exclusive())
		_, err := b.DeclareExchange("x", warren.ExchangeFanout)
		require.NoError(t, err)
		require.NoError(t, b.Bind("ex", "x", "", nil, warren.As(owner)))
		publishN(t, b, q, 3)

		other, endOther := warren.NewOwner(t.Context())
		defer endOther()
		for _, by := range []struct {
			name string
			as   []warren.CallOption // nothing: on nobody's behalf
			ctx  context.Context
		}{
			{"nobody", nil, t.Context()},
			{"another owner", []warren.CallOption{warren.As(other)}, other},
			{"a plain context", []warren.CallOption{warren.As(t.Context())}, t.Context()},
		} {
			const (
				byAs      = "(call it on behalf of its owner: warren.As(ownerCtx))"
				byContext = "(pass its owner's context, or one derived from it)"
				byDeclare = "(declare it with warren.ExclusiveTo(ownerCtx))"
			)
			calls := []struct {
				name string
				call func() error
				hint string // how to call it on the owner's behalf, as the error says
			}{
				{"Queue", func() error { _, err := b.Queue("ex", by.as...); return err }, byAs},
				{"Bind", func() error { return b.Bind("ex", "amq.fanout", "", nil, by.as...) }, byAs},
				{"Unbind", func() error { return b.Unbind("ex", "x", "", nil, by.as...) }, byAs},
				{"Broker.Purge", func() error { _, err := b.Purge("ex", by.as...); return err }, byAs},
				{"Queue.Purge", func() error { _, err := q.Purge(by.as...); return err }, byAs},
				{"DeleteQueue", func() error { _, err := b.DeleteQueue("ex", by.as...); return err }, byAs},
				{"Consume", func() error { _, err := q.Consume(by.ctx); return err }, byContext},
				{"Get", func() error { _, err := q.Get(by.ctx); return err }, byContext},
				{"Move", func() error { _, err := q.Move(by.ctx, "", "plain"); return err }, byContext},
				{"Serve", func() error { return q.Serve(by.ctx, func(context.Context, warren.Delivery) error { return nil }) }, byContext},
				{"DeclareQueue", func() error { _, err := b.DeclareQueue("ex", warren.ExclusiveTo(by.ctx)); return err }, byDeclare},
			}
			for _, c := range calls {
				err := c.call()
				require.ErrorIs(t, err, warren.ErrResourceLocked, "%s on behalf of %s", c.name, by.name)
				require.ErrorContains(t, err, `exclusive queue "ex": owned by another context `+c.hint+": resource locked",
					"%s on behalf of %s says how to call it on behalf of the owner", c.name, by.name)
			}
		}
		st := q.Stats()
		require.Equal(t, 3, st.Ready, "refused calls changed nothing")
		require.Equal(t, 0, st.Consumers)
		require.NoError(t, b.Publish(t.Context(), "x", "", warren.Message{Body: []byte("3")}, warren.Mandatory()),
			"the owner's binding is still there, and anyone may publish")
		require.NoError(t, b.Publish(t.Context(), "amq.fanout", "", warren.Message{}))
		require.Equal(t, 4, q.Len(), "the refused Bind to amq.fanout made no binding")

		// The owner may do all of it.
		got, err := b.Queue("ex", warren.As(owner))
		require.NoError(t, err)
		require.Same(t, q, got)
		require.NoError(t, b.Unbind("ex", "x", "", nil, warren.As(owner)))
		n, err := q.Purge(warren.As(owner))
		require.NoError(t, err)
		require.Equal(t, 4, n)
		n, err = b.DeleteQueue("ex", warren.As(owner))
		require.NoError(t, err)
		require.Equal(t, 0, n)
		require.False(t, queueExists(t, b, "ex"))
	})
}

// TestOwnerDerivedContexts: a context derived from an owner made by NewOwner — with its own
// cancellation, a deadline, a value, or as an owner of its own — is that owner; a context merely
// sharing a plain owner's Done channel is the plain owner's, one cancellable on its own is not.
func TestOwnerDerivedContexts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		session, end := warren.NewOwner(t.Context())
		defer end()
		q := declare(t, b, "ex", warren.ExclusiveTo(session))
		publishN(t, b, q, 4)

		cancellable, cancel := context.WithCancel(session)
		defer cancel()
		timed, cancelTimed := context.WithTimeout(session, time.Hour)
		defer cancelTimed()
		nested, endNested := warren.NewOwner(cancellable)
		defer endNested()
		for name, ctx := range map[string]context.Context{
			"WithCancel": cancellable, "WithTimeout": timed, "WithValue": context.WithValue(session, ctxKey{}, 1), "NewOwner": nested,
		} {
			c, err := q.Consume(ctx, warren.Prefetch(1))
			require.NoError(t, err, "Consume with a %s child of the owner", name)
			require.NoError(t, c.Cancel())
			d, err := q.Get(ctx)
			require.NoError(t, err, "Get with a %s child of the owner", name)
			require.NoError(t, d.Nack())
			_, err = b.Queue("ex", warren.As(ctx))
			require.NoError(t, err, "Queue on behalf of a %s child of the owner", name)
		}
		_, err := b.DeclareQueue("ex", warren.ExclusiveTo(timed))
		require.NoError(t, err, "redeclared by a child of the owner")

		// A plain context as the owner: only the context itself and its WithValue children.
		plain, endPlain := context.WithCancel(t.Context())
		defer endPlain()
		p := declare(t, b, "plain-ex", warren.ExclusiveTo(plain))
		_, err = p.Consume(context.WithValue(plain, ctxKey{}, 1))
		require.NoError(t, err)
		child, cancelChild := context.WithCancel(plain)
		defer cancelChild()
		_, err = p.Get(child)
		require.ErrorIs(t, err, warren.ErrResourceLocked, "Go cannot tell that child was derived from a plain owner")

		// The owner's end deletes its queues, however derived their users were.
		end()
		synctest.Wait()
		require.False(t, queueExists(t, b, "ex"))
	})
}

// TestAsNil: As(nil) is a caller's bug, reported as an invalid argument.
func TestAsNil(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	//lint:ignore SA1012 the nil context is what is tested
	_, err := b.Queue("q", warren.As(nil))
	require.ErrorIs(t, err, warren.ErrInvalidArgument)
	//lint:ignore SA1012 the nil context is what is tested
	_, err = q.Purge(warren.As(nil))
	require.ErrorIs(t, err, warren.ErrInvalidArgument)
}

// TestWaitReleased: once an owner is cancelled, WaitReleased returns when everything it held —
// its consumers' deliveries, received and buffered, and its Gets, whatever context derived from
// it they were started with — is back in place; before the owner ends it waits for that, unless
// the owner holds nothing.
func TestWaitReleased(t *testing.T) {
	for round := range 30 { // outside a bubble: the returns run on other goroutines
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 10)
		owner, end := warren.NewOwner(t.Context())
		channel, closeChannel := context.WithCancel(owner)
		defer closeChannel()
		c, err := q.Consume(channel, warren.Prefetch(4))
		require.NoError(t, err)
		receive(t, c, 2)
		for range 3 {
			_, err := q.Get(owner)
			require.NoError(t, err)
		}
		require.NoError(t, b.WaitReleased(t.Context(), t.Context()), "another context holds nothing")
		end()
		require.NoError(t, b.WaitReleased(t.Context(), owner))
		st := q.Stats()
		require.Equal(t, [3]int{10, 0, 0}, [3]int{st.Ready, st.Unacked, st.Consumers}, "round %d: ready, unacked, consumers", round)
		select {
		case <-c.Done():
		default:
			t.Fatalf("round %d: the consumer has not ended", round)
		}
		b.Close()
	}

	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 1)
		owner, end := warren.NewOwner(t.Context())
		defer end()
		_, err := q.Get(owner)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		require.ErrorIs(t, b.WaitReleased(ctx, owner), context.DeadlineExceeded, "the owner holds a Get and has not ended")
		go func() {
			time.Sleep(time.Hour)
			end()
		}()
		start := time.Now()
		require.NoError(t, b.WaitReleased(t.Context(), owner))
		require.Equal(t, time.Hour, time.Since(start), "it waited for the owner to end")
		require.Equal(t, 1, q.Len())
	})
}

// ---------------------------------------------------------------------------------------------
// Exclusive queues (R2.6): deleted with their owner, used by it alone.

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

type ctxKey struct{}

// The consumers of an exclusive queue end with ErrQueueDeleted when the owner ends, whichever
// of the queue's and the consumers' context callbacks runs first.
func TestExclusiveQueueConsumersEndWithQueueDeleted(t *testing.T) {
	b := newBroker(t)
	for i := range 100 {
		ctx, cancel := context.WithCancel(t.Context())
		q := declare(t, b, "", warren.ExclusiveTo(ctx))
		c, err := q.Consume(ctx)
		require.NoError(t, err)
		cancel()
		<-c.Done()
		require.ErrorIs(t, c.Err(), warren.ErrQueueDeleted, "round %d", i)
		_, err = b.Queue(q.Name())
		require.ErrorIs(t, err, warren.ErrNotFound, "round %d: the queue outlived its owner", i)
	}
}

package warren_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

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
			calls := []struct {
				name string
				call func() error
			}{
				{"Queue", func() error { _, err := b.Queue("ex", by.as...); return err }},
				{"Bind", func() error { return b.Bind("ex", "amq.fanout", "", nil, by.as...) }},
				{"Unbind", func() error { return b.Unbind("ex", "x", "", nil, by.as...) }},
				{"Broker.Purge", func() error { _, err := b.Purge("ex", by.as...); return err }},
				{"Queue.Purge", func() error { _, err := q.Purge(by.as...); return err }},
				{"DeleteQueue", func() error { _, err := b.DeleteQueue("ex", by.as...); return err }},
				{"Consume", func() error { _, err := q.Consume(by.ctx); return err }},
				{"Get", func() error { _, err := q.Get(by.ctx); return err }},
				{"DeclareQueue", func() error { _, err := b.DeclareQueue("ex", warren.ExclusiveTo(by.ctx)); return err }},
			}
			for _, c := range calls {
				require.ErrorIs(t, c.call(), warren.ErrResourceLocked, "%s on behalf of %s", c.name, by.name)
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

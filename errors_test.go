package warren_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of the error contract (errors.go): every error path of the API returns the sentinel
// errors.go documents for it — each test asserts it with errors.Is and that the failed call
// changed nothing — and every error says "warren: " once. Tests that start consumers run in a
// synctest bubble, so they also prove that nothing is left running. Settlement errors are in
// delivery_test.go, declaration arguments in arguments_test.go.

// Names at and past the 255-byte limit, and one that is not UTF-8.
var (
	longName255     = strings.Repeat("n", 255)
	longName256     = strings.Repeat("n", 256)
	invalidUTF8Name = "bad\xff\xfename"
)

// namesOf collects an iterator of named things into their names.
func namesOf[T interface{ Name() string }](seq func(func(T) bool)) []string {
	var out []string
	for x := range seq {
		out = append(out, x.Name())
	}
	return out
}

// assertNotFound asserts that err wraps ErrNotFound, naming the call.
func assertNotFound(t *testing.T, call string, err error) {
	t.Helper()
	assert.ErrorIs(t, err, warren.ErrNotFound, "%s = %v, want ErrNotFound", call, err)
}

func TestDeclareQueueErrors(t *testing.T) {
	cases := []struct {
		name string
		want error
	}{
		{longName256, warren.ErrInvalidArgument},
		{longName256 + "x", warren.ErrInvalidArgument},
		{invalidUTF8Name, warren.ErrInvalidArgument},
		{"amq.custom", warren.ErrAccessRefused},
		{"amq.", warren.ErrAccessRefused},
		{"amq.gen-mine", warren.ErrAccessRefused},
	}
	for _, tc := range cases {
		b := newBroker(t)
		before := namesOf(b.Queues())
		q, err := b.DeclareQueue(tc.name)
		assert.ErrorIs(t, err, tc.want, "DeclareQueue(%.20q…) = %v, want %v", tc.name, err, tc.want)
		assert.Nil(t, q, "DeclareQueue(%.20q…) returned a queue with error %v", tc.name, err)
		assert.Equal(t, before, namesOf(b.Queues()), "queues after failed DeclareQueue(%.20q…)", tc.name)
		_, err = b.Queue(tc.name)
		assert.ErrorIs(t, err, warren.ErrNotFound, "Queue(%.20q…) after failed declare", tc.name)
	}

	// The boundary is valid.
	b := newBroker(t)
	q, err := b.DeclareQueue(longName255)
	require.NoError(t, err, "DeclareQueue(255 bytes)")
	assert.Equal(t, longName255, q.Name())
}

func TestDeclareExchangeErrors(t *testing.T) {
	cases := []struct {
		desc string
		name string
		kind string
		opts []warren.ExchangeOption
		want error
	}{
		{"name 256 bytes", longName256, warren.ExchangeDirect, nil, warren.ErrInvalidArgument},
		{"name not UTF-8", invalidUTF8Name, warren.ExchangeDirect, nil, warren.ErrInvalidArgument},
		{"new amq. name", "amq.custom", warren.ExchangeDirect, nil, warren.ErrAccessRefused},
		{"new amq. fanout", "amq.custom", warren.ExchangeFanout, nil, warren.ErrAccessRefused},
		{"default exchange", "", warren.ExchangeDirect, nil, warren.ErrAccessRefused},
		{"default exchange as fanout", "", warren.ExchangeFanout, nil, warren.ErrAccessRefused},
		{"unknown kind", "x", "x-consistent-hash", nil, warren.ErrInvalidArgument},
		{"empty kind", "x", "", nil, warren.ErrInvalidArgument},
		{"kind in upper case", "x", "DIRECT", nil, warren.ErrInvalidArgument},
		{"alternate-exchange int", "x", warren.ExchangeDirect,
			[]warren.ExchangeOption{warren.Arguments(warren.Table{"alternate-exchange": 42})}, warren.ErrPreconditionFailed},
		{"alternate-exchange bytes", "x", warren.ExchangeDirect,
			[]warren.ExchangeOption{warren.Arguments(warren.Table{"alternate-exchange": []byte("ae")})}, warren.ErrPreconditionFailed},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			b := newBroker(t)
			before := namesOf(b.Exchanges())
			x, err := b.DeclareExchange(tc.name, tc.kind, tc.opts...)
			assert.ErrorIs(t, err, tc.want, "DeclareExchange(%.20q…, %q) = %v, want %v", tc.name, tc.kind, err, tc.want)
			assert.Nil(t, x)
			assert.Equal(t, before, namesOf(b.Exchanges()), "exchanges after failed declare")
			if tc.name == "" {
				// The default exchange is untouched and still routes by queue name.
				d, err := b.Exchange("")
				require.NoError(t, err)
				assert.Equal(t, warren.ExchangeDirect, d.Kind())
				q := declare(t, b, "q")
				require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{}, warren.Mandatory()))
				assert.Equal(t, 1, q.Len())
			} else {
				_, err = b.Exchange(tc.name)
				assert.ErrorIs(t, err, warren.ErrNotFound, "Exchange(%.20q…) after failed declare", tc.name)
			}
		})
	}
}

func TestBindErrors(t *testing.T) {
	key256 := strings.Repeat("k", 256)
	cases := []struct {
		desc string
		call func(b *warren.Broker) error
		want error
	}{
		{"Bind missing queue", func(b *warren.Broker) error { return b.Bind("missing", "fan", "", nil) }, warren.ErrNotFound},
		{"Bind missing exchange", func(b *warren.Broker) error { return b.Bind("q", "missing", "", nil) }, warren.ErrNotFound},
		{"BindExchange missing destination", func(b *warren.Broker) error { return b.BindExchange("missing", "fan", "", nil) }, warren.ErrNotFound},
		{"BindExchange missing source", func(b *warren.Broker) error { return b.BindExchange("fan", "missing", "", nil) }, warren.ErrNotFound},
		{"Bind default exchange", func(b *warren.Broker) error { return b.Bind("q", "", "q", nil) }, warren.ErrAccessRefused},
		{"Unbind default exchange", func(b *warren.Broker) error { return b.Unbind("q", "", "q", nil) }, warren.ErrAccessRefused},
		{"BindExchange default source", func(b *warren.Broker) error { return b.BindExchange("fan", "", "", nil) }, warren.ErrAccessRefused},
		{"Bind key 256 bytes", func(b *warren.Broker) error { return b.Bind("q", "fan", key256, nil) }, warren.ErrInvalidArgument},
		{"BindExchange key 256 bytes", func(b *warren.Broker) error { return b.BindExchange("other", "fan", key256, nil) }, warren.ErrInvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			b := newBroker(t)
			q := declare(t, b, "q")
			_, err := b.DeclareExchange("fan", warren.ExchangeFanout)
			require.NoError(t, err)
			_, err = b.DeclareExchange("other", warren.ExchangeFanout)
			require.NoError(t, err)

			err = tc.call(b)
			assert.ErrorIs(t, err, tc.want, "%s = %v, want %v", tc.desc, err, tc.want)

			// No binding was made: "fan" routes nowhere, and the default exchange still routes
			// to q by name only.
			err = b.Publish(t.Context(), "fan", "", warren.Message{}, warren.Mandatory())
			assert.ErrorIs(t, err, warren.ErrUnroutable, "Publish(fan) after %s = %v, want ErrUnroutable", tc.desc, err)
			assert.Equal(t, 0, q.Len())
			require.NoError(t, b.DeleteExchange("fan", warren.IfUnused()), "fan has no bindings")
		})
	}

	// The boundary is valid.
	b := newBroker(t)
	declare(t, b, "q")
	_, err := b.DeclareExchange("d", warren.ExchangeDirect)
	require.NoError(t, err)
	require.NoError(t, b.Bind("q", "d", longName255, nil), "Bind with a 255-byte key")
	require.NoError(t, b.Publish(t.Context(), "d", longName255, warren.Message{}, warren.Mandatory()))
}

func TestPublishErrors(t *testing.T) {
	cases := []struct {
		desc     string
		exchange string
		key      string
		opts     []warren.PublishOption
		want     error // nil: accepted, and dropped
	}{
		{"missing exchange", "missing", "q", nil, warren.ErrNotFound},
		{"missing exchange mandatory", "missing", "q", []warren.PublishOption{warren.Mandatory()}, warren.ErrNotFound},
		{"internal exchange", "internal", "", nil, warren.ErrAccessRefused},
		{"routing key 256 bytes", "", longName256, nil, warren.ErrInvalidArgument},
		{"routing key 256 bytes to fanout", "fan", longName256, nil, warren.ErrInvalidArgument},
		{"mandatory, no route", "", "nosuchqueue", []warren.PublishOption{warren.Mandatory()}, warren.ErrUnroutable},
		{"mandatory, no binding", "direct", "other", []warren.PublishOption{warren.Mandatory()}, warren.ErrUnroutable},
		{"not mandatory, no route", "", "nosuchqueue", nil, nil},
		{"not mandatory, no binding", "direct", "other", nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			b := newBroker(t)
			q := declare(t, b, "q")
			for _, x := range []struct{ name, kind string }{{"internal", warren.ExchangeFanout}, {"fan", warren.ExchangeFanout}, {"direct", warren.ExchangeDirect}} {
				var opts []warren.ExchangeOption
				if x.name == "internal" {
					opts = append(opts, warren.Internal())
				}
				_, err := b.DeclareExchange(x.name, x.kind, opts...)
				require.NoError(t, err)
				require.NoError(t, b.Bind("q", x.name, "q", nil))
			}

			err := b.Publish(t.Context(), tc.exchange, tc.key, warren.Message{Body: []byte("m")}, tc.opts...)
			if tc.want == nil {
				assert.NoError(t, err, "Publish(%q, %.20q…)", tc.exchange, tc.key)
			} else {
				assert.ErrorIs(t, err, tc.want, "Publish(%q, %.20q…) = %v, want %v", tc.exchange, tc.key, err, tc.want)
			}
			assert.Equal(t, 0, q.Len(), "nothing enqueued")

			if x, err := b.Exchange(tc.exchange); err == nil {
				err := x.Publish(t.Context(), tc.key, warren.Message{Body: []byte("m")}, tc.opts...)
				if tc.want == nil {
					assert.NoError(t, err, "(*Exchange %q).Publish(%.20q…)", tc.exchange, tc.key)
				} else {
					assert.ErrorIs(t, err, tc.want, "(*Exchange %q).Publish(%.20q…) = %v, want %v", tc.exchange, tc.key, err, tc.want)
				}
				assert.Equal(t, 0, q.Len(), "nothing enqueued")
			}
		})
	}

	// The boundaries are valid.
	b := newBroker(t)
	q := declare(t, b, longName255)
	require.NoError(t, b.Publish(t.Context(), "", longName255, warren.Message{}, warren.Mandatory()), "Publish with a 255-byte key")
	assert.Equal(t, 1, q.Len())
}

func TestCancelledContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 1)
		x, err := b.Exchange("")
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()

		err = b.Publish(ctx, "", "q", warren.Message{})
		assert.True(t, err == context.Canceled, "Publish(cancelled ctx) = %v, want context.Canceled", err)
		assert.ErrorIs(t, err, context.Canceled)
		err = x.Publish(ctx, "q", warren.Message{})
		assert.True(t, err == context.Canceled, "(*Exchange).Publish(cancelled ctx) = %v, want context.Canceled", err)
		err = b.Publish(ctx, "missing", "q", warren.Message{})
		assert.True(t, err == context.Canceled, "Publish(cancelled ctx, missing exchange) = %v, want context.Canceled", err)

		d, err := q.Get(ctx)
		assert.True(t, err == context.Canceled, "Get(cancelled ctx) = %v, want context.Canceled", err)
		assert.ErrorIs(t, err, context.Canceled)
		assert.Zero(t, d)
		d, err = q.Get(ctx, warren.AutoAck())
		assert.True(t, err == context.Canceled, "Get(cancelled ctx, AutoAck) = %v, want context.Canceled", err)
		assert.Zero(t, d)

		for _, opts := range [][]warren.ConsumeOption{nil, {warren.AutoAck()}} {
			c, err := q.Consume(ctx, opts...)
			assert.True(t, err == context.Canceled, "Consume(cancelled ctx, %d opts) = %v, want context.Canceled", len(opts), err)
			assert.ErrorIs(t, err, context.Canceled)
			assert.Nil(t, c)
		}

		// A deadline is reported as itself.
		dctx, dcancel := context.WithTimeout(t.Context(), 0)
		defer dcancel()
		err = b.Publish(dctx, "", "q", warren.Message{})
		assert.True(t, err == context.DeadlineExceeded, "Publish(expired ctx) = %v, want context.DeadlineExceeded", err)

		synctest.Wait()
		assert.Equal(t, 1, q.Len(), "nothing published, nothing taken")
		assert.Equal(t, 0, q.Unacked())
		assert.Equal(t, 0, q.ConsumerCount())
	})
}

func TestGetEmpty(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	for _, opts := range [][]warren.GetOption{nil, {warren.AutoAck()}} {
		d, err := q.Get(t.Context(), opts...)
		assert.True(t, err == warren.ErrEmpty, "Get(empty, %d opts) = %v, want ErrEmpty", len(opts), err)
		assert.Zero(t, d)
	}
	// Empty again once the only message is out.
	publishN(t, b, q, 1)
	d, err := q.Get(t.Context())
	require.NoError(t, err)
	_, err = q.Get(t.Context())
	assert.ErrorIs(t, err, warren.ErrEmpty, "Get with the only message unacked")
	assert.Equal(t, 1, q.Unacked())
	require.NoError(t, d.Ack())
}

func TestConsumeInvalidOptions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		cases := []struct {
			desc string
			opts []warren.ConsumeOption
			want error
		}{
			{"Prefetch(-1)", []warren.ConsumeOption{warren.Prefetch(-1)}, warren.ErrInvalidArgument},
			{"Prefetch(65536)", []warren.ConsumeOption{warren.Prefetch(65536)}, warren.ErrInvalidArgument},
			{"Prefetch(0), unlimited", []warren.ConsumeOption{warren.Prefetch(0)}, nil},
			{"Prefetch(0), AutoAck: the default", []warren.ConsumeOption{warren.Prefetch(0), warren.AutoAck()}, nil},
			{"ConsumerTag(256 bytes)", []warren.ConsumeOption{warren.ConsumerTag(longName256)}, warren.ErrInvalidArgument},
			{"Prefetch(1)", []warren.ConsumeOption{warren.Prefetch(1)}, nil},
			{"Prefetch(65535)", []warren.ConsumeOption{warren.Prefetch(65535)}, nil},
		}
		for _, tc := range cases {
			c, err := q.Consume(t.Context(), tc.opts...)
			if tc.want == nil {
				require.NoError(t, err, "Consume(%s)", tc.desc)
				require.NoError(t, c.Cancel())
				continue
			}
			assert.ErrorIs(t, err, tc.want, "Consume(%s) = %v, want %v", tc.desc, err, tc.want)
			assert.Nil(t, c)
			assert.Equal(t, 0, q.ConsumerCount(), "after Consume(%s)", tc.desc)
		}
	})
}

func TestDuplicateConsumerTag(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		other := declare(t, b, "other")
		for _, first := range [][]warren.ConsumeOption{nil, {warren.AutoAck()}} {
			c1, err := q.Consume(t.Context(), append(first, warren.ConsumerTag("t"))...)
			require.NoError(t, err)
			for _, second := range [][]warren.ConsumeOption{nil, {warren.AutoAck()}} {
				c2, err := q.Consume(t.Context(), append(second, warren.ConsumerTag("t"))...)
				assert.ErrorIs(t, err, warren.ErrPreconditionFailed, "Consume(tag t) while t is active = %v, want ErrPreconditionFailed", err)
				assert.Nil(t, c2)
				assert.Equal(t, 1, q.ConsumerCount())
			}
			assert.NoError(t, c1.Err(), "the first consumer is still active")

			// The tag is per queue.
			c3, err := other.Consume(t.Context(), warren.ConsumerTag("t"))
			require.NoError(t, err, "Consume(tag t) on another queue")
			require.NoError(t, c3.Cancel())

			// A cancelled consumer's tag is free again.
			require.NoError(t, c1.Cancel())
			c4, err := q.Consume(t.Context(), warren.ConsumerTag("t"))
			require.NoError(t, err, "Consume(tag t) after Cancel")
			assert.Equal(t, "t", c4.Tag())
			require.NoError(t, c4.Cancel())
		}

		// So is the tag of a consumer whose context ended.
		ctx, cancel := context.WithCancel(t.Context())
		_, err := q.Consume(ctx, warren.ConsumerTag("t"))
		require.NoError(t, err)
		cancel()
		synctest.Wait()
		c, err := q.Consume(t.Context(), warren.ConsumerTag("t"))
		require.NoError(t, err, "Consume(tag t) after the context of the first ended")
		require.NoError(t, c.Cancel())
	})
}

func TestDeleteQueuePreconditions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)

		// IfUnused with a push consumer, and with an AutoAck one.
		for _, opts := range [][]warren.ConsumeOption{nil, {warren.AutoAck()}} {
			q := declare(t, b, "q")
			c, err := q.Consume(t.Context(), opts...)
			require.NoError(t, err)
			_, err = b.DeleteQueue("q", warren.IfUnused())
			assert.ErrorIs(t, err, warren.ErrPreconditionFailed, "DeleteQueue(q, IfUnused) with a consumer = %v, want ErrPreconditionFailed", err)
			got, err := b.Queue("q")
			require.NoError(t, err, "the queue still exists")
			assert.Same(t, q, got)
			assert.NoError(t, c.Err(), "the consumer is still active")
			publishN(t, b, q, 1)
			synctest.Wait()
			d := <-c.Deliveries()
			if len(opts) == 0 {
				require.NoError(t, d.Ack())
			}
			require.NoError(t, c.Cancel())
			deleteQueue(t, b, "q", warren.IfUnused())
		}

		// IfEmpty with ready messages.
		q := declare(t, b, "q")
		publishN(t, b, q, 2)
		_, err := b.DeleteQueue("q", warren.IfEmpty())
		assert.ErrorIs(t, err, warren.ErrPreconditionFailed, "DeleteQueue(q, IfEmpty) with ready messages = %v, want ErrPreconditionFailed", err)
		_, err = b.DeleteQueue("q", warren.IfEmpty(), warren.IfUnused())
		assert.ErrorIs(t, err, warren.ErrPreconditionFailed, "DeleteQueue(q, IfEmpty, IfUnused) with ready messages = %v, want ErrPreconditionFailed", err)
		assert.Equal(t, 2, q.Len())

		// IfEmpty with only unacknowledged messages succeeds (R6.13).
		d1, err := q.Get(t.Context())
		require.NoError(t, err)
		d2, err := q.Get(t.Context())
		require.NoError(t, err)
		deleteQueue(t, b, "q", warren.IfEmpty())
		_, err = b.Queue("q")
		assertNotFound(t, "Queue(q) after delete", err)
		assert.NoError(t, d1.Ack(), "Ack after delete: a no-op")
		assert.NoError(t, d2.Nack(), "Nack after delete: a no-op")

		// Deleting what does not exist succeeds.
		deleteQueue(t, b, "q")
		deleteQueue(t, b, "never", warren.IfUnused(), warren.IfEmpty())
	})
}

func TestDeleteExchangeErrors(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	_, err := b.DeclareExchange("x", warren.ExchangeFanout)
	require.NoError(t, err)
	require.NoError(t, b.Bind("q", "x", "", nil))

	err = b.DeleteExchange("x", warren.IfUnused())
	assert.ErrorIs(t, err, warren.ErrPreconditionFailed, "DeleteExchange(x, IfUnused) with a binding = %v, want ErrPreconditionFailed", err)
	require.NoError(t, b.Publish(t.Context(), "x", "", warren.Message{}, warren.Mandatory()), "the binding still routes")
	assert.Equal(t, 1, q.Len())

	for _, name := range []string{"", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match", "amq.missing"} {
		for _, opts := range [][]warren.DeleteOption{nil, {warren.IfUnused()}} {
			err := b.DeleteExchange(name, opts...)
			assert.ErrorIs(t, err, warren.ErrAccessRefused, "DeleteExchange(%q) = %v, want ErrAccessRefused", name, err)
		}
	}
	for _, name := range []string{"", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"} {
		_, err := b.Exchange(name)
		assert.NoError(t, err, "Exchange(%q) after refused delete", name)
	}
	require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{}, warren.Mandatory()), "default exchange still routes")

	assert.NoError(t, b.DeleteExchange("missing"), "DeleteExchange(missing)")
	assert.NoError(t, b.DeleteExchange("missing", warren.IfUnused()), "DeleteExchange(missing, IfUnused)")

	// Being the destination of an exchange-to-exchange binding does not count as used.
	_, err = b.DeclareExchange("src", warren.ExchangeFanout)
	require.NoError(t, err)
	_, err = b.DeclareExchange("dst", warren.ExchangeFanout)
	require.NoError(t, err)
	require.NoError(t, b.BindExchange("dst", "src", "", nil))
	assert.NoError(t, b.DeleteExchange("dst", warren.IfUnused()), "DeleteExchange(destination only, IfUnused)")
}

func TestAfterDeleteQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		_, err := b.DeclareExchange("x", warren.ExchangeFanout)
		require.NoError(t, err)
		require.NoError(t, b.Bind("q", "x", "", nil))
		c, err := q.Consume(t.Context(), warren.Prefetch(2))
		require.NoError(t, err)
		auto, err := q.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(1))
		require.NoError(t, err)
		publishN(t, b, q, 6)
		synctest.Wait()
		d := receive(t, c, 1)[0] // one received, one buffered
		g, err := q.Get(t.Context())
		require.NoError(t, err)

		deleteQueue(t, b, "q")
		synctest.Wait()

		_, err = q.Get(t.Context())
		assertNotFound(t, "Get", err)
		assert.ErrorIs(t, err, warren.ErrQueueDeleted)
		_, err = q.Get(t.Context(), warren.AutoAck())
		assertNotFound(t, "Get(AutoAck)", err)
		c2, err := q.Consume(t.Context())
		assertNotFound(t, "Consume", err)
		assert.Nil(t, c2)
		_, err = q.Consume(t.Context(), warren.AutoAck())
		assertNotFound(t, "Consume(AutoAck)", err)
		n, err := q.Purge()
		assertNotFound(t, "Purge", err)
		assert.Equal(t, 0, n)
		_, err = b.Purge("q")
		assertNotFound(t, "Broker.Purge", err)
		_, err = b.Queue("q")
		assertNotFound(t, "Queue", err)
		// Settling a deleted queue's delivery is a no-op, as in RabbitMQ: once.
		assert.NoError(t, d.Ack(), "d.Ack")
		assert.ErrorIs(t, d.Nack(), warren.ErrAlreadySettled, "d.Nack after d.Ack")
		assert.ErrorIs(t, d.Reject(), warren.ErrAlreadySettled, "d.Reject after d.Ack")
		assert.NoError(t, g.Nack(), "g.Nack")
		assert.ErrorIs(t, g.Ack(), warren.ErrAlreadySettled, "g.Ack after g.Nack")
		assert.NoError(t, c.AckUpTo(0), "AckUpTo")
		assert.ErrorIs(t, c.NackUpTo(d.DeliveryTag), warren.ErrUnknownDelivery, "NackUpTo a settled tag")
		assert.NoError(t, c.RejectUpTo(0), "RejectUpTo")
		assert.NoError(t, c.Recover(), "Recover")
		err = b.Bind("q", "x", "", nil)
		assertNotFound(t, "Bind(deleted queue)", err)

		for _, cons := range []*warren.Consumer{c, auto} {
			err := cons.Err()
			assert.ErrorIs(t, err, warren.ErrQueueDeleted, "Err() = %v, want ErrQueueDeleted", err)
			assert.ErrorIs(t, err, warren.ErrNotFound, "Err() = %v, want it to wrap ErrNotFound", err)
			select {
			case <-cons.Done():
			default:
				t.Errorf("Done() not closed after DeleteQueue")
			}
			// Nothing buffered remains; the channel is closed.
			select {
			case d, ok := <-cons.Deliveries():
				assert.False(t, ok, "Deliveries() yielded %v after DeleteQueue, want closed", d)
			default:
				t.Errorf("Deliveries() not closed after DeleteQueue")
			}
			assert.NoError(t, cons.Cancel(), "Cancel after DeleteQueue")
			assert.ErrorIs(t, cons.Err(), warren.ErrQueueDeleted, "Err() after Cancel still says why it stopped")
		}
		assert.Equal(t, 0, q.Len())
		assert.Equal(t, 0, q.Unacked())
		assert.Equal(t, 0, q.ConsumerCount())

		// The binding went with the queue; a new queue of the same name is a different queue.
		err = b.Publish(t.Context(), "x", "", warren.Message{}, warren.Mandatory())
		assert.ErrorIs(t, err, warren.ErrUnroutable, "Publish(x) after its only queue was deleted = %v", err)
		q2 := declare(t, b, "q")
		assert.NotSame(t, q, q2)
		publishN(t, b, q2, 1)
		_, err = q.Get(t.Context())
		assertNotFound(t, "old handle Get after redeclare", err)
		assert.Equal(t, 1, q2.Len())
	})
}

func TestExchangePublishAfterDelete(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	x, err := b.DeclareExchange("x", warren.ExchangeFanout)
	require.NoError(t, err)
	require.NoError(t, b.Bind("q", "x", "", nil))
	require.NoError(t, b.DeleteExchange("x"))

	err = x.Publish(t.Context(), "", warren.Message{})
	assertNotFound(t, "(*Exchange).Publish after delete", err)
	err = b.Publish(t.Context(), "x", "", warren.Message{})
	assertNotFound(t, "Publish(x) after delete", err)
	_, err = b.Exchange("x")
	assertNotFound(t, "Exchange(x) after delete", err)

	// Redeclared under the same name, the old handle still refers to the deleted exchange.
	x2, err := b.DeclareExchange("x", warren.ExchangeFanout)
	require.NoError(t, err)
	require.NoError(t, b.Bind("q", "x", "", nil))
	err = x.Publish(t.Context(), "", warren.Message{})
	assertNotFound(t, "old (*Exchange).Publish after redeclare", err)
	assert.Equal(t, 0, q.Len())
	require.NoError(t, x2.Publish(t.Context(), "", warren.Message{}, warren.Mandatory()))
	assert.Equal(t, 1, q.Len())
}

func TestAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := warren.New()
		q := declare(t, b, "q")
		x, err := b.DeclareExchange("x", warren.ExchangeFanout)
		require.NoError(t, err)
		require.NoError(t, b.Bind("q", "x", "", nil))
		_, err = b.DeclareExchange("y", warren.ExchangeFanout)
		require.NoError(t, err)
		c, err := q.Consume(t.Context(), warren.Prefetch(2))
		require.NoError(t, err)
		auto, err := q.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(1))
		require.NoError(t, err)
		publishN(t, b, q, 8)
		synctest.Wait()
		d := receive(t, c, 1)[0]
		g, err := q.Get(t.Context())
		require.NoError(t, err)

		require.NoError(t, b.Close())
		require.NoError(t, b.Close(), "second Close")

		calls := []struct {
			call string
			f    func() error
		}{
			{"DeclareQueue(q)", func() error { _, err := b.DeclareQueue("q"); return err }},
			{"DeclareQueue(new)", func() error { _, err := b.DeclareQueue("new"); return err }},
			{`DeclareQueue("")`, func() error { _, err := b.DeclareQueue(""); return err }},
			{"DeclareExchange(x)", func() error { _, err := b.DeclareExchange("x", warren.ExchangeFanout); return err }},
			{"DeclareExchange(new)", func() error { _, err := b.DeclareExchange("new", warren.ExchangeDirect); return err }},
			{"Bind", func() error { return b.Bind("q", "y", "", nil) }},
			{"Unbind", func() error { return b.Unbind("q", "x", "", nil) }},
			{"BindExchange", func() error { return b.BindExchange("y", "x", "", nil) }},
			{"UnbindExchange", func() error { return b.UnbindExchange("y", "x", "", nil) }},
			{"Publish", func() error { return b.Publish(t.Context(), "", "q", warren.Message{}) }},
			{"Publish(x)", func() error { return b.Publish(t.Context(), "x", "", warren.Message{}) }},
			{"Publish(missing)", func() error { return b.Publish(t.Context(), "missing", "", warren.Message{}) }},
			{"(*Exchange).Publish", func() error { return x.Publish(t.Context(), "", warren.Message{}) }},
			{"Get", func() error { _, err := q.Get(t.Context()); return err }},
			{"Get(AutoAck)", func() error { _, err := q.Get(t.Context(), warren.AutoAck()); return err }},
			{"Consume", func() error { _, err := q.Consume(t.Context()); return err }},
			{"Consume(AutoAck)", func() error { _, err := q.Consume(t.Context(), warren.AutoAck()); return err }},
			{"Purge", func() error { _, err := q.Purge(); return err }},
			{"Broker.Purge", func() error { _, err := b.Purge("q"); return err }},
			{"DeleteQueue(q)", func() error { _, err := b.DeleteQueue("q"); return err }},
			{"DeleteQueue(missing)", func() error { _, err := b.DeleteQueue("missing"); return err }},
			{"DeleteExchange(x)", func() error { return b.DeleteExchange("x") }},
			{"DeleteExchange(missing)", func() error { return b.DeleteExchange("missing") }},
			{"Queue(q)", func() error { _, err := b.Queue("q"); return err }},
			{"Exchange(x)", func() error { _, err := b.Exchange("x"); return err }},
			{"Exchange(\"\")", func() error { _, err := b.Exchange(""); return err }},
			{"d.Ack", d.Ack},
			{"d.Nack", d.Nack},
			{"d.Reject", d.Reject},
			{"g.Ack", g.Ack},
			{"g.Nack", g.Nack},
			{"g.Reject", g.Reject},
			{"AckUpTo(0)", func() error { return c.AckUpTo(0) }},
			{"AckUpTo(tag)", func() error { return c.AckUpTo(d.DeliveryTag) }},
			{"NackUpTo", func() error { return c.NackUpTo(0) }},
			{"RejectUpTo", func() error { return c.RejectUpTo(0) }},
			{"Recover", c.Recover},
			{"auto.AckUpTo", func() error { return auto.AckUpTo(0) }},
			{"auto.Recover", auto.Recover},
		}
		for _, tc := range calls {
			err := tc.f()
			assert.ErrorIs(t, err, warren.ErrClosed, "%s after Close = %v, want ErrClosed", tc.call, err)
		}
		for _, tc := range calls {
			if err := tc.f(); !errors.Is(err, warren.ErrClosed) {
				t.Errorf("%s after Close, twice = %v, want ErrClosed", tc.call, err)
			}
		}

		for _, cons := range []*warren.Consumer{c, auto} {
			assert.True(t, cons.Err() == warren.ErrClosed, "Err() after Close = %v, want ErrClosed", cons.Err())
			select {
			case d, ok := <-cons.Deliveries():
				assert.False(t, ok, "Deliveries() yielded %v after Close, want closed", d)
			default:
				t.Errorf("Deliveries() not closed after Close")
			}
			select {
			case <-cons.Done():
			default:
				t.Errorf("Done() not closed after Close")
			}
			assert.NoError(t, cons.Cancel(), "Cancel after Close")
			assert.True(t, cons.Err() == warren.ErrClosed, "Err() after Close and Cancel = %v, want ErrClosed", cons.Err())
		}
		require.NoError(t, b.Close(), "third Close")
	})
}

func TestBindDefaultExchangeAsDestination(t *testing.T) {
	b := newBroker(t)
	_, err := b.DeclareExchange("x", warren.ExchangeFanout)
	require.NoError(t, err)
	require.ErrorIs(t, b.BindExchange("", "x", "", nil), warren.ErrAccessRefused)
	require.ErrorIs(t, b.UnbindExchange("", "x", "", nil), warren.ErrAccessRefused)
}

// TestErrorsSayWarrenOnce checks that an error's text names the package once, at the start,
// however many layers wrap it: a declaration's option error inside its argument error inside the
// declaration, a consumer's end inside a queue's deletion, a sentinel wrapping a sentinel.
func TestErrorsSayWarrenOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		var errs []error
		add := func(err error) {
			t.Helper()
			require.Error(t, err)
			errs = append(errs, err)
		}
		_, err := b.DeclareQueue("q2", warren.MessageTTL(1500*time.Microsecond))
		add(err)
		_, err = b.DeclareQueue("q3", warren.Arguments(warren.Table{"x-nested": warren.Table{"k": struct{}{}}}))
		add(err)
		declare(t, b, "q", warren.DeliveryLimit(1))
		_, err = b.DeclareQueue("q", warren.DeliveryLimit(2))
		add(err)
		add(b.Bind("missing", "amq.fanout", "", nil))
		add(b.Publish(t.Context(), "", "q", warren.Message{Expiration: "soon"}))
		_, err = b.DeclareQueue("amq.q")
		add(err)

		slow := declare(t, b, "slow", warren.WithAlerts(warren.Alerts{Messages: 1, Policy: warren.Delete}))
		sc, err := slow.Consume(t.Context(), warren.Prefetch(1))
		require.NoError(t, err)
		require.NoError(t, b.Publish(t.Context(), "", "slow", warren.Message{}))
		require.NoError(t, b.Publish(t.Context(), "", "slow", warren.Message{}))
		<-sc.Done()
		add(sc.Err())
		require.ErrorIs(t, sc.Err(), warren.ErrSlowConsumer)
		timed := declare(t, b, "timed")
		tc, err := timed.Consume(t.Context(), warren.AckTimeout(time.Second))
		require.NoError(t, err)
		require.NoError(t, b.Publish(t.Context(), "", "timed", warren.Message{}))
		time.Sleep(2 * time.Second)
		synctest.Wait()
		add(tc.Err())

		q := declare(t, b, "doomed")
		c, err := q.Consume(t.Context())
		require.NoError(t, err)
		_, err = q.Consume(t.Context(), warren.Prefetch(-1))
		add(err)
		deleteQueue(t, b, "doomed")
		add(c.Err())
		_, err = q.Get(t.Context())
		add(err)
		add(warren.Permanent(warren.ErrQueueDeleted))

		for _, err := range errs {
			requireOnePrefix(t, err)
		}
	})
}

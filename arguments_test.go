package warren_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of declaration arguments (options.go, ttl.go; arguments.go to come): RabbitMQ's
// x-arguments and the options that set them are parsed and validated at declaration (an
// invalid argument is ErrPreconditionFailed, an invalid option ErrInvalidArgument), hold AMQP
// field values only, and decide whether a redeclaration is equivalent.

// TestArgumentsMustBeAMQPTypes: declaration and binding arguments hold AMQP field values, as a
// RabbitMQ client would send them; anything else is refused (RabbitMQ answers 406), rather than
// kept and never equal to itself on redeclaration.
func TestArgumentsMustBeAMQPTypes(t *testing.T) {
	b := newBroker(t)
	_, err := b.DeclareExchange("x", warren.ExchangeHeaders)
	require.NoError(t, err)
	declare(t, b, "q")
	for _, v := range []any{time.Second, []string{"a"}, struct{}{}, uint64(1), warren.Table{"nested": []int{1}}} {
		_, err := b.DeclareQueue("q2", warren.Arguments(warren.Table{"k": v}))
		require.ErrorIs(t, err, warren.ErrPreconditionFailed, "DeclareQueue with %T", v)
		_, err = b.DeclareExchange("x2", warren.ExchangeDirect, warren.Arguments(warren.Table{"k": v}))
		require.ErrorIs(t, err, warren.ErrPreconditionFailed, "DeclareExchange with %T", v)
		require.ErrorIs(t, b.Bind("q", "x", "", warren.Table{"k": v}), warren.ErrPreconditionFailed, "Bind with %T", v)
	}
	_, err = b.Queue("q2")
	require.ErrorIs(t, err, warren.ErrNotFound, "nothing was declared")
	ok := warren.Table{"i": int32(1), "s": "a", "t": time.Unix(0, 0), "l": []any{int64(1), "b"},
		"n": warren.Table{"f": 1.5}, "d": warren.Decimal{Scale: 1, Value: 5}, "nil": nil, "b": []byte("x")}
	_, err = b.DeclareQueue("q3", warren.Arguments(ok))
	require.NoError(t, err)
	_, err = b.DeclareQueue("q3", warren.Arguments(ok))
	require.NoError(t, err, "an equivalent redeclaration")
	require.NoError(t, b.Bind("q", "x", "", ok))
}

func TestArgumentsThatContainThemselves(t *testing.T) {
	b := newBroker(t)
	self := warren.Table{}
	self["me"] = self
	_, err := b.DeclareQueue("q", warren.Arguments(warren.Table{"k": self}))
	require.ErrorIs(t, err, warren.ErrPreconditionFailed)
}

// TestQueueTypeClassicOnly: "x-queue-type" may be absent or "classic", the one kind of queue warren
// implements; anything else — "quorum" and "stream", which would silently become classic queues,
// another string, another type (a NaN among them, which FuzzQueueArguments once found could not
// be redeclared) — is refused with ErrPreconditionFailed, naming the value.
func TestQueueTypeClassicOnly(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q", warren.Arguments(warren.Table{"x-queue-type": "classic"}))
	again, err := b.DeclareQueue("q", warren.Arguments(warren.Table{"x-queue-type": "classic"}))
	require.NoError(t, err)
	require.Same(t, q, again)
	for _, v := range []any{"quorum", "stream", "weird", "", []byte("classic"), 1, math.NaN()} {
		_, err := b.DeclareQueue("other", warren.Arguments(warren.Table{"x-queue-type": v}))
		require.ErrorIs(t, err, warren.ErrPreconditionFailed, "x-queue-type %v (%T)", v, v)
		require.ErrorContains(t, err, fmt.Sprint(v))
		require.ErrorContains(t, err, "classic")
		require.False(t, queueExists(t, b, "other"))
	}
}

func TestTTLArguments(t *testing.T) {
	b := newBroker(t)
	for _, v := range []any{"1000", 1.5, int64(-1), int64(1 << 32), true} {
		_, err := b.DeclareQueue("q", warren.Arguments(warren.Table{"x-message-ttl": v}))
		require.ErrorIs(t, err, warren.ErrPreconditionFailed, "x-message-ttl %#v", v)
	}
	for _, d := range []time.Duration{-time.Millisecond, time.Microsecond, 1<<32*time.Millisecond + time.Millisecond} {
		_, err := b.DeclareQueue("q", warren.MessageTTL(d))
		require.ErrorIs(t, err, warren.ErrInvalidArgument, "MessageTTL(%v)", d)
	}
	q, err := b.DeclareQueue("q", warren.MessageTTL(time.Second))
	require.NoError(t, err)
	same, err := b.DeclareQueue("q", warren.Arguments(warren.Table{"x-message-ttl": int32(1000)}))
	require.NoError(t, err, "the option and the argument are the same declaration")
	require.Same(t, q, same)
	_, err = b.DeclareQueue("q", warren.MessageTTL(2*time.Second))
	require.ErrorIs(t, err, warren.ErrPreconditionFailed)

	_, err = b.DeclareQueue("d1", warren.Arguments(warren.Table{"x-dead-letter-exchange": 1}))
	require.ErrorIs(t, err, warren.ErrPreconditionFailed)
	_, err = b.DeclareQueue("d2", warren.Arguments(warren.Table{"x-dead-letter-routing-key": "k"}))
	require.ErrorIs(t, err, warren.ErrPreconditionFailed, "a routing key without an exchange (R4.1)")
	_, err = b.DeclareQueue("d3", warren.DeadLetter("dlx", "k"))
	require.NoError(t, err)
	_, err = b.DeclareQueue("d3", warren.DeadLetter("dlx", "other"))
	require.ErrorIs(t, err, warren.ErrPreconditionFailed)
}

func TestLimitArguments(t *testing.T) {
	b := newBroker(t)
	bad := []warren.Table{
		{"x-max-length": int64(-1)}, {"x-max-length": "3"}, {"x-max-length-bytes": 1.5},
		{"x-overflow": "drop-tail"}, {"x-overflow": 1}, {"x-delivery-limit": int64(-2)},
		{"x-expires": int64(0)}, {"x-expires": int64(-5)}, {"x-expires": int64(1 << 32)},
	}
	for _, args := range bad {
		_, err := b.DeclareQueue("q", warren.Arguments(args))
		require.ErrorIs(t, err, warren.ErrPreconditionFailed, "%v", args)
	}
	for _, opt := range []warren.QueueOption{warren.MaxLength(-1), warren.MaxLengthBytes(-1), warren.DeliveryLimit(-1)} {
		_, err := b.DeclareQueue("q", opt)
		require.ErrorIs(t, err, warren.ErrInvalidArgument)
	}
	q, err := b.DeclareQueue("q", warren.MaxLength(3), warren.Overflow(warren.RejectPublish))
	require.NoError(t, err)
	same, err := b.DeclareQueue("q", warren.Arguments(warren.Table{"x-max-length": int16(3), "x-overflow": "reject-publish"}))
	require.NoError(t, err)
	require.Same(t, q, same)
	_, err = b.DeclareQueue("q", warren.MaxLength(4), warren.Overflow(warren.RejectPublish))
	require.ErrorIs(t, err, warren.ErrPreconditionFailed)
	_, err = b.DeclareQueue("d", warren.Arguments(warren.Table{"x-delivery-limit": int64(-1)}))
	require.NoError(t, err, "-1 means no limit, as in RabbitMQ 4")
}

// TestPriorityQueueArguments: "x-max-priority" must be an integer from 0 to 255
// (ErrPreconditionFailed); MaxPriority must be from 1 to 255 (ErrInvalidArgument); a
// redeclaration must have the same maximum.
func TestPriorityQueueArguments(t *testing.T) {
	b := newBroker(t)
	for _, v := range []any{int32(-1), int32(256), int64(1000), "5", 5.5, true} {
		_, err := b.DeclareQueue("bad", warren.Arguments(warren.Table{"x-max-priority": v}))
		require.ErrorIs(t, err, warren.ErrPreconditionFailed, "x-max-priority %v (%T)", v, v)
	}
	for _, n := range []int{0, -1, 256} {
		_, err := b.DeclareQueue("bad", warren.MaxPriority(n))
		require.ErrorIs(t, err, warren.ErrInvalidArgument, "MaxPriority(%d)", n)
	}
	require.False(t, queueExists(t, b, "bad"))

	declare(t, b, "p1", warren.MaxPriority(1))
	declare(t, b, "p255", warren.MaxPriority(255))
	declare(t, b, "a0", warren.Arguments(warren.Table{"x-max-priority": int32(0)}))
	declare(t, b, "a255", warren.Arguments(warren.Table{"x-max-priority": uint8(255)}))

	declare(t, b, "pq", warren.MaxPriority(5))
	_, err := b.DeclareQueue("pq", warren.MaxPriority(6))
	require.ErrorIs(t, err, warren.ErrPreconditionFailed, "another maximum")
	_, err = b.DeclareQueue("pq")
	require.ErrorIs(t, err, warren.ErrPreconditionFailed, "no maximum")
	_, err = b.DeclareQueue("pq", warren.MaxPriority(5))
	require.NoError(t, err)
	declare(t, b, "plain")
	_, err = b.DeclareQueue("plain", warren.MaxPriority(5))
	require.ErrorIs(t, err, warren.ErrPreconditionFailed, "a maximum on a queue without one")
}

// ---------------------------------------------------------------------------------------------
// Equivalence on redeclaration.

func TestRedeclareQueue(t *testing.T) {
	args := func(t warren.Table) []warren.QueueOption { return []warren.QueueOption{warren.Arguments(t)} }
	cases := []struct {
		desc          string
		first, second []warren.QueueOption
		want          error // nil: equivalent
	}{
		{"same", nil, nil, nil},
		{"durable then transient", []warren.QueueOption{warren.Durable()}, nil, warren.ErrPreconditionFailed},
		{"transient then durable", nil, []warren.QueueOption{warren.Durable()}, warren.ErrPreconditionFailed},
		{"auto-delete then not", []warren.QueueOption{warren.AutoDelete()}, nil, warren.ErrPreconditionFailed},
		{"not then auto-delete", nil, []warren.QueueOption{warren.AutoDelete()}, warren.ErrPreconditionFailed},
		{"x-max-length differs", args(warren.Table{"x-max-length": 10}), args(warren.Table{"x-max-length": 20}), warren.ErrPreconditionFailed},
		{"x-max-length dropped", args(warren.Table{"x-max-length": 10}), nil, warren.ErrPreconditionFailed},
		{"x-max-length added", nil, args(warren.Table{"x-max-length": 10}), warren.ErrPreconditionFailed},
		{"x-message-ttl differs", args(warren.Table{"x-message-ttl": 1000}), args(warren.Table{"x-message-ttl": 2000}), warren.ErrPreconditionFailed},
		{"x-dead-letter-exchange differs", args(warren.Table{"x-dead-letter-exchange": "a"}), args(warren.Table{"x-dead-letter-exchange": "b"}), warren.ErrPreconditionFailed},
		{"x-max-length same", args(warren.Table{"x-max-length": 10}), args(warren.Table{"x-max-length": 10}), nil},
		{"unrecognised argument differs", args(warren.Table{"x-custom": 1}), args(warren.Table{"x-custom": 2}), nil},
		{"unrecognised argument added", nil, args(warren.Table{"x-custom": "v", "app": true}), nil},
		{"unrecognised argument dropped", args(warren.Table{"x-custom": "v"}), nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			b := newBroker(t)
			q := declare(t, b, "q", tc.first...)
			publishN(t, b, q, 2)

			got, err := b.DeclareQueue("q", tc.second...)
			if tc.want == nil {
				require.NoError(t, err, "DeclareQueue(q, second)")
				assert.Same(t, q, got)
			} else {
				assert.ErrorIs(t, err, tc.want, "DeclareQueue(q, second) = %v, want %v", err, tc.want)
				assert.Nil(t, got)
			}
			// The queue is unchanged: same handle, same messages, and the first declaration is
			// still equivalent.
			again, err := b.DeclareQueue("q", tc.first...)
			require.NoError(t, err, "DeclareQueue(q, first) after the redeclaration")
			assert.Same(t, q, again)
			assert.Equal(t, 2, q.Len())
		})
	}
}

func TestRedeclareExchange(t *testing.T) {
	type decl struct {
		kind string
		opts []warren.ExchangeOption
	}
	direct := func(opts ...warren.ExchangeOption) decl { return decl{warren.ExchangeDirect, opts} }
	cases := []struct {
		desc          string
		first, second decl
		want          error // nil: equivalent
	}{
		{"same", direct(), direct(), nil},
		{"kind", direct(), decl{warren.ExchangeFanout, nil}, warren.ErrPreconditionFailed},
		{"kind topic", direct(), decl{warren.ExchangeTopic, nil}, warren.ErrPreconditionFailed},
		{"durable then transient", direct(warren.Durable()), direct(), warren.ErrPreconditionFailed},
		{"transient then durable", direct(), direct(warren.Durable()), warren.ErrPreconditionFailed},
		{"auto-delete", direct(warren.AutoDelete()), direct(), warren.ErrPreconditionFailed},
		{"auto-delete added", direct(), direct(warren.AutoDelete()), warren.ErrPreconditionFailed},
		{"internal", direct(warren.Internal()), direct(), warren.ErrPreconditionFailed},
		{"internal added", direct(), direct(warren.Internal()), warren.ErrPreconditionFailed},
		{"alternate dropped", direct(warren.AlternateExchange("ae")), direct(), warren.ErrPreconditionFailed},
		{"alternate added", direct(), direct(warren.AlternateExchange("ae")), warren.ErrPreconditionFailed},
		{"alternate differs", direct(warren.AlternateExchange("ae")), direct(warren.AlternateExchange("other")), warren.ErrPreconditionFailed},
		{"alternate as argument differs", direct(warren.AlternateExchange("ae")),
			direct(warren.Arguments(warren.Table{"alternate-exchange": "other"})), warren.ErrPreconditionFailed},
		{"alternate non-string", direct(warren.AlternateExchange("ae")),
			direct(warren.Arguments(warren.Table{"alternate-exchange": 7})), warren.ErrPreconditionFailed},
		{"alternate as option and as argument", direct(warren.AlternateExchange("ae")),
			direct(warren.Arguments(warren.Table{"alternate-exchange": "ae"})), nil},
		{"unknown argument differs", direct(warren.Arguments(warren.Table{"x-custom": 1})),
			direct(warren.Arguments(warren.Table{"x-custom": 2})), nil},
		{"unknown argument added", direct(), direct(warren.Arguments(warren.Table{"x-custom": "v"})), nil},
		{"unknown argument dropped", direct(warren.Arguments(warren.Table{"x-custom": "v"})), direct(), nil},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			b := newBroker(t)
			x, err := b.DeclareExchange("x", tc.first.kind, tc.first.opts...)
			require.NoError(t, err)

			got, err := b.DeclareExchange("x", tc.second.kind, tc.second.opts...)
			if tc.want == nil {
				require.NoError(t, err, "DeclareExchange(x, second)")
				assert.Same(t, x, got)
			} else {
				assert.ErrorIs(t, err, tc.want, "DeclareExchange(x, %s, second) = %v, want %v", tc.second.kind, err, tc.want)
				assert.Nil(t, got)
			}
			cur, err := b.Exchange("x")
			require.NoError(t, err)
			assert.Same(t, x, cur)
			assert.Equal(t, tc.first.kind, cur.Kind())
			again, err := b.DeclareExchange("x", tc.first.kind, tc.first.opts...)
			require.NoError(t, err, "DeclareExchange(x, first) after the redeclaration")
			assert.Same(t, x, again)
		})
	}
}

// TestDeclarePredeclaredExchange: an existing "amq." exchange is compared, not refused. The
// predeclared exchanges are durable, as in RabbitMQ, so only a durable redeclaration of the
// same kind is equivalent.
func TestDeclarePredeclaredExchange(t *testing.T) {
	b := newBroker(t)
	want, err := b.Exchange("amq.direct")
	require.NoError(t, err)

	x, err := b.DeclareExchange("amq.direct", warren.ExchangeDirect, warren.Durable())
	require.NoError(t, err, `DeclareExchange("amq.direct", direct, Durable())`)
	assert.Same(t, want, x, "redeclare returns the predeclared exchange")

	x, err = b.DeclareExchange("amq.direct", warren.ExchangeFanout, warren.Durable())
	assert.ErrorIs(t, err, warren.ErrPreconditionFailed, `DeclareExchange("amq.direct", fanout) = %v, want ErrPreconditionFailed`, err)
	assert.Nil(t, x)

	x, err = b.DeclareExchange("amq.direct", warren.ExchangeDirect)
	assert.ErrorIs(t, err, warren.ErrPreconditionFailed, `DeclareExchange("amq.direct", direct) non-durable = %v, want ErrPreconditionFailed`, err)
	assert.Nil(t, x)

	got, err := b.Exchange("amq.direct")
	require.NoError(t, err)
	assert.Same(t, want, got)
	assert.Equal(t, warren.ExchangeDirect, got.Kind())

	x, err = b.DeclareExchange("amq.fanout", warren.ExchangeFanout, warren.Durable())
	require.NoError(t, err, `DeclareExchange("amq.fanout", fanout, Durable())`)
	assert.Equal(t, "amq.fanout", x.Name())
}

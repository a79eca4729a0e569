package warren_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of Broker.Topology and Broker.DeclareTopology (topology.go).

// richTopology declares on b a topology with one of everything a topology holds, and some of
// what it leaves out: an exclusive queue (and its binding), the predeclared exchanges.
func richTopology(t *testing.T, b *warren.Broker) {
	t.Helper()
	declareExchange(t, b, "orders", warren.ExchangeTopic, warren.Durable())
	declareExchange(t, b, "orders.dlx", warren.ExchangeFanout, warren.Durable())
	declareExchange(t, b, "unrouted", warren.ExchangeFanout)
	declareExchange(t, b, "billing", warren.ExchangeDirect, warren.AlternateExchange("unrouted"))
	declareExchange(t, b, "match", warren.ExchangeHeaders, warren.AutoDelete())
	declareExchange(t, b, "audit", warren.ExchangeFanout, warren.Internal(), warren.Arguments(warren.Table{"x-note": "kept"}))
	declare(t, b, "orders.created", warren.Durable(), warren.DeadLetter("orders.dlx", "dead"), warren.MessageTTL(time.Minute),
		warren.MaxLength(10000), warren.Overflow(warren.RejectPublish))
	declare(t, b, "orders.dead", warren.Durable())
	declare(t, b, "unrouted")
	declare(t, b, "billing.invoices", warren.MaxPriority(10), warren.DeliveryLimit(5), warren.SingleActiveConsumer(),
		warren.Expires(time.Hour), warren.MaxLengthBytes(1<<20))
	declare(t, b, "scratch", warren.AutoDelete(), warren.Arguments(warren.Table{"x-queue-mode": "lazy"}))
	declare(t, b, "mine", warren.ExclusiveTo(context.Background()))
	require.NoError(t, b.Bind("orders.created", "orders", "order.*.created", nil))
	require.NoError(t, b.Bind("orders.created", "orders", "order.#.urgent", nil))
	require.NoError(t, b.Bind("orders.dead", "orders.dlx", "", nil))
	require.NoError(t, b.Bind("unrouted", "unrouted", "", nil))
	require.NoError(t, b.Bind("billing.invoices", "billing", "invoice", nil))
	require.NoError(t, b.Bind("scratch", "match", "", warren.Table{"x-match": "all", "region": "eu", "tier": int64(2)}))
	require.NoError(t, b.Bind("scratch", "match", "", warren.Table{"x-match": "any", "region": "us"}))
	require.NoError(t, b.Bind("scratch", "amq.topic", "logs.#", nil))
	require.NoError(t, b.Bind("mine", "orders", "#", nil, warren.As(context.Background())))
	require.NoError(t, b.BindExchange("audit", "orders", "#", nil))
	require.NoError(t, b.BindExchange("orders.dlx", "billing", "failed", nil))
}

func TestTopologyIsWhatWasDeclared(t *testing.T) {
	b := newBroker(t)
	richTopology(t, b)
	top := b.Topology()

	names := func() (xs, qs []string) {
		for _, x := range top.Exchanges {
			xs = append(xs, x.Name)
		}
		for _, q := range top.Queues {
			qs = append(qs, q.Name)
		}
		return xs, qs
	}
	xs, qs := names()
	require.Equal(t, []string{"audit", "billing", "match", "orders", "orders.dlx", "unrouted"}, xs,
		"sorted; the default and amq. exchanges left out")
	require.Equal(t, []string{"billing.invoices", "orders.created", "orders.dead", "scratch", "unrouted"}, qs,
		"sorted; the exclusive queue left out")

	require.Equal(t, warren.ExchangeDecl{Name: "billing", Kind: warren.ExchangeDirect,
		Arguments: warren.Table{"alternate-exchange": "unrouted"}}, top.Exchanges[1], "the alternate exchange as its argument")
	require.Equal(t, warren.ExchangeDecl{Name: "audit", Kind: warren.ExchangeFanout, Internal: true,
		Arguments: warren.Table{"x-note": "kept"}}, top.Exchanges[0])
	require.Equal(t, warren.ExchangeDecl{Name: "match", Kind: warren.ExchangeHeaders, AutoDelete: true}, top.Exchanges[2])
	require.Equal(t, warren.QueueDecl{Name: "orders.created", Durable: true, Arguments: warren.Table{
		"x-dead-letter-exchange": "orders.dlx", "x-dead-letter-routing-key": "dead", "x-message-ttl": int64(60000),
		"x-max-length": int64(10000), "x-overflow": "reject-publish"}}, top.Queues[1], "typed options as x- arguments")
	require.Equal(t, warren.QueueDecl{Name: "billing.invoices", Arguments: warren.Table{
		"x-max-priority": int64(10), "x-delivery-limit": int64(5), "x-single-active-consumer": true,
		"x-expires": int64(3600000), "x-max-length-bytes": int64(1 << 20)}}, top.Queues[0])
	require.Equal(t, warren.QueueDecl{Name: "orders.dead", Durable: true}, top.Queues[2], "no arguments: nil")

	require.Equal(t, []warren.BindingDecl{
		{Source: "amq.topic", Destination: "scratch", RoutingKey: "logs.#"},
		{Source: "billing", Destination: "billing.invoices", RoutingKey: "invoice"},
		{Source: "billing", Destination: "orders.dlx", ToExchange: true, RoutingKey: "failed"},
		{Source: "match", Destination: "scratch", Arguments: warren.Table{"x-match": "all", "region": "eu", "tier": int64(2)}},
		{Source: "match", Destination: "scratch", Arguments: warren.Table{"x-match": "any", "region": "us"}},
		{Source: "orders", Destination: "orders.created", RoutingKey: "order.#.urgent"},
		{Source: "orders", Destination: "orders.created", RoutingKey: "order.*.created"},
		{Source: "orders", Destination: "audit", ToExchange: true, RoutingKey: "#"},
		{Source: "orders.dlx", Destination: "orders.dead"},
		{Source: "unrouted", Destination: "unrouted"},
	}, top.Bindings, "by source, queues before exchanges, destination, key; bindings from amq. exchanges in, the exclusive queue's out")

	// The values are the caller's: changing them changes nothing in the broker.
	top.Queues[1].Arguments["x-max-length"] = int64(1)
	top.Exchanges[1].Arguments["alternate-exchange"] = "elsewhere"
	require.Equal(t, int64(10000), b.Topology().Queues[1].Arguments["x-max-length"])
	require.Equal(t, "unrouted", b.Topology().Exchanges[1].Arguments["alternate-exchange"])
}

func TestDeclareTopologyRoundTrip(t *testing.T) {
	b := newBroker(t)
	richTopology(t, b)
	top := b.Topology()

	c := newBroker(t)
	require.NoError(t, c.DeclareTopology(top))
	require.Equal(t, top, c.Topology(), "declared in another broker, the same topology")
	require.NoError(t, c.DeclareTopology(top), "twice: equivalent, nothing changes")
	require.Equal(t, top, c.Topology())
	require.NoError(t, b.DeclareTopology(top), "into the broker it came from: nothing changes")
	require.Equal(t, top, b.Topology())

	// The declared broker routes as the first: the topic binding, the alternate exchange, the
	// exchange-to-exchange binding and the headers match.
	require.NoError(t, c.Publish(context.Background(), "orders", "order.eu.created", msg("created")))
	require.NoError(t, c.Publish(context.Background(), "billing", "nobody", msg("unrouted")))
	require.NoError(t, c.Publish(context.Background(), "billing", "failed", msg("failed")))
	require.NoError(t, c.Publish(context.Background(), "match", "", warren.Message{Body: []byte("eu2"),
		Headers: warren.Table{"region": "eu", "tier": int64(2)}}))
	for queue, want := range map[string]string{"orders.created": "created", "unrouted": "unrouted", "orders.dead": "failed", "scratch": "eu2"} {
		q, err := c.Queue(queue)
		require.NoError(t, err)
		require.Equal(t, want, drain(t, q), queue)
	}
}

func TestDeclareTopologyErrors(t *testing.T) {
	b := newBroker(t)
	richTopology(t, b)
	top := b.Topology()

	for _, tc := range []struct {
		name string
		t    warren.Topology
		want error
	}{
		{"an inequivalent queue", warren.Topology{Queues: []warren.QueueDecl{{Name: "orders.created"}}}, warren.ErrPreconditionFailed},
		{"an inequivalent exchange", warren.Topology{Exchanges: []warren.ExchangeDecl{{Name: "orders", Kind: warren.ExchangeDirect, Durable: true}}}, warren.ErrPreconditionFailed},
		{"an inequivalent predeclared exchange", warren.Topology{Exchanges: []warren.ExchangeDecl{{Name: "amq.topic", Kind: warren.ExchangeFanout, Durable: true}}}, warren.ErrPreconditionFailed},
		{"a missing predeclared exchange", warren.Topology{Exchanges: []warren.ExchangeDecl{{Name: "amq.nothing", Kind: warren.ExchangeFanout}}}, warren.ErrNotFound},
		{"the default exchange", warren.Topology{Exchanges: []warren.ExchangeDecl{{Name: "", Kind: warren.ExchangeDirect, Durable: true}}}, warren.ErrAccessRefused},
		{"a binding to a missing queue", warren.Topology{Bindings: []warren.BindingDecl{{Source: "orders", Destination: "nowhere"}}}, warren.ErrNotFound},
		{"a binding from a missing exchange", warren.Topology{Bindings: []warren.BindingDecl{{Source: "nowhere", Destination: "scratch"}}}, warren.ErrNotFound},
		{"a quorum queue", warren.Topology{Queues: []warren.QueueDecl{{Name: "jobs", Arguments: warren.Table{"x-queue-type": "quorum"}}}}, warren.ErrPreconditionFailed},
		{"an unknown kind", warren.Topology{Exchanges: []warren.ExchangeDecl{{Name: "odd", Kind: "x-delayed-message"}}}, warren.ErrInvalidArgument},
	} {
		err := b.DeclareTopology(tc.t)
		require.ErrorIs(t, err, tc.want, tc.name)
	}
	require.Equal(t, top, b.Topology(), "nothing changed")
	require.ErrorIs(t, b.DeclareTopology(warren.Topology{Queues: []warren.QueueDecl{{Name: "first"}, {Name: "bad", Arguments: warren.Table{"x-max-length": "ten"}}}}),
		warren.ErrPreconditionFailed)
	require.True(t, queueExists(t, b, "first"), "what came before the error stays, as in RabbitMQ's import")
	require.NoError(t, b.Close())
	require.ErrorIs(t, b.DeclareTopology(top), warren.ErrClosed)
	require.ErrorIs(t, b.DeclareTopology(warren.Topology{Exchanges: []warren.ExchangeDecl{{Name: "amq.topic", Kind: warren.ExchangeTopic, Durable: true}}}), warren.ErrClosed)
}

func TestTopologyClassic(t *testing.T) {
	top := warren.Topology{Queues: []warren.QueueDecl{
		{Name: "jobs", Durable: true, Arguments: warren.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(5)}},
		{Name: "plain", Arguments: warren.Table{"x-queue-type": "classic"}},
		{Name: "none"},
	}}
	classic := top.Classic()
	require.Equal(t, warren.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(5)}, top.Queues[0].Arguments, "t itself unchanged")
	require.Equal(t, []warren.QueueDecl{
		{Name: "jobs", Durable: true, Arguments: warren.Table{"x-delivery-limit": int64(5)}},
		{Name: "plain", Arguments: warren.Table{"x-queue-type": "classic"}},
		{Name: "none"},
	}, classic.Queues)
	b := newBroker(t)
	require.ErrorIs(t, b.DeclareTopology(top), warren.ErrPreconditionFailed)
	require.NoError(t, b.DeclareTopology(classic))

	// Its delivery limit holds: the fifth return dead-letters (here: drops) the message.
	q, err := b.Queue("jobs")
	require.NoError(t, err)
	publish(t, b, "jobs", "poison")
	for range 6 {
		d, err := q.Get(context.Background())
		require.NoError(t, err)
		require.NoError(t, d.Nack())
	}
	require.Equal(t, 0, q.Len())

	stream := warren.Topology{Queues: []warren.QueueDecl{{Name: "s", Arguments: warren.Table{"x-queue-type": "stream"}}}}
	require.Equal(t, stream, stream.Classic(), "a stream stays a stream")
	require.ErrorIs(t, b.DeclareTopology(stream.Classic()), warren.ErrPreconditionFailed)
}

// A binding keeps its own copy of its arguments: a caller that reuses and changes the table
// after Bind changes neither the binding's match nor what Topology shows.
func TestBindKeepsItsOwnArguments(t *testing.T) {
	b := newBroker(t)
	declare(t, b, "q")
	_, err := b.DeclareExchange("h", warren.ExchangeHeaders)
	require.NoError(t, err)
	args := warren.Table{"x-match": "all", "kind": "a"}
	require.NoError(t, b.Bind("q", "h", "", args))
	args["kind"] = "b"
	args["x-match"] = "any"
	bs := b.Topology().Bindings
	require.Len(t, bs, 1)
	require.Equal(t, warren.Table{"x-match": "all", "kind": "a"}, bs[0].Arguments)
	require.NoError(t, b.Unbind("q", "h", "", warren.Table{"x-match": "all", "kind": "a"}))
	require.Empty(t, b.Topology().Bindings, "unbound with the arguments it was bound with")
}

// A queue's and an exchange's Declaration is its entry in Topology, and a copy: changing it
// changes nothing.
func TestDeclaration(t *testing.T) {
	b := newBroker(t)
	richTopology(t, b)
	top := b.Topology()
	for _, d := range top.Queues {
		q, err := b.Queue(d.Name)
		require.NoError(t, err)
		require.Equal(t, d, q.Declaration())
	}
	for _, d := range top.Exchanges {
		x, err := b.Exchange(d.Name)
		require.NoError(t, err)
		require.Equal(t, d, x.Declaration())
	}
	billing, err := b.Exchange("billing")
	require.NoError(t, err)
	require.Equal(t, warren.Table{"alternate-exchange": "unrouted"}, billing.Declaration().Arguments)
	billing.Declaration().Arguments["alternate-exchange"] = "elsewhere"
	require.Equal(t, "unrouted", billing.Declaration().Arguments["alternate-exchange"])
	q, err := b.Queue("orders.created")
	require.NoError(t, err)
	q.Declaration().Arguments["x-max-length"] = 1
	require.Equal(t, int64(10000), q.Declaration().Arguments["x-max-length"])
	ex, err := b.Queue("mine", warren.As(context.Background()))
	require.NoError(t, err)
	require.Equal(t, warren.QueueDecl{Name: "mine"}, ex.Declaration(), "an exclusive queue, which Topology leaves out, has one too")
}

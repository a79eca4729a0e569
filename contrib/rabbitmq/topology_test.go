package rabbitmq

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of DeclareTopology (topology.go): against a real RabbitMQ, and what it refuses before
// sending anything.

// probe is a message to route through a topology.
type probe struct {
	exchange, key, body string
	headers             warren.Table
}

// routedInWarren declares top in a new warren broker, publishes the probes, and returns what
// each queue holds, in order.
func routedInWarren(t *testing.T, top warren.Topology, probes []probe) map[string][]string {
	t.Helper()
	b := warren.New()
	defer b.Close()
	require.NoError(t, b.DeclareTopology(top.Classic()))
	ctx := context.Background()
	for _, p := range probes {
		require.NoError(t, b.Publish(ctx, p.exchange, p.key, warren.Message{Body: []byte(p.body), Headers: p.headers}))
	}
	held := map[string][]string{}
	for q := range b.Queues() {
		for {
			d, err := q.Get(ctx, warren.AutoAck())
			if errors.Is(err, warren.ErrEmpty) {
				break
			}
			require.NoError(t, err)
			held[q.Name()] = append(held[q.Name()], string(d.Message.Body))
		}
	}
	return held
}

// routedInRabbitMQ publishes the probes on ch (with confirms, so that they are routed before
// anything is read) and returns what each of top's queues holds, in order.
func routedInRabbitMQ(t *testing.T, ch *amqp.Channel, top warren.Topology, probes []probe) map[string][]string {
	t.Helper()
	require.NoError(t, ch.Confirm(false))
	ctx := context.Background()
	for _, p := range probes {
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, p.exchange, p.key, false, false,
			amqp.Publishing{Body: []byte(p.body), Headers: amqpTable(p.headers)})
		require.NoError(t, err)
		ok, err := c.WaitContext(ctx)
		require.NoError(t, err)
		require.True(t, ok, "confirmed")
	}
	held := map[string][]string{}
	for _, q := range top.Queues {
		for {
			d, ok, err := ch.Get(q.Name, true)
			require.NoError(t, err)
			if !ok {
				break
			}
			held[q.Name] = append(held[q.Name], string(d.Body))
		}
	}
	return held
}

// The definitions file RabbitMQ 3.10 exported, declared on RabbitMQ and in warren, routes the
// same messages to the same queues in both.
func TestDeclareTopologyRoutesAsWarren(t *testing.T) {
	conn := dial(t)
	top := unique(t, conn, readFixture(t))
	x := func(name string) string {
		return top.Exchanges[0].Name[:len(top.Exchanges[0].Name)-len("billing")] + name
	}
	probes := []probe{
		{x("orders"), "order.eu.created", "created", nil},
		{x("orders"), "order.eu.big.urgent", "urgent", nil},
		{x("orders"), "order.failed", "failed", nil},
		{x("orders"), "nothing.matches", "lost", nil},
		{x("billing"), "invoice", "invoice", nil},
		{x("billing"), "job", "job", nil},
		{x("billing"), "nobody", "unrouted", nil},
		{x("match"), "", "eu2", warren.Table{"region": "eu", "tier": int32(2)}},
		{x("match"), "", "eu3", warren.Table{"region": "eu", "tier": int32(3)}},
		{x("scratch"), "work", "work", nil},
		{"", x("orders.dead"), "direct", nil},
	}
	// Classic, where the file does not say: a quorum queue with single active consumer refuses
	// basic.get (405), which reads the queues here.
	ch := channel(t, conn)
	require.NoError(t, DeclareTopology(ch, top, Classic))
	require.NoError(t, DeclareTopology(ch, top, Classic), "again: nothing changes")
	inRabbit := routedInRabbitMQ(t, ch, top, probes)
	inWarren := routedInWarren(t, top, probes)
	require.Equal(t, inWarren, inRabbit)
	require.Equal(t, map[string][]string{
		x("orders.created"): {"created", "urgent"}, x("orders.dead"): {"failed", "direct"},
		x("billing.invoices"): {"invoice"}, x("jobs.quorum"): {"job"}, x("orders.unrouted"): {"unrouted"},
		x("billing.single"): {"eu2"}, x("transient.work"): {"work"},
	}, inRabbit, "and it is what the topology says")
}

// A warren broker's own topology goes to RabbitMQ: durable queues as quorum queues where
// RabbitMQ allows it, the others classic; a delivery limit holds the same way on both.
func TestDeclareTopologyQuorum(t *testing.T) {
	conn := dial(t)
	b := warren.New()
	defer b.Close()
	for _, q := range []struct {
		name string
		opts []warren.QueueOption
	}{
		{"durable", []warren.QueueOption{warren.Durable(), warren.MessageTTL(time.Hour)}},
		{"limited", []warren.QueueOption{warren.Durable(), warren.DeliveryLimit(2)}},
		{"lazy", []warren.QueueOption{warren.Durable(), warren.Arguments(warren.Table{"x-queue-mode": "lazy"})}},
		{"transient", nil},
		{"priorities", []warren.QueueOption{warren.Durable(), warren.MaxPriority(5)}},
		{"gone-when-unused", []warren.QueueOption{warren.Durable(), warren.AutoDelete()}},
	} {
		_, err := b.DeclareQueue(q.name, q.opts...)
		require.NoError(t, err)
	}
	top := unique(t, conn, b.Topology())
	ch := channel(t, conn)
	require.NoError(t, DeclareTopology(ch, top, Quorum))
	require.NoError(t, DeclareTopology(ch, top, Quorum), "again: nothing changes")

	// A redeclaration as a classic queue is refused (406) exactly when it is a quorum queue.
	quorum := 0
	for _, q := range top.Queues {
		ch2 := channel(t, conn)
		args := amqpTable(q.Arguments)
		if args == nil {
			args = amqp.Table{}
		}
		delete(args, "x-delivery-limit") // a classic queue's would be refused whatever the queue is
		args["x-queue-type"] = "classic"
		_, err := ch2.QueueDeclare(q.Name, q.Durable, q.AutoDelete, false, false, args)
		want := q.Durable && !q.AutoDelete && q.Arguments["x-max-priority"] == nil
		if want {
			quorum++
			require.ErrorContains(t, err, "inequivalent arg 'x-queue-type'", "%s is a quorum queue", q.Name)
		} else {
			require.NoError(t, err, "%s stays classic", q.Name)
			ch2.Close()
		}
	}
	require.Equal(t, 3, quorum, "durable, limited, lazy")

	// The delivery limit: the message is delivered, then returned twice and delivered again
	// each time; the third return exceeds the limit and it is gone. The same in warren.
	var limited string
	for _, q := range top.Queues {
		if q.Arguments["x-delivery-limit"] == int64(2) {
			limited = q.Name
		}
	}
	require.NotEmpty(t, limited)
	rabbitDeliveries := 0
	_, err := ch.QueueDeclarePassive(limited, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.PublishWithContext(context.Background(), "", limited, false, false, amqp.Publishing{Body: []byte("poison")}))
	require.Eventually(t, func() bool {
		q, err := ch.QueueDeclarePassive(limited, true, false, false, false, nil)
		return err == nil && q.Messages == 1
	}, 5*time.Second, 10*time.Millisecond)
	for {
		d, ok, err := ch.Get(limited, false)
		require.NoError(t, err)
		if !ok {
			break
		}
		rabbitDeliveries++
		require.NoError(t, d.Nack(false, true))
		require.Less(t, rabbitDeliveries, 10, "the limit holds")
	}

	q, err := b.Queue("limited")
	require.NoError(t, err)
	require.NoError(t, b.Publish(context.Background(), "", "limited", warren.Message{Body: []byte("poison")}))
	warrenDeliveries := 0
	for {
		d, err := q.Get(context.Background())
		if errors.Is(err, warren.ErrEmpty) {
			break
		}
		require.NoError(t, err)
		warrenDeliveries++
		require.NoError(t, d.Nack())
	}
	require.Equal(t, 3, warrenDeliveries)
	require.Equal(t, warrenDeliveries, rabbitDeliveries, "RabbitMQ's quorum queue and warren agree")

	// A quorum queue declared without a limit has none: a message comes back after more returns
	// than RabbitMQ 4's default of 20, whether nacked or held by a channel that closes.
	unlimited := top.Queues[0].Name
	require.NoError(t, ch.PublishWithContext(context.Background(), "", unlimited, false, false, amqp.Publishing{Body: []byte("again")}))
	get := func(ch *amqp.Channel) amqp.Delivery {
		t.Helper()
		var d amqp.Delivery
		require.Eventually(t, func() bool {
			var ok bool
			var err error
			d, ok, err = ch.Get(unlimited, false)
			require.NoError(t, err)
			return ok
		}, 5*time.Second, 5*time.Millisecond, "the message is still there")
		return d
	}
	for i := range 25 {
		if i%2 == 0 {
			require.NoError(t, get(ch).Nack(false, true))
			continue
		}
		held := channel(t, conn)
		get(held)
		require.NoError(t, held.Close())
	}
	d := get(ch)
	require.Equal(t, "again", string(d.Body))
	require.True(t, d.Redelivered)
	require.NoError(t, d.Ack(false))
}

// A redeclaration that is not equivalent fails as it does in warren, wrapping both errors.
func TestDeclareTopologyInequivalent(t *testing.T) {
	conn := dial(t)
	top := unique(t, conn, warren.Topology{Queues: []warren.QueueDecl{{Name: "q", Durable: true}}})
	require.NoError(t, DeclareTopology(channel(t, conn), top, Classic))
	top.Queues[0].Arguments = warren.Table{"x-max-length": int64(5)}
	ch := channel(t, conn)
	err := DeclareTopology(ch, top, Classic)
	require.ErrorIs(t, err, warren.ErrPreconditionFailed)
	var ae *amqp.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, amqp.PreconditionFailed, ae.Code)
	require.True(t, ch.IsClosed(), "RabbitMQ closed the channel")
	require.ErrorIs(t, DeclareTopology(ch, top, Classic), warren.ErrClosed)

	missing := unique(t, conn, warren.Topology{Bindings: []warren.BindingDecl{{Source: "no-such-exchange", Destination: "no-such-queue"}}})
	require.ErrorIs(t, DeclareTopology(channel(t, conn), missing, Classic), warren.ErrNotFound)
}

// What RabbitMQ cannot do as warren does is refused before anything is sent (no channel
// needed).
func TestDeclareTopologyRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		q    warren.QueueDecl
		qt   QueueType
	}{
		{"the Block overflow", warren.QueueDecl{Name: "q", Durable: true, Arguments: warren.Table{"x-overflow": "block"}}, Quorum},
		{"a classic queue's delivery limit", warren.QueueDecl{Name: "q", Durable: true, Arguments: warren.Table{"x-delivery-limit": int64(3)}}, Classic},
		{"a non-durable queue's delivery limit", warren.QueueDecl{Name: "q", Arguments: warren.Table{"x-delivery-limit": int64(3)}}, Quorum},
		{"a priority queue's delivery limit", warren.QueueDecl{Name: "q", Durable: true,
			Arguments: warren.Table{"x-delivery-limit": int64(3), "x-max-priority": int64(2)}}, Quorum},
	} {
		err := DeclareTopology(nil, warren.Topology{Queues: []warren.QueueDecl{tc.q}}, tc.qt)
		require.ErrorIs(t, err, warren.ErrUnsupported, tc.name)
	}
	require.ErrorIs(t, DeclareTopology(nil, warren.Topology{}, "stream"), warren.ErrInvalidArgument)

	args, err := queueArguments(warren.QueueDecl{Name: "q", Durable: true, Arguments: warren.Table{"x-queue-mode": "lazy"}}, Quorum)
	require.NoError(t, err)
	require.Equal(t, warren.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(noDeliveryLimit)}, args, "quorum: no lazy mode, no default limit of 20")
	args, err = queueArguments(warren.QueueDecl{Name: "q", Durable: true, Arguments: warren.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(5)}}, Classic)
	require.NoError(t, err)
	require.Equal(t, warren.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(5)}, args, "a queue that says it is quorum is one")
}

func TestAMQPTable(t *testing.T) {
	require.Nil(t, amqpTable(nil))
	require.Nil(t, amqpTable(warren.Table{}))
	in := warren.Table{"n": int64(1), "d": warren.Decimal{Scale: 2, Value: 314}, "t": warren.Table{"inner": warren.Table{}},
		"a": []any{warren.Table{"x": "y"}, int16(3)}, "m": map[string]any{"k": true}}
	out := amqpTable(in)
	require.NoError(t, out.Validate(), "every value is one amqp091-go can send")
	require.Equal(t, amqp.Table{"n": int64(1), "d": amqp.Decimal{Scale: 2, Value: 314}, "t": amqp.Table{"inner": amqp.Table{}},
		"a": []any{amqp.Table{"x": "y"}, int16(3)}, "m": amqp.Table{"k": true}}, out)
	require.Error(t, amqp.Table(in).Validate(), "as it was, amqp091-go would refuse it")
}

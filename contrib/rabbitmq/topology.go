package rabbitmq

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
)

// QueueType is the type of queue a warren queue becomes on RabbitMQ.
type QueueType string

const (
	// Classic queues: one node's, as warren's are. RabbitMQ's classic queues have no delivery
	// limit, so a queue with one ([warren.DeliveryLimit], "x-delivery-limit") needs Quorum.
	Classic QueueType = "classic"
	// Quorum queues: replicated, for a cluster. What changes, on RabbitMQ (3.10 measured, 4
	// documented):
	//   - Only a durable queue that is not auto-delete can be one: RabbitMQ refuses the others
	//     (406), so they stay classic, as do queues with priorities ("x-max-priority": refused
	//     by 3.10's quorum queues; RabbitMQ 4's have two levels only), whose delivery limit, if
	//     any, then makes the declaration fail with [warren.ErrUnsupported].
	//   - A quorum queue of RabbitMQ 4 has a delivery limit of 20 unless told otherwise; warren's
	//     queues have none unless set, so a queue without "x-delivery-limit" is declared with
	//     2147483647, the largest. Not -1, which RabbitMQ 4 reads as no limit but 3.10 accepts and
	//     reads as none allowed: every returned message is dropped (measured).
	//   - "x-queue-mode" (lazy) is left out: a quorum queue keeps its messages on disk anyway,
	//     and refuses the argument.
	//   - basic.get on a quorum queue with single active consumer is refused (405).
	//   - Dead-lettering from a quorum queue is at most once unless its overflow is
	//     reject-publish and "x-dead-letter-strategy" is at-least-once (RabbitMQ 3.10+); warren's
	//     is at least once between durable queues. Not changed here: set the argument on the
	//     warren queue if you need it.
	Quorum QueueType = "quorum"
)

// DeclareTopology declares t on ch: its exchanges, then its queues (as qt where RabbitMQ allows
// it, see [Quorum], unless a queue's "x-queue-type" says otherwise), then its bindings, as [warren.Broker.DeclareTopology] does in warren.
// Declaring what exists already, equivalently, changes nothing: call it again after every
// reconnect. Predeclared exchanges ("amq.") in t are checked, not declared.
//
// It stops at the first error. What RabbitMQ cannot do as warren does is refused before
// anything is sent, with an error wrapping [warren.ErrUnsupported]: the [warren.Block] overflow,
// and a delivery limit on a queue that stays classic. RabbitMQ's refusals wrap warren's
// errors for the same AMQP reply codes ([warren.ErrPreconditionFailed] for 406, an inequivalent
// redeclaration, [warren.ErrNotFound] for 404, [warren.ErrAccessRefused] for 403, …) and
// the [*amqp.Error]; after one, RabbitMQ has closed ch.
func DeclareTopology(ch *amqp.Channel, t warren.Topology, qt QueueType) error {
	if qt != Classic && qt != Quorum {
		return fmt.Errorf("rabbitmq: queue type %q is neither classic nor quorum: %w", qt, warren.ErrInvalidArgument)
	}
	queues := make([]warren.QueueDecl, len(t.Queues))
	for i, q := range t.Queues {
		args, err := queueArguments(q, qt)
		if err != nil {
			return err
		}
		q.Arguments = args
		queues[i] = q
	}
	for _, x := range t.Exchanges {
		var err error
		if x.Name == "" || strings.HasPrefix(x.Name, "amq.") {
			err = ch.ExchangeDeclarePassive(x.Name, x.Kind, x.Durable, x.AutoDelete, x.Internal, false, amqpTable(x.Arguments))
		} else {
			err = ch.ExchangeDeclare(x.Name, x.Kind, x.Durable, x.AutoDelete, x.Internal, false, amqpTable(x.Arguments))
		}
		if err != nil {
			return wrap(err, "declare exchange %q", x.Name)
		}
	}
	for _, q := range queues {
		if _, err := ch.QueueDeclare(q.Name, q.Durable, q.AutoDelete, false, false, amqpTable(q.Arguments)); err != nil {
			return wrap(err, "declare queue %q", q.Name)
		}
	}
	for _, b := range t.Bindings {
		var err error
		if b.ToExchange {
			err = ch.ExchangeBind(b.Destination, b.RoutingKey, b.Source, false, amqpTable(b.Arguments))
		} else {
			err = ch.QueueBind(b.Destination, b.RoutingKey, b.Source, false, amqpTable(b.Arguments))
		}
		if err != nil {
			return wrap(err, "bind %q to %q with %q", b.Destination, b.Source, b.RoutingKey)
		}
	}
	return nil
}

// queueArguments returns q's arguments as a queue of type qt on RabbitMQ, or why it cannot be
// one. q's own Table is not changed.
func queueArguments(q warren.QueueDecl, qt QueueType) (warren.Table, error) {
	args := maps.Clone(q.Arguments)
	if args == nil {
		args = warren.Table{}
	}
	if args["x-overflow"] == string(warren.Block) {
		return nil, fmt.Errorf("rabbitmq: queue %q: RabbitMQ has no %q overflow (publishers would not wait for room): %w",
			q.Name, warren.Block, warren.ErrUnsupported)
	}
	_, priorities := args["x-max-priority"]
	quorum := qt == Quorum && q.Durable && !q.AutoDelete && !priorities
	switch args["x-queue-type"] {
	case string(Quorum): // a topology read from RabbitMQ's definitions says so itself
		quorum = true
	case string(Classic):
		quorum = false
	case nil:
	default:
		return args, nil // a stream: as RabbitMQ takes it
	}
	if !quorum {
		if _, ok := args["x-delivery-limit"]; ok {
			why := "classic queues have no delivery limit: declare with Quorum"
			if qt == Quorum {
				why = "it stays a classic queue (not durable, auto-delete, or with priorities), and those have no delivery limit"
			}
			return nil, fmt.Errorf("rabbitmq: queue %q: x-delivery-limit: %s: %w", q.Name, why, warren.ErrUnsupported)
		}
		return args, nil
	}
	args["x-queue-type"] = string(Quorum)
	delete(args, "x-queue-mode")
	if _, ok := args["x-delivery-limit"]; !ok {
		args["x-delivery-limit"] = int64(noDeliveryLimit)
	}
	return args, nil
}

// noDeliveryLimit is the delivery limit of a quorum queue declared without one: RabbitMQ's
// largest (a 32-bit signed count), which no message reaches, on every version.
const noDeliveryLimit = math.MaxInt32

// wrap returns err, from amqp091-go, wrapping the warren error of its AMQP reply code, with
// what was being done.
func wrap(err error, format string, args ...any) error {
	what := fmt.Sprintf(format, args...)
	var ae *amqp.Error
	if errors.As(err, &ae) {
		if sentinel := sentinelOf(ae); sentinel != nil {
			return fmt.Errorf("rabbitmq: %s: %w: %w", what, sentinel, err)
		}
	}
	return fmt.Errorf("rabbitmq: %s: %w", what, err)
}

// sentinelOf returns warren's error for an AMQP reply code, nil for one it has none for.
func sentinelOf(ae *amqp.Error) error {
	switch ae.Code {
	case amqp.NotFound:
		return warren.ErrNotFound
	case amqp.AccessRefused:
		return warren.ErrAccessRefused
	case amqp.ResourceLocked:
		return warren.ErrResourceLocked
	case amqp.PreconditionFailed:
		return warren.ErrPreconditionFailed
	case amqp.ChannelError, amqp.ConnectionForced:
		return warren.ErrClosed
	}
	if errors.Is(ae, amqp.ErrClosed) {
		return warren.ErrClosed
	}
	return nil
}

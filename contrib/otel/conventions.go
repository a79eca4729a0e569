package warrenotel

import (
	"strings"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/warrenmq/warren"
)

// The OpenTelemetry messaging semantic conventions, as this package applies them: those of
// RabbitMQ (semconv v1.43.0, docs/messaging/rabbitmq.md), whose model warren implements.

// ScopeName is the instrumentation scope of every span and instrument this package makes: what
// tells warren's telemetry apart from a RabbitMQ client's, whose messaging.system is the same.
const ScopeName = "github.com/warrenmq/warren/contrib/otel"

// Attributes of warren's own, beside the semantic conventions' (none of those says these).
const (
	// DeliveryCountKey is the attribute of a process span that says how many times the message
	// came back to its queue before this delivery ([warren.Delivery].DeliveryCount): 0 on the
	// first attempt, 1 on the first retry.
	DeliveryCountKey = attribute.Key("warren.message.delivery_count")
	// DeadLetterReasonKey is the attribute of a process span of a dead letter that says why it
	// was last dead-lettered: "rejected", "expired", "maxlen" or "delivery_limit" (the reason
	// of the newest entry of its x-death header, [warren.Message.Deaths]).
	DeadLetterReasonKey = attribute.Key("warren.dead_letter.reason")
	// DeadLetterQueueKey is the attribute of a process span of a dead letter that names the
	// queue it was last dead-lettered from (the queue of the newest entry of its x-death
	// header, [warren.Message.Deaths]).
	DeadLetterQueueKey = attribute.Key("warren.dead_letter.queue")
	// QueueKey is the attribute of every per-queue instrument of [Metrics] that names the queue.
	QueueKey = attribute.Key("warren.queue.name")
)

// Operation names: RabbitMQ's (AMQP 0-9-1's methods), as messaging.operation.name.
const (
	opPublish = "publish" // basic.publish: operation type send
	opProcess = "process" // a handler run by Serve: operation type process
	opAck     = "ack"     // basic.ack: operation type settle
	opNack    = "nack"    // basic.nack with requeue
	opReject  = "reject"  // basic.reject without requeue
)

// serverNamed is the prefix of the names warren (and RabbitMQ) give queues declared without
// one: anonymous destinations, in the conventions' words, left out of span names.
const serverNamed = "amq.gen-"

// publishDestination is messaging.destination.name of a publish: "{exchange}:{routing key}"
// when both are given, the one given when only one is, "amq.default" for the default exchange
// without a routing key (rabbitmq.md, note [1], producer side).
func publishDestination(exchange, key string) string {
	switch {
	case exchange != "" && key != "":
		return exchange + ":" + key
	case exchange != "":
		return exchange
	case key != "":
		return key
	}
	return "amq.default"
}

// consumeDestination is messaging.destination.name of a delivery's processing:
// "{exchange}:{routing key}:{queue}", leaving out what is empty (the default exchange, an
// unknown queue), and the queue when it equals the routing key, as it does for a publish
// through the default exchange (rabbitmq.md, note [1], consumer side).
func consumeDestination(exchange, key, queue string) string {
	if queue == key {
		queue = ""
	}
	parts := make([]string, 0, 3)
	for _, p := range []string{exchange, key, queue} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, ":")
}

// anonymous reports whether a destination is a server-named queue: the queue consumed from, or,
// through the default exchange, the routing key.
func anonymous(exchange, key, queue string) bool {
	return strings.HasPrefix(queue, serverNamed) || exchange == "" && strings.HasPrefix(key, serverNamed)
}

// spanName is "{operation} {destination}", or the operation alone for an anonymous
// destination or none (messaging-spans.md, "Span name"): a server-named queue's name would
// make span names of unbounded cardinality.
func spanName(op, destination string, anon bool) string {
	if anon || destination == "" {
		return op
	}
	return op + " " + destination
}

// destinationAttrs are the attributes that say where a message goes or came from, beside
// messaging.system: the destination's name, whether it is anonymous, the routing key when there
// is one.
func destinationAttrs(attrs []attribute.KeyValue, destination, key string, anon bool) []attribute.KeyValue {
	attrs = append(attrs, semconv.MessagingSystemRabbitMQ, semconv.MessagingDestinationName(destination))
	if anon {
		attrs = append(attrs, semconv.MessagingDestinationAnonymous(true))
	}
	if key != "" {
		attrs = append(attrs, semconv.MessagingRabbitMQDestinationRoutingKey(key))
	}
	return attrs
}

// messageAttrs are the attributes of a single message's properties: its id and correlation id,
// when set.
func messageAttrs(attrs []attribute.KeyValue, m *warren.Message) []attribute.KeyValue {
	if m.MessageID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(m.MessageID))
	}
	if m.CorrelationID != "" {
		attrs = append(attrs, semconv.MessagingMessageConversationID(m.CorrelationID))
	}
	return attrs
}

package warrenotel

import (
	"context"
	"maps"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
)

// Publish publishes msg through p (a [*warren.Broker], any [warren.Backend]: contrib/rabbitmq's
// Client is one), as p.Publish(ctx, exchange, key, msg, opts...) does, inside a "send" span, and
// returns what p.Publish returns.
//
// The span is a PRODUCER span named "publish {destination}" ("publish orders:created",
// "publish jobs"), a child of ctx's span, with the conventions' attributes: messaging.system
// "rabbitmq", messaging.operation.name "publish", messaging.operation.type "send",
// messaging.destination.name, messaging.rabbitmq.destination.routing_key,
// messaging.message.id and messaging.message.conversation_id from msg's MessageID and
// CorrelationID. A failed publish sets the span's status to Error and error.type.
//
// The span's context is the message's creation context: it is written into the message's
// headers (W3C "traceparent" and "tracestate" by default) so that every delivery of the message
// — each retry, and each dead letter of it, whose headers are the original's — is traced as
// its child (see [Tracer.Middleware]). The headers are copied first, never modified: msg.Headers
// may be shared. When msg already carries a valid span context in its headers, the conventions
// call it a custom creation context: it is kept unchanged, and the span links to it instead (a
// handler that forwards the message it received keeps that message's trace).
//
// Publish blocks as p.Publish does; ctx's cancellation is p.Publish's business.
func (t *Tracer) Publish(ctx context.Context, p warren.Publisher, exchange, key string, msg warren.Message, opts ...warren.PublishOption) error {
	dest := publishDestination(exchange, key)
	anon := anonymous(exchange, key, "")
	attrs := make([]attribute.KeyValue, 0, 8)
	attrs = append(attrs, semconv.MessagingOperationName(opPublish), semconv.MessagingOperationTypeSend)
	attrs = destinationAttrs(attrs, dest, key, anon)
	attrs = messageAttrs(attrs, &msg)
	start := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...)}
	custom := trace.SpanContextFromContext(t.propagator.Extract(context.Background(), HeaderCarrier(msg.Headers)))
	if custom.IsValid() {
		start = append(start, trace.WithLinks(trace.Link{SpanContext: custom}))
	}
	ctx, span := t.tracer.Start(ctx, spanName(opPublish, dest, anon), start...)
	defer span.End()
	if !custom.IsValid() {
		msg.Headers = t.inject(ctx, msg.Headers)
	}
	err := p.Publish(ctx, exchange, key, msg, opts...)
	if err != nil {
		fail(span, err)
	}
	return err
}

// inject returns headers with ctx's span context written in: a new table, headers' entries and
// the propagator's; headers itself when the propagator writes nothing (no valid span context),
// so that a message published without tracing stays as it was.
func (t *Tracer) inject(ctx context.Context, headers warren.Table) warren.Table {
	carried := HeaderCarrier{}
	t.propagator.Inject(ctx, carried)
	if len(carried) == 0 {
		return headers
	}
	h := make(warren.Table, len(headers)+len(carried))
	maps.Copy(h, headers)
	maps.Copy(h, carried)
	return h
}

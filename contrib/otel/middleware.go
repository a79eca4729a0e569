package warrenotel

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
)

// errGoexit is the failure of a handler that ended its goroutine with runtime.Goexit instead of
// returning, which Serve fails the delivery for.
var errGoexit = errors.New("warrenotel: handler called runtime.Goexit")

// handlerFailure is the failure of a handler that did not return, given what recover returned
// in a deferred call of a middleware: a panic's value, or nil for runtime.Goexit (since Go 1.21,
// panic(nil) recovers as a *runtime.PanicNilError). Serve fails the delivery either way, as it
// fails it for an error, and a panic's value decides as an error would, so the error wraps it
// when it is one.
func handlerFailure(p any) error {
	switch v := p.(type) {
	case nil:
		return errGoexit
	case error:
		return fmt.Errorf("handler panicked: %w", v)
	default:
		return fmt.Errorf("handler panicked: %v", v)
	}
}

// nilError is the failure of a handler that returned a nil pointer (map, slice, func, chan) in a
// non-nil error, `var e *MyErr; return e`, as the spans and measurements record it: the error's
// methods may dereference their nil receiver, so they are never called, and its type is named
// instead. Serve logs such a handler and fails its delivery.
type nilError struct{ typ reflect.Type }

// typedNil returns err as a nilError when it holds a nil pointer (map, slice, func, chan), and
// nil otherwise.
func typedNil(err error) error {
	if err == nil {
		return nil
	}
	switch v := reflect.ValueOf(err); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.UnsafePointer:
		if v.IsNil() {
			return nilError{v.Type()}
		}
	}
	return nil
}

func (e nilError) Error() string { return "handler returned a nil " + e.typ.String() }

// ErrorType is the error.type of the handler's error (semconv.ErrorType): its type, named as for
// a value of that type that is not nil.
func (e nilError) ErrorType() string {
	if pkg, name := e.typ.PkgPath(), e.typ.Name(); pkg != "" && name != "" {
		return pkg + "." + name
	}
	return e.typ.String()
}

// Middleware returns a middleware for the handlers of the named queue: wrap the handler given to
// [warren.Queue.Serve] (or [warren.Broker.Serve], or any backend's Serve) with it, as in
//
//	err := q.Serve(ctx, tracer.Middleware("jobs")(handle), warren.Workers(8))
//
// Each delivery is then handled inside a "process" span, and its settlement recorded in a
// "settle" span:
//
//   - The process span is a CONSUMER span named "process {destination}", where the destination
//     is "{exchange}:{routing key}:{queue}" without the empty parts and without the queue when
//     it is the routing key ("process jobs" for a message published to the default exchange
//     with the key "jobs"; "process jobs.dlx:jobs:jobs.dead" for one dead-lettered through
//     "jobs.dlx"). Its parent is the message's creation context, read from the headers
//     ([Tracer.Publish] writes it), and it links to it too, as the conventions ask; so every
//     attempt at a message, and its dead letters, are children of the span that published it,
//     in its trace. When handling runs in the scope of another span (one in the context given
//     to Serve), that span is linked. A message that carries no span context is processed in a
//     child of the context's span, or a new trace. Attributes: messaging.system "rabbitmq",
//     messaging.operation.name and .type "process", messaging.destination.name, the routing key,
//     messaging.rabbitmq.message.delivery_tag, the message's id and correlation id,
//     [DeliveryCountKey], and for a dead letter [DeadLetterReasonKey] and [DeadLetterQueueKey].
//     A handler that fails or panics sets the span's status to Error and error.type; a panic
//     goes on to Serve, which recovers it. A typed nil error (`var e *MyErr; return e`) is
//     recorded as "handler returned a nil *MyErr", with error.type naming *MyErr, without calling
//     its methods, which could panic on the nil receiver.
//   - The handler's ctx carries the process span (and the baggage the propagator read, if it
//     reads baggage): spans it starts are children of it.
//   - The settle span is a CLIENT span, a child of the process span, named by the settlement
//     ("ack jobs", "nack jobs", "reject jobs"), with messaging.operation.type "settle" and
//     messaging.operation.name "ack", "nack" or "reject". When the handler settles its delivery
//     itself (Ack, Nack, NackWithDelay, Reject), the span covers that call, and records its
//     error. Otherwise the settlement is Serve's, made from the handler's result once the
//     handler has returned: nil acks, an error wrapping [warren.ErrPermanent] rejects (the
//     message is dead-lettered, or dropped), any other error, a panic or runtime.Goexit nacks
//     (the message goes back for another attempt, or is dead-lettered past the queue's
//     [warren.DeliveryLimit]). A middleware sees no further than its handler's return, so this
//     span records the settlement Serve is about to make: it is ended before Serve makes it,
//     and a failure of the settlement itself (the broker closed meanwhile) is not in it.
//
// queue names the queue served, for the destination; "" leaves it out. The returned
// middleware returns nil for a nil handler, which Serve refuses. The middleware is safe for
// concurrent use, and so for Serve's workers.
func (t *Tracer) Middleware(queue string) func(warren.Handler) warren.Handler {
	return func(h warren.Handler) warren.Handler {
		if h == nil {
			return nil
		}
		return func(ctx context.Context, d warren.Delivery) error { return t.process(ctx, queue, h, d) }
	}
}

// process runs h on d inside a process span, and records d's settlement.
func (t *Tracer) process(ctx context.Context, queue string, h warren.Handler, d warren.Delivery) error {
	dest := consumeDestination(d.Exchange, d.RoutingKey, queue)
	anon := anonymous(d.Exchange, d.RoutingKey, queue)
	attrs := make([]attribute.KeyValue, 0, 12)
	attrs = append(attrs, semconv.MessagingOperationName(opProcess), semconv.MessagingOperationTypeProcess)
	attrs = destinationAttrs(attrs, dest, d.RoutingKey, anon)
	attrs = append(attrs, semconv.MessagingRabbitMQMessageDeliveryTag(int(d.DeliveryTag)))
	attrs = messageAttrs(attrs, &d.Message)
	attrs = append(attrs, DeliveryCountKey.Int(d.DeliveryCount))
	// x-death, not x-last-death-*: RabbitMQ before 3.13 writes only x-death.
	if deaths := d.Message.Deaths(); len(deaths) > 0 {
		last := deaths[0] // newest first
		if last.Reason != "" {
			attrs = append(attrs, DeadLetterReasonKey.String(string(last.Reason)))
		}
		if last.Queue != "" {
			attrs = append(attrs, DeadLetterQueueKey.String(last.Queue))
		}
	}
	start := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}

	ambient := trace.SpanContextFromContext(ctx)
	// Extract puts the message's span context in ctx as the current span, the parent: the
	// conventions allow that for a single message ("Message creation context as parent of
	// Process span"), and it keeps a message's producer and consumers in one trace.
	ctx = t.propagator.Extract(ctx, HeaderCarrier(d.Message.Headers))
	if creation := trace.SpanContextFromContext(ctx); creation.IsValid() && !creation.Equal(ambient) {
		links := []trace.Link{{SpanContext: creation}}
		if ambient.IsValid() {
			links = append(links, trace.Link{SpanContext: ambient})
		}
		start = append(start, trace.WithLinks(links...))
	}
	ctx, span := t.tracer.Start(ctx, spanName(opProcess, dest, anon), start...)

	s := &settler{t: t, d: d, process: span, dest: dest, anon: anon}
	return callHandler(ctx, h, warren.NewDelivery(d, s), func(err error) { s.finish(ctx, err) })
}

// callHandler calls h(ctx, d), then done with how the call ended: h's error, or, when h did not
// return (a panic, runtime.Goexit), handlerFailure's. A panic goes on to Serve, re-panicked from
// the deferred call, above the handler's frames, which are still on the stack: Serve's recover
// logs a stack that reaches the handler.
func callHandler(ctx context.Context, h warren.Handler, d warren.Delivery, done func(error)) (err error) {
	returned := false
	defer func() {
		if returned {
			return
		}
		p := recover()
		done(handlerFailure(p))
		if p != nil {
			panic(p)
		}
	}()
	err = h(ctx, d)
	returned = true
	if nerr := typedNil(err); nerr != nil {
		done(nerr) // and Serve, given err as it is, logs the handler's mistake
		return err
	}
	done(err)
	return err
}

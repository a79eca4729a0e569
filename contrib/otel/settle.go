package warrenotel

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
)

// settler is the [warren.Settler] of the delivery a traced handler is given: it settles the
// delivery Serve handed out on the handler's behalf, inside a settle span, and remembers that
// the handler settled, so that finish records no settlement of Serve's, which Serve then does
// not make. One per delivery; safe for concurrent use, as a Settler must be.
type settler struct {
	// Set once before the handler runs.
	t       *Tracer
	d       warren.Delivery // the delivery Serve handed out, the one settled
	process trace.Span      // the process span, parent of the settle span
	dest    string
	anon    bool

	settled atomic.Bool // the handler settled the delivery, or tried to
}

// Settle settles the delivery as the handler asked, inside a settle span that records the
// result. A second settlement fails as it would have without the middleware, with an error
// wrapping [warren.ErrAlreadySettled].
func (s *settler) Settle(_ uint64, o warren.Outcome, delay time.Duration) error {
	s.settled.Store(true)
	op := opNack
	switch o {
	case warren.Acked:
		op = opAck
	case warren.Rejected:
		op = opReject
	}
	span := s.start(trace.ContextWithSpan(context.Background(), s.process), op)
	defer span.End()
	var err error
	switch o {
	case warren.Acked:
		err = s.d.Ack()
	case warren.Rejected:
		err = s.d.Reject()
	default:
		err = s.d.NackWithDelay(delay) // a plain Nack for a delay ≤ 0
	}
	if err != nil {
		fail(span, err)
	}
	return err
}

// finish ends the process span once the handler is done with err: marks it failed for an
// error, and, unless the handler settled the delivery itself, records the settlement Serve
// makes from err (see [Tracer.Middleware]).
func (s *settler) finish(ctx context.Context, err error) {
	if err != nil {
		fail(s.process, err)
	}
	if !s.settled.Load() {
		op := opNack
		switch {
		case err == nil:
			op = opAck
		case errors.Is(err, warren.ErrPermanent):
			op = opReject
		}
		s.start(ctx, op).End()
	}
	s.process.End()
}

// start starts a settle span, a child of ctx's span, for the settlement op.
func (s *settler) start(ctx context.Context, op string) trace.Span {
	attrs := make([]attribute.KeyValue, 0, 8)
	attrs = append(attrs, semconv.MessagingOperationName(op), semconv.MessagingOperationTypeSettle)
	attrs = destinationAttrs(attrs, s.dest, s.d.RoutingKey, s.anon)
	attrs = append(attrs, semconv.MessagingRabbitMQMessageDeliveryTag(int(s.d.DeliveryTag)))
	_, span := s.t.tracer.Start(ctx, spanName(op, s.dest, s.anon),
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	return span
}

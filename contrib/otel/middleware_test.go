package warrenotel_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	warrenotel "github.com/warrenmq/warren/contrib/otel"
)

// Tests of Tracer.Middleware beyond the acceptance trace (trace_test.go): handlers that settle
// their deliveries themselves, panics, the scope of another span, messages without a span
// context, dead letters without x-last-death-* headers, anonymous queues.

// TestMiddlewareHandlerSettles: a handler that settles its delivery itself gets one settle span,
// for its own settlement, around the call, and none for Serve's (which Serve does not make);
// the settlement takes effect; a second settlement fails as without the middleware.
func TestMiddlewareHandlerSettles(t *testing.T) {
	for _, tc := range []struct {
		name   string
		settle func(warren.Delivery) error
		result error // the handler's, after it settled
		span   string
		check  func(t *testing.T, q, dead *warren.Queue)
	}{
		{"ack", warren.Delivery.Ack, errors.New("late failure, ignored by Serve"), "ack q", func(t *testing.T, q, dead *warren.Queue) {
			require.Equal(t, uint64(1), q.Stats().Acked)
		}},
		{"nack with delay", func(d warren.Delivery) error { return d.NackWithDelay(time.Hour) }, nil, "nack q", func(t *testing.T, q, dead *warren.Queue) {
			s := q.Stats()
			require.Equal(t, uint64(1), s.Nacked)
			require.Equal(t, 1, s.Delayed, "hidden for the delay, though the handler returned nil")
		}},
		{"reject", warren.Delivery.Reject, nil, "reject q", func(t *testing.T, q, dead *warren.Queue) {
			require.Equal(t, uint64(1), q.Stats().Rejected)
			require.Equal(t, 1, dead.Len(), "dead-lettered, though the handler returned nil")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := newTracing(t)
				b := newBroker(t)
				dead := declare(t, b, "dead")
				q := declare(t, b, "q", warren.DeadLetter("", "dead"))
				require.NoError(t, tr.tracer.Publish(t.Context(), b, "", "q", warren.Message{Body: []byte("m")}))

				var again error
				handleAll(t, t.Context(), q, tr.tracer.Middleware("q")(func(ctx context.Context, d warren.Delivery) error {
					require.NoError(t, tc.settle(d))
					again = d.Ack()
					return tc.result
				}))
				require.ErrorIs(t, again, warren.ErrAlreadySettled)
				tc.check(t, q, dead)

				spans := tr.spans()
				require.Equal(t, []string{"publish q", tc.span, "ack q", "process q"}, names(spans),
					"the handler's settlement, then its failed second one; none of Serve's")
				process := one(t, spans, "process q")
				settle := named(spans, tc.span)[0]
				require.True(t, same(process.SpanContext, settle.Parent))
				require.Equal(t, codes.Unset, settle.Status.Code)
				second := named(spans, "ack q")[len(named(spans, "ack q"))-1]
				require.Equal(t, codes.Error, second.Status.Code, "the second settlement failed")
				require.NotEmpty(t, attrs(second)[semconv.ErrorTypeKey])
				if tc.result != nil {
					require.Equal(t, codes.Error, process.Status.Code)
				}
			})
		})
	}
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestMiddlewarePanic: a panicking handler's process span fails and its settlement is Serve's
// for a failure: nack for a plain panic, reject for a panic with an error wrapping
// ErrPermanent. The panic still reaches Serve, which recovers it and logs a stack that reaches
// the handler, though the middleware re-panicked it.
func TestMiddlewarePanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		var logs syncBuffer
		b := newBroker(t, warren.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		var panics int
		defer b.Listen(func(e warren.Event) {
			if e.Kind == warren.EventHandlerPanicked {
				panics++
			}
		})()
		dead := declare(t, b, "dead")
		q := declare(t, b, "q", warren.DeadLetter("", "dead"))
		require.NoError(t, tr.tracer.Publish(t.Context(), b, "", "q", warren.Message{Body: []byte("m")}))

		handleAll(t, t.Context(), q, tr.tracer.Middleware("q")(func(ctx context.Context, d warren.Delivery) error {
			if d.DeliveryCount == 0 {
				panic("boom")
			}
			panic(warren.Permanent(errors.New("poison")))
		}))
		require.Equal(t, 2, panics, "Serve saw both panics")
		require.Equal(t, 1, dead.Len(), "the second panic rejected the message")
		require.Contains(t, logs.String(), "middleware_test.go", "the logged stack reaches the handler")

		spans := tr.spans()
		require.Equal(t, []string{"publish q", "nack q", "process q", "reject q", "process q"}, names(spans))
		processes := named(spans, "process q")
		require.Equal(t, codes.Error, processes[0].Status.Code)
		require.Equal(t, "handler panicked: boom", processes[0].Status.Description)
		require.Equal(t, codes.Error, processes[1].Status.Code)
		require.Equal(t, "handler panicked: warren: permanent failure: poison", processes[1].Status.Description)
	})
}

// TestMiddlewareTypedNilError: a handler that returns a nil *opError in a non-nil error fails its
// attempt: the process span says so and names the type, though the error's own methods would
// panic; Serve gets the error as the handler returned it, logs it and nacks the message.
func TestMiddlewareTypedNilError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		var logs syncBuffer
		b := newBroker(t, warren.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		q := declare(t, b, "q")
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("m")}))
		handleAll(t, t.Context(), q, tr.tracer.Middleware("q")(func(ctx context.Context, d warren.Delivery) error {
			if d.DeliveryCount == 0 {
				return (*opError)(nil)
			}
			return nil
		}))
		spans := tr.spans()
		require.Equal(t, []string{"nack q", "process q", "ack q", "process q"}, names(spans))
		require.Equal(t, codes.Error, spans[1].Status.Code)
		require.Equal(t, "handler returned a nil *warrenotel_test.opError", spans[1].Status.Description)
		require.Equal(t, "*warrenotel_test.opError", attrs(spans[1])[semconv.ErrorTypeKey])
		require.Contains(t, logs.String(), "handler returned a nil *warrenotel_test.opError", "Serve logged it")
	})
}

// TestMiddlewareGoexit: a handler that ends its goroutine (t.FailNow does) fails its delivery
// in Serve, which nacks it: the span says so, and is ended.
func TestMiddlewareGoexit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		b := newBroker(t)
		q := declare(t, b, "q")
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("m")}))
		exited := false
		handleAll(t, t.Context(), q, tr.tracer.Middleware("q")(func(ctx context.Context, d warren.Delivery) error {
			if !exited {
				exited = true
				runtime.Goexit()
			}
			return nil
		}))
		spans := tr.spans()
		require.Equal(t, []string{"nack q", "process q", "ack q", "process q"}, names(spans))
		require.Equal(t, codes.Error, spans[1].Status.Code)
		require.Equal(t, "warrenotel: handler called runtime.Goexit", spans[1].Status.Description)
	})
}

// TestMiddlewareInScopeOfAnotherSpan: when Serve's context carries a span, a traced message's
// process span is still the publish's child, and links to both the publish and that span; an
// untraced message's process span is a child of that span, with no links.
func TestMiddlewareInScopeOfAnotherSpan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		b := newBroker(t)
		q := declare(t, b, "q")
		require.NoError(t, tr.tracer.Publish(t.Context(), b, "", "q", warren.Message{Body: []byte("traced")}))
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("untraced")}))

		ctx, worker := tr.start(t.Context(), "worker")
		var seen handlings
		handleAll(t, ctx, q, tr.tracer.Middleware("q")(func(ctx context.Context, d warren.Delivery) error {
			seen.add(ctx, d)
			return nil
		}))
		worker.End()

		spans := tr.spans()
		publish := one(t, spans, "publish q")
		processes := named(spans, "process q")
		require.Len(t, processes, 2)
		traced, untraced := processes[0], processes[1]
		require.True(t, same(publish.SpanContext, traced.Parent))
		require.Len(t, traced.Links, 2)
		require.True(t, same(publish.SpanContext, traced.Links[0].SpanContext), "links to the creation context")
		require.True(t, same(worker.SpanContext(), traced.Links[1].SpanContext), "and to the span it ran in the scope of")

		require.True(t, same(worker.SpanContext(), untraced.Parent), "no creation context: a child of the ambient span")
		require.Empty(t, untraced.Links)
		require.Nil(t, seen.all()[1].d.Message.Headers, "an untraced message has no headers added")
	})
}

// TestMiddlewareUntracedMessage: a message without a span context, handled outside any span,
// starts a trace of its own.
func TestMiddlewareUntracedMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		b := newBroker(t)
		q := declare(t, b, "q")
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("m")}))
		handleAll(t, t.Context(), q, tr.tracer.Middleware("q")(func(context.Context, warren.Delivery) error { return nil }))
		process := one(t, tr.spans(), "process q")
		require.False(t, process.Parent.IsValid(), "a root span")
		require.Empty(t, process.Links)
	})
}

// TestMiddlewareDeadLetterWithoutLastDeath: a dead letter from RabbitMQ before 3.13 carries its
// history in x-death alone, without the x-last-death-* headers; its process span still says
// why and where from it was last dead-lettered, from the newest x-death entry (the first).
func TestMiddlewareDeadLetterWithoutLastDeath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		b := newBroker(t)
		q := declare(t, b, "q")
		headers := warren.Table{"x-death": []any{
			warren.Table{"queue": "orders", "reason": "expired", "count": int64(1), "exchange": "", "routing-keys": []any{"orders"}},
			warren.Table{"queue": "jobs", "reason": "rejected", "count": int64(2), "exchange": "", "routing-keys": []any{"jobs"}},
		}}
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("m"), Headers: headers}))
		handleAll(t, t.Context(), q, tr.tracer.Middleware("q")(func(_ context.Context, d warren.Delivery) error {
			require.NotContains(t, d.Message.Headers, "x-last-death-reason")
			require.NotContains(t, d.Message.Headers, "x-last-death-queue")
			return nil
		}))
		a := attrs(one(t, tr.spans(), "process q"))
		require.Equal(t, "expired", a[warrenotel.DeadLetterReasonKey])
		require.Equal(t, "orders", a[warrenotel.DeadLetterQueueKey])
	})
}

// TestMiddlewareAnonymousQueue: a server-named queue's name is an attribute, not part of the
// span names (they would be of unbounded cardinality).
func TestMiddlewareAnonymousQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		b := newBroker(t)
		q := declare(t, b, "")
		require.NoError(t, tr.tracer.Publish(t.Context(), b, "", q.Name(), warren.Message{Body: []byte("m")}))
		handleAll(t, t.Context(), q, tr.tracer.Middleware(q.Name())(func(context.Context, warren.Delivery) error { return nil }))

		spans := tr.spans()
		require.Equal(t, []string{"publish", "ack", "process"}, names(spans))
		for _, s := range spans {
			a := attrs(s)
			require.Equal(t, q.Name(), a[semconv.MessagingDestinationNameKey], "span %q", s.Name)
			require.Equal(t, true, a[semconv.MessagingDestinationAnonymousKey], "span %q", s.Name)
		}
	})
}

// TestMiddlewareNilHandler: the middleware of a nil handler is nil, which Serve refuses.
func TestMiddlewareNilHandler(t *testing.T) {
	tr := newTracing(t)
	require.Nil(t, tr.tracer.Middleware("q")(nil))
	b := newBroker(t)
	q := declare(t, b, "q")
	require.ErrorIs(t, q.Serve(t.Context(), tr.tracer.Middleware("q")(nil)), warren.ErrInvalidArgument)
}

// TestMiddlewareHandlerContext: the handler's context is the one Serve gives, with the process
// span in it: its values and its cancellation are Serve's.
func TestMiddlewareHandlerContext(t *testing.T) {
	type key struct{}
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		b := newBroker(t)
		q := declare(t, b, "q")
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("m")}))
		ctx := context.WithValue(t.Context(), key{}, "v")
		var value any
		var span trace.SpanContext
		handleAll(t, ctx, q, tr.tracer.Middleware("q")(func(ctx context.Context, d warren.Delivery) error {
			value, span = ctx.Value(key{}), trace.SpanContextFromContext(ctx)
			<-ctx.Done() // until Serve stops
			return ctx.Err()
		}))
		require.Equal(t, "v", value)
		process := one(t, tr.spans(), "process q")
		require.True(t, same(process.SpanContext, span))
		require.Equal(t, codes.Error, process.Status.Code, "interrupted")
		require.Equal(t, "nack", attrs(one(t, tr.spans(), "nack q"))[semconv.MessagingOperationNameKey])
		require.Equal(t, 1, q.Len(), "back in its place")
	})
}

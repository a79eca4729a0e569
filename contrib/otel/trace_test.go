package warrenotel_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	warrenotel "github.com/warrenmq/warren/contrib/otel"
)

// One trace from a publish, through a retry and a dead letter, to the dead-letter queue's
// handler.

// handled is what a handler saw of one delivery: the span in its context, and the delivery.
type handled struct {
	span trace.SpanContext
	d    warren.Delivery
}

// handlings records what handlers saw, safely for Serve's workers.
type handlings struct {
	mu   sync.Mutex
	list []handled
}

func (h *handlings) add(ctx context.Context, d warren.Delivery) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.list = append(h.list, handled{trace.SpanContextFromContext(ctx), d})
}

func (h *handlings) all() []handled {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]handled(nil), h.list...)
}

// TestOneTraceThroughRetryAndDeadLetter: a message published under an application's span fails
// in its handler once (nacked, retried), then permanently (rejected), is dead-lettered through
// "jobs.dlx" into "jobs.dead", and handled there. Every span is in the application's trace:
// the publish a child of the application's span, each of the three processings a child of the
// publish (and linked to it), each settlement a child of its processing, with the outcome Serve
// gives the handler's result; the handlers run inside their process spans; the dead letter
// carries the publish's traceparent unchanged.
func TestOneTraceThroughRetryAndDeadLetter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		b := newBroker(t)
		_, err := b.DeclareExchange("jobs.dlx", warren.ExchangeDirect)
		require.NoError(t, err)
		jobs := declare(t, b, "jobs", warren.DeadLetter("jobs.dlx", ""))
		dead := declare(t, b, "jobs.dead")
		require.NoError(t, b.Bind("jobs.dead", "jobs.dlx", "jobs", nil))

		// Published before the handlers start, so that the spans end in one order.
		ctx, checkout := tr.start(t.Context(), "checkout")
		msg := warren.Message{Body: []byte("job"), MessageID: "m-1", CorrelationID: "order-7"}
		require.NoError(t, tr.tracer.Publish(ctx, b, "", "jobs", msg))
		checkout.End()

		var work, deadWork handlings
		stopJobs := serve(t.Context(), jobs, tr.tracer.Middleware("jobs")(func(ctx context.Context, d warren.Delivery) error {
			work.add(ctx, d)
			if d.DeliveryCount == 0 {
				return errors.New("transient")
			}
			return warren.Permanent(errors.New("malformed"))
		}))
		stopDead := serve(t.Context(), dead, tr.tracer.Middleware("jobs.dead")(func(ctx context.Context, d warren.Delivery) error {
			deadWork.add(ctx, d)
			return nil
		}))

		synctest.Wait()
		require.NoError(t, stopJobs())
		require.NoError(t, stopDead())
		require.Zero(t, jobs.Len()+jobs.Unacked()+dead.Len()+dead.Unacked(), "every message settled")

		spans := tr.spans()
		require.Equal(t, []string{
			"publish jobs", "checkout",
			"nack jobs", "process jobs",
			"reject jobs", "process jobs",
			"ack jobs.dlx:jobs:jobs.dead", "process jobs.dlx:jobs:jobs.dead",
		}, names(spans), "every span, in the order they ended")
		root := one(t, spans, "checkout").SpanContext
		for _, s := range spans {
			require.Equal(t, root.TraceID(), s.SpanContext.TraceID(), "span %q is in the application's trace", s.Name)
		}

		publish := one(t, spans, "publish jobs")
		require.Equal(t, trace.SpanKindProducer, publish.SpanKind)
		require.True(t, same(root, publish.Parent), "publish is a child of the application's span")
		require.Equal(t, codes.Unset, publish.Status.Code)
		require.Equal(t, map[string]any{
			"messaging.system":                           "rabbitmq",
			"messaging.operation.name":                   "publish",
			"messaging.operation.type":                   "send",
			"messaging.destination.name":                 "jobs",
			"messaging.rabbitmq.destination.routing_key": "jobs",
			"messaging.message.id":                       "m-1",
			"messaging.message.conversation_id":          "order-7",
		}, stringKeys(attrs(publish)))

		processes := named(spans, "process jobs")
		settles := []string{"nack jobs", "reject jobs"}
		errs := []string{"transient", "warren: permanent failure: malformed"}
		seen := work.all()
		require.Len(t, seen, 2, "two attempts")
		for i, p := range processes {
			require.Equal(t, trace.SpanKindConsumer, p.SpanKind)
			require.True(t, same(publish.SpanContext, p.Parent), "attempt %d is a child of the publish", i)
			require.True(t, p.Parent.IsRemote(), "through the message's headers")
			require.Len(t, p.Links, 1)
			require.True(t, same(publish.SpanContext, p.Links[0].SpanContext), "attempt %d links to the publish", i)
			a := attrs(p)
			require.Equal(t, "rabbitmq", a[semconv.MessagingSystemKey])
			require.Equal(t, "process", a[semconv.MessagingOperationNameKey])
			require.Equal(t, "process", a[semconv.MessagingOperationTypeKey])
			require.Equal(t, "jobs", a[semconv.MessagingDestinationNameKey])
			require.Equal(t, "jobs", a[semconv.MessagingRabbitMQDestinationRoutingKeyKey])
			require.Equal(t, int64(seen[i].d.DeliveryTag), a[semconv.MessagingRabbitMQMessageDeliveryTagKey])
			require.Equal(t, "m-1", a[semconv.MessagingMessageIDKey])
			require.Equal(t, int64(i), a[warrenotel.DeliveryCountKey], "attempt %d", i)
			require.NotContains(t, a, warrenotel.DeadLetterReasonKey)
			require.Equal(t, codes.Error, p.Status.Code)
			require.Equal(t, errs[i], p.Status.Description)
			require.NotEmpty(t, a[semconv.ErrorTypeKey])
			require.True(t, same(p.SpanContext, seen[i].span), "attempt %d's handler runs in its process span", i)

			settle := one(t, spans, settles[i])
			require.Equal(t, trace.SpanKindClient, settle.SpanKind)
			require.True(t, same(p.SpanContext, settle.Parent), "%s is a child of attempt %d", settles[i], i)
			require.Equal(t, codes.Unset, settle.Status.Code, "the settlement itself did not fail")
			sa := attrs(settle)
			require.Equal(t, "settle", sa[semconv.MessagingOperationTypeKey])
			require.Equal(t, settles[i][:len(settles[i])-len(" jobs")], sa[semconv.MessagingOperationNameKey])
			require.Equal(t, "jobs", sa[semconv.MessagingDestinationNameKey])
		}

		deadSeen := deadWork.all()
		require.Len(t, deadSeen, 1, "one dead letter")
		dl := deadSeen[0].d
		carried := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), warrenotel.HeaderCarrier(dl.Message.Headers)))
		require.True(t, same(publish.SpanContext, carried), "the dead letter carries the publish's traceparent")
		require.Equal(t, "rejected", dl.Message.Headers["x-first-death-reason"])

		deadProcess := one(t, spans, "process jobs.dlx:jobs:jobs.dead")
		require.Equal(t, trace.SpanKindConsumer, deadProcess.SpanKind)
		require.True(t, same(publish.SpanContext, deadProcess.Parent), "the dead letter's processing is a child of the publish")
		require.Len(t, deadProcess.Links, 1)
		require.True(t, same(publish.SpanContext, deadProcess.Links[0].SpanContext))
		require.True(t, same(deadProcess.SpanContext, deadSeen[0].span), "the DLQ handler runs in its process span")
		require.Equal(t, codes.Unset, deadProcess.Status.Code)
		da := attrs(deadProcess)
		require.Equal(t, "jobs.dlx:jobs:jobs.dead", da[semconv.MessagingDestinationNameKey])
		require.Equal(t, "jobs", da[semconv.MessagingRabbitMQDestinationRoutingKeyKey], "dead-lettered under its own key")
		require.Equal(t, "rejected", da[warrenotel.DeadLetterReasonKey])
		require.Equal(t, "jobs", da[warrenotel.DeadLetterQueueKey])
		require.Equal(t, int64(0), da[warrenotel.DeliveryCountKey], "a dead letter is a new message in its queue")
		require.Equal(t, "m-1", da[semconv.MessagingMessageIDKey], "the dead letter keeps its properties")

		ack := one(t, spans, "ack jobs.dlx:jobs:jobs.dead")
		require.True(t, same(deadProcess.SpanContext, ack.Parent))
		require.Equal(t, "ack", attrs(ack)[semconv.MessagingOperationNameKey])
	})
}

// stringKeys returns m with its keys as strings, for comparing with a literal.
func stringKeys[K ~string](m map[K]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[string(k)] = v
	}
	return out
}

// TestTraceThroughRedrive: a dead letter moved back from its dead-letter queue with Queue.Move
// (the redrive after a fix) keeps its headers, so its next processing is still a child of the
// original publish, and says which death brought it there.
func TestTraceThroughRedrive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		b := newBroker(t)
		jobs := declare(t, b, "jobs", warren.DeadLetter("", "jobs.dead"))
		dead := declare(t, b, "jobs.dead")
		ctx, checkout := tr.start(t.Context(), "checkout")
		require.NoError(t, tr.tracer.Publish(ctx, b, "", "jobs", warren.Message{Body: []byte("job")}))
		checkout.End()

		fixed := false
		handle := tr.tracer.Middleware("jobs")(func(ctx context.Context, d warren.Delivery) error {
			if !fixed {
				return warren.Permanent(errors.New("bug"))
			}
			return nil
		})
		handleAll(t, t.Context(), jobs, handle)
		require.Equal(t, 1, dead.Len(), "dead-lettered")
		fixed = true
		moved, err := dead.Move(t.Context(), "", "jobs")
		require.NoError(t, err)
		require.Equal(t, 1, moved)
		handleAll(t, t.Context(), jobs, handle)

		spans := tr.spans()
		require.Equal(t, []string{"publish jobs", "checkout", "reject jobs", "process jobs", "ack jobs", "process jobs"}, names(spans))
		publish := one(t, spans, "publish jobs")
		processes := named(spans, "process jobs")
		for _, p := range processes {
			require.Equal(t, publish.SpanContext.TraceID(), p.SpanContext.TraceID())
			require.True(t, same(publish.SpanContext, p.Parent), "a child of the publish")
		}
		redriven := attrs(processes[1])
		require.Equal(t, "rejected", redriven[warrenotel.DeadLetterReasonKey])
		require.Equal(t, "jobs", redriven[warrenotel.DeadLetterQueueKey])
		require.Equal(t, codes.Unset, processes[1].Status.Code)
	})
}

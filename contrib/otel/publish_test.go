package warrenotel_test

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/warrenmq/warren"
	warrenotel "github.com/warrenmq/warren/contrib/otel"
)

// get takes the one message of q, acked.
func get(t *testing.T, q *warren.Queue) warren.Message {
	t.Helper()
	d, err := q.Get(t.Context(), warren.AutoAck())
	require.NoError(t, err)
	return d.Message
}

// carried returns the span context a message's headers carry in W3C trace context.
func carried(m warren.Message) trace.SpanContext {
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), warrenotel.HeaderCarrier(m.Headers)))
}

// TestPublishInjectsIntoACopy: the published message carries the publish span's context in
// "traceparent" beside its own headers; the caller's table is left as it was.
func TestPublishInjectsIntoACopy(t *testing.T) {
	tr := newTracing(t)
	b := newBroker(t)
	q := declare(t, b, "q")
	headers := warren.Table{"app": "x"}
	require.NoError(t, tr.tracer.Publish(t.Context(), b, "", "q", warren.Message{Body: []byte("m"), Headers: headers}))
	require.Equal(t, warren.Table{"app": "x"}, headers, "the caller's headers are not modified")

	got := get(t, q)
	require.Equal(t, "x", got.Headers["app"])
	require.Contains(t, got.Headers, "traceparent")
	require.NotContains(t, got.Headers, "tracestate", "none to carry")
	require.Len(t, got.Headers, 2)
	publish := one(t, tr.spans(), "publish q")
	require.True(t, same(publish.SpanContext, carried(got)), "the creation context is the publish span's")
}

// TestPublishWithoutTracing: with a tracer provider that records nothing and no span in ctx,
// there is no span context to carry, and the message is published as it was, without headers.
func TestPublishWithoutTracing(t *testing.T) {
	tracer := warrenotel.NewTracer(warrenotel.WithTracerProvider(noop.NewTracerProvider()))
	b := newBroker(t)
	q := declare(t, b, "q")
	require.NoError(t, tracer.Publish(t.Context(), b, "", "q", warren.Message{Body: []byte("m")}))
	require.Nil(t, get(t, q).Headers)
}

// TestPublishKeepsCustomCreationContext: a message that already carries a span context (one a
// handler forwards, say) keeps it; the publish span links to it.
func TestPublishKeepsCustomCreationContext(t *testing.T) {
	tr := newTracing(t)
	b := newBroker(t)
	q := declare(t, b, "q")
	ctx, origin := tr.start(t.Context(), "origin")
	headers := warren.Table{}
	propagation.TraceContext{}.Inject(ctx, warrenotel.HeaderCarrier(headers))
	origin.End()
	want := headers["traceparent"]

	ctx, forward := tr.start(t.Context(), "forward")
	require.NoError(t, tr.tracer.Publish(ctx, b, "", "q", warren.Message{Body: []byte("m"), Headers: headers}))
	forward.End()
	require.Equal(t, want, get(t, q).Headers["traceparent"], "the creation context is kept")

	publish := one(t, tr.spans(), "publish q")
	require.True(t, same(forward.SpanContext(), publish.Parent), "the publish is a child of ctx's span")
	require.Len(t, publish.Links, 1)
	require.True(t, same(origin.SpanContext(), publish.Links[0].SpanContext), "and links to the creation context")
}

// TestPublishFailure: a publish that fails returns p.Publish's error, and its span says so.
func TestPublishFailure(t *testing.T) {
	tr := newTracing(t)
	b := newBroker(t)
	err := tr.tracer.Publish(t.Context(), b, "", "nowhere", warren.Message{Body: []byte("m")}, warren.Mandatory())
	require.ErrorIs(t, err, warren.ErrUnroutable)
	err = tr.tracer.Publish(t.Context(), b, "missing", "k", warren.Message{Body: []byte("m")})
	require.ErrorIs(t, err, warren.ErrNotFound)

	for _, name := range []string{"publish nowhere", "publish missing:k"} {
		s := one(t, tr.spans(), name)
		require.Equal(t, codes.Error, s.Status.Code, name)
		require.NotEmpty(t, s.Status.Description, name)
		require.NotEmpty(t, attrs(s)[semconv.ErrorTypeKey], name)
	}
}

// TestPublishDestinations: the span's name and destination follow RabbitMQ's conventions for a
// producer: "{exchange}:{routing key}", the one given, or amq.default; a server-named queue is
// left out of the span's name.
func TestPublishDestinations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		b := newBroker(t)
		anon := declare(t, b, "")
		for _, tc := range []struct {
			exchange, key string
			span, dest    string
		}{
			{"amq.topic", "orders.created", "publish amq.topic:orders.created", "amq.topic:orders.created"},
			{"amq.fanout", "", "publish amq.fanout", "amq.fanout"},
			{"", "jobs", "publish jobs", "jobs"},
			{"", "", "publish amq.default", "amq.default"},
			{"", anon.Name(), "publish", anon.Name()},
		} {
			tr.exp.Reset()
			require.NoError(t, tr.tracer.Publish(t.Context(), b, tc.exchange, tc.key, warren.Message{Body: []byte("m")}))
			s := one(t, tr.spans(), tc.span)
			a := attrs(s)
			require.Equal(t, tc.dest, a[semconv.MessagingDestinationNameKey], "Publish(%q, %q)", tc.exchange, tc.key)
			if tc.key == "" {
				require.NotContains(t, a, semconv.MessagingRabbitMQDestinationRoutingKeyKey, "Publish(%q, %q)", tc.exchange, tc.key)
			} else {
				require.Equal(t, tc.key, a[semconv.MessagingRabbitMQDestinationRoutingKeyKey], "Publish(%q, %q)", tc.exchange, tc.key)
			}
		}
	})
}

// TestPublishBaggage: with a propagator of trace context and baggage, the baggage published
// reaches the handler's context.
func TestPublishBaggage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t, warrenotel.WithPropagator(propagation.NewCompositeTextMapPropagator(
			propagation.TraceContext{}, propagation.Baggage{})))
		b := newBroker(t)
		q := declare(t, b, "q")
		m, err := baggage.NewMember("tenant", "acme")
		require.NoError(t, err)
		bag, err := baggage.New(m)
		require.NoError(t, err)
		require.NoError(t, tr.tracer.Publish(baggage.ContextWithBaggage(t.Context(), bag), b, "", "q", warren.Message{Body: []byte("m")}))

		var tenant string
		handleAll(t, t.Context(), q, tr.tracer.Middleware("q")(func(ctx context.Context, d warren.Delivery) error {
			tenant = baggage.FromContext(ctx).Member("tenant").Value()
			return nil
		}))
		require.Equal(t, "acme", tenant)
	})
}

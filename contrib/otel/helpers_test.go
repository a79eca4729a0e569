package warrenotel_test

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	warrenotel "github.com/warrenmq/warren/contrib/otel"
)

// tracing is a tracer provider whose spans are exported as they end into memory, and a Tracer
// of it.
type tracing struct {
	exp    *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
	tracer *warrenotel.Tracer
}

// newTracing returns a tracing that samples every span; it shuts down at the test's end.
func newTracing(t *testing.T, opts ...warrenotel.TracerOption) *tracing {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	opts = append([]warrenotel.TracerOption{warrenotel.WithTracerProvider(tp)}, opts...)
	return &tracing{exp: exp, tp: tp, tracer: warrenotel.NewTracer(opts...)}
}

// start starts a span of the test's own, as an application's would be.
func (tr *tracing) start(ctx context.Context, name string) (context.Context, trace.Span) {
	return tr.tp.Tracer("test").Start(ctx, name)
}

// spans returns the spans ended so far, in the order they ended.
func (tr *tracing) spans() tracetest.SpanStubs { return tr.exp.GetSpans() }

// named returns the ended spans named name, in the order they ended.
func named(spans tracetest.SpanStubs, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// one returns the one ended span named name.
func one(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	got := named(spans, name)
	require.Len(t, got, 1, "spans named %q among %v", name, names(spans))
	return got[0]
}

// names returns the spans' names, in order.
func names(spans tracetest.SpanStubs) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name
	}
	return out
}

// attrs returns a span's attributes by key, as plain Go values.
func attrs(s tracetest.SpanStub) map[attribute.Key]any {
	m := make(map[attribute.Key]any, len(s.Attributes))
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value.AsInterface()
	}
	return m
}

// same reports whether two span contexts name the same span (one may be remote, the other not).
func same(a, b trace.SpanContext) bool {
	return a.TraceID() == b.TraceID() && a.SpanID() == b.SpanID()
}

// newBroker returns a broker closed at the test's end.
func newBroker(t *testing.T, opts ...warren.BrokerOption) *warren.Broker {
	t.Helper()
	b := warren.New(opts...)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// declare declares a queue.
func declare(t *testing.T, b *warren.Broker, name string, opts ...warren.QueueOption) *warren.Queue {
	t.Helper()
	q, err := b.DeclareQueue(name, opts...)
	require.NoError(t, err)
	return q
}

// serve runs q.Serve(ctx, h, opts...) on a goroutine of its own until the returned stop is
// called, which cancels it and returns what Serve returned. Call it, and stop, in a synctest
// bubble, where synctest.Wait waits for the handlers to be idle.
func serve(ctx context.Context, q *warren.Queue, h warren.Handler, opts ...warren.ServeOption) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	started := make(chan struct{})
	opts = append(opts, warren.OnStart(func() { close(started) }))
	go func() { done <- q.Serve(ctx, h, opts...) }()
	select {
	case <-started:
	case err := <-done: // failed to start: stop says why
		done <- err
	}
	return func() error {
		cancel()
		return <-done
	}
}

// handleAll serves q with h until every handler is idle, in a synctest bubble, then stops
// Serve; Serve must return nil.
func handleAll(t *testing.T, ctx context.Context, q *warren.Queue, h warren.Handler) {
	t.Helper()
	stop := serve(ctx, q, h)
	synctest.Wait()
	require.NoError(t, stop())
}

// opError is an error type as os.PathError is: pointer methods that read its fields, so that a
// nil *opError, returned in a non-nil error, panics in each of them.
type opError struct {
	op  string
	err error
}

func (e *opError) Error() string { return e.op + ": " + e.err.Error() }
func (e *opError) Unwrap() error { return e.err }

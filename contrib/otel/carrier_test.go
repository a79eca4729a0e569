package warrenotel_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	warrenotel "github.com/warrenmq/warren/contrib/otel"
)

// TestHeaderCarrier: Get reads strings and []byte, and nothing else; Set writes strings; Keys
// lists every header, sorted.
func TestHeaderCarrier(t *testing.T) {
	c := warrenotel.HeaderCarrier{"s": "text", "b": []byte("bytes"), "n": int32(7), "t": warren.Table{}}
	for key, want := range map[string]string{"s": "text", "b": "bytes", "n": "", "t": "", "absent": ""} {
		require.Equal(t, want, c.Get(key), "Get(%q)", key)
	}
	c.Set("traceparent", "v")
	require.Equal(t, "v", c["traceparent"])
	require.Equal(t, []string{"b", "n", "s", "t", "traceparent"}, c.Keys())
	require.Empty(t, warrenotel.HeaderCarrier(nil).Keys())
	require.Empty(t, warrenotel.HeaderCarrier(nil).Get("traceparent"))
}

// TestHeaderCarrierRoundTrip: W3C trace context written into a table is read back, also when a
// client made its values []byte.
func TestHeaderCarrierRoundTrip(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{1, 2, 3},
		SpanID:     trace.SpanID{4, 5, 6},
		TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	h := warren.Table{}
	propagation.TraceContext{}.Inject(ctx, warrenotel.HeaderCarrier(h))
	require.Equal(t, "00-01020300000000000000000000000000-0405060000000000-01", h["traceparent"])

	got := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), warrenotel.HeaderCarrier(h)))
	require.True(t, got.Equal(sc.WithRemote(true)))

	h["traceparent"] = []byte(h["traceparent"].(string))
	got = trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), warrenotel.HeaderCarrier(h)))
	require.True(t, got.Equal(sc.WithRemote(true)), "from []byte")
}

package warrenotel

import (
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Tracer traces messages through warren: [Tracer.Publish] records the publish and writes its
// span context into the message's headers; [Tracer.Middleware] wraps a [warren.Handler] to
// read it back and record the processing and the settlement of each delivery. Create one with
// [NewTracer]; the zero Tracer is not usable. A Tracer is safe for concurrent use, holds no
// resources and needs no closing.
type Tracer struct {
	// Set once by NewTracer.
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
}

// NewTracer returns a Tracer whose spans come from the [WithTracerProvider] provider
// (OpenTelemetry's global one by default) under the instrumentation scope [ScopeName], and whose
// span contexts travel in headers written by the [WithPropagator] propagator (W3C trace
// context by default).
func NewTracer(opts ...TracerOption) *Tracer {
	cfg := defaultTracerConfig()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	return &Tracer{
		tracer:     cfg.provider.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		propagator: cfg.propagator,
	}
}

// fail marks span as failed with err, as the conventions' "Recording errors" asks: status
// Error with err's message, and error.type.
func fail(span trace.Span, err error) {
	span.SetStatus(codes.Error, err.Error())
	span.SetAttributes(semconv.ErrorType(err))
}

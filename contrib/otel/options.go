package warrenotel

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TracerOption configures a [Tracer]; see [NewTracer]. A nil TracerOption is ignored.
type TracerOption func(*tracerConfig)

type tracerConfig struct {
	provider   trace.TracerProvider
	propagator propagation.TextMapPropagator
}

// defaultTracerConfig is what [NewTracer] uses when no option says otherwise.
//
// The tracer provider is OpenTelemetry's global one, read when the Tracer is made: the
// convention for instrumentation libraries, so that an application configures tracing once. It
// is a no-op until the application sets one, and a Tracer made before that follows the one set
// later (the global provider delegates). The propagator is not the global one: that is a no-op
// by default, which would carry nothing in the headers; W3C trace context is what this package
// is for.
func defaultTracerConfig() tracerConfig {
	return tracerConfig{provider: otel.GetTracerProvider(), propagator: propagation.TraceContext{}}
}

// WithTracerProvider sets the provider the Tracer's spans come from. Default: OpenTelemetry's
// global provider ([otel.GetTracerProvider]) as of [NewTracer]. A nil provider keeps the
// default.
func WithTracerProvider(tp trace.TracerProvider) TracerOption {
	return func(c *tracerConfig) {
		if tp != nil {
			c.provider = tp
		}
	}
}

// WithPropagator sets how a span context is written into a message's headers and read back.
// Default: [propagation.TraceContext], the W3C "traceparent" and "tracestate" headers. Use a
// [propagation.NewCompositeTextMapPropagator] of TraceContext and [propagation.Baggage] to
// carry baggage too. A nil propagator keeps the default.
func WithPropagator(p propagation.TextMapPropagator) TracerOption {
	return func(c *tracerConfig) {
		if p != nil {
			c.propagator = p
		}
	}
}

// MetricsOption configures a [Metrics]; see [NewMetrics]. A nil MetricsOption is ignored.
type MetricsOption func(*metricsConfig)

type metricsConfig struct {
	provider metric.MeterProvider
}

// defaultMetricsConfig is what [NewMetrics] uses when no option says otherwise: OpenTelemetry's
// global meter provider, for the reason given for the tracer provider (defaultTracerConfig).
func defaultMetricsConfig() metricsConfig {
	return metricsConfig{provider: otel.GetMeterProvider()}
}

// WithMeterProvider sets the provider the instruments come from. Default: OpenTelemetry's global
// provider ([otel.GetMeterProvider]) as of [NewMetrics]. A nil provider keeps the default.
func WithMeterProvider(mp metric.MeterProvider) MetricsOption {
	return func(c *metricsConfig) {
		if mp != nil {
			c.provider = mp
		}
	}
}

// Package warrenotel traces messages through a [warren.Broker] with OpenTelemetry.
//
// The import path is github.com/warrenmq/warren/contrib/otel, but the package is named
// warrenotel, so that it can be imported next to go.opentelemetry.io/otel without an alias.
// It is a module of its own: warren itself does not depend on OpenTelemetry.
//
// [Tracer.Publish] publishes a message inside a PRODUCER span, after OpenTelemetry's messaging
// semantic conventions for RabbitMQ (semconv v1.43.0), and writes the span's context into a
// copy of the message's headers as W3C trace context, through a [HeaderCarrier].
// [Tracer.Middleware] wraps a [warren.Handler] to read it back: each delivery is processed in a
// CONSUMER span, a child of the publish, and its settlement recorded in a CLIENT span. Headers
// survive redelivery and dead-lettering, so a message's retries and dead letters are in the
// trace of its publish.
package warrenotel

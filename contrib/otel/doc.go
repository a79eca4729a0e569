// Package warrenotel traces messages through a [warren.Broker] with OpenTelemetry, and exposes
// the broker's statistics, and the processing of its messages, as OpenTelemetry metrics.
//
// The import path is github.com/warrenmq/warren/contrib/otel, but the package is named
// warrenotel, so that it can be imported next to go.opentelemetry.io/otel without an alias.
// It is a module of its own: warren itself does not depend on OpenTelemetry.
//
// # Tracing
//
// A [Tracer] is made once, from a tracer provider, and used on both sides:
//
//	tracer := warrenotel.NewTracer(warrenotel.WithTracerProvider(tp))
//
//	// Publishing: a PRODUCER span, whose context goes into the message's headers.
//	err := tracer.Publish(ctx, b, "", "jobs", warren.Message{Body: body})
//
//	// Consuming: a CONSUMER span per delivery, a child of the publish, and its settlement.
//	err = q.Serve(ctx, tracer.Middleware("jobs")(handle), warren.Workers(8))
//
// A message published and then retried once and dead-lettered gives one trace:
//
//	publish jobs                                (PRODUCER, a child of ctx's span)
//	├── process jobs                            (CONSUMER, delivery count 0, Error)
//	│   └── nack jobs                           (CLIENT: Serve returns it for another attempt)
//	├── process jobs                            (CONSUMER, delivery count 1, Error)
//	│   └── reject jobs                         (CLIENT: the error wrapped warren.ErrPermanent)
//	└── process jobs.dlx:jobs:jobs.dead         (CONSUMER, dead-letter reason "rejected")
//	    └── ack jobs.dlx:jobs:jobs.dead         (CLIENT)
//
// [Tracer.Publish] and [Tracer.Middleware] say what each span carries.
//
// # Propagation
//
// The publish span's context is the message's creation context: [Tracer.Publish] writes it
// into a copy of the message's headers, as W3C trace context ("traceparent", "tracestate") by
// default ([WithPropagator] for another propagator, or baggage too), through a [HeaderCarrier].
// The middleware reads it back from each delivery and makes it the parent of the process span
// (and links to it, as the conventions ask). The context lasts as long as the headers do:
// across redeliveries, which are the same message, and across dead-lettering, because a dead
// letter is a copy of the message whose headers are the original's plus its x-death history
// (so a message that expires or overflows its queue is traced into its dead-letter queue too),
// and across a redrive with [warren.Queue.Move], which moves a message as it is. The same holds
// for contrib/rabbitmq's backend: RabbitMQ keeps headers when it dead-letters.
//
// # Conventions
//
// Spans follow OpenTelemetry's messaging semantic conventions as of semconv v1.43.0, the
// newest that go.opentelemetry.io/otel v1.47.0 ships, and within them those of RabbitMQ,
// whose model warren implements: span names "{operation} {destination}", destination names
// "{exchange}:{routing key}" when publishing and "{exchange}:{routing key}:{queue}" when
// consuming, operation types "send", "process" and "settle", the routing key as
// messaging.rabbitmq.destination.routing_key. messaging.system is "rabbitmq": the conventions
// name a system as the instrumentation knows it, and what warren speaks is RabbitMQ's model
// (contrib/amqp speaks its protocol, contrib/rabbitmq runs the same code on a RabbitMQ
// cluster), so backends that understand RabbitMQ spans understand these. Spans made here are
// told apart by their instrumentation scope, [ScopeName]. A server-named queue ("amq.gen-…")
// is an anonymous destination: its name is an attribute, not part of the span name.
//
// # Metrics
//
// [NewMetrics] registers observable instruments whose values come from [warren.Broker.Stats] at
// each collection: per-queue gauges and counters, labelled by [QueueKey], plus the broker's
// exchange count, unroutable publishes and memory budget (used, limit, alarm, waiting
// publishers, alarms). It runs no goroutine: the reader's collection calls
// it. [Metrics.Close] unregisters them.
//
// [Metrics.Middleware] measures the handlers of Serve as the messaging conventions ask: each
// attempt at a message in messaging.process.duration (seconds, with error.type when the handler
// fails or panics) and in messaging.client.consumed.messages, under the queue's name. It goes
// with the tracer's, which it belongs inside, so that its measurements are made in the process
// span:
//
//	err = q.Serve(ctx, handle, warren.Middleware(tracer.Middleware("jobs"), metrics.Middleware("jobs")))
package warrenotel

// Package rabbitmq takes a warren application onto a RabbitMQ cluster: the same topology, and
// the same handlers.
//
// [Client] implements [warren.Backend], as a [warren.Broker] does, so that code written against
// that interface (declare a topology, publish with a confirm, serve a queue with a
// [warren.Handler]) runs in the process or on RabbitMQ unchanged. The client keeps its
// connection up: it reconnects with a backoff, declares its topologies again, publishes again
// what was not confirmed, and its [Client.Serve] goes on. What RabbitMQ has no counterpart for
// fails with [warren.ErrUnsupported].
//
// [DeclareTopology] declares a [warren.Topology] — a broker's exchanges, queues and bindings,
// from [warren.Broker.Topology] or a definitions file ([warren.ReadDefinitions]) — on a RabbitMQ
// channel, with classic or quorum queues. Declaring is idempotent.
//
// It is its own module, on github.com/rabbitmq/amqp091-go, so that importing warren stays
// light. Its tests run against a real RabbitMQ at $WARREN_RABBITMQ_URL, which CI sets after
// starting one (bench/rabbitmq.sh); without it they are skipped, saying so.
package rabbitmq

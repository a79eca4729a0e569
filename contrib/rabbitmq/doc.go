// Package rabbitmq takes a warren application onto a RabbitMQ cluster: the same topology, and
// (in the steps that follow) the same handlers.
//
// [DeclareTopology] declares a [warren.Topology] — a broker's exchanges, queues and bindings,
// from [warren.Broker.Topology] or a definitions file ([warren.ReadDefinitions]) — on a RabbitMQ
// channel, with classic or quorum queues. Declaring is idempotent: declaring the same topology
// again (after a reconnect, from another instance) changes nothing.
//
// It is its own module, on github.com/rabbitmq/amqp091-go, so that importing warren stays
// light. Its tests run against a real RabbitMQ at $WARREN_RABBITMQ_URL, which CI sets after
// starting one (bench/rabbitmq.sh); without it they are skipped, saying so.
package rabbitmq

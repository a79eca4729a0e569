// Package bench compares warren with buffered Go channels and with other message brokers a Go
// service might embed or talk to, on the same workloads, in one run. Each system sits behind
// the small interface below; the workloads (workloads.go) drive it and verify every message:
// nothing lost, nothing duplicated, and the order, where the system promises one.
//
// The driver is cmd/bench: it runs every measurement in a fresh process and takes medians.
package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// BodySize is the size of every message body. The first 8 bytes carry the sequence number.
const BodySize = 128

// Delivery is one message received by a Consumer. It is passed by value; h and Tag let the
// system settle it without a map lookup or an allocation.
type Delivery struct {
	Body        []byte
	Redelivered bool
	Tag         uint64 // the system's delivery tag, where it has one
	h           any    // the system's own delivery handle (a pointer), where it has one
}

// Config describes the queue a workload needs.
type Config struct {
	// Capacity is the most messages the queue will hold at once (a hint: the channel baselines
	// size their buffers with it; the others ignore it).
	Capacity int
	// Messages is every message the workload will publish to the queue (chan-min-unbounded
	// sizes its buffer with it, so that its producer never waits for room).
	Messages int
	// MaxUnacked is the most unacknowledged deliveries the workload's consumers hold at once,
	// prefetch × consumers (JetStream sets its consumer's MaxAckPending to it; the others
	// bound each consumer by its own prefetch).
	MaxUnacked int
}

// System is one message system under test: a broker (or a channel) and its queues.
type System interface {
	// DeclareQueue creates a work queue: every message is delivered to one of its consumers.
	DeclareQueue(name string, cfg Config) error
	// Producer returns a publisher; each producer goroutine gets its own.
	Producer() (Producer, error)
	// Consumer returns a consumer of queue name that holds at most prefetch unacknowledged
	// deliveries; each consumer goroutine gets its own.
	Consumer(name string, prefetch int) (Consumer, error)
	// Close releases everything.
	Close() error
}

// Producer publishes to queues. It is used by one goroutine.
type Producer interface {
	// Publish publishes body to queue name. It may return before the system has the message
	// (an asynchronous publish); Flush waits for every publish so far to be confirmed.
	Publish(name string, body []byte) error
	Flush() error
	Close() error
}

// Consumer receives from one queue. It is used by one goroutine.
type Consumer interface {
	// Next returns the next delivery, waiting for one until ctx ends.
	Next(ctx context.Context) (Delivery, error)
	// Ack acknowledges d (a no-op where the system has no acknowledgements).
	Ack(d Delivery) error
	// Requeue returns the unacknowledged deliveries ds, all received from this consumer in
	// the order given, to the queue for redelivery, the way a user of the system would: one
	// multiple-negative-acknowledgement where the system has one, else one per delivery.
	// ErrUnsupported where the system cannot.
	Requeue(ds []Delivery) error
	Close() error
}

// TopicRouter is implemented by systems that route by topic patterns (S2).
type TopicRouter interface {
	// SetupTopic declares queues queues and one binding per pattern (AMQP topic syntax:
	// dotted words, "*" one word, "#" zero or more words, used only last), binding i to queue
	// i % queues.
	SetupTopic(patterns []string, queues int) error
	// PublishTopic publishes body with routing key key through the topic exchange.
	PublishTopic(key string, body []byte) error
	// FlushTopic returns once every message published so far has been routed.
	FlushTopic() error
	// DrainTopic receives every message routed, perBinding[i] of them through binding i, and
	// returns their bodies' sequence numbers as lists, each in the order one queue (or, for
	// a system with one subscription per binding, one subscription) delivered them.
	DrainTopic(perBinding []int, queues int) ([][]uint64, error)
}

// SyncProducerSystem is implemented by systems that can give a producer whose Publish returns
// only once the system has confirmed that message (D1: every publisher waits for each confirm
// before its next publish). A system without it is asked for its ordinary Producer, whose
// Publish must then be synchronous already (the channel, warren).
type SyncProducerSystem interface {
	SyncProducer() (Producer, error)
}

// BatchPublisher is implemented by producers that publish many messages with one wait for
// their confirms (D2: warren's Broker.PublishBatch).
type BatchPublisher interface {
	// PublishBatch publishes bodies to queue name, in order, and returns once every one is
	// confirmed.
	PublishBatch(name string, bodies [][]byte) error
}

// DiskUser is implemented by systems that keep their data in a directory of their own: the
// bytes and files in it now (the durable systems, for the report's disk columns).
type DiskUser interface {
	DiskUsage() (bytes int64, files int, err error)
}

// ErrUnsupported is returned by operations a system cannot do meaningfully.
var ErrUnsupported = errors.New("not supported by this system")

// ErrSkip is wrapped by Open when a system is not available here (RabbitMQ not running).
var ErrSkip = errors.New("system not available")

// Info says what a system promises and can do, for the workloads and the report.
type Info struct {
	Name string
	// Ordered: one queue delivers in publication order (per producer) to each consumer.
	Ordered bool
	// Acks: deliveries are acknowledged (at-least-once); false for core NATS and the channel.
	Acks bool
	// Backlog: the queue keeps messages published while no consumer takes them.
	Backlog bool
	// ClientOnly: allocations and RSS are the client process's only (a broker elsewhere).
	ClientOnly bool
	// WithServer: the system is a client talking to a server over a socket, both in this
	// process, so allocations and RSS are the two together (warren-amqp).
	WithServer bool
	// Durable: the system writes its queue and messages to disk; it belongs to the durable
	// suite (cmd/bench -durable) rather than the in-memory one.
	Durable bool
	// Batch: the system's producers implement BatchPublisher (D2).
	Batch bool
	// NA maps a workload ID to the reason the system cannot do it meaningfully.
	NA map[string]string
	// Setup describes the configuration, for the report.
	Setup string
}

// Spec is a system the driver knows: its Info and how to open it.
type Spec struct {
	Info
	Open func() (System, error)
}

var specs = map[string]Spec{}

// naD2 is the reason a system without a batch publish is not run in D2.
const naD2 = "D2 measures warren's `PublishBatch` (a single publisher confirming a batch with one wait); this system has no such call, so it is not run there (its way to spread the cost of confirms over many messages is an asynchronous confirm window, which its W1 uses where it has one)"

func register(s Spec) {
	if !s.Batch {
		if s.NA == nil {
			s.NA = map[string]string{}
		}
		if _, ok := s.NA["D2"]; !ok {
			s.NA["D2"] = naD2
		}
	}
	specs[s.Name] = s
}

// Systems returns the names of the known systems, in report order.
func Systems() []string {
	order := []string{"chan-min", "chan-min-unbounded", "chan", "warren", "warren-block", "watermill-gochannel", "nats-core", "nats-jetstream-mem", "rabbitmq", "rabbitmq-client", "warren-amqp",
		"warren-durable-always", "warren-durable-interval", "warren-durable-never", "nats-jetstream-file", "nats-jetstream-file-sync", "rabbitmq-durable"}
	var names []string
	for _, n := range order {
		if _, ok := specs[n]; ok {
			names = append(names, n)
		}
	}
	var rest []string
	for n := range specs {
		if !slices.Contains(order, n) {
			rest = append(rest, n)
		}
	}
	sort.Strings(rest)
	return append(names, rest...)
}

// SuiteSystems returns the names of the systems of one suite, in report order: the in-memory
// systems (durable false), or the durable ones after `warren` (in memory), their reference.
func SuiteSystems(durable bool) []string {
	var out []string
	if durable {
		out = append(out, "warren")
	}
	for _, n := range Systems() {
		if specs[n].Durable == durable {
			out = append(out, n)
		}
	}
	return out
}

// NeedsRabbit says whether the named system talks to the RabbitMQ node at RabbitURL.
func NeedsRabbit(name string) bool { return strings.HasPrefix(name, "rabbitmq") }

// Lookup returns the spec of the named system.
func Lookup(name string) (Spec, error) {
	s, ok := specs[name]
	if !ok {
		return Spec{}, fmt.Errorf("unknown system %q (known: %s)", name, strings.Join(Systems(), ", "))
	}
	return s, nil
}

package warren

import (
	"context"
	"time"
)

// Backend is what a service's code needs of a message broker, whichever it is: a [Broker] in
// the process, or a RabbitMQ cluster through contrib/rabbitmq's Client. Code written against it
// (topology, publishers, handlers) runs on both unchanged; what one of them cannot do fails
// there with [ErrUnsupported].
type Backend interface {
	// DeclareTopology declares exchanges, queues and bindings ([Broker.DeclareTopology]).
	DeclareTopology(t Topology) error
	// Publish publishes and returns the confirm ([Broker.Publish]).
	Publish(ctx context.Context, exchange, key string, msg Message, opts ...PublishOption) error
	// Serve runs h on the queue's deliveries until ctx ends ([Broker.Serve]).
	Serve(ctx context.Context, queue string, h Handler, opts ...ServeOption) error
	// Close closes the backend.
	Close() error
}

var _ Backend = (*Broker)(nil)

// Serve is [Queue.Serve] on the queue with the given name, looked up on ctx's behalf (an
// exclusive queue is served only by its owner): an error wrapping [ErrNotFound] when there is
// none.
func (b *Broker) Serve(ctx context.Context, queue string, h Handler, opts ...ServeOption) error {
	q, err := b.Queue(queue, As(ctx))
	if err != nil {
		return err
	}
	return q.Serve(ctx, h, opts...)
}

// Backends other than warren's own: what they need to honour warren's options the way a
// [Broker] does (contrib/rabbitmq's client is one).

// PublishSettings is what a publish's options ask for.
type PublishSettings struct {
	Mandatory  bool          // [Mandatory]
	Immediate  bool          // [Immediate]
	Delay      time.Duration // [DeliverAfter]; 0 for none
	Expiration string        // [ExpireAfter], as the Message.Expiration it sets; "" when not given
}

// ReadPublishOptions returns what opts ask for, or the error an invalid one makes a publish
// fail with (wrapping [ErrInvalidArgument]), as [Broker.Publish] reads them.
func ReadPublishOptions(opts ...PublishOption) (PublishSettings, error) {
	if len(opts) == 0 {
		return PublishSettings{}, nil // the common case, without reading a configuration
	}
	cfg := publishOptions(opts)
	if cfg.err != nil {
		return PublishSettings{}, cfg.err
	}
	if cfg.immediate && cfg.delay > 0 {
		return PublishSettings{}, errorf("publish: immediate with a delay: %w", ErrInvalidArgument)
	}
	s := PublishSettings{Mandatory: cfg.mandatory, Immediate: cfg.immediate, Delay: max(cfg.delay, 0)}
	if cfg.expiration != nil {
		s.Expiration = *cfg.expiration
	}
	return s, nil
}

// ServeSettings is what [Queue.Serve]'s options ask of the consumer under the pool, for a
// backend that makes its own consumer and hands it to [ServeSource].
type ServeSettings struct {
	Workers    int           // [Workers]
	Prefetch   int           // [Prefetch]; Workers when not given, as Serve does
	Tag        string        // [ConsumerTag]; "" for one the backend makes
	Priority   int           // [ConsumerPriority]
	Exclusive  bool          // [Exclusive]
	Selector   bool          // a [Selector] is given
	AckTimeout time.Duration // [AckTimeout]; 0 when not given
	BackoffMax time.Duration // the longest delay of a [Backoff]: failed deliveries are returned with NackWithDelay; 0 without one
}

// ReadServeOptions returns what opts ask of the consumer, or the error an invalid one makes
// Serve fail with, as [Queue.Serve] reads them.
func ReadServeOptions(opts ...ServeOption) (ServeSettings, error) {
	cfg, err := serveOptions(opts)
	switch {
	case err != nil:
		return ServeSettings{}, err
	case cfg.consume.err != nil:
		return ServeSettings{}, cfg.consume.err
	case cfg.consume.prefetchSet && (cfg.consume.prefetch < 1 || cfg.consume.prefetch > maxPrefetch):
		return ServeSettings{}, errorf("serve: prefetch %d not in [1, %d]: %w", cfg.consume.prefetch, maxPrefetch, ErrInvalidArgument)
	}
	s := ServeSettings{Workers: cfg.workers, Prefetch: cfg.consume.prefetch, Tag: cfg.consume.tag, Priority: cfg.consume.priority,
		Exclusive: cfg.consume.exclusive, Selector: cfg.consume.selector != nil, AckTimeout: max(cfg.consume.ackTimeout, 0),
		BackoffMax: cfg.longest}
	if !cfg.consume.prefetchSet {
		s.Prefetch = cfg.workers
	}
	return s, nil
}

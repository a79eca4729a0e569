package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/contrib/rabbitmq"
)

func init() {
	register(Spec{
		Info: Info{
			Name: "rabbitmq-client", Ordered: true, Acks: true, Backlog: true, ClientOnly: true,
			NA: map[string]string{
				"W4": "`Client.Serve` settles each delivery by its handler's result, and this system's consumers run one handler at a time (`Workers(1)`, to keep RabbitMQ's order): holding 10k deliveries unacknowledged would take 10k handlers at once, whose hand-off to one consumer would lose the order W4 measures",
			},
			Setup: "contrib/rabbitmq's `Client` (`github.com/warrenmq/warren/contrib/rabbitmq`, on `amqp091-go`) against the `rabbitmq` node: one `rabbitmq.Dial` (its own connection) per producer and per consumer, each with `MaxInFlight(4000)` (`-rabbit-window`, as every 4000 here); queues declared with `Client.DeclareTopology` as `rabbitmq`'s (classic, not durable; transient messages). Each producer publishes with `Client.PublishDeferred` through the default exchange and keeps the confirmations in a window of 4000, waiting for the oldest when it is full (at most 4000 unconfirmed per producer, as `rabbitmq`); Flush waits for every confirmation. Each consumer is `Client.Serve(queue, handler, Workers(1), Prefetch(prefetch))` (`basic.qos`, `basic.consume`): the handler hands its delivery to the workload's `Next` and returns nil, so that Serve acks it (`basic.ack` per message), once the workload acks it. D1 and D3 call `Client.Publish` on the workload's goroutine. S2: the exchange, queues and bindings declared with `Client.DeclareTopology` (the exchange on the publisher's client too, as an application declares what it publishes to), published through `Client.Publish` as above, drained with `Client.Serve`. Queues are deleted at the end with `amqp091-go` (the client has no delete). Allocations and peak RSS are the client process's only",
		},
		Open: func() (System, error) { return newRabbitClient() },
	})
}

// queueDecl declares a queue of rabbitmq's kind: not durable, with queueArgs (classic,
// expiring RabbitQueueExpires after its last use).
func queueDecl(name string) warren.QueueDecl {
	return warren.QueueDecl{Name: name, Arguments: warren.Table(queueArgs())}
}

type rabbitClientSys struct {
	prefix string
	c      *rabbitmq.Client // declares the queues; S2's drain

	mu      sync.Mutex // guards clients and queues
	clients []*rabbitmq.Client
	queues  []string // with their prefix, deleted by Close

	// S2
	topicQueues []string
	topicPub    *clientProducer
}

func newRabbitClient() (*rabbitClientSys, error) {
	s := &rabbitClientSys{prefix: fmt.Sprintf("wbc%d.", os.Getpid())}
	c, err := s.dial()
	if err != nil {
		return nil, fmt.Errorf("%w: cannot connect to %s: %v", ErrSkip, RabbitURL, err)
	}
	s.c = c
	return s, nil
}

// dial makes a Client, closed by the system's Close if not before.
func (s *rabbitClientSys) dial() (*rabbitmq.Client, error) {
	c, err := rabbitmq.Dial(RabbitURL, rabbitmq.MaxInFlight(RabbitConfirmWindow))
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.clients = append(s.clients, c)
	s.mu.Unlock()
	return c, nil
}

func (s *rabbitClientSys) declare(t warren.Topology) error {
	if err := s.c.DeclareTopology(t); err != nil {
		return err
	}
	s.mu.Lock()
	for _, q := range t.Queues {
		s.queues = append(s.queues, q.Name)
	}
	s.mu.Unlock()
	return nil
}

func (s *rabbitClientSys) DeclareQueue(name string, _ Config) error {
	return s.declare(warren.Topology{Queues: []warren.QueueDecl{queueDecl(s.prefix + name)}})
}

func (s *rabbitClientSys) Producer() (Producer, error) { return s.producer(false) }

// SyncProducer is a producer whose Publish is Client.Publish: it waits for its confirm.
func (s *rabbitClientSys) SyncProducer() (Producer, error) { return s.producer(true) }

func (s *rabbitClientSys) producer(each bool) (*clientProducer, error) {
	c, err := s.dial()
	if err != nil {
		return nil, err
	}
	return &clientProducer{c: c, prefix: s.prefix, each: each}, nil
}

func (s *rabbitClientSys) Consumer(name string, prefetch int) (Consumer, error) {
	c, err := s.dial()
	if err != nil {
		return nil, err
	}
	k := &clientConsumer{c: c, in: make(chan warren.Delivery), settled: make(chan uint64, 1), served: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	started := make(chan struct{})
	var once sync.Once // Serve starts its pool again after a reconnect
	go func() {
		defer close(k.served)
		k.err = c.Serve(ctx, s.prefix+name, k.handle, warren.Workers(1), warren.Prefetch(prefetch),
			warren.OnStart(func() { once.Do(func() { close(started) }) }))
	}()
	select {
	case <-started:
		return k, nil
	case <-k.served:
		c.Close()
		if k.err == nil {
			k.err = errClosed
		}
		return nil, k.err
	}
}

// Close closes every client, then deletes the queues (and S2's exchange) with amqp091-go:
// the client has no delete.
func (s *rabbitClientSys) Close() error {
	s.mu.Lock()
	clients, queues := s.clients, s.queues
	s.clients = nil
	s.mu.Unlock()
	var errs []error
	for _, c := range clients {
		errs = append(errs, c.Close())
	}
	conn, err := amqp.DialConfig(RabbitURL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, q := range queues {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
	if s.topicQueues != nil {
		_ = ch.ExchangeDelete(s.prefix+topicExchange, false, false)
	}
	return errors.Join(errs...)
}

// ServerRSS returns the RabbitMQ node's resident set size now.
func (s *rabbitClientSys) ServerRSS() (int64, bool) { return rabbitServerRSS() }

// ---- producer: deferred confirms in a window ----

type clientProducer struct {
	c      *rabbitmq.Client
	prefix string
	each   bool                    // Publish is Client.Publish: it waits for its own confirm
	window []rabbitmq.Confirmation // deferred publishes not yet waited for, oldest first
}

// publish publishes with Client.PublishDeferred and keeps its confirmation, waiting for the
// oldest once RabbitConfirmWindow are kept (the client's MaxInFlight holds the same bound on
// what is unconfirmed); a SyncProducer's waits for each confirm.
func (p *clientProducer) publish(exchange, key string, body []byte) error {
	if p.each {
		return p.c.Publish(context.Background(), exchange, key, warren.Message{Body: body})
	}
	if len(p.window) == RabbitConfirmWindow {
		if err := p.window[0].Wait(); err != nil {
			return err
		}
		p.window = p.window[1:]
	}
	f, err := p.c.PublishDeferred(context.Background(), exchange, key, warren.Message{Body: body})
	if err != nil {
		return err
	}
	p.window = append(p.window, f)
	return nil
}

func (p *clientProducer) Publish(name string, body []byte) error {
	return p.publish("", p.prefix+name, body)
}

// Flush waits for every confirm so far and returns the first failure.
func (p *clientProducer) Flush() error {
	var errs []error
	for _, f := range p.window {
		errs = append(errs, f.Wait())
	}
	p.window = p.window[:0]
	return errors.Join(errs...)
}

func (p *clientProducer) Close() error { return p.c.Close() }

// ---- consumer: Client.Serve's handler, pulled by Next ----

type clientConsumer struct {
	c       *rabbitmq.Client
	in      chan warren.Delivery // the handler → Next
	settled chan uint64          // Ack → the handler: the tag acked (one handler at a time: Workers(1))
	cancel  context.CancelFunc   // ends Serve
	served  chan struct{}        // closed when Serve has returned
	err     error                // Serve's result, written before served is closed
	held    uint64               // the delivery tag Next handed out and not yet acked; 0 for none
}

// handle is Serve's handler: it hands d to Next and returns nil, so that Serve acks d, once the
// workload has acked it. A tag other than d's is an ack that came after its handler gave up
// (its context ended: the connection was lost), and is dropped.
func (k *clientConsumer) handle(ctx context.Context, d warren.Delivery) error {
	select {
	case k.in <- d:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	for {
		select {
		case tag := <-k.settled:
			if tag == d.DeliveryTag {
				return nil
			}
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

func (k *clientConsumer) Next(ctx context.Context) (Delivery, error) {
	select {
	case d := <-k.in:
		k.held = d.DeliveryTag
		return Delivery{Body: d.Message.Body, Redelivered: d.Redelivered, Tag: d.DeliveryTag}, nil
	case <-k.served:
		if k.err != nil {
			return Delivery{}, k.err
		}
		return Delivery{}, errClosed
	case <-ctx.Done():
		return Delivery{}, context.Cause(ctx)
	}
}

func (k *clientConsumer) Ack(d Delivery) error {
	if d.Tag != k.held || k.held == 0 {
		return fmt.Errorf("rabbitmq-client: ack of delivery %d, but the handler holds %d (one at a time)", d.Tag, k.held)
	}
	k.held = 0
	// Room in the buffer, or soon: the earlier tag was taken by its handler, or, if that one
	// gave up, is dropped by the next.
	k.settled <- d.Tag
	return nil
}

// Requeue is not supported: one handler runs at a time, so the workload cannot hold several
// deliveries (W4 is n/a).
func (k *clientConsumer) Requeue([]Delivery) error { return ErrUnsupported }

func (k *clientConsumer) Close() error {
	k.cancel()
	<-k.served
	return k.c.Close()
}

// ---- S2: a topic exchange ----

func (s *rabbitClientSys) SetupTopic(patterns []string, queues int) error {
	x := s.prefix + topicExchange
	s.topicQueues = make([]string, queues)
	for i := range queues {
		s.topicQueues[i] = fmt.Sprintf("%st%d", s.prefix, i)
	}
	// Declarations and bindings are one round trip each: spread them over a few topologies
	// declared at once, each on a channel of its own. Topology w has the queues i ≡ w (mod
	// workers) and their bindings.
	const workers = 8
	tops := make([]warren.Topology, workers)
	for w := range tops {
		tops[w].Exchanges = []warren.ExchangeDecl{{Name: x, Kind: warren.ExchangeTopic}}
	}
	for i, q := range s.topicQueues {
		tops[i%workers].Queues = append(tops[i%workers].Queues, queueDecl(q))
	}
	for i, p := range patterns {
		q := i % queues
		tops[q%workers].Bindings = append(tops[q%workers].Bindings, warren.BindingDecl{Source: x, Destination: s.topicQueues[q], RoutingKey: p})
	}
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w, t := range tops {
		wg.Go(func() { errs[w] = s.declare(t) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	p, err := s.producer(false)
	if err != nil {
		return err
	}
	s.topicPub = p
	// The publisher declares the exchange too, as an application declares its topology on the
	// client it publishes with. Without it the client knows the exchange only once a publish has
	// checked that it exists, and each of the first publishes that run at once opens a channel
	// to check: 4000 of them exhaust the connection's channels (RabbitMQ's 504).
	return p.c.DeclareTopology(warren.Topology{Exchanges: tops[0].Exchanges})
}

func (s *rabbitClientSys) PublishTopic(key string, body []byte) error {
	return s.topicPub.publish(s.prefix+topicExchange, key, body)
}

// FlushTopic waits for every publish to return: a confirmed message has been routed and
// enqueued.
func (s *rabbitClientSys) FlushTopic() error { return s.topicPub.Flush() }

// DrainTopic serves each queue in turn with Client.Serve until it has delivered what was routed
// to it.
func (s *rabbitClientSys) DrainTopic(perBinding []int, queues int) ([][]uint64, error) {
	want := perQueue(perBinding, queues)
	out := make([][]uint64, queues)
	for q := range queues {
		if want[q] == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := s.c.Serve(ctx, s.topicQueues[q], func(_ context.Context, d warren.Delivery) error {
			out[q] = append(out[q], SeqOf(d.Message.Body))
			if len(out[q]) == want[q] {
				cancel() // Serve acks this one, and returns once it has
			}
			return nil
		}, warren.Workers(1), warren.Prefetch(256))
		cancel()
		if err != nil {
			return out, err
		}
		if len(out[q]) < want[q] {
			return out, fmt.Errorf("queue %d: %d of %d messages", q, len(out[q]), want[q])
		}
	}
	return out, nil
}

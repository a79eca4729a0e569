package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/warrenmq/warren"
)

// BlockMaxLength is the MaxLength of warren-block's queues (with the Block overflow policy):
// publishers wait while a queue holds this many ready messages.
var BlockMaxLength = 4096

func init() {
	register(Spec{
		Info: Info{
			Name: "warren", Ordered: true, Acks: true, Backlog: true, Batch: true,
			Setup: "`warren.New()`, queues with default options (unbounded), `Broker.Publish` through the default exchange, `Queue.Consume` with `Prefetch`, `Delivery.Ack` per message, `Consumer.NackUpTo` to requeue",
		},
		Open: func() (System, error) { return newWarren(false), nil },
	})
	register(Spec{
		Info: Info{
			Name: "warren-multiack", Ordered: true, Acks: true, Backlog: true,
			NA: map[string]string{
				"W4": "its acks wait for a batch, and a requeue of held messages would take those acked ones back too",
				"S2": "routing is the same code as `warren`",
			},
			Setup: "as `warren`, but each consumer acknowledges with `Consumer.AckUpTo` once every 64 deliveries (AMQP's multiple ack, as clients batch their acks), not `Delivery.Ack` per message: what settling and dispatching several messages per critical section gives",
		},
		Open: func() (System, error) { s := newWarren(false); s.ackEvery = 64; return s, nil },
	})
	register(Spec{
		Info: Info{
			Name: "warren-block", Ordered: true, Acks: true, Batch: true,
			NA: map[string]string{
				"W3": "a bounded queue holds no 1M backlog: the publisher waits for a consumer (that is the point of Block)",
				"W4": "the 100k backlog exceeds the bound",
				"S1": "a bounded queue holds no deep backlog",
				"S2": "routing is the same code as `warren`; the per-queue backlogs would exceed the bound",
			},
			Setup: "as `warren`, with `MaxLength(4096)` and `Overflow(Block)` on the queue: the publisher waits for room",
		},
		Open: func() (System, error) { return newWarren(true), nil },
	})
}

type warrenSys struct {
	b     *warren.Broker
	block bool
	// ackEvery, when set, makes the consumers ack with Consumer.AckUpTo every ackEvery
	// deliveries instead of one Ack each (warren-multiack).
	ackEvery int
	mu       sync.Mutex
	queues   map[string]*warren.Queue
	topicQ   []*warren.Queue

	// A durable broker (sys_warren_durable.go): durable queues and exchange, persistent
	// messages, its log in dir, which Close removes.
	durable bool
	dir     string
}

func newWarren(block bool) *warrenSys {
	return &warrenSys{b: warren.New(), block: block, queues: map[string]*warren.Queue{}}
}

// queueOptions are the options of every queue the system declares.
func (s *warrenSys) queueOptions() []warren.QueueOption {
	var opts []warren.QueueOption
	if s.block {
		opts = append(opts, warren.MaxLength(BlockMaxLength), warren.Overflow(warren.Block))
	}
	if s.durable {
		opts = append(opts, warren.Durable())
	}
	return opts
}

func (s *warrenSys) DeclareQueue(name string, _ Config) error {
	opts := s.queueOptions()
	q, err := s.b.DeclareQueue(name, opts...)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.queues[name] = q
	s.mu.Unlock()
	return nil
}

// Producer: on a durable broker, a producer that streams with deferred confirms (at most
// AsyncWindow unconfirmed, as JetStream's); in memory, Publish, which is its own confirm.
func (s *warrenSys) Producer() (Producer, error) {
	p := &warrenProducer{b: s.b, persistent: s.durable}
	if s.durable {
		p.window = make([]warren.Confirmation, AsyncWindow)
	}
	return p, nil
}

func (s *warrenSys) Consumer(name string, prefetch int) (Consumer, error) {
	s.mu.Lock()
	q, ok := s.queues[name]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("warren: no queue %q", name)
	}
	c, err := q.Consume(context.Background(), warren.Prefetch(prefetch))
	if err != nil {
		return nil, err
	}
	return &warrenConsumer{c: c, ch: c.Deliveries(), held: make([]warren.Delivery, 2*prefetch), ackEvery: s.ackEvery}, nil
}

func (s *warrenSys) Close() error {
	err := s.b.Close()
	if s.dir != "" {
		err = errors.Join(err, os.RemoveAll(s.dir))
	}
	return err
}

type warrenProducer struct {
	b          *warren.Broker
	persistent bool
	batch      []warren.Publishing // PublishBatch's, reused
	// window, when set, makes Publish deferred: a ring of the last len(window) confirmations,
	// the oldest waited for before its slot is reused.
	window []warren.Confirmation
	next   int
	last   warren.Confirmation
}

func (p *warrenProducer) Publish(name string, body []byte) error {
	msg := warren.Message{Body: body, Persistent: p.persistent}
	if p.window == nil {
		return p.b.Publish(context.Background(), "", name, msg)
	}
	slot := &p.window[p.next]
	p.next = (p.next + 1) % len(p.window)
	if err := slot.Wait(); err != nil {
		return err
	}
	c, err := p.b.PublishDeferred(context.Background(), "", name, msg)
	*slot, p.last = c, c
	return err
}

// PublishBatch is Broker.PublishBatch: on a durable broker, one wait for the log per batch.
func (p *warrenProducer) PublishBatch(name string, bodies [][]byte) error {
	p.batch = p.batch[:0]
	for _, b := range bodies {
		p.batch = append(p.batch, warren.Publishing{Key: name, Message: warren.Message{Body: b, Persistent: p.persistent}})
	}
	return p.b.PublishBatch(context.Background(), p.batch)
}

// Flush waits for the last deferred confirm, which confirms the ones before it.
func (p *warrenProducer) Flush() error { return p.last.Wait() }
func (p *warrenProducer) Close() error { return nil }

type warrenConsumer struct {
	c  *warren.Consumer
	ch <-chan warren.Delivery
	// held keeps the deliveries received, round-robin, for Ack: a Delivery is a value, which
	// Next receives straight into its slot, and the harness's Delivery carries a pointer to
	// the slot rather than a copy in an interface (an allocation per message). Twice the
	// prefetch: the workloads ack in order, so a slot's delivery is settled before it comes
	// round again (Ack checks).
	held []warren.Delivery
	next int
	// ackEvery > 0: Ack acks with AckUpTo every ackEvery calls (unacked counts them), and Close
	// acks what is left.
	ackEvery, unacked int
	last              uint64
}

var errClosed = errors.New("consumer closed")

func (c *warrenConsumer) Next(ctx context.Context) (Delivery, error) {
	d := &c.held[c.next]
	c.next = (c.next + 1) % len(c.held)
	var ok bool
	select {
	case *d, ok = <-c.ch:
	default:
		select {
		case *d, ok = <-c.ch:
		case <-ctx.Done():
			return Delivery{}, context.Cause(ctx)
		}
	}
	if !ok {
		if err := c.c.Err(); err != nil {
			return Delivery{}, err
		}
		return Delivery{}, errClosed
	}
	return Delivery{Body: d.Message.Body, Redelivered: d.Redelivered, Tag: d.DeliveryTag, h: d}, nil
}

func (c *warrenConsumer) Ack(d Delivery) error {
	if c.ackEvery > 0 {
		c.unacked++
		c.last = d.Tag
		if c.unacked < c.ackEvery {
			return nil
		}
		c.unacked = 0
		return c.c.AckUpTo(d.Tag)
	}
	w := d.h.(*warren.Delivery)
	if w.DeliveryTag != d.Tag {
		return fmt.Errorf("warren: delivery %d acked after its slot went to delivery %d (acked out of order by more than the prefetch)", d.Tag, w.DeliveryTag)
	}
	return w.Ack()
}

func (c *warrenConsumer) Requeue(ds []Delivery) error {
	if len(ds) == 0 {
		return nil
	}
	return c.c.NackUpTo(ds[len(ds)-1].Tag)
}

func (c *warrenConsumer) Close() error {
	if c.unacked > 0 {
		if err := c.c.AckUpTo(c.last); err != nil {
			return err
		}
	}
	return c.c.Cancel()
}

// S2: a topic exchange.

const topicExchange = "bench.topic"

func (s *warrenSys) SetupTopic(patterns []string, queues int) error {
	var xopts []warren.ExchangeOption
	if s.durable {
		xopts = append(xopts, warren.Durable())
	}
	if _, err := s.b.DeclareExchange(topicExchange, warren.ExchangeTopic, xopts...); err != nil {
		return err
	}
	s.topicQ = make([]*warren.Queue, queues)
	for i := range queues {
		q, err := s.b.DeclareQueue(fmt.Sprintf("t%d", i), s.queueOptions()...)
		if err != nil {
			return err
		}
		s.topicQ[i] = q
	}
	for i, p := range patterns {
		if err := s.b.Bind(s.topicQ[i%queues].Name(), topicExchange, p, nil); err != nil {
			return err
		}
	}
	return nil
}

func (s *warrenSys) PublishTopic(key string, body []byte) error {
	return s.b.Publish(context.Background(), topicExchange, key, warren.Message{Body: body, Persistent: s.durable})
}

func (s *warrenSys) FlushTopic() error { return nil }

func (s *warrenSys) DrainTopic(perBinding []int, queues int) ([][]uint64, error) {
	out := make([][]uint64, queues)
	for i, q := range s.topicQ {
		for {
			d, err := q.Get(context.Background(), warren.AutoAck())
			if errors.Is(err, warren.ErrEmpty) {
				break
			}
			if err != nil {
				return nil, err
			}
			out[i] = append(out[i], SeqOf(d.Message.Body))
		}
	}
	return out, nil
}

package bench

import (
	"context"
	"fmt"
	"maps"
	"sync"

	"github.com/warrenmq/warren"
)

// The channel baselines: a buffered channel per queue, receive as the acknowledgement.
//
// chan-min sends a small struct holding the body, by value: what a Go developer handing bodies
// from one goroutine to another would write, and so the honest limit, allocation and memory
// included, against which the report's ratios are taken. chan sends a *warren.Message, one
// 208-byte allocation per message on top of the body, as the project's own benchmarks did; it
// is kept as a second column. The two differ only in what their channels carry.

func init() {
	na := map[string]string{
		"W4": "a channel has no acknowledgements, so nothing can be taken unacknowledged and returned",
		"S2": "a channel has no routing",
	}
	register(Spec{
		Info: Info{
			Name: "chan-min", Ordered: true, Backlog: true, NA: na,
			Setup: "a buffered `chan struct{ body []byte }` per queue (24 bytes per slot, no allocation per message beyond the body, whose first 8 bytes carry its sequence number): the honest limit of a handoff in Go; its capacity is the workload's bound: 4096 for W1/W2, the whole backlog for W3/S1 (unbounded there, as warren's default queue); receive is the acknowledgement",
		},
		Open: func() (System, error) { return &chanMinSys{newChanSys[minMsg]("chan-min", false)}, nil },
	})
	// chan-min-unbounded is chan-min without W1/W2's bound, the peer of warren's unbounded
	// queue there: its channel holds every message of the run, so the producer never waits
	// for room. In W3/S1 chan-min already holds the whole backlog, so this would be the same
	// system measured twice.
	naUnbounded := map[string]string{
		"W3": "`chan-min` already holds W3's whole backlog: the same system",
		"S1": "`chan-min` already holds S1's whole backlog: the same system",
	}
	maps.Copy(naUnbounded, na)
	register(Spec{
		Info: Info{
			Name: "chan-min-unbounded", Ordered: true, Backlog: true, NA: naUnbounded,
			Setup: "`chan-min` with a channel sized to every message of the run (at full size W1's and W2's 1M: a 24 MB buffer, made before the timed phase): the producer never waits for room, as with warren's unbounded queue; W1 and W2 only (in W3/S1 `chan-min` is already unbounded)",
		},
		Open: func() (System, error) { return &chanMinSys{newChanSys[minMsg]("chan-min", true)}, nil },
	})
	register(Spec{
		Info: Info{
			Name: "chan", Ordered: true, Backlog: true, NA: na,
			Setup: "a buffered `chan *warren.Message` per queue (one allocation per message, as the project's own baseline); its capacity is the workload's bound: 4096 for W1/W2, the whole backlog for W3/S1; receive is the acknowledgement",
		},
		Open: func() (System, error) { return &chanMsgSys{newChanSys[*warren.Message]("chan", false)}, nil },
	})
}

// chanSys is what the channel baselines share: a channel of T per queue, and how producers
// find it. What goes through the channel, per message, is each baseline's own code.
type chanSys[T any] struct {
	name      string
	mu        sync.Mutex
	queues    map[string]chan T
	unbounded bool // the capacity is every message the workload publishes, not its bound
}

func newChanSys[T any](name string, unbounded bool) *chanSys[T] {
	return &chanSys[T]{name: name, queues: map[string]chan T{}, unbounded: unbounded}
}

func (s *chanSys[T]) DeclareQueue(name string, cfg Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := cfg.Capacity
	if s.unbounded {
		c = max(c, cfg.Messages)
	}
	if c <= 0 {
		c = 4096
	}
	s.queues[name] = make(chan T, c)
	return nil
}

func (s *chanSys[T]) queue(name string) (chan T, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, ok := s.queues[name]
	if !ok {
		return nil, fmt.Errorf("%s: no queue %q", s.name, name)
	}
	return q, nil
}

func (s *chanSys[T]) Close() error { return nil }

// chanSender is a producer's channel: the queue it last published to, looked up again only
// when the queue changes.
type chanSender[T any] struct {
	s    *chanSys[T]
	name string
	ch   chan T
}

// lookup makes the queue name the one p.ch sends to. The baselines' Publish call it only when
// the queue changes, and send on p.ch themselves: a call per message through the generic code
// cost chan-min about 10 % in W1.
func (p *chanSender[T]) lookup(name string) error {
	q, err := p.s.queue(name)
	if err != nil {
		return err
	}
	p.ch, p.name = q, name
	return nil
}

func (p *chanSender[T]) Flush() error { return nil }
func (p *chanSender[T]) Close() error { return nil }

// chanReceiver is a consumer's channel: a receive without a select first, then one with the
// context for the stall watchdog.
type chanReceiver[T any] struct{ ch chan T }

func (c *chanReceiver[T]) receive(ctx context.Context) (T, error) {
	select {
	case m := <-c.ch:
		return m, nil
	default:
	}
	select {
	case m := <-c.ch:
		return m, nil
	case <-ctx.Done():
		var zero T
		return zero, context.Cause(ctx)
	}
}

func (c *chanReceiver[T]) Ack(Delivery) error       { return nil }
func (c *chanReceiver[T]) Requeue([]Delivery) error { return ErrUnsupported }
func (c *chanReceiver[T]) Close() error             { return nil }

// ---- chan-min: the body, by value ----

// minMsg is what goes through chan-min's channel.
type minMsg struct{ body []byte }

type chanMinSys struct{ *chanSys[minMsg] }

func (s *chanMinSys) Producer() (Producer, error) {
	return &chanMinProducer{chanSender[minMsg]{s: s.chanSys}}, nil
}

func (s *chanMinSys) Consumer(name string, _ int) (Consumer, error) {
	q, err := s.queue(name)
	if err != nil {
		return nil, err
	}
	return &chanMinConsumer{chanReceiver[minMsg]{ch: q}}, nil
}

type chanMinProducer struct{ chanSender[minMsg] }

func (p *chanMinProducer) Publish(name string, body []byte) error {
	if p.ch == nil || name != p.name {
		if err := p.lookup(name); err != nil {
			return err
		}
	}
	p.ch <- minMsg{body: body}
	return nil
}

type chanMinConsumer struct{ chanReceiver[minMsg] }

func (c *chanMinConsumer) Next(ctx context.Context) (Delivery, error) {
	m, err := c.receive(ctx)
	return Delivery{Body: m.body}, err
}

// ---- chan: a *warren.Message each ----

type chanMsgSys struct{ *chanSys[*warren.Message] }

func (s *chanMsgSys) Producer() (Producer, error) {
	return &chanMsgProducer{chanSender[*warren.Message]{s: s.chanSys}}, nil
}

func (s *chanMsgSys) Consumer(name string, _ int) (Consumer, error) {
	q, err := s.queue(name)
	if err != nil {
		return nil, err
	}
	return &chanMsgConsumer{chanReceiver[*warren.Message]{ch: q}}, nil
}

type chanMsgProducer struct{ chanSender[*warren.Message] }

func (p *chanMsgProducer) Publish(name string, body []byte) error {
	if p.ch == nil || name != p.name {
		if err := p.lookup(name); err != nil {
			return err
		}
	}
	p.ch <- &warren.Message{Body: body}
	return nil
}

type chanMsgConsumer struct{ chanReceiver[*warren.Message] }

func (c *chanMsgConsumer) Next(ctx context.Context) (Delivery, error) {
	m, err := c.receive(ctx)
	if err != nil {
		return Delivery{}, err
	}
	return Delivery{Body: m.Body}, nil
}

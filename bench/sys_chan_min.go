package bench

import (
	"context"
	"fmt"
	"maps"
	"sync"
)

// The minimal channel baselines. `chan` hands a *warren.Message through its channel, one
// 208-byte allocation per message on top of the body, as the project's own benchmarks did;
// a Go developer handing bodies from one goroutine to another would not allocate that: they
// would send a small struct holding the body by value. chan-min is that, so that a ratio
// against it says what warren costs over the cheapest handoff Go has, allocation and memory
// included.

func init() {
	naMin := map[string]string{
		"W4": "a channel has no acknowledgements, so nothing can be taken unacknowledged and returned",
		"S2": "a channel has no routing",
	}
	register(Spec{
		Info: Info{
			Name: "chan-min", Ordered: true, Backlog: true, NA: naMin,
			Setup: "a buffered `chan struct{ body []byte }` per queue (24 bytes per slot, no allocation per message beyond the body, whose first 8 bytes carry its sequence number): the honest limit of a handoff in Go; its capacity is the workload's bound: 4096 for W1/W2, the whole backlog for W3/S1 (unbounded there, as warren's default queue); receive is the acknowledgement",
		},
		Open: func() (System, error) { return &chanMinSys{queues: map[string]chan minMsg{}}, nil },
	})
	// chan-min-unbounded is chan-min without W1/W2's bound, the peer of warren's unbounded
	// queue there: its channel holds every message of the run, so the producer never waits
	// for room. In W3/S1 chan-min already holds the whole backlog, so this would be the same
	// system measured twice.
	naUnbounded := map[string]string{
		"W3": "`chan-min` already holds W3's whole backlog: the same system",
		"S1": "`chan-min` already holds S1's whole backlog: the same system",
	}
	maps.Copy(naUnbounded, naMin)
	register(Spec{
		Info: Info{
			Name: "chan-min-unbounded", Ordered: true, Backlog: true, NA: naUnbounded,
			Setup: "`chan-min` with a channel sized to every message of the run (at full size W1's and W2's 1M: a 24 MB buffer, made before the timed phase): the producer never waits for room, as with warren's unbounded queue; W1 and W2 only (in W3/S1 `chan-min` is already unbounded)",
		},
		Open: func() (System, error) {
			return &chanMinSys{queues: map[string]chan minMsg{}, unbounded: true}, nil
		},
	})
}

// minMsg is what goes through chan-min's channel: the body, by value.
type minMsg struct{ body []byte }

type chanMinSys struct {
	mu        sync.Mutex
	queues    map[string]chan minMsg
	unbounded bool // the capacity is every message the workload publishes, not its bound
}

func (s *chanMinSys) DeclareQueue(name string, cfg Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := cfg.Capacity
	if s.unbounded {
		c = max(c, cfg.Messages)
	}
	if c <= 0 {
		c = 4096
	}
	s.queues[name] = make(chan minMsg, c)
	return nil
}

func (s *chanMinSys) queue(name string) (chan minMsg, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, ok := s.queues[name]
	if !ok {
		return nil, fmt.Errorf("chan-min: no queue %q", name)
	}
	return q, nil
}

func (s *chanMinSys) Producer() (Producer, error) { return &chanMinProducer{s: s}, nil }

func (s *chanMinSys) Consumer(name string, _ int) (Consumer, error) {
	q, err := s.queue(name)
	if err != nil {
		return nil, err
	}
	return &chanMinConsumer{ch: q}, nil
}

func (s *chanMinSys) Close() error { return nil }

type chanMinProducer struct {
	s    *chanMinSys
	name string
	ch   chan minMsg
}

func (p *chanMinProducer) Publish(name string, body []byte) error {
	if p.ch == nil || name != p.name {
		q, err := p.s.queue(name)
		if err != nil {
			return err
		}
		p.ch, p.name = q, name
	}
	p.ch <- minMsg{body: body}
	return nil
}

func (p *chanMinProducer) Flush() error { return nil }
func (p *chanMinProducer) Close() error { return nil }

// chanMinConsumer receives as chan's consumer does (a receive without a select first, then
// one with the context for the stall watchdog), so that the two baselines differ only in what
// their channels carry.
type chanMinConsumer struct{ ch chan minMsg }

func (c *chanMinConsumer) Next(ctx context.Context) (Delivery, error) {
	select {
	case m := <-c.ch:
		return Delivery{Body: m.body}, nil
	default:
	}
	select {
	case m := <-c.ch:
		return Delivery{Body: m.body}, nil
	case <-ctx.Done():
		return Delivery{}, context.Cause(ctx)
	}
}

func (c *chanMinConsumer) Ack(Delivery) error       { return nil }
func (c *chanMinConsumer) Requeue([]Delivery) error { return ErrUnsupported }
func (c *chanMinConsumer) Close() error             { return nil }

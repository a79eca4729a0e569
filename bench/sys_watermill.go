package bench

import (
	"context"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// WatermillBuffer is the gochannel OutputChannelBuffer: the subscriber channel's capacity,
// the nearest thing gochannel has to a prefetch.
var WatermillBuffer int64 = 256

func init() {
	register(Spec{
		Info: Info{
			Name: "watermill-gochannel", Acks: true, Backlog: true,
			NA: map[string]string{
				"S2": "gochannel topics are exact names: no pattern routing to compare",
			},
			Setup: "`gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 256}, watermill.NopLogger{})` (not persistent, publish does not wait for acks: the defaults); one `Subscribe` per queue, subscribed before publishing because gochannel drops messages published to a topic without subscribers; several consumers read that subscription's channel (gochannel has no consumer groups: each subscription gets every message); `message.NewMessage(\"\", body)` (no UUID generated), `Ack`, and `Nack` to requeue. Publish hands each message to a new goroutine per subscriber, so a backlog is a goroutine per message and delivery order is not promised",
		},
		Open: func() (System, error) { return newWatermill(), nil },
	})
}

type watermillSys struct {
	g      *gochannel.GoChannel
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	subs   map[string]<-chan *message.Message
}

func newWatermill() *watermillSys {
	ctx, cancel := context.WithCancel(context.Background())
	return &watermillSys{
		g:   gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: WatermillBuffer}, watermill.NopLogger{}),
		ctx: ctx, cancel: cancel, subs: map[string]<-chan *message.Message{},
	}
}

func (s *watermillSys) DeclareQueue(name string, _ Config) error {
	ch, err := s.g.Subscribe(s.ctx, name)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.subs[name] = ch
	s.mu.Unlock()
	return nil
}

func (s *watermillSys) Producer() (Producer, error) { return &watermillProducer{g: s.g}, nil }

func (s *watermillSys) Consumer(name string, _ int) (Consumer, error) {
	s.mu.Lock()
	ch, ok := s.subs[name]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("watermill: no queue %q", name)
	}
	return &watermillConsumer{ch: ch}, nil
}

func (s *watermillSys) Close() error {
	s.cancel()
	return s.g.Close()
}

type watermillProducer struct{ g *gochannel.GoChannel }

func (p *watermillProducer) Publish(name string, body []byte) error {
	return p.g.Publish(name, message.NewMessage("", body))
}

func (p *watermillProducer) Flush() error { return nil }
func (p *watermillProducer) Close() error { return nil }

type watermillConsumer struct{ ch <-chan *message.Message }

func (c *watermillConsumer) Next(ctx context.Context) (Delivery, error) {
	select {
	case m, ok := <-c.ch:
		if !ok {
			return Delivery{}, errClosed
		}
		return Delivery{Body: m.Payload, h: m}, nil
	case <-ctx.Done():
		return Delivery{}, context.Cause(ctx)
	}
}

func (c *watermillConsumer) Ack(d Delivery) error {
	d.h.(*message.Message).Ack()
	return nil
}

func (c *watermillConsumer) Requeue(ds []Delivery) error {
	for _, d := range ds {
		d.h.(*message.Message).Nack()
	}
	return nil
}

func (c *watermillConsumer) Close() error { return nil }

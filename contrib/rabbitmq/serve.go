package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
)

// Serve consumes from the queue and runs h on each delivery with warren's pool
// ([warren.ServeSource]): the same [warren.Handler], settled by its result as
// [warren.Queue.Serve] settles it (nil acks, an error requeues, [warren.Permanent] rejects, a
// panic requeues), with the same [warren.Workers], [warren.Prefetch] (basic.qos),
// [warren.ConsumerTag], [warren.ConsumerPriority] ("x-priority"), [warren.Exclusive],
// [warren.GracePeriod], [warren.OnStart] and [warren.Middleware] (typed handlers such as
// [warren.JSONHandler] too); [warren.Backoff] with retry queues (see below). What
// RabbitMQ has no counterpart for fails with [warren.ErrUnsupported]: [warren.Selector], a
// consumer's [warren.AckTimeout] (RabbitMQ's is the queue's "x-consumer-timeout"), and a
// Backoff longer than a retry queue's longest message TTL (2³²−1 ms).
//
// A failure that is to come back after a delay ([warren.Backoff], or a handler's own
// [warren.Delivery.NackWithDelay]) takes RabbitMQ's retry pattern: a copy waits out the delay
// in a retry queue ("<queue>.retry.<ms>", declared by the client, a message TTL dead-lettering
// back to queue) and comes back at the queue's tail, where warren keeps its place; the
// queue's delivery limit, if the client declared the queue, is kept across the copies by the
// client, and the failure that exceeds it rejects the message (dead-lettered with reason
// "rejected", where warren says "delivery_limit"). Retries carry RabbitMQ's x-death entries of
// the retry queues (reason "expired"), which warren's do not.
//
// A delivery's DeliveryCount is RabbitMQ's "x-delivery-count" header, which quorum queues set
// (a classic queue has none, and a redelivered message counts 1), plus the deliveries of the
// copies before it when it is a retry. When the connection drops,
// what the handlers hold cannot be settled any more (their settlement fails, logged at debug
// level): RabbitMQ delivers those messages again, redelivered, and Serve goes on on the next
// connection. It returns nil once ctx ends and its handlers are done, or the error that keeps it
// from consuming (the queue does not exist: [warren.ErrNotFound]; the client closed:
// [warren.ErrClosed]).
func (c *Client) Serve(ctx context.Context, queue string, h warren.Handler, opts ...warren.ServeOption) error {
	s, err := warren.ReadServeOptions(opts...)
	switch {
	case err != nil:
		return err
	case s.Selector:
		return fmt.Errorf("rabbitmq: serve: Selector: RabbitMQ has no selectors: %w", warren.ErrUnsupported)
	case s.AckTimeout > 0:
		return fmt.Errorf("rabbitmq: serve: AckTimeout: RabbitMQ's consumer timeout is the queue's x-consumer-timeout: %w", warren.ErrUnsupported)
	case s.BackoffMax > maxRetryDelay:
		return fmt.Errorf("rabbitmq: serve: Backoff up to %v: a retry queue holds a message for at most %v: %w", s.BackoffMax, maxRetryDelay, warren.ErrUnsupported)
	case h == nil:
		return fmt.Errorf("rabbitmq: serve: nil handler: %w", warren.ErrInvalidArgument)
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil
		}
		conn, err := c.connection(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		src, err := c.consume(conn, queue, s)
		if err != nil {
			if (conn.IsClosed() || errors.Is(err, warren.ErrClosed)) && !c.isClosed() {
				continue // lost meanwhile (amqp091-go says ErrClosed, or EOF): consume on the next connection
			}
			return err
		}
		err = warren.ServeSource(ctx, src, h, opts...)
		src.close()
		switch {
		case ctx.Err() != nil:
			return nil
		case c.isClosed():
			return warren.ErrClosed
		case errors.Is(err, errConnectionLost):
			continue
		}
		return err
	}
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// errConnectionLost ends a consumer whose channel closed under it.
var errConnectionLost = errors.New("rabbitmq: the consumer's channel closed")

// consumer is a RabbitMQ consumer as a [warren.Source]: deliveries made by
// [warren.NewDelivery], settled on its channel.
type consumer struct {
	ch       *amqp.Channel
	tag      string
	out      chan warren.Delivery
	done     chan struct{}
	wg       sync.WaitGroup
	stopOnce sync.Once
	stopped  chan struct{} // closed by Cancel

	c     *Client
	queue string
	limit int64 // the queue's delivery limit as the client declared it; -1 for none

	mu          sync.Mutex
	err         error
	outstanding map[uint64]held // deliveries handed over and not settled, by tag: at most the prefetch
}

// held is a delivery the pool holds, as far as a retry needs it.
type held struct {
	msg        warren.Message
	deliveries int // before this one: its DeliveryCount
}

// consume starts a consumer of queue on a channel of its own on conn.
func (c *Client) consume(conn *amqp.Connection, queue string, s warren.ServeSettings) (*consumer, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, wrap(err, "open a channel")
	}
	if err := ch.Qos(s.Prefetch, 0, false); err != nil {
		ch.Close()
		return nil, wrap(err, "qos")
	}
	var args amqp.Table
	if s.Priority != 0 {
		args = amqp.Table{"x-priority": int32(s.Priority)}
	}
	deliveries, err := ch.Consume(queue, s.Tag, false, s.Exclusive, false, false, args)
	if err != nil {
		ch.Close()
		return nil, wrap(err, "consume from queue %q", queue)
	}
	k := &consumer{ch: ch, tag: s.Tag, out: make(chan warren.Delivery), done: make(chan struct{}),
		stopped: make(chan struct{}), c: c, queue: queue, limit: c.deliveryLimit(queue), outstanding: map[uint64]held{}}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	k.wg.Go(func() { k.forward(deliveries, closed) })
	return k, nil
}

// forward hands RabbitMQ's deliveries to the pool until the channel closes or Cancel.
func (k *consumer) forward(deliveries <-chan amqp.Delivery, closed <-chan *amqp.Error) {
	defer close(k.done)
	defer close(k.out)
	for {
		select {
		case <-k.stopped:
			return
		case <-closed: // the channel is gone, whatever its deliveries say
			k.lost()
			return
		case d, ok := <-deliveries:
			if !ok {
				k.lost()
				return
			}
			desc := delivery(d)
			wd := warren.NewDelivery(desc, k)
			k.mu.Lock()
			k.outstanding[d.DeliveryTag] = held{msg: desc.Message, deliveries: desc.DeliveryCount}
			k.mu.Unlock()
			select {
			case k.out <- wd:
			case <-k.stopped:
				k.Settle(d.DeliveryTag, warren.Requeued, 0) // never handed over
				return
			}
		}
	}
}

// lost records that the consumer's channel closed under it, unless Cancel came first.
func (k *consumer) lost() {
	k.mu.Lock()
	defer k.mu.Unlock()
	select {
	case <-k.stopped:
	default:
		k.err = errConnectionLost
	}
}

// delivery returns the description of a RabbitMQ delivery as warren's.
func delivery(d amqp.Delivery) warren.Delivery {
	headers := warren.Table(d.Headers)
	count := 0
	if n, ok := headers.Int("x-delivery-count"); ok {
		count = int(n)
	} else if d.Redelivered {
		count = 1
	}
	redelivered := d.Redelivered
	if n, ok := headers.Int(retriesHeader); ok && n > 0 {
		count += int(n)
		redelivered = true // its message was delivered before, as a copy
	}
	return warren.Delivery{Message: message(d), Exchange: d.Exchange, RoutingKey: d.RoutingKey, Redelivered: redelivered,
		DeliveryCount: count, DeliveryTag: d.DeliveryTag, ConsumerTag: d.ConsumerTag}
}

func (k *consumer) Deliveries() <-chan warren.Delivery { return k.out }
func (k *consumer) Done() <-chan struct{}              { return k.done }

func (k *consumer) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// Cancel stops the deliveries; what RabbitMQ sent and the pool did not take goes back.
func (k *consumer) Cancel() error {
	k.stopOnce.Do(func() { close(k.stopped) })
	return nil
}

// close ends the consumer: its channel closes, and RabbitMQ requeues what is unacked.
func (k *consumer) close() {
	k.Cancel()
	k.ch.Close()
	k.wg.Wait()
}

// Settle settles a delivery on the consumer's channel, once.
func (k *consumer) Settle(tag uint64, o warren.Outcome, delay time.Duration) error {
	k.mu.Lock()
	h, ok := k.outstanding[tag]
	if !ok {
		k.mu.Unlock()
		return fmt.Errorf("rabbitmq: settle delivery %d: %w", tag, warren.ErrAlreadySettled)
	}
	delete(k.outstanding, tag)
	k.mu.Unlock()
	var err error
	switch {
	case o == warren.Requeued && delay > 0:
		return k.retry(tag, h, delay)
	case o == warren.Acked:
		err = k.ch.Ack(tag, false)
	case o == warren.Requeued:
		err = k.ch.Nack(tag, false, true)
	default:
		err = k.ch.Reject(tag, false)
	}
	if err != nil {
		return wrap(err, "settle delivery %d", tag)
	}
	return nil
}

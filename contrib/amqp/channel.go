package amqp

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/contrib/amqp/internal/wire"
)

// errHeldBack is write's error for a delivery it did not write: its consumer stopped, or its
// channel ended, while it waited for room under the channel's global prefetch.
var errHeldBack = errors.New("amqp: delivery held back")

// releaseTimeout bounds how long closing a channel waits for what it held to be back in the
// queues before it sends close-ok anyway.
const releaseTimeout = 30 * time.Second

// channel is one AMQP channel: a warren owner derived from its connection's. The reader
// goroutine runs its methods; its consumers' goroutines write its deliveries. mu guards the
// delivery tags and the consumers, which both use.
type channel struct {
	c      *conn
	id     uint16
	ctx    context.Context
	cancel context.CancelFunc
	as     warren.CallOption // on the channel's behalf

	// The reader's alone.
	closing    bool          // channel.close sent: waiting for close-ok, dropping the rest
	lastQueue  string        // the last queue declared, which "" names in later methods
	prefetch   int           // basic.qos prefetch-count for the consumers to come; 0 for none
	confirming bool          // confirm.select
	published  uint64        // publishes since confirm.select: the last one's confirm tag
	ack        wire.BasicAck // the last confirm, kept here rather than allocated each time
	nack       wire.BasicNack
	pending    *wire.BasicPublish // the publish whose content is awaited: &pub, or nil
	pub        wire.BasicPublish  // a copy: the connection's reader reuses the one it read
	header     wire.ContentHeader // of pending, when hasHeader
	hasHeader  bool
	body       []byte

	mu        sync.Mutex
	nextTag   uint64
	unacked   unacked
	consumers map[string]*consumer
	// global is the channel's basic.qos prefetch-count with global=true: how many deliveries
	// its consumers together may have unacked (0: no limit); room is signalled when they have
	// fewer, or when a consumer waiting for room must stop waiting.
	global int
	room   sync.Cond
	wg     sync.WaitGroup // the consumers' goroutines
}

// consumer is a basic.consume: warren's consumer and the goroutine that writes its deliveries.
type consumer struct {
	tag       string
	k         *warren.Consumer
	noAck     bool
	cancelled atomic.Bool       // by the client: no basic.cancel goes back
	done      chan struct{}     // closed when its goroutine has written its last delivery
	deliver   wire.BasicDeliver // the one being written, kept rather than allocated each time
}

func newChannel(c *conn, id uint16) *channel {
	ch := &channel{c: c, id: id, consumers: map[string]*consumer{}}
	ch.room.L = &ch.mu
	ch.ctx, ch.cancel = warren.NewOwner(c.ctx)
	ch.as = warren.As(ch.ctx)
	return ch
}

// method runs m. A soft error closes the channel (channel.close); a hard one is returned, to
// close the connection.
func (ch *channel) method(m wire.Method) error {
	if ch.closing {
		switch m.(type) {
		case *wire.ChannelCloseOk:
			delete(ch.c.channels, ch.id)
		case *wire.ChannelClose:
			ch.c.sendMethod(ch.id, &wire.ChannelCloseOk{})
		}
		return nil // dropped, as RabbitMQ drops what comes after its channel.close
	}
	if ch.pending != nil {
		return exception(wire.UnexpectedFrame, m, "expected content header for %s, got %s", ch.pending.Name(), m.Name())
	}
	err := ch.run(m)
	if err == nil {
		return nil
	}
	e := failure(m, err)
	if e.closesConnection {
		return e
	}
	ch.closeWith(e)
	return nil
}

// closeWith closes the channel for a soft error: what it holds goes back, and channel.close
// is sent; the channel is gone once the client's close-ok comes.
func (ch *channel) closeWith(e *amqpError) {
	ch.closing = true
	ch.pending, ch.hasHeader, ch.body = nil, false, nil
	ch.release()
	ch.c.sendMethod(ch.id, &wire.ChannelClose{ReplyCode: e.code, ReplyText: e.text, ClassID: e.class, MethodID: e.method})
}

// release ends the channel's owner and waits until what it held is back in the queues.
func (ch *channel) release() {
	ch.c.flush() // the replies so far, before the wait
	ch.end()
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	ch.c.b.WaitReleased(ctx, ch.ctx)
}

// end ends the channel's owner (its consumers stop; what they and its gets hold goes back)
// and waits for its consumers' goroutines.
func (ch *channel) end() {
	ch.cancel()
	ch.wakeWaiters()
	ch.wg.Wait()
}

// wakeWaiters wakes the consumers waiting for room under the channel's global prefetch, to
// look again.
func (ch *channel) wakeWaiters() {
	ch.mu.Lock()
	ch.room.Broadcast()
	ch.mu.Unlock()
}

func (ch *channel) run(m wire.Method) error {
	b, as := ch.c.b, ch.as
	switch m := m.(type) {
	case *wire.ChannelClose:
		ch.release()
		delete(ch.c.channels, ch.id)
		return ch.c.sendMethod(ch.id, &wire.ChannelCloseOk{})
	case *wire.ChannelCloseOk:
		return nil // a close-ok for a close the server did not send: RabbitMQ ignores it too
	case *wire.ChannelFlow:
		return exception(wire.NotImplemented, m, "active=%t", m.Active)

	case *wire.ExchangeDeclare:
		if m.Passive {
			_, err := b.Exchange(m.Exchange)
			return ch.reply(err, m.NoWait, &wire.ExchangeDeclareOk{})
		}
		opts := []warren.ExchangeOption{}
		if m.Durable {
			opts = append(opts, warren.Durable())
		}
		if m.AutoDelete {
			opts = append(opts, warren.AutoDelete())
		}
		if m.Internal {
			opts = append(opts, warren.Internal())
		}
		if len(m.Arguments) > 0 {
			opts = append(opts, warren.Arguments(m.Arguments))
		}
		_, err := b.DeclareExchange(m.Exchange, m.Type, opts...)
		return ch.reply(err, m.NoWait, &wire.ExchangeDeclareOk{})
	case *wire.ExchangeDelete:
		var opts []warren.CallOption
		if m.IfUnused {
			opts = append(opts, warren.IfUnused())
		}
		err := b.DeleteExchange(m.Exchange, opts...)
		if errors.Is(err, warren.ErrNotFound) {
			err = nil // deleting what does not exist succeeds, as in RabbitMQ
		}
		return ch.reply(err, m.NoWait, &wire.ExchangeDeleteOk{})
	case *wire.ExchangeBind:
		return ch.reply(b.BindExchange(m.Destination, m.Source, m.RoutingKey, m.Arguments), m.NoWait, &wire.ExchangeBindOk{})
	case *wire.ExchangeUnbind:
		return ch.reply(b.UnbindExchange(m.Destination, m.Source, m.RoutingKey, m.Arguments), m.NoWait, &wire.ExchangeUnbindOk{})

	case *wire.QueueDeclare:
		return ch.declareQueue(m)
	case *wire.QueueBind:
		return ch.reply(b.Bind(ch.queueName(m.Queue), m.Exchange, m.RoutingKey, m.Arguments, as), m.NoWait, &wire.QueueBindOk{})
	case *wire.QueueUnbind:
		return ch.reply(b.Unbind(ch.queueName(m.Queue), m.Exchange, m.RoutingKey, m.Arguments, as), false, &wire.QueueUnbindOk{})
	case *wire.QueuePurge:
		n, err := b.Purge(ch.queueName(m.Queue), as)
		return ch.reply(err, m.NoWait, &wire.QueuePurgeOk{MessageCount: uint32(n)})
	case *wire.QueueDelete:
		opts := []warren.CallOption{as}
		if m.IfUnused {
			opts = append(opts, warren.IfUnused())
		}
		if m.IfEmpty {
			opts = append(opts, warren.IfEmpty())
		}
		n, err := b.DeleteQueue(ch.queueName(m.Queue), opts...)
		return ch.reply(err, m.NoWait, &wire.QueueDeleteOk{MessageCount: uint32(n)})

	case *wire.BasicQos:
		switch {
		case m.PrefetchSize != 0:
			return exception(wire.NotImplemented, m, "prefetch_size!=0 (%d)", m.PrefetchSize)
		case m.Global:
			// The channel's limit, which applies at once, to the consumers it has too.
			ch.mu.Lock()
			ch.global = int(m.PrefetchCount)
			ch.room.Broadcast()
			ch.mu.Unlock()
		default:
			ch.prefetch = int(m.PrefetchCount) // for the consumers to come
		}
		return ch.c.sendMethod(ch.id, &wire.BasicQosOk{})
	case *wire.BasicConsume:
		return ch.consume(m)
	case *wire.BasicCancel:
		ch.stopConsumer(m.ConsumerTag)
		if m.NoWait {
			return nil
		}
		return ch.c.sendMethod(ch.id, &wire.BasicCancelOk{ConsumerTag: m.ConsumerTag})
	case *wire.BasicGet:
		return ch.get(m)
	case *wire.BasicPublish:
		if m.Immediate {
			return exception(wire.NotImplemented, m, "immediate=true")
		}
		ch.pub = *m
		ch.pending = &ch.pub
		return nil
	case *wire.BasicAck:
		return ch.settle(m, m.DeliveryTag, m.Multiple, warren.Delivery.Ack)
	case *wire.BasicNack:
		if m.Requeue {
			return ch.settle(m, m.DeliveryTag, m.Multiple, warren.Delivery.Nack)
		}
		return ch.settle(m, m.DeliveryTag, m.Multiple, warren.Delivery.Reject)
	case *wire.BasicReject:
		if m.Requeue {
			return ch.settle(m, m.DeliveryTag, false, warren.Delivery.Nack)
		}
		return ch.settle(m, m.DeliveryTag, false, warren.Delivery.Reject)
	case *wire.BasicRecover:
		if !m.Requeue {
			return exception(wire.NotImplemented, m, "requeue=false")
		}
		if err := ch.settle(m, 0, true, warren.Delivery.Nack); err != nil {
			return err
		}
		return ch.c.sendMethod(ch.id, &wire.BasicRecoverOk{})
	case *wire.BasicRecoverAsync:
		return exception(wire.NotImplemented, m, "basic.recover-async")

	case *wire.ConfirmSelect:
		ch.confirming = true
		if m.Nowait {
			return nil
		}
		return ch.c.sendMethod(ch.id, &wire.ConfirmSelectOk{})
	case *wire.TxSelect, *wire.TxCommit, *wire.TxRollback:
		return exception(wire.NotImplemented, m, "transactions are not implemented")
	}
	return exception(wire.CommandInvalid, m, "%s is not a method a client sends", m.Name())
}

// reply sends ok unless err or noWait.
func (ch *channel) reply(err error, noWait bool, ok wire.Method) error {
	if err != nil || noWait {
		return err
	}
	return ch.c.reply(ch.id, ok)
}

// queueName returns name, or the channel's last declared queue for "".
func (ch *channel) queueName(name string) string {
	if name == "" {
		return ch.lastQueue
	}
	return name
}

func (ch *channel) declareQueue(m *wire.QueueDeclare) error {
	b := ch.c.b
	var (
		q   *warren.Queue
		err error
	)
	if m.Passive {
		q, err = b.Queue(ch.queueName(m.Queue), ch.as)
	} else {
		opts := []warren.QueueOption{}
		if m.Durable {
			opts = append(opts, warren.Durable())
		}
		if m.AutoDelete {
			opts = append(opts, warren.AutoDelete())
		}
		if m.Exclusive {
			opts = append(opts, warren.ExclusiveTo(ch.c.ctx))
		}
		if len(m.Arguments) > 0 {
			opts = append(opts, warren.Arguments(m.Arguments))
		}
		q, err = b.DeclareQueue(m.Queue, opts...)
	}
	if err != nil {
		return err
	}
	ch.lastQueue = q.Name()
	return ch.reply(nil, m.NoWait, &wire.QueueDeclareOk{Queue: q.Name(), MessageCount: uint32(q.Len()), ConsumerCount: uint32(q.ConsumerCount())})
}

func (ch *channel) consume(m *wire.BasicConsume) error {
	q, err := ch.c.b.Queue(ch.queueName(m.Queue), ch.as)
	if err != nil {
		return err
	}
	ch.mu.Lock()
	_, taken := ch.consumers[m.ConsumerTag]
	ch.mu.Unlock()
	if taken && m.ConsumerTag != "" {
		return exception(wire.NotAllowed, m, "attempt to reuse consumer tag '%s'", m.ConsumerTag)
	}
	prefetch := ch.prefetch // 0: unlimited, as warren's Prefetch(0)
	ch.mu.Lock()
	if ch.global > 0 && !m.NoAck && (prefetch == 0 || prefetch > ch.global) {
		// What the consumer buffers beyond what the channel lets it send waits out of other
		// consumers' reach: no more than the channel's limit.
		prefetch = ch.global
	}
	ch.mu.Unlock()
	opts := []warren.ConsumeOption{warren.Prefetch(prefetch)}
	if m.ConsumerTag != "" {
		opts = append(opts, warren.ConsumerTag(m.ConsumerTag))
	}
	if m.Exclusive {
		opts = append(opts, warren.Exclusive())
	}
	if m.NoAck {
		opts = append(opts, warren.AutoAck())
	}
	if p, ok := m.Arguments["x-priority"]; ok {
		n, ok := m.Arguments.Int("x-priority")
		if !ok {
			return exception(wire.PreconditionFailed, m, "invalid arg 'x-priority' for queue '%s': %v", q.Name(), p)
		}
		opts = append(opts, warren.ConsumerPriority(int(n)))
	}
	k, err := q.Consume(ch.ctx, opts...)
	if err != nil {
		return err
	}
	cs := &consumer{tag: k.Tag(), k: k, noAck: m.NoAck, done: make(chan struct{})}
	ch.mu.Lock()
	ch.consumers[cs.tag] = cs
	ch.mu.Unlock()
	if !m.NoWait {
		if err := ch.c.sendMethod(ch.id, &wire.BasicConsumeOk{ConsumerTag: cs.tag}); err != nil {
			return err
		}
	}
	ch.wg.Go(func() { ch.deliver(cs) })
	return nil
}

// deliver writes a consumer's deliveries until it stops. A consumer stopped by something else
// than the client (its queue deleted) is cancelled for the client with basic.cancel
// (consumer_cancel_notify).
func (ch *channel) deliver(cs *consumer) {
	defer close(cs.done)
	for d := range cs.k.Deliveries() {
		// Flushed when no other delivery waits: a burst goes out in few writes.
		err := ch.write(cs, d, cs.noAck, 0, len(cs.k.Deliveries()) == 0)
		if errors.Is(err, errHeldBack) && cs.cancelled.Load() && ch.ctx.Err() == nil {
			// Cancelled while waiting for room: the delivery goes back to its place (marked
			// redelivered, as warren marks whatever a consumer received).
			d.Nack()
			continue
		}
		if err != nil {
			return // the connection or the channel ends: its end returns what is held
		}
	}
	ch.c.flush() // what the last one left, if Cancel took the rest back
	ch.mu.Lock()
	delete(ch.consumers, cs.tag)
	ch.mu.Unlock()
	if !cs.cancelled.Load() && ch.ctx.Err() == nil {
		ch.c.sendMethod(ch.id, &wire.BasicCancel{ConsumerTag: cs.tag, NoWait: true})
	}
}

// write gives d the channel's next delivery tag, keeps it unless it is settled already (no-ack),
// and writes basic.deliver for consumer cs, or basic.get-ok with messageCount when cs is nil
// (from the reader), with the content.
func (ch *channel) write(cs *consumer, d warren.Delivery, settled bool, messageCount uint32, flush bool) error {
	limited := cs != nil && !settled // a no-ack consumer's and basic.get's deliveries are not
	ch.mu.Lock()
	if limited && ch.global > 0 && ch.unacked.limited >= ch.global {
		ch.mu.Unlock()
		ch.c.flush() // what was written, which the client must see to ack: not under mu
		ch.mu.Lock()
		for ch.global > 0 && ch.unacked.limited >= ch.global {
			if cs.cancelled.Load() || ch.ctx.Err() != nil {
				ch.mu.Unlock()
				return errHeldBack
			}
			ch.room.Wait()
		}
	}
	ch.nextTag++
	tag := ch.nextTag
	if !settled {
		ch.unacked.add(tag, d, limited)
	}
	ch.mu.Unlock()
	props := properties(&d.Message)
	var m wire.Method
	if cs == nil {
		m = &wire.BasicGetOk{DeliveryTag: tag, Redelivered: d.Redelivered, Exchange: d.Exchange, RoutingKey: d.RoutingKey, MessageCount: messageCount}
	} else {
		cs.deliver = wire.BasicDeliver{ConsumerTag: cs.tag, DeliveryTag: tag, Redelivered: d.Redelivered, Exchange: d.Exchange, RoutingKey: d.RoutingKey}
		m = &cs.deliver
	}
	return ch.c.write(func(w *wire.Writer) {
		w.MethodFrame(ch.id, m)
		w.ContentFrames(ch.id, &props, d.Message.Body, ch.c.frameMax)
	}, flush)
}

// stopConsumer cancels the consumer with tag, if the channel has it: no more deliveries; what
// it delivered stays unacked on the channel, as AMQP says. It returns once the consumer's last
// delivery is written and its tag is free, so that cancel-ok comes after both.
func (ch *channel) stopConsumer(tag string) {
	ch.mu.Lock()
	cs := ch.consumers[tag]
	ch.mu.Unlock()
	if cs == nil {
		return
	}
	cs.cancelled.Store(true)
	ch.wakeWaiters()
	cs.k.Cancel()
	<-cs.done
}

func (ch *channel) get(m *wire.BasicGet) error {
	q, err := ch.c.b.Queue(ch.queueName(m.Queue), ch.as)
	if err != nil {
		return err
	}
	var opts []warren.ConsumeOption
	if m.NoAck {
		opts = append(opts, warren.AutoAck())
	}
	d, err := q.Get(ch.ctx, opts...)
	if errors.Is(err, warren.ErrEmpty) {
		return ch.c.sendMethod(ch.id, &wire.BasicGetEmpty{})
	}
	if err != nil {
		return err
	}
	count := uint32(q.Len())
	return ch.write(nil, d, m.NoAck, count, true)
}

// settle settles the delivery with tag, or with multiple every one up to tag (0: all), in tag
// order. A tag the channel does not hold closes it with PRECONDITION_FAILED, as RabbitMQ's
// "unknown delivery tag".
func (ch *channel) settle(m wire.Method, tag uint64, multiple bool, how func(warren.Delivery) error) error {
	if !multiple { // the common case, without the slices
		ch.mu.Lock()
		d, ok := ch.unacked.take(tag)
		ch.roomLocked()
		ch.mu.Unlock()
		if !ok {
			return exception(wire.PreconditionFailed, m, "unknown delivery tag %d", tag)
		}
		return settled(m, tag, how(d))
	}
	ch.mu.Lock()
	ds, tags := ch.unacked.takeUpTo(tag, nil, nil)
	ch.roomLocked()
	ch.mu.Unlock()
	if len(tags) == 0 && tag != 0 {
		return exception(wire.PreconditionFailed, m, "unknown delivery tag %d", tag)
	}
	for i, d := range ds {
		if err := settled(m, tags[i], how(d)); err != nil {
			return err
		}
	}
	return nil
}

// roomLocked wakes the consumers waiting for room under the channel's global prefetch, if
// there is room now.
func (ch *channel) roomLocked() {
	if ch.global > 0 && ch.unacked.limited < ch.global {
		ch.room.Broadcast()
	}
}

// settled returns the channel error for a settlement's error: a delivery that warren no
// longer has outstanding is, for the client, an unknown delivery tag.
func settled(m wire.Method, tag uint64, err error) error {
	if err != nil && !errors.Is(err, warren.ErrAlreadySettled) {
		return exception(wire.PreconditionFailed, m, "unknown delivery tag %d: %v", tag, err)
	}
	return nil
}

// content takes a content header or body frame of the publish under way.
func (ch *channel) content(f wire.Frame) error {
	if ch.closing {
		return nil
	}
	if ch.pending == nil {
		return exception(wire.UnexpectedFrame, nil, "content frame on channel %d with no publish under way", ch.id)
	}
	if f.Type == wire.FrameHeader {
		if ch.hasHeader {
			return exception(wire.UnexpectedFrame, ch.pending, "a second content header")
		}
		h, err := ch.c.methods.ContentHeader(f.Payload)
		if err != nil {
			return exception(wire.FrameError, ch.pending, "%v", err)
		}
		if h.Class != 60 {
			return exception(wire.FrameError, ch.pending, "content header of class %d", h.Class)
		}
		if h.BodySize > ch.c.s.cfg.maxMessageSize {
			ch.closeWith(exception(wire.PreconditionFailed, ch.pending, "message size %d is larger than configured max size %d",
				h.BodySize, ch.c.s.cfg.maxMessageSize))
			return nil
		}
		ch.header, ch.hasHeader = h, true
		ch.body = make([]byte, 0, h.BodySize)
	} else {
		if !ch.hasHeader {
			return exception(wire.UnexpectedFrame, ch.pending, "content body before its header")
		}
		if uint64(len(ch.body)+len(f.Payload)) > ch.header.BodySize {
			return exception(wire.FrameError, ch.pending, "content body larger than its header's %d bytes", ch.header.BodySize)
		}
		ch.body = append(ch.body, f.Payload...)
	}
	if uint64(len(ch.body)) < ch.header.BodySize {
		return nil
	}
	pub, body := ch.pending, ch.body
	ch.pending, ch.hasHeader, ch.body = nil, false, nil
	if err := ch.publish(pub, &ch.header.Properties, body); err != nil {
		e := failure(pub, err)
		if e.closesConnection {
			return e
		}
		ch.closeWith(e)
	}
	return nil
}

// publish publishes a message whose content has come, and confirms it when the channel is in
// confirm mode: basic.ack, after a basic.return for a mandatory message that reached no queue;
// basic.nack when a queue refused it (reject-publish).
func (ch *channel) publish(m *wire.BasicPublish, props *wire.BasicProperties, body []byte) error {
	if props.UserID != "" && props.UserID != ch.c.user {
		return exception(wire.PreconditionFailed, m, "user_id property set to '%s' but authenticated user was '%s'", props.UserID, ch.c.user)
	}
	msg := message(props, body)
	opts := ch.c.publishOpts[:1]
	if m.Mandatory {
		opts = ch.c.publishOpts[:2]
	}
	err := ch.c.b.Publish(ch.ctx, m.Exchange, m.RoutingKey, msg, opts...)
	var confirm wire.Method
	if ch.confirming {
		ch.published++
		ch.ack = wire.BasicAck{DeliveryTag: ch.published}
		confirm = &ch.ack
	}
	switch {
	case err == nil:
	case errors.Is(err, warren.ErrUnroutable):
		ret := &wire.BasicReturn{ReplyCode: wire.NoRoute, ReplyText: "NO_ROUTE", Exchange: m.Exchange, RoutingKey: m.RoutingKey}
		if err := ch.c.send(func(w *wire.Writer) {
			w.MethodFrame(ch.id, ret)
			w.ContentFrames(ch.id, props, body, ch.c.frameMax)
		}); err != nil {
			return err
		}
	case errors.Is(err, warren.ErrQueueFull):
		if confirm != nil {
			ch.nack = wire.BasicNack{DeliveryTag: ch.published}
			confirm = &ch.nack
		}
	case errors.Is(err, warren.ErrNotFound):
		return exception(wire.NotFound, m, "no exchange '%s' in vhost '%s'", m.Exchange, ch.c.vhost)
	default:
		return err
	}
	if confirm == nil {
		return nil
	}
	return ch.c.reply(ch.id, confirm)
}

// message returns a publish's content as warren's message.
func message(p *wire.BasicProperties, body []byte) warren.Message {
	return warren.Message{Body: body, Headers: p.Headers, ContentType: p.ContentType, ContentEncoding: p.ContentEncoding,
		Persistent: p.DeliveryMode == 2, Priority: p.Priority, CorrelationID: p.CorrelationID, ReplyTo: p.ReplyTo,
		Expiration: p.Expiration, MessageID: p.MessageID, Timestamp: p.Timestamp, Type: p.Type, UserID: p.UserID, AppID: p.AppID}
}

// properties returns a message's properties for a content header.
func properties(m *warren.Message) wire.BasicProperties {
	p := wire.BasicProperties{Headers: m.Headers, ContentType: m.ContentType, ContentEncoding: m.ContentEncoding,
		Priority: m.Priority, CorrelationID: m.CorrelationID, ReplyTo: m.ReplyTo, Expiration: m.Expiration,
		MessageID: m.MessageID, Timestamp: m.Timestamp, Type: m.Type, UserID: m.UserID, AppID: m.AppID}
	if m.Persistent {
		p.DeliveryMode = 2
	} else {
		p.DeliveryMode = 1
	}
	return p
}

package warren

import (
	"cmp"
	"context"
	"crypto/rand"
	"slices"
	"sort"
	"time"
)

// Consumer is a subscription to one [Queue]: AMQP's basic.consume. It receives deliveries on
// [Consumer.Deliveries] while it has credit: at most its prefetch count of deliveries are
// outstanding (buffered or received, and not yet settled) at once.
//
// A consumer stops and ends in these ways, mirroring AMQP's channel:
//   - [Consumer.Cancel] stops new deliveries, puts deliveries that were buffered but never
//     received back in their places unchanged, and closes Deliveries. Deliveries already
//     received stay settle-able until the consumer's context ends.
//   - The context given to [Queue.Consume] ends, or [Consumer.Close] is called: the consumer
//     stops as with Cancel, and every delivery still outstanding returns to its original
//     position in the queue, redelivered.
//   - Its [AckTimeout] passes: as when its context ends, with [ErrAckTimeout].
//   - The queue is deleted or the broker closes: Deliveries is closed and [Consumer.Err] says why.
//
// [Consumer.Done] is closed once it has ended: stopped, and holding nothing.
//
// Create one with [Queue.Consume]; the zero Consumer is not usable. A Consumer is safe for
// concurrent use.
type Consumer struct {
	q          *Queue
	tag        string
	prefetch   int
	autoAck    bool
	exclusive  bool
	priority   int
	selector   func(*Message) bool
	ackTimeout time.Duration  // 0 for none
	ch         chan *Delivery // capacity = prefetch; push consumers: sent to and closed under q.mu
	done       chan struct{}  // closed when the consumer has stopped and its messages are back (see Done)

	// AutoAck consumers only: their feeder goroutine pulls from the queue and sends to ch. When
	// halt is closed it puts back what it holds, closes ch and then done, and exits.
	wake chan struct{} // capacity 1; a signal that messages may be ready
	halt chan struct{} // closed when the consumer stops

	// owner is the context given to Consume. It is the consumer's owner, AMQP's channel: kept
	// to tell, when some context of the queue's ends, whether it was this one, and why.
	owner context.Context
	// as is the context on whose behalf the consumer was started, when that is not owner: the
	// context given to Serve, whose consumer outlives it by the drain. Nil otherwise.
	as context.Context

	// Guarded by q.mu.
	stopCtx func() bool     // stops watching owner
	unacked ring[*Delivery] // outstanding deliveries in tag order, with settled holes
	live    int             // outstanding deliveries in unacked, received or still buffered
	nextTag uint64          // last delivery tag issued
	waiting bool            // the feeder is waiting for wake
	idle    bool            // the feeder is parked holding nothing (waiting, or woken and not yet run)
	handoff entry           // when handing: a message given to the idle feeder (dispatch.go)
	handing bool
	sending bool     // the feeder is sending a delivery into ch, outside q.mu
	served  bool     // started by Serve: what it holds, its handlers are working on (idle.go)
	active  bool     // in q.consumers or q.feeders: receiving (not waiting its turn, not stopped)
	cursor  []uint64 // selector: per rank, every ready key below it was rejected (dispatch.go)
	turn    uint64   // general dispatch: when it last received, for round-robin
	missed  uint64   // general dispatch: the pass in which it last found nothing to take
	stopped bool     // no more deliveries; ch closed (or being closed by the feeder)
	ended   bool     // nothing outstanding remains; the context is no longer watched
	err     error    // why the consumer stopped; nil while active
}

// Consume starts a consumer on the queue. Deliveries arrive on [Consumer.Deliveries] in queue
// order, round-robin among the queue's consumers. ctx owns the consumer and every delivery it
// has not settled: when ctx ends, they return to their original positions, redelivered.
//
// Consume does not block. It fails with ctx.Err() if ctx is already done, with an error wrapping
// [ErrInvalidArgument] for a bad option, and with one wrapping [ErrPreconditionFailed] if the
// consumer tag is already in use on this queue.
func (q *Queue) Consume(ctx context.Context, opts ...ConsumeOption) (*Consumer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cfg := defaultConsumeConfig()
	for _, o := range opts {
		if o != nil {
			o.applyConsume(&cfg)
		}
	}
	return q.consume(ctx, cfg)
}

// consume starts a consumer configured by cfg.
func (q *Queue) consume(ctx context.Context, cfg consumeConfig) (*Consumer, error) {
	if cfg.err != nil {
		return nil, cfg.err
	}
	if cfg.autoAck && cfg.ackTimeout > 0 {
		return nil, errorf("consume: an ack timeout needs manual acknowledgement: %w", ErrInvalidArgument)
	}
	if cfg.prefetch < 1 || cfg.prefetch > maxPrefetch {
		return nil, errorf("consume: prefetch %d not in [1, %d]: %w", cfg.prefetch, maxPrefetch, ErrInvalidArgument)
	}
	if len(cfg.tag) > maxNameLen {
		return nil, errorf("consume: consumer tag longer than %d bytes: %w", maxNameLen, ErrInvalidArgument)
	}
	c := &Consumer{
		q:         q,
		tag:       cfg.tag,
		prefetch:  cfg.prefetch,
		autoAck:   cfg.autoAck,
		exclusive: cfg.exclusive,
		priority:  cfg.priority,
		selector:  cfg.selector,
		owner:     ctx,
		as:        cfg.owner,
		served:    cfg.served,
		ch:        make(chan *Delivery, bufferSize(cfg)),
		done:      make(chan struct{}),
	}
	if c.selector != nil {
		c.cursor = make([]uint64, q.cfg.levels())
		for rank := range c.cursor {
			c.cursor[rank] = uint64(rank) << seqBits
		}
	}
	switch {
	case cfg.ackTimeout > 0:
		c.ackTimeout = cfg.ackTimeout
	case cfg.ackTimeout < 0 && !cfg.autoAck:
		c.ackTimeout = q.cfg.ackTimeout
	}
	q.mu.Lock()
	defer q.unlock()
	if q.endErr != nil {
		return nil, errorf("consume from queue %q: %w", q.name, q.endErrLocked())
	}
	if err := q.checkUse("consume", cmp.Or(cfg.owner, ctx)); err != nil {
		return nil, err
	}
	if c.tag == "" {
		for c.tag == "" || q.consumerLocked(c.tag) != nil {
			c.tag = "amq.ctag-" + rand.Text()
		}
	} else if q.consumerLocked(c.tag) != nil {
		return nil, errorf("consume from queue %q: consumer tag %q in use: %w", q.name, c.tag, ErrPreconditionFailed)
	}
	if err := q.addConsumerLocked(c); err != nil {
		return nil, err
	}
	if q.b.listening() {
		q.eventLocked(Event{Kind: EventConsumerCreated, Consumer: c.tag})
	}
	if c.ackTimeout > 0 {
		q.ackTimed++
	}
	// Watch ctx under mu, so that stopCtx is in place before anything reads it; if ctx is
	// already done the callback runs on its own goroutine and waits for mu.
	c.stopCtx = context.AfterFunc(ctx, q.reap)
	if c.autoAck {
		c.wake = make(chan struct{}, 1)
		c.halt = make(chan struct{})
		// Started under mu: Broker.Close ends this queue under mu before it waits for
		// feeders, so the goroutine is either counted before that wait or never started.
		q.b.wg.Go(c.feed)
		return c, nil
	}
	q.dispatchLocked()
	return c, nil
}

// bufferSize is the capacity of a consumer's channel: its prefetch, so that dispatch never blocks
// on it. An AutoAck consumer's feeder holds one more message while it waits to send it, so its
// channel has one slot less, and the consumer holds at most its prefetch either way.
func bufferSize(cfg consumeConfig) int {
	if cfg.autoAck {
		return cfg.prefetch - 1
	}
	return cfg.prefetch
}

// consumerLocked returns the consumer with tag, active or waiting its turn, or nil.
func (q *Queue) consumerLocked(tag string) *Consumer {
	for _, cs := range [...][]*Consumer{q.consumers, q.feeders, q.standby} {
		for _, c := range cs {
			if c.tag == tag {
				return c
			}
		}
	}
	return nil
}

// Tag returns the consumer tag: the one given with [ConsumerTag], or a generated "amq.ctag-…".
func (c *Consumer) Tag() string { return c.tag }

// Deliveries returns the channel on which the consumer receives. It is closed when the
// consumer stops: after [Consumer.Cancel], when the consumer's context ends, when the queue is
// deleted or when the broker closes; [Consumer.Err] then says which.
func (c *Consumer) Deliveries() <-chan *Delivery { return c.ch }

// Done returns a channel that is closed when the consumer has ended: it receives nothing more
// and holds nothing more. By then every delivery it was given has been settled or dealt with —
// back in its place in the queue, or expired and dead-lettered — or its queue is gone. After
// [Consumer.Cancel] a consumer that still holds received deliveries has not ended: Done is closed
// once they are settled, or once its context ends and they are back ([Consumer.Close] does both
// at once).
func (c *Consumer) Done() <-chan struct{} { return c.done }

// Err returns nil while the consumer is active and, once it has stopped, why: [ErrCancelled],
// the cause of its context (e.g. [context.Canceled]), an error wrapping [ErrQueueDeleted], or
// [ErrClosed].
func (c *Consumer) Err() error {
	c.q.mu.Lock()
	defer c.q.readUnlock()
	return c.err
}

// Cancel stops the consumer (AMQP's basic.cancel): no more deliveries, deliveries buffered but
// never received go back to their places unchanged, and Deliveries is closed by the time Cancel
// returns. Deliveries already received stay outstanding and settle-able; they return to the
// queue if the consumer's context ends before they are settled. Cancel is idempotent and returns
// nil, also after the queue was deleted or the broker closed.
func (c *Consumer) Cancel() error {
	q := c.q
	q.mu.Lock()
	if c.stopped {
		q.unlock()
		if c.autoAck {
			<-c.done // stopped by someone else: wait as they do for the feeder to finish
		}
		return nil
	}
	q.restoreAllLocked(c.stopLocked(ErrCancelled, nil, ReasonCancel))
	if c.autoAck {
		c.signalStopLocked() // the feeder puts back what it holds and closes Deliveries
	}
	q.removeConsumerLocked(c)
	c.tidyLocked() // ended, if it holds nothing
	q.dispatchLocked()
	autoDelete := q.shouldAutoDeleteLocked()
	q.unlock()
	c.afterStop(autoDelete)
	return nil
}

// Close ends the consumer as the end of its context would, and returns once it has ended (see
// [Consumer.Done]): it stops receiving, if it had not, deliveries buffered and never received go
// back to their places unchanged, and those it received and has not settled go back to their
// original positions, redelivered (settling them later fails with [ErrAlreadySettled]).
// Everything goes back in one critical section, before anything is dispatched again; messages
// whose TTL passed meanwhile, or past the delivery limit, are dead-lettered by the time Close
// returns. [Consumer.Err] then reports [ErrCancelled], unless the consumer had stopped for
// another reason. Close is idempotent and returns nil, also after the queue was deleted or the
// broker closed. Like [Consumer.Cancel], it must not be called from an event listener.
func (c *Consumer) Close() error {
	q := c.q
	q.mu.Lock()
	if c.ended {
		q.mu.Unlock()
		<-c.done // ended by someone else: wait as they do for its feeder, or its dead letters
		if c.served && q.cfg.autoDelete {
			// Serve closes its consumer once its handlers are done: an auto-delete queue it
			// alone consumed goes now (see shouldAutoDeleteLocked), also when the consumer
			// ended by settling its last delivery.
			q.b.autoDeleteQueue(q)
		}
		return nil
	}
	ended := q.orphanLocked(func(x *Consumer) error {
		if x == c {
			return ErrCancelled
		}
		return nil
	}, nil, ReasonOwnerEnded)
	q.dispatchLocked()
	q.finishOrphans(ended)
	<-c.done
	return nil
}

// signalStopLocked closes done, once; for an AutoAck consumer it closes halt instead, telling
// the feeder to stop, and the feeder closes done once it has put its messages back.
func (c *Consumer) signalStopLocked() {
	ch := c.done
	if c.autoAck {
		ch = c.halt
	}
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// afterStop finishes stopping outside q.mu: it waits for the feeder to close Deliveries and
// deletes an auto-delete queue whose last consumer this was.
func (c *Consumer) afterStop(autoDelete bool) {
	if c.autoAck {
		<-c.done // the feeder has put its messages back and closed Deliveries
	}
	if autoDelete {
		c.q.b.autoDeleteQueue(c.q)
	}
}

// stopLocked stops new deliveries and closes ch (the feeder does, for an AutoAck consumer,
// once told by signalStopLocked). It appends to back the entries of deliveries that were
// buffered and never received, unchanged, for the caller to put back; the caller also removes
// c from the queue's consumer lists and calls signalStopLocked.
func (c *Consumer) stopLocked(reason error, back []entry, why Reason) []entry {
	if c.stopped {
		return back
	}
	c.stopped = true
	c.err = reason
	if c.q.b.listening() {
		c.q.eventLocked(Event{Kind: EventConsumerDeleted, Consumer: c.tag, Err: reason})
	}
	if c.autoAck {
		c.q.leaving = append(c.q.leaving, c) // dispatch waits until the feeder has put back what it holds
		return back                          // the feeder drains and closes ch
	}
	back = c.drainLocked(back, why)
	close(c.ch)
	return back
}

// drainLocked takes the deliveries buffered in ch and not yet received, and appends their
// entries to back, unchanged, as if they had never been delivered; each is evented as coming
// back for why (see backLocked). Only ch's sender may call it: under q.mu for a push consumer,
// the feeder for an AutoAck one. The application may be receiving at the same time; what it
// receives first is its own.
func (c *Consumer) drainLocked(back []entry, why Reason) []entry {
	for {
		select {
		case d := <-c.ch:
			if !c.autoAck {
				c.q.releaseLocked(d, deliveryReturned)
			}
			c.backLocked(d.e, why)
			back = append(back, d.e)
		default:
			return back
		}
	}
}

// backLocked events a delivery of c's on its way back to the queue: EventRequeued for why, or,
// for an auto-acked delivery (why ReasonReturned), EventEnqueued, since its span ended when it
// was delivered; nothing for why "". If the message cannot go back (its TTL passed, or the
// delivery limit), a terminal event follows when it comes back.
func (c *Consumer) backLocked(e entry, why Reason) {
	switch why {
	case "":
	case ReasonReturned:
		c.q.enqueuedLocked(e.env, len(c.q.outbox), why)
	default:
		c.q.messageEventLocked(EventRequeued, e.env, c.tag, why)
	}
}

// shouldAutoDeleteLocked reports whether an auto-delete queue has lost its last consumer (only
// after it has had one). A consumer of Serve's goes when it has ended, not when it stops: the
// queue outlives the handlers Serve waits for, so that their results settle.
func (q *Queue) shouldAutoDeleteLocked() bool {
	if !q.cfg.autoDelete || !q.hadConsumer || q.endErr != nil || q.consumerCountLocked() > 0 {
		return false
	}
	for _, c := range q.holders {
		if c.served {
			return false
		}
	}
	return true
}

// newDeliveryLocked returns a delivery of e to this consumer, with the consumer's next tag.
func (c *Consumer) newDeliveryLocked(e entry) *Delivery {
	q := c.q
	d := q.newDeliveryLocked(e)
	c.nextTag++
	d.DeliveryTag = c.nextTag
	d.ConsumerTag = c.tag
	q.messageEventLocked(EventDelivered, e.env, c.tag, "")
	if c.autoAck {
		d.state = deliveryAutoAcked
		q.n.acked++
		q.messageEventLocked(EventAcked, e.env, c.tag, "")
	}
	return d
}

// deliverLocked records a delivery of e to a push consumer and returns it for sending.
func (c *Consumer) deliverLocked(e entry) *Delivery {
	d := c.newDeliveryLocked(e)
	d.c = c
	if c.ackTimeout > 0 {
		d.due = later(c.q.clock(), c.ackTimeout)
	}
	c.unacked.push(d)
	c.live++
	c.q.unacked++
	return d
}

// tidyLocked drops settled deliveries from the front of unacked, compacts it when holes
// dominate (a consumer that holds one delivery for long while settling many later ones), and
// finishes a stopped consumer that holds nothing more.
func (c *Consumer) tidyLocked() {
	trimSettled(&c.unacked, c.live)
	if c.stopped && c.live == 0 && !c.ended {
		c.finishLocked()
	}
}

// trimSettled drops settled deliveries from the front of a tag-ordered list of deliveries with
// live outstanding ones, and compacts it when holes dominate.
func trimSettled(r *ring[*Delivery], live int) {
	for r.len() > 0 && r.front().state != deliveryOutstanding {
		r.pop()
	}
	if n := r.len(); n > 64 && n > 4*live {
		r.filter(func(d *Delivery) bool { return d.state == deliveryOutstanding })
	}
}

// finishLocked marks a stopped consumer ended: it holds nothing more and its context is no
// longer watched.
func (c *Consumer) finishLocked() {
	c.ended = true
	c.signalStopLocked()
	c.stopCtx()
	q := c.q
	if i := slices.Index(q.holders, c); i >= 0 {
		q.holders = slices.Delete(q.holders, i, i+1)
		q.unholdLocked(c)
	}
}

// unholdLocked accounts for c leaving q.holders.
func (q *Queue) unholdLocked(c *Consumer) {
	if c.ackTimeout > 0 {
		q.ackTimed--
	}
}

// wakeLocked tells a waiting feeder that messages may be ready.
func (c *Consumer) wakeLocked() {
	if c.waiting {
		c.waiting = false
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// feed is the goroutine of an AutoAck consumer. A push consumer is sent to under the queue lock
// while it has credit, and its acks say when it has room again; an auto-ack consumer never acks,
// so only a blocking send can tell that the application made room. The feeder takes one message
// at a time under the lock and sends it outside the lock. What it holds or has buffered when the
// consumer stops goes back to its place unchanged.
func (c *Consumer) feed() {
	q := c.q
	var held *Delivery // taken from the queue when halt came, never sent
	for held == nil {
		q.mu.Lock()
		c.sending = false // a send that filled ch left it set: equally idle until ch is read
		if c.stopped {
			q.unlock()
			break
		}
		var (
			e  entry
			ok bool
		)
		c.idle = false
		if !c.handing && c.active && len(q.leaving) == 0 { // see Queue.leaving
			if q.general {
				c.idle = true
				q.dispatchLocked() // the general dispatch hands idle feeders their messages
			} else {
				e, ok = q.takeLocked()
			}
		}
		if c.handing { // handed over by dispatch, or as it arrived with TTL 0
			e, ok, c.handoff, c.handing = c.handoff, true, entry{}, false
			c.idle = false
		}
		if !ok {
			c.waiting, c.idle = true, true
			q.unlock()
			select {
			case <-c.wake:
			case <-c.halt:
			}
			continue
		}
		d := c.newDeliveryLocked(e)
		c.sending = true
		q.unlock()
		select {
		case c.ch <- d:
		case <-c.halt:
			held = d
		}
	}
	// One critical section: what the feeder held and what is buffered go back together,
	// before anything is dispatched.
	q.mu.Lock()
	c.sending = false
	var back []entry
	if held != nil {
		back = append(back, held.e)
	}
	why := ReasonReturned
	if q.endErr != nil {
		why = "" // nothing goes back into an ended queue, and these were acked: no events
	}
	if held != nil {
		c.backLocked(held.e, why)
	}
	back = c.drainLocked(back, why)
	if c.handing {
		// Handed over but never delivered, so never evented: it goes back as if it had not
		// left (and expires as it comes back, if it must). (A queue that ended dropped it and
		// cleared handing itself.)
		back = append(back, c.handoff)
		c.handoff, c.handing = entry{}, false
	}
	q.restoreAllLocked(back)
	if i := slices.Index(q.leaving, c); i >= 0 {
		q.leaving = slices.Delete(q.leaving, i, i+1)
	}
	q.dispatchLocked()
	// Closed in the critical section that puts its messages back, so that whoever looks at
	// the queue sees both or neither (Broker.WaitReleased).
	close(c.ch)
	close(c.done)
	q.unlock()
}

// AckUpTo acknowledges every outstanding delivery of this consumer with a tag up to and
// including tag (AMQP's basic.ack with multiple). Tag 0 means every outstanding delivery. Only
// deliveries the application has received from [Consumer.Deliveries] are covered; those still
// buffered in the channel are not. If tag is not outstanding and received on this consumer
// (never issued, already settled, still buffered) nothing is settled and the error wraps
// [ErrUnknownDelivery].
func (c *Consumer) AckUpTo(tag uint64) error { return c.settleUpTo(tag, settleAck) }

// NackUpTo returns every outstanding delivery with a tag up to tag to its original position,
// redelivered (basic.nack with multiple and requeue). Tag 0 and errors are as for AckUpTo.
func (c *Consumer) NackUpTo(tag uint64) error { return c.settleUpTo(tag, settleNack) }

// RejectUpTo rejects every outstanding delivery with a tag up to tag, in tag order, without
// requeueing them (basic.nack with multiple, without requeue). Tag 0 and errors are as for
// AckUpTo.
func (c *Consumer) RejectUpTo(tag uint64) error { return c.settleUpTo(tag, settleReject) }

func (c *Consumer) settleUpTo(tag uint64, how settlement) error {
	q := c.q
	q.mu.Lock()
	defer q.unlock()
	if q.b.closed.Load() {
		return errorf("settle up to %d: %w", tag, ErrClosed)
	}
	if c.autoAck {
		return errorf("settle up to %d on an auto-ack consumer: %w", tag, ErrUnknownDelivery)
	}
	// Only deliveries the application has received can be settled: the last len(ch) entries
	// of unacked are still buffered in ch. Only mu's holder sends to ch, so len(ch) can only
	// shrink meanwhile, and a delivery received just now is, safely, left alone.
	end := c.unacked.len() - len(c.ch)
	if tag != 0 {
		i := sort.Search(end, func(i int) bool { return c.unacked.at(i).DeliveryTag >= tag })
		if i == end || c.unacked.at(i).DeliveryTag != tag || c.unacked.at(i).state != deliveryOutstanding {
			return errorf("settle up to %d: tag not outstanding on consumer %q: %w", tag, c.tag, ErrUnknownDelivery)
		}
		end = i + 1
	}
	var back []entry // nacked: they go back together
	for i := range end {
		d := c.unacked.at(i)
		switch {
		case d.state != deliveryOutstanding:
			continue
		case q.endErr != nil:
			d.state = deliverySettled // a deleted queue: a no-op, as for one delivery (settleEndedLocked)
			continue
		}
		if how == settleNack {
			q.releaseLocked(d, deliverySettled)
			c.backLocked(d.e, ReasonNack)
			back = append(back, redelivered(d.e))
		} else {
			q.settleLocked(d, how)
		}
	}
	if how == settleNack {
		q.n.nacked += uint64(len(back))
	}
	q.restoreAllLocked(back)
	c.tidyLocked()
	q.dispatchLocked()
	return nil
}

// deliveryState is where a delivery stands; guarded by its queue's mu.
type deliveryState uint8

const (
	deliveryOutstanding deliveryState = iota + 1 // held by the application, to be settled
	deliverySettled                              // acked, nacked or rejected
	deliveryReturned                             // went back to the queue: its consumer or Get context ended, or Recover
	deliveryAutoAcked                            // settled at delivery; nothing to settle
)

// settlement is what a settlement does with the message.
type settlement uint8

const (
	settleAck    settlement = iota + 1 // remove it
	settleNack                         // return it to its original position, redelivered
	settleReject                       // remove it; dead-letter it when the queue has a dead-letter exchange
)

// Delivery is one delivery of one message from one queue, to a [Consumer] or a [Queue.Get].
// Its exported fields describe the delivery and must be treated as read-only; the message is
// shared with every other queue and delivery of it.
//
// Settle a delivery exactly once, with [Delivery.Ack], [Delivery.Nack] or [Delivery.Reject], or
// with one of the consumer's UpTo methods. A second settlement returns an error wrapping
// [ErrAlreadySettled]; so does settling a delivery that already went back to the queue because
// its owner ended. A delivery whose queue was deleted may still be settled, once, to no effect
// (the message went with the queue), as RabbitMQ allows; after the broker closes, settling fails
// with [ErrClosed]. The methods are safe for concurrent use; the zero Delivery, and a copy of a
// Delivery, settle nothing and return [ErrUnknownDelivery]: use the *Delivery as received.
//
// Deliveries are allocated in small chunks: holding one keeps the messages of up to 15 others
// of its queue reachable until it is dropped.
type Delivery struct {
	Message       *Message      // the message; shared and immutable
	Exchange      string        // the exchange it was published to
	RoutingKey    string        // the routing key it was published with
	Redelivered   bool          // it was delivered before and came back to the queue
	state         deliveryState // unexported; here to fill the padding after Redelivered
	DeliveryCount int           // how many times it came back to the queue before this delivery (RabbitMQ's x-delivery-count)
	DeliveryTag   uint64        // per consumer (or per queue for Get), from 1, in delivery order
	ConsumerTag   string        // the consumer's tag; empty for Get
	MessageCount  int           // Get only: ready messages left in the queue after this one

	_    noCopy    // a copy would be a second handle on one delivery: go vet flags it
	self *Delivery // d.self == d, so that settling a copy is refused
	q    *Queue
	c    *Consumer // nil for Get
	e    entry     // the message's place in q
	due  int64     // when its consumer's ack timeout ends it, on q's clock; 0 for never
	get  *getOwner // Get only, and only when the Get's context can end
}

// Ack acknowledges the delivery: the message is done and leaves the queue (AMQP's basic.ack).
// It frees one unit of the consumer's prefetch credit.
func (d *Delivery) Ack() error { return d.settle(settleAck) }

// Nack returns the message to its original position in the queue, ahead of everything published
// after it, marked redelivered and with its delivery count one higher (basic.nack with requeue).
func (d *Delivery) Nack() error { return d.settle(settleNack) }

// Reject refuses the message without requeueing it (basic.reject without requeue): it is
// dead-lettered with reason "rejected" when the queue has a dead-letter exchange, and dropped
// otherwise.
func (d *Delivery) Reject() error { return d.settle(settleReject) }

func (d *Delivery) settle(how settlement) error {
	return d.settleWith(func(q *Queue) { q.settleAsLocked(d, how) })
}

// settleWith settles an outstanding delivery: it releases it, then lets then decide what becomes
// of the message, under the queue lock.
func (d *Delivery) settleWith(then func(*Queue)) error {
	if d == nil || d.q == nil || d.self != d {
		return ErrUnknownDelivery
	}
	q := d.q
	q.mu.Lock()
	if q.endErr != nil {
		err := q.settleEndedLocked(d)
		q.mu.Unlock()
		return err
	}
	err := q.checkSettleLocked(d)
	if err == nil {
		q.releaseLocked(d, deliverySettled)
		then(q)
		if d.c != nil {
			d.c.tidyLocked()
		}
		q.dispatchLocked()
	}
	q.unlock()
	if err == nil {
		d.stopWatching()
	}
	return err
}

// noCopy makes go vet's copylocks check report copies of the struct that contains it.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

// getOwner is the owner of a Get delivery: the context given to Get. Kept apart from Delivery,
// which every delivery allocates, because only Gets whose context can end need it.
type getOwner struct {
	ctx  context.Context // to tell, when a context of the queue's ends, whether it was this one
	stop func() bool     // stops watching ctx
}

// stopWatching stops watching a Get delivery's owning context, if it was watched.
func (d *Delivery) stopWatching() {
	if d.get != nil {
		d.get.stop()
	}
}

// checkSettleLocked says why d cannot be settled, if it cannot.
func (q *Queue) checkSettleLocked(d *Delivery) error {
	switch {
	case d.state == deliveryAutoAcked:
		return errorf("settle auto-acked delivery %d: %w", d.DeliveryTag, ErrUnknownDelivery)
	case d.state != deliveryOutstanding:
		return errorf("settle delivery %d: %w", d.DeliveryTag, ErrAlreadySettled)
	}
	return nil
}

// settleEndedLocked settles a delivery of a queue that ended. Once the broker has closed, there is
// nothing to settle with: [ErrClosed]. A deleted queue took its messages with it, and RabbitMQ
// accepts the settlement of a delivery from a deleted queue as a no-op: so does warren, once per
// delivery (a second settlement is refused as usual), so that a handler that did its work does
// not see a failure. Why its consumer ended, its Err says.
func (q *Queue) settleEndedLocked(d *Delivery) error {
	if q.b.closed.Load() {
		return errorf("settle delivery %d from queue %q: %w", d.DeliveryTag, q.name, ErrClosed)
	}
	if err := q.checkSettleLocked(d); err != nil {
		return err
	}
	d.state = deliverySettled // the queue's counts went with it
	return nil
}

// releaseLocked moves an outstanding delivery to state, settled or returned, and releases
// what it held: the queue's unacked count, and its consumer's credit or its Get owner.
func (q *Queue) releaseLocked(d *Delivery, state deliveryState) {
	d.state = state
	q.unacked--
	if d.c != nil {
		d.c.live--
	} else {
		q.getsLive--
		trimSettled(&q.gets, q.getsLive)
	}
}

// settleLocked settles an outstanding delivery. The caller tidies the consumer and dispatches.
func (q *Queue) settleLocked(d *Delivery, how settlement) {
	q.releaseLocked(d, deliverySettled)
	q.settleAsLocked(d, how)
}

// settleAsLocked does what a settlement does with a released delivery's message.
func (q *Queue) settleAsLocked(d *Delivery, how settlement) {
	switch how {
	case settleAck:
		q.n.acked++
		q.messageEventLocked(EventAcked, d.e.env, d.ConsumerTag, "")
	case settleNack:
		q.n.nacked++
		q.returnLocked(d.e, d.ConsumerTag)
	case settleReject:
		q.n.rejected++
		q.deadLetterLocked(d.e, ReasonRejected)
	}
}

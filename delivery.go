package warren

import (
	"context"
	"sort"
	"time"
)

// deliveryState is where a delivery stands; guarded by its queue's mu.
type deliveryState uint8

// settlement is what a settlement does with the message.
type settlement uint8

// Delivery is one delivery of one message from one queue, to a [Consumer] or a [Queue.Get]: a
// value, like amqp091-go's, which the application may copy and keep. Its exported fields
// describe the delivery; the message's Body and Headers are shared with every other queue and
// delivery of it and must be treated as read-only.
//
// Settle a delivery exactly once, with [Delivery.Ack], [Delivery.Nack] or [Delivery.Reject], or
// with one of the consumer's UpTo methods; a copy settles the same delivery. A second settlement
// returns an error wrapping [ErrAlreadySettled]; so does settling a delivery that already went
// back to the queue because its owner ended. A delivery whose queue was deleted may still be
// settled, once, to no effect (the message went with the queue), as RabbitMQ allows; after the
// broker closes, settling fails with [ErrClosed]. The zero Delivery, and a delivery that was
// auto-acknowledged, settle nothing and return [ErrUnknownDelivery]. The methods are safe for
// concurrent use.
type Delivery struct {
	Message       Message // the message; its Body and Headers are shared and read-only
	Exchange      string  // the exchange it was published to
	RoutingKey    string  // the routing key it was published with
	Redelivered   bool    // it was delivered before and came back to the queue
	DeliveryCount int     // how many times it came back to the queue before this delivery (RabbitMQ's x-delivery-count)
	DeliveryTag   uint64  // per consumer (or per queue for Get), from 1, in delivery order
	ConsumerTag   string  // the consumer's tag; empty for Get
	MessageCount  int     // Get only: ready messages left in the queue after this one

	q     *Queue // its queue
	lease *lease // the queue's record of it while it is outstanding; nil when auto-acked
	gen   uint64 // the lease's generation when it was made: a lease reused since is another delivery's
	e     entry  // the message's place in its queue, for putting it back if it is never received
}

// lease is the queue's record of an outstanding delivery: in its holder's list, in tag order,
// until it is settled or comes back and the list lets go of it (queueCore.trim). Leases are
// reused: one whose list let go of it returns to its queue's free list with its generation one
// higher, so that a [Delivery] value that still names it (gen) is known to be stale. Guarded by
// its queue's mu.
type lease struct {
	ext   Settler   // a delivery of another backend (NewDelivery): it settles; nothing else is set
	h     *holder   // its consumer's, or its queue's Gets'
	e     entry     // the message's place in q
	tag   uint64    // the delivery tag
	due   int64     // when its consumer's ack timeout ends it, on q's clock; 0 for never
	get   *getOwner // Get only, and only when the Get's context can end
	gen   uint64    // bumped each time the record is reused
	state deliveryState
	// uncounted: made to a holder whose deliveries count at receipt (holder.atReceipt), and
	// not received yet; a durable queue's log holds the message as not out (store.received).
	uncounted bool
}

// Ack acknowledges the delivery: the message is done and leaves the queue (AMQP's basic.ack).
// It frees one unit of the consumer's prefetch credit.
func (d Delivery) Ack() error { return d.settle(settleAck) }

// Nack returns the message to its original position in the queue, ahead of everything published
// after it, marked redelivered and with its delivery count one higher (basic.nack with requeue).
func (d Delivery) Nack() error { return d.settle(settleNack) }

// Reject refuses the message without requeueing it (basic.reject without requeue): it is
// dead-lettered with reason "rejected" when the queue has a dead-letter exchange, and dropped
// otherwise.
func (d Delivery) Reject() error { return d.settle(settleReject) }

func (d *Delivery) settle(how settlement) error {
	if d.q == nil && d.lease != nil {
		return d.lease.ext.Settle(d.DeliveryTag, Outcome(how), 0)
	}
	return d.settleWith(func(q *Queue, r *lease) { q.core.settle(r, how) })
}

// Outcome is how a delivery was settled, for a [Settler].
type Outcome uint8

// The outcomes.
const (
	Acked    Outcome = Outcome(settleAck)    // [Delivery.Ack]
	Requeued Outcome = Outcome(settleNack)   // [Delivery.Nack], [Delivery.NackWithDelay]
	Rejected Outcome = Outcome(settleReject) // [Delivery.Reject]
)

// Settler settles the deliveries of a backend other than warren's own (contrib/rabbitmq's): a
// [Delivery] made by [NewDelivery] hands its Ack, Nack, Reject and NackWithDelay to Settle,
// with its DeliveryTag and, for NackWithDelay, the delay. Settle must be safe for concurrent
// use, and refuse a second settlement of a delivery with an error wrapping [ErrAlreadySettled].
type Settler interface {
	Settle(tag uint64, o Outcome, delay time.Duration) error
}

// NewDelivery returns a delivery that describes what d's exported fields say and is settled by
// s: how a backend other than warren's own hands its deliveries to a [Handler], so that the
// same handler serves both.
func NewDelivery(d Delivery, s Settler) Delivery {
	return Delivery{Message: d.Message, Exchange: d.Exchange, RoutingKey: d.RoutingKey, Redelivered: d.Redelivered,
		DeliveryCount: d.DeliveryCount, DeliveryTag: d.DeliveryTag, ConsumerTag: d.ConsumerTag, MessageCount: d.MessageCount,
		lease: &lease{ext: s}}
}

// settleWith settles an outstanding delivery with then, which releases its record and decides
// what becomes of the message, under the queue lock.
func (d *Delivery) settleWith(then func(*Queue, *lease)) error {
	q, r := d.q, d.lease
	switch {
	case q == nil:
		return ErrUnknownDelivery // the zero Delivery
	case r == nil && q.b.closed.Load():
		return errorf("settle delivery %d from queue %q: %w", d.DeliveryTag, q.name, ErrClosed)
	case r == nil:
		return errorf("settle auto-acked delivery %d: %w", d.DeliveryTag, ErrUnknownDelivery)
	}
	q.mu.Lock()
	if r.gen != d.gen {
		// Its lease was let go of, and perhaps reused: the delivery was settled, or came back.
		q.commit()
		if q.b.closed.Load() {
			return errorf("settle delivery %d from queue %q: %w", d.DeliveryTag, q.name, ErrClosed)
		}
		return errorf("settle delivery %d: %w", d.DeliveryTag, ErrAlreadySettled)
	}
	if q.endErr != nil {
		err := q.settleEndedLocked(r)
		q.commit()
		return err
	}
	err := checkSettle(r)
	if err == nil && q.log != nil && r.e.env.persistent {
		// Refused while the log takes no new work (a full disk): the delivery stays
		// outstanding, to be settled again once the log writes, rather than settled in
		// memory with nothing in the log to say so.
		if cause := q.b.store.refusing(); cause != nil {
			err = errorf("settle delivery %d from queue %q: %w: %w", d.DeliveryTag, q.name, ErrStorage, cause)
		}
	}
	get := r.get
	if err == nil {
		then(q, r)
		if c := r.h.c; c != nil {
			c.tidyLocked()
		} else {
			q.core.trim(r.h)
		}
		q.dispatchLocked()
	}
	q.commit()
	if err == nil && get != nil {
		get.stop() // stop watching the Get's owning context
	}
	return err
}

// NackWithDelay returns the message to its original position, redelivered and with its delivery
// count one higher as [Delivery.Nack] does, but hidden from consumers until d has passed: a
// retry with a delay, bounded by the queue's [DeliveryLimit] (past it the message is
// dead-lettered at once with reason "delivery_limit"). The message's TTL keeps running; if it
// expires while hidden it is expired when d has passed. Delayed messages are not counted by
// [Queue.Len] nor removed by [Queue.Purge]. A d ≤ 0 is a plain Nack; d is capped at about 146
// years (1<<62 ns), so that a huge delay, up to the largest Duration, hides the message
// practically forever without disturbing the queue's other deadlines.
func (d Delivery) NackWithDelay(delay time.Duration) error {
	if delay <= 0 {
		return d.Nack()
	}
	if d.q == nil && d.lease != nil {
		return d.lease.ext.Settle(d.DeliveryTag, Requeued, delay)
	}
	return d.settleWith(func(q *Queue, r *lease) {
		q.core.release(r, deliverySettled)
		q.core.nack(r.e, r.h.tag, delay)
	})
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
	defer q.commit()
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
		i := sort.Search(end, func(i int) bool { return c.unacked.at(i).tag >= tag })
		if i == end || c.unacked.at(i).tag != tag || c.unacked.at(i).state != deliveryOutstanding {
			return errorf("settle up to %d: tag not outstanding on consumer %q: %w", tag, c.tag, ErrUnknownDelivery)
		}
		end = i + 1
	}
	if err := c.refuseUpToLocked(end); err != nil {
		return errorf("settle up to %d: %w", tag, err)
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
			q.core.release(d, deliverySettled)
			e := redelivered(d.e)
			q.core.back(&c.holder, e, ReasonNack)
			back = append(back, e)
		} else {
			q.core.settle(d, how)
		}
	}
	q.core.restoreAll(back)
	c.tidyLocked()
	q.dispatchLocked()
	return nil
}

// refuseUpToLocked returns the error of a settlement of c's first end deliveries, if one of
// them is of a persistent message in a durable queue and the log takes no new work (a full
// disk): then none is settled, as a single settlement is refused (Delivery.settleWith). The
// caller holds c's queue's lock.
func (c *Consumer) refuseUpToLocked(end int) error {
	q := c.q
	if q.log == nil || q.endErr != nil {
		return nil
	}
	cause := q.b.store.refusing()
	if cause == nil {
		return nil
	}
	for i := range end {
		if d := c.unacked.at(i); d.state == deliveryOutstanding && d.e.env.persistent {
			return errorf("%w: %w", ErrStorage, cause)
		}
	}
	return nil
}

// Recover returns every delivery this consumer holds to its original position (AMQP's
// basic.recover with requeue): received ones redelivered, buffered unread ones unchanged. They
// are dispatched again at once, possibly to this consumer. An AutoAck consumer holds nothing to
// recover.
func (c *Consumer) Recover() error {
	q := c.q
	q.mu.Lock()
	defer q.commit()
	if q.b.closed.Load() {
		return errorf("recover: %w", ErrClosed)
	}
	if c.autoAck || c.ended || q.endErr != nil { // a deleted queue took everything: nothing to recover
		return nil
	}
	var back []entry
	if !c.stopped {
		back = c.drainLocked(back, ReasonRecover)
	}
	q.core.restoreAll(q.core.takeBack(&c.holder, back, ReasonRecover))
	c.tidyLocked()
	q.dispatchLocked()
	return nil
}

// giveBack returns a consumer's delivery that the application received but never handled to its
// place unchanged, as if it had stayed buffered (Serve gives back what a worker took after Serve
// began to stop). A delivery no longer outstanding is left alone.
func (d *Delivery) giveBack() {
	q, r := d.q, d.lease
	if r == nil {
		return
	}
	if q == nil {
		r.ext.Settle(d.DeliveryTag, Requeued, 0) // another backend's: it comes back redelivered
		return
	}
	q.mu.Lock()
	// The generation first: a lease let go of since (an ack timeout or a context end took the
	// delivery back) may be on the free list, holderless, or another delivery's.
	if q.endErr == nil && r.gen == d.gen && r.state == deliveryOutstanding {
		if c := r.h.c; c != nil {
			q.core.release(r, deliveryReturned)
			q.core.back(r.h, r.e, ReasonCancel)
			q.core.restoreAll([]entry{r.e})
			c.tidyLocked()
			q.dispatchLocked()
		}
	}
	q.commit()
}

// getOwner is the owner of a Get delivery: the context given to Get. Kept apart from lease,
// which every outstanding delivery has, because only Gets whose context can end need it.
type getOwner struct {
	ctx  context.Context // to tell, when a context of the queue's ends, whether it was this one
	stop func() bool     // stops watching ctx
}

// settleEndedLocked settles a delivery of a queue that ended. Once the broker has closed, there is
// nothing to settle with: [ErrClosed]. A deleted queue took its messages with it, and RabbitMQ
// accepts the settlement of a delivery from a deleted queue as a no-op: so does warren, once per
// delivery (a second settlement is refused as usual), so that a handler that did its work does
// not see a failure. Why its consumer ended, its Err says.
func (q *Queue) settleEndedLocked(r *lease) error {
	if q.b.closed.Load() {
		return errorf("settle delivery %d from queue %q: %w", r.tag, q.name, ErrClosed)
	}
	if err := checkSettle(r); err != nil {
		return err
	}
	r.state = deliverySettled // the queue's counts went with it
	return nil
}

// deliverLocked records a delivery of e to h into d, the zero Delivery (see
// [queueCore.deliver]), and makes it this queue's.
func (q *Queue) deliverLocked(d *Delivery, h *holder, e entry, autoAck bool, due int64) {
	q.core.deliver(d, h, e, autoAck, due)
	d.q = q
}

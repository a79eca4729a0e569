package warren

import (
	"cmp"
	"context"
	"crypto/rand"
	"math"
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
	holder     // its deliveries, and its tag (core.go); guarded by q.mu
	q          *Queue
	prefetch   int
	autoAck    bool
	exclusive  bool
	priority   int
	selector   func(*Message) bool
	ackTimeout time.Duration // 0 for none
	ch         chan Delivery // capacity = prefetch; push consumers: sent to and closed under q.mu
	done       chan struct{} // closed when the consumer has stopped and its messages are back (see Done)

	feeder    feeder // AutoAck consumers only: the goroutine that sends to ch (feeder.go)
	unlimited bool   // prefetch 0: its credit is room in its channel (unlimited.go)

	// owner is the context given to Consume. It is the consumer's owner, AMQP's channel: kept
	// to tell, when some context of the queue's ends, whether it was this one, and why.
	owner context.Context
	// as is the context on whose behalf the consumer was started, when that is not owner: the
	// context given to Serve, whose consumer outlives it by the drain. Nil otherwise.
	as context.Context

	// Guarded by q.mu.
	stopCtx func() bool // stops watching owner
	served  bool        // started by Serve: what it holds, its handlers are working on (idle.go)
	active  bool        // in consumerSet.push or feeders: receiving (not waiting its turn, not stopped)
	cursor  []uint64    // selector: per rank, every ready key below it was rejected (dispatch.go)
	turn    uint64      // general dispatch: when it last received, for round-robin
	missed  uint64      // general dispatch: the pass in which it last found nothing to take
	stopped bool        // no more deliveries; ch closed (or being closed by the feeder)
	ended   bool        // nothing outstanding remains; the context is no longer watched
	err     error       // why the consumer stopped; nil while active
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
	if cfg.prefetch < 0 || cfg.prefetch > maxPrefetch {
		return nil, errorf("consume: prefetch %d not in [0, %d]: %w", cfg.prefetch, maxPrefetch, ErrInvalidArgument)
	}
	unlimited := cfg.prefetch == 0 && !cfg.autoAck
	if cfg.prefetch == 0 {
		cfg.prefetch = DefaultPrefetch // AutoAck: its prefetch only sizes its buffer
	}
	if len(cfg.tag) > maxNameLen {
		return nil, errorf("consume: consumer tag longer than %d bytes: %w", maxNameLen, ErrInvalidArgument)
	}
	capacity := bufferSize(cfg)
	if unlimited {
		capacity = unlimitedBuffer // what bounds it (unlimited.go)
	}
	c := &Consumer{
		q:         q,
		prefetch:  cfg.prefetch,
		autoAck:   cfg.autoAck,
		exclusive: cfg.exclusive,
		priority:  cfg.priority,
		selector:  cfg.selector,
		owner:     ctx,
		as:        cfg.owner,
		served:    cfg.served,
		ch:        make(chan Delivery, capacity),
		done:      make(chan struct{}),
	}
	c.holder.c, c.tag = c, cfg.tag
	c.holder.atReceipt = cfg.served // a Serve worker's taking a delivery is its receipt (store.received)
	if unlimited {
		c.prefetch, c.unlimited = math.MaxInt, true // its credit is room in its channel
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
	defer q.commit()
	if q.endErr != nil {
		return nil, errorf("consume from queue %q: %w", q.name, q.endErrLocked())
	}
	if err := q.checkUse("consume", cmp.Or(cfg.owner, ctx), byContext); err != nil {
		return nil, err
	}
	if c.tag == "" {
		for c.tag == "" || q.consumers.byTag(c.tag) != nil {
			c.tag = "amq.ctag-" + rand.Text()
		}
	} else if q.consumers.byTag(c.tag) != nil {
		return nil, errorf("consume from queue %q: consumer tag %q in use: %w", q.name, c.tag, ErrPreconditionFailed)
	}
	if err := q.consumers.admit(c, q.cfg.singleActive); err != nil {
		return nil, errorf("consume from queue %q: %w", q.name, err)
	}
	q.core.hold(&c.holder)
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
		c.feeder.wake = make(chan struct{}, 1)
		c.feeder.halt = make(chan struct{})
		// Started under mu: Broker.Close ends this queue under mu before it waits for
		// feeders, so the goroutine is either counted before that wait or never started.
		q.b.wg.Go(c.feed)
		return c, nil
	}
	q.dispatchLocked()
	return c, nil
}

// ConsumerInfo describes one of a queue's consumers, for inspection ([Queue.Consumers]): what
// RabbitMQ's management lists for a queue's consumers, and how much each holds.
type ConsumerInfo struct {
	Tag string
	// Status is "active" (receiving), "waiting" (its turn not come, on a single-active-consumer
	// queue) or "stopped" (cancelled, and still holding deliveries it received).
	Status     string
	Prefetch   int // 0 for unlimited
	Priority   int
	AutoAck    bool
	Exclusive  bool
	Selector   bool          // it takes only the messages its selector accepts
	Served     bool          // started by [Queue.Serve]
	AckTimeout time.Duration // 0 for none
	Unacked    int           // deliveries not yet settled: buffered in its channel or received
}

// Consumers returns the queue's consumers in the order they started: those receiving, those
// waiting their turn, and those stopped but still holding deliveries. It is a snapshot taken in
// one critical section that copies a few words per consumer; the descriptions are built after
// it. After the queue is deleted it returns nothing.
func (q *Queue) Consumers() []ConsumerInfo {
	hs := make([]heldBy, 0, 8)
	q.view(func() { hs = q.consumersLocked(hs) })
	if len(hs) == 0 {
		return nil
	}
	out := make([]ConsumerInfo, len(hs))
	for i, h := range hs {
		c := h.c // what is read of c here was set before Consume returned and never changes
		out[i] = ConsumerInfo{Tag: c.tag, Status: h.status, Prefetch: c.prefetch, Priority: c.priority,
			AutoAck: c.autoAck, Exclusive: c.exclusive, Selector: c.selector != nil, Served: c.served,
			AckTimeout: c.ackTimeout, Unacked: h.live}
		if c.unlimited {
			out[i].Prefetch = 0
		}
	}
	return out
}

// heldBy is what Consumers copies of a consumer under the lock.
type heldBy struct {
	c      *Consumer
	live   int
	status string
}

// consumersLocked appends the queue's consumers, in the order they started, to hs: Consumers'
// critical section.
func (q *Queue) consumersLocked(hs []heldBy) []heldBy {
	for _, h := range q.core.holders {
		status := "waiting"
		switch c := h.c; {
		case c.stopped:
			status = "stopped"
		case c.active:
			status = "active"
		}
		hs = append(hs, heldBy{h.c, h.live, status})
	}
	return hs
}

// Tag returns the consumer tag: the one given with [ConsumerTag], or a generated "amq.ctag-…".
func (c *Consumer) Tag() string { return c.tag }

// Deliveries returns the channel on which the consumer receives. It is closed when the
// consumer stops: after [Consumer.Cancel], when the consumer's context ends, when the queue is
// deleted or when the broker closes; [Consumer.Err] then says which.
func (c *Consumer) Deliveries() <-chan Delivery { return c.ch }

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
func (c *Consumer) Err() (err error) {
	c.q.view(func() { err = c.err })
	return err
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
		q.commit()
		if c.autoAck {
			<-c.done // stopped by someone else: wait as they do for the feeder to finish
		}
		return nil
	}
	q.core.restoreAll(c.stopLocked(ErrCancelled, nil, ReasonCancel))
	if c.autoAck {
		c.signalStopLocked() // the feeder puts back what it holds and closes Deliveries
	}
	q.removeConsumerLocked(c)
	c.tidyLocked() // ended, if it holds nothing
	q.dispatchLocked()
	autoDelete := q.shouldAutoDeleteLocked()
	q.commit()
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
		q.commit()
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
		ch = c.feeder.halt
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
			if d.lease != nil {
				c.q.core.release(d.lease, deliveryReturned)
			}
			c.q.core.back(&c.holder, d.e, why)
			back = append(back, d.e)
		default:
			return back
		}
	}
}

// shouldAutoDeleteLocked reports whether an auto-delete queue has lost its last consumer (only
// after it has had one). A consumer of Serve's goes when it has ended, not when it stops: the
// queue outlives the handlers Serve waits for, so that their results settle.
func (q *Queue) shouldAutoDeleteLocked() bool {
	if !q.cfg.autoDelete || !q.consumers.had || q.endErr != nil || q.consumers.count() > 0 {
		return false
	}
	for _, h := range q.core.holders {
		if h.c.served {
			return false
		}
	}
	return true
}

// tidyLocked drops settled deliveries from the front of unacked, compacts it when holes
// dominate (a consumer that holds one delivery for long while settling many later ones), and
// finishes a stopped consumer that holds nothing more.
func (c *Consumer) tidyLocked() {
	c.q.core.trim(&c.holder)
	if c.stopped && c.live == 0 && !c.ended {
		c.finishLocked()
	}
}

// finishLocked marks a stopped consumer ended: it holds nothing more and its context is no
// longer watched.
func (c *Consumer) finishLocked() {
	c.ended = true
	c.signalStopLocked()
	c.stopCtx()
	if c.q.core.unhold(&c.holder) {
		c.q.unholdLocked(c)
	}
}

// unholdLocked accounts for c leaving the holders.
func (q *Queue) unholdLocked(c *Consumer) {
	if c.ackTimeout > 0 {
		q.ackTimed--
	}
}

// deliverLocked records a delivery of e to c into d, the zero Delivery (see queueCore.deliver).
func (c *Consumer) deliverLocked(e entry, d *Delivery) {
	var due int64
	if c.ackTimeout > 0 {
		due = later(c.q.core.clock(), c.ackTimeout)
	}
	c.q.deliverLocked(d, &c.holder, e, c.autoAck, due)
}

// sendLocked delivers e to c and sends the delivery into its channel, which has room for it
// (dispatch gives a consumer only what its credit allows).
func (c *Consumer) sendLocked(e entry) {
	var d Delivery
	c.deliverLocked(e, &d)
	c.ch <- d
}

const (
	deliveryOutstanding deliveryState = iota + 1 // held by the application, to be settled
	deliverySettled                              // acked, nacked or rejected
	deliveryReturned                             // went back to the queue: its consumer or Get context ended, or Recover
)

const (
	settleAck    settlement = iota + 1 // remove it
	settleNack                         // return it to its original position, redelivered
	settleReject                       // remove it; dead-letter it when the queue has a dead-letter exchange
)

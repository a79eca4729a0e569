package warren

import (
	"context"
	"iter"
	"slices"
	"sync"
	"time"

	"github.com/google/btree"
)

// Queue is an ordered store of messages with its consumers: RabbitMQ's classic queue. Ready
// messages are kept in order of their sequence id; a message that comes back (nack, recover, a
// consumer that ended) returns to its original position, marked redelivered.
//
// Obtain a Queue from [Broker.DeclareQueue] or [Broker.Queue]; the zero Queue is not usable.
// A Queue is safe for concurrent use. After the queue is deleted its methods return an error
// wrapping [ErrNotFound]; after the broker closes, [ErrClosed].
type Queue struct {
	b     *Broker
	name  string
	cfg   queueConfig // fixed at declare
	epoch time.Time   // the zero of the queue's clock (see ttl.go)

	// mu guards every field below. It is never held while user code runs, and no other queue's
	// lock is ever taken while it is held. The broker's topology lock, when needed, is taken
	// before it, never after.
	mu          sync.Mutex
	ready       readySet
	nextSeq     uint64                      // sequence id of the next enqueued message
	holders     []*Consumer                 // consumers not ended: active, or cancelled and holding deliveries
	gets        ring[*Delivery]             // Get deliveries in tag order, outstanding ones and settled holes
	getsLive    int                         // outstanding Get deliveries in gets
	consumers   []*Consumer                 // active push consumers, by priority then arrival (dispatch.go)
	feeders     []*Consumer                 // active AutoAck consumers, which pull through their own goroutine
	standby     []*Consumer                 // single active consumer: those waiting their turn, in order
	order       []*Consumer                 // consumers and feeders by priority, for the general dispatch
	general     bool                        // dispatch must heed priorities or selectors
	exclusive   bool                        // the active consumer is exclusive
	rr          int                         // round-robin cursor into consumers (simple dispatch)
	pass        uint64                      // general dispatch passes, to mark consumers found wanting
	turns       uint64                      // deliveries made by the general dispatch, for round-robin
	hadConsumer bool                        // for auto-delete: a consumer ever existed
	gotTag      uint64                      // last delivery tag issued to a Get
	arriving    uint64                      // seq of the message being enqueued, which TTL 0 lets through once
	timer       *time.Timer                 // the queue's one timer, armed for the earliest deadline
	timerAt     int64                       // the deadline the timer is armed for; 0 when stopped
	outbox      []Event                     // events and dead letters collected, not yet taken by the flusher
	flushing    bool                        // a goroutine is emptying the outbox (see unlock)
	queuedDead  uint64                      // dead letters ever put in the outbox
	flushedDead uint64                      // of those, published (or discarded by the queue's end)
	n           counters                    // what Stats reports (stats.go)
	flushed     sync.Cond                   // on mu: flushedDead grew
	blocked     []blockedPublisher          // publishers waiting for room (Block), first come first woken
	lastUsed    int64                       // when the queue was last used, for Expires
	delayed     *btree.BTreeG[delayedEntry] // hidden until due: NackWithDelay, DeliverAfter; nil until used
	unacked     int                         // deliveries outstanding, all consumers and Gets
	ackTimed    int                         // holders with an ack timeout (ttl.go)
	endErr      error                       // non-nil once the queue is deleted or its broker closed
	slab        []Delivery                  // the next deliveries to hand out
	ownerStop   func() bool                 // an exclusive queue: stops watching its owner context
	scan        selectorScan                // the selector scan in progress (dispatch.go)
	panics      []selectorPanic             // selector panics to log once mu is released
	// leaving are the stopped AutoAck consumers whose feeders have not yet put back what they
	// hold: those messages are older than anything that could go out meanwhile, so dispatch,
	// feeders' own takes and hand-offs wait while there are any (a context end's messages are all
	// back before anything is dispatched, requeue.go). A single active consumer's successor is
	// activated at once and receives once they are back. (They may have left holders already:
	// the queue's end finds their hand-offs here.)
	leaving []*Consumer
	// ending are the consumers a context end (or an ack timeout, or Close) ended whose Done is
	// not yet closed: it is, once the dead letters of what they held are out (finishOrphans).
	ending      []*Consumer
	stamps      ring[stamp]            // arrival times, sampled (stats.go)
	pruneStamps int                    // prune stamps when there are this many
	alertStates [alertKinds]alertState // per threshold of cfg.alerts (stats.go)
	doomed      error                  // the Delete policy's reason, until unlock deletes the queue
}

func newQueue(b *Broker, name string, cfg queueConfig) *Queue {
	q := &Queue{
		b: b, name: name, cfg: cfg, epoch: time.Now(),
		ready: newReadySet(b.freeNodes, cfg.levels()), nextSeq: 1,
		lastUsed: 1,
	}
	q.flushed.L = &q.mu
	q.scan.visit = q.selectorVisit
	return q
}

// Name returns the queue's name; for a server-named queue, the generated "amq.gen-…" name.
func (q *Queue) Name() string { return q.name }

// Len returns the number of ready messages: those waiting for a consumer, not those delivered
// and unacknowledged (AMQP's message_count).
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.readUnlock()
	return q.ready.len()
}

// Unacked returns the number of deliveries of this queue that are outstanding: delivered (or
// buffered for a consumer) and not yet settled.
func (q *Queue) Unacked() int {
	q.mu.Lock()
	defer q.readUnlock()
	return q.unacked
}

// ConsumerCount returns the number of active consumers (AMQP's consumer_count), counting those
// waiting their turn on a single-active-consumer queue.
func (q *Queue) ConsumerCount() int {
	q.mu.Lock()
	defer q.readUnlock()
	return q.consumerCountLocked()
}

// unlock releases mu, first arming the timer for the earliest deadline, then empties the outbox:
// the events and dead letters the critical section collected. Every critical section that may
// expire or reject a message, or record an event, ends with unlock rather than mu.Unlock.
//
// The outbox is emptied outside the lock, since listeners are user code and dead letters go into
// other queues (never two queue locks at once), and in the order it was filled, whichever
// goroutine filled it (and a queue's events in order): one goroutine at a time — the first
// to find no flush in progress — takes the outbox batch by batch until it is empty. A dead letter
// routed back into this queue, or a listener publishing into it, adds to the outbox of the flush
// in progress, so nothing waits on itself.
func (q *Queue) unlock() {
	if q.panics != nil {
		defer q.logPanics(q.panics) // after mu is released
		q.panics = nil
	}
	if q.cfg.alerting && q.endErr == nil {
		q.checkAlertsLocked(0)
		if err := q.doomed; err != nil {
			// Synchronously, after mu is released: the broker's lock comes first. This goroutine
			// may be a feeder of the queue, which is why deleteByPolicy does not wait for feeders.
			defer q.b.deleteByPolicy(q, err)
			q.doomed = nil
		}
	}
	if q.timerAt != 0 || q.ready.expiries.Len() > 0 || q.cfg.expires > 0 || q.delayed != nil || q.ackTimed > 0 ||
		q.cfg.alerts.Age > 0 || q.getsLive > 0 && q.cfg.ackTimeout > 0 {
		q.armLocked()
	}
	if len(q.blocked) > 0 && q.roomLocked(q.blocked[0].need) {
		close(q.blocked[0].ready) // the first waiting publisher tries again
		q.blocked = q.blocked[1:]
	}
	if q.flushing || len(q.outbox) == 0 {
		q.mu.Unlock()
		q.b.idle.pokeIfWaiting()
		return
	}
	q.flushing = true
	for len(q.outbox) > 0 {
		batch := q.outbox
		q.outbox = nil
		q.mu.Unlock()
		dead, lost := q.b.flush(q, batch)
		q.mu.Lock()
		if q.outbox == nil && cap(batch) <= 256 {
			// Reused, so that a queue whose listeners hear every message does not allocate
			// an outbox per critical section.
			clear(batch)
			q.outbox = batch[:0]
		}
		if dead+lost > 0 {
			q.n.deadLettered += dead
			q.n.dropped += lost
			q.flushedDead += dead + lost
			q.flushed.Broadcast()
		}
	}
	q.flushing = false
	q.mu.Unlock()
	// Only now: a WaitIdle that began during the flush saw it in progress and waits for this.
	q.b.idle.pokeIfWaiting()
}

// readUnlock ends a critical section that only read: it changed nothing unlock would act on,
// and must not count as a change for WaitIdle (a goroutine polling Len would keep it waiting).
func (q *Queue) readUnlock() { q.mu.Unlock() }

// flushOutbox empties the outbox of a queue that was ended by a caller holding the broker's lock,
// once that is released.
func (q *Queue) flushOutbox() {
	q.mu.Lock()
	q.unlock()
}

// waitFlushedLocked waits until every dead letter collected so far has been published.
func (q *Queue) waitFlushedLocked() {
	for target := q.queuedDead; q.flushedDead < target; {
		q.flushed.Wait()
	}
}

// enqueue appends a published message, with message TTL ttl (-1 for none), and dispatches; with
// a delay, the message takes its place in the queue now but stays hidden until the delay passes
// (see [DeliverAfter]); with immediate, it is taken out again, and [ErrNoConsumers] returned, if
// no consumer took it at once (see [Immediate]). It returns the queue's end error if the queue
// was deleted after routing chose it, and [ErrQueueFull] when a length limit refuses the
// message. With the Block policy it waits for room until ctx ends; a ctx already done (a dead
// letter's) makes it refuse at once instead.
func (q *Queue) enqueue(ctx context.Context, env *envelope, ttl time.Duration, opt publishConfig) error {
	q.mu.Lock()
	for {
		if q.endErr != nil {
			err := q.endErrLocked()
			q.dropLocked(env, q.endReasonLocked()) // routed here, and the queue went meanwhile
			q.unlock()
			return err
		}
		if !q.cfg.limited() || q.cfg.overflow == DropHead || q.roomLocked(len(env.msg.Body)) {
			break
		}
		// RejectPublish, RejectPublishDLX and Block check before enqueueing.
		// Immediate never waits, nor does a body larger than the byte limit: it never fits.
		if q.cfg.overflow == Block && ctx.Err() == nil && !opt.immediate &&
			(q.cfg.maxBytes < 0 || int64(len(env.msg.Body)) <= q.cfg.maxBytes) {
			if err := q.waitRoomLocked(ctx, len(env.msg.Body)); err != nil {
				q.dropLocked(env, ReasonQueueFull)
				q.unlock()
				return err
			}
			continue
		}
		if q.cfg.overflow == RejectPublishDLX && q.cfg.hasDLX {
			q.deadLetterLocked(entry{env: env}, ReasonMaxLen)
		} else {
			q.dropLocked(env, ReasonQueueFull)
		}
		q.unlock()
		return errorf("queue %q: %w", q.name, ErrQueueFull)
	}
	e := entry{env: env, seq: q.nextSeq}
	if p := q.cfg.maxPriority; p > 0 {
		e.rank = uint8(p - min(p, int(env.msg.Priority))) // above the maximum counts as the maximum
	}
	var now int64
	if ttl >= 0 || q.cfg.ttl >= 0 {
		now = q.clock()
		e.deadline = q.deadlineFor(now, ttl)
	}
	if q.cfg.alerting && q.cfg.alerts.MessageSize > 0 {
		q.alertStates[alertSize].over = false // each message is a crossing of its own
		now = q.crossLocked(alertSize, len(env.msg.Body) >= q.cfg.alerts.MessageSize,
			int64(len(env.msg.Body)), int64(q.cfg.alerts.MessageSize), env, now)
	}
	at := len(q.outbox) // where the Enqueued event goes, once the message is known to stay
	q.nextSeq++
	if opt.delay > 0 {
		q.enqueuedLocked(env, at, opt.deadReason)
		q.pushStampLocked(e.seq, now)
		q.delayLocked(e, opt.delay)
		q.unlock()
		return nil
	}
	if opt.immediate || !q.deliverArrivingLocked(e) {
		q.ready.push(e)
		q.arriving = e.seq
		q.dispatchLocked()
		q.arriving = 0
	}
	if opt.immediate {
		q.handOffLocked(e)
		if _, ok := q.ready.remove(e.key()); ok { // no consumer took it: it was never here
			q.dropLocked(env, ReasonNoConsumers)
			q.unlock()
			return errorf("queue %q: %w", q.name, ErrNoConsumers)
		}
	}
	q.enqueuedLocked(env, at, opt.deadReason)
	q.stampLocked(e, now)
	if ttl == 0 || q.cfg.ttl == 0 {
		q.handOffLocked(e)
		q.expireDueLocked(q.clock()) // a TTL-0 message no consumer took expires now
	}
	q.dropHeadLocked()
	q.unlock()
	return nil
}

// enqueuedLocked counts a message that entered the queue and, if anyone listens, puts its
// Enqueued event at outbox position at: before the events of its dispatch, which happened first
// so that an Immediate publish no consumer took is never evented as enqueued.
func (q *Queue) enqueuedLocked(env *envelope, at int, reason Reason) {
	q.n.enqueued++
	if !q.b.listening() {
		return
	}
	e := Event{Kind: EventEnqueued, Queue: q.name, Exchange: env.exchange.name, RoutingKey: env.routingKey,
		Message: &env.msg, Reason: reason}
	if at >= len(q.outbox) {
		q.outbox = append(q.outbox, e)
	} else {
		q.outbox = slices.Insert(q.outbox, at, e)
	}
}

// handOffLocked gives an arriving TTL-0 message that no push consumer took to a waiting AutoAck
// consumer, if it is the only ready message: a consumer can take it as it arrives, so it must
// not expire. A feeder takes messages only after this critical section, so an idle one is
// handed the message here.
func (q *Queue) handOffLocked(e entry) {
	// The general dispatch hands feeders their messages itself; and nothing goes out while a
	// stopped feeder puts back older messages (see leaving).
	if q.ready.len() != 1 || q.general || len(q.leaving) > 0 {
		return
	}
	for _, c := range q.feeders {
		if c.idle && !c.handing {
			if got, ok := q.ready.remove(e.key()); ok {
				c.handoff, c.handing = got, true
				c.wakeLocked()
			}
			return
		}
	}
}

// roomLocked reports whether a message of n body bytes fits within the queue's length limits.
func (q *Queue) roomLocked(n int) bool {
	return (q.cfg.maxLen < 0 || int64(q.ready.len()) < q.cfg.maxLen) &&
		(q.cfg.maxBytes < 0 || q.ready.bytes+int64(n) <= q.cfg.maxBytes)
}

// dropHeadLocked enforces the length limits of a drop-head queue: while over a limit, it drops
// the head (the oldest, or the first returned) and dead-letters it with reason maxlen.
func (q *Queue) dropHeadLocked() {
	if !q.cfg.limited() || q.cfg.overflow != DropHead {
		return
	}
	q.dropOverLocked(q.cfg.maxLen, q.cfg.maxBytes)
}

// dropOverLocked drops the head while the queue holds more than maxLen ready messages or maxBytes
// ready bytes (-1 for no limit), dead-lettering with reason maxlen, or expired if it had.
func (q *Queue) dropOverLocked(maxLen, maxBytes int64) {
	for (maxLen >= 0 && int64(q.ready.len()) > maxLen) || (maxBytes >= 0 && q.ready.bytes > maxBytes) {
		e, ok := q.ready.popMin()
		if !ok {
			return
		}
		reason := ReasonMaxLen
		if q.expiredLocked(e) {
			reason = ReasonExpired
		}
		q.deadLetterLocked(e, reason)
	}
}

// blockedPublisher is a publisher waiting for room for a body of need bytes in a Block queue.
type blockedPublisher struct {
	ready chan struct{} // closed when it may try again
	need  int
}

// waitRoomLocked waits, with mu released, until the queue may have room for a body of need bytes
// or ctx ends; it returns with mu held either way, and ctx.Err() if ctx ended. Publishers are
// woken in turn, each when there is room for its own body: one that does not fit yet holds up
// those behind it, as a queue does.
func (q *Queue) waitRoomLocked(ctx context.Context, need int) error {
	ready := make(chan struct{})
	q.blocked = append(q.blocked, blockedPublisher{ready, need})
	q.unlock()
	select {
	case <-ready:
		q.mu.Lock()
		return nil
	case <-ctx.Done():
		q.mu.Lock()
		if i := slices.IndexFunc(q.blocked, func(p blockedPublisher) bool { return p.ready == ready }); i >= 0 {
			q.blocked = slices.Delete(q.blocked, i, i+1)
		}
		// If this waiter had just been woken, the caller's unlock wakes the next.
		return ctx.Err()
	}
}

// takeLocked removes and returns the first ready message that has not expired, expiring (and
// dead-lettering) those that have on the way.
func (q *Queue) takeLocked() (entry, bool) {
	for {
		e, ok := q.ready.popMin()
		if !ok || !q.expiredLocked(e) {
			return e, ok
		}
		q.deadLetterLocked(e, ReasonExpired)
	}
}

// Get takes the first ready message, if any, without waiting: it returns [ErrEmpty] when the
// queue has no ready message (AMQP's get-empty). The delivery's MessageCount says how many ready
// messages remain.
//
// Unless [AutoAck] is given, the delivery must be settled. It belongs to ctx the way a consumer's
// deliveries belong to the consumer's context: if ctx ends while the delivery is unsettled, the
// message returns to its original position, redelivered; so it does when the delivery is held
// longer than the queue's "x-consumer-timeout", if it has one. Get does not block; a ctx already
// done fails the call with ctx.Err(). Of the options, only [AutoAck] applies to a Get; any other
// is refused with [ErrInvalidArgument].
func (q *Queue) Get(ctx context.Context, opts ...ConsumeOption) (*Delivery, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	autoAck := false
	if len(opts) > 0 {
		var err error // only here: the options' interface calls move their config to the heap
		if autoAck, err = getOptions(opts); err != nil {
			return nil, err
		}
	}
	q.mu.Lock()
	if q.endErr != nil {
		err := q.endErrLocked()
		q.unlock()
		return nil, errorf("get from queue %q: %w", q.name, err)
	}
	if err := q.checkUse("get", ctx); err != nil {
		q.unlock()
		return nil, err
	}
	e, ok := q.takeLocked()
	q.touchLocked() // a Get is a use, even of an empty queue
	if !ok {
		q.unlock()
		return nil, ErrEmpty
	}
	d := q.newDeliveryLocked(e)
	q.gotTag++
	d.DeliveryTag = q.gotTag
	d.MessageCount = q.ready.len()
	q.messageEventLocked(EventDelivered, e.env, "", "")
	if autoAck {
		d.state = deliveryAutoAcked
		q.n.acked++
		q.messageEventLocked(EventAcked, e.env, "", "")
	} else {
		q.unacked++
		q.gets.push(d)
		q.getsLive++
		if q.cfg.ackTimeout > 0 { // the queue's consumer timeout applies to Gets too, as in RabbitMQ
			d.due = later(q.clock(), q.cfg.ackTimeout)
		}
		if ctx.Done() != nil { // else ctx never ends, and there is nothing to watch
			// Registered under mu so that d.get is in place before anyone can settle d; the
			// callback takes mu itself, on its own goroutine, after ctx ends.
			d.get = &getOwner{ctx: ctx, stop: context.AfterFunc(ctx, q.reap)}
		}
	}
	q.unlock()
	return d, nil
}

// outstandingLocked yields every outstanding delivery of the queue: each consumer's in tag
// order, consumers in the order they started, then the Gets' in tag order.
func (q *Queue) outstandingLocked() iter.Seq[*Delivery] {
	return func(yield func(*Delivery) bool) {
		for _, c := range q.holders {
			for d := range outstanding(&c.unacked) {
				if !yield(d) {
					return
				}
			}
		}
		for d := range outstanding(&q.gets) {
			if !yield(d) {
				return
			}
		}
	}
}

// Browse returns the queue's ready messages in delivery order, without consuming them (AMQP
// has no browse; Qpid's browsing consumers do this): a snapshot taken when the iteration starts,
// in one critical section, then yielded with no lock held. Messages hidden by a delay and
// deliveries outstanding are not included. After the queue is deleted it yields nothing. The
// messages are shared with the queue: treat them as read-only.
func (q *Queue) Browse() iter.Seq[*Message] {
	return func(yield func(*Message) bool) {
		q.mu.Lock()
		var ms []*Message
		if q.endErr == nil {
			ms = make([]*Message, 0, q.ready.len())
			q.ready.ascend(0, func(e entry) bool {
				if !q.expiredLocked(e) {
					ms = append(ms, &e.env.msg)
				}
				return true
			})
		}
		q.readUnlock()
		for _, m := range ms {
			if !yield(m) {
				return
			}
		}
	}
}

// Purge removes every ready message and returns how many there were. Deliveries outstanding
// with consumers are not touched and may still come back (AMQP's queue.purge). An exclusive
// queue may be purged only on behalf of its owner ([As]; else [ErrResourceLocked]).
func (q *Queue) Purge(opts ...CallOption) (int, error) {
	cfg := callOptions(opts)
	if cfg.err != nil {
		return 0, cfg.err
	}
	q.mu.Lock()
	defer q.unlock()
	if q.endErr != nil {
		return 0, errorf("purge queue %q: %w", q.name, q.endErrLocked())
	}
	if err := q.checkUse("purge", cfg.owner); err != nil {
		return 0, err
	}
	q.dropReadyLocked(ReasonPurged)
	return q.ready.clear(), nil
}

// endErrLocked returns why the queue can no longer be used: [ErrClosed] once its broker has
// closed, even if the queue was deleted before; else the deletion error.
func (q *Queue) endErrLocked() error {
	if q.b.closed.Load() {
		return ErrClosed
	}
	return q.endErr
}

// endLocked deletes the queue's contents and ends its consumers with err, which is what every
// later call on the queue or its deliveries returns; reason is why, for its deletion event. Every
// message it held is evented as dropped. It returns the feeders to join after mu is released;
// the caller, which holds the broker's lock, empties the outbox once that is released
// ([Queue.flushOutbox]).
func (q *Queue) endLocked(err error, reason Reason) []*Consumer {
	if q.endErr != nil {
		return nil
	}
	q.endErr = err
	if q.timer != nil {
		q.timer.Stop()
		q.timerAt = 0
	}
	// What the queue held is dropped: ready, hidden, outstanding (buffered or received), and
	// dead letters not yet published (a deleted queue dead-letters nothing more).
	why := q.endReasonLocked()
	q.dropReadyLocked(why)
	if q.delayed != nil {
		q.delayed.Ascend(func(k delayedEntry) bool {
			q.dropLocked(k.e.env, why)
			return true
		})
		q.delayed = nil
	}
	for d := range q.outstandingLocked() {
		q.dropLocked(d.e.env, why)
	}
	for _, cs := range [...][]*Consumer{q.holders, q.leaving} {
		for _, c := range cs {
			if c.handing { // handed to an AutoAck consumer's goroutine, which has not taken it yet
				q.dropLocked(c.handoff.env, why)
				c.handoff, c.handing = entry{}, false
			}
		}
	}
	kept := q.outbox[:0]
	for _, e := range q.outbox {
		if e.Kind == eventDeadLetter {
			q.dropLocked(e.env, why)
			continue
		}
		kept = append(kept, e)
	}
	clear(q.outbox[len(kept):])
	q.outbox = kept
	q.flushedDead = q.queuedDead
	q.flushed.Broadcast()
	for _, p := range q.blocked {
		close(p.ready) // waiting publishers see endErr
	}
	q.blocked = nil
	var feeders []*Consumer
	for _, c := range q.holders {
		if c.autoAck {
			feeders = append(feeders, c)
		}
		c.stopLocked(err, nil, "") // the queue's messages are discarded (evented above)
		c.ended = true
		c.signalStopLocked()
		c.stopCtx()
	}
	for d := range outstanding(&q.gets) {
		d.stopWatching()
	}
	q.gets = ring[*Delivery]{}
	q.getsLive = 0
	q.holders, q.consumers, q.feeders, q.standby, q.order = nil, nil, nil, nil, nil
	q.ackTimed = 0
	q.leaving = nil
	if q.ownerStop != nil {
		q.ownerStop()
	}
	// The application may hold the *Queue long after: keep nothing it could reclaim.
	q.ready.clear() // returns its tree nodes to the broker's free list
	q.ready = newReadySet(q.b.freeNodes, q.cfg.levels())
	q.stamps = ring[stamp]{}
	q.slab = nil
	q.unacked = 0
	if q.b.listening() {
		q.eventLocked(Event{Kind: EventQueueDeleted, Reason: reason, Err: err})
	}
	return feeders
}

// dropReadyLocked counts and events every ready message as dropped with reason, before the
// ready set is cleared.
func (q *Queue) dropReadyLocked(reason Reason) {
	if !q.b.listening() {
		q.n.dropped += uint64(q.ready.len())
		return
	}
	q.ready.ascend(0, func(e entry) bool {
		q.dropLocked(e.env, reason)
		return true
	})
}

// getOptions applies a Get's options and returns whether it auto-acknowledges; every option
// but AutoAck is refused.
func getOptions(opts []ConsumeOption) (autoAck bool, err error) {
	cfg := defaultConsumeConfig()
	for _, o := range opts {
		if o != nil {
			o.applyConsume(&cfg)
		}
	}
	if cfg.prefetchSet || cfg.tag != "" || cfg.exclusive || cfg.priority != 0 || cfg.selector != nil ||
		cfg.ackTimeout != -1 || cfg.err != nil {
		return false, errorf("get: only AutoAck applies to a Get: %w", ErrInvalidArgument)
	}
	return cfg.autoAck, nil
}

package warren

import (
	"context"
	"iter"
	"slices"
	"sync"
	"time"

	"github.com/warrenmq/warren/internal/wal"
)

// Queue is an ordered store of messages with its consumers: RabbitMQ's classic queue. Ready
// messages are kept in order of their sequence id; a message that comes back (nack, recover, a
// consumer that ended) returns to its original position, marked redelivered.
//
// Obtain a Queue from [Broker.DeclareQueue] or [Broker.Queue]; the zero Queue is not usable.
// A Queue is safe for concurrent use. After the queue is deleted its methods return an error
// wrapping [ErrNotFound]; after the broker closes, [ErrClosed].
type Queue struct {
	b    *Broker
	name string
	cfg  queueConfig // fixed at declare

	// mu guards every field below. It is never held while user code runs, and no other queue's
	// lock is ever taken while it is held. The broker's topology lock, when needed, is taken
	// before it, never after. Every critical section ends with commit.
	mu          sync.Mutex
	core        queueCore          // the messages and deliveries (core.go)
	consumers   consumerSet        // the active consumers and those waiting their turn (dispatch.go)
	timer       *time.Timer        // the queue's one timer, armed for the earliest deadline
	timerAt     int64              // the deadline the timer is armed for; 0 when stopped
	flushing    bool               // a goroutine is applying effects (see commit)
	flushedDead uint64             // dead letters published (or discarded by the queue's end), of core.queuedDead
	heldAdded   int64              // what the queue's messages take in memory, as last added to the broker's memory budget (commit)
	flushed     sync.Cond          // on mu: flushedDead grew
	blocked     []blockedPublisher // publishers waiting for room (Block), first come first woken
	lastUsed    int64              // when the queue was last used, for Expires
	ackTimed    int                // holders with an ack timeout (ttl.go)
	// roomDue is when the timer looks whether unlimited-prefetch consumers have room again,
	// 0 for never; roomDelay the delay of the next look (unlimited.go).
	roomDue   int64
	roomDelay time.Duration
	endErr    error           // non-nil once the queue is deleted or its broker closed
	ownerStop func() bool     // an exclusive queue: stops watching its owner context
	scan      selectorScan    // the selector scan in progress (dispatch.go)
	panics    []selectorPanic // selector panics to log once mu is released
	selecting Message         // the message a selector is looking at (acceptsLocked)
	// leaving are the stopped AutoAck consumers whose feeders have not yet put back what they
	// hold: those messages are older than anything that could go out meanwhile, so dispatch,
	// feeders' own takes and hand-offs wait while there are any (a context end's messages are all
	// back before anything is dispatched, requeue.go). A single active consumer's successor is
	// activated at once and receives once they are back. (They may have left the holders
	// already: the queue's end finds their hand-offs here.)
	leaving []*Consumer
	// ending are the consumers a context end (or an ack timeout, or Close) ended whose Done is
	// not yet closed: it is, once the dead letters of what they held are out (finishOrphans).
	ending      []*Consumer
	alertStates [alertKinds]alertState // per threshold of cfg.alerts (alerts.go)
	log         *queueLog              // a durable queue of a durable broker: what it logs (store.go); nil otherwise
	doomed      error                  // the Delete policy's reason, until commit deletes the queue
}

func newQueue(b *Broker, name string, cfg queueConfig) *Queue {
	q := &Queue{b: b, name: name, cfg: cfg, lastUsed: 1}
	q.core = newCore(&q.cfg, b.freeNodes, &b.listeners.list)
	if b.store != nil && cfg.durable && cfg.owner == nil {
		q.log = &queueLog{}
		q.log.keep.Store(new([]*listener))
		q.core.heard = &q.log.keep
		if w := b.cfg.pageWindow; w > 0 {
			q.core.ready.paged.window = w
			q.core.ready.paged.read = q.readPaged
		}
	}
	q.flushed.L = &q.mu
	q.scan.visit = q.selectorVisit
	return q
}

// Name returns the queue's name; for a server-named queue, the generated "amq.gen-…" name.
func (q *Queue) Name() string { return q.name }

// Len returns the number of ready messages: those waiting for a consumer, not those delivered
// and unacknowledged (AMQP's message_count).
func (q *Queue) Len() (n int) {
	q.view(func() { n = q.core.ready.len() })
	return n
}

// Unacked returns the number of deliveries of this queue that are outstanding: delivered (or
// buffered for a consumer) and not yet settled.
func (q *Queue) Unacked() (n int) {
	q.view(func() { n = q.core.unacked })
	return n
}

// ConsumerCount returns the number of active consumers (AMQP's consumer_count), counting those
// waiting their turn on a single-active-consumer queue.
func (q *Queue) ConsumerCount() (n int) {
	q.view(func() { n = q.consumers.count() })
	return n
}

// enqueue appends a published message, with message TTL ttl (-1 for none), and dispatches; with
// a delay, the message takes its place in the queue now but stays hidden until the delay passes
// (see [DeliverAfter]); with immediate, it is taken out again, and [ErrNoConsumers] returned, if
// no consumer took it at once (see [Immediate]). It returns the queue's end error if the queue
// was deleted after routing chose it, and [ErrQueueFull] when a length limit refuses the
// message (a moving message's refusal by a reject-publish-dlx queue is left to the mover,
// refuseMoving, which records it). With the Block policy it waits for room until ctx ends; a
// ctx already done (a dead letter's) makes it refuse at once instead.
func (q *Queue) enqueue(ctx context.Context, env *envelope, ttl time.Duration, opt publishConfig) (wal.LSN, error) {
	q.mu.Lock()
	for {
		if q.endErr != nil {
			err := q.endErrLocked()
			q.core.drop(entry{env: env}, q.endReasonLocked()) // routed here, and the queue went meanwhile
			q.commit()
			return 0, err
		}
		if q.cfg.refusesOnAlarm() && q.b.mem.over.Load() && opt.deadReason == "" && !opt.moving && !opt.immediate {
			// The broker is over its memory budget (memory.go): refused, and not dead-lettered,
			// since the dead letter would take the memory the refusal saves.
			q.core.drop(entry{env: env}, ReasonMemoryAlarm)
			q.commit()
			return 0, errorf("queue %q: the broker is over its memory limit: %w", q.name, ErrQueueFull)
		}
		if !q.cfg.limited() || q.cfg.overflow == DropHead || q.core.room(int(env.size)) {
			break
		}
		// RejectPublish, RejectPublishDLX and Block check before enqueueing.
		// Immediate never waits, nor does a body larger than the byte limit: it never fits.
		if q.cfg.overflow == Block && ctx.Err() == nil && !opt.immediate &&
			(q.cfg.maxBytes < 0 || int64(int(env.size)) <= q.cfg.maxBytes) {
			if err := q.waitRoomLocked(ctx, int(env.size), opt.blocked); err != nil {
				q.core.drop(entry{env: env}, ReasonQueueFull)
				q.commit()
				return 0, err
			}
			continue
		}
		switch {
		case q.cfg.refusesToDLX() && opt.moving:
			// Whether to dead-letter it depends on whether another queue takes it: the
			// mover decides, once the publish has been to every queue (refuseMoving).
		case q.cfg.refusesToDLX():
			q.core.deadLetter(entry{env: env}, ReasonMaxLen)
		default:
			q.core.drop(entry{env: env}, ReasonQueueFull)
		}
		q.commit()
		return 0, errorf("queue %q: %w", q.name, ErrQueueFull)
	}
	e := entry{env: env}
	now := q.core.admit(&e, ttl)
	if q.cfg.alerting && q.cfg.alerts.MessageSize > 0 {
		q.alertStates[alertSize].over = false // each message is a crossing of its own
		now = q.crossLocked(alertSize, int(env.size) >= q.cfg.alerts.MessageSize,
			int64(int(env.size)), int64(q.cfg.alerts.MessageSize), env, now)
	}
	at := q.core.mark() // where its Enqueued effect goes, once the message is known to stay
	if opt.delay > 0 {
		q.core.enqueued(e, at, opt.deadReason)
		q.core.pushStamp(e.seq, now)
		q.core.delay(e, opt.delay)
		return q.commit(), nil
	}
	if opt.immediate || !q.deliverArrivingLocked(e) {
		q.pushArrivingLocked(e)
		q.core.arriving = e.seq
		q.dispatchLocked()
		q.core.arriving = 0
	}
	if opt.immediate {
		q.handOffLocked(e)
		if _, ok := q.core.ready.remove(e.key()); ok || q.core.ready.unpageNewest(e) { // no consumer took it: it was never here
			q.core.drop(e, ReasonNoConsumers)
			q.commit()
			return 0, errorf("queue %q: %w", q.name, ErrNoConsumers)
		}
	}
	q.core.enqueued(e, at, opt.deadReason)
	q.core.stamp(e, now)
	if ttl == 0 || q.cfg.ttl == 0 {
		q.handOffLocked(e)
		q.core.expireDue(q.core.clock()) // a TTL-0 message no consumer took expires now
	}
	q.core.dropHead()
	return q.commit(), nil
}

// blockedPublisher is a publisher waiting for room for a body of need bytes in a Block queue.
type blockedPublisher struct {
	ready chan struct{} // closed when it may try again
	need  int
}

// waitRoomLocked waits, with mu released, until the queue may have room for a body of need bytes
// or ctx ends; it returns with mu held either way, and ctx.Err() if ctx ended. Publishers are
// woken in turn, each when there is room for its own body: one that does not fit yet holds up
// those behind it, as a queue does. told, if not nil, is told (with mu released) that the
// publisher waits, and that it no longer does.
func (q *Queue) waitRoomLocked(ctx context.Context, need int, told func(bool)) error {
	ready := make(chan struct{})
	q.blocked = append(q.blocked, blockedPublisher{ready, need})
	q.commit()
	if told != nil {
		told(true)
	}
	woken := false
	select {
	case <-ready:
		woken = true
	case <-ctx.Done():
	}
	if told != nil {
		told(false)
	}
	q.mu.Lock()
	if woken {
		return nil
	}
	if i := slices.IndexFunc(q.blocked, func(p blockedPublisher) bool { return p.ready == ready }); i >= 0 {
		q.blocked = slices.Delete(q.blocked, i, i+1)
	}
	// If this waiter had just been woken, the caller's commit wakes the next.
	return ctx.Err()
}

// Get takes the first ready message, if any, without waiting: it returns [ErrEmpty] when the
// queue has no ready message (AMQP's get-empty), and an error wrapping [ErrStorage] when the
// next one is on disk (a durable queue's backlog) and could not be read back. The delivery's
// MessageCount says how many ready messages remain.
//
// Unless [AutoAck] is given, the delivery must be settled. It belongs to ctx the way a consumer's
// deliveries belong to the consumer's context: if ctx ends while the delivery is unsettled, the
// message returns to its original position, redelivered; so it does when the delivery is held
// longer than the queue's "x-consumer-timeout", if it has one. Get does not block; a ctx already
// done fails the call with ctx.Err(). Of the options, only [AutoAck] applies to a Get; any other
// is refused with [ErrInvalidArgument].
func (q *Queue) Get(ctx context.Context, opts ...ConsumeOption) (Delivery, error) {
	if err := ctx.Err(); err != nil {
		return Delivery{}, err
	}
	autoAck := false
	if len(opts) > 0 {
		var err error // only here: the options' interface calls move their config to the heap
		if autoAck, err = getOptions(opts); err != nil {
			return Delivery{}, err
		}
	}
	q.mu.Lock()
	if q.endErr != nil {
		err := q.endErrLocked()
		q.commit()
		return Delivery{}, errorf("get from queue %q: %w", q.name, err)
	}
	if err := q.checkUse("get", ctx, byContext); err != nil {
		q.commit()
		return Delivery{}, err
	}
	e, ok := q.core.take()
	q.touchLocked() // a Get is a use, even of an empty queue
	if !ok {
		var err error
		if p := &q.core.ready.paged; p.n > 0 {
			err = p.err // the first message is on disk, and could not be read back
		}
		q.commit()
		if err != nil {
			return Delivery{}, errorf("get from queue %q: %w", q.name, err)
		}
		return Delivery{}, ErrEmpty
	}
	var due int64
	if q.cfg.ackTimeout > 0 && !autoAck { // the queue's consumer timeout applies to Gets too, as in RabbitMQ
		due = later(q.core.clock(), q.cfg.ackTimeout)
	}
	var d Delivery
	q.deliverLocked(&d, &q.core.gets, e, autoAck, due)
	d.MessageCount = q.core.ready.len()
	if !autoAck && ctx.Done() != nil { // else ctx never ends, and there is nothing to watch
		// Registered under mu so that the record's get is in place before anyone can settle
		// d; the callback takes mu itself, on its own goroutine, after ctx ends.
		d.lease.get = &getOwner{ctx: ctx, stop: context.AfterFunc(ctx, q.reap)}
	}
	q.commit()
	return d, nil
}

// Browse returns the queue's ready messages in delivery order, without consuming them (AMQP
// has no browse; Qpid's browsing consumers do this): a snapshot taken when the iteration starts,
// in one critical section, then yielded with no lock held. Messages hidden by a delay and
// deliveries outstanding are not included. After the queue is deleted it yields nothing. The
// messages are the queue's, or copies of them: treat them as read-only.
func (q *Queue) Browse() iter.Seq[*Message] {
	return func(yield func(*Message) bool) {
		var ms []*Message
		q.view(func() {
			if q.endErr != nil {
				return
			}
			ms = make([]*Message, 0, q.core.ready.len())
			q.core.ready.ascendWithPaged(0, func(e entry) bool { // a chunk that cannot be read ends it
				if !q.core.expired(e) {
					ms = append(ms, e.env.messagePtr())
				}
				return true
			})
		})
		for _, m := range ms {
			if !yield(m) {
				return
			}
		}
	}
}

// ReadyMessage is a ready message as [Queue.BrowseFrom] shows it.
type ReadyMessage struct {
	// ID is the message's place in the queue's delivery order: ascending IDs are delivery
	// order, and a message keeps its ID while it is in the queue, also when it comes back to
	// its place after a delivery. For [Queue.BrowseFrom] and [MoveIDs]; not the same across
	// queues, nor a [Message.MessageID].
	ID            uint64
	Message       *Message // the queue's, or a copy: read-only
	Redelivered   bool     // it was delivered before and came back
	DeliveryCount int      // how many times it came back (x-delivery-count)
}

// BrowseFrom returns up to n of the queue's ready messages in delivery order, those after the
// one with ID after (0: from the head), without consuming them: a page of what [Queue.Browse]
// yields, with IDs, for paging through a long queue. It takes the queue lock once, for a seek
// and n entries' copy, with no allocation under it for a page of up to 64: the seek reads a few
// entries in a queue whose messages arrived one after another and came back, if at all, one at
// a time; O(log(size)) at worst. Messages hidden by a
// delay and deliveries outstanding are not included. After the queue is deleted it returns
// nothing.
func (q *Queue) BrowseFrom(after uint64, n int) []ReadyMessage {
	if n <= 0 {
		return nil
	}
	// Under the lock only the entries are copied (allocated before it, for a page of up to
	// 64): the messages are built after it, from their envelopes, which do not change once
	// published, so that a page holds the lock about as long as Stats does.
	es := make([]entry, 0, min(n, 64))
	from := after
	if after != 0 {
		from++
	}
	q.view(func() { es = q.readyPageLocked(from, n, es) })
	if len(es) == 0 {
		return nil
	}
	out := make([]ReadyMessage, len(es))
	for i, e := range es {
		out[i] = ReadyMessage{ID: e.key(), Message: e.env.messagePtr(), Redelivered: e.redelivered, DeliveryCount: int(e.returns)}
	}
	return out
}

// readyPageLocked appends to es up to n unexpired ready entries with keys from from on, in
// delivery order: BrowseFrom's critical section.
func (q *Queue) readyPageLocked(from uint64, n int, es []entry) []entry {
	if q.endErr != nil {
		return es
	}
	q.core.ready.ascendWithPaged(from, func(e entry) bool { // a chunk that cannot be read ends the page
		if !q.core.expired(e) {
			es = append(es, e)
		}
		return len(es) < n
	})
	return es
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
	defer q.commit()
	if q.endErr != nil {
		return 0, errorf("purge queue %q: %w", q.name, q.endErrLocked())
	}
	if err := q.checkUse("purge", cfg.owner, byAs); err != nil {
		return 0, err
	}
	return q.core.purge(ReasonPurged), nil
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
// the caller, which holds the broker's lock, applies the effects once that is released
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
	// What the queue held is dropped: what was handed to an AutoAck consumer's goroutine and not
	// yet taken, then everything the core holds (see queueCore.end).
	why := q.endReasonLocked()
	for _, h := range q.core.holders {
		q.dropHandoffLocked(h.c, why)
	}
	for _, c := range q.leaving {
		q.dropHandoffLocked(c, why)
	}
	q.core.end(why)
	q.flushedDead = q.core.queuedDead
	q.flushed.Broadcast()
	for _, p := range q.blocked {
		close(p.ready) // waiting publishers see endErr
	}
	q.blocked = nil
	var feeders []*Consumer
	for _, h := range q.core.holders {
		c := h.c
		if c.autoAck {
			feeders = append(feeders, c)
		}
		c.stopLocked(err, nil, "") // the queue's messages are discarded (dropped above)
		c.ended = true
		c.signalStopLocked()
		c.stopCtx()
	}
	for r := range q.core.gets.outstanding() {
		if r.get != nil {
			r.get.stop()
		}
	}
	q.core.reset(q.b.freeNodes) // the application may hold the *Queue long after
	q.consumers = consumerSet{had: true}
	q.ackTimed = 0
	q.leaving = nil
	if q.ownerStop != nil {
		q.ownerStop()
	}
	if q.b.listening() {
		q.eventLocked(Event{Kind: EventQueueDeleted, Reason: reason, Err: err})
	}
	return feeders
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

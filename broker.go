package warren

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/google/btree"
	"github.com/warrenmq/warren/internal/wal"
)

// freeNodesMax bounds the btree nodes a broker keeps for reuse (about 2 KiB each): enough for
// the returns of a holding of about 10k messages without allocating.
const freeNodesMax = 256

// Broker is a namespace of exchanges, queues and bindings: RabbitMQ's virtual host, in process.
// Create one with [New]; the zero Broker is not usable. A Broker is safe for concurrent use.
//
// [Broker.Close] ends it: every consumer stops, every later call returns [ErrClosed], and no
// goroutine of the broker's is left running.
type Broker struct {
	cfg       brokerConfig
	closed    atomic.Bool    // set first thing by Close; read without locks
	closeOnce sync.Once      // Close's work, which every Close call waits for
	closeErr  error          // what Close returns; set by closeOnce's work
	wg        sync.WaitGroup // what Close waits for: AutoAck feeders, owner-ended deletions, moves
	routers   sync.Pool      // *router scratch space for publishing
	listeners listeners      // event listeners (events.go)
	idle      idleWaiters    // WaitIdle (idle.go)
	// unroutable counts publishes that reached no queue (BrokerStats).
	unroutable atomic.Uint64
	// mem is the budget for the messages the broker holds (memory.go).
	mem memoryBudget
	// store is the log of a durable broker (store.go); nil for one in memory only.
	store *store
	// noWait is a context that is already done: an internal publish (a dead letter) passes it so
	// that a full queue with the Block policy refuses it instead of waiting.
	noWait context.Context
	// freeNodes is the btree node free list shared by the broker's queues; safe for concurrent
	// use. It keeps at most freeNodesMax nodes.
	freeNodes *btree.FreeListG[entry]

	// mu guards the topology: the two maps, and every exchange's bindings and deleted flag.
	// Publishing holds it for reading while routing only, never while enqueueing. It is taken
	// before a queue's mu, never after.
	mu        sync.RWMutex
	defaultX  *Exchange // the default exchange "", also in exchanges; set once by New
	exchanges map[string]*Exchange
	queues    map[string]*Queue
	// byName is queues again, for the default exchange's publish (publishDefault): a lookup
	// without mu, whose read lock, taken by every publisher, made them contend on one cache
	// line. Changed with queues, under mu.
	byName sync.Map // string → *Queue
	// topology are the events of the topology change in progress, emitted by unlockTopology
	// once mu is released.
	topology []Event
}

// unlockTopology releases the topology lock taken for writing and emits the events of the
// change made under it.
func (b *Broker) unlockTopology() {
	evs := b.topology
	b.topology = nil
	var logged wal.LSN
	if b.store != nil {
		logged, b.store.topology = b.store.topology, 0
	}
	b.mu.Unlock()
	b.emitAll(evs)
	// A full disk makes this wait for space (or for Close, which ends the wait).
	if err := b.confirm(context.Background(), logged); err != nil {
		// The durable topology change is in memory, not surely in the log; the log failed,
		// and every later publish to a durable queue says so.
		b.cfg.logger.Error("warren: durable log: a topology change is not logged", "err", err)
	}
}

// topologyEventLocked records an event of the topology change in progress, if anyone listens.
func (b *Broker) topologyEventLocked(e Event) {
	if b.listening() {
		b.topology = append(b.topology, e)
	}
}

// New returns a broker with the predeclared exchanges, all durable: the default exchange ""
// (a direct exchange to which every queue is bound by its name), "amq.direct", "amq.fanout",
// "amq.topic", "amq.headers" and "amq.match" (a headers exchange).
func New(opts ...BrokerOption) *Broker {
	b := &Broker{
		cfg:       defaultBrokerConfig(),
		exchanges: make(map[string]*Exchange),
		queues:    make(map[string]*Queue),
		freeNodes: btree.NewFreeListG[entry](freeNodesMax),
	}
	for _, o := range opts {
		if o != nil {
			o.applyBroker(&b.cfg)
		}
	}
	for _, fn := range b.cfg.listeners {
		b.Listen(fn)
	}
	b.mem.limit = memoryLimitFor(b.cfg)
	b.routers.New = func() any { return new(router) }
	noWait, cancel := context.WithCancel(context.Background())
	cancel()
	b.noWait = noWait
	for _, p := range []struct{ name, kind string }{
		{"", ExchangeDirect},
		{"amq.direct", ExchangeDirect},
		{"amq.fanout", ExchangeFanout},
		{"amq.topic", ExchangeTopic},
		{"amq.headers", ExchangeHeaders},
		{"amq.match", ExchangeHeaders},
	} {
		b.exchanges[p.name] = newExchange(b, p.name, p.kind, exchangeConfig{durable: true})
	}
	b.defaultX = b.exchanges[""]
	return b
}

// Close ends the broker: every queue's consumers stop (their Deliveries channels close and
// [Consumer.Err] returns [ErrClosed]), every message is discarded, and every later call on the
// broker, its exchanges, queues, consumers and deliveries returns an error wrapping [ErrClosed].
// Close waits for the broker's goroutines to exit, and for each [Queue.Move] to settle the
// message it has on its way (which, the queues ended, takes no longer than the publish in
// progress). It is idempotent: every call returns what the first returned, which is nil for a
// broker from [New].
//
// A durable broker's persistent messages in durable queues stay in its log, with the
// acknowledgements made so far; Close first compacts the log close to what is live, so that
// the next [Open] reads little more than what it restores, then writes and syncs it. If it
// cannot — the log failed before, or the disk is full (Close tries once, and waits for no
// space) — it returns an error wrapping [ErrStorage]: what the log could not write is lost,
// and the next Open finds what was written before. Publishes and declarations still waiting
// for the log then return [ErrStorage] too.
func (b *Broker) Close() error {
	b.closeOnce.Do(func() {
		if b.store != nil {
			// Nobody waits for space past this point: the log tries a stall's write once
			// more, and from now on a full disk fails it, waking every waiter (a feeder
			// deleting its queue may be one, and Close waits for feeders below).
			b.store.log.Closing()
			b.store.closing()
		}
		b.mu.Lock()
		b.closed.Store(true)
		b.mem.close() // publishers waiting for memory see the broker closed
		var ck *checkpoint
		if b.store != nil {
			ck = b.store.snapshot(b.durableQueues(), b.store.log.MarkNow(), b.store.nextQueue)
		}
		ended := slices.Collect(maps.Values(b.queues))
		for _, q := range ended {
			b.endQueueLocked(q, ErrClosed, ReasonClosed, nil)
		}
		clear(b.queues)
		b.byName.Clear()
		clear(b.exchanges)
		b.unlockTopology()
		for _, q := range ended {
			q.flushOutbox() // what the queues held, evented as dropped
		}
		b.announceMemory() // the queues' end cleared the alarm
		// Every feeder was started, and every move lent its message, under its queue's mu
		// before that queue ended, so none can be added from here on. A move settles before
		// the log closes: its message, in its destination's log, is not left in its source's.
		b.wg.Wait()
		if b.store != nil {
			b.closeErr = b.store.close(ck)
		}
	})
	return b.closeErr
}

// DeclareQueue declares a queue and returns it (AMQP's queue.declare). An empty name declares a
// server-named queue "amq.gen-…". Declaring an existing queue returns it when the declaration is
// equivalent (same [Durable], [AutoDelete] and recognised "x-" [Arguments]) and fails with
// [ErrPreconditionFailed] when it is not.
//
// Other errors: names longer than 255 bytes or not UTF-8 ([ErrInvalidArgument]), names starting
// with "amq." ([ErrAccessRefused]), a closed broker ([ErrClosed]).
func (b *Broker) DeclareQueue(name string, opts ...QueueOption) (_ *Queue, err error) {
	if b.closed.Load() {
		return nil, ErrClosed
	}
	var cfg queueConfig
	for _, o := range opts {
		if o != nil {
			o.applyQueue(&cfg)
		}
	}
	if name != "" {
		if err := checkName("queue", name); err != nil {
			return nil, err
		}
		if err := checkReserved("queue", name); err != nil {
			return nil, err
		}
	}
	if cfg.err != nil {
		return nil, errorf("declare queue %q: %w", name, cfg.err)
	}
	if err := checkTable(cfg.args); err != nil {
		return nil, errorf("declare queue %q: %w", name, err)
	}
	if err := cfg.parseArgs(); err != nil {
		return nil, errorf("declare queue %q: %w", name, err)
	}
	if cfg.owner != nil && cfg.owner.Err() != nil {
		return nil, errorf("declare exclusive queue %q: owner: %w", name, cfg.owner.Err())
	}
	var (
		created *Queue
		logged  wal.LSN // a durable queue's declaration, in the log
	)
	defer func() {
		if created != nil {
			created.flushOutbox() // its creation event, first of its events
		}
		if lerr := b.confirm(context.Background(), logged); lerr != nil && err == nil {
			err = errorf("declare queue %q: %w", name, lerr)
		}
	}()
	b.mu.Lock()
	defer b.unlockTopology()
	if b.closed.Load() {
		return nil, ErrClosed
	}
	if name == "" {
		for name == "" || b.queues[name] != nil {
			name = "amq.gen-" + rand.Text()
		}
	} else if q := b.queues[name]; q != nil {
		switch {
		case q.cfg.owner != nil && !q.usableBy(cfg.owner):
			return nil, lockedError("declare queue", name, byDeclare)
		case q.cfg.owner == nil && cfg.owner != nil:
			return nil, errorf("declare queue %q exclusive: it exists and is not: %w", name, ErrResourceLocked)
		}
		if err := q.cfg.equivalent(cfg); err != nil {
			return nil, errorf("declare queue %q: %w", name, err)
		}
		q.touch() // a declaration is a use
		return q, nil
	}
	// The queue becomes reachable only once it is whole: by its name in the index that the
	// default exchange's publish reads without mu (publishDefault) last of all, after its id in
	// the log and its creation event. A publish that found it earlier was logged under no queue
	// (lost at the next Open), and wrote the queue's effects beside its creation event.
	q := newQueue(b, name, cfg)
	if q.log != nil {
		logged = b.store.declareQueue(q)
	}
	if b.listening() {
		// Among the queue's effects, so that every listener hears of the queue before any of
		// its messages, also one a listener publishes on hearing of it.
		q.mu.Lock()
		q.eventLocked(Event{Kind: EventQueueCreated})
		q.release()
		created = q
	}
	if cfg.owner != nil {
		// Set under b.mu, before anything can end the queue; the callback takes b.mu.
		q.ownerStop = context.AfterFunc(cfg.owner, func() { b.deleteOwned(q) })
	}
	if cfg.expires > 0 {
		// Its declaration is its first use: the expiry runs from now, on the queue's timer,
		// also if nothing else ever happens to it (no commit of the queue's would arm it).
		q.mu.Lock()
		q.touchLocked()
		q.armLocked()
		q.release()
	}
	b.queues[name] = q
	b.byName.Store(name, q)
	return q, nil
}

// deleteOwned deletes an exclusive queue whose owner context ended.
func (b *Broker) deleteOwned(q *Queue) {
	counted := false
	q.view(func() {
		// Counted under mu before the queue ends, so Broker.Close waits for this goroutine too.
		if q.endErr == nil {
			b.wg.Add(1)
			counted = true
		}
	})
	if !counted {
		return
	}
	defer b.wg.Done()
	b.deleteQueue(q, deletion{err: errorf("exclusive queue %q: owner ended: %w", q.name, ErrQueueDeleted),
		reason: ReasonOwnerEnded, wait: true})
}

// checkName validates the form of a queue or exchange name given by the user.
func checkName(what, name string) error {
	switch {
	case len(name) > maxNameLen:
		return errorf("%s name longer than %d bytes: %w", what, maxNameLen, ErrInvalidArgument)
	case !utf8.ValidString(name):
		return errorf("%s name %q is not UTF-8: %w", what, name, ErrInvalidArgument)
	}
	return nil
}

// checkReserved refuses a new name with the reserved prefix "amq.".
func checkReserved(what, name string) error {
	if strings.HasPrefix(name, "amq.") {
		return errorf("%s name %q: prefix \"amq.\" is reserved: %w", what, name, ErrAccessRefused)
	}
	return nil
}

// Queue returns the queue with the given name (AMQP's passive declare), or an error wrapping
// [ErrNotFound]. An exclusive queue is returned only to its owner ([As]); others get an error
// wrapping [ErrResourceLocked].
func (b *Broker) Queue(name string, opts ...CallOption) (*Queue, error) {
	cfg := callOptions(opts)
	if cfg.err != nil {
		return nil, cfg.err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed.Load() {
		return nil, ErrClosed
	}
	q := b.queues[name]
	if q == nil {
		return nil, errorf("queue %q: %w", name, ErrNotFound)
	}
	if err := q.checkUse("look up queue", cfg.owner, byAs); err != nil {
		return nil, err
	}
	q.touch() // a passive declaration is a use
	return q, nil
}

// Exchange returns the exchange with the given name, or an error wrapping [ErrNotFound].
func (b *Broker) Exchange(name string) (*Exchange, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed.Load() {
		return nil, ErrClosed
	}
	if x := b.exchanges[name]; x != nil {
		return x, nil
	}
	return nil, errorf("exchange %q: %w", name, ErrNotFound)
}

// Queues returns the broker's queues, sorted by name, as of the call.
func (b *Broker) Queues() iter.Seq[*Queue] {
	b.mu.RLock()
	qs := slices.Collect(maps.Values(b.queues))
	b.mu.RUnlock()
	slices.SortFunc(qs, func(x, y *Queue) int { return cmp.Compare(x.name, y.name) }) // names never change
	return slices.Values(qs)
}

// Exchanges returns the broker's exchanges, the predeclared ones included, sorted by name, as
// of the call.
func (b *Broker) Exchanges() iter.Seq[*Exchange] {
	b.mu.RLock()
	xs := slices.Collect(maps.Values(b.exchanges))
	b.mu.RUnlock()
	slices.SortFunc(xs, func(x, y *Exchange) int { return cmp.Compare(x.name, y.name) })
	return slices.Values(xs)
}

// DeleteQueue deletes a queue with its messages, ready and unacknowledged, and its bindings
// (AMQP's queue.delete), and returns how many ready messages went with it (delete-ok's
// message-count), counted in the critical section that deletes it: nothing is dead-lettered. Its
// consumers stop, and their [Consumer.Err] says why with an error wrapping [ErrQueueDeleted];
// their deliveries, and Get deliveries, may still be settled, to no effect.
//
// With [IfUnused] it fails if the queue has consumers, with [IfEmpty] if it has ready messages;
// both with [ErrPreconditionFailed]. An exclusive queue may be deleted only on behalf of its
// owner ([As]; else [ErrResourceLocked]). Deleting a queue that does not exist succeeds, as in
// RabbitMQ. DeleteQueue returns once the queue's consumers have stopped.
func (b *Broker) DeleteQueue(name string, opts ...CallOption) (int, error) {
	cfg := callOptions(opts)
	if cfg.err != nil {
		return 0, cfg.err
	}
	b.mu.RLock()
	closed, q := b.closed.Load(), b.queues[name]
	b.mu.RUnlock()
	switch {
	case closed:
		return 0, ErrClosed
	case q == nil:
		return 0, nil
	}
	return b.deleteQueue(q, deletion{
		err: errorf("queue %q: %w", name, ErrQueueDeleted), reason: ReasonDeleted, wait: true,
		unless: func() error {
			switch {
			case !q.usableBy(cfg.owner):
				return q.checkUse("delete queue", cfg.owner, byAs)
			case cfg.ifUnused && q.consumers.count() > 0:
				return errorf("delete queue %q: in use: %w", name, ErrPreconditionFailed)
			case cfg.ifEmpty && q.core.ready.len() > 0:
				return errorf("delete queue %q: not empty: %w", name, ErrPreconditionFailed)
			}
			return nil
		},
	})
}

// deletion is why and how a queue is deleted (see deleteQueue).
type deletion struct {
	err    error  // what its consumers end with, and later calls on the queue return
	reason Reason // its deletion event's
	// unless, if not nil, runs with the broker's and the queue's locks held, and keeps the
	// queue if it returns an error: errKeep when the queue no longer qualifies, or the error to
	// return.
	unless func() error
	wait   bool // wait until its AutoAck consumers' feeders have finished (not from one of them)
}

// errKeep is what a deletion's condition returns to keep a queue that no longer qualifies: a
// consumer came back to an auto-delete queue, an expiring queue was used.
var errKeep = errors.New("warren: keep the queue")

// deleteQueue is the one way a queue is deleted: by [Broker.DeleteQueue], when it auto-deletes,
// expires or its owner ends, and by the Delete policy of its [Alerts] ([Broker.Close] ends every
// queue through endQueueLocked, as this does). Under the broker's lock and then the queue's, it
// checks the deletion's condition, ends the queue (endLocked) and removes it with its bindings
// from the topology; once both locks are released, the queue's effects are applied (the drops
// of what it held, its deletion event). It returns how many ready messages went with the queue.
// A queue already gone is not an error; a closed broker is [ErrClosed].
func (b *Broker) deleteQueue(q *Queue, del deletion) (int, error) {
	b.mu.Lock()
	switch {
	case b.closed.Load():
		b.mu.Unlock()
		return 0, ErrClosed
	case b.queues[q.name] != q: // deleted meanwhile
		b.mu.Unlock()
		return 0, nil
	}
	n, feeders, err := b.endQueueLocked(q, del.err, del.reason, del.unless)
	if err == nil {
		b.removeQueueLocked(q)
		if q.log != nil {
			b.store.logTopologyLocked(recUnqueue, decl{id: q.log.qid}) // unlockTopology waits for it
		}
	}
	b.unlockTopology()
	q.flushOutbox()
	if del.wait {
		for _, c := range feeders {
			<-c.done // its Deliveries channel is closed: the deletion is complete
		}
	}
	if errors.Is(err, errKeep) {
		err = nil
	}
	return n, err
}

// endQueueLocked ends q, unless (if not nil) returns an error, under the broker's lock, which
// the caller holds; it returns how many ready messages q had and the feeders to wait for. q's
// effects wait until the caller has released the broker's lock and called [Queue.flushOutbox]:
// they include events, which listeners may answer by calling into the broker.
func (b *Broker) endQueueLocked(q *Queue, err error, reason Reason, unless func() error) (int, []*Consumer, error) {
	q.mu.Lock()
	if unless != nil && q.endErr == nil {
		if err := unless(); err != nil {
			q.release()
			return 0, nil, err
		}
	}
	n := q.core.ready.len()
	closing := reason == ReasonClosed && q.log != nil
	if closing {
		// The broker's end is not the messages': they stay in the log, so only the
		// broker's listeners need the effects of dropping them.
		q.core.heard = &b.listeners.list
	}
	feeders := q.endLocked(err, reason)
	if closing {
		// What is recorded after is logged again: a message on its way out with Move, which
		// its mover settles as moved before the log closes (settleMove).
		q.core.heard = &q.log.keep
	}
	q.release()
	return n, feeders, nil
}

// autoDeleteQueue deletes an auto-delete queue whose last consumer went, unless a consumer
// arrived in between.
func (b *Broker) autoDeleteQueue(q *Queue) {
	b.deleteQueue(q, deletion{err: errorf("queue %q auto-deleted: %w", q.name, ErrQueueDeleted),
		reason: ReasonAutoDelete, wait: true, unless: func() error {
			if !q.shouldAutoDeleteLocked() {
				return errKeep
			}
			return nil
		}})
}

// expireQueue deletes a queue that has been unused for its expiry, unless it was used in
// between. Its messages are discarded, not dead-lettered.
func (b *Broker) expireQueue(q *Queue) {
	b.deleteQueue(q, deletion{err: errorf("queue %q expired: %w", q.name, ErrQueueDeleted),
		reason: ReasonQueueExpired, unless: func() error {
			if !q.unusedLocked(q.core.clock()) {
				return errKeep
			}
			return nil
		}})
}

// deleteByPolicy deletes a queue that crossed a threshold of its [Alerts] with the [Delete]
// policy; err says which, and is what its consumers end with. It does not wait for the queue's
// feeders to finish, since it may run on one of them.
func (b *Broker) deleteByPolicy(q *Queue, err error) {
	b.deleteQueue(q, deletion{err: err, reason: ReasonPolicy})
}

// removeQueueLocked removes an ended queue from the topology with every binding to it.
func (b *Broker) removeQueueLocked(q *Queue) {
	delete(b.queues, q.name)
	b.byName.Delete(q.name)
	for _, x := range b.exchanges {
		x.unbindLocked(func(bd *binding) bool { return bd.queue == q })
	}
}

// bindingEvent returns the event of a binding's creation or deletion.
func (bd *binding) event(kind EventKind) Event {
	e := Event{Kind: kind, Exchange: bd.src.name, RoutingKey: bd.key}
	if bd.queue != nil {
		e.Queue = bd.queue.name
	} else {
		e.DestinationExchange = bd.exchange.name
	}
	return e
}

// Purge removes the ready messages of the named queue; see [Queue.Purge].
func (b *Broker) Purge(name string, opts ...CallOption) (int, error) {
	q, err := b.Queue(name, opts...)
	if err != nil {
		return 0, err
	}
	return q.Purge(opts...)
}

// Publish routes msg through the named exchange with routing key key and enqueues it in every
// queue it reaches, once per queue however many paths lead there (AMQP's basic.publish). The
// message is shared, not copied, by those queues: see [Message] for what must not change after.
//
// The return value is the publisher confirm: nil means the message is in every queue it routed
// to, or, without [Mandatory], that it routed nowhere and was dropped. Errors: ctx already done
// (ctx.Err()), a missing exchange ([ErrNotFound]), an internal exchange ([ErrAccessRefused]), a
// routing key over 255 bytes ([ErrInvalidArgument]), an invalid [Message.Expiration] or headers
// that hold a table or array containing itself or nest deeper than 32 levels (see [Table];
// [ErrPreconditionFailed]), [ErrUnroutable] with Mandatory, [ErrQueueFull] when a queue with a
// reject-publish policy refused it (the other queues took it), [ErrStorage] on a durable broker
// whose log cannot take a persistent message routed to a durable queue (a full disk, a failed
// log: it enters no queue), [ErrClosed].
//
// Publish blocks on a queue with the [Block] overflow policy that is full: it waits for room
// until ctx ends, and then returns ctx.Err() (the queues before that one in routing order have
// the message). On a durable broker it also waits for the log to hold the message's records (see
// [Open]), which takes longer when the disk filled up after the message was taken: the log then
// writes it when space comes back. If ctx ends first, Publish returns ctx.Err(), and the
// message's outcome is unknown, as when a publisher confirm times out on RabbitMQ: it is in its
// queues, and in the log if the log can write it.
func (b *Broker) Publish(ctx context.Context, exchange, key string, msg Message, opts ...PublishOption) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return b.publish(ctx, nil, exchange, key, &msg, opts)
}

// PublishDeferred publishes msg as [Broker.Publish] does, but does not wait for the durable log:
// it returns once the message is in its queues, with a [Confirmation] whose Wait is the rest of
// Publish's confirm. Routing errors ([ErrUnroutable], [ErrNotFound], …) are returned at once, as
// Publish returns them; so is an error after some queues took the message ([ErrQueueFull], or
// ctx's end while a [Block] queue was full), with a Confirmation for those queues.
//
// It is the asynchronous confirm of AMQP's confirm mode, for a publisher that streams: keep a
// window of confirmations and wait for the oldest when it is full, or wait for the last one
// only. Confirmations are ordered: once Wait returns nil, every publish that returned before
// this one on this broker is confirmed too, including when this one had nothing of its own to
// confirm (a transient message, or no durable queue took it). A message is delivered to
// consumers before its confirm, as in RabbitMQ; a crash may lose a message whose Wait did not
// return nil, even if a consumer had it. On a broker from [New] the Confirmation is always
// complete.
func (b *Broker) PublishDeferred(ctx context.Context, exchange, key string, msg Message, opts ...PublishOption) (Confirmation, error) {
	if err := ctx.Err(); err != nil {
		return Confirmation{}, err
	}
	lsn, _, err := b.send(ctx, nil, exchange, key, &msg, opts)
	if b.store != nil {
		// The order of confirmations: this one covers every deferred publish before it,
		// even when it wrote nothing itself (a transient message, no durable queue).
		last := &b.store.deferred
		for cur := last.Load(); ; cur = last.Load() {
			if lsn <= wal.LSN(cur) {
				lsn = wal.LSN(cur)
				break
			}
			if last.CompareAndSwap(cur, uint64(lsn)) {
				break
			}
		}
	}
	if lsn == 0 {
		return Confirmation{}, err
	}
	return Confirmation{b: b, lsn: lsn}, err
}

// Confirmation is the pending confirm of a [Broker.PublishDeferred]. The zero value is a
// complete confirm. It is a small value: copy it freely.
type Confirmation struct {
	b   *Broker
	lsn wal.LSN
}

// Wait returns once the message's records are in the log as the broker's [SyncPolicy] asks (as
// [Broker.Publish] returns), or with the error that prevents it: [ErrStorage] when the log
// failed (the message must be taken as not confirmed), [ErrClosed] when the broker closed
// first. While the disk is full it waits for space, or for [Broker.Close]. It may be called any
// number of times, from any goroutine.
func (c Confirmation) Wait() error {
	if c.b == nil {
		return nil
	}
	return c.b.confirm(context.Background(), c.lsn)
}

// Publishing is one message of a [Broker.PublishBatch]: the exchange and routing key to publish
// it with, and the message.
type Publishing struct {
	Exchange, Key string
	Message       Message
}

// PublishBatch publishes each of ps in order, as [Broker.Publish] would with opts, and confirms
// them together: on a durable broker it waits for the log once, for the whole batch, where
// Publish waits once per message. Under [SyncAlways] a lone publisher gets one sync per batch
// rather than one per message; concurrent publishers share syncs anyway, so the batch is for a
// publisher with many messages at hand (an import, a fan-out of jobs). On a broker from [New] it
// is Publish in a loop.
//
// It stops at the first publish that fails and returns a [*BatchError] with its index: the
// messages before it are published and confirmed, the ones after it are not published, and the
// failed one is as Publish leaves it ([ErrQueueFull]: the other queues took it). When the log
// fails, no message of the batch is confirmed ([ErrStorage]); when the disk is full, the
// messages taken before it filled wait for space as Publish's do, until ctx ends (ctx.Err()).
func (b *Broker) PublishBatch(ctx context.Context, ps []Publishing, opts ...PublishOption) error {
	var (
		lsn wal.LSN
		err error
		at  int
	)
	for i := range ps {
		if err = ctx.Err(); err == nil {
			var l wal.LSN
			msg := ps[i].Message // send may set its Expiration: the caller's stays as it was
			l, _, err = b.send(ctx, nil, ps[i].Exchange, ps[i].Key, &msg, opts)
			lsn = max(lsn, l)
		}
		if err != nil {
			at = i
			break
		}
	}
	if cerr := b.confirm(ctx, lsn); cerr != nil {
		return cerr
	}
	if err != nil {
		return &BatchError{Index: at, Err: err}
	}
	return nil
}

// BatchError is the error of a [Broker.PublishBatch] that stopped at the publish of message
// Index, which failed with Err. errors.Is and errors.As see Err.
type BatchError struct {
	Index int
	Err   error
}

func (e *BatchError) Error() string {
	return fmt.Sprintf("warren: publish batch: message %d: %s", e.Index, strings.TrimPrefix(e.Err.Error(), "warren: "))
}

func (e *BatchError) Unwrap() error { return e.Err }

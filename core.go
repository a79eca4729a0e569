package warren

import (
	"cmp"
	"iter"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/btree"
)

// The queue core.
//
// A queue is two layers (docs/ARCHITECTURE.md has the whole picture):
//   - queueCore, here and in ready.go: the queue's messages and deliveries, and every
//     transition between their states. It has no lock, channel, goroutine, timer or broker of
//     its own, and calls no user code: it is plain data, tested on its own (core_test.go)
//     against a naive model.
//   - Queue, the shell (queue.go, consumer.go, dispatch.go, feeder.go, ttl.go, idle.go): the
//     mutex that guards the core, consumers' channels and goroutines, the timer, waiting
//     publishers. It decides when to call the core, and leaves every critical section through
//     one door, [Queue.commit], which applies what the core did.
//
// Every transition of a message is recorded as an effect, by record (or one of its forms for the
// hot path: enqueued, recordDelivered, recordAcked) and nothing else:
//
//	EventEnqueued     a message entered the ready set (or the delayed set): published, dead-lettered in, or an auto-acked delivery back unread
//	EventDelivered    it went out to a consumer or a Get
//	EventAcked        its delivery was acknowledged, or auto-acknowledged as it went out (terminal)
//	EventRequeued     its delivery came back (nack, recover, cancel, an owner's end, an ack timeout)
//	eventDelayed      it was hidden until a due time (DeliverAfter, NackWithDelay)
//	EventExpired      its TTL passed and there is no dead-letter exchange (terminal)
//	eventDeadLetter   it leaves for the dead-letter exchange (terminal once published: see flush)
//	EventDropped      it left, or was refused, and went nowhere (terminal)
//	EventMoved        it left for another exchange with Queue.Move (terminal)
//
// record counts each effect in the queue's counters (Stats) and, when someone listens or the
// effect needs the shell (a dead letter), appends it to effects, in order, interleaved with the
// queue's own events (note). commit hands effects to the flush, which, with no lock held,
// emits them as events and publishes the dead letters. So counters and message events change
// in one place, and a new transition cannot forget either.
//
// Invariants the core keeps (and core_test.go checks against its model):
//   - A message is in exactly one place: ready, delayed, or held by one outstanding delivery;
//     or it has left with a terminal effect. Every Enqueued is followed by exactly one terminal
//     effect for that message in that queue.
//   - A message keeps its sequence id while it is in the queue; whatever brings it back puts it
//     under that id, so it lands where it was (requeue.go).
//   - unacked is the number of outstanding deliveries; each holder's live is its share.
//   - Nothing is taken or delivered after its deadline (ttl.go), except a TTL-0 message in the
//     critical section it arrived in (arriving).
//   - held is the footprint (memory.go) of the messages the queue holds: ready, delayed and
//     outstanding. It changes where the counters do: up with each Enqueued, down with each
//     terminal effect of a message that had entered.
type queueCore struct {
	cfg    *queueConfig // the queue's, fixed at declare
	epoch  time.Time    // the zero of the queue's clock (see ttl.go)
	ranked bool         // an arriving message needs a rank or a deadline whatever its own TTL: priorities, or a queue TTL

	ready    readySet
	delayed  *btree.BTreeG[delayedEntry] // hidden until due: NackWithDelay, DeliverAfter; nil until used
	nextSeq  uint64                      // sequence id of the next enqueued message
	arriving uint64                      // seq of the message being enqueued, which TTL 0 lets through once

	holders []*holder // consumers holding deliveries or able to, in the order they started
	gets    holder    // the Gets' deliveries
	moving  holder    // messages on their way out with Queue.Move (move.go)
	unacked int       // deliveries outstanding, all holders
	free    []*lease  // delivery records to reuse (deliver)

	stamps      ring[stamp] // arrival times, sampled (see stamp)
	pruneStamps int         // prune stamps when there are this many

	n          counters
	held       int64  // the footprint of what the queue holds, for the broker's memory budget (memory.go)
	queuedDead uint64 // dead letters ever recorded; the shell counts those flushed
	effects    []effect
	heard      *atomic.Pointer[[]*listener] // the broker's listeners: record effects while not nil
	// listeners are the broker's listeners, also when heard is a durable queue's log (which
	// records every effect): a purge reads paged messages back only for them (purge).
	listeners *atomic.Pointer[[]*listener]
	ended     Reason // why the queue ended, for what is dropped after; "" while it lives
}

// counters are a queue's message counts since it was declared (Stats); changed by record only.
type counters struct {
	enqueued, delivered, redelivered, acked, nacked, rejected, expired, deadLettered, dropped, moved uint64
}

// effect is one transition, as record saw it: a message event of kind (with the message's entry
// as the transition left it, the consumer's tag and a reason), or, with ev set, an event of the
// queue's own.
type effect struct {
	kind EventKind
	// atReceipt, on an EventDelivered, says that the delivery counts in a durable queue's log
	// only once the application receives it (holder.atReceipt): the log writes nothing for it
	// now.
	atReceipt bool
	reason    Reason
	tag       string
	e         entry
	n         int64 // eventDelayed: when it is due, on the queue's clock
	ev        *Event
}

// refused reports whether the effect is the terminal one of a message the queue refused on
// arrival (a length limit, a deleted queue, an Immediate publish no consumer took): it was never
// enqueued here (no Enqueued effect came before it), so whatever counts holders of the message
// must not count this queue's letting go of it. Such a message has no sequence id, but for the
// Immediate one, which is taken back out after it was admitted.
func (ef effect) refused() bool { return ef.e.seq == 0 || ef.reason == ReasonNoConsumers }

// eventDelayed is an effect that is not emitted: a message hidden until a due time.
const eventDelayed = eventDeadLetter + 1

// holder holds outstanding deliveries: a consumer (received, or buffered in its channel), or
// the queue's Gets. Its deliveries are in tag order, with settled holes.
type holder struct {
	c       *Consumer // the consumer, for the shell; nil for the Gets. The core does not look at it.
	tag     string    // the consumer's tag; "" for the Gets
	unacked ring[*lease]
	live    int    // outstanding deliveries in unacked
	nextTag uint64 // last delivery tag issued
	// atReceipt: a delivery to this holder counts towards the delivery limit after a crash only
	// once the application has received it, which the shell tells the log then (Serve's
	// consumer: store.received); until then its lease is uncounted. Fixed when the holder is made.
	atReceipt bool
}

func newCore(cfg *queueConfig, free *btree.FreeListG[entry], heard *atomic.Pointer[[]*listener]) queueCore {
	return queueCore{cfg: cfg, epoch: time.Now(), ranked: cfg.maxPriority > 0 || cfg.ttl >= 0,
		ready: newReadySet(free, cfg.levels()), nextSeq: 1, heard: heard, listeners: heard}
}

// clock returns the queue's time: nanoseconds since its epoch, at least 1.
func (c *queueCore) clock() int64 { return int64(time.Since(c.epoch)) + 1 }

// observed reports whether every effect is recorded, not only those the shell must act on.
func (c *queueCore) observed() bool { return c.heard.Load() != nil }

// record counts a transition of e's message and keeps it for the shell: with its hot-path
// forms below (recordDelivered, recordAcked), the one place where counters change and message
// effects are made.
func (c *queueCore) record(kind EventKind, e entry, tag string, reason Reason) {
	c.count(kind, reason, 1)
	switch kind {
	case EventEnqueued:
		c.held += e.env.footprint()
	case EventAcked, EventExpired, eventDeadLetter, EventDropped, EventMoved:
		if !(effect{e: e, reason: reason}).refused() {
			c.held -= e.env.footprint()
		}
	}
	if kind == EventDelivered && e.redelivered {
		c.n.redelivered++
	}
	if kind == eventDeadLetter || c.observed() {
		c.keep(kind, e, tag, reason)
	}
}

// recordDelivered is record(EventDelivered, e, tag, ""), small enough to inline: on the hot path,
// three calls a message with 64 bytes of arguments each cost a few percent of a round trip.
func (c *queueCore) recordDelivered(e entry, tag string) {
	c.n.delivered++
	if e.redelivered {
		c.n.redelivered++
	}
	if c.observed() {
		c.keep(EventDelivered, e, tag, "")
	}
}

// recordAcked is record(EventAcked, e, tag, ""), small enough to inline.
func (c *queueCore) recordAcked(e entry, tag string) {
	c.n.acked++
	c.held -= e.env.footprint()
	if c.observed() {
		c.keep(EventAcked, e, tag, "")
	}
}

// keep appends an effect for the shell.
func (c *queueCore) keep(kind EventKind, e entry, tag string, reason Reason) {
	c.effects = append(c.effects, effect{kind: kind, reason: reason, tag: tag, e: e})
}

// count adds n transitions of kind to the counters.
func (c *queueCore) count(kind EventKind, reason Reason, n uint64) {
	switch kind {
	case EventEnqueued:
		c.n.enqueued += n
	case EventDelivered:
		c.n.delivered += n
	case EventAcked:
		c.n.acked += n
	case EventRequeued:
		if reason == ReasonNack {
			c.n.nacked += n
		}
	case EventExpired:
		c.n.expired += n
	case eventDeadLetter:
		c.queuedDead += n
		switch reason {
		case ReasonExpired:
			c.n.expired += n
		case ReasonRejected:
			c.n.rejected += n
		}
	case EventMoved:
		c.n.moved += n
	case EventDropped:
		c.n.dropped += n
		if reason == ReasonRejected {
			c.n.rejected += n
		}
	}
}

// deadLettered counts the outcome of dead letters the flush published: dead reached a queue,
// lost went nowhere (their events are the flush's).
func (c *queueCore) deadLettered(dead, lost uint64) {
	c.n.deadLettered += dead
	c.n.dropped += lost
}

// note keeps an event of the queue's own (a consumer's, an alert, the queue's creation or
// deletion) in order with the message effects. Call it when someone listens, or for an alert.
func (c *queueCore) note(ev Event) {
	c.effects = append(c.effects, effect{ev: &ev})
}

// mark returns where the next effect goes, for enqueued.
func (c *queueCore) mark() int { return len(c.effects) }

// enqueued is record(EventEnqueued, e, "", reason), small enough to inline, with the effect kept
// at position at: before the effects of its dispatch, which happened first so that an Immediate
// publish no consumer took is never recorded as enqueued.
func (c *queueCore) enqueued(e entry, at int, reason Reason) {
	c.n.enqueued++
	c.held += e.env.footprint()
	if c.heard.Load() != nil {
		c.keepAt(at, &e, reason)
	}
}

// keepAt keeps the Enqueued effect of e at position at. (Not inlined: so that enqueued is.)
//
//go:noinline
func (c *queueCore) keepAt(at int, e *entry, reason Reason) {
	n := len(c.effects)
	c.keep(EventEnqueued, *e, "", reason)
	if at < n {
		ef := c.effects[n]
		copy(c.effects[at+1:], c.effects[at:n])
		c.effects[at] = ef
	}
}

// admit gives a message arriving with message TTL ttl (-1 for none), e, its place: its
// sequence id, priority rank and deadline. It returns the clock if it had to read it; else 0.
func (c *queueCore) admit(e *entry, ttl time.Duration) (now int64) {
	e.seq = c.nextSeq
	c.nextSeq++
	if ttl >= 0 || c.ranked {
		now = c.rank(e, ttl)
	}
	return
}

// rank sets an arriving entry's priority rank and deadline, and returns the clock if it read it.
func (c *queueCore) rank(e *entry, ttl time.Duration) (now int64) {
	if p := c.cfg.maxPriority; p > 0 {
		e.rank = uint8(p - min(p, int(e.env.priority))) // above the maximum counts as the maximum
	}
	if ttl >= 0 || c.cfg.ttl >= 0 {
		now = c.clock()
		e.deadline = c.deadlineFor(now, ttl)
	}
	return now
}

// room reports whether a message of n body bytes fits within the queue's length limits.
func (c *queueCore) room(n int) bool {
	return (c.cfg.maxLen < 0 || int64(c.ready.len()) < c.cfg.maxLen) &&
		(c.cfg.maxBytes < 0 || c.ready.bytes+int64(n) <= c.cfg.maxBytes)
}

// dropHead enforces the length limits of a drop-head queue: while over a limit, it drops the
// head (the oldest, or the first returned) and dead-letters it with reason maxlen.
func (c *queueCore) dropHead() {
	if !c.cfg.limited() || c.cfg.overflow != DropHead {
		return
	}
	c.dropOver(c.cfg.maxLen, c.cfg.maxBytes)
}

// dropOver drops the head while the queue holds more than maxLen ready messages or maxBytes
// ready bytes (-1 for no limit), dead-lettering with reason maxlen, or expired if it had.
func (c *queueCore) dropOver(maxLen, maxBytes int64) {
	for (maxLen >= 0 && int64(c.ready.len()) > maxLen) || (maxBytes >= 0 && c.ready.bytes > maxBytes) {
		e, ok := c.ready.popMin()
		if !ok {
			return
		}
		reason := ReasonMaxLen
		if c.expired(e) {
			reason = ReasonExpired
		}
		c.deadLetter(e, reason)
	}
}

// take removes and returns the first ready message that has not expired, expiring (and
// dead-lettering) those that have on the way.
func (c *queueCore) take() (entry, bool) {
	for {
		e, ok := c.ready.popMin()
		if !ok || !c.expired(e) {
			return e, ok
		}
		c.deadLetter(e, ReasonExpired)
	}
}

// takeBefore takes the first ready message, in delivery order, of those enqueued before
// sequence id before, and dead-letters the expired ones it meets: what a move from the head
// takes, which must not take what it enqueued itself. Within a priority rank the keys are the
// sequence ids, so a rank's older messages all come before its newer ones: it reads the first
// entry of each rank, from the highest priority, until one is older than before — O(ranks)
// seeks, however many newer messages wait ahead (a move into its own queue puts every message
// it moved of a higher priority there).
func (c *queueCore) takeBefore(before uint64) (entry, bool) {
	for from := uint64(0); ; {
		var first entry // its env nil: none (ascend yields live entries only)
		c.ready.ascendWithPaged(from, func(e entry) bool {
			first = e
			return false
		})
		switch {
		case first.env == nil:
			return entry{}, false
		case first.seq >= before: // and so is the rest of its rank
			if int(first.rank) == len(c.ready.lower) { // the last rank
				return entry{}, false
			}
			from = uint64(first.rank+1) << seqBits
			continue
		}
		e, ok := c.ready.removeWithPaged(first.key())
		if !ok { // a chunk that cannot be read back: the move stops there
			return entry{}, false
		}
		if !c.expired(e) {
			return e, true
		}
		c.deadLetter(e, ReasonExpired)
	}
}

// deadLetter records that e's message leaves the queue for reason, one of the x-death reasons:
// with a dead-letter exchange it goes to the shell, to be published once the lock is released
// (see [Queue.commit]); without one it expires or drops here. A queue that ended dead-letters
// nothing.
func (c *queueCore) deadLetter(e entry, reason Reason) {
	switch {
	case c.ended != "":
		c.record(EventDropped, e, "", c.ended)
	case c.cfg.hasDLX:
		c.record(eventDeadLetter, e, "", reason)
	case reason == ReasonExpired:
		c.record(EventExpired, e, "", "")
	default:
		c.record(EventDropped, e, "", reason)
	}
}

// drop records that e's message leaves the queue, or is refused by it, going nowhere.
func (c *queueCore) drop(e entry, reason Reason) { c.record(EventDropped, e, "", reason) }

// purge drops every ready message with reason and returns how many there were.
//
// Paged messages are read back only for listeners (an event has its message), and not at the
// broker's close, which leaves them in the log: else their chunks are let go of whole, unread
// (ready.clear), counted here, and the shell settles them on disk by sequence id
// (settleDroppedLocked). A chunk the pager fails to read goes the same way.
func (c *queueCore) purge(reason Reason) int {
	if c.observed() && reason != ReasonClosed && c.listeners != nil && c.listeners.Load() != nil {
		c.ready.pageInAll()
	}
	n := c.ready.len()
	if c.observed() {
		c.ready.ascend(0, func(e entry) bool {
			c.drop(e, reason)
			return true
		})
		if p := &c.ready.paged; p.n > 0 {
			c.count(EventDropped, reason, uint64(p.n))
			c.held -= p.footprint()
		}
	} else {
		c.count(EventDropped, reason, uint64(n))
		c.held -= c.ready.footprint()
	}
	c.ready.paged.why = reason
	c.ready.clear()
	return n
}

// delayedEntry is a message hidden from consumers until due, on the queue's clock.
type delayedEntry struct {
	due int64
	e   entry
}

func delayedLess(a, b delayedEntry) bool {
	if a.due != b.due {
		return a.due < b.due
	}
	return a.e.seq < b.e.seq
}

// delay hides e from consumers for d, capped at maxWait: it keeps its place (its sequence id)
// and rejoins the ready set there when d has passed (promoteDue).
func (c *queueCore) delay(e entry, d time.Duration) {
	if c.delayed == nil {
		c.delayed = btree.NewG(32, delayedLess)
	}
	due := later(c.clock(), d)
	c.delayed.ReplaceOrInsert(delayedEntry{due, e})
	if c.observed() {
		n := len(c.effects)
		c.record(eventDelayed, e, "", "")
		c.effects[n].n = due
	}
}

// promoteDue moves the delayed messages that are due at now back into the ready set, at their
// original positions; one whose deadline passed meanwhile expires instead.
func (c *queueCore) promoteDue(now int64) {
	for c.delayed != nil {
		k, ok := c.delayed.Min()
		if !ok || k.due > now {
			return
		}
		c.delayed.DeleteMin()
		if c.expired(k.e) {
			c.deadLetter(k.e, ReasonExpired)
			continue
		}
		c.cover(k.e.seq)
		c.ready.reinsert(k.e)
		c.dropHead()
	}
}

// redelivered returns e as it comes back after the application saw it.
func redelivered(e entry) entry {
	e.redelivered = true
	e.returns++
	return e
}

// nack puts back one message the application received and nacked, redelivered, hidden for
// delay if it is positive; or expires it if its deadline passed meanwhile, or dead-letters it
// past the delivery limit.
func (c *queueCore) nack(e entry, tag string, delay time.Duration) {
	e = redelivered(e)
	c.record(EventRequeued, e, tag, ReasonNack)
	switch {
	case c.ended != "" || !c.mayReturn(e): // a deleted queue keeps nothing
	case delay > 0:
		c.delay(e, delay)
	default:
		c.cover(e.seq)
		c.ready.reinsert(e)
		c.dropHead() // returned messages are at the head: the first dropped
	}
}

// mayReturn reports whether a message coming back may go back: not if its deadline passed
// meanwhile nor if it came back more times than the delivery limit. Those it dead-letters
// instead.
func (c *queueCore) mayReturn(e entry) bool {
	switch {
	case c.expired(e):
		c.deadLetter(e, ReasonExpired)
	case c.cfg.deliveryLimit >= 0 && int64(e.returns) > c.cfg.deliveryLimit:
		c.deadLetter(e, ReasonDeliveryLimit)
	default:
		return true
	}
	return false
}

// restoreAll puts back messages that come back together, already recorded as they return
// (back). Those whose deadline passed meanwhile are expired instead, and those past the delivery
// limit dead-lettered, in queue order.
func (c *queueCore) restoreAll(es []entry) {
	if len(es) == 0 || c.ended != "" {
		return
	}
	slices.SortFunc(es, func(a, b entry) int { return cmp.Compare(a.key(), b.key()) })
	live := es[:0]
	least := ^uint64(0)
	for _, e := range es {
		if c.mayReturn(e) {
			live = append(live, e)
			least = min(least, e.seq)
		}
	}
	clear(es[len(live):])
	if len(live) > 0 {
		c.cover(least)
	}
	c.ready.merge(live)
	c.dropHead()
}

// back records that a delivery of h's is on its way back to the queue, e as it comes back
// (redelivered, or unchanged if the application never saw it): Requeued for why, or,
// for an auto-acked delivery (why ReasonReturned), Enqueued, since its span ended when it was
// delivered; nothing for why "". If the message cannot go back (its TTL passed, or the delivery
// limit), a terminal effect follows when it comes back (restoreAll).
func (c *queueCore) back(h *holder, e entry, why Reason) {
	switch why {
	case "":
	case ReasonReturned:
		c.record(EventEnqueued, e, "", why)
	default:
		c.record(EventRequeued, e, h.tag, why)
	}
}

// takeBack releases every delivery h's application received and has not settled, marking it
// returned, and appends its entry to back, redelivered, for the caller to restore.
func (c *queueCore) takeBack(h *holder, back []entry, why Reason) []entry {
	for d := range h.outstanding() {
		c.release(d, deliveryReturned)
		e := redelivered(d.e)
		c.back(h, e, why)
		back = append(back, e)
	}
	return back
}

// deadlineFor returns the deadline of a message entering the queue at now (the queue's clock)
// with message TTL ttl (-1 for none), or 0 for none.
func (c *queueCore) deadlineFor(now int64, ttl time.Duration) int64 {
	if c.cfg.ttl >= 0 && (ttl < 0 || c.cfg.ttl < ttl) {
		ttl = c.cfg.ttl
	}
	if ttl < 0 {
		return 0
	}
	return later(now, ttl)
}

// expired reports whether e's deadline has passed. A message arriving in this critical section
// with TTL 0 has not expired yet: it may still be taken at once.
func (c *queueCore) expired(e entry) bool {
	return e.deadline != 0 && e.seq != c.arriving && e.deadline <= c.clock()
}

// expireDue removes every ready message whose deadline is not after now and dead-letters it,
// earliest deadline first, paged messages included (their chunks are read back: readDue).
func (c *queueCore) expireDue(now int64) {
	due := c.ready.readDue(now)
	if len(due) > 1 {
		slices.SortFunc(due, func(a, b entry) int {
			return cmp.Or(cmp.Compare(a.deadline, b.deadline), cmp.Compare(a.key(), b.key()))
		})
	}
	for {
		k, ok := c.ready.expiries.Min()
		inMemory := ok && k.deadline <= now
		if len(due) > 0 && (!inMemory || expiryLess(expiry{due[0].deadline, due[0].key()}, k)) {
			c.deadLetter(due[0], ReasonExpired)
			due = due[1:]
			continue
		}
		if !inMemory {
			return
		}
		e, ok := c.ready.remove(k.key)
		if !ok { // cannot happen: the index holds only ready entries; do not spin on it
			c.ready.expiries.Delete(k)
			continue
		}
		c.deadLetter(e, ReasonExpired)
	}
}

// nextDeadline returns the earliest time a message is due to move by itself: its deadline, or
// its delay's end; 0 for never.
func (c *queueCore) nextDeadline() int64 {
	var at int64
	if k, ok := c.ready.expiries.Min(); ok {
		at = k.deadline
	}
	if c.ready.paged.n > 0 {
		if k, ok := c.ready.paged.expiries.Min(); ok && (at == 0 || k.deadline < at) {
			at = k.deadline
		}
	}
	if c.delayed != nil {
		if k, ok := c.delayed.Min(); ok && (at == 0 || k.due < at) {
			at = k.due
		}
	}
	return at
}

// leaseSlabSize is how many leases a queue allocates at once, when its free list is empty. A
// queue holds at most as many as it ever had deliveries outstanding at once, rounded up.
const leaseSlabSize = 16

// deliver records a delivery of e to h, with h's next tag, into d, which must be the zero
// Delivery (filled in place: a Delivery is 344 bytes, and each copy of it on the way to a
// consumer's channel cost a few percent of a round trip). With autoAck it is acknowledged as it
// goes out; else it is outstanding, held by h (in a lease) until it is settled or comes back, and
// due is when an ack timeout ends it (0 for never). Queue.deliverLocked also sets the delivery's
// queue.
func (c *queueCore) deliver(d *Delivery, h *holder, e entry, autoAck bool, due int64) {
	d.Exchange, d.RoutingKey = e.env.exchange.name, e.env.routingKey
	d.Redelivered, d.DeliveryCount = e.redelivered, int(e.returns)
	d.ConsumerTag = h.tag
	d.e = e
	if m := e.env.ownMessage(); m != nil {
		d.Message = *m
	} else {
		d.Message.Body, d.Message.Persistent, d.Message.Priority = e.env.bodyBytes(), e.env.persistent, e.env.priority
	}
	c.recordDelivered(e, h.tag)
	if h.atReceipt && c.observed() {
		c.effects[len(c.effects)-1].atReceipt = true
	}
	if autoAck {
		h.nextTag++
		d.DeliveryTag = h.nextTag
		c.recordAcked(e, h.tag)
		return
	}
	r := c.lend(h, e)
	r.due, r.uncounted = due, h.atReceipt
	d.DeliveryTag, d.lease, d.gen = r.tag, r, r.gen
}

// lend takes e out as outstanding, held by h, under the next delivery tag: deliver's, and, with
// nothing delivered, a message's on its way elsewhere (Queue.Move). Nothing is recorded: how it
// ends is.
func (c *queueCore) lend(h *holder, e entry) *lease {
	h.nextTag++
	r := c.newLease()
	r.h, r.e, r.tag, r.state = h, e, h.nextTag, deliveryOutstanding
	h.unacked.push(r)
	h.live++
	c.unacked++
	return r
}

// newLease returns a lease from the free list, or a fresh one.
func (c *queueCore) newLease() *lease {
	if len(c.free) == 0 {
		slab := make([]lease, leaseSlabSize)
		for i := range slab {
			c.free = append(c.free, &slab[i])
		}
	}
	r := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	return r
}

// reuse takes back a lease its holder's list let go of: no Delivery value names it any more
// (its generation moves on), and it keeps nothing reachable.
func (c *queueCore) reuse(r *lease) {
	r.h, r.e, r.tag, r.due, r.get, r.state, r.uncounted = nil, entry{}, 0, 0, nil, 0, false
	r.gen++
	if c.ended == "" { // an ended queue delivers nothing more: it keeps no spares
		c.free = append(c.free, r)
	}
}

// checkSettle says why r cannot be settled, if it cannot.
func checkSettle(r *lease) error {
	if r.state != deliveryOutstanding {
		return errorf("settle delivery %d: %w", r.tag, ErrAlreadySettled)
	}
	return nil
}

// release moves an outstanding delivery to state, settled or returned, and releases what it
// held: the queue's unacked count and its holder's credit. It leaves the record in its
// holder's list, which the caller may be walking: the caller trims the list when it is done
// (queueCore.trim; Consumer.tidyLocked for a consumer).
func (c *queueCore) release(r *lease, state deliveryState) {
	r.state = state
	c.unacked--
	r.h.live--
}

// settle settles an outstanding delivery: releases it and does with its message what how says.
func (c *queueCore) settle(r *lease, how settlement) {
	c.release(r, deliverySettled)
	switch how {
	case settleAck:
		c.recordAcked(r.e, r.h.tag)
	case settleNack:
		c.nack(r.e, r.h.tag, 0)
	case settleReject:
		c.deadLetter(r.e, ReasonRejected)
	}
}

// hold adds a holder (a new consumer).
func (c *queueCore) hold(h *holder) { c.holders = append(c.holders, h) }

// unhold removes a holder that holds nothing more, and reports whether it was there.
func (c *queueCore) unhold(h *holder) bool {
	i := slices.Index(c.holders, h)
	if i >= 0 {
		c.holders = slices.Delete(c.holders, i, i+1)
	}
	return i >= 0
}

// trim lets go of settled and returned deliveries at the front of h's list, and compacts it
// when holes dominate (a consumer that holds one delivery for long while settling many later
// ones); their records are reused.
func (c *queueCore) trim(h *holder) {
	l := &h.unacked
	for l.len() > 0 && l.front().state != deliveryOutstanding {
		c.reuse(l.pop())
	}
	if n := l.len(); n > 64 && n > 4*h.live {
		l.filter(func(r *lease) bool {
			if r.state != deliveryOutstanding {
				c.reuse(r)
				return false
			}
			return true
		})
	}
}

// clear lets go of every delivery in h's list, none of them outstanding any more.
func (c *queueCore) clear(h *holder) {
	for h.unacked.len() > 0 {
		c.reuse(h.unacked.pop())
	}
}

// outstanding yields h's outstanding deliveries in tag order.
func (h *holder) outstanding() iter.Seq[*lease] {
	return func(yield func(*lease) bool) {
		for i := range h.unacked.len() {
			if d := h.unacked.at(i); d.state == deliveryOutstanding && !yield(d) {
				return
			}
		}
	}
}

// outstanding yields every outstanding delivery of the queue: each consumer's in tag order,
// consumers in the order they started, then the Gets' in tag order.
func (c *queueCore) outstanding() iter.Seq[*lease] {
	return func(yield func(*lease) bool) {
		for _, h := range c.holders {
			for d := range h.outstanding() {
				if !yield(d) {
					return
				}
			}
		}
		for d := range c.gets.outstanding() {
			if !yield(d) {
				return
			}
		}
		for d := range c.moving.outstanding() {
			if !yield(d) {
				return
			}
		}
	}
}

// each calls fn with every message the queue holds: the ready ones in delivery order, then the
// delayed ones with when they are due (on the queue's clock), then the outstanding ones, out
// as the log holds them: not a delivery not received yet (lease.uncounted), nor a message lent
// to a move (lend records nothing: it is in the queue until its move settles it). fn must not
// change the queue.
func (c *queueCore) each(fn func(e entry, due int64, out bool)) {
	c.ready.ascend(0, func(e entry) bool {
		fn(e, 0, false)
		return true
	})
	if c.delayed != nil {
		c.delayed.Ascend(func(k delayedEntry) bool {
			fn(k.e, k.due, false)
			return true
		})
	}
	for d := range c.outstanding() {
		fn(d.e, 0, !d.uncounted && d.h != &c.moving)
	}
}

// end drops everything the queue holds — ready, delayed, outstanding, and dead letters not yet
// published (a deleted queue dead-letters nothing more) — with reason why. Effects recorded
// before stay, for the shell to apply; what is dropped after (a publish that raced the deletion)
// is dropped for why too. Outstanding deliveries stay outstanding: settling one is a no-op.
// A message on its way out with Queue.Move is not dropped here: whether it leaves as moved or
// dropped depends on whether the destination takes it, which its mover records (settleMove).
func (c *queueCore) end(why Reason) {
	c.ended = why
	c.purge(why)
	if c.delayed != nil {
		c.delayed.Ascend(func(k delayedEntry) bool {
			c.drop(k.e, why)
			return true
		})
		c.delayed = nil
	}
	for d := range c.outstanding() {
		if d.h != &c.moving {
			c.drop(d.e, why)
		}
	}
	var dead []effect
	kept := c.effects[:0]
	for _, ef := range c.effects {
		if ef.kind == eventDeadLetter {
			dead = append(dead, ef)
			continue
		}
		kept = append(kept, ef)
	}
	clear(c.effects[len(kept):])
	c.effects = kept
	for _, ef := range dead {
		if !ef.refused() {
			c.held += ef.e.env.footprint() // it left once already, as a dead letter
		}
		c.drop(ef.e, why)
	}
}

// reset lets go of everything an ended queue held, once the shell has stopped its holders.
func (c *queueCore) reset(free *btree.FreeListG[entry]) {
	p := &c.ready.paged // the chunks its end let go of are the shell's still, to settle on disk
	dropped, pending, why := p.dropped, p.droppedPending, p.why
	c.ready = newReadySet(free, c.cfg.levels())
	c.ready.paged.dropped, c.ready.paged.droppedPending, c.ready.paged.why = dropped, pending, why
	c.holders, c.gets, c.moving, c.unacked, c.free = nil, holder{}, holder{}, 0, nil
	c.stamps = ring[stamp]{}
}

// restore puts back what a durable queue held when its broker last stopped (recovery.go): ready
// entries sorted by key, delayed ones, and the next sequence id. They count as enqueued; no
// effect is recorded, since they are in the log already.
func (c *queueCore) restore(ready []entry, delayed []delayedEntry, nextSeq uint64) {
	c.count(EventEnqueued, "", uint64(len(ready)+len(delayed)))
	for _, e := range ready {
		c.held += e.env.footprint()
	}
	for _, k := range delayed {
		c.held += k.e.env.footprint()
	}
	live := ready[:0]
	for _, e := range ready {
		// A delivery out at the crash, now past the delivery limit, is dead-lettered. One
		// whose deadline passed stays for resume's expireDue, which expires the messages in
		// memory and those on disk together, by deadline: which of them Open keeps in memory
		// (the page window, a checkpoint's) does not change the order they expire in.
		if c.expired(e) || c.mayReturn(e) {
			live = append(live, e)
		}
	}
	ready = live
	if len(ready) > 0 {
		least := ready[0].seq
		for _, e := range ready {
			least = min(least, e.seq)
		}
		c.cover(least)
		c.ready.merge(ready)
	}
	for _, k := range delayed {
		if c.delayed == nil {
			c.delayed = btree.NewG(32, delayedLess)
		}
		c.delayed.ReplaceOrInsert(k)
	}
	c.nextSeq = max(c.nextSeq, nextSeq)
}

// Arrival stamps: the oldest message's age without a clock read per message.
//
// A clock read costs about a sixth of a publish, so a message carries no arrival time. Instead
// the queue keeps stamps, (seq, time) pairs, in seq order: one when a message stays ready in a
// queue that was empty (the one moment its age is not bounded by an older message), one every
// 64 sequence ids, one per message on a queue with an age threshold, and one per delayed
// publish (it joins the ready set later, maybe into an empty queue). The oldest ready
// message arrived no earlier than the newest stamp at or before its seq. Stamps no message
// held needs are dropped from time to time (see pushStamp).

// stamp records that the message with sequence id seq arrived at at, on the queue's clock.
type stamp struct {
	seq uint64
	at  int64
}

// stampEvery is how many sequence ids apart the regular stamps are (a power of two).
const stampEvery = 64

// stamp records e's arrival if a stamp is due: the caller has just enqueued and dispatched e;
// now is the queue's clock if the caller read it, else 0.
func (c *queueCore) stamp(e entry, now int64) {
	if e.seq&(stampEvery-1) != 0 && c.ready.len() != 1 && c.cfg.alerts.Age == 0 {
		return
	}
	c.pushStamp(e.seq, now)
}

// pushStamp records that the message with sequence id seq, the newest, arrived at now (0: read
// the clock). Now and then it drops the stamps no message needs: those before the one that
// covers the oldest message the queue holds, ready or out with a consumer (which may come
// back); that costs a look at every outstanding delivery, so it is done only when the stamps
// have doubled since the last time, and it thins them out, keeping every other one, beyond
// maxStamps.
func (c *queueCore) pushStamp(seq uint64, now int64) {
	if now == 0 {
		now = c.clock()
	}
	if c.stamps.len() >= c.pruneStamps {
		c.pruneOldStamps()
		c.pruneStamps = max(stampEvery, 2*c.stamps.len())
	}
	c.stamps.push(stamp{seq, now})
}

// cover makes sure a message with sequence id seq coming back into the ready set is covered by
// a stamp: one delivered as it arrived, or whose stamp went, counts its age from now, its
// return (an under-estimate, but not nothing).
func (c *queueCore) cover(seq uint64) {
	if c.stamps.len() == 0 || c.stamps.front().seq > seq {
		c.stamps.pushFront(stamp{seq, c.clock()})
	}
}

// maxStamps bounds the stamps a queue keeps: a delivery held for long keeps the stamps after it.
const maxStamps = 4096

// pruneOldStamps drops the stamps before the one covering the oldest message held, and thins
// them out beyond maxStamps.
func (c *queueCore) pruneOldStamps() {
	oldest, ok := c.ready.oldestSeq()
	for d := range c.outstanding() {
		if !ok || d.e.seq < oldest {
			oldest, ok = d.e.seq, true
		}
	}
	if !ok {
		c.stamps.clear()
		return
	}
	for c.stamps.len() >= 2 && c.stamps.at(1).seq <= oldest {
		c.stamps.pop()
	}
	if c.stamps.len() > maxStamps {
		i := 0
		c.stamps.filter(func(stamp) bool { i++; return i%2 == 1 }) // the first kept: it covers the oldest
	}
}

// oldestAt returns when the oldest ready message arrived, as far as the stamps tell.
func (c *queueCore) oldestAt() (int64, bool) {
	oldest, ok := c.ready.oldestSeq()
	if !ok || c.stamps.len() == 0 {
		return 0, false
	}
	lo, hi := 0, c.stamps.len() // the first stamp after oldest
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if c.stamps.at(m).seq <= oldest {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return c.stamps.at(max(lo-1, 0)).at, true
}

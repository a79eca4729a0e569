package warren

import (
	"cmp"
	"slices"
)

// Dispatch: which consumer receives which message.
//
// A queue's active consumers are push consumers (manual acknowledgement: sent to under the
// queue lock while they have credit) and feeders (AutoAck: a goroutine of their own hands
// messages over, see [Consumer.feed]). They are kept in q.consumers and q.feeders, each sorted
// by priority, highest first, and by arrival within a priority. A single-active-consumer queue
// keeps only its active consumer there and the others in q.standby.
//
// Two paths, chosen by q.general, which reorderLocked sets whenever the consumers change:
//   - Simple (every active consumer has the same priority and none has a selector): push
//     consumers take the head of the queue round-robin, skipping those without credit, and
//     feeders take the head themselves whenever they are woken and have room.
//   - General: consumers are served band by band, highest priority first; within a band,
//     round-robin by least recent turn among those with credit; each takes the first ready
//     message it accepts (its selector's first match, or the head). A band is done when every
//     consumer in it is out of credit or finds nothing; only then does the next band receive.
//     So a message goes to a lower band only when no consumer of a higher band with credit
//     accepts it (Qpid's noHigherPriorityWithCredit). Feeders take part through a hand-off:
//     an idle feeder has credit, and receiving is being handed the entry and woken.
//
// Invariants:
//   - A consumer receives only while it has credit, so a send into its channel never blocks.
//   - Every message a consumer receives is the first ready message it accepts at that moment;
//     so each consumer receives in queue order, and skipped messages keep their places.
//   - A selector's cursors, one per priority rank: every ready message of rank r with a key
//     below c.cursor[r] has been rejected by c's selector (or had expired). A fresh message is
//     the newest of its rank, so it lands past every cursor of its rank. A message that comes
//     back — returned, promoted from a delay — lowers readySet.floors[rank], and the cursors of
//     that rank are moved back to the floor before the next scan (cursorsLocked). So each
//     message is shown to a selector once while it stays ready, plus once per return ahead of
//     the cursor; a scan costs O(log n) per rank plus the messages it shows.

// consumerCountLocked returns the number of active consumers of every kind, waiting single-active
// consumers included (AMQP's consumer_count).
func (q *Queue) consumerCountLocked() int {
	return len(q.consumers) + len(q.feeders) + len(q.standby)
}

// addConsumerLocked admits a new consumer, or refuses it: an exclusive consumer in use refuses
// all, and an exclusive one needs a queue without consumers and without single active
// consumer.
func (q *Queue) addConsumerLocked(c *Consumer) error {
	switch {
	case q.exclusive:
		return errorf("consume from queue %q: in exclusive use: %w", q.name, ErrAccessRefused)
	case c.exclusive && q.cfg.singleActive:
		return errorf("consume from queue %q: exclusive consumer on a single active consumer queue: %w", q.name, ErrAccessRefused)
	case c.exclusive && q.consumerCountLocked() > 0:
		return errorf("consume from queue %q: queue has consumers, cannot consume exclusively: %w", q.name, ErrAccessRefused)
	}
	q.exclusive = c.exclusive
	q.hadConsumer = true
	q.core.hold(&c.holder)
	if q.cfg.singleActive && len(q.consumers)+len(q.feeders) > 0 {
		q.standby = insertByPriority(q.standby, c)
		return nil
	}
	q.activateLocked(c)
	return nil
}

// activateLocked makes c an active consumer.
func (q *Queue) activateLocked(c *Consumer) {
	c.active = true
	if c.autoAck {
		q.feeders = insertByPriority(q.feeders, c)
		c.feeder.wakeUp()
	} else {
		// A newcomer joins the end of the rotation, as in RabbitMQ: every consumer of its
		// priority takes its turn before it does. In the consumers list that is just before
		// the consumer whose turn is next, if that one is of its priority, else after its
		// priority's last; and the turn stays with the consumer it was at.
		i := priorityIndex(q.consumers, c)
		if q.rr >= len(q.consumers) {
			q.rr = 0
		}
		if q.rr < i && q.consumers[q.rr].priority == c.priority {
			i = q.rr
		}
		if i <= q.rr {
			q.rr++
		}
		q.consumers = slices.Insert(q.consumers, i, c)
	}
	q.turns++
	c.turn = q.turns // the general dispatch's rotation: the most recent turn is the last
	q.reorderLocked()
}

// insertByPriority inserts c after every consumer of its priority or higher.
func insertByPriority(cs []*Consumer, c *Consumer) []*Consumer {
	return slices.Insert(cs, priorityIndex(cs, c), c)
}

// priorityIndex returns where c goes in cs: after every consumer of its priority or higher.
func priorityIndex(cs []*Consumer, c *Consumer) int {
	i := 0
	for i < len(cs) && cs[i].priority >= c.priority {
		i++
	}
	return i
}

// removeConsumerLocked takes a stopped consumer out of dispatch; on a single-active-consumer
// queue whose active consumer it was, the next waiting one becomes active.
func (q *Queue) removeConsumerLocked(c *Consumer) {
	defer q.touchLocked() // the expiry clock restarts when the last consumer goes
	if c.exclusive {
		q.exclusive = false
	}
	if i := slices.Index(q.standby, c); i >= 0 {
		q.standby = slices.Delete(q.standby, i, i+1)
		return
	}
	if !c.active {
		return
	}
	c.active = false
	if i := slices.Index(q.consumers, c); i >= 0 {
		if i < q.rr {
			q.rr--
		}
		q.consumers = slices.Delete(q.consumers, i, i+1)
	} else if i := slices.Index(q.feeders, c); i >= 0 {
		q.feeders = slices.Delete(q.feeders, i, i+1)
	}
	// The next waiting consumer takes over. What c held comes back before it receives: now,
	// or, for an AutoAck consumer, when its feeder has put it back (see Queue.leaving).
	if q.cfg.singleActive && len(q.standby) > 0 && len(q.consumers)+len(q.feeders) == 0 {
		next := q.standby[0]
		q.standby = slices.Delete(q.standby, 0, 1)
		q.activateLocked(next)
		return
	}
	q.reorderLocked()
}

// reorderLocked recomputes, after the active consumers changed, whether dispatch needs the
// general path, and the order it serves them in.
func (q *Queue) reorderLocked() {
	clear(q.order)
	q.order = append(append(q.order[:0], q.consumers...), q.feeders...)
	slices.SortStableFunc(q.order, func(a, b *Consumer) int { return cmp.Compare(b.priority, a.priority) })
	q.general = false
	for _, c := range q.order {
		if c.selector != nil || c.priority != q.order[0].priority {
			q.general = true
		}
	}
}

// dispatchLocked hands ready messages to consumers with credit until either runs out. Sends
// never block: a push consumer's channel has room for its whole prefetch, and a consumer only
// receives while its outstanding deliveries are fewer than its prefetch.
func (q *Queue) dispatchLocked() {
	if q.core.ready.len() == 0 || len(q.leaving) > 0 {
		return
	}
	if q.general {
		q.dispatchGeneralLocked()
		return
	}
	for _, c := range q.feeders {
		c.feeder.wakeUp()
	}
	for q.core.ready.len() > 0 {
		c := q.creditedLocked()
		if c == nil {
			return
		}
		e, ok := q.core.take()
		if !ok {
			return // everything ready had expired
		}
		c.ch <- c.deliverLocked(e)
	}
}

// creditedLocked returns the next push consumer in round-robin order that has credit, and moves
// the turn past it; nil if none has. For the simple dispatch only.
func (q *Queue) creditedLocked() *Consumer {
	n := len(q.consumers)
	for range n {
		if q.rr >= n {
			q.rr = 0
		}
		c := q.consumers[q.rr]
		q.rr++
		if c.live < c.prefetch {
			return c
		}
	}
	return nil
}

// deliverArrivingLocked delivers a message as it arrives when the simple dispatch would take it
// at once: nothing is ready ahead of it, no stopped feeder is putting older messages back (see
// Queue.leaving), and a push consumer has credit. It spares the message the trip into the ready
// set and out again, and it is the same delivery, to the same consumer, as push and dispatch
// would make: an arriving message has not expired, even with a TTL of 0. It reports
// whether the message was delivered; if not, the caller pushes and dispatches as usual.
func (q *Queue) deliverArrivingLocked(e entry) bool {
	if q.core.ready.len() != 0 || q.general || len(q.leaving) > 0 {
		return false
	}
	c := q.creditedLocked()
	if c == nil {
		return false
	}
	c.ch <- c.deliverLocked(e)
	return true
}

// dispatchGeneralLocked is dispatch with consumer priorities or selectors: band by band, see
// the top of this file.
func (q *Queue) dispatchGeneralLocked() {
	q.cursorsLocked()
	q.pass++
	for lo := 0; lo < len(q.order) && q.core.ready.len() > 0; {
		hi := lo + 1
		for hi < len(q.order) && q.order[hi].priority == q.order[lo].priority {
			hi++
		}
		band := q.order[lo:hi]
		lo = hi
		for q.core.ready.len() > 0 {
			// The consumer with credit, not yet found wanting in this pass, whose last turn
			// is the oldest.
			var c *Consumer
			for _, x := range band {
				if x.missed != q.pass && x.hasCreditLocked() && (c == nil || x.turn < c.turn) {
					c = x
				}
			}
			if c == nil {
				break
			}
			e, ok := q.takeForLocked(c)
			if !ok {
				c.missed = q.pass
				continue
			}
			q.turns++
			c.turn = q.turns
			switch {
			case !c.autoAck:
				c.ch <- c.deliverLocked(e)
			case len(c.ch) < cap(c.ch):
				// An idle feeder sends nothing itself, so sending here keeps the channel's
				// order; what does not fit is handed to the feeder, and nothing more is sent
				// here until it has sent that.
				c.ch <- c.deliverLocked(e)
			default:
				c.feeder.hand(e)
			}
		}
	}
}

// hasCreditLocked reports whether c can receive a message now: a push consumer while it holds
// fewer than its prefetch; a feeder while it is idle with nothing handed to it, which then
// receives into its channel while that has room and then one hand-off.
func (c *Consumer) hasCreditLocked() bool {
	if c.autoAck {
		return c.feeder.idle() && !c.stopped
	}
	return c.live < c.prefetch
}

// takeForLocked removes and returns the first ready message c accepts, expiring (and
// dead-lettering) expired messages it meets at the head. A selective consumer scans each rank
// from its cursor for that rank, highest priority first.
func (q *Queue) takeForLocked(c *Consumer) (entry, bool) {
	if c.selector == nil {
		return q.core.take()
	}
	q.scan.c, q.scan.ok = c, false
	for rank := range c.cursor {
		q.core.ready.scanRank(uint8(rank), c.cursor[rank], q.scan.visit)
		if q.scan.ok {
			break
		}
	}
	e, ok := q.scan.found, q.scan.ok
	q.scan.c, q.scan.found = nil, entry{}
	if ok {
		q.core.ready.remove(e.key())
	}
	return e, ok
}

// selectorScan is the state of one selector scan, kept in the queue so that the callback is
// bound once (see newQueue) rather than allocated per scan.
type selectorScan struct {
	visit func(entry) bool // q.selectorVisit
	c     *Consumer
	found entry
	ok    bool
}

// selectorVisit is the callback of a selector scan: it moves the consumer's cursor past e and
// stops at the first message the consumer accepts.
func (q *Queue) selectorVisit(e entry) bool {
	c := q.scan.c
	c.cursor[e.rank] = e.key() + 1 // rejected or taken: either way behind the cursor now
	if q.core.expired(e) || !q.acceptsLocked(c, &e.env.msg) {
		return true // an expired message is the timer's to remove
	}
	q.scan.found, q.scan.ok = e, true
	return false
}

// acceptsLocked runs c's selector on m. A selector that panics rejects the message: the panic
// is the application's bug, but it runs under the queue lock and must not take the broker down.
// The panic is logged after the lock is released.
func (q *Queue) acceptsLocked(c *Consumer, m *Message) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			ok = false
			q.panics = append(q.panics, selectorPanic{c.tag, p})
		}
	}()
	return c.selector(m)
}

// selectorPanic is a selector's panic, to be logged once the queue lock is released.
type selectorPanic struct {
	consumer string
	value    any
}

// logPanics logs selector panics; the caller holds no lock.
func (q *Queue) logPanics(ps []selectorPanic) {
	for _, p := range ps {
		q.b.cfg.logger.Error("warren: selector panicked; message skipped", "queue", q.name, "consumer", p.consumer, "panic", p.value)
	}
}

// cursorsLocked moves the selector cursors back to the least key of each rank that came back
// to the ready set since the last dispatch, where it is below them.
func (q *Queue) cursorsLocked() {
	if !q.core.ready.lowered {
		return
	}
	for rank, floor := range q.core.ready.floors {
		if floor == noFloor {
			continue
		}
		for _, cs := range [...][]*Consumer{q.order, q.standby} {
			for _, c := range cs {
				if c.selector != nil {
					c.cursor[rank] = min(c.cursor[rank], floor)
				}
			}
		}
		q.core.ready.floors[rank] = noFloor
	}
	q.core.ready.lowered = false
}

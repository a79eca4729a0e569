package warren

import (
	"cmp"
	"slices"
)

// Dispatch: which consumer receives which message.
//
// A queue's active consumers are push consumers (manual acknowledgement: sent to under the
// queue lock while they have credit) and feeders (AutoAck: a goroutine of their own hands
// messages over, see feeder.go). They are kept in the queue's consumerSet, in push and feeders,
// each sorted by priority, highest first, and by arrival within a priority. A
// single-active-consumer queue keeps only its active consumer there and the others in standby.
//
// Two paths, chosen by consumerSet.general, which consumerSet.reorder sets whenever the
// consumers change:
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

// consumerSet is a queue's active consumers, in the orders dispatch serves them, and those
// waiting their turn on a single-active-consumer queue. Its queue's mu guards it.
type consumerSet struct {
	push      []*Consumer // active push consumers, by priority then arrival
	feeders   []*Consumer // active AutoAck consumers (feeder.go), by priority then arrival
	standby   []*Consumer // single active consumer: those waiting their turn, in order
	order     []*Consumer // push consumers and feeders by priority, for the general dispatch
	general   bool        // dispatch must heed priorities or selectors
	exclusive bool        // the active consumer is exclusive
	rr        int         // round-robin cursor into push (simple dispatch)
	pass      uint64      // general dispatch passes, to mark consumers found wanting
	turns     uint64      // deliveries made by the general dispatch, for round-robin
	had       bool        // a consumer ever existed (auto-delete)
}

// count returns the number of active consumers of every kind, waiting single-active consumers
// included (AMQP's consumer_count).
func (s *consumerSet) count() int { return len(s.push) + len(s.feeders) + len(s.standby) }

// byTag returns the consumer with tag, active or waiting its turn, or nil.
func (s *consumerSet) byTag(tag string) *Consumer {
	for _, cs := range [...][]*Consumer{s.push, s.feeders, s.standby} {
		for _, c := range cs {
			if c.tag == tag {
				return c
			}
		}
	}
	return nil
}

// admit adds a new consumer, or says why not: an exclusive consumer in use refuses all, and an
// exclusive one needs a queue without consumers and without single active consumer. On a
// single-active-consumer queue it waits its turn while another is active.
func (s *consumerSet) admit(c *Consumer, singleActive bool) error {
	switch {
	case s.exclusive:
		return errorf("in exclusive use: %w", ErrAccessRefused)
	case c.exclusive && singleActive:
		return errorf("exclusive consumer on a single active consumer queue: %w", ErrAccessRefused)
	case c.exclusive && s.count() > 0:
		return errorf("queue has consumers, cannot consume exclusively: %w", ErrAccessRefused)
	}
	s.exclusive = c.exclusive
	s.had = true
	if singleActive && len(s.push)+len(s.feeders) > 0 {
		s.standby = insertByPriority(s.standby, c)
		return nil
	}
	s.activate(c)
	return nil
}

// activate makes c an active consumer.
func (s *consumerSet) activate(c *Consumer) {
	c.active = true
	if c.autoAck {
		s.feeders = insertByPriority(s.feeders, c)
		c.feeder.wakeUp()
	} else {
		// A newcomer joins the end of the rotation, as in RabbitMQ: every consumer of its
		// priority takes its turn before it does. In the push list that is just before the
		// consumer whose turn is next, if that one is of its priority, else after its
		// priority's last; and the turn stays with the consumer it was at.
		i := priorityIndex(s.push, c)
		if s.rr >= len(s.push) {
			s.rr = 0
		}
		if s.rr < i && s.push[s.rr].priority == c.priority {
			i = s.rr
		}
		if i <= s.rr {
			s.rr++
		}
		s.push = slices.Insert(s.push, i, c)
	}
	s.turns++
	c.turn = s.turns // the general dispatch's rotation: the most recent turn is the last
	s.reorder()
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

// remove takes a stopped consumer out of dispatch; on a single-active-consumer queue whose
// active consumer it was, the next waiting one becomes active. What c held comes back before
// that one receives: now, or, for an AutoAck consumer, when its feeder has put it back (see
// Queue.leaving).
func (s *consumerSet) remove(c *Consumer, singleActive bool) {
	if c.exclusive {
		s.exclusive = false
	}
	if i := slices.Index(s.standby, c); i >= 0 {
		s.standby = slices.Delete(s.standby, i, i+1)
		return
	}
	if !c.active {
		return
	}
	c.active = false
	if i := slices.Index(s.push, c); i >= 0 {
		if i < s.rr {
			s.rr--
		}
		s.push = slices.Delete(s.push, i, i+1)
	} else if i := slices.Index(s.feeders, c); i >= 0 {
		s.feeders = slices.Delete(s.feeders, i, i+1)
	}
	if singleActive && len(s.standby) > 0 && len(s.push)+len(s.feeders) == 0 {
		next := s.standby[0]
		s.standby = slices.Delete(s.standby, 0, 1)
		s.activate(next)
		return
	}
	s.reorder()
}

// reorder recomputes, after the active consumers changed, whether dispatch needs the general
// path, and the order it serves them in.
func (s *consumerSet) reorder() {
	clear(s.order)
	s.order = append(append(s.order[:0], s.push...), s.feeders...)
	slices.SortStableFunc(s.order, func(a, b *Consumer) int { return cmp.Compare(b.priority, a.priority) })
	s.general = false
	for _, c := range s.order {
		if c.selector != nil || c.priority != s.order[0].priority {
			s.general = true
		}
	}
}

// credited returns the next push consumer in round-robin order that has credit, and moves the
// turn past it; nil if none has. For the simple dispatch only.
func (s *consumerSet) credited() *Consumer {
	n := len(s.push)
	for range n {
		if s.rr >= n {
			s.rr = 0
		}
		c := s.push[s.rr]
		s.rr++
		if c.hasCreditLocked() {
			return c
		}
	}
	return nil
}

// removeConsumerLocked takes a stopped consumer out of dispatch (consumerSet.remove); the
// queue's expiry clock restarts when the last consumer goes.
func (q *Queue) removeConsumerLocked(c *Consumer) {
	q.consumers.remove(c, q.cfg.singleActive)
	q.touchLocked()
}

// dispatchLocked hands ready messages to consumers with credit until either runs out. Sends
// never block: a push consumer's channel has room for its whole prefetch, and a consumer only
// receives while its outstanding deliveries are fewer than its prefetch.
func (q *Queue) dispatchLocked() {
	if q.core.ready.len() == 0 || len(q.leaving) > 0 {
		return
	}
	if q.consumers.general {
		q.dispatchGeneralLocked()
		return
	}
	for _, c := range q.consumers.feeders {
		c.feeder.wakeUp()
	}
	for q.core.ready.len() > 0 {
		c := q.consumers.credited()
		if c == nil {
			return
		}
		e, ok := q.core.take()
		if !ok {
			return // everything ready had expired
		}
		c.sendLocked(e)
	}
}

// deliverArrivingLocked delivers a message as it arrives when the simple dispatch would take it
// at once: nothing is ready ahead of it, no stopped feeder is putting older messages back (see
// Queue.leaving), and a push consumer has credit. It spares the message the trip into the ready
// set and out again, and it is the same delivery, to the same consumer, as push and dispatch
// would make: an arriving message has not expired, even with a TTL of 0. It reports
// whether the message was delivered; if not, the caller pushes and dispatches as usual.
func (q *Queue) deliverArrivingLocked(e entry) bool {
	if q.core.ready.len() != 0 || q.consumers.general || len(q.leaving) > 0 {
		return false
	}
	c := q.consumers.credited()
	if c == nil {
		return false
	}
	c.sendLocked(e)
	return true
}

// dispatchGeneralLocked is dispatch with consumer priorities or selectors: band by band, see
// the top of this file.
func (q *Queue) dispatchGeneralLocked() {
	q.cursorsLocked()
	q.consumers.pass++
	for lo := 0; lo < len(q.consumers.order) && q.core.ready.len() > 0; {
		hi := lo + 1
		for hi < len(q.consumers.order) && q.consumers.order[hi].priority == q.consumers.order[lo].priority {
			hi++
		}
		band := q.consumers.order[lo:hi]
		lo = hi
		for q.core.ready.len() > 0 {
			// The consumer with credit, not yet found wanting in this pass, whose last turn
			// is the oldest.
			var c *Consumer
			for _, x := range band {
				if x.missed != q.consumers.pass && x.hasCreditLocked() && (c == nil || x.turn < c.turn) {
					c = x
				}
			}
			if c == nil {
				break
			}
			e, ok := q.takeForLocked(c)
			if !ok {
				c.missed = q.consumers.pass
				continue
			}
			q.consumers.turns++
			c.turn = q.consumers.turns
			switch {
			case !c.autoAck:
				c.sendLocked(e)
			case len(c.ch) < cap(c.ch):
				// An idle feeder sends nothing itself, so sending here keeps the channel's
				// order; what does not fit is handed to the feeder, and nothing more is sent
				// here until it has sent that.
				c.sendLocked(e)
			default:
				c.feeder.hand(e)
			}
		}
	}
}

// hasCreditLocked reports whether c can receive a message now: a push consumer while it holds
// fewer than its prefetch, or, of unlimited prefetch, while its channel has room (unlimited.go); a
// feeder while it is idle with nothing handed to it, which then receives into its channel
// while that has room and then one hand-off.
func (c *Consumer) hasCreditLocked() bool {
	if c.autoAck {
		return c.feeder.idle() && !c.stopped
	}
	if c.unlimited {
		return c.unlimitedCreditLocked()
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
		// The backlog on disk too (read back a chunk at a time); a chunk that cannot be read
		// ends the scan of its rank there, its error kept for the timer to retry (wakeAtLocked).
		q.core.ready.scanWithPaged(uint8(rank), c.cursor[rank], q.scan.visit)
		if q.scan.ok {
			break
		}
	}
	e, ok := q.scan.found, q.scan.ok
	q.scan.c, q.scan.found = nil, entry{}
	if ok {
		e, ok = q.core.ready.removeWithPaged(e.key())
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
	if q.core.expired(e) || !q.acceptsLocked(c, e.env) {
		return true // an expired message is the timer's to remove
	}
	q.scan.found, q.scan.ok = e, true
	return false
}

// acceptsLocked runs c's selector on m. A selector that panics rejects the message: the panic
// is the application's bug, but it runs under the queue lock and must not take the broker down.
// The panic is logged after the lock is released.
func (q *Queue) acceptsLocked(c *Consumer, env *envelope) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			ok = false
			q.panics = append(q.panics, selectorPanic{c.tag, p})
		}
	}()
	q.selecting = env.message()                // the selector sees it only during the call (Selector)
	defer func() { q.selecting = Message{} }() // and the queue does not keep its body after
	return c.selector(&q.selecting)
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
		for _, cs := range [...][]*Consumer{q.consumers.order, q.consumers.standby} {
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

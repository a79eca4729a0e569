package warren

import (
	"cmp"
	"fmt"
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
//     feeders take the head themselves whenever they are woken and have room (R2.2).
//   - General: consumers are served band by band, highest priority first (R2.3); within a band,
//     round-robin by least recent turn among those with credit; each takes the first ready
//     message it accepts (its selector's first match, or the head). A band is done when every
//     consumer in it is out of credit or finds nothing; only then does the next band receive.
//     So a message goes to a lower band only when no consumer of a higher band with credit
//     accepts it (Qpid's noHigherPriorityWithCredit, Q8.8). Feeders take part through a hand-off:
//     an idle feeder has credit, and receiving is being handed the entry and woken.
//
// Invariants:
//   - A consumer receives only while it has credit, so a send into its channel never blocks.
//   - Every message a consumer receives is the first ready message it accepts at that moment;
//     so each consumer receives in queue order, and skipped messages keep their places.
//   - A selector's cursor: every ready message with a key below c.cursor has been rejected by
//     c's selector (or had expired). A message that joins the set below a cursor — returned,
//     promoted from a delay, or fresh at a higher priority — lowers readySet.floor, and the
//     cursors are moved back to the floor before the next scan (cursorsLocked).

// consumerCountLocked returns the number of active consumers of every kind, waiting single-active
// consumers included (AMQP's consumer_count).
func (q *Queue) consumerCountLocked() int {
	return len(q.consumers) + len(q.feeders) + len(q.standby)
}

// addConsumerLocked admits a new consumer, or refuses it: an exclusive consumer in use refuses
// all (R2.5), and an exclusive one needs a queue without consumers and without single active
// consumer (R2.4).
func (q *Queue) addConsumerLocked(c *Consumer) error {
	switch {
	case q.exclusive:
		return fmt.Errorf("warren: consume from queue %q: in exclusive use: %w", q.name, ErrAccessRefused)
	case c.exclusive && q.cfg.singleActive:
		return fmt.Errorf("warren: consume from queue %q: exclusive consumer on a single active consumer queue: %w", q.name, ErrAccessRefused)
	case c.exclusive && q.consumerCountLocked() > 0:
		return fmt.Errorf("warren: consume from queue %q: queue has consumers, cannot consume exclusively: %w", q.name, ErrAccessRefused)
	}
	q.exclusive = c.exclusive
	q.hadConsumer = true
	q.holders = append(q.holders, c)
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
		c.wakeLocked()
	} else {
		q.consumers = insertByPriority(q.consumers, c)
	}
	q.reorderLocked()
}

// insertByPriority inserts c after every consumer of its priority or higher.
func insertByPriority(cs []*Consumer, c *Consumer) []*Consumer {
	i := 0
	for i < len(cs) && cs[i].priority >= c.priority {
		i++
	}
	return slices.Insert(cs, i, c)
}

// removeConsumerLocked takes a stopped consumer out of dispatch; on a single-active-consumer
// queue whose active consumer it was, the next waiting one becomes active.
func (q *Queue) removeConsumerLocked(c *Consumer) {
	defer q.touchLocked() // the expiry clock restarts when the last consumer goes (R3.8)
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
	if q.cfg.singleActive && len(q.standby) > 0 {
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
	if q.ready.len() == 0 {
		return
	}
	if q.general {
		q.dispatchGeneralLocked()
		return
	}
	for _, c := range q.feeders {
		c.wakeLocked()
	}
	n := len(q.consumers)
	for misses := 0; misses < n && q.ready.len() > 0; {
		if q.rr >= n {
			q.rr = 0
		}
		c := q.consumers[q.rr]
		q.rr++
		if c.live >= c.prefetch {
			misses++
			continue
		}
		e, ok := q.takeLocked()
		if !ok {
			return // everything ready had expired
		}
		c.ch <- c.deliverLocked(e)
		misses = 0
	}
}

// dispatchGeneralLocked is dispatch with consumer priorities or selectors: band by band, see
// the top of this file.
func (q *Queue) dispatchGeneralLocked() {
	q.cursorsLocked()
	q.pass++
	for lo := 0; lo < len(q.order) && q.ready.len() > 0; {
		hi := lo + 1
		for hi < len(q.order) && q.order[hi].priority == q.order[lo].priority {
			hi++
		}
		band := q.order[lo:hi]
		lo = hi
		for q.ready.len() > 0 {
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
			if c.autoAck {
				c.handoff, c.handing = e, true
				c.wakeLocked()
			} else {
				c.ch <- c.deliverLocked(e)
			}
		}
	}
}

// hasCreditLocked reports whether c can receive a message now: a push consumer while it holds
// fewer than its prefetch, a feeder while it is idle with nothing handed to it.
func (c *Consumer) hasCreditLocked() bool {
	if c.autoAck {
		return c.idle && !c.handing && !c.stopped
	}
	return c.live < c.prefetch
}

// takeForLocked removes and returns the first ready message c accepts, expiring (and
// dead-lettering) expired messages it meets at the head.
func (q *Queue) takeForLocked(c *Consumer) (entry, bool) {
	if c.selector == nil {
		return q.takeLocked()
	}
	var (
		found entry
		ok    bool
	)
	q.ready.ascend(c.cursor, func(e entry) bool {
		c.cursor = e.key() + 1 // rejected or taken: either way behind the cursor now
		if q.expiredLocked(e) || !c.accepts(&e.env.msg) {
			return true // an expired message is the timer's to remove
		}
		found, ok = e, true
		return false
	})
	if ok {
		q.ready.remove(found.key())
	}
	return found, ok
}

// accepts runs c's selector on m. A selector that panics rejects the message: the panic is
// the application's bug, but it runs under the queue lock and must not take the broker down.
func (c *Consumer) accepts(m *Message) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			ok = false
			c.q.b.cfg.logger.Error("warren: selector panicked; message skipped", "queue", c.q.name, "consumer", c.tag, "panic", p)
		}
	}()
	return c.selector(m)
}

// cursorsLocked moves the selector cursors back to the least key that joined the ready set
// since the last dispatch, if it is below them.
func (q *Queue) cursorsLocked() {
	if q.ready.floor == noFloor {
		return
	}
	for _, c := range q.order {
		c.cursor = min(c.cursor, q.ready.floor)
	}
	for _, c := range q.standby {
		c.cursor = min(c.cursor, q.ready.floor)
	}
	q.ready.floor = noFloor
}

package warren

import "time"

// flush empties one batch of src's outbox, in order, with no lock held: it emits the events and
// publishes the dead letters, and returns how many of those reached a queue and how many were
// dropped.
func (b *Broker) flush(src *Queue, batch []effect) (dead, lost uint64) {
	var now time.Time
	for _, ef := range batch {
		switch {
		case ef.ev != nil:
			if e := ef.ev; e.Kind == EventAlert {
				b.cfg.logger.Warn("warren: queue alert", "queue", e.Queue, "threshold", e.Reason,
					"value", e.Value, "limit", e.Limit)
			}
			b.emit(*ef.ev)
		case ef.kind == eventDeadLetter:
			if now.IsZero() {
				now = time.Now()
			}
			if b.publishDeadLetter(src, ef.env, ef.reason, now) {
				dead++
			} else {
				lost++
			}
		case ef.kind == eventDelayed:
		default:
			b.emit(Event{Kind: ef.kind, Queue: src.name, Exchange: ef.env.exchange.name, RoutingKey: ef.env.routingKey,
				Consumer: ef.tag, Message: &ef.env.msg, Reason: ef.reason})
		}
	}
	return dead, lost
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
	if q.timerAt != 0 || q.core.ready.expiries.Len() > 0 || q.cfg.expires > 0 || q.core.delayed != nil || q.ackTimed > 0 ||
		q.cfg.alerts.Age > 0 || q.core.gets.live > 0 && q.cfg.ackTimeout > 0 {
		q.armLocked()
	}
	if len(q.blocked) > 0 && q.core.room(q.blocked[0].need) {
		close(q.blocked[0].ready) // the first waiting publisher tries again
		q.blocked = q.blocked[1:]
	}
	if q.flushing || len(q.core.effects) == 0 {
		q.mu.Unlock()
		q.b.idle.pokeIfWaiting()
		return
	}
	q.flushing = true
	for len(q.core.effects) > 0 {
		batch := q.core.effects
		q.core.effects = nil
		q.mu.Unlock()
		dead, lost := q.b.flush(q, batch)
		q.mu.Lock()
		if q.core.effects == nil && cap(batch) <= 256 {
			// Reused, so that a queue whose listeners hear every message does not allocate
			// an outbox per critical section.
			clear(batch)
			q.core.effects = batch[:0]
		}
		if dead+lost > 0 {
			q.core.deadLettered(dead, lost)
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
	for target := q.core.queuedDead; q.flushedDead < target; {
		q.flushed.Wait()
	}
}

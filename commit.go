package warren

import (
	"time"

	"github.com/warrenmq/warren/internal/wal"
)

// Leaving a critical section.
//
// A queue's critical section is entered with q.mu.Lock and left through one of three doors, all
// here:
//   - commit, the door of every section that may have changed something: it applies what the
//     section did (the core's effects, alerts, the timer, waiting publishers, WaitIdle).
//   - view, for a section that only reads: it changes nothing and does not count as a change
//     for WaitIdle (a goroutine polling Len would otherwise keep WaitIdle waiting forever).
//   - release, for a section that runs under the broker's topology lock (endQueueLocked,
//     touch): the effects of a queue's end include events, and listeners may call into the
//     broker, so they wait until the caller has released that lock and calls flushOutbox.
// No other code unlocks q.mu (architecture_test.go checks it).

// commit leaves a critical section: it checks the alert thresholds, arms the timer for the
// earliest deadline, lets the first waiting publisher try again if there is room, releases mu,
// and applies the effects the section recorded (queueCore.effects): the events and the dead
// letters.
//
// Effects are applied outside the lock, since listeners are user code and dead letters go into
// other queues (never two queue locks at once), and in the order they were recorded, whichever
// goroutine recorded them (and a queue's events in order): one goroutine at a time — the first
// to find no flush in progress — takes the effects batch by batch until there are none. A dead
// letter routed back into this queue, or a listener publishing into it, adds to the effects of
// the flush in progress, so nothing waits on itself.
func (q *Queue) commit() (lsn wal.LSN) {
	if q.log != nil && len(q.core.effects) > q.log.logged {
		// Under mu, so that the log's order is the critical sections'.
		lsn = q.b.store.logEffects(q, q.core.effects[q.log.logged:])
		q.log.logged = len(q.core.effects)
	}
	if len(q.core.ready.paged.pending) > 0 {
		q.core.ready.placePending(uint64(lsn), uint64(q.b.store.log.Written()))
	}
	if len(q.core.ready.paged.dropped) > 0 && q.log != nil {
		q.settleDroppedLocked()
	}
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
	if q.timerAt != 0 || q.core.ready.expiries.Len() > 0 || q.core.ready.paged.n > 0 || q.cfg.expires > 0 || q.core.delayed != nil || q.ackTimed > 0 ||
		q.cfg.alerts.Age > 0 || q.core.gets.live > 0 && q.cfg.ackTimeout > 0 || q.roomDue != 0 {
		q.armLocked()
	}
	if used := q.core.held - q.core.ready.paged.footprint(); used != q.heldAdded {
		q.b.mem.add(used - q.heldAdded)
		q.heldAdded = used
	}
	if len(q.blocked) > 0 && q.core.room(q.blocked[0].need) {
		close(q.blocked[0].ready) // the first waiting publisher tries again
		q.blocked = q.blocked[1:]
	}
	if q.flushing || len(q.core.effects) == 0 {
		q.mu.Unlock()
		q.b.idle.pokeIfWaiting()
		q.b.announceMemory()
		return lsn
	}
	q.flushing = true
	for len(q.core.effects) > 0 {
		batch := q.core.effects
		q.core.effects = nil
		if q.log != nil {
			q.log.logged = 0
		}
		q.mu.Unlock()
		dead, lost := q.b.flush(q, batch)
		q.mu.Lock()
		if q.core.effects == nil && cap(batch) <= 256 {
			// Reused, so that a queue whose listeners hear every message does not allocate
			// a batch per critical section.
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
	q.b.announceMemory()
	return lsn
}

// view runs read, which must only read the queue, in a critical section. (No defer: so that
// view inlines, and read's closure stays on its caller's stack.)
func (q *Queue) view(read func()) {
	q.mu.Lock()
	read()
	q.mu.Unlock()
}

// release leaves a critical section run under the broker's topology lock, leaving its effects
// for flushOutbox (see endQueueLocked, touch).
func (q *Queue) release() { q.mu.Unlock() }

// flushOutbox applies the effects of a section that ended with release, once the caller has
// released the broker's lock.
func (q *Queue) flushOutbox() {
	q.mu.Lock()
	q.commit()
}

// waitFlushedLocked waits until every dead letter recorded so far has been published.
func (q *Queue) waitFlushedLocked() {
	for target := q.core.queuedDead; q.flushedDead < target; {
		q.flushed.Wait()
	}
}

// flush applies one batch of src's effects, in order, with no lock held: it emits the events
// and publishes the dead letters, and returns how many of those reached a queue and how many
// were dropped.
func (b *Broker) flush(src *Queue, batch []effect) (dead, lost uint64) {
	var now time.Time
	listening := b.listening()
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
			outcome := b.publishDeadLetter(src, ef.e.env, ef.reason, now)
			if outcome == deadTaken {
				dead++
			} else {
				lost++
			}
			// It leaves its durable queue in the log only once its copy is in its targets or
			// dropped by a rule; refused by a closing broker, it stays there (at least once).
			if src.log != nil && outcome != deadRefused {
				b.store.settleDeadLetter(src, ef)
			}
		case ef.kind == eventDelayed, !listening:
		default:
			env := ef.e.env
			b.emit(Event{Kind: ef.kind, Queue: src.name, Exchange: env.exchange.name, RoutingKey: env.routingKey,
				Consumer: ef.tag, Message: env.messagePtr(), Reason: ef.reason})
		}
	}
	return dead, lost
}

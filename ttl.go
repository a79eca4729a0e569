package warren

import (
	"math"
	"strconv"
	"time"
)

// Message TTL and precise expiry.
//
// A message's deadline is fixed when it enters a queue: the time of entry plus the lower of the
// queue's TTL ([MessageTTL], "x-message-ttl") and the message's own ([Message.Expiration]).
// It never changes, whatever happens to the message afterwards: a delivery and a return keep it.
// Deadlines are nanoseconds since the queue's epoch on the monotonic clock, offset by one so that
// zero means "none" (8 bytes of each entry, which is 32).
//
// Invariants:
//   - Every ready entry with a deadline is in the ready set's expiry index under (deadline, seq),
//     and nothing else is. A delivered entry is not in the index: while a consumer holds a message
//     nothing happens to it.
//   - An expired message is never delivered: taking a message checks its deadline, so a timer
//     that fires late cannot let one through. The one exception: a message whose TTL is 0
//     may be taken in the same critical section in which it arrived, if a consumer can take it.
//   - One timer per queue ([time.AfterFunc]) is armed for the earliest deadline in the index, and
//     removes every message whose deadline has passed wherever it is in the queue — not only at
//     the head, as RabbitMQ's classic queues do (a deliberate difference).
//   - A message that comes back (Nack, a context end, Recover) after its deadline is expired
//     instead of going back.
//
// An expired message is dead-lettered with reason "expired" when the queue has a dead-letter
// exchange, and dropped otherwise.

// maxWait is the longest a queue waits for anything, about 146 years: every duration that meets
// its clock (a TTL, a delay, an age threshold, an ack timeout, an expiry) is capped at it by
// later. Callers that keep a duration beside the deadline it gives, to compare with, cap it too.
const maxWait = time.Duration(1<<62 - 1)

// later returns the time d after now on the queue's clock: d is capped at maxWait (a negative d
// counts as 0), and the sum saturates at math.MaxInt64 rather than wrapping. Every deadline and
// due time is computed by it. A wrapped one would be negative: it would sort first among the
// queue's deadlines, arm the timer about 292 years out (or, just past the wrap, in the past,
// firing again and again), and armLocked, which keeps a timer armed no later than a new
// deadline, would never move it sooner, freezing every TTL and delay of the queue.
func later(now int64, d time.Duration) int64 {
	d = min(max(d, 0), maxWait)
	if now > math.MaxInt64-int64(d) { // only once the queue's clock has run for ~146 years
		return math.MaxInt64
	}
	return now + int64(d)
}

// wakeAtLocked returns when the queue's timer must next run: the earliest message deadline, or
// the queue's own expiry while it has no consumers; 0 for never.
func (q *Queue) wakeAtLocked() int64 {
	at := q.core.nextDeadline()
	if q.cfg.expires > 0 && q.consumers.count() == 0 {
		if x := later(q.lastUsed, q.cfg.expires); at == 0 || x < at {
			at = x
		}
	}
	if due := q.ageDueLocked(); due != 0 && (at == 0 || due < at) {
		at = due
	}
	if q.ackTimed > 0 {
		for _, h := range q.core.holders {
			if due := h.c.ackDueLocked(); due != 0 && (at == 0 || due < at) {
				at = due
			}
		}
	}
	if q.core.gets.live > 0 && q.cfg.ackTimeout > 0 {
		for d := range q.core.gets.outstanding() { // in tag order, so in due order
			if at == 0 || d.due < at {
				at = d.due
			}
			break
		}
	}
	if q.roomDue != 0 && (at == 0 || q.roomDue < at) {
		at = q.roomDue
	}
	if q.core.ready.paged.err != nil { // a chunk could not be read back: dispatch tries again
		if retry := later(q.core.clock(), pageRetry); at == 0 || retry < at {
			at = retry
		}
	}
	return at
}

// ackDueLocked returns when c's ack timeout next ends it: the due time of its oldest
// outstanding delivery (deliveries are in tag order, and so in due order); 0 for never.
func (c *Consumer) ackDueLocked() int64 {
	if c.ackTimeout == 0 {
		return 0
	}
	for d := range c.outstanding() {
		return d.due
	}
	return 0
}

// armLocked points the queue's timer at wakeAtLocked.
func (q *Queue) armLocked() {
	at := q.wakeAtLocked()
	if at == 0 || q.endErr != nil {
		if q.timerAt != 0 {
			q.timer.Stop()
			q.timerAt = 0
		}
		return
	}
	if q.timerAt != 0 && at >= q.timerAt {
		// Armed early enough: a timer that fires before anything is due re-arms itself. This
		// spares a Reset on every delivery, which moves the earliest deadline later.
		return
	}
	d := time.Duration(max(at-q.core.clock(), 0))
	if q.timer == nil {
		q.timer = time.AfterFunc(d, q.onTimer)
	} else {
		q.timer.Reset(d)
	}
	q.timerAt = at
}

// onTimer runs on the timer's goroutine when the earliest deadline comes: it expires the
// messages due, promotes the delayed ones due, ends the consumers whose ack timeout passed, and
// deletes the queue if it has been unused for its expiry.
func (q *Queue) onTimer() {
	q.mu.Lock()
	q.timerAt = 0
	if q.endErr != nil {
		q.commit()
		return
	}
	// Counted under mu before the queue ends, so that Broker.Close, which ends every queue
	// before it waits, waits for this callback's dead letters too.
	q.b.wg.Add(1)
	defer q.b.wg.Done()
	now := q.core.clock()
	q.core.expireDue(now)
	q.core.promoteDue(now)
	q.roomLookDueLocked(now)
	var timedOut []*Consumer
	if q.ackTimed > 0 || q.core.gets.live > 0 && q.cfg.ackTimeout > 0 {
		timedOut = q.orphanLocked(func(c *Consumer) error {
			if due := c.ackDueLocked(); due != 0 && due <= now {
				return ErrAckTimeout
			}
			return nil
		}, func(r *lease) bool { return r.due != 0 && r.due <= now }, ReasonAckTimeout)
	}
	q.dispatchLocked()
	expired := q.unusedLocked(now)
	q.finishOrphans(timedOut)
	if expired {
		q.b.expireQueue(q)
	}
}

// unusedLocked reports whether the queue has been unused for its expiry, at now.
func (q *Queue) unusedLocked(now int64) bool {
	return q.cfg.expires > 0 && q.endErr == nil && q.consumers.count() == 0 &&
		now >= later(q.lastUsed, q.cfg.expires)
}

// touchLocked records a use of the queue, which postpones its expiry.
func (q *Queue) touchLocked() {
	if q.cfg.expires > 0 {
		q.lastUsed = q.core.clock()
	}
}

// touch records a use of the queue (a declaration, a lookup), which postpones its expiry, from a
// caller holding the broker's lock. The timer is left as it is: armed for the earlier expiry, it
// finds the queue used and re-arms itself.
func (q *Queue) touch() {
	if q.cfg.expires == 0 {
		return
	}
	q.mu.Lock()
	q.touchLocked()
	q.release()
}

// parseExpiration parses a message's Expiration property: "" for none (-1), else a decimal
// number of milliseconds from 0 to 2^32-1. Anything else is an error wrapping
// [ErrPreconditionFailed], as RabbitMQ's 406.
func parseExpiration(s string) (time.Duration, error) {
	if s == "" {
		return -1, nil
	}
	ms, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, errorf("invalid expiration %q: %w", s, ErrPreconditionFailed)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

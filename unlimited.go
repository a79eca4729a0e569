package warren

import "time"

// Consumers of unlimited prefetch.
//
// A push consumer's channel has room for its whole prefetch, so that dispatch, under the queue
// lock, never blocks sending to it, and its credit is its prefetch less what it holds. A
// consumer of unlimited prefetch ([Prefetch](0), AMQP's prefetch 0) may hold any number of
// deliveries unsettled; what bounds it is its channel, of unlimitedBuffer slots: it has credit
// while its channel has room. So it takes messages as fast as the application receives them,
// however many it has not settled, and while the application does not receive, the messages
// stay in the queue, where TTLs and length limits apply to them. That is what a RabbitMQ client
// with prefetch 0 sees: the server sends until the connection pushes back.
//
// Invariant: a send into the channel happens under the queue lock, only when the channel has
// room (the application receiving only makes more), so it never blocks; and under the lock
// the channel's deliveries are exactly the consumer's unreceived ones, as for a push consumer.
//
// Room made by receiving takes no lock, so nothing would dispatch to the consumer again until
// something else took the queue lock (a publish, a settlement). So when dispatch finds such a
// consumer's channel full while messages are ready (unlimitedCreditLocked), the queue's timer
// is set for a look (Queue.roomDue, ttl.go), which dispatches: after roomMinDelay, doubling up
// to roomMaxDelay while the look finds no room anywhere, back to the shortest once a consumer
// has room. Nothing is set while no message waits.

// unlimitedBuffer is the capacity of an unlimited-prefetch consumer's channel (a variable for
// the tests, which make it small).
var unlimitedBuffer = DefaultPrefetch

// The delays of the queue's look for room: the first, and the most it backs off to.
const (
	roomMinDelay = 50 * time.Microsecond
	roomMaxDelay = 10 * time.Millisecond
)

// unlimitedCreditLocked reports whether an unlimited-prefetch consumer has credit: room in its
// channel. If it has none, the queue's timer is to look again (see the top of this file).
func (c *Consumer) unlimitedCreditLocked() bool {
	q := c.q
	if len(c.ch) < cap(c.ch) {
		q.roomDelay = 0
		return true
	}
	if q.roomDue == 0 && !c.stopped {
		q.roomDue = later(q.core.clock(), max(q.roomDelay, roomMinDelay))
	}
	return false
}

// roomLookDueLocked is the queue timer's look for room, when it is due at now: the next
// look, if dispatch sets one, comes later than this one did.
func (q *Queue) roomLookDueLocked(now int64) {
	if q.roomDue == 0 || q.roomDue > now {
		return
	}
	q.roomDue = 0
	q.roomDelay = min(2*max(q.roomDelay, roomMinDelay), roomMaxDelay)
	// The caller dispatches.
}

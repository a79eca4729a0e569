package warren

import (
	"cmp"
	"context"
	"fmt"
	"slices"
)

// Returning a message to its original position.
//
// A message keeps the sequence id it was given when it entered the queue for as long as it is
// in the queue, delivered or not. Whatever brings it back — a Nack, a consumer or Get context
// that ended, Recover — reinserts it into the ready set under that id, so it lands exactly where
// it was: ahead of everything that entered the queue after it, behind everything still ready
// that entered before it (RabbitMQ's classic-queue requeue, R1.5). See [readySet] for why the
// append tail and the btree together keep that order.
//
// Two kinds of return:
//   - returnLocked: the application saw the message. It comes back redelivered, its delivery
//     count one higher.
//   - restoreLocked: the message was buffered for a consumer that stopped before receiving it.
//     It comes back unchanged, as if never delivered.

// returnLocked puts back a message the application received, redelivered.
func (q *Queue) returnLocked(e entry) {
	e.redelivered = true
	e.returns++
	q.restoreLocked(e)
}

// restoreLocked puts back a message unchanged. It does nothing once the queue has ended, so a
// deleted queue keeps no references.
func (q *Queue) restoreLocked(e entry) {
	if q.endErr != nil {
		return
	}
	q.ready.reinsert(e)
}

// Recover returns every delivery this consumer holds to its original position (AMQP's
// basic.recover with requeue): received ones redelivered, buffered unread ones unchanged. They
// are dispatched again at once, possibly to this consumer. An AutoAck consumer holds nothing to
// recover.
func (c *Consumer) Recover() error {
	q := c.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.endErr != nil {
		return fmt.Errorf("warren: recover: %w", q.endErrLocked())
	}
	if c.autoAck || c.ended {
		return nil
	}
	if !c.stopped {
		c.drainLocked()
	}
	for i := range c.unacked.len() {
		if d := c.unacked.at(i); d.state == deliveryOutstanding {
			q.settleLocked(d, settleNack)
			d.state = deliveryReturned
		}
	}
	c.tidyLocked()
	q.dispatchLocked()
	return nil
}

// returnChunk bounds how many messages a context end returns per hold of the queue lock, so
// that returning a large holding (10k costs milliseconds) does not stall publishers.
const returnChunk = 256

// reap runs when a context that owns consumers or Get deliveries of this queue ends: AMQP's
// channel close. Everything owned by any context that has ended — not only the one whose
// callback runs, since one context may own several consumers and Gets, each with its own
// callback — is claimed at once: consumers stop, and their outstanding deliveries and the
// outstanding Get deliveries become returned, so settling them now fails with
// [ErrAlreadySettled]. The messages then go back to their original positions, smallest
// sequence id first, in chunks of returnChunk; dispatch waits for the last chunk, so a consumer
// of this queue sees them in queue order: between chunks publishers enqueue and acknowledgements
// settle, but nothing is dispatched (see [Queue.dispatchLocked]). The consumers' done channels
// close once all is back.
func (q *Queue) reap() {
	q.mu.Lock()
	if q.endErr != nil {
		q.mu.Unlock()
		return
	}
	var (
		back  []entry
		ended []*Consumer
	)
	claim := func(d *Delivery) {
		d.state = deliveryReturned
		q.unacked--
		back = append(back, d.e)
	}
	for _, c := range slices.Clone(q.holders) {
		if c.owner.Err() == nil {
			continue
		}
		if !c.stopped {
			c.stopLocked(context.Cause(c.owner))
			q.removeConsumerLocked(c)
		}
		for i := range c.unacked.len() {
			if d := c.unacked.at(i); d.state == deliveryOutstanding {
				claim(d)
			}
		}
		c.unacked.clear()
		c.live = 0
		c.ended = true
		q.holders = slices.DeleteFunc(q.holders, func(x *Consumer) bool { return x == c })
		ended = append(ended, c)
	}
	for d := range q.gets {
		if d.get.ctx.Err() != nil {
			claim(d)
			delete(q.gets, d)
		}
	}
	slices.SortFunc(back, func(a, b entry) int { return cmp.Compare(a.key(), b.key()) })
	chunked := len(back) > returnChunk
	if chunked {
		q.reaping++ // dispatch waits while the lock is let go between chunks
	}
	for i, e := range back {
		if i > 0 && i%returnChunk == 0 {
			q.mu.Unlock()
			if q.betweenChunks != nil {
				q.betweenChunks()
			}
			q.mu.Lock()
		}
		q.returnLocked(e) // a no-op once the queue has ended
	}
	if chunked {
		q.reaping--
	}
	for _, c := range ended {
		c.closeDoneLocked()
	}
	q.dispatchLocked()
	autoDelete := q.shouldAutoDeleteLocked()
	q.mu.Unlock()
	for _, c := range ended {
		c.stopCtx()
		if c.autoAck {
			<-c.done // the feeder has put its messages back
		}
	}
	if autoDelete {
		q.b.autoDeleteQueue(q)
	}
}

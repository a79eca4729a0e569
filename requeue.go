package warren

import "fmt"

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
		return fmt.Errorf("warren: recover: %w", q.endErr)
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

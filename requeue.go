package warren

import (
	"context"
	"slices"
)

// Returning a message to its original position.
//
// A message keeps the sequence id it was given when it entered the queue for as long as it is
// in the queue, delivered or not. Whatever brings it back — a Nack, a consumer or Get context
// that ended, Recover, Cancel — puts it back into the ready set under that id, so it lands
// exactly where it was: ahead of everything that entered the queue after it, behind everything
// still ready that entered before it (RabbitMQ's classic-queue requeue). See [readySet].
//
// Two kinds of return:
//   - redelivered: the application saw the message. It comes back marked redelivered, its
//     delivery count one higher.
//   - unchanged: the message was buffered for a consumer that stopped before receiving it. It
//     comes back as if never delivered.
//
// One message (a Nack) goes into the ready set's btree; many at once (a context end, Recover,
// NackUpTo, Cancel's buffered deliveries) are sorted and merged, and are all back before
// anything is dispatched.

// reap runs when a context that owns consumers or Get deliveries of this queue ends: AMQP's
// channel close. Everything owned by any context that has ended — not only the one whose
// callback runs, since one context may own several consumers and Gets, each with its own
// callback — goes back in one critical section (see orphanLocked). The consumers' Done
// channels close once all of it is back.
func (q *Queue) reap() {
	q.mu.Lock()
	if q.endErr != nil {
		q.commit()
		return
	}
	if o := q.cfg.owner; o != nil && o.Err() != nil {
		// The owner of this exclusive queue ended, and with it every context that may use
		// the queue: the queue is deleted, and its consumers end with that reason
		// rather than with their contexts'.
		q.commit()
		q.b.deleteOwned(q)
		return
	}
	// Counted under mu before the queue ends, so Broker.Close, which ends every queue before
	// it waits, waits for this goroutine too.
	q.b.wg.Add(1)
	defer q.b.wg.Done()
	ended := q.orphanLocked(func(c *Consumer) error {
		if c.owner.Err() != nil {
			return context.Cause(c.owner)
		}
		return nil
	}, func(r *lease) bool { return r.get != nil && r.get.ctx.Err() != nil }, ReasonOwnerEnded)
	q.dispatchLocked()
	q.finishOrphans(ended)
}

// orphanLocked ends every holder for which end returns a reason, and returns every outstanding
// Get delivery for which get (if not nil) returns true, in one critical section: the consumers
// stop with that reason, their buffered unread deliveries come back unchanged, their received
// outstanding ones and those Get deliveries come back redelivered (settling them now fails with
// [ErrAlreadySettled]). On a single-active-consumer queue the next consumer becomes active as
// the active one ends, and receives once the caller dispatches, after everything is back: so a
// consumer of this queue sees them in queue order. It returns the consumers it ended, for
// finishOrphans.
func (q *Queue) orphanLocked(end func(*Consumer) error, get func(*lease) bool, why Reason) []*Consumer {
	var (
		back  []entry
		ended []*Consumer
	)
	q.core.holders = slices.DeleteFunc(q.core.holders, func(h *holder) bool {
		c := h.c
		reason := end(c)
		if reason == nil {
			return false
		}
		if !c.stopped {
			back = c.stopLocked(reason, back, why)
			q.removeConsumerLocked(c)
		}
		back = q.core.takeBack(h, back, why)
		q.core.clear(h)
		c.ended = true
		q.unholdLocked(c)
		ended = append(ended, c)
		return true
	})
	if get != nil {
		for r := range q.core.gets.outstanding() {
			if get(r) {
				if r.get != nil {
					r.get.stop() // an ack timeout's return: its context no longer owns anything here
				}
				q.core.release(r, deliveryReturned)
				e := redelivered(r.e)
				q.core.back(&q.core.gets, e, why)
				back = append(back, e)
			}
		}
		q.core.trim(&q.core.gets)
	}
	q.core.restoreAll(back)
	for _, c := range ended {
		if c.autoAck {
			c.signalStopLocked() // the feeder puts its messages back, then closes done
		} else {
			q.ending = append(q.ending, c) // until finishOrphans closes done
		}
	}
	return ended
}

// finishOrphans finishes ending the consumers orphanLocked ended, and releases mu: it publishes
// the dead letters of what had expired meanwhile (or hands them to the flush in progress), and
// only then closes the consumers' Done channels, so that by then what came back has been dealt
// with, dead letters included. It deletes an auto-delete queue whose last consumer they were.
func (q *Queue) finishOrphans(ended []*Consumer) {
	autoDelete := len(ended) > 0 && q.shouldAutoDeleteLocked()
	q.commit()
	if len(ended) == 0 {
		return
	}
	q.mu.Lock()
	q.waitFlushedLocked()
	for _, c := range ended {
		c.signalStopLocked()
		if i := slices.Index(q.ending, c); i >= 0 {
			q.ending = slices.Delete(q.ending, i, i+1)
		}
	}
	q.commit() // WaitReleased may wait for these ends
	for _, c := range ended {
		c.stopCtx()
		if c.autoAck {
			<-c.done
		}
	}
	if autoDelete {
		q.b.autoDeleteQueue(q)
	}
}

package warren

import (
	"context"
	"iter"
	"sync"
	"sync/atomic"
)

// Idle: a barrier for tests.
//
// A queue is busy while something will happen to its messages without anyone calling in:
//   - it has effects (events, dead letters) not yet applied, or a goroutine is applying them;
//   - a stopped AutoAck consumer is putting back what it held (Queue.leaving);
//   - a feeder is taking or handing over a message (not parked, and not stuck sending into a
//     full channel: a channel nobody reads is the application's to drain);
//   - a consumer started by Serve holds deliveries: its handlers are running or about to;
//   - the context owning a consumer, or a Get delivery, has ended and what it holds is not yet
//     back (the return runs on another goroutine);
//   - a timer will move a message: a ready message has a TTL, a message is delayed, or a
//     delivery has an ack timeout; or a timer will delete the queue with ready messages in it:
//     its expiry ([Expires], while it has no consumer) or the age threshold of a [Delete]
//     policy.
//
// Deliveries held by a plain consumer or a Get are the application's: they do not make the
// queue busy (except through an ack timeout), until the context that owns them ends: from then
// until they are back, the queue is busy. A queue's dispatch runs in every critical section
// that could let a consumer take a message, so "a ready message and a consumer with credit that
// accepts it" never outlives one and needs no check of its own.
//
// Every critical section that ends with commit pokes the broker's idle generation while
// someone waits, so WaitIdle re-checks after any change and knows a pass over the queues saw
// one consistent state when the generation did not move during it.

// idleWaiters is the state WaitIdle waits on. waiting says, without the lock, whether anyone
// waits; mu guards the rest.
type idleWaiters struct {
	waiting atomic.Int32 // WaitIdle calls in progress
	mu      sync.Mutex
	gen     uint64        // bumped on every change while someone waits
	changed chan struct{} // closed and replaced when gen moves
}

// pokeIfWaiting tells the waiters, if there are any, that a queue's state changed: a broker nobody
// waits on pays one atomic load. The caller holds no queue lock, and calls it after the change
// is visible: after releasing the queue's lock.
func (w *idleWaiters) pokeIfWaiting() {
	if w.waiting.Load() != 0 {
		w.poke()
	}
}

// poke tells the waiters that a queue's state changed.
func (w *idleWaiters) poke() {
	w.mu.Lock()
	w.gen++
	if w.changed != nil {
		close(w.changed)
		w.changed = nil
	}
	w.mu.Unlock()
}

// WaitIdle waits until no message of the broker's can make progress by itself — see the list
// below — and returns nil, or ctx.Err() if ctx ends first. It is a barrier for tests: publish,
// WaitIdle, then assert, with no sleeps. Inside a [testing/synctest] bubble, time-driven
// progress (a TTL, a delay, an ack timeout, a Backoff) is waited for in virtual time, so a
// test of a one-hour retry flow takes milliseconds.
//
// The broker is idle when, in every queue: no consumer started by [Queue.Serve] holds a
// delivery (no handler is running or about to); no AutoAck consumer is moving a message into
// its channel, unless the channel is full; no dead letter or event is on its way; no ready
// message has a TTL, none is delayed, no delivery has an ack timeout running, and no queue
// holding ready messages is due to be deleted by its [Expires] or a [Delete] age threshold.
// Deliveries
// held by [Queue.Consume] consumers and by [Queue.Get] are the application's to settle and do
// not count, nor do messages buffered in a consumer's channel for the application to receive —
// until the context that owns them ends: then WaitIdle waits until they are back in the queue.
// Work outside the broker (a publish still in progress) is not seen.
func (b *Broker) WaitIdle(ctx context.Context) error {
	return b.waitFor(ctx, func() (bool, error) {
		for q := range b.Queues() {
			if q.busy() {
				return false, nil
			}
		}
		return true, nil
	})
}

// WaitEmpty waits until the queue holds no message — none ready, none delayed ([DeliverAfter],
// [Delivery.NackWithDelay]), no delivery outstanding with a consumer or a Get, none on its way
// back from a stopped consumer — and returns nil; or returns ctx.Err() if ctx ends first, or an
// error wrapping [ErrQueueDeleted] (or [ErrClosed]) if the queue goes. It is how a service drains
// a queue before it stops: stop publishing, WaitEmpty with a deadline, then end its
// [Queue.Serve] (whose handlers have then settled everything). Unlike [Broker.WaitIdle], it
// looks at this queue alone, and a message waiting for its TTL keeps it waiting until the
// message expires. Messages published meanwhile are waited for too. Inside a [testing/synctest]
// bubble it waits through virtual time.
func (q *Queue) WaitEmpty(ctx context.Context) error {
	return q.b.waitFor(ctx, func() (empty bool, err error) {
		q.view(func() { empty, err = q.emptyLocked() })
		return empty, err
	})
}

// emptyLocked reports whether the queue holds no message (see WaitEmpty), or why it never will.
func (q *Queue) emptyLocked() (bool, error) {
	if q.endErr != nil {
		return false, errorf("wait for queue %q to empty: %w", q.name, q.endErrLocked())
	}
	if q.core.ready.len() > 0 || q.core.unacked > 0 || len(q.leaving) > 0 || q.core.delayed != nil && q.core.delayed.Len() > 0 {
		return false, nil
	}
	for _, h := range q.core.holders {
		if h.c.feeder.state == feederHanded { // a message on its way to an AutoAck consumer's feeder
			return false, nil
		}
	}
	return true, nil
}

// waitFor waits until reached reports true, or an error, for a state of the broker's queues that
// no critical section changed while reached looked at it; or until ctx ends. reached must read
// each queue it looks at in a critical section of that queue's.
//
// While anyone waits, every critical section that ends with commit pokes b.idle: so reached runs
// again after any change, and a pass during which the generation did not move saw one consistent
// state.
func (b *Broker) waitFor(ctx context.Context, reached func() (bool, error)) error {
	b.idle.waiting.Add(1)
	defer b.idle.waiting.Add(-1)
	for {
		b.idle.mu.Lock()
		gen := b.idle.gen
		if b.idle.changed == nil {
			b.idle.changed = make(chan struct{})
		}
		changed := b.idle.changed
		b.idle.mu.Unlock()
		ok, err := reached()
		if err != nil {
			return err
		}
		b.idle.mu.Lock()
		still := b.idle.gen == gen
		b.idle.mu.Unlock()
		if ok && still {
			return nil
		}
		if ok {
			continue // something changed during the pass: look again
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// busy reports whether something will happen to the queue's messages without anyone calling
// in (see the top of this file).
func (q *Queue) busy() (busy bool) {
	q.view(func() { busy = q.busyLocked() })
	return busy
}

// busyLocked reports whether the queue is busy (see busy).
func (q *Queue) busyLocked() bool {
	if q.endErr != nil {
		return false
	}
	if q.flushing || len(q.core.effects) > 0 || len(q.leaving) > 0 || q.core.ready.hasDeadlines() ||
		(q.core.delayed != nil && q.core.delayed.Len() > 0) {
		return true
	}
	if q.core.ready.len() > 0 && (q.cfg.expires > 0 && q.consumers.count() == 0 ||
		q.cfg.alerts.Policy == Delete && q.ageDueLocked() != 0) {
		return true // the queue will be deleted, by its expiry or its age threshold, and its messages dropped
	}
	if q.core.gets.live > 0 && q.cfg.ackTimeout > 0 {
		return true // the consumer timeout will take the Gets back
	}
	for d := range q.core.gets.outstanding() {
		if d.get != nil && d.get.ctx.Err() != nil {
			return true // its owner ended: it is on its way back
		}
	}
	for _, h := range q.core.holders {
		switch c := h.c; {
		case c.owner.Err() != nil:
			return true // its context ended: what it holds is on its way back
		case c.autoAck:
			if c.feeder.busy(c) {
				return true
			}
		case c.live == 0:
		case c.served || c.ackTimeout > 0:
			return true
		}
	}
	return false
}

// DeliveryInfo describes one outstanding delivery, for inspection ([Queue.Outstanding]).
type DeliveryInfo struct {
	Message       *Message // shared and read-only
	ConsumerTag   string   // empty for a Get
	DeliveryTag   uint64
	Redelivered   bool
	DeliveryCount int
}

// Outstanding returns the queue's deliveries not yet settled — received by consumers or still
// buffered in their channels, and Gets — as a snapshot taken in one critical section when the
// iteration starts: consumers in the order they started, each in tag order, then Gets in tag
// order. It describes them rather than handing them out: settle a delivery through the
// Delivery its consumer received.
func (q *Queue) Outstanding() iter.Seq[DeliveryInfo] {
	return func(yield func(DeliveryInfo) bool) {
		var ds []DeliveryInfo
		q.view(func() {
			for r := range q.core.outstanding() {
				ds = append(ds, DeliveryInfo{Message: r.e.env.messagePtr(), ConsumerTag: r.h.tag, DeliveryTag: r.tag,
					Redelivered: r.e.redelivered, DeliveryCount: int(r.e.returns)})
			}
		})
		for _, d := range ds {
			if !yield(d) {
				return
			}
		}
	}
}

package warren

import "slices"

// AutoAck consumers and their feeders.
//
// A push consumer is sent to under the queue lock while it has credit, and its acks say when it
// has room again. An AutoAck consumer never acks, so only a blocking send can tell that the
// application made room: each AutoAck consumer has a goroutine of its own, its feeder, which
// takes one message at a time under the lock and sends it into the consumer's channel outside
// the lock. The channel has prefetch-1 slots and the feeder holds at most one more message
// while it waits to send it, so the consumer holds at most its prefetch.
//
// A feeder is in one of these states (feederState), changed under the queue lock:
//
//	taking   its goroutine runs: it is taking a message, or about to
//	parked   it holds nothing and waits for a wake-up (wakeLocked moves it to woken)
//	woken    it holds nothing; woken, its goroutine has not run yet
//	handed   a message was handed to it (handoff), which its goroutine has not taken yet
//	sending  it is sending a delivery into the channel, outside the lock (and blocks there
//	         while the channel is full)
//
// Where messages reach it:
//   - On dispatch's simple path, dispatch wakes it and it takes the head itself (take): push
//     consumers with credit are served first, in the critical section that made messages
//     ready, and a feeder takes what they leave.
//   - On the general path (priorities, selectors) it is one of the consumers dispatch serves,
//     with credit while it holds nothing (parked or woken): dispatch sends into its channel
//     while that has room, and hands it one more (handed). Its goroutine runs the general
//     dispatch itself when it has room again.
//   - An arriving message with TTL 0 that no push consumer took is handed to a parked or woken
//     feeder (handOffLocked), so that it does not expire before the goroutine runs.
//
// When the consumer stops, halt is closed: the feeder puts back what it holds, what it was
// handed and what is still buffered in the channel, in one critical section, and the queue
// dispatches nothing meanwhile (Queue.leaving): those messages are older than anything that
// could go out. Then it closes the channel and done, and exits.
type feeder struct {
	wake    chan struct{} // capacity 1: messages may be ready
	halt    chan struct{} // closed when the consumer stops
	state   feederState
	handoff entry // in state handed: the message
}

// feederState is where a feeder stands; see the top of this file.
type feederState uint8

const (
	feederTaking feederState = iota
	feederParked
	feederWoken
	feederHanded
	feederSending
)

// idle reports whether the feeder holds nothing: it may be handed a message.
func (f *feeder) idle() bool { return f.state == feederParked || f.state == feederWoken }

// wakeUp tells a parked feeder that messages may be ready.
func (f *feeder) wakeUp() {
	if f.state == feederParked {
		f.state = feederWoken
		select {
		case f.wake <- struct{}{}:
		default:
		}
	}
}

// hand gives an idle feeder a message to send, and wakes it.
func (f *feeder) hand(e entry) {
	parked := f.state == feederParked
	f.state, f.handoff = feederHanded, e
	if parked {
		select {
		case f.wake <- struct{}{}:
		default:
		}
	}
}

// takeHandoff returns the message the feeder was handed, if it was, and forgets it.
func (f *feeder) takeHandoff() (entry, bool) {
	if f.state != feederHanded {
		return entry{}, false
	}
	e := f.handoff
	f.state, f.handoff = feederTaking, entry{}
	return e, true
}

// busy reports whether the feeder will move a message by itself: it was handed one, or it is
// running, or sending into a channel that has room (one that is full is the application's to
// drain).
func (f *feeder) busy(c *Consumer) bool {
	switch f.state {
	case feederHanded:
		return true
	case feederTaking:
		return !c.stopped
	case feederSending:
		return !c.stopped && len(c.ch) < cap(c.ch)
	}
	return false
}

// bufferSize is the capacity of a consumer's channel: its prefetch, so that dispatch never blocks
// on it. An AutoAck consumer's feeder holds one more message while it waits to send it, so its
// channel has one slot less, and the consumer holds at most its prefetch either way.
func bufferSize(cfg consumeConfig) int {
	if cfg.autoAck {
		return cfg.prefetch - 1
	}
	return cfg.prefetch
}

// feed is the feeder's goroutine.
func (c *Consumer) feed() {
	q, f := c.q, &c.feeder
	var unsent Delivery // taken from the queue when halt came, never sent
	for unsent.q == nil {
		q.mu.Lock()
		if f.state != feederHanded {
			f.state = feederTaking // a send that filled the channel is over
		}
		if c.stopped {
			q.commit()
			break
		}
		e, ok := f.takeHandoff()                    // handed by dispatch, or as it arrived with TTL 0
		if !ok && c.active && len(q.leaving) == 0 { // see Queue.leaving
			if q.consumers.general {
				f.state = feederWoken // idle: the general dispatch hands it its messages
				q.dispatchLocked()
				e, ok = f.takeHandoff()
			} else {
				e, ok = q.core.take()
			}
		}
		if !ok {
			f.state = feederParked
			q.commit()
			select {
			case <-f.wake:
			case <-f.halt:
			}
			continue
		}
		var d Delivery
		c.deliverLocked(e, &d)
		f.state = feederSending
		q.commit()
		select {
		case c.ch <- d:
		case <-f.halt:
			unsent = d
		}
	}
	// One critical section: what the feeder held and what is buffered go back together,
	// before anything is dispatched.
	q.mu.Lock()
	var back []entry
	why := ReasonReturned
	if q.endErr != nil {
		why = "" // nothing goes back into an ended queue, and these were acked: no effects
	}
	if unsent.q != nil {
		back = append(back, unsent.e)
		q.core.back(&c.holder, unsent.e, why)
	}
	back = c.drainLocked(back, why)
	if e, ok := f.takeHandoff(); ok {
		// Handed over but never delivered, so never recorded: it goes back as if it had not
		// left (and expires as it comes back, if it must). (A queue that ended dropped it
		// itself, dropHandoffLocked.)
		back = append(back, e)
	}
	f.state = feederTaking
	q.core.restoreAll(back)
	if i := slices.Index(q.leaving, c); i >= 0 {
		q.leaving = slices.Delete(q.leaving, i, i+1)
	}
	q.dispatchLocked()
	// Closed in the critical section that puts its messages back, so that whoever looks at
	// the queue sees both or neither (Broker.WaitReleased).
	close(c.ch)
	q.commit()
	// Only now: whoever waits for the consumer to end (Cancel, Close, a deletion) finds the
	// effects of what came back applied, its events emitted, as a push consumer's Cancel does.
	close(c.done)
}

// handOffLocked gives an arriving TTL-0 message that no push consumer took to an idle feeder,
// if it is the only ready message: a consumer can take it as it arrives, so it must not expire.
// A feeder takes messages only after this critical section, so an idle one is handed the
// message here.
func (q *Queue) handOffLocked(e entry) {
	// The general dispatch hands feeders their messages itself; and nothing goes out while a
	// stopped feeder puts back older messages (see leaving).
	if q.core.ready.len() != 1 || q.consumers.general || len(q.leaving) > 0 {
		return
	}
	for _, c := range q.consumers.feeders {
		if c.feeder.idle() {
			if got, ok := q.core.ready.remove(e.key()); ok {
				c.feeder.hand(got)
			}
			return
		}
	}
}

// dropHandoffLocked drops the message handed to c's feeder, if it has not taken it yet: its
// queue ended.
func (q *Queue) dropHandoffLocked(c *Consumer, why Reason) {
	if e, ok := c.feeder.takeHandoff(); ok {
		q.core.drop(e, why)
	}
}

package warren_test

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/warrenmq/warren"
)

// The stress tests' consumer steps, which TestStress, TestStressScale and TestStressFeatures
// share: holding deliveries to settle them together with AckUpTo, and receiving without leaving
// held credit idle while waiting.

// stressBook is what the shared consumer steps need of a stress test's ledger.
type stressBook interface {
	// errorf reports a failure.
	errorf(format string, args ...any)
	// ack records a successful ack of id (negative: a delivery the ledger did not recognise).
	ack(id int)
	// countUpTo counts a successful AckUpTo, for the log.
	countUpTo()
}

// stressHeld are the deliveries a stress consumer has received and not yet settled, in tag
// order, to be acked together with AckUpTo.
type stressHeld struct {
	c   *warren.Consumer
	l   stressBook
	rng *rand.Rand // draws the AckUpTo tag
	max int        // hold acks everything once this many are held; 0: only flush does

	ds  []warren.Delivery
	ids []int // the ledger's id of each of ds
}

// hold adds d, received as id, to what is held, and flushes once max deliveries are held.
func (h *stressHeld) hold(d warren.Delivery, id int) {
	h.ds = append(h.ds, d)
	h.ids = append(h.ids, id)
	if h.max > 0 && len(h.ds) >= h.max {
		h.flush()
	}
}

// ack settles d, received as id, with a successful ack: held for AckUpTo (see hold) if
// batched, otherwise acked on its own at once.
func (h *stressHeld) ack(d warren.Delivery, id int, batched bool) {
	if batched {
		h.hold(d, id)
		return
	}
	if err := d.Ack(); err != nil {
		h.l.errorf("Ack() = %v, want nil", err)
	} else {
		h.l.ack(id)
	}
}

// flush acks everything held with one AckUpTo, of the last held tag or, one time in four, of
// tag 0, which covers exactly the received deliveries: those held. It records the acks if
// AckUpTo succeeds and forgets what is held either way. With nothing held it does nothing,
// not even draw from rng.
func (h *stressHeld) flush() {
	if len(h.ds) == 0 {
		return
	}
	tag := h.ds[len(h.ds)-1].DeliveryTag
	if h.rng.IntN(4) == 0 {
		tag = 0
	}
	if err := h.c.AckUpTo(tag); err != nil {
		h.l.errorf("AckUpTo(%d) = %v, want nil", tag, err)
	} else {
		h.l.countUpTo()
		for _, id := range h.ids {
			h.l.ack(id)
		}
	}
	h.forget()
}

// settleEach settles every held delivery on its own, with settle, and forgets them.
func (h *stressHeld) settleEach(settle func(d warren.Delivery, id int)) {
	for i, d := range h.ds {
		settle(d, h.ids[i])
	}
	h.forget()
}

// recoverAll returns every unacked delivery of the consumer with Recover — what is held and
// what was received since — and forgets what is held, which has gone back with it.
func (h *stressHeld) recoverAll() {
	if err := h.c.Recover(); err != nil {
		h.l.errorf("Recover() = %v, want nil", err)
	}
	h.forget()
}

func (h *stressHeld) forget() { h.ds, h.ids = h.ds[:0], h.ids[:0] }

// stressGot says how stressReceive ended.
type stressGot int

const (
	stressDelivery stressGot = iota // a delivery
	stressClosed                    // Deliveries was closed: the consumer has ended
	stressIdle                      // idle fired before a delivery came
	stressOver                      // the run is over: done was closed or ctx ended
)

// stressReceive takes c's next delivery. If none is buffered, it first calls flush (unless nil)
// to settle what the consumer holds: the credit that blocks may be what the messages that remain
// need, so it must not sit idle while the consumer waits. Then it waits for a delivery, for idle
// (nil: no limit), or for the end of the run, done or ctx.
func stressReceive(ctx context.Context, c *warren.Consumer, done <-chan struct{}, idle <-chan time.Time, flush func()) (d warren.Delivery, got stressGot) {
	var ok bool
	select {
	case d, ok = <-c.Deliveries():
	default:
		if flush != nil {
			flush()
		}
		select {
		case d, ok = <-c.Deliveries():
		case <-idle:
			return warren.Delivery{}, stressIdle
		case <-done:
			return warren.Delivery{}, stressOver
		case <-ctx.Done():
			return warren.Delivery{}, stressOver
		}
	}
	if !ok {
		return warren.Delivery{}, stressClosed
	}
	return d, stressDelivery
}

// stressConsume starts a consumer of q, owned by ctx, with a random prefetch, and returns it
// with how many deliveries it may hold (for an unlimited one, how many it is to hold at most):
// mostly 1 to 32, one time in ten 300 to 999, large enough that a context end returns more than
// one chunk; with unlimited, one time in three unlimited (0), whose credit is room in its
// channel (unlimited.go). A failure is reported to l unless the run is ending (parent
// done); nil then.
func stressConsume(parent, ctx context.Context, q *warren.Queue, l stressBook, rng *rand.Rand, unlimited bool) (*warren.Consumer, int) {
	prefetch := 1 + rng.IntN(32)
	switch {
	case rng.IntN(10) == 0:
		prefetch = 300 + rng.IntN(700)
	case unlimited && rng.IntN(3) == 0:
		prefetch = 0
	}
	c, err := q.Consume(ctx, warren.Prefetch(prefetch))
	if err != nil {
		if parent.Err() == nil {
			l.errorf("Consume(Prefetch(%d)) = %v, want nil", prefetch, err)
		}
		return nil, 0
	}
	if prefetch == 0 {
		return c, 64
	}
	return c, prefetch
}

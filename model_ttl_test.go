package warren_test

// Model-based test of time (STYLE habit 34), beside model_test.go's model of dispatch: a
// deliberately naive reference, mtModel, mirrors one queue "main" with message TTL, a delivery
// limit, length limits, delayed messages (NackWithDelay, DeliverAfter), consumers' ack timeouts
// (AckTimeout, "x-consumer-timeout") and dead-lettering through a fanout exchange "e-dead" into
// a queue "dead". A driver runs the same operation sequence against it and a real broker in a
// synctest bubble, and compares after every step: main.Len, main.Unacked, main.ConsumerCount,
// the virtual clock, every Publish and Get result and every delivery received (with its tag,
// flags and count), each consumer's buffered deliveries, Err, Done and whether Deliveries is
// closed, and the list of dead letters that reached "dead" — body, message id, reason, x-death
// count, original-expiration — in arrival order, which it reads by draining "dead" with AutoAck
// Gets after each step.
//
// Gets, and in half of the sequences push consumers, pull from main. The consumers all have
// priority 0, no selector and manual acknowledgement (model_test.go covers the rest of
// dispatch), so dispatch is the simple path's round-robin, which runs synchronously in the step
// (or in the timer's callback, awaited by synctest.Wait): which message a step touches never
// depends on scheduling. AutoAck consumers are left out: their feeder goroutines would make it
// depend. Gets and consumers are owned by contexts from a pool: each takes a fresh one or shares
// a live one, and ending a context returns at once all its consumers' deliveries (buffered ones
// unchanged, received ones redelivered) and its outstanding Gets, then dispatches.
//
// Ack timeouts: a consumer's delivery is due its ack timeout after it was dispatched; when the
// oldest outstanding delivery of a consumer (buffered or received, also after Cancel) is due,
// the consumer ends as on a context end — Err wraps ErrAckTimeout unless it was cancelled
// before, buffered deliveries come back unchanged, received ones redelivered, all together with
// those of other consumers due at the same instant — and the queue dispatches. A Get delivery
// is due the queue's consumer timeout ("x-consumer-timeout") after the Get, and comes back
// redelivered when it is due, with the consumers' of that instant.
//
// The rules the model holds to (SEMANTICS R1.5, R1.10, R3.3-R3.6, R4.2, R4.9, R5.1-R5.3, and
// the doc comments of ttl.go, requeue.go and queue.go):
//   - A message's deadline is fixed on entry: publish time + min(queue TTL, message TTL). It is
//     expired when its deadline is not after now: an expired message is never delivered, and a
//     ready one is dead-lettered "expired" exactly at its deadline, wherever it is in the queue.
//   - A TTL-0 message (deadline = arrival) is dead-lettered at once on publish unless a
//     consumer with credit takes it as it arrives (R3.5): dispatch runs before the expiry.
//   - A return (Nack, the owning context's end, Recover, an ack timeout) makes it redelivered
//     with one more return; a buffered, unread delivery that comes back (Cancel, Recover, a
//     context end, an ack timeout) is unchanged. Past its deadline it is dead-lettered
//     "expired", past the delivery limit "delivery_limit", else it goes back under its seq and
//     drop-head runs. What comes back together (a context end, Cancel, Recover, ack timeouts at
//     one instant) comes back in seq order (so the dead letters come in queue order), then
//     drop-head runs once. Every settlement, return, Consume and timer run ends with a dispatch.
//   - Length limits count ready messages only. Reject-publish refuses a message that does not
//     fit (ErrQueueFull, nothing enqueued); reject-publish-dlx also dead-letters it "maxlen".
//     Drop-head enqueues, then drops the head (smallest seq) while over a limit, "maxlen" (or
//     "expired" for a head already past its deadline, which the model never sees).
//   - NackWithDelay(d > 0) checks expiry and the delivery limit like a return, else hides the
//     message until due; DeliverAfter hides a new message (after the reject-publish check, before
//     any expiry). When due, it rejoins at its seq, or is dead-lettered "expired" if its deadline
//     has passed; drop-head runs after each one that rejoins.
//   - Reject dead-letters "rejected". Ack removes.
//
// Simultaneous events. Time moves only in an advance step (time.Sleep, then synctest.Wait), and
// every other step's effects happen at one instant in one goroutine (a context end's in its
// AfterFunc, awaited by synctest.Wait before anything else runs). Within an advance the queue's
// one timer fires at each distinct event time, in order; events that share an instant are
// handled in one critical section in a fixed order — first every ready message whose deadline
// has come, by (deadline, seq), then every delayed message now due, by (due, seq), each followed
// by drop-head, then the consumers whose ack timeout has come, their messages returned in seq
// order (each one past its deadline or the delivery limit dead-lettered), then drop-head once,
// then one dispatch — and the model does the same. So no order depends on the scheduler, ties
// (equal deadlines, a deadline equal to a due time, an event at the very end of a sleep) are
// generated freely, and dead letters are compared as an exact ordered list, never as a multiset.
//
// TestModelTime draws sequences from a seeded math/rand/v2 source (WARREN_MODELTIME_SEED sets
// the first seed, WARREN_MODELTIME_SEQS how many); FuzzModelTime decodes them from the fuzzer's
// bytes: five bytes of queue configuration, then four per operation (kind, a, b, c).

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warrenmq/warren"
)

// ---------------------------------------------------------------------------------------------
// The reference.

// mtCfg is main's configuration; -1 is "none".
type mtCfg struct {
	ttl        time.Duration // queue message TTL
	limit      int           // delivery limit
	maxLen     int
	maxBytes   int
	overflow   warren.OverflowPolicy
	ackTimeout time.Duration // "x-consumer-timeout": the consumers' default ack timeout
}

func (c mtCfg) options() []warren.QueueOption {
	var o []warren.QueueOption
	if c.ttl >= 0 {
		o = append(o, warren.MessageTTL(c.ttl))
	}
	if c.limit >= 0 {
		o = append(o, warren.DeliveryLimit(c.limit))
	}
	if c.maxLen >= 0 {
		o = append(o, warren.MaxLength(c.maxLen))
	}
	if c.maxBytes >= 0 {
		o = append(o, warren.MaxLengthBytes(c.maxBytes))
	}
	if c.ackTimeout >= 0 {
		o = append(o, warren.Arguments(warren.Table{"x-consumer-timeout": int64(c.ackTimeout / time.Millisecond)}))
	}
	return append(o, warren.Overflow(c.overflow))
}

func (c mtCfg) String() string {
	var s []string
	if c.ttl >= 0 {
		s = append(s, "ttl "+c.ttl.String())
	}
	if c.limit >= 0 {
		s = append(s, "delivery limit "+strconv.Itoa(c.limit))
	}
	if c.maxLen >= 0 {
		s = append(s, "max length "+strconv.Itoa(c.maxLen))
	}
	if c.maxBytes >= 0 {
		s = append(s, "max bytes "+strconv.Itoa(c.maxBytes))
	}
	if c.ackTimeout >= 0 {
		s = append(s, "consumer timeout "+mtDur(c.ackTimeout))
	}
	return strings.Join(append(s, string(c.overflow)), ", ")
}

// mtCfgBytes is the length of main's configuration in the fuzz input.
const mtCfgBytes = 6

// decodeMTCfg reads main's configuration from six bytes.
func decodeMTCfg(p []byte) mtCfg {
	var b [mtCfgBytes]byte
	copy(b[:], p)
	c := mtCfg{ttl: -1, limit: -1, maxLen: -1, maxBytes: -1, ackTimeout: -1}
	if b[0]%3 != 0 {
		c.ttl = time.Duration(200+int(b[0])*20) * time.Millisecond // 0.22 s to 5.3 s
	}
	if b[1]%5 != 0 {
		c.limit = int(b[1]%5) - 1 // 0..3
	}
	if b[2]%8 >= 3 {
		c.maxLen = int(b[2]%8) - 2 // 1..5
	}
	c.overflow = [...]warren.OverflowPolicy{warren.DropHead, warren.RejectPublish, warren.RejectPublishDLX}[b[3]%3]
	if b[4]%4 >= 2 {
		c.maxBytes = int(b[4]/4) % 13 // 0..12; bodies are 1..4 bytes
	}
	if b[5]%4 == 3 {
		c.ackTimeout = time.Duration(50+int(b[5]/4)*40) * time.Millisecond // 0.05 s to 2.57 s
	}
	return c
}

// mtMsg is a message in the reference queue, or as a delivery carried it.
type mtMsg struct {
	id          int // MessageID "m<id>"
	body        string
	exp         string // the Expiration it was published with
	seq         uint64
	deadline    time.Duration // since the bubble's start; -1 for none
	returns     int
	redelivered bool
}

func (m mtMsg) String() string {
	s := "m" + strconv.Itoa(m.id)
	if m.redelivered {
		s += "*"
	}
	if m.returns > 0 {
		s += "x" + strconv.Itoa(m.returns)
	}
	if m.deadline >= 0 {
		s += "@" + mtDur(m.deadline)
	}
	return s
}

// mtDur renders a virtual time or duration in seconds with milliseconds.
func mtDur(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', 3, 64)
}

// mtDead is one dead letter, as it arrived in "dead".
type mtDead struct {
	id     int
	body   string
	reason string
	count  int64
	exp    string // original-expiration
}

func (d mtDead) String() string {
	s := fmt.Sprintf("m%d/%s", d.id, d.reason)
	if d.count != 1 {
		s += fmt.Sprintf("(count %d)", d.count)
	}
	return s
}

type mtDelayed struct {
	due time.Duration
	m   mtMsg
}

type mtState uint8

const (
	mtOutstanding mtState = iota
	mtSettled
	mtReturned // went back to the queue: its owner ended, an ack timeout, Recover, or (buffered) Cancel
)

// mtHeld is one delivery: of a Get, or to a consumer.
type mtHeld struct {
	m     mtMsg // as delivered
	tag   uint64
	ctx   int     // the owning context: the Get's, or the consumer's
	cons  *mtCons // nil for a Get
	due   time.Duration
	state mtState
	real  warren.Delivery
}

func (d *mtHeld) String() string {
	if d.cons == nil {
		return fmt.Sprintf("get#%d %v", d.tag, d.m)
	}
	return fmt.Sprintf("%v#%d %v", d.cons, d.tag, d.m)
}

// mtCons is one push consumer of main, with manual acknowledgement.
type mtCons struct {
	idx      int // the tag is "c<idx>"
	prefetch int
	timeout  time.Duration // ack timeout; 0 for none
	ctx      int
	active   bool      // receiving: not cancelled, not timed out, its context not ended
	ended    bool      // its context ended or its ack timeout passed: it holds nothing more
	stopErr  error     // what Err says once it is not active
	buffered []*mtHeld // in the channel, unread, in tag order
	held     []*mtHeld // received and outstanding, in tag order
	nextTag  uint64
}

func (c *mtCons) String() string {
	s := "c" + strconv.Itoa(c.idx)
	if c.timeout > 0 {
		s += "(timeout " + mtDur(c.timeout) + ")"
	}
	return s
}

// ackDue returns when c's ack timeout ends it: the due time of its oldest outstanding
// delivery, buffered or received; -1 for never.
func (c *mtCons) ackDue() time.Duration {
	due := time.Duration(-1)
	if c.timeout == 0 {
		return due
	}
	for _, ds := range [][]*mtHeld{c.held, c.buffered} {
		if len(ds) > 0 && (due < 0 || ds[0].due < due) {
			due = ds[0].due
		}
	}
	return due
}

// mtStats counts, over TestModelTime's sequences, the cases that are easy to miss, so that a
// change to the generator that stops reaching them shows in the log.
type mtStats struct {
	reasons          map[string]int // dead letters by reason
	sameInstant      int            // timer instants that dead-lettered two or more messages
	tieDeadlines     int            // expiries sharing their deadline with the previous one
	promoted         int            // delayed messages that rejoined
	promotedDead     int            // ... or expired when due
	returnedDrop     int            // drop-head victims that had been delivered
	refused          int            // publishes refused by a length limit
	returnExpiry     int            // returns past the deadline
	sharedEnds       int            // context ends returning several deliveries
	gets             int
	empties          int
	maxReady         int
	pushed           int // deliveries to consumers
	pushedTTL0       int // ... of a TTL-0 message as it arrived
	timerPushes      int // ... made by the timer (after a promotion or an ack timeout)
	timeouts         int // consumers ended by their ack timeout
	timeoutsOff      int // ... after they were cancelled
	timeoutsTie      int // timer instants at which an ack timeout coincided with another event
	timeoutsTogether int // ... with another ack timeout
	timeoutBack      int // deliveries an ack timeout returned (buffered and received)
	timeoutDead      int // ... which were dead-lettered instead (expired, delivery limit)
}

func (s *mtStats) String() string {
	return fmt.Sprintf("dead letters %v; instants with several dead letters %d, equal deadlines %d; "+
		"delayed rejoined %d, expired when due %d; redelivered drop-head victims %d; refused publishes %d; "+
		"returns past deadline %d; context ends returning several %d; gets %d (empty %d); max ready %d; "+
		"pushed %d (TTL 0 on arrival %d, by the timer %d); ack timeouts %d (of cancelled consumers %d, "+
		"beside an expiry or promotion %d, several at once %d) returning %d (dead-lettered %d)",
		s.reasons, s.sameInstant, s.tieDeadlines, s.promoted, s.promotedDead, s.returnedDrop, s.refused,
		s.returnExpiry, s.sharedEnds, s.gets, s.empties, s.maxReady, s.pushed, s.pushedTTL0, s.timerPushes,
		s.timeouts, s.timeoutsOff, s.timeoutsTie, s.timeoutsTogether, s.timeoutBack, s.timeoutDead)
}

// mtModel is the reference queue: slices and linear scans.
type mtModel struct {
	cfg     mtCfg
	now     time.Duration // virtual time since the bubble's start
	nextSeq uint64
	ready   []mtMsg // by seq
	delayed []mtDelayed
	held    []*mtHeld // every delivery the application has had: Gets, and consumers' received ones
	dead    []mtDead  // every dead letter so far, in order
	gotTag  uint64
	cons    []*mtCons // every consumer, by index
	active  []*mtCons // the active ones, in registration order
	rr      int       // the round-robin cursor into active
	stats   *mtStats
	// timedOut lists the consumers ack timeouts ended, for the history.
	timedOut []*mtCons
}

func (m *mtModel) expired(x mtMsg) bool { return x.deadline >= 0 && x.deadline <= m.now }

func (m *mtModel) overLimit(x mtMsg) bool { return m.cfg.limit >= 0 && x.returns > m.cfg.limit }

func (m *mtModel) deadLetter(x mtMsg, reason string) {
	m.dead = append(m.dead, mtDead{id: x.id, body: x.body, reason: reason, count: 1, exp: x.exp})
	m.stats.reasons[reason]++
}

func (m *mtModel) bytes() int {
	n := 0
	for _, x := range m.ready {
		n += len(x.body)
	}
	return n
}

func (m *mtModel) room(n int) bool {
	return (m.cfg.maxLen < 0 || len(m.ready) < m.cfg.maxLen) && (m.cfg.maxBytes < 0 || m.bytes()+n <= m.cfg.maxBytes)
}

func (m *mtModel) over() bool {
	return m.cfg.maxLen >= 0 && len(m.ready) > m.cfg.maxLen || m.cfg.maxBytes >= 0 && m.bytes() > m.cfg.maxBytes
}

// insert puts x among the ready messages at its seq.
func (m *mtModel) insert(x mtMsg) {
	i, _ := slices.BinarySearchFunc(m.ready, x.seq, func(r mtMsg, s uint64) int { return cmp.Compare(r.seq, s) })
	m.ready = slices.Insert(m.ready, i, x)
	m.stats.maxReady = max(m.stats.maxReady, len(m.ready))
}

// dropHead drops the head while a drop-head queue is over a limit.
func (m *mtModel) dropHead() {
	if m.cfg.overflow != warren.DropHead {
		return
	}
	for len(m.ready) > 0 && m.over() {
		x := m.ready[0]
		m.ready = m.ready[1:]
		reason := "maxlen"
		if m.expired(x) {
			reason = "expired"
		}
		if x.redelivered {
			m.stats.returnedDrop++
		}
		m.deadLetter(x, reason)
	}
}

// expireDue dead-letters every ready message whose deadline has come, by (deadline, seq).
func (m *mtModel) expireDue() int {
	n := 0
	last := time.Duration(-1)
	for {
		best := -1
		for i, x := range m.ready { // by seq: a strict < keeps the smallest seq of a tie
			if m.expired(x) && (best < 0 || x.deadline < m.ready[best].deadline) {
				best = i
			}
		}
		if best < 0 {
			return n
		}
		x := m.ready[best]
		m.ready = slices.Delete(m.ready, best, best+1)
		if x.deadline == last {
			m.stats.tieDeadlines++
		}
		last = x.deadline
		m.deadLetter(x, "expired")
		n++
	}
}

// promoteDue lets the delayed messages now due rejoin, by (due, seq).
func (m *mtModel) promoteDue() {
	for {
		best := -1
		for i, d := range m.delayed {
			if d.due <= m.now && (best < 0 || d.due < m.delayed[best].due ||
				d.due == m.delayed[best].due && d.m.seq < m.delayed[best].m.seq) {
				best = i
			}
		}
		if best < 0 {
			return
		}
		x := m.delayed[best].m
		m.delayed = slices.Delete(m.delayed, best, best+1)
		if m.expired(x) {
			m.stats.promotedDead++
			m.deadLetter(x, "expired")
			continue
		}
		m.stats.promoted++
		m.insert(x)
		m.dropHead()
	}
}

// advance moves the clock by d, handling each event time on the way as the queue's timer does:
// expiries, then promotions, then ack timeouts, then one dispatch.
func (m *mtModel) advance(d time.Duration) {
	target := m.now + d
	for {
		next := time.Duration(-1)
		for _, x := range m.ready {
			if x.deadline >= 0 && (next < 0 || x.deadline < next) {
				next = x.deadline
			}
		}
		for _, x := range m.delayed {
			if next < 0 || x.due < next {
				next = x.due
			}
		}
		for _, c := range m.cons {
			if due := c.ackDue(); !c.ended && due >= 0 && (next < 0 || due < next) {
				next = due
			}
		}
		for _, d := range m.held {
			if d.cons == nil && d.state == mtOutstanding && d.due >= 0 && (next < 0 || d.due < next) {
				next = d.due // the queue's consumer timeout applies to Gets too
			}
		}
		if next < 0 || next > target {
			break
		}
		m.now = max(m.now, next)
		before, promoted := len(m.dead), m.stats.promoted
		m.expireDue()
		m.promoteDue()
		others := len(m.dead) > before || m.stats.promoted > promoted
		if n := m.timeouts(); n > 0 && others {
			m.stats.timeoutsTie++
		} else if n > 1 {
			m.stats.timeoutsTogether++
		}
		if len(m.dead)-before > 1 {
			m.stats.sameInstant++
		}
		pushed := m.stats.pushed
		m.dispatch()
		m.stats.timerPushes += m.stats.pushed - pushed
	}
	m.now = target
}

// publish enqueues a new message; ttl is its own TTL (-1 for none).
func (m *mtModel) publish(x mtMsg, ttl, delay time.Duration) error {
	if m.cfg.overflow != warren.DropHead && !m.room(len(x.body)) {
		m.stats.refused++
		if m.cfg.overflow == warren.RejectPublishDLX {
			m.deadLetter(x, "maxlen")
		}
		return warren.ErrQueueFull
	}
	if m.cfg.ttl >= 0 && (ttl < 0 || m.cfg.ttl < ttl) {
		ttl = m.cfg.ttl
	}
	x.deadline = -1
	if ttl >= 0 {
		x.deadline = m.now + ttl
	}
	x.seq = m.nextSeq
	m.nextSeq++
	if delay > 0 {
		m.delayed = append(m.delayed, mtDelayed{m.now + delay, x})
		return nil
	}
	m.insert(x)
	if len(m.ready) == 1 && ttl == 0 && m.hasCredit() {
		m.stats.pushedTTL0++ // taken as it arrives: not expired yet (R3.5)
	}
	m.dispatch()
	if ttl == 0 {
		m.expireDue() // a TTL-0 message no consumer took
	}
	m.dropHead()
	return nil
}

// hasCredit reports whether an active consumer has credit.
func (m *mtModel) hasCredit() bool {
	return slices.ContainsFunc(m.active, func(c *mtCons) bool { return len(c.buffered)+len(c.held) < c.prefetch })
}

// dispatch hands the head to active consumers with credit, round-robin (dispatch.go's simple
// path: every consumer has one priority and no selector). Nothing ready has expired: the timer
// removes each message at its deadline, and a TTL-0 one may be taken as it arrives.
func (m *mtModel) dispatch() {
	for misses := 0; len(m.ready) > 0 && misses < len(m.active); {
		if m.rr >= len(m.active) {
			m.rr = 0
		}
		c := m.active[m.rr]
		m.rr++
		if len(c.buffered)+len(c.held) >= c.prefetch {
			misses++
			continue
		}
		x := m.ready[0]
		m.ready = m.ready[1:]
		c.nextTag++
		d := &mtHeld{m: x, tag: c.nextTag, ctx: c.ctx, cons: c, due: -1}
		if c.timeout > 0 {
			d.due = m.now + c.timeout
		}
		c.buffered = append(c.buffered, d)
		m.stats.pushed++
		misses = 0
	}
}

// consume adds an active consumer and dispatches. The newcomer joins the end of the rotation:
// every active consumer takes its turn before it, so it goes just before the one whose turn is
// next.
func (m *mtModel) consume(prefetch int, timeout time.Duration, ctx int) *mtCons {
	c := &mtCons{idx: len(m.cons), prefetch: prefetch, timeout: timeout, ctx: ctx, active: true}
	m.cons = append(m.cons, c)
	if m.rr >= len(m.active) {
		m.rr = 0
	}
	m.active = slices.Insert(m.active, m.rr, c)
	m.rr++
	m.dispatch()
	return c
}

// receive takes c's next buffered delivery, if any.
func (m *mtModel) receive(c *mtCons) *mtHeld {
	if len(c.buffered) == 0 {
		return nil
	}
	d := c.buffered[0]
	c.buffered = c.buffered[1:]
	c.held = append(c.held, d)
	m.held = append(m.held, d)
	return d
}

// stop ends c's receiving: it leaves dispatch and its buffered deliveries are appended to back,
// unchanged, for the caller to restore.
func (m *mtModel) stop(c *mtCons, reason error, back []mtMsg) []mtMsg {
	if !c.active {
		return back
	}
	for _, d := range c.buffered {
		d.state = mtReturned
		back = append(back, d.m)
	}
	c.buffered = nil
	i := slices.Index(m.active, c)
	if i < m.rr {
		m.rr--
	}
	m.active = slices.Delete(m.active, i, i+1)
	c.active = false
	c.stopErr = reason
	return back
}

// takeBack appends c's received outstanding deliveries to back, redelivered.
func (m *mtModel) takeBack(c *mtCons, back []mtMsg) []mtMsg {
	for _, d := range c.held {
		d.state = mtReturned
		back = append(back, mtRedelivered(d.m))
	}
	c.held = nil
	return back
}

// restoreAll puts back messages that come back together (already marked as they return), in
// seq order: those past their deadline or the delivery limit are dead-lettered instead; then
// drop-head runs once.
func (m *mtModel) restoreAll(back []mtMsg) (dead int) {
	slices.SortFunc(back, func(a, b mtMsg) int { return cmp.Compare(a.seq, b.seq) })
	for _, x := range back {
		switch {
		case m.expired(x):
			m.stats.returnExpiry++
			m.deadLetter(x, "expired")
			dead++
		case m.overLimit(x):
			m.deadLetter(x, "delivery_limit")
			dead++
		default:
			m.insert(x)
		}
	}
	m.dropHead()
	return dead
}

// cancel is Consumer.Cancel: buffered deliveries back unchanged, received ones stay
// outstanding.
func (m *mtModel) cancel(c *mtCons) {
	if !c.active {
		return
	}
	m.restoreAll(m.stop(c, warren.ErrCancelled, nil))
	m.dispatch()
}

// recover is Consumer.Recover: buffered deliveries back unchanged, received ones redelivered,
// then a dispatch.
func (m *mtModel) recover(c *mtCons) {
	if c.ended {
		return
	}
	var back []mtMsg
	for _, d := range c.buffered {
		d.state = mtReturned
		back = append(back, d.m)
	}
	c.buffered = nil
	m.restoreAll(m.takeBack(c, back))
	m.dispatch()
}

// timeouts ends, as a context end would, every consumer whose oldest outstanding delivery is
// due: Err then says ErrAckTimeout (unless it was cancelled before); and returns every Get
// delivery held past the queue's consumer timeout. It returns how many of both.
func (m *mtModel) timeouts() int {
	var (
		back []mtMsg
		n    int
	)
	for _, c := range m.cons {
		if due := c.ackDue(); c.ended || due < 0 || due > m.now {
			continue
		}
		if !c.active {
			m.stats.timeoutsOff++
		}
		back = m.stop(c, warren.ErrAckTimeout, back)
		back = m.takeBack(c, back)
		c.ended = true
		m.timedOut = append(m.timedOut, c)
		n++
	}
	for _, d := range m.held { // Gets held past the consumer timeout come back with them
		if d.cons == nil && d.state == mtOutstanding && d.due >= 0 && d.due <= m.now {
			d.state = mtReturned
			back = append(back, mtRedelivered(d.m))
			n++
		}
	}
	if n > 0 {
		m.stats.timeouts += n
		m.stats.timeoutBack += len(back)
		m.stats.timeoutDead += m.restoreAll(back)
	}
	return n
}

// get takes the head.
func (m *mtModel) get(ctx int) (*mtHeld, error) {
	for len(m.ready) > 0 {
		x := m.ready[0]
		m.ready = m.ready[1:]
		if m.expired(x) { // never, with the timer exact: checked by the comparison
			m.deadLetter(x, "expired")
			continue
		}
		m.gotTag++
		h := &mtHeld{m: x, tag: m.gotTag, ctx: ctx, due: -1}
		if m.cfg.ackTimeout > 0 {
			h.due = m.now + m.cfg.ackTimeout
		}
		m.held = append(m.held, h)
		return h, nil
	}
	return nil, warren.ErrEmpty
}

func mtRedelivered(x mtMsg) mtMsg {
	x.redelivered = true
	x.returns++
	return x
}

// giveBack returns one message (a Nack).
func (m *mtModel) giveBack(x mtMsg) {
	x = mtRedelivered(x)
	switch {
	case m.expired(x):
		m.stats.returnExpiry++
		m.deadLetter(x, "expired")
	case m.overLimit(x):
		m.deadLetter(x, "delivery_limit")
	default:
		m.insert(x)
		m.dropHead()
	}
}

// nackDelay is NackWithDelay(d) with d > 0.
func (m *mtModel) nackDelay(x mtMsg, d time.Duration) {
	x = mtRedelivered(x)
	switch {
	case m.expired(x):
		m.stats.returnExpiry++
		m.deadLetter(x, "expired")
	case m.overLimit(x):
		m.deadLetter(x, "delivery_limit")
	default:
		m.delayed = append(m.delayed, mtDelayed{m.now + d, x})
	}
}

type mtHow uint8

const (
	mtAck mtHow = iota
	mtNack
	mtReject
	mtNackDelay
)

func (h mtHow) String() string { return [...]string{"Ack", "Nack", "Reject", "NackWithDelay"}[h] }

// settle settles an outstanding delivery, then dispatches.
func (m *mtModel) settle(d *mtHeld, how mtHow, delay time.Duration) error {
	if d.state != mtOutstanding {
		return warren.ErrAlreadySettled
	}
	defer m.dispatch()
	d.state = mtSettled
	if c := d.cons; c != nil {
		c.held = slices.DeleteFunc(c.held, func(x *mtHeld) bool { return x == d })
	}
	switch {
	case how == mtNack || how == mtNackDelay && delay <= 0:
		m.giveBack(d.m)
	case how == mtNackDelay:
		m.nackDelay(d.m, delay)
	case how == mtReject:
		m.deadLetter(d.m, "rejected")
	}
	return nil
}

// endContext is the end of context ctx: every consumer it owns stops (its buffered deliveries
// come back unchanged), and every delivery it owns — its consumers' received ones and its Gets —
// comes back redelivered, all together in seq order; then one dispatch.
func (m *mtModel) endContext(ctx int) int {
	var back []mtMsg
	for _, c := range m.cons {
		if c.ctx == ctx && !c.ended {
			back = m.stop(c, context.Canceled, back)
			back = m.takeBack(c, back)
			c.ended = true
		}
	}
	for _, d := range m.held {
		if d.cons == nil && d.ctx == ctx && d.state == mtOutstanding {
			d.state = mtReturned
			back = append(back, mtRedelivered(d.m))
		}
	}
	if len(back) > 1 {
		m.stats.sharedEnds++
	}
	m.restoreAll(back)
	m.dispatch()
	return len(back)
}

func (m *mtModel) unacked() int {
	n := 0
	for _, c := range m.cons {
		n += len(c.buffered)
	}
	for _, d := range m.held {
		if d.state == mtOutstanding {
			n++
		}
	}
	return n
}

func (m *mtModel) picture() string {
	var r, d []string
	for _, x := range m.ready {
		r = append(r, x.String())
	}
	for _, x := range m.delayed {
		d = append(d, x.m.String()+" due "+mtDur(x.due))
	}
	var p strings.Builder
	p.WriteString(fmt.Sprintf("at %s: ready [%s], delayed [%s], unacked %d", mtDur(m.now), strings.Join(r, " "),
		strings.Join(d, ", "), m.unacked()))
	for _, c := range m.cons {
		if c.ended || !c.active && len(c.held) == 0 {
			continue
		}
		var b, h []string
		for _, d := range c.buffered {
			b = append(b, fmt.Sprintf("#%d %v", d.tag, d.m))
		}
		for _, d := range c.held {
			h = append(h, fmt.Sprintf("#%d %v", d.tag, d.m))
		}
		p.WriteString(fmt.Sprintf("; %v (active %v) buffered [%s] received [%s]", c, c.active, strings.Join(b, " "),
			strings.Join(h, " ")))
		if due := c.ackDue(); due >= 0 {
			p.WriteString(" due " + mtDur(due))
		}
	}
	return p.String()
}

// ---------------------------------------------------------------------------------------------
// Operations.

type mtKind uint8

const (
	mtPublish     mtKind = iota // a%4: Expiration none, "0", b*16+1 ms (twice); 1+(a>>2)%4 body bytes; (a>>4)%4 == 3: DeliverAfter c*20+1 ms
	mtGet                       // a%4 == 0: a fresh context, else a live one (newest first by a/4); b%16 == 0: an ended one
	mtSettle                    // a: an outstanding delivery (a Get, a consumer's received one); b%8: 0-2 Ack, 3-4 Nack, 5 Reject, 6-7 NackWithDelay(c*25 ms)
	mtSettleAgain               // a: a delivery no longer outstanding; b%4: how
	mtEndContext                // a: a live context, mostly one owning deliveries or consumers
	mtAdvance                   // sleep 1 + b*{1,4,16,32}[a%4] ms
	mtConsume                   // a: prefetch 1+a%4; (a>>2)%8: context 0-3 fresh, 4-6 a live one (newest first by a>>5), 7 an ended one; b%4: ack timeout 0 the queue's, 1 AckTimeout(0), 2-3 AckTimeout by c (see consume), and with b%32 == 31 AutoAck too (invalid)
	mtReceive                   // a: a consumer (a%8 != 0: an active one, by a/8); b: 1+b%4 receives
	mtCancel                    // a: a consumer, as for mtReceive; b%4 == 3: Recover instead
	mtNumKinds
)

type mtOp struct {
	kind    mtKind
	a, b, c uint8
}

// decodeMT reads the configuration (six bytes) and the operations (four bytes each).
func decodeMT(data []byte) (mtCfg, []mtOp) {
	const maxOps = 400
	cfg := decodeMTCfg(data[:min(len(data), mtCfgBytes)])
	var ops []mtOp
	for i := mtCfgBytes; i < len(data) && len(ops) < maxOps; i += 4 {
		var p [4]byte
		copy(p[:], data[i:])
		ops = append(ops, mtOp{mtKind(p[0] % byte(mtNumKinds)), p[1], p[2], p[3]})
	}
	return cfg, ops
}

func encodeMT(cfg [mtCfgBytes]byte, ops ...mtOp) []byte {
	b := cfg[:]
	for _, o := range ops {
		b = append(b, byte(o.kind), o.a, o.b, o.c)
	}
	return b
}

// randomMT returns a random sequence's encoding: n operations with per-sequence jittered
// weights. One sequence in six is bulky: twice as long, without length limits, mostly publishing
// and getting with shared contexts, so that the queue grows long and context ends return many
// messages at once into the middle of it. Of the others, half have push consumers beside the
// Gets, with ack timeouts.
func randomMT(rng *rand.Rand, n int) []byte {
	base := [mtNumKinds]int{mtPublish: 30, mtGet: 14, mtSettle: 16, mtSettleAgain: 2, mtEndContext: 4, mtAdvance: 16}
	var cfg [mtCfgBytes]byte
	for i := range cfg {
		cfg[i] = uint8(rng.Uint32())
	}
	bulk := rng.IntN(6) == 0
	if !bulk && rng.IntN(2) == 0 {
		base[mtConsume], base[mtReceive], base[mtCancel] = 6, 14, 2
	}
	if bulk {
		n *= 2
		base = [mtNumKinds]int{mtPublish: 40, mtGet: 30, mtSettle: 6, mtSettleAgain: 1, mtEndContext: 3, mtAdvance: 5}
		cfg[2], cfg[4] = 0, 0 // no length limits
	}
	var w [mtNumKinds]int
	total := 0
	for k := range w {
		w[k] = base[k] * (1 + rng.IntN(3))
		total += w[k]
	}
	ops := make([]mtOp, n)
	for i := range ops {
		x := rng.IntN(total)
		k := mtKind(0)
		for x >= w[k] {
			x -= w[k]
			k++
		}
		ops[i] = mtOp{k, uint8(rng.Uint32()), uint8(rng.Uint32()), uint8(rng.Uint32())}
		if bulk && k == mtGet && ops[i].a%4 == 0 && rng.IntN(4) != 0 {
			ops[i].a |= 1 // mostly a live context
		}
	}
	return encodeMT(cfg, ops...)
}

// ---------------------------------------------------------------------------------------------
// The driver.

type mtCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
	ended  bool
}

type mtHarness struct {
	t        *testing.T
	label    string
	b        *warren.Broker
	main     *warren.Queue
	deadQ    *warren.Queue
	m        *mtModel
	start    time.Time
	ctxs     []*mtCtx
	cons     []*warren.Consumer // by mtCons.idx
	deadSeen []mtDead           // what arrived in "dead", in order
	nextID   int
	step     int
	cur      string
	history  []string
}

func newMTHarness(t *testing.T, label string, cfg mtCfg, stats *mtStats) *mtHarness {
	if stats == nil {
		stats = &mtStats{}
	}
	if stats.reasons == nil {
		stats.reasons = map[string]int{}
	}
	h := &mtHarness{t: t, label: label, b: newBroker(t), start: time.Now(),
		m: &mtModel{cfg: cfg, nextSeq: 1, stats: stats}}
	h.main, h.deadQ = deadTopology(t, h.b, cfg.options()...)
	h.history = []string{"   0  main: " + cfg.String()}
	return h
}

// mtTrace logs every sequence's history when it passes too (WARREN_MODELTIME_TRACE=1, with -v).
var mtTrace = os.Getenv("WARREN_MODELTIME_TRACE") != ""

func (h *mtHarness) fail(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("step %d (%s): %s\nmodel %s\ndead letters so far (model) %v\n%s; history:\n%s",
		h.step, h.cur, fmt.Sprintf(format, args...), h.m.picture(), h.m.dead, h.label, strings.Join(h.history, "\n"))
}

func (h *mtHarness) logf(format string, args ...any) {
	h.cur = fmt.Sprintf("t=%s ", mtDur(h.m.now)) + fmt.Sprintf(format, args...)
	h.history = append(h.history, fmt.Sprintf("%4d  %s", h.step, h.cur))
}

func (h *mtHarness) note(format string, args ...any) {
	h.history[len(h.history)-1] += fmt.Sprintf(format, args...)
}

func (h *mtHarness) checkErr(call string, got, want error) {
	h.t.Helper()
	if want == nil && got != nil || want != nil && !errors.Is(got, want) {
		h.fail("%s error = %v, want %v", call, got, want)
	}
}

// readDead drains "dead" and appends what arrived to deadSeen, checking what every dead letter
// must carry.
func (h *mtHarness) readDead() {
	h.t.Helper()
	for {
		d, err := h.deadQ.Get(h.t.Context(), warren.AutoAck())
		if errors.Is(err, warren.ErrEmpty) {
			return
		}
		if err != nil {
			h.fail("dead.Get: %v", err)
		}
		msg := d.Message
		id, err := strconv.Atoi(strings.TrimPrefix(msg.MessageID, "m"))
		if err != nil {
			h.fail("dead letter %q: MessageID %q", msg.Body, msg.MessageID)
		}
		got := mtDead{id: id, body: string(msg.Body)}
		deaths, _ := msg.Headers["x-death"].([]any)
		if len(deaths) != 1 {
			h.fail("dead letter m%d: x-death %#v, want one entry", id, msg.Headers["x-death"])
		}
		x, _ := deaths[0].(warren.Table)
		got.reason, _ = x["reason"].(string)
		got.count, _ = x["count"].(int64)
		got.exp, _ = x["original-expiration"].(string)
		switch {
		case x["queue"] != "main":
			h.fail("dead letter m%d: x-death queue %v, want main", id, x["queue"])
		case msg.Headers["x-first-death-reason"] != got.reason || msg.Headers["x-last-death-reason"] != got.reason:
			h.fail("dead letter m%d: x-first/last-death-reason %v/%v, x-death reason %q", id,
				msg.Headers["x-first-death-reason"], msg.Headers["x-last-death-reason"], got.reason)
		case msg.Expiration != "":
			h.fail("dead letter m%d: Expiration %q, want none (R4.6)", id, msg.Expiration)
		case d.Redelivered || d.DeliveryCount != 0:
			h.fail("dead letter m%d: Redelivered %v, DeliveryCount %d, want a fresh message", id, d.Redelivered, d.DeliveryCount)
		}
		h.deadSeen = append(h.deadSeen, got)
	}
}

// check compares the observable state after a step.
func (h *mtHarness) check() {
	h.t.Helper()
	if got := time.Since(h.start); got != h.m.now {
		h.fail("virtual time %v, model %v", got, h.m.now)
	}
	h.readDead()
	if !slices.Equal(h.deadSeen, h.m.dead) {
		i := 0
		for i < len(h.deadSeen) && i < len(h.m.dead) && h.deadSeen[i] == h.m.dead[i] {
			i++
		}
		h.fail("dead letters differ from #%d:\n got  %v\n want %v\n(full: got %v)", i,
			h.deadSeen[i:], h.m.dead[i:], h.deadSeen)
	}
	if got, want := h.main.Len(), len(h.m.ready); got != want {
		h.fail("main.Len() = %d, want %d", got, want)
	}
	if got, want := h.main.Unacked(), h.m.unacked(); got != want {
		h.fail("main.Unacked() = %d, want %d", got, want)
	}
	if got, want := h.main.ConsumerCount(), len(h.m.active); got != want {
		h.fail("main.ConsumerCount() = %d, want %d", got, want)
	}
	for i, mc := range h.m.cons {
		c := h.cons[i]
		if got, want := len(c.Deliveries()), len(mc.buffered); got != want {
			h.fail("consumer %v: len(Deliveries()) = %d, want %d", mc, got, want)
		}
		if len(mc.buffered) == 0 {
			select {
			case d, ok := <-c.Deliveries():
				switch {
				case ok:
					h.fail("consumer %v: received %s #%d, want nothing buffered", mc, d.Message.MessageID, d.DeliveryTag)
				case mc.active:
					h.fail("consumer %v: Deliveries() closed, want it open", mc)
				}
			default:
				if !mc.active {
					h.fail("consumer %v: Deliveries() open, want it closed", mc)
				}
			}
		}
		var wantErr error
		if !mc.active {
			wantErr = mc.stopErr
		}
		if err := c.Err(); wantErr == nil && err != nil || wantErr != nil && !errors.Is(err, wantErr) {
			h.fail("consumer %v: Err() = %v, want %v", mc, err, wantErr)
		}
		if got, want := isClosed(c.Done()), !mc.active && len(mc.held) == 0; got != want { // ended
			h.fail("consumer %v: Done() closed = %v, want %v", mc, got, want)
		}
	}
}

func (h *mtHarness) newCtx() int {
	ctx, cancel := context.WithCancel(h.t.Context())
	h.ctxs = append(h.ctxs, &mtCtx{ctx: ctx, cancel: cancel})
	return len(h.ctxs) - 1
}

// ctxsWhere returns the indexes of the contexts that satisfy ok, newest first.
func (h *mtHarness) ctxsWhere(ok func(i int, c *mtCtx) bool) []int {
	var out []int
	for i := len(h.ctxs) - 1; i >= 0; i-- {
		if ok(i, h.ctxs[i]) {
			out = append(out, i)
		}
	}
	return out
}

// owning returns how many deliveries (received or got) and active consumers context i owns.
func (h *mtHarness) owning(i int) int {
	n := 0
	for _, d := range h.m.held {
		if d.ctx == i && d.state == mtOutstanding {
			n++
		}
	}
	for _, c := range h.m.active {
		if c.ctx == i {
			n++
		}
	}
	return n
}

func mtSettleReal(d warren.Delivery, how mtHow, delay time.Duration) error {
	switch how {
	case mtAck:
		return d.Ack()
	case mtNack:
		return d.Nack()
	case mtReject:
		return d.Reject()
	default:
		return d.NackWithDelay(delay)
	}
}

func (h *mtHarness) publish(o mtOp) {
	h.nextID++
	id := h.nextID
	var exp string
	ttl := time.Duration(-1)
	switch o.a % 4 {
	case 1:
		exp, ttl = "0", 0
	case 2, 3:
		ms := 1 + int(o.b)*16
		exp, ttl = strconv.Itoa(ms), time.Duration(ms)*time.Millisecond
	}
	body := strings.Repeat(string(rune('a'+id%26)), 1+int(o.a>>2)%4)
	var delay time.Duration
	var opts []warren.PublishOption
	if (o.a>>4)%4 == 3 {
		delay = time.Duration(1+int(o.c)*20) * time.Millisecond
		opts = append(opts, warren.DeliverAfter(delay))
	}
	h.logf("publish m%d %q exp %q", id, body, exp)
	if delay > 0 {
		h.note(" after %s", mtDur(delay))
	}
	msg := warren.Message{Body: []byte(body), MessageID: "m" + strconv.Itoa(id), Expiration: exp}
	before := len(h.m.dead)
	want := h.m.publish(mtMsg{id: id, body: body, exp: exp}, ttl, delay)
	err := h.b.Publish(h.t.Context(), "", "main", msg, opts...)
	h.note(" → %v; dead %v", err, h.m.dead[before:])
	h.checkErr("Publish", err, want)
}

func (h *mtHarness) get(o mtOp) {
	ended := h.ctxsWhere(func(_ int, c *mtCtx) bool { return c.ended })
	if o.b%16 == 0 && len(ended) > 0 {
		i := ended[int(o.a)%len(ended)]
		h.logf("get with ended context x%d", i)
		d, err := h.main.Get(h.ctxs[i].ctx)
		if d.DeliveryTag != 0 {
			h.fail("Get with an ended context returned %s", d.Message.MessageID)
		}
		h.checkErr("Get", err, context.Canceled)
		return
	}
	live := h.ctxsWhere(func(_ int, c *mtCtx) bool { return !c.ended })
	var i int
	if o.a%4 == 0 || len(live) == 0 {
		i = h.newCtx()
	} else {
		i = live[int(o.a/4)%len(live)]
	}
	h.logf("get (context x%d)", i)
	before := len(h.m.dead)
	want, wantErr := h.m.get(i)
	d, err := h.main.Get(h.ctxs[i].ctx)
	h.m.stats.gets++
	if wantErr != nil {
		h.m.stats.empties++
		h.note(" → %v", err)
		if d.DeliveryTag != 0 {
			h.fail("Get = %s, want %v", d.Message.MessageID, wantErr)
		}
		h.checkErr("Get", err, wantErr)
		return
	}
	if err != nil || d.DeliveryTag == 0 {
		h.fail("Get error %v, want %v", err, want.m)
	}
	want.real = d
	h.note(" → #%d %v count %d; dead %v", want.tag, want.m, len(h.m.ready), h.m.dead[before:])
	x := want.m
	switch {
	case d.Message.MessageID != "m"+strconv.Itoa(x.id) || string(d.Message.Body) != x.body:
		h.fail("Get = %s %q, want %v %q", d.Message.MessageID, d.Message.Body, x, x.body)
	case d.Message.Expiration != x.exp:
		h.fail("Get %v: Expiration %q, want %q", x, d.Message.Expiration, x.exp)
	case d.Redelivered != x.redelivered:
		h.fail("Get %v: Redelivered %v", x, d.Redelivered)
	case d.DeliveryCount != x.returns:
		h.fail("Get %v: DeliveryCount %d", x, d.DeliveryCount)
	case d.MessageCount != len(h.m.ready):
		h.fail("Get %v: MessageCount %d, want %d", x, d.MessageCount, len(h.m.ready))
	case d.DeliveryTag != want.tag:
		h.fail("Get %v: DeliveryTag %d, want %d", x, d.DeliveryTag, want.tag)
	}
}

func (h *mtHarness) settle(o mtOp) {
	var out []*mtHeld
	for _, d := range h.m.held {
		if d.state == mtOutstanding {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		h.logf("settle: nothing outstanding")
		return
	}
	d := out[int(o.a)%len(out)]
	how := [...]mtHow{mtAck, mtAck, mtAck, mtNack, mtNack, mtReject, mtNackDelay, mtNackDelay}[o.b%8]
	delay := time.Duration(o.c) * 25 * time.Millisecond
	h.logf("%v %v", how, d)
	if how == mtNackDelay {
		h.note("(%s)", mtDur(delay))
	}
	before := len(h.m.dead)
	want := h.m.settle(d, how, delay)
	err := mtSettleReal(d.real, how, delay)
	h.note(" → %v; dead %v", err, h.m.dead[before:])
	h.checkErr(how.String(), err, want)
}

func (h *mtHarness) settleAgain(o mtOp) {
	var done []*mtHeld
	for _, d := range h.m.held {
		if d.state != mtOutstanding {
			done = append(done, d)
		}
	}
	if len(done) == 0 {
		h.logf("settle again: nothing settled")
		return
	}
	d := done[int(o.a)%len(done)]
	how := mtHow(o.b % 4)
	h.logf("%v again %v", how, d)
	want := h.m.settle(d, how, time.Second)
	h.checkErr(how.String(), mtSettleReal(d.real, how, time.Second), want)
}

func (h *mtHarness) endContext(o mtOp) {
	live := h.ctxsWhere(func(_ int, c *mtCtx) bool { return !c.ended })
	owning := h.ctxsWhere(func(i int, c *mtCtx) bool { return !c.ended && h.owning(i) > 0 })
	if o.a%4 != 0 && len(owning) > 0 {
		live = owning
	}
	if len(live) == 0 {
		h.logf("end context: none live")
		return
	}
	h.endCtx(live[int(o.a/4)%len(live)])
}

func (h *mtHarness) endCtx(i int) {
	h.logf("end context x%d owning %d", i, h.owning(i))
	before := len(h.m.dead)
	h.m.endContext(i)
	h.ctxs[i].cancel()
	h.ctxs[i].ended = true
	synctest.Wait()
	h.note(" → ready %d; dead %v", len(h.m.ready), h.m.dead[before:])
}

func (h *mtHarness) advance(d time.Duration) {
	h.logf("advance %s", mtDur(d))
	before, pushed := len(h.m.dead), h.m.stats.pushed
	h.m.timedOut = h.m.timedOut[:0]
	h.m.advance(d)
	time.Sleep(d)
	synctest.Wait()
	h.note(" → ready %d; dead %v", len(h.m.ready), h.m.dead[before:])
	if len(h.m.timedOut) > 0 {
		h.note("; ack timeouts %v", h.m.timedOut)
	}
	if n := h.m.stats.pushed - pushed; n > 0 {
		h.note("; %d dispatched", n)
	}
}

func (h *mtHarness) do(o mtOp) {
	switch o.kind {
	case mtPublish:
		h.publish(o)
	case mtGet:
		h.get(o)
	case mtSettle:
		h.settle(o)
	case mtSettleAgain:
		h.settleAgain(o)
	case mtEndContext:
		h.endContext(o)
	case mtAdvance:
		h.advance(time.Duration(1+int(o.b)*[...]int{1, 4, 16, 32}[o.a%4]) * time.Millisecond)
	case mtConsume:
		h.consume(o)
	case mtReceive:
		h.receive(o)
	case mtCancel:
		h.cancel(o)
	}
}

func (h *mtHarness) consume(o mtOp) {
	prefetch := 1 + int(o.a)%4
	var i int
	switch x := (o.a >> 2) % 8; {
	case x == 7:
		i = h.newCtx()
		h.ctxs[i].cancel()
		h.ctxs[i].ended = true
	case x >= 4:
		live := h.ctxsWhere(func(_ int, c *mtCtx) bool { return !c.ended })
		if len(live) > 0 {
			i = live[int(o.a>>5)%len(live)]
			break
		}
		fallthrough
	default:
		i = h.newCtx()
	}
	opts := []warren.ConsumeOption{warren.Prefetch(prefetch), warren.ConsumerTag("c" + strconv.Itoa(len(h.m.cons)))}
	timeout, how := time.Duration(0), "the queue's ack timeout"
	if h.m.cfg.ackTimeout > 0 {
		timeout = h.m.cfg.ackTimeout
	}
	switch o.b % 4 {
	case 1:
		timeout, how = 0, "AckTimeout(0)"
		opts = append(opts, warren.AckTimeout(0))
	case 2, 3:
		// A few round values, so that consumers time out together, and the queue's TTL, so
		// that a delivery's ack timeout comes at the message's deadline.
		switch x := o.c % 8; {
		case x < 5:
			timeout = [...]time.Duration{50, 100, 250, 1000, 2500}[x] * time.Millisecond
		case x < 7 && h.m.cfg.ttl > 0:
			timeout = h.m.cfg.ttl
		default:
			timeout = time.Duration(20+int(o.c/8)*10) * time.Millisecond
		}
		how = "AckTimeout(" + mtDur(timeout) + ")"
		opts = append(opts, warren.AckTimeout(timeout))
	}
	var wantErr error
	if h.ctxs[i].ended {
		wantErr = context.Canceled
	}
	if o.b%32 == 31 {
		how += " AutoAck"
		opts = append(opts, warren.AutoAck())
		if wantErr == nil {
			wantErr = warren.ErrInvalidArgument
		}
	}
	h.logf("consume c%d prefetch %d %s, context x%d owning %d", len(h.m.cons), prefetch, how, i, h.owning(i))
	c, err := h.main.Consume(h.ctxs[i].ctx, opts...)
	h.checkErr("Consume", err, wantErr)
	if wantErr != nil {
		if c != nil {
			h.fail("Consume returned a consumer with error %v", err)
		}
		h.note(" → %v", err)
		return
	}
	mc := h.m.consume(prefetch, timeout, i)
	h.cons = append(h.cons, c)
	h.note(" → %v, buffered %d", mc, len(mc.buffered))
}

// pickCons resolves a to a consumer: mostly an active one, sometimes any.
func (h *mtHarness) pickCons(a uint8) *mtCons {
	switch {
	case len(h.m.cons) == 0:
		return nil
	case a%8 != 0 && len(h.m.active) > 0:
		return h.m.active[int(a/8)%len(h.m.active)]
	}
	return h.m.cons[int(a/8)%len(h.m.cons)]
}

func (h *mtHarness) receive(o mtOp) {
	mc := h.pickCons(o.a)
	if mc == nil {
		h.logf("receive: no consumer")
		return
	}
	k := 1 + int(o.b)%4
	h.logf("receive %d from %v", k, mc)
	c := h.cons[mc.idx]
	for range k {
		want := h.m.receive(mc)
		var (
			d  warren.Delivery
			ok bool
		)
		select {
		case d, ok = <-c.Deliveries():
		default:
			if want != nil {
				h.fail("receive from %v: nothing buffered, want %v", mc, want)
			}
			if !mc.active {
				h.fail("receive from %v: channel open and empty, want it closed", mc)
			}
			h.note(" (none)")
			return
		}
		switch {
		case !ok && want != nil:
			h.fail("receive from %v: channel closed, want %v", mc, want)
		case !ok && mc.active:
			h.fail("receive from %v: channel closed, want it open", mc)
		case !ok:
			h.note(" (closed)")
			return
		case want == nil:
			h.fail("receive from %v: got %s #%d, want nothing", mc, d.Message.MessageID, d.DeliveryTag)
		}
		want.real = d
		h.note(" %v", want)
		x := want.m
		switch {
		case d.Message.MessageID != "m"+strconv.Itoa(x.id) || string(d.Message.Body) != x.body:
			h.fail("receive from %v: %s %q, want %v %q", mc, d.Message.MessageID, d.Message.Body, x, x.body)
		case d.Message.Expiration != x.exp:
			h.fail("receive %v: Expiration %q, want %q", want, d.Message.Expiration, x.exp)
		case d.Redelivered != x.redelivered:
			h.fail("receive %v: Redelivered %v", want, d.Redelivered)
		case d.DeliveryCount != x.returns:
			h.fail("receive %v: DeliveryCount %d", want, d.DeliveryCount)
		case d.DeliveryTag != want.tag:
			h.fail("receive %v: DeliveryTag %d", want, d.DeliveryTag)
		case d.ConsumerTag != "c"+strconv.Itoa(mc.idx):
			h.fail("receive %v: ConsumerTag %q", want, d.ConsumerTag)
		}
	}
}

func (h *mtHarness) cancel(o mtOp) {
	mc := h.pickCons(o.a)
	if mc == nil {
		h.logf("cancel: no consumer")
		return
	}
	before := len(h.m.dead)
	if o.b%4 == 3 {
		h.logf("Recover %v", mc)
		h.m.recover(mc)
		h.checkErr("Recover", h.cons[mc.idx].Recover(), nil)
	} else {
		h.logf("Cancel %v", mc)
		h.m.cancel(mc)
		h.checkErr("Cancel", h.cons[mc.idx].Cancel(), nil)
	}
	h.note(" → dead %v", h.m.dead[before:])
}

// run executes ops, then ends every context, lets every deadline and delay pass, and takes
// what is left.
func (h *mtHarness) run(ops []mtOp) {
	h.t.Helper()
	for _, o := range ops {
		h.step++
		h.do(o)
		h.check()
	}
	for i, c := range h.ctxs {
		if !c.ended {
			h.step++
			h.endCtx(i)
			h.check()
		}
	}
	h.step++
	h.advance(time.Minute)
	h.check()
	if len(h.m.delayed) > 0 {
		h.fail("model: delayed after a minute: %v", h.m.picture())
	}
	for len(h.m.ready) > 0 {
		h.step++
		h.get(mtOp{kind: mtGet, b: 1}) // a fresh context
		h.check()
		d := h.m.held[len(h.m.held)-1]
		h.step++
		h.logf("Ack #%d %v", d.tag, d.m)
		h.checkErr("Ack", d.real.Ack(), h.m.settle(d, mtAck, 0))
		h.check()
	}
	h.step++
	h.get(mtOp{kind: mtGet, b: 1})
	h.check()
	if h.main.Len() != 0 || h.main.Unacked() != 0 {
		h.fail("main not empty at the end")
	}
	if mtTrace {
		h.t.Logf("%s; history:\n%s", h.label, strings.Join(h.history, "\n"))
	}
}

// ---------------------------------------------------------------------------------------------
// The tests.

// TestModelTime runs random sequences against the reference. WARREN_MODELTIME_SEED sets the
// seed of the first sequence (sequence i uses seed+i), WARREN_MODELTIME_SEQS the number of
// sequences.
func TestModelTime(t *testing.T) {
	nops := 200
	seed, seqs := modelSeeds(t, "WARREN_MODELTIME", 250, nops)
	start := time.Now()
	stats := &mtStats{reasons: map[string]int{}}
	for i := range uint64(seqs) {
		s := seed + i
		synctest.Test(t, func(t *testing.T) {
			label := fmt.Sprintf("seed %d: rerun with WARREN_MODELTIME_SEED=%d WARREN_MODELTIME_SEQS=1", s, s)
			cfg, ops := decodeMT(randomMT(rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15)), nops))
			newMTHarness(t, label, cfg, stats).run(ops)
		})
		if t.Failed() {
			return
		}
	}
	t.Logf("%d sequences in %v; %v", seqs, time.Since(start).Round(time.Millisecond), stats)
}

// FuzzModelTime decodes the fuzz input (five bytes of configuration, then four per operation:
// kind, a, b, c; see mtKind and decodeMTCfg) and compares the queue with the reference.
func FuzzModelTime(f *testing.F) {
	type op = mtOp
	pub := func(a, b, c uint8) op { return op{mtPublish, a, b, c} }
	get := op{mtGet, 1, 1, 0}
	adv := func(ms uint8) op { return op{mtAdvance, 0, ms - 1, 0} }
	// Queue TTL 2.2 s, no limits: message TTLs, two equal, and "0"; expiry in deadline order.
	f.Add(encodeMT([mtCfgBytes]byte{100, 0, 0, 0, 0}, pub(2, 50, 0), pub(2, 20, 0), pub(0, 0, 0), pub(1, 0, 0), pub(3, 20, 0),
		adv(255), op{mtAdvance, 2, 200, 0}))
	// Delivery limit 1: Gets nacked, a context ends owning two Gets, a return past the limit.
	f.Add(encodeMT([mtCfgBytes]byte{0, 2, 0, 0, 0}, pub(4, 0, 0), pub(4, 0, 0), pub(4, 0, 0), get, get, op{mtSettle, 0, 3, 0},
		get, op{mtEndContext, 1, 0, 0}, get, get, op{mtEndContext, 1, 0, 0}, get, op{mtSettle, 0, 4, 0}))
	// TTL 0.82 s, max length 2, drop-head: returns over the limit are dropped first.
	f.Add(encodeMT([mtCfgBytes]byte{31, 0, 4, 0, 0}, pub(4, 0, 0), pub(4, 0, 0), get, get, pub(4, 0, 0), pub(4, 0, 0),
		op{mtEndContext, 1, 0, 0}, adv(200), op{mtAdvance, 3, 200, 0}))
	// TTL 0.22 s, 6 bytes, reject-publish-dlx: a refused 4-byte body; NackWithDelay past the
	// deadline; DeliverAfter with a message TTL.
	f.Add(encodeMT([mtCfgBytes]byte{1, 0, 0, 2, 2 + 4*6}, pub(0x0c, 0, 0), pub(0x0c, 0, 0), pub(0x0c, 0, 0), get,
		op{mtSettle, 0, 6, 200}, pub(0x33, 10, 40), adv(250), op{mtAdvance, 2, 250, 0}, get, op{mtSettle, 0, 5, 0}))
	// Max length 3: a NackWithDelay due (225 ms) at another message's deadline, a DeliverAfter
	// due (241 ms) at a third's.
	f.Add(encodeMT([mtCfgBytes]byte{0, 0, 5, 0, 0}, pub(2, 14, 0), pub(2, 14, 0), get, op{mtSettle, 0, 6, 9},
		pub(2, 15, 0), pub(0x30, 0, 12), op{mtAdvance, 1, 250, 0}))
	// A queue consumer timeout of 50 ms: a consumer (prefetch 2) receives one of its two, and
	// times out; the buffered one comes back unchanged, the received one redelivered, and a
	// consumer with AckTimeout(0) takes them; the returned delivery is settled again.
	f.Add(encodeMT([mtCfgBytes]byte{0, 0, 0, 0, 0, 3}, pub(4, 0, 0), pub(4, 0, 0), pub(4, 0, 0), op{mtConsume, 1, 0, 0},
		op{mtReceive, 1, 0, 0}, adv(60), op{mtConsume, 1, 1, 0}, op{mtSettleAgain, 0, 0, 0}, op{mtReceive, 1, 1, 0}))
	// TTL 2.2 s and an ack timeout of the TTL: the deliveries' due time is the messages'
	// deadline, so both come back expired.
	f.Add(encodeMT([mtCfgBytes]byte{100, 0, 0, 0, 0, 0}, op{mtConsume, 1, 2, 5}, pub(0, 0, 0), pub(0, 0, 0),
		op{mtReceive, 1, 0, 0}, op{mtAdvance, 3, 68, 0}, adv(23), get))
	// A consumer with AckTimeout(100 ms) is cancelled holding a received delivery, which its ack
	// timeout then returns; Err stays ErrCancelled.
	f.Add(encodeMT([mtCfgBytes]byte{0, 0, 0, 0, 0, 0}, op{mtConsume, 1, 2, 1}, pub(4, 0, 0), pub(4, 0, 0),
		op{mtReceive, 1, 0, 0}, op{mtCancel, 1, 0, 0}, adv(100), op{mtSettleAgain, 0, 0, 0}, get))
	// Max length 1, drop-head: two consumers with AckTimeout(250 ms) time out together; their
	// returns come back in seq order and the first two are dropped.
	f.Add(encodeMT([mtCfgBytes]byte{0, 0, 3, 0, 0, 0}, op{mtConsume, 0, 2, 2}, op{mtConsume, 0, 2, 2}, pub(4, 0, 0),
		pub(4, 0, 0), pub(4, 0, 0), op{mtReceive, 1, 0, 0}, op{mtReceive, 9, 0, 0}, adv(250)))
	f.Add([]byte("the quick brown fox jumps over the lazy dog, twice: the quick brown fox"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, ops := decodeMT(data)
		synctest.Test(t, func(t *testing.T) {
			newMTHarness(t, "fuzz input", cfg, nil).run(ops)
		})
	})
}

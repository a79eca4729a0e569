package warren

// The queue core (core.go, ready.go) tested on its own: no goroutine, no Broker, no Queue.
//
// TestCoreAgainstModel drives a queueCore and a naive model of it (plain slices and maps) with
// random sequences of the core's operations, called the way the shell calls them: publish
// (plain, delivered on arrival, dispatched while arriving, Immediate, refused by a length limit,
// delayed), take and deliver (to consumers, an AutoAck feeder, Gets; from the head or, as a
// selector does, from anywhere), settle (ack, nack, reject, NackWithDelay, the UpTo forms, a
// second settlement), returns (a consumer stopped, cancelled or recovered, with buffered and
// received deliveries; Gets whose context ended; a feeder's unread deliveries; a give-back),
// time passing in a synctest bubble with or without the timer's expireDue and promoteDue,
// purge, and end. After every step it compares the effects recorded (in order, with the
// envelope), the ready set in delivery order (seq, priority rank, deadline, returns,
// redelivered), its length, bytes, expiry index and oldest seq, the delayed messages and their
// due times, the next deadline, each holder's outstanding deliveries and live count, unacked,
// and the counters; checks the stream of effects on its own (each message's span is Enqueued,
// deliveries each followed by a return or a terminal effect, exactly one terminal effect;
// delivered only while ready and unexpired; the open spans are what the model holds); checks
// Stats' law (what entered has ended or is in the queue); and checks that the oldest ready
// message has an arrival stamp no later than when it last entered the ready set. One sequence
// in eight runs with nobody listening, where only dead letters are kept as effects.
//
// Not covered: the shell's choices (which consumer gets a message, prefetch, selectors'
// cursors, single-active consumers: the test picks), alerts, the exact arrival stamps beyond
// that bound, and sizes that page a ring or compact the ready set (ready.go's own tests).

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/google/btree"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/warrenmq/warren/internal/wal"
)

// newTestCore returns a core with the default configuration, changed by set if not nil, that
// records every effect (someone listens).
func newTestCore(set func(*queueConfig)) *queueCore {
	cfg := &queueConfig{}
	if err := cfg.parseArgs(); err != nil { // no arguments: the defaults
		panic(err)
	}
	if set != nil {
		set(cfg)
	}
	heard := new(atomic.Pointer[[]*listener])
	heard.Store(&[]*listener{})
	c := newCore(cfg, btree.NewFreeListG[entry](32), heard)
	return &c
}

var coreExchange = &Exchange{name: "x"}

// coreEnv returns the envelope of message i: its body is "m<i>" padded with dots to at least
// size bytes.
func coreEnv(i, size int, priority uint8) *envelope {
	body := fmt.Sprintf("m%d", i)
	body += strings.Repeat(".", max(size-len(body), 0))
	return testEnvelope(Message{Body: []byte(body), Priority: priority}, coreExchange)
}

// corePublish enqueues a message with message TTL ttl as the shell does when no consumer takes
// it on arrival, and returns its entry.
func corePublish(c *queueCore, env *envelope, ttl time.Duration) entry {
	e, now := admitted(c, env, ttl)
	at := c.mark()
	c.ready.push(e)
	c.enqueued(e, at, "")
	c.stamp(e, now)
	if ttl == 0 || c.cfg.ttl == 0 {
		c.expireDue(c.clock())
	}
	c.dropHead()
	return e
}

// coreTake takes the next ready message and delivers it to h, outstanding; nil if none is ready.
func coreTake(c *queueCore, h *holder) *Delivery {
	e, ok := c.take()
	if !ok {
		return nil
	}
	return deliverTo(c, h, e, false, 0)
}

// deliverTo is c.deliver, with the Delivery on the heap: the tests tell deliveries apart by
// their address.
func deliverTo(c *queueCore, h *holder, e entry, autoAck bool, due int64) *Delivery {
	d := new(Delivery)
	c.deliver(d, h, e, autoAck, due)
	return d
}

// settleable says why d cannot be settled, if it cannot, as Delivery.settleWith would.
func settleable(d *Delivery) error {
	switch {
	case d.lease == nil:
		return ErrUnknownDelivery
	case d.lease.gen != d.gen:
		return ErrAlreadySettled
	}
	return checkSettle(d.lease)
}

// coreFx is an effect as the tests compare it.
type coreFx struct {
	kind   EventKind
	reason Reason
	tag    string
	seq    uint64
	env    *envelope
}

func (f coreFx) String() string {
	s := fmt.Sprintf("%s %d", fxName(f.kind), f.seq)
	if f.tag != "" {
		s += " " + f.tag
	}
	if f.reason != "" {
		s += " " + string(f.reason)
	}
	return s
}

func fxName(k EventKind) string {
	switch k {
	case EventEnqueued:
		return "Enqueued"
	case EventDelivered:
		return "Delivered"
	case EventAcked:
		return "Acked"
	case EventRequeued:
		return "Requeued"
	case eventDelayed:
		return "Delayed"
	case EventExpired:
		return "Expired"
	case eventDeadLetter:
		return "DeadLetter"
	case EventDropped:
		return "Dropped"
	}
	return k.String()
}

// takeEffects returns the effects c recorded since the last call, and forgets them.
func takeEffects(t *testing.T, c *queueCore) []coreFx {
	fxs := make([]coreFx, 0, len(c.effects))
	for _, ef := range c.effects {
		holds(t, ef.ev == nil, "the core notes no event of the queue's own by itself")
		fxs = append(fxs, coreFx{ef.kind, ef.reason, ef.tag, ef.e.seq, ef.e.env})
	}
	c.effects = c.effects[:0]
	return fxs
}

func fxStrings(fxs []coreFx) []string {
	s := make([]string, len(fxs))
	for i, f := range fxs {
		s[i] = f.String()
	}
	return s
}

// readyOf lists c's ready messages in delivery order: "seq", and "+returns" for one that came back.
func readyOf(c *queueCore) []string {
	var s []string
	c.ready.ascend(0, func(e entry) bool {
		s = append(s, entryString(e.seq, e.returns, e.redelivered))
		return true
	})
	return s
}

func entryString(seq uint64, returns uint32, redelivered bool) string {
	s := strconv.FormatUint(seq, 10)
	if returns > 0 || redelivered {
		s += fmt.Sprintf("+%d", returns)
		if !redelivered {
			s += " (not redelivered)"
		}
	}
	return s
}

// ---------------------------------------------------------------------------------------------
// Examples.

// TestCoreEachOutAsTheLogHolds: each, which compaction and checkpoints write the queue's state
// from, calls a message out only when the log says so: a consumer's delivery is out; one to a
// holder that counts at receipt and not received yet is not, nor is a message lent to a move
// (lend writes nothing: a checkpoint or compaction that called it out brought it back
// redelivered, one delivery nearer its limit, after a move that gave it back).
func TestCoreEachOutAsTheLogHolds(t *testing.T) {
	c := newTestCore(nil)
	for i := range 4 {
		corePublish(c, coreEnv(i, 0, 0), -1)
	}
	consumer, serve := &holder{}, &holder{atReceipt: true}
	c.holders = append(c.holders, consumer, serve)
	coreTake(c, consumer)
	coreTake(c, serve)
	e, ok := c.take()
	require.True(t, ok)
	c.lend(&c.moving, e)
	out := map[string]bool{}
	c.each(func(e entry, _ int64, o bool) { out[string(e.env.bodyBytes())] = o })
	require.Equal(t, map[string]bool{"m0": true, "m1": false, "m2": false, "m3": false}, out)
}

func TestCoreNackReturnsToOriginalPosition(t *testing.T) {
	c := newTestCore(nil)
	h := &holder{tag: "c1"}
	c.hold(h)
	for i := 1; i <= 3; i++ {
		corePublish(c, coreEnv(i, 0, 0), -1)
	}
	d1, d2 := coreTake(c, h), coreTake(c, h)
	require.Equal(t, []string{"3"}, readyOf(c))

	c.settle(d1.lease, settleNack)
	assert.Equal(t, []string{"1+1", "3"}, readyOf(c), "1 goes back ahead of 3, redelivered")
	c.settle(d2.lease, settleNack)
	assert.Equal(t, []string{"1+1", "2+1", "3"}, readyOf(c), "2 goes back between 1 and 3")

	d := coreTake(c, h)
	assert.Equal(t, "m1", string(d.Message.Body))
	assert.True(t, d.Redelivered)
	assert.Equal(t, 1, d.DeliveryCount)
	assert.Equal(t, uint64(3), d.DeliveryTag)
	assert.Equal(t, []string{
		"Enqueued 1", "Enqueued 2", "Enqueued 3",
		"Delivered 1 c1", "Delivered 2 c1",
		"Requeued 1 c1 nack", "Requeued 2 c1 nack",
		"Delivered 1 c1",
	}, fxStrings(takeEffects(t, c)))
	assert.Equal(t, 1, c.unacked)
	assert.Equal(t, 1, h.live)
	assert.ErrorIs(t, settleable(d1), ErrAlreadySettled)
}

func TestCoreRecordCountsEveryEffect(t *testing.T) {
	for _, tc := range []struct {
		dlx    bool
		n      counters
		dead   uint64
		byKind map[string]int
	}{{
		dlx:    false,
		n:      counters{enqueued: 6, delivered: 4, redelivered: 1, acked: 2, nacked: 1, rejected: 1, expired: 1, dropped: 3},
		byKind: map[string]int{"Enqueued": 6, "Delivered": 4, "Acked": 2, "Requeued": 1, "Expired": 1, "Dropped": 3},
	}, {
		dlx:    true, // 1 (maxlen), 3 (rejected) and 5 (expired) are dead letters
		n:      counters{enqueued: 6, delivered: 4, redelivered: 1, acked: 2, nacked: 1, rejected: 1, expired: 1, dropped: 1},
		dead:   3,
		byKind: map[string]int{"Enqueued": 6, "Delivered": 4, "Acked": 2, "Requeued": 1, "DeadLetter": 3, "Dropped": 1},
	}} {
		t.Run(fmt.Sprintf("dlx=%v", tc.dlx), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newTestCore(func(cfg *queueConfig) { cfg.hasDLX, cfg.maxLen = tc.dlx, 3 })
				h := &holder{tag: "c1"}
				c.hold(h)
				for i := 1; i <= 4; i++ { // 1 is dropped from the head
					corePublish(c, coreEnv(i, 0, 0), -1)
				}
				c.settle(coreTake(c, h).lease, settleAck)    // 2
				c.settle(coreTake(c, h).lease, settleNack)   // 3, back
				c.settle(coreTake(c, h).lease, settleReject) // 3 again, redelivered
				e, _ := c.take()
				deliverTo(c, &c.gets, e, true, 0) // 4, auto-acked
				corePublish(c, coreEnv(5, 0, 0), time.Second)
				time.Sleep(time.Second)
				c.expireDue(c.clock()) // 5
				corePublish(c, coreEnv(6, 0, 0), -1)
				assert.Equal(t, 1, c.purge(ReasonPurged)) // 6

				assert.Equal(t, tc.n, c.n)
				assert.Equal(t, tc.dead, c.queuedDead)
				byKind := map[string]int{}
				for _, f := range takeEffects(t, c) {
					byKind[fxName(f.kind)]++
				}
				assert.Equal(t, tc.byKind, byKind)
			})
		})
	}
}

func TestCoreEndDropsEverything(t *testing.T) {
	c := newTestCore(func(cfg *queueConfig) { cfg.hasDLX = true })
	h := &holder{tag: "c1"}
	c.hold(h)
	for i := 1; i <= 4; i++ {
		corePublish(c, coreEnv(i, 0, 0), -1)
	}
	e, _ := admitted(c, coreEnv(5, 0, 0), -1)
	c.enqueued(e, c.mark(), "")
	c.delay(e, time.Hour) // 5, hidden
	held, got, rejected := coreTake(c, h), coreTake(c, &c.gets), coreTake(c, h)
	takeEffects(t, c)
	c.settle(rejected.lease, settleReject) // a dead letter the shell has not published yet
	require.Len(t, c.effects, 1)
	require.Equal(t, eventDeadLetter, c.effects[0].kind)

	c.end(ReasonQueueDeleted)
	assert.Equal(t, []string{
		"Dropped 4 queue-deleted", // ready
		"Dropped 5 queue-deleted", // delayed
		"Dropped 1 queue-deleted", // a consumer's outstanding delivery
		"Dropped 2 queue-deleted", // a Get's
		"Dropped 3 queue-deleted", // the dead letter: a deleted queue dead-letters nothing
	}, fxStrings(takeEffects(t, c)))
	assert.Equal(t, 0, c.ready.len())
	assert.Nil(t, c.delayed)
	assert.Equal(t, 2, c.unacked, "outstanding deliveries stay outstanding: the shell settles them as no-ops")
	assert.NoError(t, settleable(held))
	assert.NoError(t, settleable(got))

	// What comes back or is dead-lettered after the end is dropped.
	c.deadLetter(entry{env: coreEnv(6, 0, 0), seq: 6}, ReasonExpired)
	c.restoreAll([]entry{held.e})
	assert.Equal(t, []string{"Dropped 6 queue-deleted"}, fxStrings(takeEffects(t, c)))
	assert.Equal(t, 0, c.ready.len())

	c.reset(btree.NewFreeListG[entry](32))
	assert.Equal(t, 0, c.unacked)
	assert.Empty(t, c.holders)
}

func TestCoreTTLZeroArriving(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestCore(func(cfg *queueConfig) { cfg.ttl = 0 })
		h := &holder{tag: "c1"}
		c.hold(h)

		// A consumer takes it in the critical section it arrives in, as dispatch does.
		e, _ := admitted(c, coreEnv(1, 0, 0), -1)
		at := c.mark()
		c.ready.push(e)
		c.arriving = e.seq
		d := coreTake(c, h)
		c.arriving = 0
		c.enqueued(e, at, "")
		require.NotNil(t, d, "an arriving TTL-0 message may be taken")
		assert.Equal(t, []string{"Enqueued 1", "Delivered 1 c1"}, fxStrings(takeEffects(t, c)), "Enqueued goes before its dispatch")

		// Nobody takes the next: it expires as it arrives.
		corePublish(c, coreEnv(2, 0, 0), -1)
		assert.Equal(t, []string{"Enqueued 2", "Expired 2"}, fxStrings(takeEffects(t, c)))
		assert.Equal(t, 0, c.ready.len())

		// Nor can it be taken later, even with no time passed.
		e, _ = admitted(c, coreEnv(3, 0, 0), -1)
		c.ready.push(e)
		c.enqueued(e, c.mark(), "")
		assert.Nil(t, coreTake(c, h))
		// And the one delivered expires as it comes back.
		c.settle(d.lease, settleNack)
		assert.Equal(t, []string{"Enqueued 3", "Expired 3", "Requeued 1 c1 nack", "Expired 1"}, fxStrings(takeEffects(t, c)))
		assert.Equal(t, counters{enqueued: 3, delivered: 1, nacked: 1, expired: 3}, c.n)
	})
}

func TestCoreDropHeadDropsReturnedFirst(t *testing.T) {
	c := newTestCore(func(cfg *queueConfig) { cfg.maxLen = 2 })
	h := &holder{tag: "c1"}
	c.hold(h)
	corePublish(c, coreEnv(1, 0, 0), -1)
	corePublish(c, coreEnv(2, 0, 0), -1)
	d := coreTake(c, h)
	corePublish(c, coreEnv(3, 0, 0), -1)
	c.restoreAll(c.takeBack(h, nil, ReasonOwnerEnded))
	assert.Equal(t, []string{"2", "3"}, readyOf(c))
	assert.Equal(t, []string{
		"Enqueued 1", "Enqueued 2", "Delivered 1 c1", "Enqueued 3",
		"Requeued 1 c1 owner-ended", "Dropped 1 maxlen",
	}, fxStrings(takeEffects(t, c)))
	assert.ErrorIs(t, settleable(d), ErrAlreadySettled, "returned")
}

// ---------------------------------------------------------------------------------------------
// The model.

// coreMsg is the model's record of a message in the queue.
type coreMsg struct {
	env         *envelope
	seq         uint64
	rank        uint8
	deadline    int64
	returns     uint32
	redelivered bool
}

func (m *coreMsg) cmp(o *coreMsg) int {
	return cmp.Or(cmp.Compare(m.rank, o.rank), cmp.Compare(m.seq, o.seq))
}

func (m *coreMsg) key() uint64 { return entry{seq: m.seq, rank: m.rank}.key() }

func (m coreMsg) String() string {
	return fmt.Sprintf("%s %q rank %d deadline %d", entryString(m.seq, m.returns, m.redelivered), m.env.bodyBytes(), m.rank, m.deadline)
}

func entryMsg(e entry) *coreMsg {
	return &coreMsg{env: e.env, seq: e.seq, rank: e.rank, deadline: e.deadline, returns: e.returns, redelivered: e.redelivered}
}

// coreDelayed is a delayed message of the model.
type coreDelayed struct {
	due int64
	m   *coreMsg
}

// coreHolder is the model of a holder: its outstanding deliveries in tag order.
type coreHolder struct {
	h       *holder
	out     []*Delivery
	nextTag uint64
	stopped bool // cancelled: it receives nothing more, and goes once it holds nothing
}

// coreGone is a delivery no longer outstanding, and what settling it again must say.
type coreGone struct {
	d   *Delivery
	err error
}

// Span states of a message in the stream of effects.
const (
	spanReady = iota + 1 // enqueued or back: ready or delayed
	spanOut              // delivered, outstanding
)

// coreRun is one random sequence: the core, the model, and the stream check.
type coreRun struct {
	t    *testing.T
	seed uint64
	rng  *rand.Rand
	c    *queueCore
	cfg  *queueConfig

	now        int64 // the model's clock: 1 + the time slept
	nextSeq    uint64
	msgs       map[uint64]*coreMsg // every message enqueued, by seq
	entered    map[uint64]int64    // when each message last entered the ready set
	ready      []*coreMsg          // in delivery order
	delayed    []coreDelayed       // by (due, seq)
	holders    []*coreHolder       // the consumers, as c.holders
	gets       *coreHolder
	feeder     *coreHolder // an AutoAck consumer, among holders
	held       []*Delivery // auto-acked deliveries the feeder holds unread: they go back
	of         map[*Delivery]*coreMsg
	gone       []coreGone
	made       int // holders made, for their tags
	bodies     int // messages made, for their bodies
	want       []coreFx
	n          counters
	queuedDead uint64
	arriving   uint64   // as c.arriving
	arrived    []uint64 // the messages published in this step, which may be delivered with TTL 0
	ended      Reason
	observed   bool            // someone listens: every effect is recorded, not only dead letters
	unread     map[uint64]bool // the messages on disk at the broker's close, which end unread
	refused    uint64          // messages refused, which never entered
	// disk holds what the core paged out (paged.go), by seq, for its pager to read back: the
	// model pages with a window of 1 to 4 messages in half the sequences.
	disk map[uint64]entry
	// reads counts the chunks read back, faults and expiries: the paging the sequence crossed.
	reads int
	// cover counts, over every sequence of the test, the steps that crossed the disk, by kind.
	cover map[string]int
	// early is the earliest deadline a chunk keeps as an early bound, before any of its messages'
	// (checkPaged): the core's next deadline may be it.
	early int64

	span  map[uint64]int // the stream check: seq → spanReady or spanOut while its span is open
	trace []string       // the steps so far
}

func newCoreRun(t *testing.T, seed uint64, cover map[string]int) *coreRun {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	r := &coreRun{t: t, seed: seed, rng: rng, now: 1, nextSeq: 1, msgs: map[uint64]*coreMsg{}, entered: map[uint64]int64{}, of: map[*Delivery]*coreMsg{},
		span: map[uint64]int{}, cover: cover}
	r.c = newTestCore(func(cfg *queueConfig) {
		if rng.IntN(3) == 0 {
			cfg.maxPriority = 1 + rng.IntN(5)
		}
		if rng.IntN(3) == 0 {
			cfg.ttl = time.Duration(rng.IntN(40)) * time.Millisecond
		}
		if rng.IntN(3) == 0 {
			cfg.maxLen = int64(rng.IntN(8))
		}
		if rng.IntN(4) == 0 {
			cfg.maxBytes = int64(rng.IntN(100))
		}
		cfg.overflow = []OverflowPolicy{DropHead, DropHead, RejectPublish, RejectPublishDLX}[rng.IntN(4)]
		if rng.IntN(3) == 0 {
			cfg.deliveryLimit = int64(rng.IntN(4))
		}
		cfg.hasDLX = rng.IntN(2) == 0
		if rng.IntN(4) == 0 {
			cfg.alerts.Age = time.Second // a stamp per message
		}
	})
	r.cfg = r.c.cfg
	if rng.IntN(2) == 0 {
		r.disk = map[uint64]entry{}
		r.c.ready.paged.window = 1 + rng.IntN(4)
		r.c.ready.paged.read = r.readChunk
	}
	if r.observed = rng.IntN(8) != 0; !r.observed {
		r.c.heard.Store(nil)
	}
	r.gets = &coreHolder{h: &r.c.gets}
	r.feeder = r.addHolder("auto")
	r.addHolder("")
	r.addHolder("")
	r.trace = append(r.trace, fmt.Sprintf("config %+v, observed %v, page window %d", *r.cfg, r.observed, r.c.ready.paged.window))
	return r
}

// addHolder adds a consumer, tagged "c<n>" if tag is empty.
func (r *coreRun) addHolder(tag string) *coreHolder {
	r.made++
	if tag == "" {
		tag = fmt.Sprintf("c%d", r.made)
	}
	h := &coreHolder{h: &holder{tag: tag}}
	r.c.hold(h.h)
	r.holders = append(r.holders, h)
	return h
}

// expectAt records an effect the core must record, at position at of the step's effects, and
// counts it as Stats does.
func (r *coreRun) expectAt(at int, kind EventKind, m *coreMsg, tag string, reason Reason) {
	r.want = slices.Insert(r.want, at, coreFx{kind, reason, tag, m.seq, m.env})
	switch kind {
	case EventEnqueued:
		r.n.enqueued++
	case EventDelivered:
		r.n.delivered++
		if m.redelivered {
			r.n.redelivered++
		}
	case EventAcked:
		r.n.acked++
	case EventRequeued:
		if reason == ReasonNack {
			r.n.nacked++
		}
	case EventExpired:
		r.n.expired++
	case eventDeadLetter:
		r.queuedDead++
		switch reason {
		case ReasonExpired:
			r.n.expired++
		case ReasonRejected:
			r.n.rejected++
		}
	case EventDropped:
		r.n.dropped++
		if reason == ReasonRejected {
			r.n.rejected++
		}
	}
}

func (r *coreRun) expect(kind EventKind, m *coreMsg, tag string, reason Reason) {
	r.expectAt(len(r.want), kind, m, tag, reason)
}

func (r *coreRun) expired(m *coreMsg) bool {
	return m.deadline != 0 && m.seq != r.arriving && m.deadline <= r.now
}

// after returns the time d after the model's now, as a deadline or a due time.
func (r *coreRun) after(d time.Duration) int64 {
	return r.now + int64(min(d, math.MaxInt64-time.Duration(r.now), maxWait))
}

// deadLetter records m leaving for reason: a dead letter if the queue has a dead-letter exchange,
// else expired or dropped; dropped with the queue's reason once it has ended.
func (r *coreRun) deadLetter(m *coreMsg, reason Reason) {
	kind := EventDropped
	switch {
	case r.ended != "":
		reason = r.ended
	case r.cfg.hasDLX:
		kind = eventDeadLetter
	case reason == ReasonExpired:
		kind, reason = EventExpired, ""
	}
	r.expect(kind, m, "", reason)
}

func (r *coreRun) readyBytes() int64 {
	var n int64
	for _, m := range r.ready {
		n += int64(m.env.size)
	}
	return n
}

func (r *coreRun) push(m *coreMsg) {
	i, found := slices.BinarySearchFunc(r.ready, m, (*coreMsg).cmp)
	holds(r.t, !found, "model: %d is ready twice", m.seq)
	r.ready = slices.Insert(r.ready, i, m)
	r.entered[m.seq] = r.now
}

func (r *coreRun) remove(m *coreMsg) bool {
	i, found := slices.BinarySearchFunc(r.ready, m, (*coreMsg).cmp)
	if found {
		r.ready = slices.Delete(r.ready, i, i+1)
	}
	return found
}

func (r *coreRun) popMin() *coreMsg {
	m := r.ready[0]
	r.ready = slices.Delete(r.ready, 0, 1)
	return m
}

// dropHead drops the head while the ready set is over a length limit of a drop-head queue.
func (r *coreRun) dropHead() {
	over := func() bool {
		return r.cfg.maxLen >= 0 && int64(len(r.ready)) > r.cfg.maxLen || r.cfg.maxBytes >= 0 && r.readyBytes() > r.cfg.maxBytes
	}
	for r.cfg.overflow == DropHead && len(r.ready) > 0 && over() {
		m := r.popMin()
		if r.expired(m) {
			r.deadLetter(m, ReasonExpired)
		} else {
			r.deadLetter(m, ReasonMaxLen)
		}
	}
}

// take takes the first ready message that has not expired, expiring those before it.
func (r *coreRun) take() *coreMsg {
	for len(r.ready) > 0 {
		m := r.popMin()
		if !r.expired(m) {
			return m
		}
		r.deadLetter(m, ReasonExpired)
	}
	return nil
}

// delivered checks a delivery of m the core made to h and records it in the model.
func (r *coreRun) delivered(h *coreHolder, m *coreMsg, d *Delivery, autoAck bool) {
	t := r.t
	h.nextTag++
	want := m.env.message()
	require.Equal(t, want, d.Message, "Message")
	eq(t, "x", d.Exchange, "Exchange")
	eq(t, m.redelivered, d.Redelivered, "Redelivered")
	eq(t, int(m.returns), d.DeliveryCount, "DeliveryCount")
	eq(t, h.nextTag, d.DeliveryTag, "DeliveryTag")
	eq(t, h.h.tag, d.ConsumerTag, "ConsumerTag")
	if !autoAck {
		eq(t, h.h, d.lease.h, "holder")
	}
	r.of[d] = m
	r.expect(EventDelivered, m, h.h.tag, "")
	if autoAck {
		r.expect(EventAcked, m, h.h.tag, "")
		r.gone = append(r.gone, coreGone{d, ErrUnknownDelivery})
		return
	}
	h.out = append(h.out, d)
}

// release takes d from h's outstanding deliveries.
func (r *coreRun) release(h *coreHolder, d *Delivery) *coreMsg {
	i := slices.Index(h.out, d)
	holds(r.t, i >= 0, "model: delivery %d of %q is not outstanding", d.DeliveryTag, h.h.tag)
	h.out = slices.Delete(h.out, i, i+1)
	r.gone = append(r.gone, coreGone{d, ErrAlreadySettled})
	return r.of[d]
}

// returned marks m as coming back after the application saw it.
func returned(m *coreMsg) *coreMsg {
	m.returns++
	m.redelivered = true
	return m
}

// mayReturn reports whether m, coming back, may go back: not once expired, nor past the delivery
// limit; it dead-letters m then.
func (r *coreRun) mayReturn(m *coreMsg) bool {
	var why Reason
	if r.expired(m) {
		why = ReasonExpired
	} else if r.cfg.deliveryLimit >= 0 && int64(m.returns) > r.cfg.deliveryLimit {
		why = ReasonDeliveryLimit
	}
	if why != "" {
		r.deadLetter(m, why)
	}
	return why == ""
}

func (r *coreRun) restoreAll(ms []*coreMsg) {
	slices.SortFunc(ms, (*coreMsg).cmp)
	for _, m := range ms {
		if r.mayReturn(m) {
			r.push(m)
		}
	}
	r.dropHead()
}

func (r *coreRun) nack(m *coreMsg, tag string, delay time.Duration) {
	r.expect(EventRequeued, m, tag, ReasonNack)
	returned(m)
	switch {
	case !r.mayReturn(m):
	case delay > 0:
		r.delay(m, delay)
	default:
		r.push(m)
		r.dropHead()
	}
}

func (r *coreRun) delay(m *coreMsg, d time.Duration) {
	r.expect(eventDelayed, m, "", "")
	k := coreDelayed{r.after(d), m}
	i, _ := slices.BinarySearchFunc(r.delayed, k, func(a, b coreDelayed) int {
		return cmp.Or(cmp.Compare(a.due, b.due), cmp.Compare(a.m.seq, b.m.seq))
	})
	r.delayed = slices.Insert(r.delayed, i, k)
}

func (r *coreRun) expireDue() {
	var due []*coreMsg
	for _, m := range r.ready {
		if m.deadline != 0 && m.deadline <= r.now {
			due = append(due, m)
		}
	}
	slices.SortFunc(due, func(a, b *coreMsg) int { return cmp.Or(cmp.Compare(a.deadline, b.deadline), a.cmp(b)) })
	for _, m := range due {
		r.remove(m)
		r.deadLetter(m, ReasonExpired)
	}
}

func (r *coreRun) promoteDue() {
	for len(r.delayed) > 0 && r.delayed[0].due <= r.now {
		m := r.delayed[0].m
		r.delayed = slices.Delete(r.delayed, 0, 1)
		if r.expired(m) {
			r.deadLetter(m, ReasonExpired)
			continue
		}
		r.push(m)
		r.dropHead()
	}
}

func (r *coreRun) purge(why Reason) int {
	n := len(r.ready)
	for _, m := range r.ready {
		if r.unread[m.seq] {
			r.n.dropped++ // counted, not read back: no effect (queueCore.purge)
			continue
		}
		r.expect(EventDropped, m, "", why)
	}
	r.ready = nil
	return n
}

func (r *coreRun) end(why Reason) {
	r.ended = why
	r.purge(why)
	for _, k := range r.delayed {
		r.expect(EventDropped, k.m, "", why)
	}
	r.delayed = nil
	for _, h := range append(slices.Clone(r.holders), r.gets) {
		for _, d := range h.out {
			r.expect(EventDropped, r.of[d], "", why)
		}
	}
	var dead []coreFx
	r.want = slices.DeleteFunc(r.want, func(f coreFx) bool {
		if f.kind == eventDeadLetter {
			dead = append(dead, f)
		}
		return f.kind == eventDeadLetter
	})
	for _, f := range dead {
		r.expect(EventDropped, &coreMsg{env: f.env, seq: f.seq}, "", why)
	}
}

func (r *coreRun) nextDeadline() int64 {
	var at int64
	for _, m := range r.ready {
		if m.deadline != 0 && (at == 0 || m.deadline < at) {
			at = m.deadline
		}
	}
	if len(r.delayed) > 0 && (at == 0 || r.delayed[0].due < at) {
		at = r.delayed[0].due
	}
	return at
}

// ---------------------------------------------------------------------------------------------
// The operations: each does to the core what the shell does, and the same to the model.

// arrive puts an arriving entry into the ready set, as the shell does: paged out when the set
// pages (its record then on the model's disk), unless it is one of the one in five that may not
// be (a transient message, or one in several queues), else in memory.
func (r *coreRun) arrive(e entry) string {
	pageable := r.disk != nil && r.rng.IntN(5) > 0
	if !pageable || !r.c.ready.pages(e.rank) {
		r.c.ready.arrive(e, false)
		if r.disk != nil && !pageable && r.c.ready.paged.n > 0 {
			r.cover["kept in memory behind the disk"]++
			return ", kept in memory"
		}
		return ""
	}
	r.disk[e.seq] = e
	r.c.ready.pageOut(e, pageLoc{seg: e.seq / 4, lsn: e.seq}) // chunks end at every fourth seq, as segments would
	return ", paged out"
}

// readChunk is the model's pager: it reads a chunk's live messages back from disk.
func (r *coreRun) readChunk(rank uint8, c *chunk) ([]entry, error) {
	r.reads++
	var ents []entry
	for seq := c.first; seq <= c.last; seq++ {
		if e, ok := r.disk[seq]; ok && e.rank == rank && c.holds(seq) {
			ents = append(ents, e)
		}
	}
	return ents, nil
}

// newEnv returns a new message, with a unique body; one in four has headers, so that its
// footprint (memory.go) counts them.
func (r *coreRun) newEnv() *envelope {
	r.bodies++
	env := coreEnv(r.bodies, r.rng.IntN(24), uint8(r.rng.IntN(8)))
	if r.rng.IntN(4) == 0 {
		m := env.message()
		m.Headers = Table{"h": strings.Repeat("x", r.rng.IntN(64))}
		env = testEnvelope(m, coreExchange)
	}
	return env
}

func (r *coreRun) randTTL() time.Duration {
	switch r.rng.IntN(8) {
	case 0:
		return 0
	case 1, 2, 3:
		return time.Duration(1+r.rng.IntN(50)) * time.Millisecond
	}
	return -1
}

func (r *coreRun) randDelay() time.Duration {
	if r.rng.IntN(20) == 0 {
		return math.MaxInt64 // capped at maxWait: practically forever
	}
	return time.Duration(1+r.rng.IntN(40)) * time.Millisecond
}

// admit admits env to the core and the model, and checks they agree.
func (r *coreRun) admit(env *envelope, ttl time.Duration) (entry, int64, *coreMsg) {
	t := r.t
	e, now := admitted(r.c, env, ttl)
	m := &coreMsg{env: env, seq: r.nextSeq}
	r.nextSeq++
	if p := r.cfg.maxPriority; p > 0 {
		m.rank = uint8(p - min(p, int(env.priority)))
	}
	var wantNow int64
	if ttl >= 0 || r.cfg.ttl >= 0 {
		wantNow = r.now
		if r.cfg.ttl >= 0 && (ttl < 0 || r.cfg.ttl < ttl) {
			ttl = r.cfg.ttl
		}
		m.deadline = r.after(ttl)
	}
	eq(t, wantNow, now, "admit reads the clock only for a TTL")
	eqMsg(t, m, e, "admitted")
	r.msgs[m.seq] = m
	r.arrived = append(r.arrived, m.seq)
	return e, now, m
}

// consumer returns a consumer that may receive (not the feeder, not stopped), or nil.
func (r *coreRun) consumer() *coreHolder {
	var hs []*coreHolder
	for _, h := range r.holders {
		if h != r.feeder && !h.stopped {
			hs = append(hs, h)
		}
	}
	if len(hs) == 0 {
		return nil
	}
	return hs[r.rng.IntN(len(hs))]
}

// takeDeliver takes the next message and delivers it to h, as dispatch or Get does.
func (r *coreRun) takeDeliver(h *coreHolder, autoAck bool) (*Delivery, bool) {
	e, ok := r.c.take()
	m := r.take()
	eq(r.t, m != nil, ok, "take")
	if !ok {
		return nil, false
	}
	eqMsg(r.t, m, e, "taken")
	d := deliverTo(r.c, h.h, e, autoAck, 0)
	r.delivered(h, m, d, autoAck)
	return d, true
}

func (r *coreRun) opPublish() string {
	c, t := r.c, r.t
	env := r.newEnv()
	size := int(env.size)
	if r.cfg.limited() && r.cfg.overflow != DropHead {
		room := (r.cfg.maxLen < 0 || int64(len(r.ready)) < r.cfg.maxLen) &&
			(r.cfg.maxBytes < 0 || r.readyBytes()+int64(size) <= r.cfg.maxBytes)
		eq(t, room, c.room(size), "room for %d bytes", size)
		if !room {
			refused := &coreMsg{env: env}
			if r.cfg.overflow == RejectPublishDLX && r.cfg.hasDLX {
				c.deadLetter(entry{env: env}, ReasonMaxLen)
				r.deadLetter(refused, ReasonMaxLen)
			} else {
				c.drop(entry{env: env}, ReasonQueueFull)
				r.expect(EventDropped, refused, "", ReasonQueueFull)
			}
			r.refused++
			return "publish: refused"
		}
	}
	ttl := r.randTTL()
	e, now, m := r.admit(env, ttl)
	at := c.mark()
	if r.observed {
		eq(t, len(r.want), at, "mark")
	}
	at = len(r.want) // the model's
	var how string
	switch h := r.consumer(); {
	case r.rng.IntN(4) == 0 && len(r.ready) == 0 && h != nil:
		how = "delivered on arrival"
		r.delivered(h, m, deliverTo(c, h.h, e, false, 0), false)
	case r.rng.IntN(2) == 0:
		how = "pushed" + r.arrive(e)
		r.push(m)
	default:
		immediate := r.rng.IntN(3) == 0
		how = "pushed and dispatched"
		if immediate {
			how = "immediate"
		}
		how += r.arrive(e)
		r.push(m)
		c.arriving, r.arriving = e.seq, e.seq
		for k := r.rng.IntN(3); k > 0 && h != nil; k-- {
			if _, ok := r.takeDeliver(h, false); !ok {
				break
			}
		}
		c.arriving, r.arriving = 0, 0
		if immediate {
			_, ok := c.ready.remove(e.key())
			if !ok {
				ok = c.ready.unpageNewest(e) // no consumer took it, and it is still on disk
				if ok {
					r.cover["an immediate message taken back off disk"]++
				}
			}
			eq(t, r.remove(m), ok, "an immediate message no consumer took is still ready")
			if ok {
				c.drop(e, ReasonNoConsumers)
				r.expect(EventDropped, m, "", ReasonNoConsumers)
				r.refused++
				return fmt.Sprintf("publish %d ttl %v: immediate, refused", m.seq, ttl)
			}
		}
	}
	var reason Reason
	if r.rng.IntN(8) == 0 {
		reason = ReasonRejected // a dead letter arriving
	}
	c.enqueued(e, at, reason)
	r.expectAt(at, EventEnqueued, m, "", reason)
	c.stamp(e, now)
	if ttl == 0 || r.cfg.ttl == 0 {
		c.expireDue(c.clock())
		r.expireDue()
	}
	c.dropHead()
	r.dropHead()
	return fmt.Sprintf("publish %d ttl %v prio %d: %s", m.seq, ttl, env.priority, how)
}

func (r *coreRun) opPublishDelayed() string {
	c := r.c
	env := r.newEnv()
	ttl := r.randTTL()
	e, now, m := r.admit(env, ttl)
	c.enqueued(e, c.mark(), "")
	r.expect(EventEnqueued, m, "", "")
	c.pushStamp(e.seq, now)
	d := r.randDelay()
	c.delay(e, d)
	r.delay(m, d)
	return fmt.Sprintf("publish %d ttl %v delayed %v", m.seq, ttl, d)
}

func (r *coreRun) opDeliver() string {
	var h *coreHolder
	autoAck := false
	switch r.rng.IntN(6) {
	case 0:
		h, autoAck = r.gets, r.rng.IntN(2) == 0
	case 1:
		h, autoAck = r.feeder, true
	default:
		h = r.consumer()
	}
	if h == nil {
		return "deliver: no consumer"
	}
	d, ok := r.takeDeliver(h, autoAck)
	if !ok {
		return fmt.Sprintf("deliver to %q: nothing ready", h.h.tag)
	}
	if h == r.feeder && r.rng.IntN(3) == 0 {
		r.held = append(r.held, d)
	}
	return fmt.Sprintf("deliver %d to %q (tag %d, autoAck %v)", d.e.seq, h.h.tag, d.DeliveryTag, autoAck)
}

// opSelect takes a message from anywhere in the ready set, as a consumer's selector does.
func (r *coreRun) opSelect() string {
	var live []*coreMsg
	for _, m := range r.ready {
		if !r.expired(m) {
			live = append(live, m)
		}
	}
	h := r.consumer()
	if len(live) == 0 || h == nil {
		return "select: nothing"
	}
	m := live[r.rng.IntN(len(live))]
	e, ok := r.c.ready.remove(m.key())
	if !ok {
		e, ok = r.takePaged(m) // a selector reads the backlog on disk
	}
	holds(r.t, ok, "remove %d", m.seq)
	r.remove(m)
	eqMsg(r.t, m, e, "removed")
	d := deliverTo(r.c, h.h, e, false, 0)
	r.delivered(h, m, d, false)
	return fmt.Sprintf("select %d for %q", m.seq, h.h.tag)
}

// takePaged takes m out of the chunk it is paged in, reading it back, as a selector's scan does.
func (r *coreRun) takePaged(m *coreMsg) (entry, bool) {
	e, ok := r.c.ready.takePaged(entry{seq: m.seq, rank: m.rank})
	if ok {
		r.cover["a selector's take off disk"]++
	}
	return e, ok
}

// outstanding picks an outstanding delivery and its holder; nil if there is none.
func (r *coreRun) outstanding() (*coreHolder, *Delivery) {
	var hs []*coreHolder
	for _, h := range append(slices.Clone(r.holders), r.gets) {
		if len(h.out) > 0 {
			hs = append(hs, h)
		}
	}
	if len(hs) == 0 {
		return nil, nil
	}
	h := hs[r.rng.IntN(len(hs))]
	return h, h.out[r.rng.IntN(len(h.out))]
}

// tidy trims a consumer's list after a settlement, as Consumer.tidyLocked does.
func (r *coreRun) tidy(h *coreHolder) {
	if h != r.gets {
		r.c.trim(h.h)
	}
}

var settlementNames = map[settlement]string{settleAck: "ack", settleNack: "nack", settleReject: "reject"}

func (r *coreRun) opSettle() string {
	h, d := r.outstanding()
	if d == nil {
		return "settle: nothing outstanding"
	}
	eq(r.t, nil, settleable(d), "settle an outstanding delivery")
	how := settlement(1 + r.rng.IntN(3))
	r.c.settle(d.lease, how)
	r.tidy(h)
	r.settled(h, d, how)
	return fmt.Sprintf("%s %d (%q tag %d)", settlementNames[how], d.e.seq, h.h.tag, d.DeliveryTag)
}

// settled settles d in the model.
func (r *coreRun) settled(h *coreHolder, d *Delivery, how settlement) {
	m := r.release(h, d)
	switch how {
	case settleAck:
		r.expect(EventAcked, m, d.ConsumerTag, "")
	case settleNack:
		r.nack(m, d.ConsumerTag, 0)
	case settleReject:
		r.deadLetter(m, ReasonRejected)
	}
}

func (r *coreRun) opSettleAgain() string {
	if len(r.gone) == 0 {
		return "settle again: nothing settled"
	}
	g := r.gone[r.rng.IntN(len(r.gone))]
	if err := settleable(g.d); !errors.Is(err, g.err) {
		require.ErrorIs(r.t, err, g.err, "settle %d again", g.d.e.seq)
	}
	return fmt.Sprintf("settle %d again (tag %d): %v", g.d.e.seq, g.d.DeliveryTag, g.err)
}

func (r *coreRun) opNackWithDelay() string {
	h, d := r.outstanding()
	if d == nil {
		return "nack with delay: nothing outstanding"
	}
	delay := r.randDelay()
	eq(r.t, nil, settleable(d), "settle an outstanding delivery")
	r.c.release(d.lease, deliverySettled)
	r.c.nack(d.e, d.ConsumerTag, delay)
	r.tidy(h)
	r.nack(r.release(h, d), d.ConsumerTag, delay)
	return fmt.Sprintf("nack %d with delay %v", d.e.seq, delay)
}

// coreBatch is what comes back together: the core's entries and the model's messages.
type coreBatch struct {
	back []entry
	ms   []*coreMsg
}

// goBack releases d, h's outstanding delivery, to state, records its return for why, and adds it
// to b: redelivered if the application received it, else unchanged (it was buffered, unread).
func (r *coreRun) goBack(b *coreBatch, h *coreHolder, d *Delivery, state deliveryState, why Reason, received bool) {
	r.c.release(d.lease, state)
	r.c.back(h.h, d.e, why)
	m := r.release(h, d)
	r.expect(EventRequeued, m, h.h.tag, why)
	if received {
		b.back = append(b.back, redelivered(d.e))
		m = returned(m)
	} else {
		b.back = append(b.back, d.e)
	}
	b.ms = append(b.ms, m)
}

// restore puts b back, into the core and the model.
func (r *coreRun) restore(b coreBatch) {
	r.c.restoreAll(b.back)
	r.restoreAll(b.ms)
}

// opSettleUpTo settles a consumer's deliveries up to a tag, as Consumer.settleUpTo does.
func (r *coreRun) opSettleUpTo() string {
	h := r.holders[r.rng.IntN(len(r.holders))]
	if len(h.out) == 0 {
		return fmt.Sprintf("settle up to: %q holds nothing", h.h.tag)
	}
	upTo := h.out[r.rng.IntN(len(h.out))].DeliveryTag
	how := settlement(1 + r.rng.IntN(3))
	var b coreBatch
	for _, d := range slices.Clone(h.out) {
		if d.DeliveryTag > upTo {
			break
		}
		if how == settleNack {
			r.goBack(&b, h, d, deliverySettled, ReasonNack, true)
		} else {
			r.c.settle(d.lease, how)
			r.settled(h, d, how)
		}
	}
	r.restore(b)
	r.tidy(h)
	return fmt.Sprintf("%s up to %d on %q", settlementNames[how], upTo, h.h.tag)
}

// opStop stops a consumer: its last deliveries, buffered unread, come back unchanged; the others
// come back redelivered, unless it was cancelled (it keeps them until it settles them). Then an
// ended consumer goes, and another starts.
func (r *coreRun) opStop() string {
	h := r.holders[r.rng.IntN(len(r.holders))]
	if h == r.feeder || h.stopped {
		return fmt.Sprintf("stop %q: not a running push consumer", h.h.tag)
	}
	why := []Reason{ReasonOwnerEnded, ReasonRecover, ReasonAckTimeout, ReasonCancel}[r.rng.IntN(4)]
	k := r.rng.IntN(len(h.out) + 1)
	buffered, received := slices.Clone(h.out[len(h.out)-k:]), slices.Clone(h.out[:len(h.out)-k])
	var b coreBatch
	for _, d := range buffered {
		r.goBack(&b, h, d, deliveryReturned, why, false)
	}
	if why != ReasonCancel {
		b.back = r.c.takeBack(h.h, b.back, why) // the core's own loop over the received ones
		for _, d := range received {
			m := r.release(h, d)
			r.expect(EventRequeued, m, h.h.tag, why)
			b.ms = append(b.ms, returned(m))
		}
	}
	r.restore(b)
	r.tidy(h)
	switch why {
	case ReasonCancel:
		h.stopped = true
	case ReasonOwnerEnded, ReasonAckTimeout:
		r.unhold(h)
	}
	return fmt.Sprintf("stop %q (%s): %d buffered, %d received", h.h.tag, why, len(buffered), len(received))
}

// unhold removes a consumer that holds nothing more, and starts another.
func (r *coreRun) unhold(h *coreHolder) {
	holds(r.t, r.c.unhold(h.h), "unhold %q", h.h.tag)
	r.holders = slices.DeleteFunc(r.holders, func(x *coreHolder) bool { return x == h })
	r.addHolder("")
}

// opGetsBack returns some of the Gets' outstanding deliveries, as orphanLocked does when their
// contexts end or their ack timeout passes.
func (r *coreRun) opGetsBack() string {
	why := []Reason{ReasonOwnerEnded, ReasonAckTimeout}[r.rng.IntN(2)]
	var gone []*Delivery
	for _, d := range r.gets.out {
		if r.rng.IntN(2) == 0 {
			gone = append(gone, d)
		}
	}
	var b coreBatch
	for _, d := range gone {
		r.goBack(&b, r.gets, d, deliveryReturned, why, true)
	}
	r.restore(b)
	return fmt.Sprintf("%d Gets back (%s)", len(gone), why)
}

// opFeederBack puts back what the AutoAck consumer held unread, unchanged, as its feeder does
// when it stops.
func (r *coreRun) opFeederBack() string {
	var b coreBatch
	for _, d := range r.held {
		r.c.back(r.feeder.h, d.e, ReasonReturned)
		b.back = append(b.back, d.e)
		m := r.of[d]
		r.expect(EventEnqueued, m, "", ReasonReturned)
		b.ms = append(b.ms, m)
	}
	r.held = nil
	r.restore(b)
	return fmt.Sprintf("feeder puts back %d", len(b.ms))
}

// opBurst publishes many messages.
func (r *coreRun) opBurst() string {
	n := 5 + r.rng.IntN(40)
	for range n {
		r.opPublish()
	}
	return fmt.Sprintf("publish %d", n)
}

// opDeliverMany delivers many messages to one consumer.
func (r *coreRun) opDeliverMany() string {
	h := r.consumer()
	if h == nil {
		return "deliver many: no consumer"
	}
	n := 0
	for range 1 + r.rng.IntN(30) {
		if _, ok := r.takeDeliver(h, false); !ok {
			break
		}
		n++
	}
	return fmt.Sprintf("deliver %d to %q", n, h.h.tag)
}

// opGiveBack gives back a delivery unchanged, as Serve does with one a worker took too late.
func (r *coreRun) opGiveBack() string {
	h, d := r.outstanding()
	if d == nil || h == r.gets {
		return "give back: no consumer's delivery"
	}
	var b coreBatch
	r.goBack(&b, h, d, deliveryReturned, ReasonCancel, false)
	r.restore(b)
	r.tidy(h)
	return fmt.Sprintf("give back %d (%q tag %d)", d.e.seq, h.h.tag, d.DeliveryTag)
}

// opSleep lets time pass, and runs the timer most of the time.
func (r *coreRun) opSleep() string {
	d := time.Duration(r.rng.IntN(30)) * time.Millisecond
	switch at := r.nextDeadline(); {
	case r.rng.IntN(8) == 0:
		d = time.Nanosecond
	case r.rng.IntN(3) == 0 && at > r.now && at-r.now < int64(time.Hour):
		d = time.Duration(at - r.now) // to the next deadline exactly
	}
	time.Sleep(d)
	r.now += int64(d)
	if r.rng.IntN(4) == 0 {
		return fmt.Sprintf("sleep %v", d)
	}
	return fmt.Sprintf("sleep %v, %s", d, r.timer())
}

// timer expires and promotes what is due, as the queue's timer does.
func (r *coreRun) timer() string {
	now := r.c.clock()
	eq(r.t, r.now, now, "clock")
	r.c.expireDue(now)
	r.c.promoteDue(now)
	r.expireDue()
	r.promoteDue()
	return "timer"
}

func (r *coreRun) opPurge() string {
	paged := r.c.ready.paged.n
	n := r.c.purge(ReasonPurged)
	r.checkDropped(paged, ReasonPurged)
	eq(r.t, r.purge(ReasonPurged), n, "purged")
	return fmt.Sprintf("purge %d", n)
}

// checkDropped checks the chunks a purge or the queue's end for why let go of, for the shell to
// settle on disk: every message paged before it, unless a listener made it read them back to
// drop each with an effect (which the broker's close does not).
func (r *coreRun) checkDropped(paged int, why Reason) {
	n := 0
	chunks, _, _ := r.c.ready.takeDropped()
	for _, c := range chunks {
		n += c.n
	}
	if r.observed && why != ReasonClosed {
		paged = 0
	}
	eq(r.t, paged, n, "messages in the chunks let go of")
	chunks, _, _ = r.c.ready.takeDropped()
	eq(r.t, 0, len(chunks), "chunks let go of, once taken")
}

// opEnd ends the queue, sometimes right after other operations whose effects (dead letters) the
// shell has not applied yet.
func (r *coreRun) opEnd() string {
	var s strings.Builder
	for range r.rng.IntN(4) {
		// Time stands still within a step: the stream check takes deliveries as made at its end.
		if i := r.pickOp(); !coreOps[i].sleeps {
			s.WriteString(r.step(i) + "; ")
		} else {
			s.WriteString(r.timer() + "; ")
		}
	}
	why := []Reason{ReasonQueueDeleted, ReasonClosed}[r.rng.IntN(2)]
	paged := r.c.ready.paged.n
	if why == ReasonClosed { // the messages on disk stay there: not read back for their drops
		r.unread = map[uint64]bool{}
		p := &r.c.ready.paged
		for rank := range p.levels {
			for i := range p.levels[rank].len() {
				c := p.levels[rank].slot(i)
				for seq := c.first; seq <= c.last; seq++ {
					if c.holds(seq) {
						r.unread[seq] = true
					}
				}
			}
		}
	}
	r.c.end(why)
	r.checkDropped(paged, why)
	r.end(why)
	return s.String() + "end (" + string(why) + ")"
}

// coreOps are the operations with their weights (opEnd, which ends a sequence, is apart).
var coreOps = []struct {
	weight int
	op     func(*coreRun) string
	sleeps bool // lets time pass
}{
	{30, (*coreRun).opPublish, false},
	{4, (*coreRun).opPublishDelayed, false},
	{24, (*coreRun).opDeliver, false},
	{3, (*coreRun).opSelect, false},
	{12, (*coreRun).opSettle, false},
	{3, (*coreRun).opSettleAgain, false},
	{3, (*coreRun).opNackWithDelay, false},
	{3, (*coreRun).opSettleUpTo, false},
	{3, (*coreRun).opStop, false},
	{2, (*coreRun).opGetsBack, false},
	{2, (*coreRun).opFeederBack, false},
	{10, (*coreRun).opSleep, true},
	{1, (*coreRun).opPurge, false},
	{1, (*coreRun).opBurst, false},
	{2, (*coreRun).opDeliverMany, false},
	{2, (*coreRun).opGiveBack, false},
}

// pickOp returns the index of a random operation, by weight.
func (r *coreRun) pickOp() int {
	total := 0
	for _, o := range coreOps {
		total += o.weight
	}
	n := r.rng.IntN(total)
	for i, o := range coreOps {
		if n -= o.weight; n < 0 {
			return i
		}
	}
	panic("unreachable")
}

// step runs an operation, coreOps[i] or, for i < 0, opEnd.
func (r *coreRun) step(i int) string {
	var s string
	if i < 0 {
		s = r.opEnd()
	} else {
		s = coreOps[i].op(r)
	}
	// A cancelled consumer that holds nothing more goes.
	for _, h := range slices.Clone(r.holders) {
		if h.stopped && len(h.out) == 0 {
			r.unhold(h)
		}
	}
	return s
}

// run runs a sequence of steps, checking after each, and ends the queue half of the time.
func (r *coreRun) run() {
	defer func() {
		if r.t.Failed() {
			r.t.Logf("sequence seed %d failed (rerun with WARREN_CORE_SEED=%d WARREN_CORE_SEQUENCES=1) after the steps:\n\t%s",
				r.seed, r.seed, strings.Join(r.trace, "\n\t"))
		}
	}()
	steps := 20 + r.rng.IntN(150)
	for n := range steps {
		i := r.pickOp()
		if n == steps-1 && r.rng.IntN(2) == 0 || r.rng.IntN(200) == 0 {
			i = -1
		}
		r.arrived = r.arrived[:0]
		reads := r.reads
		r.trace = append(r.trace, r.step(i))
		step := r.trace[len(r.trace)-1]
		switch {
		case r.reads > reads && strings.HasPrefix(step, "sleep"):
			r.cover["a chunk read for an expiry"]++
		case r.reads > reads:
			r.cover["a chunk read for a delivery, a drop or a purge"]++
		}
		if strings.Contains(step, "paged out") {
			r.cover["a message paged out"]++
		}
		r.check()
		if r.ended != "" {
			r.c.reset(btree.NewFreeListG[entry](32))
			require.Zero(r.t, r.c.ready.len())
			require.Zero(r.t, r.c.unacked)
			return
		}
	}
}

// ---------------------------------------------------------------------------------------------
// The checks.

// The checks below call testify only on a mismatch: its calls walk the stack (t.Helper), which
// would take most of the run time of the thousands of checks a sequence makes.

// eq fails the test unless want == got.
func eq[T comparable](t *testing.T, want, got T, msgAndArgs ...any) {
	if want != got {
		t.Helper()
		require.Equal(t, want, got, msgAndArgs...)
	}
}

// holds fails the test unless ok.
func holds(t *testing.T, ok bool, msgAndArgs ...any) {
	if !ok {
		t.Helper()
		require.Fail(t, "check failed", msgAndArgs...)
	}
}

// eqList fails the test unless want and got are equal, showing them with show.
func eqList[T comparable](t *testing.T, want, got []T, show func(T) string, msgAndArgs ...any) {
	if slices.Equal(want, got) {
		return
	}
	t.Helper()
	shown := func(xs []T) []string {
		s := make([]string, len(xs))
		for i, x := range xs {
			s[i] = show(x)
		}
		return s
	}
	require.Equal(t, shown(want), shown(got), msgAndArgs...)
	require.Fail(t, "alike but not the same (another envelope, delivery or holder)", msgAndArgs...)
}

// eqMsg fails the test unless the core's entry e is the model's message m.
func eqMsg(t *testing.T, m *coreMsg, e entry, msgAndArgs ...any) {
	if got := entryMsg(e); *got != *m {
		t.Helper()
		require.Equal(t, m.String(), got.String(), msgAndArgs...)
		require.Same(t, m.env, got.env, msgAndArgs...)
	}
}

// check compares the core with the model, checks the stream of effects, and drains them.
func (r *coreRun) check() {
	t, c := r.t, r.c
	got := takeEffects(t, c)
	want := r.want
	if !r.observed { // only dead letters are kept
		want = slices.DeleteFunc(want, func(f coreFx) bool { return f.kind != eventDeadLetter })
	}
	eqList(t, want, got, coreFx.String, "effects")
	r.want = r.want[:0]
	r.flush(got)
	if r.observed {
		r.follow(got)
		r.checkSpans()
	}

	eq(t, r.now, c.clock(), "clock")
	var ready []coreMsg
	var withDeadline int
	c.ready.ascend(0, func(e entry) bool {
		ready = append(ready, *entryMsg(e))
		if e.deadline != 0 {
			withDeadline++
		}
		return true
	})
	ready = append(ready, r.checkPaged()...)
	slices.SortStableFunc(ready, func(a, b coreMsg) int { return a.cmp(&b) })
	var wantReady []coreMsg
	for _, m := range r.ready {
		wantReady = append(wantReady, *m)
	}
	eqList(t, wantReady, ready, coreMsg.String, "ready, in delivery order")
	eq(t, len(r.ready), c.ready.len(), "ready length")
	eq(t, r.readyBytes(), c.ready.bytes, "ready bytes")
	eq(t, withDeadline, c.ready.expiries.Len(), "expiry index")
	oldest, ok := c.ready.oldestSeq()
	eq(t, len(r.ready) > 0, ok, "oldest")
	if ok {
		least := slices.MinFunc(r.ready, func(a, b *coreMsg) int { return cmp.Compare(a.seq, b.seq) })
		eq(t, least.seq, oldest, "oldest")
		at, ok := c.oldestAt()
		holds(t, ok, "the oldest ready message has a stamp")
		holds(t, at >= 1 && at <= r.entered[least.seq], "the oldest ready message, %d, entered at %d, but its stamp says %d",
			least.seq, r.entered[least.seq], at)
	}

	type dueMsg struct {
		due int64
		m   coreMsg
	}
	var delayed, wantDelayed []dueMsg
	if c.delayed != nil {
		c.delayed.Ascend(func(k delayedEntry) bool {
			delayed = append(delayed, dueMsg{k.due, *entryMsg(k.e)})
			return true
		})
	}
	for _, k := range r.delayed {
		wantDelayed = append(wantDelayed, dueMsg{k.due, *k.m})
	}
	eqList(t, wantDelayed, delayed, func(k dueMsg) string { return fmt.Sprintf("%d: %s", k.due, k.m) }, "delayed")
	next := r.nextDeadline()
	if r.early != 0 && (next == 0 || r.early < next) {
		next = r.early
	}
	eq(t, next, c.nextDeadline(), "next deadline")

	eq(t, len(r.holders), len(c.holders), "holders")
	total := 0
	var all []*Delivery
	for i, h := range append(slices.Clone(r.holders), r.gets) {
		if h != r.gets {
			eq(t, h.h, c.holders[i], "holder %d", i)
		}
		eqList(t, leasesOf(h.out), slices.Collect(h.h.outstanding()), leaseString, "outstanding deliveries of %q", h.h.tag)
		eq(t, len(h.out), h.h.live, "live of %q", h.h.tag)
		total += len(h.out)
		all = append(all, h.out...)
	}
	eq(t, total, c.unacked, "unacked")
	eqList(t, leasesOf(all), slices.Collect(c.outstanding()), leaseString, "the queue's outstanding deliveries")

	eq(t, r.n, c.n, "counters")
	eq(t, r.queuedDead, c.queuedDead, "dead letters recorded")
	// Stats' law: each message that entered ends in one of Acked, Expired (without a dead-letter
	// exchange), DeadLettered or Dropped, or is still in the queue.
	ended := c.n.acked + c.n.deadLettered + c.n.dropped - r.refused
	if !r.cfg.hasDLX {
		ended += c.n.expired
	}
	if r.ended == "" {
		ended += uint64(len(r.ready) + len(r.delayed) + total)
	}
	eq(t, c.n.enqueued, ended, "messages entered = messages ended + messages in the queue: %+v", c.n)

	// The memory budget's law: the queue's footprint is that of the messages it holds.
	var held int64
	if r.ended == "" {
		for _, m := range r.ready {
			held += m.env.footprint()
		}
		for _, k := range r.delayed {
			held += k.m.env.footprint()
		}
		for _, d := range all {
			held += r.of[d].env.footprint()
		}
	}
	eq(t, held, c.held, "footprint of what the queue holds")
}

// checkPaged checks the ready set's paged tails against what they describe on the model's disk,
// and returns the paged messages.
func (r *coreRun) checkPaged() []coreMsg {
	t, p := r.t, &r.c.ready.paged
	var paged []coreMsg
	var n int
	var bytes, extra int64
	least := noFloor
	withDeadline := 0
	r.early = 0
	for rank := range p.levels {
		tail := &p.levels[rank]
		prev := uint64(0)
		for i := range tail.len() {
			c := tail.slot(i)
			ents, _ := r.readChunk(uint8(rank), c)
			r.reads--
			eq(t, c.n, len(ents), "chunk %d of rank %d: live messages", i, rank)
			holds(t, c.n > 0, "chunk %d of rank %d is not empty", i, rank)
			holds(t, ents[0].seq == c.first && ents[len(ents)-1].seq <= c.last, "chunk %d of rank %d: bounds", i, rank)
			holds(t, c.first > prev, "the chunks of rank %d are in order", rank)
			prev = c.last
			var cb, ce, dl int64
			for _, e := range ents {
				paged = append(paged, *entryMsg(e))
				cb += int64(e.env.size)
				ce += e.env.overhead()
				if e.deadline != 0 && (dl == 0 || e.deadline < dl) {
					dl = e.deadline
				}
			}
			eq(t, cb, c.bytes, "chunk %d of rank %d: bytes", i, rank)
			eq(t, ce, c.extra, "chunk %d of rank %d: footprint beyond the bodies", i, rank)
			// A deadline may be an earlier bound, after an Immediate message was taken back (even
			// when no message left has one): reading the chunk at that time makes it exact.
			holds(t, c.deadline == dl || c.deadline != 0 && (dl == 0 || c.deadline < dl), "chunk %d of rank %d: deadline %d, its messages' %d", i, rank, c.deadline, dl)
			if c.deadline != dl && (r.early == 0 || c.deadline < r.early) {
				r.early = c.deadline
			}
			if c.deadline != 0 {
				withDeadline++
				holds(t, p.expiries.Has(expiry{c.deadline, c.firstKey(uint8(rank))}), "chunk %d of rank %d is in the expiry index", i, rank)
			}
			n += c.n
			bytes += c.bytes
			extra += c.extra
			least = min(least, c.firstKey(uint8(rank)))
		}
		if tail.len() > 0 {
			// Every key of the level's fresh ring is less than its tail's (a message that came
			// back, from a consumer or a delay, may be newer: it is in the tree or the run).
			l := r.c.ready.level(uint8(rank))
			for i := range l.len() {
				if e := l.at(i); e.env != nil {
					holds(t, e.seq < tail.slot(0).first, "%d, in the fresh ring, is newer than the tail of rank %d", e.seq, rank)
				}
			}
		}
	}
	eq(t, n, p.n, "paged messages")
	eq(t, bytes, p.bytes, "paged bytes")
	eq(t, extra, p.extra, "paged footprint beyond the bodies")
	eq(t, least, p.min, "the least paged key")
	if p.expiries != nil {
		eq(t, withDeadline, p.expiries.Len(), "the tails' expiry index")
	}
	return paged
}

// flush does what the shell's flush does with the dead letters of a step: it publishes them, and
// counts those that reached a queue (here, those of even sequence ids) and those lost.
func (r *coreRun) flush(fxs []coreFx) {
	var dead, lost uint64
	for _, f := range fxs {
		switch {
		case f.kind != eventDeadLetter:
		case f.seq%2 == 0:
			dead++
		default:
			lost++
		}
	}
	r.c.deadLettered(dead, lost)
	r.n.deadLettered += dead
	r.n.dropped += lost
}

// leasesOf returns the leases of ds, in order.
func leasesOf(ds []*Delivery) []*lease {
	ls := make([]*lease, len(ds))
	for i, d := range ds {
		ls[i] = d.lease
	}
	return ls
}

func leaseString(l *lease) string { return fmt.Sprintf("tag %d: %d", l.tag, l.e.seq) }

// follow checks a step's effects as a stream, on their own: each message's span in the queue is
// an Enqueued, then deliveries each followed by a return or a terminal effect, and ends with
// exactly one terminal effect; a message is delivered only while ready and not expired.
func (r *coreRun) follow(fxs []coreFx) {
	t := r.t
	for i, f := range fxs {
		state := r.span[f.seq]
		switch f.kind {
		case EventEnqueued:
			eq(t, 0, state, "effect %d, %s: enqueued while in the queue", i, f)
			r.span[f.seq] = spanReady
		case EventDelivered:
			eq(t, spanReady, state, "effect %d, %s: delivered while not ready", i, f)
			m := r.msgs[f.seq]
			holds(t, m.deadline == 0 || m.deadline > r.now || slices.Contains(r.arrived, f.seq),
				"effect %d, %s: delivered at %d after its deadline %d", i, f, r.now, m.deadline)
			r.span[f.seq] = spanOut
		case EventRequeued:
			eq(t, spanOut, state, "effect %d, %s: returned while not delivered", i, f)
			r.span[f.seq] = spanReady
		case eventDelayed:
			eq(t, spanReady, state, "effect %d, %s: delayed while not ready", i, f)
		case EventAcked:
			eq(t, spanOut, state, "effect %d, %s: acked while not delivered", i, f)
			delete(r.span, f.seq)
		case EventExpired:
			eq(t, spanReady, state, "effect %d, %s: expired while not ready", i, f)
			delete(r.span, f.seq)
		case eventDeadLetter, EventDropped:
			switch state {
			case 0:
				holds(t, f.seq == 0 || f.reason == ReasonNoConsumers || f.reason == ReasonQueueFull,
					"effect %d, %s: terminal without Enqueued, and not a refusal", i, f)
			case spanOut:
				holds(t, f.reason == ReasonRejected || f.reason == r.ended,
					"effect %d, %s: a delivered message leaves only rejected or with the queue", i, f)
			}
			delete(r.span, f.seq)
		default:
			t.Fatalf("effect %d, %s: unknown kind", i, f)
		}
	}
}

// checkSpans checks that the messages whose span is open are those the model holds: ready or
// delayed, or out with a consumer.
func (r *coreRun) checkSpans() {
	var in, out, wantIn, wantOut []uint64
	for seq, state := range r.span {
		if state == spanReady {
			in = append(in, seq)
		} else {
			out = append(out, seq)
		}
	}
	if r.ended == "" {
		for _, m := range r.ready {
			wantIn = append(wantIn, m.seq)
		}
		for _, k := range r.delayed {
			wantIn = append(wantIn, k.m.seq)
		}
		for _, h := range append(slices.Clone(r.holders), r.gets) {
			for _, d := range h.out {
				wantOut = append(wantOut, d.e.seq)
			}
		}
	}
	for seq := range r.unread { // ended by the broker's close unread: no effect says they left
		wantIn = append(wantIn, seq)
	}
	for _, s := range [][]uint64{in, out, wantIn, wantOut} {
		slices.Sort(s)
	}
	show := func(seq uint64) string { return strconv.FormatUint(seq, 10) }
	eqList(r.t, wantIn, in, show, "messages in the queue, by the effects")
	eqList(r.t, wantOut, out, show, "messages delivered and outstanding, by the effects")
}

// ---------------------------------------------------------------------------------------------
// The test.

// TestCoreAgainstModel runs random sequences against the model. WARREN_CORE_SEED sets the seed
// of the first sequence (sequence i uses seed+i), WARREN_CORE_SEQUENCES the number of sequences.
func TestCoreAgainstModel(t *testing.T) {
	seed := rand.Uint64() >> 1
	if s := os.Getenv("WARREN_CORE_SEED"); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "WARREN_CORE_SEED")
	}
	seqs := 1000
	if testing.Short() {
		seqs = 100
	}
	if s := os.Getenv("WARREN_CORE_SEQUENCES"); s != "" {
		var err error
		seqs, err = strconv.Atoi(s)
		require.NoError(t, err, "WARREN_CORE_SEQUENCES")
	}
	t.Logf("seeds %d..%d (%d sequences; WARREN_CORE_SEED=%d reproduces)", seed, seed+uint64(seqs)-1, seqs, seed)
	cover := map[string]int{}
	for i := range uint64(seqs) {
		s := seed + i
		synctest.Test(t, func(t *testing.T) { newCoreRun(t, s, cover).run() }) // stops the test if it fails
	}
	t.Logf("paging crossed: %v", cover)
	if seqs >= 100 { // half the sequences page: each way of crossing the disk must have come up
		for _, kind := range []string{"a message paged out", "a chunk read for an expiry", "a chunk read for a delivery, a drop or a purge",
			"a selector's take off disk", "an immediate message taken back off disk", "kept in memory behind the disk"} {
			assert.Positive(t, cover[kind], "%s, over %d sequences", kind, seqs)
		}
	}
}

// TestCoreTakeBackGets: takeBack walks the Gets' list while it releases, so release must leave
// the list alone (it once trimmed the Gets' list at once, and the walk ran off its end).
func TestCoreTakeBackGets(t *testing.T) {
	cfg := queueConfig{ttl: -1, maxLen: -1, maxBytes: -1, deliveryLimit: -1, overflow: DropHead}
	var heard atomic.Pointer[[]*listener]
	c := newCore(&cfg, btree.NewFreeListG[entry](32), &heard)
	x := &Exchange{name: "x"}
	for i := range 4 {
		e, _ := admitted(&c, testEnvelope(Message{Body: []byte{byte(i)}}, x), -1)
		c.ready.push(e)
	}
	var ds []*Delivery
	for range 4 {
		e, ok := c.take()
		require.True(t, ok)
		ds = append(ds, deliverTo(&c, &c.gets, e, false, 0))
	}
	back := c.takeBack(&c.gets, nil, ReasonOwnerEnded)
	require.Len(t, back, 4)
	for _, d := range ds {
		require.Equal(t, deliveryReturned, d.lease.state)
	}
	c.trim(&c.gets)
	c.restoreAll(back)
	require.Equal(t, 0, c.unacked)
	require.Equal(t, 0, c.gets.unacked.len())
	require.Equal(t, 4, c.ready.len())
	for _, d := range ds {
		require.NotEqual(t, d.gen, d.lease.gen, "let go of: its lease is for reuse, and names another delivery")
		require.ErrorIs(t, settleable(d), ErrAlreadySettled)
	}
}

// admitted admits env into c, as the shell's enqueue does, and returns its entry and the clock
// if admit read it.
func admitted(c *queueCore, env *envelope, ttl time.Duration) (entry, int64) {
	e := entry{env: env}
	now := c.admit(&e, ttl)
	return e, now
}

// testEnvelope returns an envelope of m published to x, as a broker from New makes it.
func testEnvelope(m Message, x *Exchange) *envelope {
	var b Broker
	return b.newEnvelope(&m, x, "")
}

// TestMessageHasProperties: each property but Persistent and Priority, alone, makes a message
// need more than the 48-byte envelope, which would otherwise lose it.
func TestMessageHasProperties(t *testing.T) {
	require.False(t, (&Message{Body: []byte("b"), Persistent: true, Priority: 9}).hasProperties())
	for i := range textProps {
		var m Message
		*m.text()[i] = "x"
		require.True(t, m.hasProperties(), "text property %d", i)
	}
	require.True(t, (&Message{Timestamp: time.Unix(1, 0)}).hasProperties(), "Timestamp")
	require.True(t, (&Message{Headers: Table{}}).needsMore(), "Headers")
}

// TestEnvelopeKeepsTheMessage: the 48-byte envelope gives back the message that was published,
// whole, whether it keeps it in its own fields (a body, Persistent, Priority) or in more; a
// delivery of a message with more shares the envelope's Message, one without gets its own copy,
// with the publisher's body (not copied).
func TestEnvelopeKeepsTheMessage(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) == 8 {
		require.Equal(t, uintptr(48), unsafe.Sizeof(envelope{}), "what a queued message costs beyond its entry and body")
		require.Equal(t, uintptr(344), unsafe.Sizeof(Delivery{}), "a slot of a consumer's channel (Prefetch says so)")
	}
	body := []byte("body")
	full := Message{Body: body, Headers: Table{"k": "v"}, ContentType: "text/plain", Persistent: true, Priority: 3,
		Timestamp: time.Unix(1, 0), AppID: "app"}
	for _, m := range []Message{
		{Body: body},
		{Body: body, Persistent: true, Priority: 9},
		{Body: nil},
		{Body: []byte{}},
		{Body: body, MessageID: "id"},
		full,
	} {
		env := testEnvelope(m, coreExchange)
		require.Equal(t, m.needsMore(), env.more != nil)
		require.Equal(t, m.needsMore(), env.ownMessage() != nil, "it keeps the Message only if it must")
		got := env.message()
		require.Equal(t, m, got)
		require.Equal(t, m.Body == nil, got.Body == nil, "nil stays apart from empty")
		if len(body) > 0 && len(m.Body) > 0 {
			require.Same(t, &m.Body[0], &got.Body[0], "the body is not copied")
		}
		c := newTestCore(nil)
		d := deliverTo(c, &holder{}, entry{env: env}, true, 0)
		require.Equal(t, m, d.Message)
		if len(body) > 0 && len(m.Body) > 0 {
			require.Same(t, &m.Body[0], &d.Message.Body[0], "the delivery's body is the publisher's")
		}
	}
}

// TestEnvelopeShapes: what an envelope keeps beside it depends on the message and the broker:
// the whole Message for headers or properties, or for a listener (one *Message for every event);
// a durable broker's log state for a persistent message, without the Message when the envelope's
// own fields are all of it.
func TestEnvelopeShapes(t *testing.T) {
	plain, props := Message{Body: []byte("b"), Persistent: true}, Message{Body: []byte("b"), Persistent: true, Type: "t"}
	mem := New()
	defer mem.Close()
	durable := openTest(t, wal.NewMemFS())
	defer durable.Close()
	for _, c := range []struct {
		b         *Broker
		m         Message
		more, msg bool
		what      string
	}{
		{mem, plain, false, false, "in memory, plain: the envelope alone"},
		{mem, props, true, true, "in memory, with a property"},
		{durable, plain, true, false, "durable and persistent, plain: the log state only"},
		{durable, props, true, true, "durable and persistent, with a property"},
		{durable, Message{Body: []byte("b")}, false, false, "durable, transient: the envelope alone"},
	} {
		env := c.b.newEnvelope(&c.m, c.b.defaultX, "k")
		require.Equal(t, c.more, env.more != nil, c.what)
		require.Equal(t, c.msg, env.ownMessage() != nil, c.what)
		require.Equal(t, c.m, env.message(), c.what)
	}
	stop := mem.Listen(func(Event) {})
	defer stop()
	env := mem.newEnvelope(&plain, mem.defaultX, "k")
	require.NotNil(t, env.ownMessage(), "with a listener: one *Message for its events")
	require.Same(t, env.messagePtr(), env.messagePtr())
}

// TestBodySizeLimit: a body longer than an envelope's 32-bit length is refused (Publish calls
// checkBodySize first; a test cannot make such a body under the race detector's checkptr).
func TestBodySizeLimit(t *testing.T) {
	require.NoError(t, checkBodySize(0))
	require.NoError(t, checkBodySize(math.MaxUint32>>1))
	if strconv.IntSize == 64 {
		big := uint64(math.MaxUint32) // not a constant: an int of 32 bits could not hold it
		require.NoError(t, checkBodySize(int(big)))
		require.ErrorIs(t, checkBodySize(int(big+1)), ErrInvalidArgument)
	}
}

package warren_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of the events (events.go): the span invariant — every message that enters a queue
// leaves it with exactly one terminal event — checked by a listener (the span checker,
// checkSpans in helpers_test.go) over randomized runs, the ordering and reentrancy promises of
// Listen, and one focused test per terminal path and entity event.

// ---------------------------------------------------------------------------------------------
// 1. The invariant over randomized runs.

// TestEventsBalanceRandomized runs random operations over a topology that has every way for a
// message to enter and leave a queue — default and fanout publishes, TTLs, dead-lettering that
// works, misses or cycles, a delivery limit, the three overflow policies, priorities, push and
// AutoAck consumers that settle, recover, cancel, time out or have their context end, Gets,
// Immediate publishes, delays, Purge, a queue deleted mid-run while publishers route to it, and
// Close — in virtual time, with the span checker listening. At the end every span is closed
// exactly once, every publish was evented once, and each queue's Stats agree with its events.
func TestEventsBalanceRandomized(t *testing.T) {
	seed := testSeed(t, "WARREN_EVENTS_SEED")
	seen := map[string]int{}
	for i := range uint64(4) {
		s := seed + i
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				for k, n := range runRandom(t, s, 5000) {
					seen[k] += n
				}
			})
		})
	}
	if t.Failed() {
		return
	}
	// The runs went through every path (a topology that stopped producing some would make the
	// invariant hold vacuously).
	for _, path := range []string{
		"acked", "expired", "enqueued(returned)",
		"requeued(nack)", "requeued(recover)", "requeued(cancel)", "requeued(owner-ended)", "requeued(ack-timeout)",
		"dead-lettered(rejected)", "dead-lettered(expired)", "dead-lettered(maxlen)", "dead-lettered(delivery_limit)",
		"dropped(rejected)", "dropped(maxlen)", "dropped(purged)", "dropped(queue-deleted)", "dropped(closed)",
		"dropped(dlx-not-found)", "dropped(dlx-no-route)", "dropped(dead-letter-cycle)",
		"lone dropped(queue-full)", "lone dropped(no-consumers)", "lone dead-lettered(maxlen)",
	} {
		assert.Positive(t, seen[path], "no %s in %d runs", path, 4)
	}
}

type runQueueSpec struct {
	name string
	opts []warren.QueueOption
	dlx  bool // has a dead-letter exchange
	fan  bool // bound to the fanout exchange
}

type runConsumer struct {
	q       *warren.Queue
	c       *warren.Consumer
	cancel  context.CancelFunc
	autoAck bool
	held    []warren.Delivery // received, not settled by the test
}

type runGet struct {
	q      *warren.Queue
	d      warren.Delivery
	cancel context.CancelFunc // nil: a context that never ends
}

type randomRun struct {
	t       *testing.T
	rng     *rand.Rand
	b       *warren.Broker
	chk     *spanChecker
	specs   []runQueueSpec
	queues  map[string]*warren.Queue   // the incarnation that exists
	incarn  map[string][]*warren.Queue // every incarnation, in order
	nacks   map[*warren.Queue]int      // settlements that succeeded, per incarnation
	rejects map[*warren.Queue]int
	cons    []*runConsumer
	gets    []*runGet
	cancels []context.CancelFunc

	nextID     atomic.Int64
	published  atomic.Int64 // publishes past argument validation
	victimGone bool
	ops        map[string]int
}

// runRandom runs steps random operations, checks, and returns how often each kind of message
// event (with its reason) was seen.
func runRandom(t *testing.T, seed uint64, steps int) map[string]int {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+rng.IntN(hi-lo+1)) * time.Millisecond }
	r := &randomRun{
		t: t, rng: rng, b: warren.New(), chk: newSpanChecker("rejdlx"),
		queues: map[string]*warren.Queue{}, incarn: map[string][]*warren.Queue{},
		nacks: map[*warren.Queue]int{}, rejects: map[*warren.Queue]int{}, ops: map[string]int{},
	}
	stop := r.b.Listen(r.chk.handle)
	defer stop()
	defer r.b.Close()

	r.specs = []runQueueSpec{
		{name: "plain", fan: true},
		{name: "ttl", opts: []warren.QueueOption{warren.MessageTTL(ms(1000, 4000))}, fan: true},
		{name: "ttl-dlx", opts: []warren.QueueOption{warren.MessageTTL(ms(1000, 4000)), warren.DeadLetter("dlx", "dead")}, dlx: true, fan: true},
		{name: "limit", opts: []warren.QueueOption{warren.DeliveryLimit(rng.IntN(3)), warren.DeadLetter("dlx", "dead")}, dlx: true},
		{name: "drophead", opts: []warren.QueueOption{warren.MaxLength(1 + rng.IntN(3)), warren.DeadLetter("", "dlq")}, dlx: true},
		{name: "rejpub", opts: []warren.QueueOption{warren.MaxLength(2), warren.Overflow(warren.RejectPublish)}, fan: true},
		{name: "rejdlx", opts: []warren.QueueOption{warren.MaxLength(2), warren.Overflow(warren.RejectPublishDLX), warren.DeadLetter("dlx", "dead")}, dlx: true},
		{name: "prio", opts: []warren.QueueOption{warren.MaxPriority(5), warren.MaxLength(4)}},
		{name: "nodlx", opts: []warren.QueueOption{warren.DeadLetter("missing", "")}, dlx: true},
		{name: "noroute", opts: []warren.QueueOption{warren.DeadLetter("dlx", "nowhere")}, dlx: true},
		{name: "cycle", opts: []warren.QueueOption{warren.MessageTTL(ms(1000, 3000)), warren.DeadLetter("", "cycle")}, dlx: true},
		{name: "dlq", opts: []warren.QueueOption{warren.MessageTTL(ms(4000, 9000))}},
		{name: "victim", opts: []warren.QueueOption{warren.DeadLetter("dlx", "dead")}, dlx: true, fan: true},
	}
	_, err := r.b.DeclareExchange("fan", warren.ExchangeFanout)
	require.NoError(t, err)
	_, err = r.b.DeclareExchange("dlx", warren.ExchangeDirect)
	require.NoError(t, err)
	for _, s := range r.specs {
		r.declare(s)
	}
	require.NoError(t, r.b.Bind("dlq", "dlx", "dead", nil))

	for step := range steps {
		switch x := rng.IntN(100); {
		case x < 30:
			r.do("publish", r.publish)
		case x < 36:
			r.do("consume", r.consume)
		case x < 52:
			r.do("receive", r.receive)
		case x < 68:
			r.do("settle", r.settle)
		case x < 72:
			r.do("get", r.get)
		case x < 74:
			r.do("end get", r.endGet)
		case x < 76:
			r.do("recover", r.recover)
		case x < 78:
			r.do("cancel", r.cancelConsumer)
		case x < 81:
			r.do("end consumer", r.endConsumer)
		case x < 82:
			r.do("purge", r.purge)
		case x < 94:
			r.do("sleep", func() {
				time.Sleep(ms(50, 2500))
				synctest.Wait()
			})
		default:
			r.do("wait", synctest.Wait)
		}
		// The victim is deleted at every quarter of the run, and declared again halfway to the
		// next.
		switch phase := step * 8 / steps; {
		case phase%2 == 1 && !r.victimGone:
			r.do("delete victim", r.deleteVictim)
		case phase%2 == 0 && r.victimGone:
			r.victimGone = false
			r.declare(r.specs[len(r.specs)-1])
		}
		if t.Failed() {
			return nil
		}
	}
	synctest.Wait() // nothing runs while the broker closes: see spanChecker.handle
	require.NoError(t, r.b.Close())
	for _, cancel := range r.cancels {
		cancel()
	}
	synctest.Wait()
	t.Logf("ops %v; %d events", r.ops, r.chk.events)
	t.Logf("message events %v", r.chk.seen)

	if !assert.Empty(t, r.chk.errors(), "events that break the span invariant") {
		return nil
	}
	require.Empty(t, r.chk.openSpans(), "messages that entered a queue and never left it")
	r.chk.mu.Lock()
	defer r.chk.mu.Unlock()
	assert.Equal(t, int(r.published.Load()), r.chk.published, "EventPublished: once per publish")
	assert.Equal(t, int(r.b.Stats().Unroutable), r.chk.unroutable, "EventUnroutable and BrokerStats.Unroutable")
	assert.Empty(t, r.chk.cur, "queues without a deletion event after Close")
	for _, s := range r.specs {
		qs, ended := r.incarn[s.name], r.chk.ended[s.name]
		require.Len(t, ended, len(qs), "queue %q: one deletion event per incarnation", s.name)
		for i, q := range qs {
			compareStats(t, fmt.Sprintf("%s#%d", s.name, i), q.Stats(), ended[i], s.dlx, r.nacks[q], r.rejects[q])
		}
	}
	return r.chk.seen
}

// compareStats checks a queue's counters against its events.
func compareStats(t *testing.T, name string, st warren.QueueStats, n *eventCounts, dlx bool, nacks, rejects int) {
	t.Helper()
	k := n.kinds
	assert.Equal(t, k[warren.EventEnqueued], int(st.Enqueued), "%s: Stats.Enqueued vs EventEnqueued", name)
	assert.Equal(t, k[warren.EventDelivered], int(st.Delivered), "%s: Stats.Delivered vs EventDelivered", name)
	assert.Equal(t, k[warren.EventAcked], int(st.Acked), "%s: Stats.Acked vs EventAcked", name)
	assert.Equal(t, k[warren.EventDeadLettered], int(st.DeadLettered), "%s: Stats.DeadLettered vs EventDeadLettered", name)
	assert.Equal(t, k[warren.EventDropped], int(st.Dropped), "%s: Stats.Dropped vs EventDropped", name)
	if dlx {
		assert.Zero(t, k[warren.EventExpired], "%s: EventExpired with a dead-letter exchange", name)
		assert.GreaterOrEqual(t, int(st.Expired), n.expiredCopies, "%s: Stats.Expired vs expired dead letters", name)
	} else {
		assert.Equal(t, k[warren.EventExpired], int(st.Expired), "%s: Stats.Expired vs EventExpired", name)
	}
	assert.LessOrEqual(t, int(st.Redelivered), int(st.Delivered), "%s: Redelivered", name)
	assert.Equal(t, nacks, int(st.Nacked), "%s: Stats.Nacked vs nacks that succeeded", name)
	assert.Equal(t, rejects, int(st.Rejected), "%s: Stats.Rejected vs rejects that succeeded", name)
	assert.GreaterOrEqual(t, int(st.Nacked), n.requeued[warren.ReasonNack], "%s: Stats.Nacked vs Requeued(nack)", name)
	// Every message that entered left exactly once, and so did every one refused on arrival.
	left := st.Acked + st.DeadLettered + st.Dropped
	if !dlx {
		left += st.Expired
	}
	assert.Equal(t, int(st.Enqueued)+n.lone, int(left), "%s: Acked+DeadLettered+Dropped(+Expired) vs Enqueued + refusals", name)
	assert.Zero(t, st.Ready+st.Unacked+st.Delayed, "%s: messages left after Close", name)
}

func (r *randomRun) do(op string, f func()) {
	r.ops[op]++
	f()
}

func (r *randomRun) declare(s runQueueSpec) {
	q, err := r.b.DeclareQueue(s.name, s.opts...)
	require.NoError(r.t, err)
	r.queues[s.name] = q
	r.incarn[s.name] = append(r.incarn[s.name], q)
	if s.fan {
		require.NoError(r.t, r.b.Bind(s.name, "fan", "", nil))
	}
}

// alive reports whether q is a queue of the broker's: not deleted. (Not with Broker.Queue,
// which counts as a use of the queue and postpones its expiry.)
func (r *randomRun) alive(q *warren.Queue) bool {
	for x := range r.b.Queues() {
		if x == q {
			return true
		}
	}
	return false
}

// anyQueue returns a random queue: the current incarnation, or now and then a deleted one.
func (r *randomRun) anyQueue() *warren.Queue {
	name := r.specs[r.rng.IntN(len(r.specs))].name
	qs := r.incarn[name]
	return qs[r.rng.IntN(len(qs))]
}

func (r *randomRun) ctx() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancels = append(r.cancels, cancel)
	return ctx, cancel
}

// countPublish counts a publish that got past argument validation (and so was evented).
func (r *randomRun) countPublish(err error) {
	switch {
	case err == nil, errors.Is(err, warren.ErrQueueFull), errors.Is(err, warren.ErrNoConsumers),
		errors.Is(err, warren.ErrUnroutable):
		r.published.Add(1)
	default:
		r.t.Errorf("publish: %v", err)
	}
}

func (r *randomRun) message() warren.Message {
	id := r.nextID.Add(1)
	m := warren.Message{Body: fmt.Appendf(nil, "m%d", id), Priority: uint8(r.rng.IntN(8))}
	if r.rng.IntN(5) > 0 {
		m.Headers = warren.Table{"id": id} // else the default exchange's fast path
	}
	if r.rng.IntN(7) == 0 {
		m.Expiration = strconv.Itoa(200 + r.rng.IntN(3000))
	}
	return m
}

func (r *randomRun) publish() {
	m := r.message()
	var opts []warren.PublishOption
	switch r.rng.IntN(12) {
	case 0, 1:
		opts = append(opts, warren.Immediate())
	case 2:
		opts = append(opts, warren.DeliverAfter(time.Duration(1+r.rng.IntN(3000))*time.Millisecond))
	case 3:
		opts = append(opts, warren.Mandatory())
	}
	exchange, key := "", r.specs[r.rng.IntN(len(r.specs))].name
	switch r.rng.IntN(20) {
	case 0, 1, 2, 3, 4:
		exchange, key = "fan", ""
	case 5:
		key = "ghost"
	}
	r.countPublish(r.b.Publish(context.Background(), exchange, key, m, opts...))
}

func (r *randomRun) consume() {
	if len(r.cons) >= 8 {
		return
	}
	q := r.anyQueue()
	ctx, cancel := r.ctx()
	autoAck := r.rng.IntN(10) < 3
	var opts []warren.ConsumeOption
	if autoAck {
		opts = append(opts, warren.AutoAck(), warren.Prefetch(1+r.rng.IntN(3)))
	} else {
		opts = append(opts, warren.Prefetch(1+r.rng.IntN(4)))
		if r.rng.IntN(4) == 0 {
			opts = append(opts, warren.AckTimeout(time.Duration(2+r.rng.IntN(5))*time.Second))
		}
	}
	if r.rng.IntN(5) == 0 {
		opts = append(opts, warren.ConsumerPriority(r.rng.IntN(3)))
	}
	c, err := q.Consume(ctx, opts...)
	if err != nil {
		require.ErrorIs(r.t, err, warren.ErrNotFound, "consume") // a deleted incarnation
		return
	}
	r.cons = append(r.cons, &runConsumer{q: q, c: c, cancel: cancel, autoAck: autoAck})
}

func (r *randomRun) receive() {
	if len(r.cons) == 0 {
		return
	}
	c := r.cons[r.rng.IntN(len(r.cons))]
	for range 1 + r.rng.IntN(3) {
		select {
		case d, ok := <-c.c.Deliveries():
			if !ok {
				return
			}
			if !c.autoAck {
				c.held = append(c.held, d)
			}
		default:
			return
		}
	}
}

// settleErr accepts the errors a settlement may meet in this run: its owner ended and it came
// back, or its queue was deleted.
func (r *randomRun) settleErr(what string, err error) {
	if err != nil && !errors.Is(err, warren.ErrAlreadySettled) && !errors.Is(err, warren.ErrNotFound) {
		r.t.Errorf("%s: %v", what, err)
	}
}

func (r *randomRun) settle() {
	var held []warren.Delivery
	for _, c := range r.cons {
		held = append(held, c.held...)
	}
	if len(r.gets) > 0 && r.rng.IntN(4) == 0 {
		i := r.rng.IntN(len(r.gets))
		g := r.gets[i]
		r.gets = slices.Delete(r.gets, i, i+1)
		r.settleOne(g.q, g.d)
		if g.cancel != nil {
			g.cancel()
		}
		return
	}
	if len(held) == 0 {
		return
	}
	var c *runConsumer
	d := held[r.rng.IntN(len(held))]
	for _, x := range r.cons {
		if slices.ContainsFunc(x.held, func(y warren.Delivery) bool { return y.ConsumerTag == d.ConsumerTag && y.DeliveryTag == d.DeliveryTag }) {
			c = x
		}
	}
	if r.rng.IntN(6) == 0 {
		r.settleUpTo(c, d)
		return
	}
	c.held = slices.DeleteFunc(c.held, func(x warren.Delivery) bool { return x.DeliveryTag == d.DeliveryTag })
	r.settleOne(c.q, d)
}

func (r *randomRun) settleOne(q *warren.Queue, d warren.Delivery) {
	var err error
	alive := r.alive(q) // a deleted queue's settlements succeed and count nothing
	switch x := r.rng.IntN(20); {
	case x < 8:
		err = d.Ack()
	case x < 13:
		if err = d.Nack(); err == nil && alive {
			r.nacks[q]++
		}
	case x < 16:
		if err = d.Reject(); err == nil && alive {
			r.rejects[q]++
		}
	default:
		if err = d.NackWithDelay(time.Duration(1+r.rng.IntN(2000)) * time.Millisecond); err == nil && alive {
			r.nacks[q]++
		}
	}
	r.settleErr("settle", err)
}

// settleUpTo settles every delivery c holds up to d's tag; if it succeeds, the deliveries the
// test held with those tags are exactly the ones it settled.
func (r *randomRun) settleUpTo(c *runConsumer, d warren.Delivery) {
	var covered []warren.Delivery
	for _, x := range c.held {
		if x.DeliveryTag <= d.DeliveryTag {
			covered = append(covered, x)
		}
	}
	var err error
	how := r.rng.IntN(3)
	if !r.alive(c.q) {
		how += 3 // a deleted queue's settlements succeed and count nothing
	}
	switch how % 3 {
	case 0:
		err = c.c.AckUpTo(d.DeliveryTag)
	case 1:
		err = c.c.NackUpTo(d.DeliveryTag)
	default:
		err = c.c.RejectUpTo(d.DeliveryTag)
	}
	switch {
	case err == nil:
		c.held = slices.DeleteFunc(c.held, func(x warren.Delivery) bool {
			return slices.ContainsFunc(covered, func(y warren.Delivery) bool { return y.DeliveryTag == x.DeliveryTag })
		})
		switch how {
		case 1:
			r.nacks[c.q] += len(covered)
		case 2:
			r.rejects[c.q] += len(covered)
		}
	case errors.Is(err, warren.ErrUnknownDelivery):
		c.held = nil // its context ended or its ack timeout passed: everything went back
	default:
		r.settleErr("settle up to", err)
		c.held = nil
	}
}

func (r *randomRun) get() {
	q := r.anyQueue()
	ctx, cancel := context.Background(), context.CancelFunc(nil)
	if r.rng.IntN(2) == 0 {
		ctx, cancel = r.ctx()
	}
	autoAck := r.rng.IntN(10) < 3
	var opts []warren.GetOption
	if autoAck {
		opts = append(opts, warren.AutoAck())
	}
	d, err := q.Get(ctx, opts...)
	switch {
	case errors.Is(err, warren.ErrEmpty), errors.Is(err, warren.ErrNotFound):
	case err != nil:
		r.t.Errorf("get: %v", err)
	case !autoAck:
		r.gets = append(r.gets, &runGet{q: q, d: d, cancel: cancel})
	}
}

// endGet ends the context of a Get delivery: it comes back.
func (r *randomRun) endGet() {
	for i, g := range r.gets {
		if g.cancel != nil {
			g.cancel()
			r.gets = slices.Delete(r.gets, i, i+1)
			return
		}
	}
}

func (r *randomRun) recover() {
	if len(r.cons) == 0 {
		return
	}
	c := r.cons[r.rng.IntN(len(r.cons))]
	r.settleErr("recover", c.c.Recover())
	c.held = nil // back in the queue: settling them now fails
}

func (r *randomRun) cancelConsumer() {
	if len(r.cons) == 0 {
		return
	}
	c := r.cons[r.rng.IntN(len(r.cons))]
	require.NoError(r.t, c.c.Cancel()) // received deliveries stay settle-able
}

func (r *randomRun) endConsumer() {
	if len(r.cons) == 0 {
		return
	}
	i := r.rng.IntN(len(r.cons))
	r.cons[i].cancel()
	r.cons = slices.Delete(r.cons, i, i+1)
}

func (r *randomRun) purge() {
	_, err := r.anyQueue().Purge()
	if err != nil {
		require.ErrorIs(r.t, err, warren.ErrNotFound, "purge")
	}
}

// deleteVictim deletes a queue bound to the fanout exchange while publishers route to it, so
// that some of their messages find it gone on arrival.
func (r *randomRun) deleteVictim() {
	var wg sync.WaitGroup
	msgs := make([]warren.Message, 40)
	for i := range msgs {
		msgs[i] = r.message()
	}
	for p := range 2 {
		wg.Go(func() {
			for _, m := range msgs[p*20 : p*20+20] {
				r.countPublish(r.b.Publish(context.Background(), "fan", "", m))
			}
		})
	}
	deleteQueue(r.t, r.b, "victim")
	wg.Wait()
	r.victimGone = true
}

// ---------------------------------------------------------------------------------------------
// 2. Listeners that call back into the broker.

// TestListenerPublishesBackNoDeadlock: a listener that publishes — into the queue whose events it
// is being told of, into others — and reads Len, Stats and the broker's Stats on every event,
// under real concurrency (publishers, consumers that ack or reject into a dead-letter queue,
// an AutoAck consumer), deadlocks nothing; the events of each queue reach it one at a time and
// in order (the span checker sees Enqueued before Delivered before the terminal of every
// message); and every message is accounted for.
func TestListenerPublishesBackNoDeadlock(t *testing.T) {
	const (
		publishers = 4
		roots      = 250 // per publisher
		maxGen     = 3   // each message published into "echo" below this generation begets one more
		echoTotal  = publishers * roots * (maxGen + 1)
	)
	b := warren.New() // closed by the goroutine below: if it deadlocked, so would Close
	echo, err := b.DeclareQueue("echo", warren.DeadLetter("", "echo-dlq"))
	require.NoError(t, err)
	dlq, err := b.DeclareQueue("echo-dlq")
	require.NoError(t, err)
	side, err := b.DeclareQueue("side")
	require.NoError(t, err)
	queues := map[string]*warren.Queue{"echo": echo, "echo-dlq": dlq, "side": side}

	chk := newSpanChecker()
	var (
		nextID, published          atomic.Int64
		settled, sideGot, rejected atomic.Int64 // echo messages acked or rejected; side messages received
		dlqAcked                   atomic.Int64
		inside                     sync.Map // queue name → *atomic.Int32: listener calls in progress for it
		calls                      atomic.Int64
		failures                   = make(chan string, 100)
	)
	fail := func(format string, args ...any) {
		select {
		case failures <- fmt.Sprintf(format, args...):
		default:
		}
	}
	pub := func(queue string, gen int64) {
		id := nextID.Add(1)
		err := b.Publish(context.Background(), "", queue, warren.Message{
			Body: fmt.Appendf(nil, "m%d", id), Headers: warren.Table{"id": id, "gen": gen}})
		if err != nil && !errors.Is(err, warren.ErrClosed) {
			fail("publish from a listener: %v", err)
		}
		if err == nil {
			published.Add(1)
		}
	}
	stop := b.Listen(func(e warren.Event) {
		if e.Queue != "" && e.Kind != warren.EventHandlerPanicked {
			n, _ := inside.LoadOrStore(e.Queue, new(atomic.Int32))
			if n.(*atomic.Int32).Add(1) != 1 {
				fail("%s: the listener was called for queue %q while a call for it was in progress", describeEvent(e), e.Queue)
			}
			defer n.(*atomic.Int32).Add(-1)
		}
		chk.handle(e)
		q := queues[e.Queue]
		if q == nil {
			return
		}
		_ = q.Len()
		_ = q.Stats()
		if calls.Add(1)%64 == 0 {
			_ = b.Stats()
			if _, err := b.DeclareQueue("side"); err != nil && !errors.Is(err, warren.ErrClosed) {
				fail("declare from a listener: %v", err)
			}
		}
		if e.Message == nil {
			return
		}
		gen, _ := e.Message.Headers["gen"].(int64)
		switch {
		case e.Queue == "echo" && e.Kind == warren.EventEnqueued && gen < maxGen:
			pub("echo", gen+1) // into the queue whose events are being emitted
		case e.Queue == "echo" && (e.Kind == warren.EventAcked || e.Kind == warren.EventDeadLettered):
			pub("side", maxGen)
		}
	})
	defer stop()

	// Everything that calls the broker runs on this goroutine and those it starts; the test's
	// goroutine only watches, so that a deadlock anywhere shows as no progress, with every
	// goroutine's stack.
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		defer func() {
			if err := b.Close(); err != nil {
				fail("close: %v", err)
			}
		}()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		echoDone, sideDone := make(chan struct{}), make(chan struct{})
		var echoOnce, sideOnce sync.Once
		for range 3 {
			c, err := echo.Consume(ctx, warren.Prefetch(4))
			if err != nil {
				fail("consume: %v", err)
				return
			}
			wg.Go(func() {
				for d := range c.Deliveries() {
					id, _ := d.Message.Headers["id"].(int64)
					var err error
					if id%5 == 0 {
						err = d.Reject()
						rejected.Add(1)
					} else {
						err = d.Ack()
					}
					if err != nil {
						fail("settle: %v", err)
					}
					if settled.Add(1) == echoTotal {
						echoOnce.Do(func() { close(echoDone) })
					}
				}
			})
		}
		sc, err := side.Consume(ctx, warren.AutoAck())
		if err != nil {
			fail("consume: %v", err)
			return
		}
		wg.Go(func() {
			for range sc.Deliveries() {
				if sideGot.Add(1) == echoTotal {
					sideOnce.Do(func() { close(sideDone) })
				}
			}
		})
		dc, err := dlq.Consume(ctx, warren.Prefetch(8))
		if err != nil {
			fail("consume: %v", err)
			return
		}
		dlqProgress := make(chan struct{}, 1)
		wg.Go(func() {
			for d := range dc.Deliveries() {
				if err := d.Ack(); err != nil {
					fail("ack in the dead-letter queue: %v", err)
				}
				dlqAcked.Add(1)
				select {
				case dlqProgress <- struct{}{}:
				default:
				}
			}
		})
		var pubs sync.WaitGroup
		for range publishers {
			pubs.Go(func() {
				for range roots {
					pub("echo", 0)
				}
			})
		}
		pubs.Wait()
		<-echoDone
		<-sideDone
		for dlqAcked.Load() != rejected.Load() { // every rejected message is acked there
			<-dlqProgress
		}
		cancel()
		wg.Wait()
	}()
	select {
	case <-finished:
	case <-time.After(30 * time.Second): // a watchdog, not a sleep: it passes in well under a second
		buf := make([]byte, 1<<20)
		t.Fatalf("no progress in 30s (deadlock?): echo settled %d of %d, side %d of %d, dead letters acked %d of %d\n%s",
			settled.Load(), echoTotal, sideGot.Load(), echoTotal, dlqAcked.Load(), rejected.Load(),
			buf[:runtime.Stack(buf, true)])
	}
	close(failures)
	for f := range failures {
		t.Error(f)
	}

	require.Empty(t, chk.errors(), "events out of order or unbalanced")
	require.Empty(t, chk.openSpans(), "messages that entered a queue and never left it")
	chk.mu.Lock()
	defer chk.mu.Unlock()
	assert.Equal(t, int(published.Load()), chk.published, "EventPublished per publish")
	assert.Equal(t, int64(echoTotal+echoTotal), published.Load(), "echo messages and one side message each")
	for name, q := range queues {
		ended := chk.ended[name]
		require.Len(t, ended, 1, name)
		st := q.Stats()
		n := ended[0]
		assert.Equal(t, n.kinds[warren.EventEnqueued], int(st.Enqueued), "%s: Enqueued", name)
		assert.Equal(t, n.kinds[warren.EventAcked], int(st.Acked), "%s: Acked", name)
		assert.Equal(t, n.kinds[warren.EventDeadLettered], int(st.DeadLettered), "%s: DeadLettered", name)
	}
	assert.Equal(t, echoTotal, chk.ended["echo"][0].kinds[warren.EventEnqueued])
	assert.Equal(t, int(rejected.Load()), chk.ended["echo"][0].kinds[warren.EventDeadLettered])
	assert.Equal(t, int(rejected.Load()), chk.ended["echo-dlq"][0].kinds[warren.EventAcked])
}

// TestListenerQueueCreatedBeforeItsEvents: a queue's creation is one of its events, and comes
// first for every listener — also when an earlier listener reacts to it by publishing into the
// queue (which listeners may do): the second listener must not hear of a message entering a
// queue before it hears of the queue.
func TestListenerQueueCreatedBeforeItsEvents(t *testing.T) {
	b := newBroker(t)
	b.Listen(func(e warren.Event) {
		if e.Kind == warren.EventQueueCreated {
			if err := b.Publish(context.Background(), "", e.Queue, msg("welcome")); err != nil {
				t.Errorf("publish from a listener: %v", err)
			}
		}
	})
	r := recordEvents(t, b)
	declare(t, b, "x")
	var got []string
	for _, e := range r.where(func(e warren.Event) bool { return e.Queue == "x" }) {
		got = append(got, eventName(e))
	}
	assert.Equal(t, []string{"queue-created", "enqueued"}, got, "the events of queue x, as the second listener heard them")
}

// ---------------------------------------------------------------------------------------------
// 3. Focused tests: one per terminal path and per entity event.

// publishAll publishes a message with each of bodies to queue, in order.
func publishAll(t *testing.T, b *warren.Broker, queue string, bodies ...string) {
	t.Helper()
	for _, body := range bodies {
		publish(t, b, queue, body)
	}
}

// getOne gets a delivery from q, failing the test if it cannot.
func getOne(t *testing.T, q *warren.Queue, opts ...warren.GetOption) warren.Delivery {
	t.Helper()
	d, err := q.Get(t.Context(), opts...)
	require.NoError(t, err)
	return d
}

// TestEventAck: publish, deliver to a consumer, ack; with the fields each event carries, the
// publish evented before the message enters, and the counters.
func TestEventAck(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	checkSpans(t, b)
	q := declare(t, b, "q")
	c, err := q.Consume(t.Context(), warren.ConsumerTag("c1"), warren.Prefetch(1))
	require.NoError(t, err)
	publish(t, b, "q", "a")
	d := receive(t, c, 1)[0]
	require.Equal(t, "enqueued delivered", r.trace("q", "a"))
	require.NoError(t, d.Ack())
	require.Equal(t, "enqueued delivered acked", r.trace("q", "a"))

	enq := r.one(t, "q", "a", warren.EventEnqueued)
	assert.Equal(t, "", enq.Exchange)
	assert.Equal(t, "q", enq.RoutingKey)
	assert.Empty(t, enq.Reason)
	assert.Equal(t, d.Message, *enq.Message, "events carry the queue's message")
	assert.Equal(t, "c1", r.one(t, "q", "a", warren.EventDelivered).Consumer)
	assert.Equal(t, "c1", r.one(t, "q", "a", warren.EventAcked).Consumer)

	all := r.all()
	pubAt := slices.IndexFunc(all, func(e warren.Event) bool { return e.Kind == warren.EventPublished })
	enqAt := slices.IndexFunc(all, func(e warren.Event) bool { return e.Kind == warren.EventEnqueued })
	require.GreaterOrEqual(t, pubAt, 0)
	assert.Less(t, pubAt, enqAt, "published before it reaches a queue")
	assert.Equal(t, "q", all[pubAt].RoutingKey)
	assert.Equal(t, d.Message, *all[pubAt].Message)
	assert.Len(t, r.ofKind(warren.EventPublished), 1, "once per publish")

	st := q.Stats()
	assert.Equal(t, [3]uint64{1, 1, 1}, [3]uint64{st.Enqueued, st.Delivered, st.Acked})
}

// TestEventAutoAck: an AutoAck consumer's and an AutoAck Get's deliveries are acked as they are
// delivered.
func TestEventAutoAck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		r := recordEvents(t, b)
		checkSpans(t, b)
		q := declare(t, b, "q")
		c, err := q.Consume(t.Context(), warren.AutoAck(), warren.ConsumerTag("auto"))
		require.NoError(t, err)
		publish(t, b, "q", "a")
		synctest.Wait()
		require.Equal(t, "enqueued delivered acked", r.trace("q", "a"))
		assert.Equal(t, "auto", r.one(t, "q", "a", warren.EventAcked).Consumer)
		d := receive(t, c, 1)[0]
		require.ErrorIs(t, d.Ack(), warren.ErrUnknownDelivery)
		require.NoError(t, c.Cancel())

		publish(t, b, "q", "b")
		d = getOne(t, q, warren.AutoAck())
		require.Equal(t, "b", string(d.Message.Body))
		require.Equal(t, "enqueued delivered acked", r.trace("q", "b"))
		assert.Empty(t, r.one(t, "q", "b", warren.EventDelivered).Consumer, "a Get")
		st := q.Stats()
		assert.Equal(t, [3]uint64{2, 2, 2}, [3]uint64{st.Enqueued, st.Delivered, st.Acked})
	})
}

// TestEventNackRequeued: a nack brings the message back (Requeued, nack) and it is delivered
// again and acked, all in one span.
func TestEventNackRequeued(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	checkSpans(t, b)
	q := declare(t, b, "q")
	c, err := q.Consume(t.Context(), warren.ConsumerTag("c1"), warren.Prefetch(1))
	require.NoError(t, err)
	publish(t, b, "q", "a")
	require.NoError(t, receive(t, c, 1)[0].Nack())
	require.Equal(t, "enqueued delivered requeued(nack) delivered", r.trace("q", "a"), "back, and at once to the consumer with credit again")
	assert.Equal(t, "c1", r.one(t, "q", "a", warren.EventRequeued).Consumer)
	d := receive(t, c, 1)[0]
	require.True(t, d.Redelivered)
	require.NoError(t, d.Ack())
	require.Equal(t, "enqueued delivered requeued(nack) delivered acked", r.trace("q", "a"))
	st := q.Stats()
	assert.Equal(t, [5]uint64{1, 2, 1, 1, 1}, [5]uint64{st.Enqueued, st.Delivered, st.Redelivered, st.Nacked, st.Acked})
}

// TestEventRejectWithoutDLX: a rejected message without a dead-letter exchange is dropped.
func TestEventRejectWithoutDLX(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	checkSpans(t, b)
	q := declare(t, b, "q")
	publish(t, b, "q", "a")
	require.NoError(t, getOne(t, q).Reject())
	require.Equal(t, "enqueued delivered dropped(rejected)", r.trace("q", "a"))
	st := q.Stats()
	assert.Equal(t, [3]uint64{1, 1, 0}, [3]uint64{st.Rejected, st.Dropped, st.DeadLettered})
}

// TestEventRejectWithDLX: a rejected message is dead-lettered: DeadLettered in the source with
// the copy, Enqueued with the death reason in the target.
func TestEventRejectWithDLX(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	checkSpans(t, b)
	_, err := b.DeclareExchange("dlx", warren.ExchangeDirect)
	require.NoError(t, err)
	src := declare(t, b, "src", warren.DeadLetter("dlx", "dead"))
	dlq := declare(t, b, "dlq")
	require.NoError(t, b.Bind("dlq", "dlx", "dead", nil))
	publish(t, b, "src", "a")
	d := getOne(t, src)
	require.NoError(t, d.Reject())

	require.Equal(t, "enqueued delivered dead-lettered(rejected)", r.trace("src", "a"))
	dl := r.one(t, "src", "a", warren.EventDeadLettered)
	assert.Equal(t, "dlx", dl.Exchange)
	assert.NotEqual(t, d.Message, *dl.Message, "the dead-lettered copy")
	require.NotEmpty(t, dl.Message.Deaths())
	assert.Equal(t, "src", dl.Message.Deaths()[0].Queue)
	assert.Equal(t, warren.ReasonRejected, dl.Message.Deaths()[0].Reason)
	assert.Empty(t, d.Message.Deaths(), "the original is untouched")

	require.Equal(t, "enqueued(rejected)", r.trace("dlq", "a"))
	in := r.one(t, "dlq", "a", warren.EventEnqueued)
	assert.Equal(t, "dlx", in.Exchange)
	assert.Equal(t, "dead", in.RoutingKey)
	assert.Equal(t, [2]uint64{1, 1}, [2]uint64{src.Stats().Rejected, src.Stats().DeadLettered})
	assert.Equal(t, uint64(1), dlq.Stats().Enqueued)
}

// TestEventRejectIntoItself: a message rejected into its own queue (a rejection is never a
// cycle) leaves with DeadLettered and comes back as a copy with a span of its own.
func TestEventRejectIntoItself(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	checkSpans(t, b)
	q := declare(t, b, "q", warren.DeadLetter("", "q"))
	publish(t, b, "q", "a")
	require.NoError(t, getOne(t, q).Reject())
	require.NoError(t, getOne(t, q).Ack())
	evs := r.about("q", "a")
	require.Len(t, evs, 6)
	orig, cp := evs[0].Message, evs[len(evs)-1].Message
	require.NotSame(t, orig, cp)
	var first, second []string
	for _, e := range evs {
		switch {
		case e.Message == orig:
			first = append(first, eventName(e))
		case e.Kind == warren.EventDeadLettered:
			first = append(first, eventName(e)) // the outcome of the original, with a copy
		default:
			second = append(second, eventName(e))
		}
	}
	assert.Equal(t, []string{"enqueued", "delivered", "dead-lettered(rejected)"}, first)
	assert.Equal(t, []string{"enqueued(rejected)", "delivered", "acked"}, second)
}

// TestEventExpired: TTL without a dead-letter exchange: Expired.
func TestEventExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		r := recordEvents(t, b)
		checkSpans(t, b)
		q := declare(t, b, "q", warren.MessageTTL(time.Second))
		publish(t, b, "q", "a")
		time.Sleep(2 * time.Second)
		synctest.Wait()
		require.Equal(t, "enqueued expired", r.trace("q", "a"))
		st := q.Stats()
		assert.Equal(t, [3]uint64{1, 0, 0}, [3]uint64{st.Expired, st.Dropped, st.DeadLettered})
		assert.Zero(t, st.Ready)
	})
}

// TestEventExpiredWhileOut: a message whose TTL passed while it was delivered comes back when
// nacked (Requeued) and cannot stay: Expired follows at once.
func TestEventExpiredWhileOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		r := recordEvents(t, b)
		checkSpans(t, b)
		q := declare(t, b, "q", warren.MessageTTL(time.Second))
		publish(t, b, "q", "a")
		d := getOne(t, q)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		require.Equal(t, "enqueued delivered", r.trace("q", "a"), "nothing happens to a delivered message")
		require.NoError(t, d.Nack())
		require.Equal(t, "enqueued delivered requeued(nack) expired", r.trace("q", "a"))
		assert.Zero(t, q.Len())
		assert.Equal(t, uint64(1), q.Stats().Expired)
	})
}

// TestEventExpiredDeadLettered: TTL with a dead-letter exchange: DeadLettered(expired), never
// Expired.
func TestEventExpiredDeadLettered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		r := recordEvents(t, b)
		checkSpans(t, b)
		q := declare(t, b, "q", warren.MessageTTL(time.Second), warren.DeadLetter("", "dlq"))
		dlq := declare(t, b, "dlq")
		publish(t, b, "q", "a")
		time.Sleep(2 * time.Second)
		synctest.Wait()
		require.Equal(t, "enqueued dead-lettered(expired)", r.trace("q", "a"))
		require.Equal(t, "enqueued(expired)", r.trace("dlq", "a"))
		st := q.Stats()
		assert.Equal(t, [2]uint64{1, 1}, [2]uint64{st.Expired, st.DeadLettered})
		assert.Equal(t, 1, dlq.Len())
	})
}

// TestEventDeadLetterDropped: the three ways a dead letter goes nowhere — its exchange missing,
// routing nowhere, cycling — each a Dropped with the copy.
func TestEventDeadLetterDropped(t *testing.T) {
	reject := func(t *testing.T, b *warren.Broker, q *warren.Queue) {
		publish(t, b, q.Name(), "a")
		require.NoError(t, getOne(t, q).Reject())
	}
	cases := []struct {
		name, want string
		opts       []warren.QueueOption
		leave      func(t *testing.T, b *warren.Broker, q *warren.Queue)
	}{
		{"dlx-not-found", "enqueued delivered dropped(dlx-not-found)",
			[]warren.QueueOption{warren.DeadLetter("missing", "")}, reject},
		{"dlx-no-route", "enqueued delivered dropped(dlx-no-route)",
			[]warren.QueueOption{warren.DeadLetter("amq.direct", "nowhere")}, reject},
		{"dead-letter-cycle", "enqueued dropped(dead-letter-cycle)",
			[]warren.QueueOption{warren.MessageTTL(time.Second), warren.DeadLetter("", "q")},
			func(t *testing.T, b *warren.Broker, q *warren.Queue) {
				publish(t, b, "q", "a")
				time.Sleep(2 * time.Second)
				synctest.Wait()
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				r := recordEvents(t, b)
				checkSpans(t, b)
				q := declare(t, b, "q", tc.opts...)
				tc.leave(t, b, q)
				require.Equal(t, tc.want, r.trace("q", "a"))
				dropped := r.one(t, "q", "a", warren.EventDropped)
				require.Len(t, dropped.Message.Deaths(), 1, "the copy, with its death recorded")
				assert.Equal(t, "q", dropped.Message.Deaths()[0].Queue)
				st := q.Stats()
				assert.Equal(t, [2]uint64{1, 0}, [2]uint64{st.Dropped, st.DeadLettered})
				assert.Zero(t, q.Len())
			})
		})
	}
}

// TestEventDeliveryLimit: past the delivery limit a nacked message comes back (Requeued) and
// cannot stay: it is dropped (or dead-lettered) at once.
func TestEventDeliveryLimit(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	checkSpans(t, b)
	q := declare(t, b, "q", warren.DeliveryLimit(0))
	publish(t, b, "q", "a")
	require.NoError(t, getOne(t, q).Nack())
	require.Equal(t, "enqueued delivered requeued(nack) dropped(delivery_limit)", r.trace("q", "a"))

	q2 := declare(t, b, "q2", warren.DeliveryLimit(0), warren.DeadLetter("", "dlq"))
	declare(t, b, "dlq")
	publish(t, b, "q2", "b")
	require.NoError(t, getOne(t, q2).Nack())
	require.Equal(t, "enqueued delivered requeued(nack) dead-lettered(delivery_limit)", r.trace("q2", "b"))
	require.Equal(t, "enqueued(delivery_limit)", r.trace("dlq", "b"))
	assert.Equal(t, [2]uint64{1, 1}, [2]uint64{q.Stats().Nacked, q.Stats().Dropped})
}

// TestEventDropHead: a drop-head queue over its length drops (or dead-letters) its head with
// reason maxlen.
func TestEventDropHead(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	checkSpans(t, b)
	q := declare(t, b, "q", warren.MaxLength(1))
	publishAll(t, b, "q", "a", "b")
	require.Equal(t, "enqueued dropped(maxlen)", r.trace("q", "a"))
	require.Equal(t, "enqueued", r.trace("q", "b"))
	assert.Equal(t, [2]uint64{2, 1}, [2]uint64{q.Stats().Enqueued, q.Stats().Dropped})

	q2 := declare(t, b, "q2", warren.MaxLength(1), warren.DeadLetter("", "dlq"))
	declare(t, b, "dlq")
	publishAll(t, b, "q2", "c", "d")
	require.Equal(t, "enqueued dead-lettered(maxlen)", r.trace("q2", "c"))
	require.Equal(t, "enqueued(maxlen)", r.trace("dlq", "c"))
	assert.Equal(t, uint64(1), q2.Stats().DeadLettered)
}

// TestEventRejectPublish: a full reject-publish queue refuses the message on arrival: Dropped
// queue-full with no Enqueued; reject-publish-dlx dead-letters it, also with no Enqueued.
func TestEventRejectPublish(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	checkSpans(t, b, "q2")
	q := declare(t, b, "q", warren.MaxLength(1), warren.Overflow(warren.RejectPublish))
	publish(t, b, "q", "a")
	require.ErrorIs(t, b.Publish(t.Context(), "", "q", msg("b")), warren.ErrQueueFull)
	require.Equal(t, "dropped(queue-full)", r.trace("q", "b"))
	assert.Len(t, r.where(func(e warren.Event) bool {
		return e.Kind == warren.EventPublished && string(e.Message.Body) == "b"
	}), 1, "a refused publish is a publish")
	assert.Equal(t, [2]uint64{1, 1}, [2]uint64{q.Stats().Enqueued, q.Stats().Dropped})

	q2 := declare(t, b, "q2", warren.MaxLength(1), warren.Overflow(warren.RejectPublishDLX), warren.DeadLetter("", "dlq"))
	declare(t, b, "dlq")
	publish(t, b, "q2", "c")
	require.ErrorIs(t, b.Publish(t.Context(), "", "q2", msg("d")), warren.ErrQueueFull)
	require.Equal(t, "dead-lettered(maxlen)", r.trace("q2", "d"))
	require.Equal(t, "enqueued(maxlen)", r.trace("dlq", "d"))
	assert.Equal(t, [2]uint64{1, 1}, [2]uint64{q2.Stats().Enqueued, q2.Stats().DeadLettered})

	// Without a dead-letter exchange, reject-publish-dlx refuses as reject-publish does.
	q3 := declare(t, b, "q3", warren.MaxLength(1), warren.Overflow(warren.RejectPublishDLX))
	publish(t, b, "q3", "e")
	require.ErrorIs(t, b.Publish(t.Context(), "", "q3", msg("f")), warren.ErrQueueFull)
	require.Equal(t, "dropped(queue-full)", r.trace("q3", "f"))
	assert.Equal(t, [3]uint64{1, 1, 0}, [3]uint64{q3.Stats().Enqueued, q3.Stats().Dropped, q3.Stats().DeadLettered})
}

// TestEventImmediate: an Immediate publish no consumer takes is Dropped no-consumers with no
// Enqueued; one a consumer takes enters and is delivered.
func TestEventImmediate(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	checkSpans(t, b)
	q := declare(t, b, "q")
	require.ErrorIs(t, b.Publish(t.Context(), "", "q", msg("a"), warren.Immediate()), warren.ErrNoConsumers)
	require.Equal(t, "dropped(no-consumers)", r.trace("q", "a"))
	assert.Equal(t, [2]uint64{0, 1}, [2]uint64{q.Stats().Enqueued, q.Stats().Dropped})

	_, err := q.Consume(t.Context(), warren.Prefetch(1))
	require.NoError(t, err)
	require.NoError(t, b.Publish(t.Context(), "", "q", msg("b"), warren.Immediate()))
	require.Equal(t, "enqueued delivered", r.trace("q", "b"))

	// Through a fanout exchange: the queue with a consumer takes it, the other refuses it.
	_, err = b.DeclareExchange("fan", warren.ExchangeFanout)
	require.NoError(t, err)
	declare(t, b, "idle")
	q3 := declare(t, b, "q3")
	_, err = q3.Consume(t.Context(), warren.Prefetch(1))
	require.NoError(t, err)
	require.NoError(t, b.Bind("idle", "fan", "", nil))
	require.NoError(t, b.Bind("q3", "fan", "", nil))
	require.NoError(t, b.Publish(t.Context(), "fan", "", msg("c"), warren.Immediate()))
	require.Equal(t, "dropped(no-consumers)", r.trace("idle", "c"))
	require.Equal(t, "enqueued delivered", r.trace("q3", "c"))
}

// TestEventPurge: every ready message purged is Dropped purged; a delivery outstanding is not
// touched.
func TestEventPurge(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	checkSpans(t, b)
	q := declare(t, b, "q")
	publishAll(t, b, "q", "out", "a", "b", "c")
	d := getOne(t, q)
	n, err := q.Purge()
	require.NoError(t, err)
	require.Equal(t, 3, n)
	for _, body := range []string{"a", "b", "c"} {
		require.Equal(t, "enqueued dropped(purged)", r.trace("q", body), body)
	}
	require.Equal(t, "enqueued delivered", r.trace("q", "out"))
	require.NoError(t, d.Ack())
	assert.Equal(t, [2]uint64{3, 1}, [2]uint64{q.Stats().Dropped, q.Stats().Acked})
}

// TestEventDeleteQueue: deleting a queue drops every message it holds — ready, delayed, nacked
// with a delay, delivered and received, buffered unread, held by a Get — ends its consumer, and
// deletes its bindings, then the queue itself, last of its events.
func TestEventDeleteQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		r := recordEvents(t, b)
		checkSpans(t, b)
		_, err := b.DeclareExchange("x", warren.ExchangeDirect)
		require.NoError(t, err)
		q := declare(t, b, "q")
		require.NoError(t, b.Bind("q", "x", "k", nil))
		c, err := q.Consume(t.Context(), warren.ConsumerTag("c"), warren.Prefetch(2))
		require.NoError(t, err)
		publishAll(t, b, "q", "received", "buffered")
		receive(t, c, 1)
		publishAll(t, b, "q", "got", "retried", "ready")
		getOne(t, q)
		require.NoError(t, getOne(t, q).NackWithDelay(time.Hour))
		require.NoError(t, b.Publish(t.Context(), "x", "k", msg("delayed"), warren.DeliverAfter(time.Hour)))
		assert.Equal(t, 2, q.Stats().Delayed)

		deleteQueue(t, b, "q")
		synctest.Wait()
		for body, want := range map[string]string{
			"received": "enqueued delivered dropped(queue-deleted)",
			"buffered": "enqueued delivered dropped(queue-deleted)",
			"got":      "enqueued delivered dropped(queue-deleted)",
			"retried":  "enqueued delivered requeued(nack) dropped(queue-deleted)",
			"ready":    "enqueued dropped(queue-deleted)",
			"delayed":  "enqueued dropped(queue-deleted)",
		} {
			assert.Equal(t, want, r.trace("q", body), body)
		}
		cd := r.ofKind(warren.EventConsumerDeleted)
		require.Len(t, cd, 1)
		assert.Equal(t, "c", cd[0].Consumer)
		assert.ErrorIs(t, cd[0].Err, warren.ErrQueueDeleted)
		assert.ErrorIs(t, c.Err(), warren.ErrQueueDeleted)
		qd := r.ofKind(warren.EventQueueDeleted)
		require.Len(t, qd, 1)
		assert.Equal(t, warren.ReasonDeleted, qd[0].Reason)
		assert.ErrorIs(t, qd[0].Err, warren.ErrQueueDeleted)
		assert.Contains(t, r.topology(), `binding-deleted x->q key "k"`)
		queueEvs := r.where(func(e warren.Event) bool { return e.Queue == "q" && e.Kind != warren.EventBindingDeleted })
		assert.Equal(t, warren.EventQueueDeleted, queueEvs[len(queueEvs)-1].Kind, "the queue's last event")
		assert.Equal(t, uint64(6), q.Stats().Dropped)
	})
}

// TestEventDeleteQueueGetForever: a Get delivery whose context never ends (context.Background,
// whose Done is nil) is as much in the queue as any other: deleting the queue, or closing the
// broker, drops it with an event.
func TestEventDeleteQueueGetForever(t *testing.T) {
	for _, end := range []string{"delete", "close"} {
		t.Run(end, func(t *testing.T) {
			b := newBroker(t)
			r := recordEvents(t, b)
			chk := checkSpans(t, b)
			q := declare(t, b, "q")
			publishAll(t, b, "q", "forever", "owned")
			_, err := q.Get(context.Background())
			require.NoError(t, err)
			getOne(t, q)
			want := "dropped(queue-deleted)"
			if end == "delete" {
				deleteQueue(t, b, "q")
			} else {
				require.NoError(t, b.Close())
				want = "dropped(closed)"
			}
			assert.Equal(t, "enqueued delivered "+want, r.trace("q", "owned"))
			assert.Equal(t, "enqueued delivered "+want, r.trace("q", "forever"))
			require.NoError(t, b.Close())
			assert.Empty(t, chk.openSpans())
			assert.Equal(t, uint64(2), q.Stats().Dropped)
		})
	}
}

// TestEventClose: closing the broker drops what every queue holds (Reason closed), ends the
// consumers with ErrClosed and deletes the queues with Reason closed.
func TestEventClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		r := recordEvents(t, b)
		chk := checkSpans(t, b)
		q := declare(t, b, "q")
		_, err := q.Consume(t.Context(), warren.ConsumerTag("c"), warren.Prefetch(1))
		require.NoError(t, err)
		publishAll(t, b, "q", "buffered", "got", "ready")
		getOne(t, q)
		require.NoError(t, b.Publish(t.Context(), "", "q", msg("delayed"), warren.DeliverAfter(time.Minute)))
		require.NoError(t, b.Close())
		synctest.Wait()
		for _, body := range []string{"buffered", "got"} {
			assert.Equal(t, "enqueued delivered dropped(closed)", r.trace("q", body), body)
		}
		for _, body := range []string{"ready", "delayed"} {
			assert.Equal(t, "enqueued dropped(closed)", r.trace("q", body), body)
		}
		cd := r.ofKind(warren.EventConsumerDeleted)
		require.Len(t, cd, 1)
		assert.ErrorIs(t, cd[0].Err, warren.ErrClosed)
		qd := r.ofKind(warren.EventQueueDeleted)
		require.Len(t, qd, 1)
		assert.Equal(t, warren.ReasonClosed, qd[0].Reason)
		assert.ErrorIs(t, qd[0].Err, warren.ErrClosed)
		assert.Empty(t, chk.openSpans())
		assert.Equal(t, uint64(4), q.Stats().Dropped)
	})
}

// TestEventConsumerContextEnded: when a consumer's context ends, what it held comes back
// (Requeued, owner-ended), received or buffered; so does a Get's delivery when its context ends.
func TestEventConsumerContextEnded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		r := recordEvents(t, b)
		checkSpans(t, b)
		q := declare(t, b, "q")
		ctx, cancel := context.WithCancel(t.Context())
		c, err := q.Consume(ctx, warren.ConsumerTag("c"), warren.Prefetch(2))
		require.NoError(t, err)
		publishAll(t, b, "q", "received", "buffered")
		d := receive(t, c, 1)[0]
		cancel()
		synctest.Wait()
		for _, body := range []string{"received", "buffered"} {
			assert.Equal(t, "enqueued delivered requeued(owner-ended)", r.trace("q", body), body)
		}
		cd := r.ofKind(warren.EventConsumerDeleted)
		require.Len(t, cd, 1)
		assert.ErrorIs(t, cd[0].Err, context.Canceled)
		require.ErrorIs(t, d.Ack(), warren.ErrAlreadySettled)

		gctx, gcancel := context.WithCancel(t.Context())
		g, err := q.Get(gctx)
		require.NoError(t, err)
		require.Equal(t, "received", string(g.Message.Body))
		gcancel()
		synctest.Wait()
		assert.Equal(t, "enqueued delivered requeued(owner-ended) delivered requeued(owner-ended)", r.trace("q", "received"))
		assert.Equal(t, 2, q.Len())
	})
}

// TestEventCancelRequeuesBuffered: Cancel puts back what its consumer had buffered and never
// received (Requeued, cancel), unchanged; what it received stays out and can still be acked.
func TestEventCancelRequeuesBuffered(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	checkSpans(t, b)
	q := declare(t, b, "q")
	c, err := q.Consume(t.Context(), warren.ConsumerTag("c"), warren.Prefetch(2))
	require.NoError(t, err)
	publishAll(t, b, "q", "received", "buffered")
	d := receive(t, c, 1)[0]
	require.NoError(t, c.Cancel())
	require.Equal(t, "enqueued delivered requeued(cancel)", r.trace("q", "buffered"))
	require.Equal(t, "enqueued delivered", r.trace("q", "received"))
	cd := r.ofKind(warren.EventConsumerDeleted)
	require.Len(t, cd, 1)
	assert.ErrorIs(t, cd[0].Err, warren.ErrCancelled)
	require.NoError(t, d.Ack())
	require.Equal(t, "enqueued delivered acked", r.trace("q", "received"))
	g := getOne(t, q)
	assert.False(t, g.Redelivered, "back unchanged")
	require.NoError(t, g.Ack())
}

// TestEventRecover: Recover puts back what the consumer holds (Requeued, recover), and it is
// dispatched again.
func TestEventRecover(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	checkSpans(t, b)
	q := declare(t, b, "q")
	c, err := q.Consume(t.Context(), warren.Prefetch(1))
	require.NoError(t, err)
	publish(t, b, "q", "a")
	receive(t, c, 1)
	require.NoError(t, c.Recover())
	require.Equal(t, "enqueued delivered requeued(recover) delivered", r.trace("q", "a"))
	require.NoError(t, receive(t, c, 1)[0].Ack())
}

// TestEventAckTimeout: an ack timeout ends the consumer (ConsumerDeleted with an error wrapping
// ErrAckTimeout) and puts back what it held (Requeued, ack-timeout).
func TestEventAckTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		r := recordEvents(t, b)
		checkSpans(t, b)
		q := declare(t, b, "q")
		c, err := q.Consume(t.Context(), warren.ConsumerTag("slow"), warren.Prefetch(2), warren.AckTimeout(time.Second))
		require.NoError(t, err)
		publishAll(t, b, "q", "received", "buffered")
		d := receive(t, c, 1)[0]
		time.Sleep(2 * time.Second)
		synctest.Wait()
		for _, body := range []string{"received", "buffered"} {
			assert.Equal(t, "enqueued delivered requeued(ack-timeout)", r.trace("q", body), body)
		}
		cd := r.ofKind(warren.EventConsumerDeleted)
		require.Len(t, cd, 1)
		assert.Equal(t, "slow", cd[0].Consumer)
		assert.ErrorIs(t, cd[0].Err, warren.ErrAckTimeout)
		require.ErrorIs(t, d.Ack(), warren.ErrAlreadySettled)
		assert.Equal(t, 2, q.Len())
	})
}

// TestEventNackWithDelay: NackWithDelay is a Requeued(nack); the message is delivered again
// when the delay has passed.
func TestEventNackWithDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		r := recordEvents(t, b)
		checkSpans(t, b)
		q := declare(t, b, "q")
		publish(t, b, "q", "a")
		require.NoError(t, getOne(t, q).NackWithDelay(time.Minute))
		require.Equal(t, "enqueued delivered requeued(nack)", r.trace("q", "a"))
		time.Sleep(time.Minute)
		synctest.Wait()
		require.NoError(t, getOne(t, q).Ack())
		require.Equal(t, "enqueued delivered requeued(nack) delivered acked", r.trace("q", "a"))
	})
}

// TestEventAutoAckReturnedUnread: an AutoAck consumer's deliveries are acked as delivered; those
// it had not handed to the application when it stopped come back with a new span, Enqueued
// Reason returned, at their places — unless the queue itself ended.
func TestEventAutoAckReturnedUnread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		r := recordEvents(t, b)
		checkSpans(t, b)
		q := declare(t, b, "q")
		c, err := q.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(3))
		require.NoError(t, err)
		publishAll(t, b, "q", "a", "b", "c", "d")
		synctest.Wait() // a and b buffered, c held by the feeder, d ready
		for _, body := range []string{"a", "b", "c"} {
			require.Equal(t, "enqueued delivered acked", r.trace("q", body), body)
		}
		require.Equal(t, "enqueued", r.trace("q", "d"))
		require.NoError(t, c.Cancel())
		for _, body := range []string{"a", "b", "c"} {
			require.Equal(t, "enqueued delivered acked enqueued(returned)", r.trace("q", body), body)
		}
		assert.Equal(t, "a b c d", drain(t, q))
		st := q.Stats()
		assert.Equal(t, [2]uint64{7, 7}, [2]uint64{st.Enqueued, st.Acked})

		// When the queue is deleted instead, nothing goes back: their spans ended when they
		// were acked, and no new one starts.
		q2 := declare(t, b, "q2")
		_, err = q2.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(3))
		require.NoError(t, err)
		publishAll(t, b, "q2", "a", "b", "c", "d")
		synctest.Wait()
		deleteQueue(t, b, "q2")
		synctest.Wait()
		for _, body := range []string{"a", "b", "c"} {
			require.Equal(t, "enqueued delivered acked", r.trace("q2", body), body)
		}
		require.Equal(t, "enqueued dropped(queue-deleted)", r.trace("q2", "d"))
		st = q2.Stats()
		assert.Equal(t, [3]uint64{4, 3, 1}, [3]uint64{st.Enqueued, st.Acked, st.Dropped})
	})
}

// handOff starts, on q, an idle AutoAck consumer to which dispatch hands the next message
// published (a second consumer priority makes dispatch take the general path; a prefetch of 1
// leaves the channel no room, so the message is handed to the consumer's goroutine). With a
// single P, what the caller does right after that publish runs before the goroutine takes it.
func handOff(t *testing.T, b *warren.Broker, q *warren.Queue) *warren.Consumer {
	t.Helper()
	c, err := q.Consume(t.Context(), warren.AutoAck(), warren.Prefetch(1), warren.ConsumerPriority(1))
	require.NoError(t, err)
	_, err = q.Consume(t.Context(), warren.Prefetch(1)) // a second priority: the general dispatch
	require.NoError(t, err)
	// Let the AutoAck consumer's goroutine park, idle.
	for range 100 {
		runtime.Gosched()
	}
	return c
}

// handOffRounds runs rounds in which dispatch hands a message to an idle AutoAck consumer
// and end (which stops the consumer or deletes the queue) runs before the consumer's goroutine
// takes it; it checks the events and counters of each round with check, and that the hand-off
// was still pending in at least one round (so the test tests what it says).
func handOffRounds(t *testing.T, end func(b *warren.Broker, c *warren.Consumer), check func(st warren.QueueStats) bool) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	pending := 0
	for i := range 20 {
		b := warren.New()
		chk := newSpanChecker()
		r := recordEvents(t, b)
		b.Listen(chk.handle)
		q, err := b.DeclareQueue("q")
		require.NoError(t, err)
		c := handOff(t, b, q)
		require.NoError(t, b.Publish(t.Context(), "", "q", msg("a")))
		if r.trace("q", "a") == "enqueued" {
			pending++
		}
		end(b, c)
		st := q.Stats()
		require.NoError(t, b.Close())
		require.Empty(t, chk.errors(), "round %d", i)
		require.Empty(t, chk.openSpans(), "round %d", i)
		require.True(t, check(st), "round %d: %+v", i, st)
	}
	require.Positive(t, pending, "no round had the hand-off pending")
}

// TestEventHandOffCancelledBeforeTaken: an AutoAck consumer stopped after dispatch handed it a
// message and before its goroutine took it. The message was never delivered, so it goes back
// within its span: no second Enqueued (and Stats.Enqueued counts it once).
func TestEventHandOffCancelledBeforeTaken(t *testing.T) {
	handOffRounds(t, func(b *warren.Broker, c *warren.Consumer) { require.NoError(t, c.Cancel()) },
		func(st warren.QueueStats) bool { return st.Enqueued == 1 })
}

// TestEventHandOffDeletedBeforeTaken: a queue deleted after dispatch handed a message to an
// AutoAck consumer and before its goroutine took it: the message is evented as dropped like
// everything else the queue held.
func TestEventHandOffDeletedBeforeTaken(t *testing.T) {
	handOffRounds(t, func(b *warren.Broker, c *warren.Consumer) { deleteQueue(t, b, "q") },
		func(st warren.QueueStats) bool { return st.Enqueued == st.Acked+st.Dropped })
}

// TestEventRequeuedNamesConsumer: EventRequeued lists Consumer among its fields (events.go):
// every Requeued of a consumer's delivery names the consumer, whatever brought it back.
func TestEventRequeuedNamesConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		r := recordEvents(t, b)
		q := declare(t, b, "q")
		ctx, cancel := context.WithCancel(t.Context())
		c, err := q.Consume(ctx, warren.ConsumerTag("c"), warren.Prefetch(2))
		require.NoError(t, err)
		publishAll(t, b, "q", "a", "b")
		ds := receive(t, c, 2)
		require.NoError(t, c.NackUpTo(ds[1].DeliveryTag)) // back, and to c again
		receive(t, c, 2)
		require.NoError(t, c.Recover())
		receive(t, c, 1)
		cancel() // "a" received, "b" buffered
		synctest.Wait()
		requeued := r.ofKind(warren.EventRequeued)
		require.Len(t, requeued, 6)
		for _, e := range requeued {
			assert.Equal(t, "c", e.Consumer, "%s", describeEvent(e))
		}
	})
}

// TestEventTopology: entity events — exchanges, queues, bindings (to queues and exchanges),
// consumers — created and deleted, and nothing for a redeclaration or a binding made twice.
func TestEventTopology(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	for range 2 {
		_, err := b.DeclareExchange("x", warren.ExchangeFanout)
		require.NoError(t, err)
		declare(t, b, "q")
		require.NoError(t, b.Bind("q", "x", "k", nil))
	}
	_, err := b.DeclareExchange("y", warren.ExchangeDirect)
	require.NoError(t, err)
	require.NoError(t, b.BindExchange("y", "x", "e", nil))
	require.NoError(t, b.Unbind("q", "x", "k", nil))
	require.NoError(t, b.Unbind("q", "x", "k", nil)) // no such binding: nothing
	q, err := b.Queue("q")
	require.NoError(t, err)
	c, err := q.Consume(t.Context(), warren.ConsumerTag("c"))
	require.NoError(t, err)
	require.NoError(t, c.Cancel())
	require.NoError(t, b.DeleteExchange("x"))
	deleteQueue(t, b, "q")
	assert.Equal(t, []string{
		"exchange-created x",
		"queue-created q",
		`binding-created x->q key "k"`,
		"exchange-created y",
		`binding-created x->exchange y key "e"`,
		`binding-deleted x->q key "k"`,
		"consumer-created q/c",
		"consumer-deleted q/c",
		`binding-deleted x->exchange y key "e"`,
		"exchange-deleted(deleted) x",
		"queue-deleted(deleted) q",
	}, r.topology())
	ed := r.ofKind(warren.EventExchangeDeleted)
	require.Len(t, ed, 1)
	assert.Equal(t, warren.ReasonDeleted, ed[0].Reason)
}

// TestEventAutoDeleteCascade: deleting a queue removes its binding, which auto-deletes the
// exchange it was the last binding of, which removes that exchange's binding as a destination,
// which auto-deletes the exchange above; an auto-delete queue losing its last consumer is
// deleted with Reason auto-delete.
func TestEventAutoDeleteCascade(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	for _, x := range []string{"ad1", "ad2"} {
		_, err := b.DeclareExchange(x, warren.ExchangeFanout, warren.AutoDelete())
		require.NoError(t, err)
	}
	declare(t, b, "leaf")
	require.NoError(t, b.Bind("leaf", "ad2", "", nil))
	require.NoError(t, b.BindExchange("ad2", "ad1", "", nil))
	before := len(r.topology())
	deleteQueue(t, b, "leaf")
	assert.Equal(t, []string{
		`binding-deleted ad2->leaf key ""`,
		"exchange-deleted(auto-delete) ad2",
		`binding-deleted ad1->exchange ad2 key ""`,
		"exchange-deleted(auto-delete) ad1",
		"queue-deleted(deleted) leaf",
	}, r.topology()[before:])
	_, err := b.Exchange("ad1")
	require.ErrorIs(t, err, warren.ErrNotFound)

	tmp := declare(t, b, "tmp", warren.AutoDelete())
	c, err := tmp.Consume(t.Context(), warren.ConsumerTag("only"))
	require.NoError(t, err)
	before = len(r.topology())
	require.NoError(t, c.Cancel())
	assert.Equal(t, []string{"consumer-deleted tmp/only", "queue-deleted(auto-delete) tmp"}, r.topology()[before:])
}

// TestEventUnroutable: a publish that reaches no queue is Published, then Unroutable, with the
// same message; with Mandatory too; BrokerStats counts them.
func TestEventUnroutable(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	_, err := b.DeclareExchange("lonely", warren.ExchangeFanout)
	require.NoError(t, err)
	require.NoError(t, b.Publish(t.Context(), "", "ghost", msg("a")))
	require.ErrorIs(t, b.Publish(t.Context(), "", "ghost", msg("b"), warren.Mandatory()), warren.ErrUnroutable)
	require.NoError(t, b.Publish(t.Context(), "lonely", "k", msg("c")))
	var got []string
	for _, e := range r.all() {
		switch e.Kind {
		case warren.EventPublished, warren.EventUnroutable:
			got = append(got, fmt.Sprintf("%s %q %s %s", e.Kind, e.Exchange, e.RoutingKey, e.Message.Body))
		case warren.EventEnqueued:
			t.Errorf("unexpected %s", describeEvent(e))
		}
	}
	assert.Equal(t, []string{
		`published "" ghost a`, `unroutable "" ghost a`,
		`published "" ghost b`, `unroutable "" ghost b`,
		`published "lonely" k c`, `unroutable "lonely" k c`,
	}, got)
	un := r.ofKind(warren.EventUnroutable)
	pub := r.ofKind(warren.EventPublished)
	for i := range un {
		assert.Same(t, pub[i].Message, un[i].Message)
	}
	assert.Equal(t, uint64(3), b.Stats().Unroutable)
}

// TestEventListenerPanicContained: a listener that panics on every event is logged, and nothing
// else notices: calls succeed, other listeners hear every event, the broker works and closes.
func TestEventListenerPanicContained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log logBuffer
		b := warren.New(warren.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
		defer b.Close()
		b.Listen(func(e warren.Event) { panic("listener bug: " + e.Kind.String()) })
		r := recordEvents(t, b)
		checkSpans(t, b)
		q, err := b.DeclareQueue("q", warren.MessageTTL(time.Second))
		require.NoError(t, err)
		c, err := q.Consume(t.Context(), warren.Prefetch(1))
		require.NoError(t, err)
		publishAll(t, b, "q", "a", "b")
		d := receive(t, c, 1)[0]
		require.NoError(t, d.Ack())
		require.NoError(t, receive(t, c, 1)[0].Ack())
		require.NoError(t, c.Cancel())
		publish(t, b, "q", "c")
		time.Sleep(2 * time.Second) // expires on the queue's timer goroutine: contained there too
		synctest.Wait()
		require.Equal(t, "enqueued delivered acked", r.trace("q", "a"))
		require.Equal(t, "enqueued delivered acked", r.trace("q", "b"))
		require.Equal(t, "enqueued expired", r.trace("q", "c"))
		require.NoError(t, b.Close())
		assert.Len(t, r.ofKind(warren.EventQueueDeleted), 1)
		assert.Contains(t, log.String(), "event listener panicked")
		assert.Contains(t, log.String(), "listener bug: expired")
	})
}

// TestEventListenStop: stop unregisters a listener (idempotently); a nil listener is ignored;
// a listener registered twice is called twice.
func TestEventListenStop(t *testing.T) {
	b := newBroker(t)
	var n atomic.Int32
	count := func(warren.Event) { n.Add(1) }
	stop := b.Listen(count)
	stop2 := b.Listen(count)
	b.Listen(nil)()
	declare(t, b, "q")
	require.Equal(t, int32(2), n.Load(), "queue-created, once per registration")
	stop()
	stop()
	declare(t, b, "q2")
	require.Equal(t, int32(3), n.Load())
	stop2()
	declare(t, b, "q3")
	require.Equal(t, int32(3), n.Load())
}

// TestEventKindTerminal: exactly Acked, Expired, DeadLettered and Dropped end a span; every kind
// has a name.
func TestEventKindTerminal(t *testing.T) {
	var terminal []string
	for k := warren.EventHandlerPanicked; k <= warren.EventAlert; k++ {
		require.NotEqual(t, "unknown", k.String(), "kind %d", k)
		if k.Terminal() {
			terminal = append(terminal, k.String())
		}
	}
	assert.Equal(t, []string{"acked", "expired", "dead-lettered", "dropped"}, terminal)
	assert.Equal(t, "unknown", warren.EventKind(0).String())
}

// A listener that panics is logged, not propagated: the publisher or handler that caused the
// event carries on.
func TestPanickingListenerIsContained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		stop := b.Listen(func(warren.Event) { panic("listener bug") })
		defer stop()
		require.NotPanics(t, func() { stop := b.Listen(nil); stop() })
		q := declare(t, b, "q")
		publishN(t, b, q, 1)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- q.Serve(ctx, func(context.Context, warren.Delivery) error { panic("handler bug") },
				warren.Backoff(time.Hour, time.Hour)) // one attempt, then hidden for an hour
		}()
		synctest.Wait()
		cancel()
		require.NoError(t, <-done)
		time.Sleep(time.Hour)
		synctest.Wait()
		require.Equal(t, 1, q.Len(), "the failed message is back in the queue")
	})
}

// TestEventHandOffCancelledThenDeleted: an AutoAck consumer handed a message is cancelled, and
// its queue deleted before its goroutine puts the hand-off back. The queue's end no longer sees
// the consumer, so the goroutine drops the message itself, evented.
func TestEventHandOffCancelledThenDeleted(t *testing.T) {
	handOffRounds(t, func(b *warren.Broker, c *warren.Consumer) {
		deleted := make(chan error)
		go func() { _, err := b.DeleteQueue("q"); deleted <- err }() // runs while Cancel waits for the feeder
		require.NoError(t, c.Cancel())
		require.NoError(t, <-deleted)
	}, func(st warren.QueueStats) bool { return st.Enqueued == st.Acked+st.Dropped })
}

// TestEventUnroutableWhenQueueWentMidPublish: a publish whose only queue is deleted between
// routing and enqueueing is unroutable in every way: the error with Mandatory, the event and
// the counter.
func TestEventUnroutableWhenQueueWentMidPublish(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	_, err := b.DeclareExchange("x", warren.ExchangeDirect)
	require.NoError(t, err)
	declare(t, b, "q")
	require.NoError(t, b.Bind("q", "x", "k", nil))
	stop := b.Listen(func(e warren.Event) {
		if e.Kind == warren.EventPublished {
			go func() { _, _ = b.DeleteQueue("q") }() // not from the listener itself: DeleteQueue waits
			for {
				if _, err := b.Queue("q"); err != nil {
					return
				}
				time.Sleep(time.Millisecond)
			}
		}
	})
	err = b.Publish(t.Context(), "x", "k", msg("m"), warren.Mandatory())
	stop()
	require.ErrorIs(t, err, warren.ErrUnroutable)
	assert.Len(t, r.ofKind(warren.EventUnroutable), 1)
	assert.Equal(t, "dropped(queue-deleted)", r.trace("q", "m"))
	assert.Equal(t, uint64(1), b.Stats().Unroutable)
}

// TestEventDeadLetteredIsTheCopyDelivered: the Message of EventDeadLettered is the copy that
// entered the target queue and is delivered from it, not a third one.
func TestEventDeadLetteredIsTheCopyDelivered(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	q := declare(t, b, "q", warren.DeadLetter("", "dlq"))
	dlq := declare(t, b, "dlq")
	publish(t, b, "q", "m")
	require.NoError(t, getOne(t, q).Reject())
	dead := r.one(t, "q", "m", warren.EventDeadLettered)
	entered := r.one(t, "dlq", "m", warren.EventEnqueued)
	require.Same(t, entered.Message, dead.Message)
	d, err := dlq.Get(t.Context(), warren.AutoAck())
	require.NoError(t, err)
	require.Equal(t, *dead.Message, d.Message)
}

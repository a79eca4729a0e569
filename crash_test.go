package warren

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/wal"
)

// Crash testing. A workload runs against a durable broker and journals what the broker told
// it: publishes confirmed, deliveries and their counts, settlements that returned. The broker
// then crashes — a kill -9 of a child process on the real file system (TestKill9, and the crash
// loop under load, TestKill9Loop), or a power loss on MemFS (TestPowerLoss*) — and a checker
// reopens the log and holds what came back against the journal: every confirmed message that
// was not acked is back, in its queue or, dead-lettered or expired, in the dead-letter queue, in
// order, once; a delivery count went up only by deliveries the application received; what the
// crash may take (an ack within FlushDelay, the last interval of SyncInterval) is counted, and
// anything older fails. The log alone is tested in internal/wal; the store's scenarios in
// store_test.go.

// The workload's topology: jobs, some of whose messages have TTLs of their own, and timed, whose
// messages have TTLs (the queue's, and some their own) and delays; both have a delivery limit
// and dead-letter through the durable exchange dlx into dlq. Who takes from them depends on the
// test: Get, Consume and Serve (TestKill9 and the power losses: Get and Consume; TestKill9Loop:
// Serve and Get). Both queues' timers may fire at one instant and commit concurrently, which the
// store survives since its scratch list of bodies moved to each queue (TestDurableConcurrentQueues).
// Most of jobs' messages have no TTL: a check waits for every TTL to run out (WaitIdle), and
// those must outlive it, to be delivered again after a crash.
const (
	crashLimit    = 1                      // jobs' and timed's DeliveryLimit
	crashJobsTTL  = 500 * time.Millisecond // the longest TTL (ExpireAfter) of a message in jobs, one in five
	crashQueueTTL = 250 * time.Millisecond // timed's MessageTTL
	crashMaxTTL   = 200 * time.Millisecond // the longest per-message TTL (ExpireAfter) in timed
	crashMaxDelay = 100 * time.Millisecond // the longest DeliverAfter and NackWithDelay
	crashBacklog  = 300                    // no publishing while jobs or dlq hold more than this
	crashMaxHeld  = 5                      // Get deliveries kept unsettled for a while
)

func crashTopology(b *Broker) (jobs, timed, dlq *Queue, err error) {
	if _, err = b.DeclareExchange("dlx", ExchangeDirect, Durable()); err != nil {
		return
	}
	if dlq, err = b.DeclareQueue("dlq", Durable()); err != nil {
		return
	}
	if err = b.Bind("dlq", "dlx", "dead", nil); err != nil {
		return
	}
	if jobs, err = b.DeclareQueue("jobs", Durable(), DeliveryLimit(crashLimit), DeadLetter("dlx", "dead")); err != nil {
		return
	}
	timed, err = b.DeclareQueue("timed", Durable(), MessageTTL(crashQueueTTL), DeliveryLimit(crashLimit), DeadLetter("dlx", "dead"))
	return
}

// The journal: one line per event, written with one Write, which a kill -9 cannot undo:
//
//	op queue n at [args]
//
// where n is the message's number (its body), and at the wall clock (Unix ns) once the call
// returned. Each publisher numbers its messages from life·10⁹ + publisher·10⁸ (crashFirst), in
// the order it publishes them, which is their order in each queue. The ops:
//   - T: the topology is declared (queue "-", n 0)
//   - I: the publish of n is about to start; args: when it starts, its delay, its TTL (ns, 0 for none)
//   - P: the publish of n was confirmed
//   - D: n was delivered; args: its DeliveryCount
//   - a: an Ack of n's delivery is about to be called (a kill may let it take effect, unjournaled)
//   - A, N, R: an Ack, Nack, Reject of n's delivery returned
//   - W: a NackWithDelay of n's delivery returned; args: when it was called, the delay
//   - X: n's delivery was given back: its Get's context ended, or its consumer was closed
type journalEntry struct {
	op    byte
	queue string
	n     int
	at    int64
	args  [3]int64
}

// parseJournal reads a journal. A last line without its newline, which only a write torn by the
// kill could leave, is ignored; any other malformed line is an error.
func parseJournal(data []byte) ([]journalEntry, error) {
	var es []journalEntry
	for len(data) > 0 {
		line, rest, ok := bytes.Cut(data, []byte("\n"))
		if !ok {
			break
		}
		data = rest
		f := bytes.Fields(line)
		if len(f) < 4 || len(f[0]) != 1 || len(f) > 7 {
			return nil, fmt.Errorf("journal: malformed line %q", line)
		}
		e := journalEntry{op: f[0][0], queue: string(f[1])}
		nums := make([]int64, len(f)-2)
		for i, s := range f[2:] {
			v, err := strconv.ParseInt(string(s), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("journal: malformed line %q", line)
			}
			nums[i] = v
		}
		e.n, e.at = int(nums[0]), nums[1]
		copy(e.args[:], nums[2:])
		es = append(es, e)
	}
	return es, nil
}

// crashWorkload publishes numbered persistent messages to jobs and timed, takes them from every
// queue, settles them in every way, and journals it all. It panics on any error: nothing in it
// may fail before the crash.
type crashWorkload struct {
	b                *Broker
	jobs, timed, dlq *Queue
	journal          io.Writer       // one Write per line; safe for concurrent use in the child
	life             int             // whose message numbers it uses (crashFirst)
	pub              *crashPublisher // step's
	held             []Delivery      // step's goroutine only (in the loop, crashLoop's own)
	consumer         *Consumer       // pollConsumer's
	// pause, if not nil, is called once step's goroutine has handed work to another (a Get's
	// context ended): it returns once that work is done.
	pause func()
	// The loop's (crashLoop): room wakes a publisher waiting for the backlog to shrink, and
	// settled the loop's own goroutine; its handlers signal both each time they settle.
	room, settled chan struct{}
}

// crashPublisher publishes a stream of numbered messages, next, next+1, and so on.
type crashPublisher struct {
	w    *crashWorkload
	next int // the next message number
	// deferred are the messages published with PublishDeferred and not yet journaled as
	// confirmed, and last the Confirmation of the latest: its Wait confirms them all.
	deferred []journalEntry
	last     Confirmation
}

// crashFirst is the first message number of a publisher of a life: numbers never repeat across
// lives, so that a publish the kill interrupted after it reached the log and before the journal
// said so is not mistaken for a later one.
func crashFirst(life, publisher int) int { return life*1_000_000_000 + publisher*100_000_000 }

// crashStream says whose stream a message number is in: its life's and publisher's.
func crashStream(n int) int { return n / 100_000_000 }

func newCrashWorkload(b *Broker, journal io.Writer, life int) *crashWorkload {
	jobs, timed, dlq, err := crashTopology(b)
	must(err)
	w := &crashWorkload{b: b, jobs: jobs, timed: timed, dlq: dlq, journal: journal, life: life}
	w.pub = &crashPublisher{w: w, next: crashFirst(life, 0)}
	w.note('T', "-", 0)
	return w
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// note journals one event.
func (w *crashWorkload) note(op byte, queue string, n int, args ...int64) {
	line := append(make([]byte, 0, 80), op, ' ')
	line = append(line, queue...)
	line = append(line, ' ')
	line = strconv.AppendInt(line, int64(n), 10)
	line = append(line, ' ')
	line = strconv.AppendInt(line, time.Now().UnixNano(), 10)
	for _, a := range args {
		line = append(line, ' ')
		line = strconv.AppendInt(line, a, 10)
	}
	_, err := w.journal.Write(append(line, '\n'))
	must(err)
}

// step does one random thing: publish, or take a message from a queue and settle it.
func (w *crashWorkload) step(ctx context.Context, rng *rand.Rand) {
	switch r := rng.IntN(100); {
	case r < 40 && w.roomToPublish():
		w.pub.publish(ctx, rng)
	case r < 55:
		w.take(ctx, w.jobs, rng)
	case r < 60:
		w.giveBack(ctx)
	case r < 72:
		w.take(ctx, w.timed, rng)
	case r < 88:
		w.take(ctx, w.dlq, rng)
	case r < 94:
		w.pollConsumer(ctx, rng)
	case r < 96:
		w.pub.confirmDeferred()
	default:
		w.settleHeld(rng)
	}
}

// roomToPublish reports whether the backlog lets the workload publish: no publishing while jobs
// or dlq hold more than crashBacklog.
func (w *crashWorkload) roomToPublish() bool {
	return w.jobs.Len() < crashBacklog && w.dlq.Len() < crashBacklog
}

// settleHeld settles the oldest delivery kept for later, if any.
func (w *crashWorkload) settleHeld(rng *rand.Rand) {
	if len(w.held) > 0 {
		d := w.held[0]
		w.held = w.held[1:]
		w.settle(d, crashNumber(d), rng)
	}
}

// publish publishes one message, or a batch, to jobs (now and then with a TTL), or to timed
// (with the queue's TTL, or one of its own, or delayed).
func (p *crashPublisher) publish(ctx context.Context, rng *rand.Rand) {
	w := p.w
	queue := "jobs"
	var (
		opts       []PublishOption
		delay, ttl time.Duration
	)
	switch {
	case rng.IntN(5) >= 2:
		if rng.IntN(5) == 0 {
			ttl = time.Duration(1+rng.Int64N(int64(crashJobsTTL/time.Millisecond))) * time.Millisecond
			opts = append(opts, ExpireAfter(ttl))
		}
	default:
		queue, ttl = "timed", crashQueueTTL
		switch rng.IntN(3) {
		case 0:
			delay = time.Duration(1+rng.Int64N(int64(crashMaxDelay/time.Millisecond))) * time.Millisecond
			opts = append(opts, DeliverAfter(delay))
		case 1:
			ttl = time.Duration(1+rng.Int64N(int64(crashMaxTTL/time.Millisecond))) * time.Millisecond
			opts = append(opts, ExpireAfter(ttl))
		}
	}
	ps := make([]Publishing, 1)
	if rng.IntN(4) == 0 {
		ps = make([]Publishing, 2+rng.IntN(4))
	}
	first, start := p.next, time.Now().UnixNano()
	for i := range ps {
		ps[i] = Publishing{Key: queue, Message: Message{Body: strconv.AppendInt(nil, int64(first+i), 10), Persistent: true}}
		w.note('I', queue, first+i, start, int64(delay), int64(ttl))
	}
	p.next += len(ps)
	if len(ps) == 1 && rng.IntN(3) == 0 {
		// Deferred: confirmed (journaled P) only once a later Wait returns, for it and every
		// deferred publish before it, which is what the Confirmation's order promises.
		c, err := w.b.PublishDeferred(ctx, "", queue, ps[0].Message, opts...)
		must(err)
		p.deferred = append(p.deferred, journalEntry{queue: queue, n: first})
		p.last = c
		if len(p.deferred) >= 8 {
			p.confirmDeferred()
		}
		return
	}
	if len(ps) == 1 {
		must(w.b.Publish(ctx, "", queue, ps[0].Message, opts...))
	} else {
		must(w.b.PublishBatch(ctx, ps, opts...))
	}
	for i := range ps {
		w.note('P', queue, first+i)
	}
}

// confirmDeferred waits for the latest deferred publish's Confirmation alone, and journals every
// deferred publish so far as confirmed.
func (p *crashPublisher) confirmDeferred() {
	if len(p.deferred) == 0 {
		return
	}
	must(p.last.Wait())
	for _, e := range p.deferred {
		p.w.note('P', e.queue, e.n)
	}
	p.deferred = p.deferred[:0]
}

// take gets a message from q, if it has one, journals its delivery, and settles it, or, from
// jobs, now and then keeps it for a later step to settle.
func (w *crashWorkload) take(ctx context.Context, q *Queue, rng *rand.Rand) {
	d, err := q.Get(ctx)
	if errors.Is(err, ErrEmpty) {
		return
	}
	must(err)
	n := w.delivered(d)
	if q == w.jobs && len(w.held) < crashMaxHeld && rng.IntN(10) == 0 {
		w.held = append(w.held, d) // or out with its Get at the crash
		return
	}
	w.settle(d, n, rng)
}

// giveBack gets a message from jobs and lets its Get's context end, which returns it.
func (w *crashWorkload) giveBack(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d, err := w.jobs.Get(ctx)
	if errors.Is(err, ErrEmpty) {
		return
	}
	must(err)
	n := w.delivered(d)
	cancel()
	if w.pause != nil {
		w.pause()
	}
	w.note('X', "jobs", n)
}

// delivered journals d and returns its message's number.
func (w *crashWorkload) delivered(d Delivery) int {
	n := crashNumber(d)
	w.note('D', d.q.name, n, int64(d.DeliveryCount))
	return n
}

func crashNumber(d Delivery) int {
	n, err := strconv.Atoi(string(d.Message.Body))
	must(err)
	return n
}

// settle acks, nacks, nacks with a delay (timed) or rejects (not dlq, which has no dead-letter
// exchange) a delivery of message n.
func (w *crashWorkload) settle(d Delivery, n int, rng *rand.Rand) {
	queue := d.q.name
	switch r := rng.IntN(20); {
	case r < 11:
		w.note('a', queue, n)
		must(d.Ack())
		w.note('A', queue, n)
	case r < 14 || queue == "dlq":
		must(d.Nack())
		w.note('N', queue, n)
	case r < 17 && queue == "timed":
		delay := time.Duration(1+rng.Int64N(int64(crashMaxDelay/time.Millisecond))) * time.Millisecond
		start := time.Now().UnixNano()
		must(d.NackWithDelay(delay))
		w.note('W', queue, n, start, int64(delay))
	default:
		must(d.Reject())
		w.note('R', queue, n)
	}
}

// consumed handles a delivery of the consumer c: it settles it, or, now and then, closes c,
// which gives back what c holds; it reports whether it closed c.
func (w *crashWorkload) consumed(c *Consumer, d Delivery, rng *rand.Rand) (closed bool) {
	n := w.delivered(d)
	if rng.IntN(50) == 0 {
		must(c.Close())
		w.note('X', "jobs", n)
		return true
	}
	w.settle(d, n, rng)
	return false
}

// consume runs a consumer on jobs until ctx ends (the child's second goroutine; the kill
// ends it).
func (w *crashWorkload) consume(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		c, err := w.jobs.Consume(ctx, Prefetch(1+rng.IntN(8)))
		must(err)
		for d := range c.Deliveries() {
			if w.consumed(c, d, rng) {
				break
			}
		}
	}
}

// pollConsumer takes what a consumer on jobs has for the workload, if anything, without
// waiting: the consumer of a run on one goroutine (a push consumer's deliveries are sent in the
// critical sections of the publishes and settlements that free them).
func (w *crashWorkload) pollConsumer(ctx context.Context, rng *rand.Rand) {
	if w.consumer == nil {
		c, err := w.jobs.Consume(ctx, Prefetch(1+rng.IntN(8)))
		must(err)
		w.consumer = c
	}
	select {
	case d := <-w.consumer.Deliveries():
		if w.consumed(w.consumer, d, rng) {
			w.consumer = nil
		}
	default:
	}
}

// The crash loop's workload (TestKill9Loop): crashPublishers publishers on goroutines of their
// own; a Serve on each queue, whose handlers journal each delivery and settle it themselves
// (Serve then finds it settled and leaves it), jobs' slower than the publishers, with a prefetch
// above its workers, so that a backlog builds and deliveries wait in its buffer; and the loop's
// own goroutine, which gets from jobs, holds, and gives back, a step each time a handler
// settled something.
const (
	crashPublishers = 4
	crashWorkers    = 2                    // jobs' Serve's
	crashPrefetch   = 64                   // jobs' Serve's: most of its deliveries wait in its buffer
	crashWork       = 1 * time.Millisecond // how long jobs' handler works on a message
)

// crashLoop runs the loop's workload until the process is killed.
func (w *crashWorkload) crashLoop(ctx context.Context, seed uint64) {
	w.room, w.settled = make(chan struct{}, 1), make(chan struct{}, 1)
	handlers := rand.New(&lockedSource{src: rand.NewPCG(seed, 1)})
	for _, s := range []struct {
		q                 *Queue
		work              time.Duration
		workers, prefetch int
	}{{w.jobs, crashWork, crashWorkers, crashPrefetch}, {w.timed, 0, 1, 4}, {w.dlq, 0, 1, 4}} {
		go func() {
			must(s.q.Serve(ctx, w.handler(handlers, s.work), Workers(s.workers), Prefetch(s.prefetch)))
		}()
	}
	for i := range crashPublishers {
		p := &crashPublisher{w: w, next: crashFirst(w.life, i+1)}
		rng := rand.New(rand.NewPCG(seed, uint64(10+i)))
		go func() {
			for {
				for !w.roomToPublish() {
					<-w.room
				}
				p.publish(ctx, rng)
				if rng.IntN(10) == 0 {
					p.confirmDeferred()
				}
			}
		}()
	}
	rng := rand.New(rand.NewPCG(seed, 2))
	for range w.settled {
		switch r := rng.IntN(10); {
		case r < 3:
			w.take(ctx, w.jobs, rng)
		case r < 4:
			w.giveBack(ctx)
		case r < 5:
			w.settleHeld(rng)
		}
	}
}

// handler returns the loop's handler: it journals the delivery, works on it for work (a sleep:
// the time a handler takes is what makes the pool slow), settles it, and tells the publishers
// and the loop's goroutine.
func (w *crashWorkload) handler(rng *rand.Rand, work time.Duration) Handler {
	return func(_ context.Context, d Delivery) error {
		n := w.delivered(d)
		if work > 0 {
			time.Sleep(work)
		}
		w.settle(d, n, rng)
		for _, ch := range []chan struct{}{w.room, w.settled} {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
		return nil
	}
}

// lockedSource is a rand.Source safe for concurrent use: the handlers share one.
type lockedSource struct {
	mu  sync.Mutex
	src rand.Source
}

func (s *lockedSource) Uint64() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.src.Uint64()
}

// crashBounds says what a crash may have taken: the records of what returned within a window
// before it. A window of 0 loses nothing, crashLoseAll anything.
type crashBounds struct {
	at, over  int64         // the crash began (a kill sent), and was surely over (the process gone); Unix ns
	published time.Duration // a publish confirmed within this of the crash may be lost
	settled   time.Duration // an ack, nack, reject, delivery or delay that returned within this may be lost
}

const crashLoseAll = time.Duration(math.MaxInt64)

// mayLose reports whether the crash may have taken the record of something that returned at at.
func (c crashBounds) mayLose(at int64, window time.Duration) bool {
	return window != 0 && c.at-at <= int64(window)
}

// crashChecker holds what a broker gets back after each crash against the journals of the lives
// before: it keeps, for each message still to be accounted for, what the workload was told.
type crashChecker struct {
	t        *testing.T
	seed     string // what the failures say first, if anything: the seed
	where    string // what the failures say first: the seed, the life
	msgs     map[int]*crashMsg
	crashes  []crashBounds // by life
	journals [][]byte      // by life
	// declaredAt is when the workload's topology was first declared (confirmed), 0 for never;
	// synced, whether a check's broker had it when it closed, which synced it.
	declaredAt int64
	synced     bool
	dlq        []int       // dlq's message numbers at the last check, in order
	stats      *crashStats // shared by the checkers of a test's runs
	// atReceipt are the queues whose every taker counts a delivery only once the application
	// received it (Get, Serve; not Consume, whose channel's receive is not seen): a delivery
	// count there is at most one more than the last one journaled. receiptWindow is how many
	// deliveries a crash may count with no journal line: received, and the kill came before
	// the line (a Get's; a Serve worker's, which waits for its delivery's record before the
	// handler runs, and the log wakes it only once the batch that carried the record is synced:
	// under SyncAlways that is tens of milliseconds behind the publishers' fsyncs, most at a
	// child's start, when the workers take the head of the queue, which the kill of the next
	// life may catch there again).
	atReceipt     map[string]bool
	receiptWindow int

	mu      sync.Mutex
	noRoute map[int]bool // guarded by mu: dead letters the broker of a check dropped for want of a route
}

// crashStats counts what the checks saw: what they checked, and what the crashes took.
type crashStats struct {
	confirmed   int           // publishes confirmed
	verified    int           // times a message that had to be back was found
	adopted     int           // publishes in flight at a crash that were found: they reached the log
	lostAcks    int           // acked messages found again: the ack was lost
	lateAcks    int           // of which acks that returned more than 10 ms (FlushDelay and some slack) before the crash
	oldestAck   time.Duration // the oldest such ack, before its crash
	lostDead    int           // messages rejected or dead-lettered found back in their queue alone
	deadDups    int           // messages in both their queue and dlq, or twice in dlq
	flatCounts  int           // redeliveries across a crash whose count did not go up: the crash took the delivery's record
	expiredDown int           // messages whose TTL passed while the broker was down, gone at the restart
	delaysKept  int           // messages delayed past the restart, hidden at the restart
	lostInBound int           // confirmed messages lost within the bound (a power loss)
	pastLimit   int           // deliveries past the delivery limit (TestDurableDeliveryLimitAcrossRestart)
	noRoute     int           // messages expired while down and dropped at the restart (TestDurableDeadLetterAtOpen)
	opens       int           // restarts after a crash
	fromCk      int           // of which from a checkpoint and the records after it
	// ackAges says, for each lost ack, how long before its crash it returned.
	ackAges []time.Duration
	// unseenCounts are the counts gone up by a delivery no journal line told of, in atReceipt
	// queues: at most unseenAllowed (receiptWindow per crash), else deliveries that the
	// application never received counted. diedUnseen of them are messages dead-lettered past
	// their delivery limit with no delivery journaled.
	unseenCounts, unseenAllowed, diedUnseen int
	// Runs cut short: the restart lost the topology (TestDurablePowerLossAfterSegmentRelease),
	// or refused a log whose last segment's header was torn (TestDurableOpensAfterTornSegmentHeader).
	topologyLost, tornHeader int
	// The kill -9 children's panics, and races found under -race, in store.logEffects
	// (TestDurableConcurrentQueues).
	childPanics, childRaces int
}

// crashMsg is what the journals said of one message.
type crashMsg struct {
	queue     string // jobs or timed
	life      int
	confirmed bool  // its publish was confirmed, or it was in flight at a crash and found after
	lost      bool  // not found after a crash that could take it: it must never be found again
	pubAt     int64 // when its publish was confirmed (for one in flight, when the crash was over)
	ttl       int64 // its TTL, 0 for none
	due       int64 // hidden until at least this by its last delay, if nothing delivered it since
	dueAt     int64 // when the NackWithDelay that set due returned; 0 for a delayed publish
	ackedAt   int64 // when the ack of it (from its queue or dlq) returned; 0 for none
	acking    bool  // an ack of it was called and did not return before the crash
	leftAt    int64 // when a settlement that dead-letters it returned: a reject, a nack past the limit
	deadAt    int64 // when it was last delivered from dlq
	dup       bool  // it was in two places at once: its copies are not told apart from then on
	// Set by a check while it looks at what the restart got back at once: its TTL ended while
	// the broker was down; it is delayed past the restart.
	expiredDown, delayed bool
	diedUnseen           bool // dead-lettered past its delivery limit with no delivery journaled (counted once)
	own, dead            seen // its last delivery from its queue, and from dlq
}

// seen is a message's last delivery from a queue: in which life, with which count, when; the
// least count a delivery after a crash may have; and, in an atReceipt queue, the most the next
// may have, as far as the journal knows (the zero seen: not delivered, count 0).
type seen struct {
	life, count, floor, ceil int
	at                       int64
}

// newCrashChecker returns a checker of a workload whose deliveries from the atReceipt queues
// count at receipt, of which a crash may take receiptWindow unjournaled (see crashChecker).
func newCrashChecker(t *testing.T, stats *crashStats, receiptWindow int, atReceipt ...string) *crashChecker {
	c := &crashChecker{t: t, msgs: map[int]*crashMsg{}, noRoute: map[int]bool{}, stats: stats,
		atReceipt: map[string]bool{}, receiptWindow: receiptWindow}
	for _, q := range atReceipt {
		c.atReceipt[q] = true
	}
	return c
}

// listener is to be given to the broker opened for a check: it hears the dead letters dropped
// for want of a route. The workload's dead letters always have one, but for a bug:
// TestDurableDeadLetterAtOpen. Counted; report fails the test if it
// ever happens again.
func (c *crashChecker) listener() BrokerOption {
	return WithListener(func(e Event) {
		if e.Kind == EventDropped && e.Reason == ReasonDLXNoRoute {
			n, err := strconv.Atoi(string(e.Message.Body))
			must(err)
			c.mu.Lock()
			c.noRoute[n] = true
			c.mu.Unlock()
		}
	})
}

func (c *crashChecker) fail(format string, args ...any) {
	c.t.Helper()
	c.t.Fatalf("%s: %s", c.where, fmt.Sprintf(format, args...))
}

// failAbout fails with message n's history: its journal lines, timed from the crash after each.
func (c *crashChecker) failAbout(n int, format string, args ...any) {
	c.t.Helper()
	var h bytes.Buffer
	for life, journal := range c.journals {
		es, _ := parseJournal(journal)
		for _, e := range es {
			if e.n == n {
				fmt.Fprintf(&h, "\n\tlife %d, %v before its crash: %c %s %v", life, time.Duration(c.crashes[life].at-e.at), e.op, e.queue, e.args)
			}
		}
	}
	c.fail(format+"; its journal:%s", append(args, h.String())...)
}

// replay reads the journal of a life that ended with a crash within bounds.
func (c *crashChecker) replay(life int, journal []byte, bounds crashBounds) {
	c.t.Helper()
	c.where = fmt.Sprintf("%slife %d", c.seed, life)
	es, err := parseJournal(journal)
	if err != nil {
		c.fail("%v", err)
	}
	c.crashes = append(c.crashes, bounds)
	c.journals = append(c.journals, bytes.Clone(journal))
	c.stats.unseenAllowed += c.receiptWindow
	for _, e := range es {
		m := c.msgs[e.n]
		if e.op == 'T' {
			if c.declaredAt == 0 {
				c.declaredAt = e.at
			}
			continue
		}
		if e.op == 'I' {
			m = &crashMsg{queue: e.queue, life: life, ttl: e.args[2]}
			if e.args[1] > 0 {
				m.due = e.args[0] + e.args[1]
			}
			c.msgs[e.n] = m
			continue
		}
		if m == nil {
			c.failAbout(e.n, "%c of message %d in %s: it was never published, or a crash took it and it was found after", e.op, e.n, e.queue)
		}
		switch e.op {
		case 'P':
			m.confirmed, m.pubAt = true, e.at
			c.stats.confirmed++
		case 'D':
			c.delivered(m, e, life, bounds)
		case 'a':
			m.acking = true
		case 'A':
			m.ackedAt, m.acking = e.at, false
		case 'N', 'W':
			switch {
			case e.queue == "dlq":
			case m.own.count >= crashLimit:
				m.leftAt = e.at // past the delivery limit: dead-lettered
			case e.op == 'W':
				m.due, m.dueAt = e.args[0]+e.args[1], e.at
			}
		case 'R':
			m.leftAt = e.at
		}
	}
	for _, m := range c.msgs {
		if !m.confirmed && m.life == life {
			m.pubAt = bounds.over // in flight at the crash: if it reached the log, it did before this
		}
	}
}

// delivered checks a delivery's count against the message's earlier ones: a count goes up by
// one at least with each return, so it goes up between two deliveries of one life; after a
// crash it is at least one more than that of the last delivery whose record the crash could not
// take (the message was out, or came back, when the log ended).
func (c *crashChecker) delivered(m *crashMsg, e journalEntry, life int, bounds crashBounds) {
	c.t.Helper()
	last := &m.own
	if e.queue == "dlq" {
		m.deadAt = e.at
		if m.dup {
			return // which copy is this?
		}
		last = &m.dead
	}
	count := int(e.args[0])
	if c.atReceipt[e.queue] && count > last.ceil {
		// A delivery the journal does not know of counted: within a life, or of a message
		// published in this life and not delivered before, never; across a crash, when the
		// application received it and the kill came before the journal's line.
		if last.at != 0 && last.life == life || last.at == 0 && e.queue != "dlq" && m.life == life {
			c.failAbout(e.n, "message %d delivered from %s with count %d; the journal told of deliveries up to count %d",
				e.n, e.queue, count, last.ceil-1)
		}
		c.stats.unseenCounts += count - last.ceil
	}
	switch {
	case last.at == 0:
	case last.life == life && count <= last.count:
		c.failAbout(e.n, "message %d delivered from %s with count %d after count %d", e.n, e.queue, count, last.count)
	case last.life != life && count < last.floor:
		c.failAbout(e.n, "message %d delivered from %s with count %d after a crash; a delivery with count %d before it could not be lost",
			e.n, e.queue, count, last.floor-1)
	case last.life != life && count <= last.count:
		c.stats.flatCounts++
	}
	if e.queue != "dlq" && count > crashLimit {
		// A bug: TestDurableDeliveryLimitAcrossRestart. Counted; report fails
		// the test if it ever happens again.
		c.stats.pastLimit++
	}
	floor := last.floor
	if !bounds.mayLose(e.at, bounds.settled) {
		floor = max(floor, count+1)
	}
	*last = seen{life: life, count: count, at: e.at, floor: floor, ceil: count + 1}
	m.due = 0
}

// deadline returns the latest the message's TTL can end, 0 for none.
func (m *crashMsg) deadline() int64 {
	if m.ttl == 0 {
		return 0
	}
	return m.pubAt + m.ttl
}

// crashSlack is how far a deadline or a due time may move on its way to the log and back: it is
// moved between a queue's clock and the wall clock, read one after the other (and the goroutine
// may be descheduled in between).
const crashSlack = 10 * time.Millisecond

// check checks what b got back when it was opened at reopened (Unix ns), after the crash that
// ended the last life replayed. It leaves b's queues as it found them, but for what expired
// and dead-lettered or became due while it waited. It returns false if the restart lost the
// topology, which the crash could not take: a bug (TestDurablePowerLossAfterSegmentRelease),
// counted (report fails the test); nothing more can be checked.
func (c *crashChecker) check(b *Broker, reopened int64) bool {
	c.t.Helper()
	bounds := c.crashes[len(c.crashes)-1]
	if _, err := b.Queue("jobs"); errors.Is(err, ErrNotFound) &&
		(c.synced || c.declaredAt != 0 && !bounds.mayLose(c.declaredAt, bounds.published)) {
		c.stats.topologyLost++
		return false
	}
	// A power loss may have taken the topology too, if it took everything.
	if _, _, _, err := crashTopology(b); err != nil {
		c.fail("declaring the topology again: %v", err)
	}
	c.synced = true // by the broker's Close

	// At once: what expired while the broker was down is gone from its queue; what is delayed
	// past now is hidden.
	jobs, timed := crashBrowse(b, "jobs"), crashBrowse(b, "timed")
	looked := time.Now().UnixNano()
	visible := map[int]bool{}
	for _, n := range slices.Concat(jobs, timed) {
		visible[n] = true
	}
	for n, m := range c.msgs {
		if m.lost {
			continue
		}
		if dl := m.deadline(); dl != 0 && dl < reopened-int64(crashSlack) {
			if visible[n] {
				c.failAbout(n, "message %d in %s: its TTL ended %v before the restart, and it is still there",
					n, m.queue, time.Duration(reopened-dl))
			}
			m.expiredDown = dl > bounds.over // counted once found in dlq
		}
		if m.due > looked+int64(crashSlack) {
			if visible[n] && !(m.dueAt != 0 && bounds.mayLose(m.dueAt, bounds.settled)) {
				c.failAbout(n, "message %d in %s: delayed until %v after the restart, and visible at once",
					n, m.queue, time.Duration(m.due-looked))
			}
			m.delayed = true // counted once found
		}
	}

	// Then, once every TTL and delay has run: everything is where it may be.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.WaitIdle(ctx); err != nil {
		c.fail("WaitIdle after the restart: %v", err)
	}
	type found struct{ queue, dead int }
	in := map[int]*found{}
	for _, q := range []string{"jobs", "timed"} {
		ns := crashBrowse(b, q)
		if !crashInOrder(ns) {
			c.fail("%s holds %v: not in order, or not once", q, ns)
		}
		for _, n := range ns {
			if m := c.msgs[n]; m == nil || m.queue != q {
				c.fail("message %d in %s: never published to it", n, q)
			}
			in[n] = &found{queue: 1}
		}
	}
	dlq, err := b.Queue("dlq")
	if err != nil {
		c.fail("%v", err)
	}
	var dead []int
	for msg := range dlq.Browse() {
		n, err := strconv.Atoi(string(msg.Body))
		if err != nil {
			c.fail("dlq holds %q", msg.Body)
		}
		m := c.msgs[n]
		if m == nil {
			c.fail("message %d in dlq: never published", n)
		}
		ds := msg.Deaths()
		if len(ds) == 0 || !c.mayDie(m, ds[0]) {
			c.failAbout(n, "message %d of %s in dlq with history %+v", n, m.queue, ds)
		}
		if ds[0].Reason == ReasonDeliveryLimit && c.atReceipt[m.queue] && m.own.at == 0 && !m.diedUnseen {
			// Past its limit, with no delivery journaled: every count it had was a delivery
			// received just before a kill and not journaled yet; else one that the application
			// never received counted. Its counts are among the unseen ones, which a crash may
			// have only so many of.
			if c.receiptWindow == 0 {
				c.failAbout(n, "message %d dead-lettered from %s past its delivery limit: the application never received it", n, m.queue)
			}
			m.diedUnseen = true
			c.stats.diedUnseen++
			c.stats.unseenCounts += crashLimit + 1
		}
		if in[n] == nil {
			in[n] = &found{}
		}
		in[n].dead++
		dead = append(dead, n)
	}
	for n, m := range c.msgs {
		f := in[n]
		if f == nil {
			f = &found{}
		}
		c.account(n, m, f.queue, f.dead, bounds)
	}
	c.checkDeadOrder(dead)
	return true
}

// crashInOrder reports whether a queue's message numbers are in order, each once: each
// publisher's in the order it published them, and a life's after those of the lives before (a
// later publish has a later place); the publishers of a life are not ordered among themselves.
func crashInOrder(ns []int) bool {
	last := map[int]int{} // by stream
	life := 0
	for _, n := range ns {
		s := crashStream(n)
		if prev, ok := last[s]; ok && n <= prev || s/10 < life {
			return false
		}
		last[s], life = n, s/10
	}
	return true
}

// mayDie reports whether m may have died as d says: from its queue, rejected, past its delivery
// limit, or expired if it had a TTL.
func (c *crashChecker) mayDie(m *crashMsg, d Death) bool {
	switch d.Reason {
	case ReasonRejected, ReasonDeliveryLimit:
		return d.Queue == m.queue
	case ReasonExpired:
		return d.Queue == m.queue && m.ttl > 0
	}
	return false
}

// account checks one message against where the restart has it: inQueue times in its queue,
// inDead times in dlq.
func (c *crashChecker) account(n int, m *crashMsg, inQueue, inDead int, bounds crashBounds) {
	c.t.Helper()
	defer func() { m.acking = false }() // whatever the ack in flight did, it is done
	switch {
	case m.lost:
		if inQueue+inDead > 0 {
			c.failAbout(n, "message %d: not found after the crash of life %d, found now", n, m.life)
		}
		return
	case !m.confirmed:
		if m.life != len(c.crashes)-1 {
			return // in flight at an earlier crash and lost: m.lost
		}
		if inQueue+inDead == 0 {
			m.lost = true
			return
		}
		m.confirmed, m.pubAt = true, bounds.over // its publish reached the log
		c.stats.adopted++
	}

	// Dead-lettering between durable queues is at least once: a crash between the copy's
	// publish and the original's settle leaves both (and the original may die again). The
	// settle is logged as the copy reaches dlq: before it was delivered from there.
	if !m.dup && (inQueue > 0 && inDead > 0 || inDead > 1) {
		if at := max(m.leftAt, m.deadAt); at != 0 && !bounds.mayLose(at, bounds.settled) {
			c.failAbout(n, "message %d in %s and dlq: dead-lettered %v before the crash", n, m.queue, time.Duration(bounds.at-at))
		}
		m.dup = true
		c.stats.deadDups++
	}
	c.mu.Lock()
	noRoute := c.noRoute[n]
	c.mu.Unlock()
	if m.dup {
		if inQueue+inDead == 0 {
			if m.ackedAt == 0 && !m.acking && !noRoute {
				c.failAbout(n, "message %d (in two places once) lost", n)
			}
			delete(c.msgs, n)
		}
		m.ackedAt = 0
		return
	}

	if m.expiredDown && inDead > 0 {
		c.stats.expiredDown++
	}
	if m.delayed && inQueue+inDead > 0 {
		c.stats.delaysKept++
	}
	m.expiredDown, m.delayed = false, false
	switch {
	case inQueue+inDead == 0 && (m.ackedAt != 0 || m.acking):
		delete(c.msgs, n) // done
	case inQueue+inDead == 0 && noRoute:
		c.stats.noRoute++
		delete(c.msgs, n)
	case inQueue+inDead == 0:
		if !bounds.mayLose(m.pubAt, bounds.published) {
			c.failAbout(n, "message %d, confirmed %v before the crash, not acked, is lost", n, time.Duration(bounds.at-m.pubAt))
		}
		m.lost = true
		c.stats.lostInBound++
	case inQueue > 0 && (m.leftAt != 0 || m.deadAt != 0):
		// Rejected, or past its limit, or delivered from dlq, and back in its queue alone: the
		// crash took the dead letter, and its copy's deliveries and ack with it.
		if at := max(m.leftAt, m.deadAt); !bounds.mayLose(at, bounds.settled) {
			c.failAbout(n, "message %d back in %s alone: dead-lettered %v before the crash", n, m.queue, time.Duration(bounds.at-at))
		}
		c.stats.lostDead++
		m.leftAt, m.deadAt, m.dead, m.ackedAt = 0, 0, seen{}, 0
	case m.ackedAt != 0:
		// Found again after its ack returned (from dlq if it is there): the crash took the ack.
		// Acked from its queue, it may be in dlq now: it expired, or passed its delivery limit,
		// at the restart.
		age := time.Duration(bounds.at - m.ackedAt)
		if !bounds.mayLose(m.ackedAt, bounds.settled) {
			c.failAbout(n, "message %d found in %s again: its ack returned %v before the crash", n, foundIn(inQueue, m.queue), age)
		}
		c.stats.lostAcks++
		c.stats.ackAges = append(c.stats.ackAges, age)
		if age > 10*time.Millisecond {
			c.stats.lateAcks++
		}
		c.stats.oldestAck = max(c.stats.oldestAck, age)
		m.ackedAt = 0
	default:
		c.stats.verified++
	}
}

func foundIn(inQueue int, queue string) string {
	if inQueue > 0 {
		return queue
	}
	return "dlq"
}

// checkDeadOrder checks dlq's order against the last check's: what was there keeps its order,
// ahead of everything dead-lettered since.
func (c *crashChecker) checkDeadOrder(dead []int) {
	c.t.Helper()
	before := map[int]int{}
	for i, n := range c.dlq {
		before[n] = i
	}
	last, newcomer := -1, -1
	for _, n := range dead {
		if m := c.msgs[n]; m != nil && m.dup {
			continue
		}
		i, old := before[n]
		switch {
		case !old:
			newcomer = n
		case newcomer >= 0:
			c.fail("dlq: message %d, there at the last check, after %d, dead-lettered since: %v", n, newcomer, dead)
		case i < last:
			c.fail("dlq: message %d before %d, against the last check's order: %v", n, c.dlq[last], dead)
		default:
			last = i
		}
	}
	c.dlq = dead
}

// crashBrowse returns the numbers of the messages q holds ready, in order.
func crashBrowse(b *Broker, queue string) []int {
	q, err := b.Queue(queue)
	must(err)
	var ns []int
	for m := range q.Browse() {
		n, err := strconv.Atoi(string(m.Body))
		must(err)
		ns = append(ns, n)
	}
	return ns
}

func (s crashStats) report(t *testing.T) {
	t.Logf("%d confirmed; checked back %d times; %d in flight and found", s.confirmed, s.verified, s.adopted)
	t.Logf("restarts: %d, %d of them from a checkpoint and the records after it", s.opens, s.fromCk)
	t.Logf("acks lost: %d (%d more than 10 ms before the crash; the oldest %v); dead letters lost: %d; "+
		"dead-letter duplicates: %d; delivery counts flat across a crash: %d",
		s.lostAcks, s.lateAcks, s.oldestAck, s.lostDead, s.deadDups, s.flatCounts)
	t.Logf("lost acks, how long before the crash their Ack returned: %s", distribution(s.ackAges))
	t.Logf("delivery counts gone up by a delivery the journal did not see: %d (at most %d: received just before a crash); "+
		"messages dead-lettered past the delivery limit with no delivery journaled: %d", s.unseenCounts, s.unseenAllowed, s.diedUnseen)
	require.LessOrEqual(t, s.unseenCounts, s.unseenAllowed,
		"deliveries the application never received counted towards the delivery limit after a crash")
	t.Logf("expired while down, gone at the restart: %d; delays kept across a restart: %d; "+
		"confirmed and lost within the bound: %d", s.expiredDown, s.delaysKept, s.lostInBound)
	t.Logf("bugs fixed, each with a test of its own in store_test.go: deliveries past the delivery limit: %d; "+
		"dead letters dropped at a restart: %d; runs cut short by a lost topology: %d, by a torn segment header: %d; "+
		"children's panics: %d, races: %d",
		s.pastLimit, s.noRoute, s.topologyLost, s.tornHeader, s.childPanics, s.childRaces)
	require.Zero(t, s.pastLimit+s.noRoute+s.topologyLost+s.tornHeader+s.childPanics+s.childRaces,
		"a fixed bug is back: see the counts above")
}

// distribution describes durations: how many, and their percentiles (nearest rank).
func distribution(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	at := func(p int) time.Duration { return ds[(len(ds)*p+99)/100-1] }
	return fmt.Sprintf("count %d, p50 %v, p90 %v, p99 %v, max %v", len(ds), at(50), at(90), at(99), ds[len(ds)-1])
}

// The kill -9 test: a child process runs the workload on a durable broker and is killed at a
// random moment; the parent reopens the log and checks. The child journals to a file with one
// write(2) per event, which the kill cannot undo.

const (
	crashChildEnv = "WARREN_CRASH_CHILD" // the child's data directory; set only in the child
	crashLifeEnv  = "WARREN_CRASH_LIFE"  // which life the child is: its message numbers start at life·10⁹
	crashSeedEnv  = "WARREN_CRASH_SEED"  // the child's seed
	crashSyncEnv  = "WARREN_CRASH_SYNC"  // its sync policy: always, interval or never
	crashLoopEnv  = "WARREN_CRASH_LOOP"  // set: the child runs the crash loop's workload (crashLoop)
)

// killWindow bounds how long before a kill -9 an ack (or any record not waited for) that
// returned may be lost. DURABILITY.md says FlushDelay (1 ms); but the log's flush waits for a
// write in progress, and with it for its fsync (under SyncInterval, its timer's), which can take
// tens of milliseconds (82 ms seen here): the bound is the one a lost record would certainly
// break, and the report gives the distribution of how long before the kill the lost ones
// returned.
const killWindow = time.Second

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// crashChild runs the workload until it is killed: TestKill9's, with a consumer on its own
// goroutine, or the crash loop's.
// crashWindow is the page window of a life of the child with seed, and of the restart that
// checks it: in half the lives a few messages to a few hundred, so that the backlog crosses the
// disk (pager.go) before the kill and after it; else the default.
func crashWindow(seed uint64) BrokerOption {
	if seed%2 == 0 {
		return WithPageWindow(1 + int(seed/2%256))
	}
	return WithPageWindow(DefaultPageWindow)
}

// crashCheckpoints is how often a life of the child with seed, and the restart that checks it,
// take a checkpoint: in two lives in three every one to four segments, so that the kill comes
// between checkpoints and the restart replays the records after one; else the default.
func crashCheckpoints(seed uint64) BrokerOption {
	if seed%3 != 0 {
		return checkpointEveryOption(1 + int(seed/3%4))
	}
	return nil
}

func crashChild(dir string) {
	life, err := strconv.Atoi(os.Getenv(crashLifeEnv))
	must(err)
	seed, err := strconv.ParseUint(os.Getenv(crashSeedEnv), 10, 64)
	must(err)
	policy := map[string]SyncPolicy{"always": SyncAlways, "interval": SyncInterval(20 * time.Millisecond), "never": SyncNever}[os.Getenv(crashSyncEnv)]
	journal, err := os.OpenFile(filepath.Join(dir, fmt.Sprint("journal.", life)), os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o644)
	must(err)
	b, err := Open(filepath.Join(dir, "log"), WithSync(policy), crashWindow(seed), crashCheckpoints(seed))
	must(err)
	w := newCrashWorkload(b, journal, life)
	ctx := context.Background()
	if os.Getenv(crashLoopEnv) != "" {
		w.crashLoop(ctx, seed) // ended by the kill
		return
	}
	go w.consume(ctx, rand.New(rand.NewPCG(seed, 1))) // ended by the kill
	rng := rand.New(rand.NewPCG(seed, 2))
	for {
		w.step(ctx, rng)
	}
}

// killAfter kills the child cmd after d, unless it ends first, and waits for it; it sets when
// the crash began and when it was over in bounds, and returns what cmd.Wait returned.
func killAfter(cmd *exec.Cmd, d time.Duration, bounds *crashBounds) error {
	ended := make(chan error, 1)
	go func() { ended <- cmd.Wait() }()
	timer := time.NewTimer(d)
	defer timer.Stop()
	var err error
	select {
	case err = <-ended:
		bounds.at = time.Now().UnixNano()
	case <-timer.C:
		bounds.at = time.Now().UnixNano()
		if kerr := cmd.Process.Signal(syscall.SIGKILL); kerr != nil {
			return kerr
		}
		err = <-ended
	}
	bounds.over = time.Now().UnixNano()
	return err
}

// crashKills returns how many kills a kill test makes: WARREN_KILLS, default 3.
func crashKills(t *testing.T) int {
	if s := os.Getenv("WARREN_KILLS"); s != "" {
		kills, err := strconv.Atoi(s)
		require.NoError(t, err, "WARREN_KILLS")
		return kills
	}
	return 3
}

// TestKill9 kills a child process running the workload, WARREN_KILLS times (default 3), at a
// random moment under a random sync policy (a kill loses nothing confirmed under any), and
// checks what the restart gets back each time; the next child goes on from there. Its consumer
// takes from jobs through a Consume channel, whose deliveries count at dispatch; Get's count at
// receipt, as Gets are all that take from timed and dlq. The step's goroutine may be killed
// between a Get's return and its journal line.
func TestKill9(t *testing.T) {
	var stats crashStats
	chk := newCrashChecker(t, &stats, 1, "timed", "dlq")
	kill9(t, chk, crashKills(t), false, "always", "interval", "never")
	stats.report(t)
}

// TestKill9Loop is the crash loop: WARREN_KILLS kills (default 3; scripts/stress-long makes 200)
// of a child under load (crashLoop: four publishers, a slow Serve on jobs with deliveries
// waiting in its buffer, TTLs and dead-lettering), under SyncAlways, the default. Every restart
// must get back every confirmed message not acked, nothing never published, in order; acks may
// be lost only within killWindow, and the report gives how long before its kill each lost ack
// returned; a delivery that no handler received does not count towards the delivery limit, so
// a count may go up only by a delivery the journal knows of, but for one a worker, or the
// loop's Get, received just before the kill (at most one each per kill, counted).
func TestKill9Loop(t *testing.T) {
	var stats crashStats
	chk := newCrashChecker(t, &stats, crashWorkers+1+1+1, "jobs", "timed", "dlq") // the Serves' workers and the loop's Get
	kills := crashKills(t)
	kill9(t, chk, kills, true, "always")
	stats.report(t)
	t.Logf("%d kills: %d confirmed, 0 lost, 0 phantoms, 0 out of order (any fails the test); duplicates: %d acks lost (%d more than 10 ms before the kill), %d dead letters in two places",
		kills, stats.confirmed, stats.lostAcks, stats.lateAcks, stats.deadDups)
}

// kill9 runs kills lives of a child, the crash loop's if loop, each under a policy drawn from
// policies, killed at a random moment, and checks what each restart gets back with chk.
func kill9(t *testing.T, chk *crashChecker, kills int, loop bool, policies ...string) {
	seed := rand.Uint64()
	t.Logf("seed %d (the children's seeds derive from it; timing decides the rest)", seed)
	rng := rand.New(rand.NewPCG(seed, 9))
	dir := t.TempDir()
	checkpointed := 0
	for life := range kills {
		policy := policies[rng.IntN(len(policies))]
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		childSeed := rng.Uint64()
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, fmt.Sprint(crashLifeEnv, "=", life),
			fmt.Sprint(crashSeedEnv, "=", childSeed), crashSyncEnv+"="+policy)
		if loop {
			cmd.Env = append(cmd.Env, crashLoopEnv+"=1")
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		bounds := crashBounds{settled: killWindow}
		lifetime := time.Duration(100+rng.IntN(250)) * time.Millisecond
		if loop {
			lifetime = time.Duration(300+rng.IntN(500)) * time.Millisecond // for the backlog to build
		}
		how, err := "killed", killAfter(cmd, lifetime, &bounds)
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL:
		case strings.Contains(stderr.String(), "(*store).logEffects"):
			// A bug: TestDurableConcurrentQueues. The child's panic is a crash as good as a
			// kill; counted (report fails the test).
			how = "panicked in store.logEffects"
			chk.stats.childPanics++
		default:
			t.Fatalf("life %d: the child ended before the kill: %v\n%s", life, err, stderr.Bytes())
		}
		// Under -race, the child reports its races on stderr and goes on; the kill may cut the
		// last report short (a whole one ends with a line of "=").
		for i, report := range strings.Split(stderr.String(), "WARNING: DATA RACE")[1:] {
			if !strings.Contains(report, "\n==================") {
				continue
			}
			if !strings.Contains(report, "(*store).logEffects") { // TestDurableConcurrentQueues
				t.Fatalf("life %d: the child's race %d:%s", life, i, report)
			}
			chk.stats.childRaces++
		}
		// Down for a while: TTLs end meanwhile.
		time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)

		journal, err := os.ReadFile(filepath.Join(dir, fmt.Sprint("journal.", life)))
		if errors.Is(err, fs.ErrNotExist) {
			err = nil // killed before it made its journal (a loaded machine starts it slowly): nothing journaled
		}
		require.NoError(t, err)
		chk.seed = fmt.Sprintf("%s (%s), ", how, policy)
		chk.replay(life, journal, bounds)
		reopened := time.Now().UnixNano()
		b, err := Open(filepath.Join(dir, "log"), chk.listener(), crashWindow(childSeed), crashCheckpoints(childSeed))
		require.NoError(t, err, "life %d", life)
		if b.Recovery().Checkpoint {
			checkpointed++
		}
		require.True(t, chk.check(b, reopened), "life %d: the topology is lost", life)
		require.NoError(t, b.Close())
		t.Logf("life %d (%s): %s; %d messages to account for", life, policy, how, len(chk.msgs))
	}
	t.Logf("%d kills; %d restarts from a checkpoint and the records after it", kills, checkpointed)
}

// Power loss: the workload runs on MemFS in a synctest bubble, on one goroutine (its consumer is
// polled), so that a seed replays a run; each life ends with fs.Crash. The sync policy decides
// what may be lost.

// powerLoss runs the workload with a log of small segments (so that segments are synced whole,
// and removed, as the lives go) under sync on MemFS, for runs seeds from seed, each for three
// lives ended by a crash in mode, which may take publishes confirmed within published of it and
// settlements within settled; it checks each restart and returns what the checks saw.
func powerLoss(t *testing.T, seed uint64, runs int, sync wal.Options, mode wal.CrashMode, published, settled time.Duration) crashStats {
	sync.SegmentSize = 16 << 10
	var total crashStats
	for i := range runs {
		synctest.Test(t, func(t *testing.T) {
			seed := seed + uint64(i)
			rng := rand.New(rand.NewPCG(seed, 0))
			fs := wal.NewMemFS()
			// The power loss comes between two steps: the journal knows every delivery.
			chk := newCrashChecker(t, &total, 0, "timed", "dlq")
			chk.seed = fmt.Sprintf("seed %d (WARREN_POWERLOSS_SEED=%[1]d), ", seed)
			var journal bytes.Buffer
			// Half the seeds page their durable queues with a window of 1 to 8 messages, so that
			// the backlog crosses the disk (pager.go) as the lives go.
			opts := []BrokerOption{logOptions(sync), crashCheckpoints(seed)}
			if seed%2 == 0 {
				opts = append(opts, WithPageWindow(1+int(seed/2%8)))
			}
			for life := range 3 {
				journal.Reset()
				b, err := openBroker(fs, opts...)
				require.NoError(t, err)
				if life > 0 {
					total.opens++
					if b.Recovery().Checkpoint {
						total.fromCk++
					}
				}
				t.Cleanup(func() {
					if b != nil {
						b.Close()
					}
				})
				w := newCrashWorkload(b, &journal, life)
				w.pause = func() {
					// Whatever runs meanwhile (a queue's timer, the return of a Get's delivery)
					// runs alone, so that a seed replays a run and a crash comes between two
					// steps, and is ordered with the workload for the race detector by the
					// queues' locks.
					synctest.Wait()
					for _, q := range []*Queue{w.jobs, w.timed, w.dlq} {
						q.Len()
					}
				}
				for range 100 + rng.IntN(200) {
					w.step(context.Background(), rng)
					w.pause()
					time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
					w.pause()
				}
				at := time.Now().UnixNano()
				fs.Crash(mode, rng)
				b.Close() // the crashed log fails; the broker still closes
				time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)

				chk.replay(life, journal.Bytes(), crashBounds{at: at, over: at, published: published, settled: settled})
				reopened := time.Now().UnixNano()
				b, err = openBroker(fs, append(opts, chk.listener())...)
				if errors.Is(err, ErrCorrupt) && strings.Contains(err.Error(), "bad segment header") {
					chk.stats.tornHeader++ // a bug: TestDurableOpensAfterTornSegmentHeader
					break
				}
				require.NoError(t, err, chk.where)
				ok := chk.check(b, reopened)
				require.NoError(t, b.Close())
				if !ok {
					break
				}
			}
		})
	}
	return total
}

// powerLossSeeds returns the first seed and the number of runs: random and runs, unless
// WARREN_POWERLOSS_SEED (then one run) and WARREN_POWERLOSS_RUNS say otherwise.
func powerLossSeeds(t *testing.T, runs int) (uint64, int) {
	seed := rand.Uint64() >> 1
	if s := os.Getenv("WARREN_POWERLOSS_SEED"); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "WARREN_POWERLOSS_SEED")
		runs = 1
	}
	if s := os.Getenv("WARREN_POWERLOSS_RUNS"); s != "" {
		var err error
		runs, err = strconv.Atoi(s)
		require.NoError(t, err, "WARREN_POWERLOSS_RUNS")
	}
	t.Logf("seeds %d..%d (WARREN_POWERLOSS_SEED=s reruns seed s)", seed, seed+uint64(runs)-1)
	return seed, runs
}

// TestPowerLossSyncAlways: under SyncAlways a power loss takes no confirmed message, whatever
// the disk kept of what was not synced (nothing, or a torn tail); an ack may be lost only
// within FlushDelay, after which the log's flush timer writes and syncs it.
func TestPowerLossSyncAlways(t *testing.T) {
	for _, mode := range []wal.CrashMode{wal.KeepSynced, wal.TornTail} {
		t.Run(mode.String(), func(t *testing.T) {
			seed, runs := powerLossSeeds(t, 20)
			powerLoss(t, seed, runs, wal.Options{Sync: wal.SyncAlways}, mode, 0, time.Millisecond).report(t)
		})
	}
}

// TestPowerLossSyncInterval: under SyncInterval(d) a power loss takes at most what was confirmed
// in the last d before it (and settlements in the last d + FlushDelay). The log's own bound is
// TestLogSyncIntervalLoss; this is the broker's, with its acks, dead letters and delays.
func TestPowerLossSyncInterval(t *testing.T) {
	const d = 50 * time.Millisecond
	seed, runs := powerLossSeeds(t, 20)
	s := powerLoss(t, seed, runs, wal.Options{Sync: wal.SyncInterval, Interval: d}, wal.KeepSynced, d, d+time.Millisecond)
	s.report(t)
	if runs >= 10 {
		require.Positive(t, s.lostInBound, "no run lost a confirmed message: the bound was not tested")
	}
}

// TestPowerLossSyncNever: under SyncNever a power loss may take anything the log did not sync
// (it syncs a segment whole when it moves past it); what comes back must still be consistent:
// only what was published, in order, once, each delivery count within a life higher than the
// last.
func TestPowerLossSyncNever(t *testing.T) {
	for _, mode := range []wal.CrashMode{wal.KeepSynced, wal.TornTail} {
		t.Run(mode.String(), func(t *testing.T) {
			seed, runs := powerLossSeeds(t, 20)
			powerLoss(t, seed, runs, wal.Options{Sync: wal.SyncNever}, mode, crashLoseAll, crashLoseAll).report(t)
		})
	}
}

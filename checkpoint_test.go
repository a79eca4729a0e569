package warren

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"maps"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/wal"
)

// Checkpoints (checkpoint.go): a checkpoint can make Open faster, never different. The tests
// open the same log twice, once with the checkpoint a clean Close left beside it and once
// without (the replay of the whole log), and hold the two brokers to each other in lockstep:
// the same operations on both must give the same results, down to each delivery's count and
// headers, each queue's counters and the events of what expired at open. A damaged, stale or
// unwritable checkpoint must leave Open where the replay takes it.

// ckWindows are the page windows the tests draw from: 0 never pages; 1 to 8 page nearly
// every message; -1 is the default (DefaultPageWindow), which nothing this small reaches.
var ckWindows = []int{0, 1, 2, 3, 4, 5, 6, 7, 8, -1}

// ckOptions are a durable broker's options with page window window (ckWindows), on small
// segments.
func ckOptions(window int, more ...BrokerOption) []BrokerOption {
	opts := []BrokerOption{logOptions(wal.Options{SegmentSize: 4096, Sync: wal.SyncNever})}
	if window >= 0 {
		opts = append(opts, WithPageWindow(window))
	}
	return append(opts, more...)
}

// ckQueues are the durable queues of ckTopology: a is a priority queue with a delivery limit,
// dead-lettering into dead-a; b has a queue TTL and dead-letters into dead-b; c is plain. The
// fanout exchange fan reaches a, b and the transient queue temp.
var ckQueues = []string{"a", "b", "c", "dead-a", "dead-b"}

// ckTopology declares ckQueues, fan and temp.
func ckTopology(t *testing.T, b *Broker) {
	t.Helper()
	_, err := b.DeclareExchange("fan", ExchangeFanout, Durable())
	require.NoError(t, err)
	durableQueue(t, b, "dead-a")
	durableQueue(t, b, "dead-b")
	durableQueue(t, b, "a", MaxPriority(5), DeliveryLimit(2), DeadLetter("", "dead-a"))
	durableQueue(t, b, "b", MessageTTL(300*time.Millisecond), DeadLetter("", "dead-b"))
	durableQueue(t, b, "c")
	_, err = b.DeclareQueue("temp")
	require.NoError(t, err)
	for _, q := range []string{"a", "b", "temp"} {
		require.NoError(t, b.Bind(q, "fan", "", nil))
	}
}

// ckEvents records, by queue, the events of what left a queue without a settlement: expired,
// dead-lettered, dropped. Within a queue they come in order; queues' timers may interleave.
type ckEvents struct {
	mu      sync.Mutex
	byQueue map[string][]string
}

func (e *ckEvents) listen(ev Event) {
	switch ev.Kind {
	case EventExpired, EventDeadLettered, EventDropped:
	default:
		return
	}
	body := ""
	if ev.Message != nil {
		body = string(ev.Message.Body)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.byQueue == nil {
		e.byQueue = map[string][]string{}
	}
	e.byQueue[ev.Queue] = append(e.byQueue[ev.Queue], fmt.Sprintf("%v %s %v", ev.Kind, body, ev.Reason))
}

// take returns what was recorded since the last take, a line per queue in name order.
func (e *ckEvents) take() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var sb strings.Builder
	for _, q := range slices.Sorted(maps.Keys(e.byQueue)) {
		fmt.Fprintf(&sb, "events %s: %s\n", q, strings.Join(e.byQueue[q], ", "))
	}
	e.byQueue = nil
	return sb.String()
}

// ckSide is one broker of a lockstep: the deliveries it holds unsettled, the events it heard.
type ckSide struct {
	b    *Broker
	fs   *wal.MemFS
	held []Delivery
	ev   *ckEvents
	// consumers are the consumers consume started, which never read.
	consumers []*Consumer
}

// openSide opens a broker on fs with opts, recording its events from the start.
func openSide(t *testing.T, fs *wal.MemFS, opts []BrokerOption) *ckSide {
	t.Helper()
	s := &ckSide{fs: fs, ev: &ckEvents{}}
	s.b = openTest(t, fs, append(slices.Clone(opts), WithListener(s.ev.listen))...)
	return s
}

// ckLockstep runs random operations on brokers that must behave alike: each operation is drawn
// once and done on every side, and each side must report what the first did.
type ckLockstep struct {
	t     *testing.T
	rng   *rand.Rand
	sides []*ckSide
	next  int // the next message's number
}

// do runs f on every side, once their earlier work is done, and requires each to return what
// the first did.
func (l *ckLockstep) do(what string, f func(s *ckSide) string) {
	l.t.Helper()
	synctest.Wait()
	var first string
	for i, s := range l.sides {
		got := f(s)
		if i == 0 {
			first = got
		} else {
			require.Equal(l.t, first, got, "%s: side %d differs from side 0", what, i)
		}
	}
}

// run does n random operations.
func (l *ckLockstep) run(n int) {
	for range n {
		switch r := l.rng.IntN(100); {
		case r < 40:
			l.publish()
		case r < 75:
			l.get()
		case r < 85:
			l.settleHeld()
		case r < 95:
			time.Sleep(time.Duration(1+l.rng.IntN(150)) * time.Millisecond) // every side's clock
		case r < 97:
			l.consume()
		default:
			q := []string{"a", "c"}[l.rng.IntN(2)]
			l.do("purge "+q, func(s *ckSide) string {
				n, err := s.b.Purge(q)
				return fmt.Sprint(n, err)
			})
		}
	}
	synctest.Wait()
}

// publish publishes one message, or a burst of them (which pages), to a queue through the
// default exchange or to fan: persistent or not, with a priority, headers, a TTL and a delay
// drawn.
func (l *ckLockstep) publish() {
	rng := l.rng
	exchange, key := "", ckQueues[rng.IntN(3)]
	if rng.IntN(3) == 0 {
		exchange, key = "fan", ""
	}
	k := 1
	if rng.IntN(4) == 0 {
		k = 3 + rng.IntN(12)
	}
	for range k {
		n := l.next
		l.next++
		m := Message{Body: fmt.Appendf(nil, "m%d", n), Persistent: rng.IntN(5) != 0, Priority: uint8(rng.IntN(8))}
		if rng.IntN(3) == 0 {
			m.Headers = Table{"n": int32(n), "kind": "k" + fmt.Sprint(n%3)}
		}
		var opts []PublishOption
		if rng.IntN(4) == 0 {
			opts = append(opts, ExpireAfter(time.Duration(10+rng.IntN(400))*time.Millisecond))
		}
		if rng.IntN(6) == 0 {
			opts = append(opts, DeliverAfter(time.Duration(1+rng.IntN(300))*time.Millisecond))
		}
		l.do("publish", func(s *ckSide) string {
			return fmt.Sprint(s.b.Publish(context.Background(), exchange, key, m, opts...))
		})
	}
}

// consume starts a consumer on a queue, with a small prefetch, which never reads: what it is
// sent is out until the broker closes (at most two a side).
func (l *ckLockstep) consume() {
	if len(l.sides[0].consumers) >= 2 {
		return
	}
	q, prefetch := ckQueues[l.rng.IntN(len(ckQueues))], 1+l.rng.IntN(3)
	l.do("consume from "+q, func(s *ckSide) string {
		c, err := queueOf(l.t, s.b, q).Consume(context.Background(), Prefetch(prefetch))
		if err == nil {
			s.consumers = append(s.consumers, c)
		}
		return fmt.Sprint(err)
	})
}

// Settlements a random operation draws from.
const (
	ckAck = iota
	ckNack
	ckNackDelay
	ckReject
	ckHold
	ckSettlements
)

// get gets from a queue, and settles the delivery as drawn, or holds it.
func (l *ckLockstep) get() {
	q := ckQueues[l.rng.IntN(len(ckQueues))]
	how, delay := l.rng.IntN(ckSettlements), time.Duration(1+l.rng.IntN(200))*time.Millisecond
	l.do("get from "+q, func(s *ckSide) string {
		d, err := queueOf(l.t, s.b, q).Get(context.Background())
		if err != nil {
			return err.Error()
		}
		return describe(d) + " " + s.settle(d, how, delay)
	})
}

// settleHeld settles a delivery held, as drawn.
func (l *ckLockstep) settleHeld() {
	if len(l.sides[0].held) == 0 {
		return
	}
	i, how, delay := l.rng.IntN(len(l.sides[0].held)), l.rng.IntN(ckHold), time.Duration(1+l.rng.IntN(200))*time.Millisecond
	l.do("settle held", func(s *ckSide) string {
		d := s.held[i]
		s.held = slices.Delete(s.held, i, i+1)
		return s.settle(d, how, delay)
	})
}

// settle settles d as how says, or holds it (at most a few at a time).
func (s *ckSide) settle(d Delivery, how int, delay time.Duration) string {
	var err error
	switch how {
	case ckNack:
		err = d.Nack()
	case ckNackDelay:
		err = d.NackWithDelay(delay)
	case ckReject:
		err = d.Reject()
	case ckHold:
		if len(s.held) < 6 {
			s.held = append(s.held, d)
			return "held"
		}
		fallthrough
	default:
		err = d.Ack()
	}
	return fmt.Sprint(how, err)
}

// describe renders a delivery: everything it says of the message and of itself.
func describe(d Delivery) string {
	m := d.Message
	return fmt.Sprintf("%s ex=%q key=%q redelivered=%v count=%d tag=%d left=%d persistent=%v priority=%d expiration=%q headers=%v",
		m.Body, d.Exchange, d.RoutingKey, d.Redelivered, d.DeliveryCount, d.DeliveryTag, d.MessageCount,
		m.Persistent, m.Priority, m.Expiration, m.Headers)
}

// queueOf returns b's queue named name.
func queueOf(t *testing.T, b *Broker, name string) *Queue {
	t.Helper()
	q, err := b.Queue(name)
	require.NoError(t, err)
	return q
}

// state renders what a side's broker holds, without changing it: its topology, each queue's
// stats (but the oldest message's age, which a restore samples anew), how many bodies the
// store counts live, and the events heard since the last look.
func (s *ckSide) state(t *testing.T) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%+v\n", s.b.Topology())
	for _, name := range queueNames(s.b) {
		st := queueOf(t, s.b, name).Stats()
		st.OldestAge = 0
		fmt.Fprintf(&sb, "%+v\n", st)
	}
	fmt.Fprintf(&sb, "live bodies: %d\n", s.live(0)[0])
	return sb.String() + s.ev.take()
}

// live returns how many bodies the queues need in each segment before segment end, by the
// store's count, and their total at 0. Two logs may place them differently (compaction rewrites
// what it finds worth it; what Open writes, dead letters and settlements, may fill a segment
// sooner in one than in the other) and hold the same.
func (s *ckSide) live(end uint64) map[uint64]int {
	s.b.store.mu.Lock()
	defer s.b.store.mu.Unlock()
	m := map[uint64]int{}
	for seg, u := range s.b.store.live {
		if seg < end {
			m[seg] = u.bodies
		}
		m[0] += u.bodies
	}
	return m
}

// end returns the segment where the log the checkpoint stands for ended: the first that Open
// writes to. Without a checkpoint, every segment.
func (ck *checkpoint) end() uint64 {
	if ck == nil {
		return math.MaxUint64
	}
	return ck.mark.Seg
}

// drain gets every ready message of every queue (queueNames: by name), in order, acking each.
func (l *ckLockstep) drain() {
	for _, q := range queueNames(l.sides[0].b) {
		l.do("drain "+q, func(s *ckSide) string {
			var out []string
			for {
				d, err := queueOf(l.t, s.b, q).Get(context.Background())
				if err != nil {
					return strings.Join(append(out, err.Error()), "\n")
				}
				out = append(out, describe(d), fmt.Sprint(d.Ack()))
			}
		})
	}
}

// check requires the sides' states to be alike, and what Open found (but whether from a
// checkpoint).
func (l *ckLockstep) check(what string) {
	l.do(what, func(s *ckSide) string {
		r := s.b.Recovery()
		r.Checkpoint = false
		return fmt.Sprintf("%+v\n", r) + s.state(l.t)
	})
}

// finish drains every side, lets every delay and TTL run out, drains again, and compares what
// the sides heard.
func (l *ckLockstep) finish() {
	l.drain()
	time.Sleep(2 * time.Second)
	l.drain()
	l.check("after the drains")
}

// closeAll closes every side's broker.
func (l *ckLockstep) closeAll() {
	l.do("close", func(s *ckSide) string { return fmt.Sprint(s.b.Close()) })
}

// ckWritten returns the newest checkpoint in fs, decoded, or nil if there is none.
func ckWritten(t *testing.T, fs *wal.MemFS) *checkpoint {
	t.Helper()
	cks, errs := readCheckpoints(fs)
	require.Empty(t, errs, "checkpoints the broker wrote")
	if len(cks) == 0 {
		return nil
	}
	return cks[0]
}

// ckOnly leaves fs with its newest checkpoint alone, and returns its file's name.
func ckOnly(t *testing.T, fs *wal.MemFS) string {
	t.Helper()
	ck := ckWritten(t, fs)
	require.NotNil(t, ck)
	if other := checkpointFiles[(ck.seq+1)%2]; fs.Contents(other) != nil {
		require.NoError(t, fs.Remove(other))
	}
	return checkpointFiles[ck.seq%2]
}

// usable reports whether a broker with page window window may open from ck: one that does not
// page cannot take chunks, and replays the log.
func (ck *checkpoint) usable(window int) bool {
	return ck != nil && (window != 0 || !slices.ContainsFunc(ck.queues, func(q ckQueue) bool { return len(q.chunks) > 0 }))
}

// withoutCheckpoint returns a copy of fs without its checkpoint: what Open replays in full.
func withoutCheckpoint(t *testing.T, fs *wal.MemFS) *wal.MemFS {
	t.Helper()
	c := fs.Clone()
	require.NoError(t, removeCheckpoints(c))
	return c
}

var (
	ckSeedsFlag = flag.Int("warren.ckseeds", 0, "seeds of TestCheckpointSameAsReplay; 0: 60, 25 with -short")
	ckFromFlag  = flag.Uint64("warren.ckfrom", 0, "the first seed of TestCheckpointSameAsReplay")
)

// TestCheckpointSameAsReplay: for many random workloads (persistent and transient messages,
// priorities, per-message and queue TTLs, dead-lettering, delays, nacks, rejects, Gets and
// consumers' deliveries out at Close, purges, fan-out; page windows from none to one message,
// sometimes another at the reopen; TTLs running out while the broker is down), the broker Open
// makes from a clean Close's checkpoint is the one it makes by replaying the whole log: the
// same topology, stats, live bodies by segment and events at open, and the same results for
// the same operations after, every delivery compared. A second life on each, closed in turn,
// reopens alike too: with its own checkpoint, and by replay (what the first life's store kept
// of the segments held what the queues needed). Under testing/synctest, so that every side
// sees the same clock.
//
// Seeds: -warren.ckseeds of them from -warren.ckfrom; 60 by default (about 9 s under -race on
// two cores), 25 with -short.
func TestCheckpointSameAsReplay(t *testing.T) {
	seeds := *ckSeedsFlag
	if seeds <= 0 {
		seeds = 60
		if testing.Short() {
			seeds = 25
		}
	}
	var written, used int // of the first lives: checkpoints Close wrote, and Open used
	for seed := *ckFromFlag; seed < *ckFromFlag+uint64(seeds); seed++ {
		synctest.Test(t, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x636b))
			window := ckWindows[rng.IntN(len(ckWindows))]
			reopen := window // a third of the time, another
			if rng.IntN(3) == 0 {
				reopen = ckWindows[rng.IntN(len(ckWindows))]
			}
			defer func() {
				if t.Failed() {
					t.Logf("seed %d: window %d, reopened with %d", seed, window, reopen)
				}
			}()

			fs := wal.NewMemFS()
			first := &ckLockstep{t: t, rng: rng, sides: []*ckSide{openSide(t, fs, ckOptions(window))}}
			defer first.sides[0].b.Close()
			ckTopology(t, first.sides[0].b)
			first.run(40 + rng.IntN(80))
			first.closeAll()
			ck := ckWritten(t, fs)
			if ck != nil {
				written++
			}
			time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond) // the broker is down: TTLs run out

			// Opened from the checkpoint, and from the whole log.
			replayFS := withoutCheckpoint(t, fs) // before the other Open writes to fs
			second := &ckLockstep{t: t, rng: rng, next: first.next, sides: []*ckSide{
				openSide(t, fs, ckOptions(reopen)),
				openSide(t, replayFS, ckOptions(reopen)),
			}}
			for _, s := range second.sides {
				defer s.b.Close()
			}
			fromCk := second.sides[0].b.Recovery()
			if ck.usable(reopen) { // else an older one may be, or none
				require.True(t, fromCk.Checkpoint, "Recovery.Checkpoint")
			}
			require.False(t, second.sides[1].b.Recovery().Checkpoint)
			if fromCk.Checkpoint {
				used++
			}
			second.check("at open")
			require.Equal(t, second.sides[1].live(ck.end()), second.sides[0].live(ck.end()), "the segments each needs, opened from one log")
			second.run(20 + rng.IntN(40))
			second.check("after the second life")
			second.closeAll()
			ck2 := ckWritten(t, second.sides[0].fs)
			time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond)

			// The first side's log with its checkpoint and without, and the second's without.
			replayA, replayB := withoutCheckpoint(t, second.sides[0].fs), withoutCheckpoint(t, second.sides[1].fs)
			third := &ckLockstep{t: t, rng: rng, next: second.next, sides: []*ckSide{
				openSide(t, replayA, ckOptions(reopen)),
				openSide(t, second.sides[0].fs, ckOptions(reopen)),
				openSide(t, replayB, ckOptions(reopen)),
			}}
			for _, s := range third.sides {
				defer s.b.Close()
			}
			if ck2.usable(reopen) {
				require.True(t, third.sides[1].b.Recovery().Checkpoint)
			}
			third.check("at the third open")
			require.Equal(t, third.sides[0].live(ck2.end()), third.sides[1].live(ck2.end()), "the segments each needs, opened from one log")
			third.finish()
			third.closeAll()
		})
		if t.Failed() {
			t.Fatalf("seed %d failed", seed)
		}
	}
	t.Logf("%d seeds: %d checkpoints written at the first Close, %d used", seeds, written, used)
	require.Greater(t, written, seeds*3/4, "Close wrote a checkpoint for most workloads")
	require.Positive(t, used)
}

// ckLife runs the first life of seed's workload (steps operations, then backlog messages more
// to queue c) on a fresh MemFS with opts, and returns its broker, open. The caller is in a
// bubble.
func ckLife(t *testing.T, seed uint64, opts []BrokerOption, steps, backlog int) *ckSide {
	t.Helper()
	l := &ckLockstep{t: t, rng: rand.New(rand.NewPCG(seed, 1)), sides: []*ckSide{openSide(t, wal.NewMemFS(), opts)}}
	ckTopology(t, l.sides[0].b)
	l.run(steps)
	for i := range backlog {
		persistent(t, l.sides[0].b, "c", fmt.Sprint("backlog ", i))
	}
	synctest.Wait()
	return l.sides[0]
}

// ckClosed closes ckLife's broker, which writes a checkpoint, and returns its file system.
func ckClosed(t *testing.T, seed uint64, opts []BrokerOption, steps, backlog int) *wal.MemFS {
	t.Helper()
	s := ckLife(t, seed, opts, steps, backlog)
	require.NoError(t, s.b.Close())
	require.NotNil(t, ckWritten(t, s.fs), "Close wrote a checkpoint")
	return s.fs
}

// ckSame opens a broker on each of fss, at this instant, with opts, requires them alike (what
// Open found, the state, and a drain of every queue) and closes them; it returns what each Open
// found. The first is the reference: the replay of the log.
func ckSame(t *testing.T, opts []BrokerOption, fss ...*wal.MemFS) []Recovery {
	t.Helper()
	l := &ckLockstep{t: t}
	for _, fs := range fss {
		s := openSide(t, fs, opts)
		defer s.b.Close()
		l.sides = append(l.sides, s)
	}
	l.check("at open")
	l.drain()
	var rs []Recovery
	for _, s := range l.sides {
		rs = append(rs, s.b.Recovery())
	}
	l.closeAll()
	return rs
}

// TestCheckpointExpiredAtOpen: what expired while the broker was down is dead-lettered at open
// in the order of the queue, whichever of its messages Open holds in memory and on disk, and
// whether a delay ran out before the broker stopped (which no record says: the log still has
// the message delayed, a checkpoint has it ready) or after. Two bugs the differential test
// found: the restore expired the messages it kept in memory before those on disk, and put a
// message whose delay had run out among the delayed, to expire after all the others.
func TestCheckpointExpiredAtOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := wal.NewMemFS()
		opts := ckOptions(1)
		b := openTest(t, fs, opts...)
		defer b.Close()
		durableQueue(t, b, "dlq")
		q := durableQueue(t, b, "q", DeadLetter("", "dlq"))
		publish := func(body string, popts ...PublishOption) {
			m := Message{Body: []byte(body), Persistent: true}
			require.NoError(t, b.Publish(context.Background(), "", "q", m, append(popts, ExpireAfter(100*time.Millisecond))...))
		}
		publish("p1")
		publish("p2")
		publish("d3", DeliverAfter(10*time.Millisecond))
		publish("p4")
		time.Sleep(20 * time.Millisecond)
		synctest.Wait() // d3 is ready: in memory, behind p2 and p4 on disk
		require.Equal(t, 2, pagedLen(q))
		require.Equal(t, 2, q.Len()-pagedLen(q))
		require.NoError(t, b.Close())
		time.Sleep(time.Second) // every one expires while the broker is down

		replay := withoutCheckpoint(t, fs)
		for _, f := range []*wal.MemFS{fs, replay} {
			b := openTest(t, f, opts...)
			require.Equal(t, f == fs, b.Recovery().Checkpoint)
			require.Equal(t, []string{"p1", "p2", "d3", "p4"}, held(t, b, "dlq"),
				"in the queue's order, as had the broker not stopped (their deadlines are one instant)")
			require.NoError(t, b.Close())
		}
	})
}

// TestCheckpointServeBuffered: a delivery Serve's worker took comes back redelivered, those
// only buffered for the pool unchanged (the log holds no delivery of them), from the checkpoint
// as from the log.
func TestCheckpointServeBuffered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := wal.NewMemFS()
		for _, window := range []int{0, 2} {
			b := openTest(t, fs, ckOptions(window)...)
			q := durableQueue(t, b, "jobs")
			persistent(t, b, "jobs", "m1", "m2", "m3", "m4", "m5")
			served := make(chan error, 1)
			go func() {
				served <- q.Serve(context.Background(), func(ctx context.Context, d Delivery) error {
					<-ctx.Done() // holds m1 until the broker closes
					return ctx.Err()
				}, Workers(1), Prefetch(3))
			}()
			synctest.Wait()
			require.Equal(t, 3, q.Unacked(), "m1 with the worker, m2 and m3 buffered")
			require.NoError(t, b.Close())
			require.ErrorIs(t, <-served, ErrClosed)

			rs := ckSame(t, ckOptions(window), withoutCheckpoint(t, fs), fs.Clone())
			require.True(t, rs[1].Checkpoint)
			b = openTest(t, fs, ckOptions(window)...)
			require.True(t, b.Recovery().Checkpoint)
			require.Equal(t, []string{"m1(1)", "m2", "m3", "m4", "m5"}, held(t, b, "jobs"))
			_, err := b.DeleteQueue("jobs")
			require.NoError(t, err)
			require.NoError(t, b.Close())
		}
	})
}

// TestCheckpointDamaged: a checkpoint with a byte flipped (each byte in turn), cut short (at
// many lengths) or with a byte more is not used: Open replays the log, without an error, to
// what the replay without the checkpoint gives.
func TestCheckpointDamaged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		opts := ckOptions(2)
		fs := ckClosed(t, 7, opts, 20, 0)
		name := ckOnly(t, fs)
		raw := fs.Contents(name)
		truth := withoutCheckpoint(t, fs)
		_, err := decodeCheckpoint(raw)
		require.NoError(t, err)
		try := func(what string, bad []byte) {
			t.Helper()
			c := fs.Clone()
			rewrite(t, c, name, bad)
			rs := ckSame(t, opts, truth.Clone(), c)
			require.False(t, rs[1].Checkpoint, "%s: used", what)
		}
		for i := range raw {
			bad := slices.Clone(raw)
			bad[i] ^= 1 << (i % 8)
			try(fmt.Sprintf("byte %d of %d flipped", i, len(raw)), bad)
		}
		for n := 0; n < len(raw); n += 1 + n/4 {
			try(fmt.Sprintf("cut to %d of %d bytes", n, len(raw)), raw[:n])
		}
		try("a byte more", append(slices.Clone(raw), 0))
		rs := ckSame(t, opts, truth.Clone(), fs.Clone())
		require.True(t, rs[1].Checkpoint, "the checkpoint as written is used")
		t.Logf("a checkpoint of %d bytes", len(raw))
	})
}

// TestCheckpointsWhileRunning: a broker publishing into a paged backlog takes a checkpoint every
// few segments, whatever it is doing meanwhile (a checkpoint taken while the next one came due
// used to swallow the trigger, and none followed); a crash after them opens from the newest,
// replaying only the records after it, with every confirmed message back once, in order, and the
// backlog on disk but for about a window.
func TestCheckpointsWhileRunning(t *testing.T) {
	const every, batches = 4, 120
	fs := wal.NewMemFS()
	opts := []BrokerOption{checkpointEveryOption(every), WithPageWindow(64),
		logOptions(wal.Options{SegmentSize: 16 << 10, Sync: wal.SyncNever})}
	b, err := openBroker(fs, opts...)
	require.NoError(t, err)
	durableQueue(t, b, "q")
	batch := make([]Publishing, 256)
	n := 0
	publish := func(batches int) {
		for range batches {
			for j := range batch {
				batch[j] = Publishing{Key: "q", Message: Message{Body: fmt.Appendf(nil, "m%06d", n), Persistent: true}}
				n++
			}
			require.NoError(t, b.PublishBatch(context.Background(), batch))
		}
	}
	publish(batches)
	q := lookup(t, b, "q")
	acked := n / 4
	for i := range acked { // acks among them: settles of messages in the checkpoints' chunks
		d, err := q.Get(context.Background())
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("m%06d", i), string(d.Message.Body))
		require.NoError(t, d.Ack())
	}
	b.store.mu.Lock()
	segs, written := b.store.lastSeg, b.store.checkpoints
	b.store.mu.Unlock()
	require.Greater(t, segs, uint64(40))
	require.GreaterOrEqual(t, written, segs/every/2, "a checkpoint every %d segments or so, over %d", every, segs)
	stopCompactor(b) // no checkpoint after this: the crash replays 20 batches over the last one
	publish(20)
	require.NoError(t, b.store.log.Sync())

	crashed := fs.Clone() // what a kill -9 leaves: what was written stays
	r, err := openBroker(crashed, opts...)
	require.NoError(t, err)
	defer r.Close()
	require.True(t, r.Recovery().Checkpoint)
	rq := lookup(t, r, "q")
	require.Equal(t, n-acked, rq.Len())
	require.Greater(t, pagedLen(rq), rq.Len()-4*64, "what the records after the mark brought, newer than the chunks, is on disk too")
	for i := acked; i < n; i++ {
		d, err := rq.Get(context.Background())
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("m%06d", i), string(d.Message.Body))
		require.NoError(t, d.Ack())
	}
	_, err = rq.Get(context.Background())
	require.ErrorIs(t, err, ErrEmpty)
	require.NoError(t, b.Close())
}

// TestCheckpointCrashSameAsReplay: a process crash after checkpoints taken while the broker ran
// (one every segment of 4 KiB, and after each compaction pass) opens to what the replay of the
// whole log gives: the newest checkpoint, and the records after its mark replayed over it —
// those its snapshots already show, settles of messages in its chunks, deliveries and returns
// of messages read back from them since, compaction's placements elsewhere.
func TestCheckpointCrashSameAsReplay(t *testing.T) {
	seeds, used := 40, 0
	if testing.Short() {
		seeds = 15
	}
	for seed := range uint64(seeds) {
		synctest.Test(t, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x637261))
			window := ckWindows[rng.IntN(len(ckWindows))]
			opts := ckOptions(window, checkpointEveryOption(1))
			defer func() {
				if t.Failed() {
					t.Logf("seed %d: window %d", seed, window)
				}
			}()
			fs := wal.NewMemFS()
			l := &ckLockstep{t: t, rng: rng, sides: []*ckSide{openSide(t, fs, opts)}}
			ckTopology(t, l.sides[0].b)
			l.run(60 + rng.IntN(120))
			require.NoError(t, l.sides[0].b.store.log.WaitWritten(context.Background(), 0))
			crashed := fs.Clone() // what a kill -9 leaves: everything written, no Close
			l.closeAll()
			time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond)
			rs := ckSame(t, opts, withoutCheckpoint(t, crashed), crashed)
			require.False(t, rs[0].Checkpoint)
			if rs[1].Checkpoint {
				used++
			}
		})
		if t.Failed() {
			t.Fatalf("seed %d failed", seed)
		}
	}
	t.Logf("%d seeds: %d opened from a checkpoint and the records after it", seeds, used)
	require.Greater(t, used, seeds/2, "most crashes open from a checkpoint")
}

// TestCheckpointStale: a checkpoint older than the log — put back after a later life wrote to
// the log and closed cleanly, or after a later life was killed, alone — opens to what the replay
// without it gives: from it and the records after its mark, or, if its mark is gone from the
// log, by the replay.
func TestCheckpointStale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		opts := ckOptions(3)
		fs := ckClosed(t, 11, opts, 40, 0)
		oldName := ckOnly(t, fs)
		old := fs.Contents(oldName)
		l := &ckLockstep{t: t, rng: rand.New(rand.NewPCG(11, 2)), next: 1 << 20, sides: []*ckSide{openSide(t, fs, opts)}}
		defer l.sides[0].b.Close()
		require.True(t, l.sides[0].b.Recovery().Checkpoint)
		l.run(30)
		require.NoError(t, l.sides[0].b.store.log.Sync()) // what the second life did is in its files
		killed := fs.Clone()
		killed.Crash(wal.KeepWritten, nil) // a kill -9 of the second life
		l.closeAll()
		require.NotNil(t, ckWritten(t, fs), "the second life's own")

		for _, f := range []*wal.MemFS{fs, killed} {
			stale := withoutCheckpoint(t, f)
			file, err := stale.Create(oldName) // rewrite replaces a file
			require.NoError(t, err)
			require.NoError(t, file.Close())
			rewrite(t, stale, oldName, old)
			ckSame(t, opts, withoutCheckpoint(t, f), stale)
		}
	})
}

// TestCheckpointLogDamaged: damage to the log after a clean Close — each segment in turn removed,
// its header damaged, a byte of its records flipped; with and without WithSalvage — never
// makes Open from the checkpoint worse than the replay. Where Open needs what was damaged (a
// segment file before the mark, a body it reads back), it replays the whole log and does what
// the replay of the damaged log does: fail with ErrCorrupt, or, salvaging, make the same
// broker; from the mark on it reads the log as the replay does. Where it needs nothing damaged
// (a header before the mark is not read: the checkpoint knows the segments' first records), it
// restores what the log held before the damage; a chunk whose segment was damaged, not read at
// open, is not dropped: its messages stay in the queue, counted, and Get says it cannot read
// them.
func TestCheckpointLogDamaged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		small := logOptions(wal.Options{SegmentSize: 1024, Sync: wal.SyncNever}) // more segments
		fs := ckClosed(t, 13, ckOptions(2, small), 30, 150)
		ck := ckWritten(t, fs)
		needed := map[uint64]bool{ck.mark.Seg: true} // the segments Open from the checkpoint reads
		for _, b := range ck.bodies {
			needed[b.seg] = true
		}
		damages := []struct {
			kind   string
			damage func(f *wal.MemFS, name string)
		}{
			{"removed", func(f *wal.MemFS, name string) { require.NoError(t, f.Remove(name)) }},
			{"header", func(f *wal.MemFS, name string) { corruptByte(t, f, name, 20) }},
			{"record", func(f *wal.MemFS, name string) { corruptByte(t, f, name, max(100, len(f.Contents(name))/2)) }},
		}
		var used, replayed, failed, stuck int
		for _, salvage := range []bool{false, true} {
			opts := ckOptions(2, small)
			if salvage {
				opts = append(opts, WithSalvage())
			}
			for _, name := range segmentNames(t, fs) {
				var seg uint64
				_, err := fmt.Sscanf(name, "%x.wal", &seg)
				require.NoError(t, err)
				for _, d := range damages {
					if d.kind == "record" && len(fs.Contents(name)) <= 100 {
						continue // no record: the mark's empty segment
					}
					what := fmt.Sprintf("%s: %s, salvage %v", name, d.kind, salvage)
					damaged := fs.Clone()
					d.damage(damaged, name)
					replay := withoutCheckpoint(t, damaged)
					b, err := openBroker(damaged.Clone(), opts...)
					rb, rerr := openBroker(replay.Clone(), opts...)
					for _, b := range []*Broker{b, rb} {
						if b != nil {
							require.NoError(t, b.Close())
						}
					}
					switch {
					case err != nil:
						failed++
						require.ErrorIs(t, err, ErrCorrupt, what)
						require.ErrorIs(t, rerr, ErrCorrupt, "%s: the replay fails too", what)
					case !b.Recovery().Checkpoint:
						replayed++
						require.NoError(t, rerr, "%s: the replay fails, the fallback does not", what)
						ckSame(t, opts, replay, damaged)
					case seg >= ck.mark.Seg:
						// From the mark on, Open from the checkpoint reads the log as the
						// replay does: it finds the damage, or cuts it as a torn end.
						used++
						ckSame(t, opts, replay, damaged)
					default:
						used++
						require.False(t, d.kind == "removed" && needed[seg], "%s: used the checkpoint", what)
						if ckDamagedChunks(t, opts, withoutCheckpoint(t, fs), damaged, what) {
							stuck++
						}
					}
				}
			}
		}
		t.Logf("of the damaged logs, %d opened from the checkpoint (%d with a chunk they could not read), %d replayed, %d refused",
			used, stuck, replayed, failed)
		require.Positive(t, stuck)
		require.Positive(t, replayed)
		require.Positive(t, failed)
	})
}

// ckDamagedChunks requires the broker Open makes from damaged, whose checkpoint it uses, alike
// to the one it makes from truth, the undamaged log, but for the chunks it cannot read back:
// each queue holds what truth's holds, in order, up to where Get fails to read on (an error
// wrapping ErrStorage; it tries again later), and counts what it could not read. It reports whether
// a queue could not read on.
func ckDamagedChunks(t *testing.T, opts []BrokerOption, truth, damaged *wal.MemFS, what string) (stuck bool) {
	t.Helper()
	l := &ckLockstep{t: t, sides: []*ckSide{openSide(t, truth, opts), openSide(t, damaged, opts)}}
	require.True(t, l.sides[1].b.Recovery().Checkpoint)
	l.check(what + ": at open")
	for _, name := range queueNames(l.sides[0].b) {
		var got [2][]string
		for i, s := range l.sides {
			q := queueOf(t, s.b, name)
			for {
				d, err := q.Get(context.Background())
				if err != nil {
					if i == 0 || q.Len() == 0 {
						require.ErrorIs(t, err, ErrEmpty)
					} else {
						require.ErrorIs(t, err, ErrStorage, "what it cannot read, it says so")
					}
					break
				}
				got[i] = append(got[i], describe(d))
				require.NoError(t, d.Ack())
			}
			if i == 1 {
				require.Equal(t, len(got[0])-len(got[1]), q.Len(), "%s: queue %s counts what it cannot read", what, name)
			}
		}
		require.Equal(t, got[0][:len(got[1])], got[1], "%s: queue %s", what, name)
		stuck = stuck || len(got[1]) < len(got[0])
	}
	l.closeAll()
	return stuck
}

// TestCheckpointCrashAfterOpen: after a checkpointed Open and a life of appends, a crash (a kill
// -9, a power loss) reopens to what the same life and crash give a broker opened by the replay:
// from the checkpoint the first Open read and the records after its mark, all of this life's.
func TestCheckpointCrashAfterOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		opts := ckOptions(2)
		fs := ckClosed(t, 17, opts, 40, 50)
		replayFS := withoutCheckpoint(t, fs)
		l := &ckLockstep{t: t, rng: rand.New(rand.NewPCG(17, 2)), next: 1 << 20,
			sides: []*ckSide{openSide(t, fs, opts), openSide(t, replayFS, opts)}}
		for _, s := range l.sides {
			defer s.b.Close()
		}
		require.True(t, l.sides[0].b.Recovery().Checkpoint)

		l.run(40)
		for _, s := range l.sides {
			require.NoError(t, s.b.store.log.Sync()) // each log's files hold the same records
		}
		lost := fs.Clone()
		lost.Crash(wal.TornTail, rand.New(rand.NewPCG(17, 3)))
		l.do("kill -9", func(s *ckSide) string {
			s.fs.Crash(wal.KeepWritten, nil)
			require.Error(t, s.b.Close(), "the crashed log fails")
			return ""
		})
		rs := ckSame(t, opts, replayFS, fs)
		require.True(t, rs[1].Checkpoint, "from the first life's checkpoint, the second life's records replayed")

		b := openTest(t, lost, opts...) // after a power loss
		require.NoError(t, b.Close())
	})
}

// TestCheckpointWriteFails: a Close whose checkpoint cannot be written (a write fails, or is cut
// short; a sync fails, keeping or dropping what it did not make durable; the directory's sync
// fails; the disk is full) succeeds, unless the log's own close failed, and leaves no checkpoint
// that a later Open uses wrongly: Open makes what the replay makes. Each fault is tried at each
// of the first writes or syncs Close makes, the log's and the checkpoint's (the disk full at
// each of a few sizes).
func TestCheckpointWriteFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		injected := errors.New("injected")
		const window = 2
		faults := []struct {
			name string
			arm  func(fs *wal.MemFS, k int)
		}{
			{"write", func(fs *wal.MemFS, k int) { fs.FailWrite(k, injected, nil) }},
			{"short write", func(fs *wal.MemFS, k int) { fs.FailWrite(k, injected, rand.New(rand.NewPCG(uint64(k), 1))) }},
			{"sync", func(fs *wal.MemFS, k int) { fs.FailSync(k, injected, wal.KeepUnsynced) }},
			{"sync dropping", func(fs *wal.MemFS, k int) { fs.FailSync(k, injected, wal.DropUnsynced) }},
			{"directory sync", func(fs *wal.MemFS, k int) { fs.FailSyncDir(k, injected) }},
			{"disk full", func(fs *wal.MemFS, k int) { fs.Capacity(fs.Used() + int64(k)*128) }},
		}
		var quiet, failed, written int // Closes without a checkpoint and no error; with an error; with one
		for _, f := range faults {
			hit := false // the fault made the checkpoint's write fail, not the log's
			for k := range 8 {
				what := fmt.Sprintf("%s at %d", f.name, k)
				s := ckLife(t, 19, ckOptions(window), 30, 40)
				f.arm(s.fs, k)
				err := s.b.Close()
				s.fs.FailWrite(-1, nil, nil)
				s.fs.FailSync(-1, nil, wal.KeepUnsynced)
				s.fs.FailSyncDir(-1, nil)
				s.fs.Capacity(-1)
				// What is left of the Close's checkpoint, if anything, must be whole or fail its
				// checksum; an older one may be there too, as good as it was.
				seq := s.b.store.checkpoints
				raw := s.fs.Contents(checkpointFiles[seq%2])
				got, derr := decodeCheckpoint(raw)
				ck := raw != nil && derr == nil && got.seq == seq
				switch {
				case err != nil:
					failed++
					require.ErrorIs(t, err, ErrStorage, what)
					require.False(t, ck, "%s: the Close of a log that failed wrote one", what)
				case !ck:
					quiet++
					hit = true
				default:
					written++
				}
				rs := ckSame(t, ckOptions(window), withoutCheckpoint(t, s.fs), s.fs)
				if ck {
					require.True(t, rs[1].Checkpoint, what)
				}
			}
			require.True(t, hit, "%s: never made the checkpoint's write fail", f.name)
		}
		t.Logf("Closes: %d failed, %d wrote no checkpoint and succeeded, %d wrote one", failed, quiet, written)
		require.Positive(t, failed, "no fault hit the log's close")
	})
}

// TestCheckpointChecksummed: a checkpoint damaged in a way its checksum does not see (each
// byte flipped in turn, the checksum made again: a bug's, not a disk's) must not make Open
// panic nor leave a queue spinning: Open may fail (a topology record no longer makes sense),
// replay the log (the file does not decode), or restore what it says; what it restored drains,
// and its timers come to rest.
func TestCheckpointChecksummed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		opts := ckOptions(2)
		fs := ckClosed(t, 31, opts, 15, 0)
		name := ckOnly(t, fs)
		raw := fs.Contents(name)
		outcomes := map[string]int{}
		for i := len(checkpointMagic); i < len(raw)-4; i++ {
			bad := slices.Clone(raw)
			bad[i] ^= 1 << (i % 8)
			body := bad[:len(bad)-4]
			binary.LittleEndian.PutUint32(bad[len(body):], crc32.Checksum(body, crcTable))
			c := fs.Clone()
			rewrite(t, c, name, bad)
			b, err := openBroker(c, opts...)
			switch {
			case err != nil:
				outcomes["refused"]++
				continue
			case b.Recovery().Checkpoint:
				outcomes["restored"]++
			default:
				outcomes["replayed"]++
			}
			for q := range b.Queues() {
				for {
					d, err := q.Get(context.Background())
					if err != nil {
						break
					}
					require.NoError(t, d.Ack())
				}
			}
			time.Sleep(time.Minute) // every TTL and delay runs out, every retry is made
			synctest.Wait()         // and nothing spins
			require.NoError(t, b.Close())
		}
		t.Logf("%d bytes flipped: %v", len(raw)-len(checkpointMagic)-4, outcomes)
		require.Positive(t, outcomes["restored"])
	})
}

// TestCheckpointCloseUnderLoad: a Close that comes while publishers, a consumer and a getter
// work (settling in every way, dead-lettering past a delivery limit, fanning out), or just after
// they stopped, with deliveries out, writes a checkpoint only if it stands for the log: Open
// from it makes what the replay makes. Real goroutines and time, under the race detector; no
// TTLs nor delays, so that two Opens a moment apart are alike.
func TestCheckpointCloseUnderLoad(t *testing.T) {
	var written, busyWritten int
	const rounds = 12
	for round := range rounds {
		window, busy := []int{0, 1, 3, -1}[round%4], round%2 == 0
		fs := wal.NewMemFS()
		b := openTest(t, fs, ckOptions(window)...)
		_, err := b.DeclareExchange("fan", ExchangeFanout, Durable())
		require.NoError(t, err)
		durableQueue(t, b, "dlq")
		jobs := durableQueue(t, b, "jobs", DeliveryLimit(1), DeadLetter("", "dlq"))
		other := durableQueue(t, b, "other", MaxPriority(3))
		require.NoError(t, b.Bind("jobs", "fan", "", nil))
		require.NoError(t, b.Bind("other", "fan", "", nil))

		var wg sync.WaitGroup
		var published atomic.Int64
		stop := make(chan struct{})
		stopped := func() bool {
			select {
			case <-stop:
				return true
			default:
				return false
			}
		}
		for p := range 2 {
			wg.Go(func() {
				for i := 0; !stopped(); i++ {
					m := Message{Body: fmt.Appendf(nil, "p%d-%d", p, i), Persistent: i%5 != 0, Priority: uint8(i % 4)}
					if b.Publish(context.Background(), "fan", "", m) != nil {
						return
					}
					published.Add(1)
				}
			})
		}
		wg.Go(func() { // Gets, settled in every way, some kept
			rng := rand.New(rand.NewPCG(uint64(round), 1))
			for !stopped() {
				d, err := []*Queue{jobs, other}[rng.IntN(2)].Get(context.Background())
				if errors.Is(err, ErrEmpty) {
					continue
				}
				if err != nil {
					return
				}
				switch rng.IntN(5) {
				case 0:
					d.Nack()
				case 1:
					d.Reject()
				case 2: // kept: out at the Close
				default:
					d.Ack()
				}
			}
		})
		c, err := other.Consume(context.Background(), Prefetch(4))
		require.NoError(t, err)
		wg.Go(func() { // what it has not read when it stops is out at the Close
			i := 0
			for d := range c.Deliveries() {
				if i++; i%3 == 0 {
					d.Nack()
				} else {
					d.Ack()
				}
				if stopped() {
					return
				}
			}
		})
		for published.Load() < 200 {
			runtime.Gosched()
		}
		if !busy {
			close(stop)
			wg.Wait()
		}
		require.NoError(t, b.Close())
		if busy {
			close(stop)
			wg.Wait()
		}

		ck := ckWritten(t, fs)
		if ck != nil {
			written++
			if busy {
				busyWritten++
			}
		}
		synctest.Test(t, func(t *testing.T) { // the comparison's Opens, in a bubble of their own
			rs := ckSame(t, ckOptions(window), withoutCheckpoint(t, fs), fs)
			require.Equal(t, ck.usable(window), rs[1].Checkpoint)
		})
	}
	t.Logf("%d of %d Closes wrote a checkpoint, %d of the %d under load", written, rounds, busyWritten, rounds/2)
	require.GreaterOrEqual(t, written, rounds/2, "every Close after the load stopped")
}

// TestCheckpointNotWhileHeldInMemory: a broker holding more messages in memory than
// checkpointMaxHeld (here a broker that does not page) takes no checkpoint while it runs — each
// would list them all under their queues' locks and write them again every interval — where one
// that pages takes them; Close takes one either way.
func TestCheckpointNotWhileHeldInMemory(t *testing.T) {
	for _, window := range []int{0, 64} {
		fs := wal.NewMemFS()
		b, err := openBroker(fs, checkpointEveryOption(1), WithPageWindow(window),
			logOptions(wal.Options{SegmentSize: 16 << 10, Sync: wal.SyncNever}))
		require.NoError(t, err)
		b.store.mu.Lock()
		b.store.maxHeld = 1000
		b.store.mu.Unlock()
		durableQueue(t, b, "q")
		batch := make([]Publishing, 256)
		publish := func(batches int) {
			for range batches {
				for j := range batch {
					batch[j] = Publishing{Key: "q", Message: Message{Body: make([]byte, 100), Persistent: true}}
				}
				require.NoError(t, b.PublishBatch(context.Background(), batch))
			}
		}
		checkpoints := func() uint64 {
			b.store.mu.Lock() // the compactor's goroutine counts them, under it too (write)
			defer b.store.mu.Unlock()
			return b.store.checkpoints
		}
		publish(8) // 2,048 messages: past 1,000 in memory, unless paged
		before := checkpoints()
		publish(32)
		stopCompactor(b) // its checkpoint in progress, if any, is done
		if window == 0 {
			require.Equal(t, before, checkpoints(), "over 1,000 messages in memory: none since")
		} else {
			require.Greater(t, checkpoints(), before, "paged: the window in memory")
		}
		require.NoError(t, b.Close())
		require.NotNil(t, ckWritten(t, fs), "Close's")
	}
}

package warren

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/wal"
)

// Recovery's picture: the records of a durable queue's life, replayed, leave RabbitMQ's picture
// after a restart (recovery.go).

// replayLog encodes records, decodes them again and replays them, one segment per record
// unless segs says otherwise.
func replayLog(t *testing.T, recs [][]byte, segs ...uint64) *replay {
	t.Helper()
	r := newReplay()
	for i, b := range recs {
		rec, err := decodeRecord(b)
		require.NoError(t, err, "record %d", i)
		seg := uint64(1)
		if i < len(segs) {
			seg = segs[i]
		}
		r.apply(seg, rec)
	}
	for id := range r.queues { // the records are about queues declared elsewhere
		if _, ok := r.queueDecls[id]; !ok {
			r.queueDecls[id] = decl{id: id, name: fmt.Sprint("queue ", id), flags: flagDurable}
		}
	}
	r.finish()
	return r
}

// replayed returns what the replay gives queueID back, in order.
func replayed(r *replay, queueID uint64) []replayMsg {
	var ms []replayMsg
	r.messages(queueID, func(m replayMsg) { ms = append(ms, m) })
	return ms
}

func TestReplayPicture(t *testing.T) {
	r := replayLog(t, [][]byte{
		pub(1, 10, 1, "a"),
		pub(2, 10, 2, "b"),
		pub(3, 10, 3, "c"),
		pub(4, 10, 4, "d"),
		pub(5, 10, 5, "e"),
		appendSeqRecord(nil, recDeliver, 10, 1, 0), // a: out at the crash
		appendSeqRecord(nil, recDeliver, 10, 2, 0), // b: acked
		appendSeqRecord(nil, recSettle, 10, 2, 0),
		appendSeqRecord(nil, recDeliver, 10, 3, 0), // c: nacked twice, then out again
		appendSeqRecord(nil, recReturn, 10, 3, 1),
		appendSeqRecord(nil, recDeliver, 10, 3, 0),
		appendSeqRecord(nil, recReturn, 10, 3, 2),
		appendSeqRecord(nil, recDeliver, 10, 3, 0),
		appendSeqRecord(nil, recDeliver, 10, 4, 0), // d: nacked with a delay
		appendSeqRecord(nil, recReturn, 10, 4, 1),
		appendSeqRecord(nil, recDelay, 10, 4, 12345),
		pub(6, 10, 6, "f"),
		appendSeqRecord(nil, recDeliver, 10, 6, 0), // f: back unread, unchanged
		appendSeqRecord(nil, recReturn, 10, 6, 0),
		appendSeqRecord(nil, recSettle, 10, 99, 0), // unknown: ignored
	})
	got := replayed(r, 10)
	require.Equal(t, []replayMsg{
		{msgID: 1, seq: 1, returns: 1, redelivered: true, returned: true},
		{msgID: 3, seq: 3, returns: 3, redelivered: true, returned: true},
		{msgID: 4, seq: 4, returns: 1, redelivered: true, due: 12345},
		{msgID: 5, seq: 5},
		{msgID: 6, seq: 6},
	}, got, "in seq order; what was out comes back redelivered with one return more; counts and due times kept; what came back unread is as it was")
	require.Nil(t, r.body(2), "acked: its body is gone")
	require.Equal(t, []byte("c"), r.body(3))
	require.Equal(t, 5, r.live[1].bodies)
}

func TestReplayBodiesAcrossQueues(t *testing.T) {
	r := replayLog(t, [][]byte{
		pub(1, 10, 1, "fanout"),
		appendPlacement(nil, placement{msgID: 1, queueID: 20, seq: 7}, nil),
		appendPlacement(nil, placement{msgID: 2, queueID: 20, seq: 8}, nil), // its publish is gone: ignored
		appendSeqRecord(nil, recSettle, 10, 1, 0),
	}, 1, 1, 2, 3)
	require.Empty(t, replayed(r, 10))
	require.Equal(t, []replayMsg{{msgID: 1, seq: 7}}, replayed(r, 20))
	require.Equal(t, []byte("fanout"), r.body(1), "kept while a queue holds it")
	require.Equal(t, 1, r.live[1].bodies)

	r = replayLog(t, [][]byte{
		pub(1, 10, 1, "fanout"),
		appendPlacement(nil, placement{msgID: 1, queueID: 20, seq: 7}, nil),
		appendSeqRecord(nil, recSettle, 10, 1, 0),
		appendSeqRecord(nil, recSettle, 20, 7, 0),
	}, 1, 1, 3, 4)
	require.Nil(t, r.body(1))
	require.Equal(t, 0, r.live[1].bodies, "segment 1 holds nothing live")
}

// TestReplayPlacementsMeetBodiesAtTheEnd: a placement is matched with its body once the log is
// read: one written before the body's rewrite (a queue took the message while compaction moved
// it), or after every other placement was settled (a queue took it while another let it go),
// is kept; one whose body is not in the log, or whose queue was deleted, is dropped.
func TestReplayPlacementsMeetBodiesAtTheEnd(t *testing.T) {
	r := replayLog(t, [][]byte{
		pub(1, 10, 1, "moved"),
		pub(2, 10, 2, "let go"),
		appendPlacement(nil, placement{msgID: 1, queueID: 20, seq: 1}, nil),             // before the rewrite
		appendSeqRecord(nil, recSettle, 10, 2, 0),                                       // 2's last holder lets go
		appendPlacement(nil, placement{msgID: 2, queueID: 20, seq: 2}, nil),             // and 20 takes it
		appendPlacement(nil, placement{msgID: 1, queueID: 10, seq: 1}, []byte("moved")), // the rewrite
		appendPlacement(nil, placement{msgID: 9, queueID: 20, seq: 3}, nil),             // its body is gone
		appendPlacement(nil, placement{msgID: 1, queueID: 30, seq: 1}, nil),
		appendDecl(nil, recUnqueue, decl{id: 30}), // deleted, its declaration in a removed segment
	}, 1, 1, 2, 2, 2, 3, 3, 3, 3)
	require.Equal(t, []replayMsg{{msgID: 1, seq: 1}}, replayed(r, 10))
	require.Equal(t, []replayMsg{{msgID: 1, seq: 1}, {msgID: 2, seq: 2}}, replayed(r, 20))
	require.Empty(t, replayed(r, 30))
	require.Equal(t, liveSegments{1: {1, int64(len("let go"))}, 3: {1, int64(len("moved"))}}, r.live,
		"2's body is still in segment 1; 1's moved to 3; nothing counts the deleted queue's")
}

func TestReplayCompactedRewrite(t *testing.T) {
	// Compaction writes a live message again, with its current state, in a later segment: the
	// old segment then holds nothing live, and the message keeps its place.
	r := replayLog(t, [][]byte{
		pub(1, 10, 5, "old"),
		appendSeqRecord(nil, recDeliver, 10, 5, 0),
		appendSeqRecord(nil, recReturn, 10, 5, 1),
		appendPlacement(nil, placement{msgID: 1, queueID: 10, seq: 5, returns: 1}, []byte("old")),
	}, 1, 1, 1, 7)
	require.Equal(t, []replayMsg{{msgID: 1, seq: 5, returns: 1, redelivered: true}}, replayed(r, 10))
	require.Equal(t, 0, r.live[1].bodies)
	require.Equal(t, 1, r.live[7].bodies)
	require.Equal(t, []byte("old"), r.body(1))
}

func TestReplayTopology(t *testing.T) {
	q := func(id uint64, name string) []byte {
		return appendDecl(nil, recQueue, decl{id: id, name: name, flags: flagDurable})
	}
	bind := func(typ recordType, src, dst string, toQueue bool, key string) []byte {
		d := decl{name: src, dest: dst, kind: key}
		if toQueue {
			d.flags = flagToQueue
		}
		return appendDecl(nil, typ, d)
	}
	r := replayLog(t, [][]byte{
		q(1, "a"), q(2, "b"),
		appendDecl(nil, recExchange, decl{name: "x", kind: ExchangeTopic, flags: flagDurable}),
		appendDecl(nil, recExchange, decl{name: "y", kind: ExchangeFanout, flags: flagDurable}),
		bind(recBind, "x", "a", true, "k.*"),
		bind(recBind, "x", "a", true, "k.*"), // the same binding again: one
		bind(recBind, "x", "b", true, "#"),
		bind(recBind, "x", "y", false, "y.#"),
		bind(recBind, "y", "b", true, ""),
		pub(1, 2, 1, "m"),
		appendDecl(nil, recUnqueue, decl{id: 2}), // b goes, with its message and bindings
		bind(recUnbind, "x", "a", true, "k.*"),
		q(3, "b"), // declared again: a new queue
	})
	require.Equal(t, map[uint64]decl{1: {id: 1, name: "a", flags: flagDurable}, 3: {id: 3, name: "b", flags: flagDurable}}, r.queueDecls)
	require.Len(t, r.exchangeDecls, 2)
	require.Equal(t, []decl{{name: "x", dest: "y", kind: "y.#"}}, r.bindings)
	require.Empty(t, replayed(r, 2))
	require.Empty(t, replayed(r, 3))
	require.Nil(t, r.body(1), "the deleted queue's message is gone")

	r.apply(2, record{typ: recUnexchange, decl: decl{name: "y"}})
	require.Empty(t, r.bindings, "an exchange goes with the bindings to it")
}

// The recovery rules: what a durable broker gets back when it opens its log again after a Close
// or a crash, RabbitMQ's picture (durable.go's Open). Each test runs in a synctest bubble, where
// time.Sleep advances the fake clock at once: "close, let 10 minutes pass, reopen" is
// restart(t, b, fs, 10*time.Minute).

// start opens a durable broker on fs, closed when the test ends.
func start(t *testing.T, fs wal.FS, opts ...BrokerOption) *Broker {
	t.Helper()
	b := openTest(t, fs, opts...)
	t.Cleanup(func() { b.Close() })
	return b
}

// restart closes b, lets d pass, and opens fs again with opts.
func restart(t *testing.T, b *Broker, fs wal.FS, d time.Duration, opts ...BrokerOption) *Broker {
	t.Helper()
	require.NoError(t, b.Close())
	time.Sleep(d)
	return start(t, fs, opts...)
}

// crash kills b as kill -9 would, once its log holds everything b appended (acknowledgements
// too), and lets d pass.
func crash(t *testing.T, b *Broker, fs *wal.MemFS, d time.Duration) {
	t.Helper()
	require.NoError(t, b.store.log.Sync())
	fs.Crash(wal.KeepWritten, nil)
	b.Close() // the crashed log fails; the broker still closes
	time.Sleep(d)
}

// lookup returns the queue named name, which must exist.
func lookup(t *testing.T, b *Broker, name string) *Queue {
	t.Helper()
	q, err := b.Queue(name)
	require.NoError(t, err)
	return q
}

// get gets the head of q, which must not be empty, and leaves it unsettled.
func get(t *testing.T, q *Queue) Delivery {
	t.Helper()
	d, err := q.Get(context.Background())
	require.NoError(t, err)
	return d
}

// ready returns the bodies of q's ready messages, in delivery order, without taking them.
func ready(q *Queue) []string {
	var out []string
	for m := range q.Browse() {
		out = append(out, string(m.Body))
	}
	return out
}

// queueNames returns the names of b's queues, without using them (a lookup would renew an
// Expires lease).
func queueNames(b *Broker) []string {
	var names []string
	for q := range b.Queues() {
		names = append(names, q.Name())
	}
	return names
}

// heard records what a broker's listener hears, from Open on (WithListener).
type heard struct {
	mu  sync.Mutex
	evs []Event
}

func (h *heard) listener() BrokerOption {
	return WithListener(func(e Event) {
		h.mu.Lock()
		h.evs = append(h.evs, e)
		h.mu.Unlock()
	})
}

// of returns the events of kind heard so far, in order.
func (h *heard) of(kind EventKind) []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Event
	for _, e := range h.evs {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// TestRecoverOrder: every confirmed persistent message of a durable queue comes back at its
// original place in the queue's order: acked ones gone, transient ones gone, those out with a
// consumer back among the others, not behind them; what is published after a restart goes
// behind them all.
func TestRecoverOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := wal.NewMemFS()
		b := start(t, fs)
		q := durableQueue(t, b, "jobs")
		persistent(t, b, "jobs", "m1", "m2", "m3")
		require.NoError(t, b.Publish(context.Background(), "", "jobs", Message{Body: []byte("transient")}))
		persistent(t, b, "jobs", "m4", "m5", "m6")
		var out []Delivery
		for range 5 {
			out = append(out, get(t, q)) // m1, m2, m3, transient, m4
		}
		require.NoError(t, out[0].Ack())
		require.NoError(t, out[2].Ack())
		require.NoError(t, out[3].Ack())

		b = restart(t, b, fs, time.Minute) // m2 and m4 out
		q = lookup(t, b, "jobs")
		require.Equal(t, []string{"m2", "m4", "m5", "m6"}, ready(q), "m2 and m4 back at their places")
		persistent(t, b, "jobs", "m7")
		get(t, q) // m2, out again

		b = restart(t, b, fs, time.Minute)
		require.Equal(t, []string{"m2", "m4", "m5", "m6", "m7"}, ready(lookup(t, b, "jobs")),
			"m7, published in the second life, stays behind the first life's messages")
	})
}

// TestRecoverUnacked: a message out with a consumer (or a Get) when the broker closed or
// crashed comes back redelivered, its delivery count one higher; a message returned before
// keeps its count, and one a consumer never read comes back as it was; and a count survives any
// number of restarts, each of which a delivery was out at.
func TestRecoverUnacked(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(t *testing.T, b *Broker, fs *wal.MemFS) *Broker
	}{
		{"close", func(t *testing.T, b *Broker, fs *wal.MemFS) *Broker { return restart(t, b, fs, time.Minute) }},
		{"kill -9", func(t *testing.T, b *Broker, fs *wal.MemFS) *Broker {
			crash(t, b, fs, time.Minute)
			return start(t, fs)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				fs := wal.NewMemFS()
				b := start(t, fs)
				q := durableQueue(t, b, "jobs")
				persistent(t, b, "jobs", "a", "b", "c", "d")
				c, err := q.Consume(t.Context(), Prefetch(2))
				require.NoError(t, err)
				da := <-c.Deliveries() // a received; b buffered, never received
				require.Equal(t, "a", string(da.Message.Body))
				require.NoError(t, da.Nack()) // a: returned once, out again at once
				synctest.Wait()
				dc := get(t, q) // c: out with a Get
				require.Equal(t, "c", string(dc.Message.Body))

				b = tc.stop(t, b, fs)
				q = lookup(t, b, "jobs")
				require.Equal(t, []string{"a", "b", "c", "d"}, ready(q))
				da = get(t, q)
				require.Equal(t, []any{"a", true, 2}, []any{string(da.Message.Body), da.Redelivered, da.DeliveryCount},
					"a: returned once by the Nack, once by the stop")
				require.NoError(t, da.Nack()) // a: 3
				get(t, q)                     // a, out at the stop: 4
				db := get(t, q)
				require.Equal(t, []any{"b", true, 1}, []any{string(db.Message.Body), db.Redelivered, db.DeliveryCount},
					"b: buffered for the consumer at the stop, which cannot know it was not read")
				dc = get(t, q) // c, out at both stops
				require.Equal(t, []any{"c", true, 1}, []any{string(dc.Message.Body), dc.Redelivered, dc.DeliveryCount})
				c, err = q.Consume(t.Context(), Prefetch(1))
				require.NoError(t, err)
				synctest.Wait()                // d buffered for c
				require.NoError(t, c.Cancel()) // d back unread: unchanged
				require.NoError(t, db.Nack())  // b: 2, ready at the stop

				b = tc.stop(t, b, fs)
				require.Equal(t, []string{"a(4)", "b(2)", "c(2)", "d"}, held(t, b, "jobs"),
					"a and c out at both stops, b returned and ready at the second, d returned unread")
			})
		})
	}
}

// TestRecoverDeliveryLimit: a poison message that crashes the process each time it is
// delivered still reaches its queue's delivery limit: each crash returns it, one delivery more,
// and the return that takes it past the limit dead-letters it when the broker opens again, as a
// Nack would have. So does a message delivered after a delay.
func TestRecoverDeliveryLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := wal.NewMemFS()
		b := start(t, fs)
		durableQueue(t, b, "jobs", DeliveryLimit(2), DeadLetter("", "poison"))
		durableQueue(t, b, "retry", DeliveryLimit(1), DeadLetter("", "poison"))
		durableQueue(t, b, "poison")
		persistent(t, b, "jobs", "bad", "good")
		persistent(t, b, "retry", "slow")
		require.NoError(t, get(t, lookup(t, b, "retry")).NackWithDelay(time.Minute))
		time.Sleep(time.Minute)
		synctest.Wait()
		require.Equal(t, 1, get(t, lookup(t, b, "retry")).DeliveryCount, "slow: out at the first crash")
		for life := range 3 { // three deliveries: as many as the limit allows
			d := get(t, lookup(t, b, "jobs"))
			require.Equal(t, []any{"bad", life}, []any{string(d.Message.Body), d.DeliveryCount})
			crash(t, b, fs, time.Minute)
			b = start(t, fs)
		}
		require.Equal(t, []string{"good"}, ready(lookup(t, b, "jobs")), "the third return took it past the limit")
		require.Empty(t, ready(lookup(t, b, "retry")))
		poison := lookup(t, b, "poison")
		require.Equal(t, []string{"slow", "bad"}, ready(poison))
		for _, from := range []string{"retry", "jobs"} {
			d := get(t, poison)
			x := d.Message.Headers["x-death"].([]any)[0].(Table)
			require.Equal(t, []any{from, string(ReasonDeliveryLimit), int64(1)}, []any{x["queue"], x["reason"], x["count"]})
		}
	})
}

// TestRecoverExpiredWhileDown: deadlines are wall-clock times, kept across restarts: what
// expired while the process was down has expired, and been dead-lettered with its x-death, when
// Open returns, even to a dead-letter queue declared and bound after it; what has not expires at
// its deadline, not later for the time the process was down.
func TestRecoverExpiredWhileDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := wal.NewMemFS()
		b := start(t, fs)
		durableQueue(t, b, "main", MessageTTL(time.Hour), DeadLetter("dlx", ""))
		_, err := b.DeclareExchange("dlx", ExchangeFanout, Durable())
		require.NoError(t, err)
		durableQueue(t, b, "dead")
		require.NoError(t, b.Bind("dead", "dlx", "", nil))
		ctx := context.Background()
		persistent(t, b, "main", "old") // due at 1h
		require.NoError(t, b.Publish(ctx, "", "main", Message{Body: []byte("short"), Persistent: true}, ExpireAfter(50*time.Minute)))
		time.Sleep(40 * time.Minute)
		persistent(t, b, "main", "new") // due at 1h40m

		b = restart(t, b, fs, 30*time.Minute) // at 1h10m
		main, dead := lookup(t, b, "main"), lookup(t, b, "dead")
		require.Equal(t, []string{"new"}, ready(main))
		require.Equal(t, []string{"old", "short"}, ready(dead), "expired while down: dead-lettered in queue order, as RabbitMQ's head-first expiry does")
		for _, want := range []struct {
			body, expiration string
		}{{"old", ""}, {"short", "3000000"}} {
			d := get(t, dead)
			require.Equal(t, want.body, string(d.Message.Body))
			x := d.Message.Headers["x-death"].([]any)
			require.Len(t, x, 1)
			death := maps.Clone(x[0].(Table))
			exp, _ := death["original-expiration"].(string)
			delete(death, "original-expiration")
			require.Equal(t, want.expiration, exp)
			require.Equal(t, Table{"queue": "main", "reason": string(ReasonExpired), "count": int64(1), "exchange": "",
				"routing-keys": []any{"main"}, "time": time.Now().Truncate(time.Second)}, death,
				"%s: dead-lettered as the broker opened", want.body)
			require.NoError(t, d.Ack())
		}

		time.Sleep(30*time.Minute - time.Millisecond)
		synctest.Wait()
		require.Equal(t, []string{"new"}, ready(main), "its deadline is 1h40m")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		require.Empty(t, ready(main))
		require.Equal(t, []string{"new"}, ready(dead))
	})
}

// TestRecoverDelayed: a delayed message keeps its due time, a wall-clock time, across a restart:
// hidden until then, at its place in the queue from then on; one whose due time passed while the
// process was down is back at once. So with a delayed publish and a delayed Nack.
func TestRecoverDelayed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := wal.NewMemFS()
		b := start(t, fs)
		q := durableQueue(t, b, "jobs")
		ctx := context.Background()
		require.NoError(t, b.Publish(ctx, "", "jobs", Message{Body: []byte("later"), Persistent: true}, DeliverAfter(time.Hour)))
		require.NoError(t, b.Publish(ctx, "", "jobs", Message{Body: []byte("soon"), Persistent: true}, DeliverAfter(10*time.Minute)))
		persistent(t, b, "jobs", "retried", "plain")
		require.NoError(t, get(t, q).NackWithDelay(30*time.Minute)) // retried: due at 30m

		b = restart(t, b, fs, 20*time.Minute) // at 20m: soon's due time passed while down
		q = lookup(t, b, "jobs")
		require.Equal(t, []string{"soon", "plain"}, ready(q), "soon is back at its place, ahead of plain")

		time.Sleep(10*time.Minute - time.Millisecond)
		synctest.Wait()
		require.Equal(t, []string{"soon", "plain"}, ready(q))
		time.Sleep(time.Millisecond) // 30m
		synctest.Wait()
		require.Equal(t, []string{"soon", "retried", "plain"}, ready(q))

		b = restart(t, b, fs, 20*time.Minute) // at 50m
		q = lookup(t, b, "jobs")
		time.Sleep(10*time.Minute - time.Millisecond)
		synctest.Wait()
		require.Equal(t, []string{"soon", "retried", "plain"}, ready(q), "later is due at 1h, not 1h after the restart")
		time.Sleep(time.Millisecond) // 1h
		synctest.Wait()
		require.Equal(t, []string{"later", "soon", "retried(1)", "plain"}, held(t, b, "jobs"))
	})
}

// TestRecoverXDeath: a message's x-death history survives restarts, and goes on: a later death
// for the same queue and reason counts in the same entry, and the first death headers stay.
func TestRecoverXDeath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := wal.NewMemFS()
		b := start(t, fs)
		durableQueue(t, b, "work", DeadLetter("", "parked"))
		durableQueue(t, b, "parked", DeadLetter("", "work"))
		persistent(t, b, "work", "m")
		require.NoError(t, get(t, lookup(t, b, "work")).Reject()) // → parked
		died := time.Now().Truncate(time.Second)

		b = restart(t, b, fs, time.Hour)
		require.NoError(t, get(t, lookup(t, b, "parked")).Reject()) // → work

		b = restart(t, b, fs, time.Hour)
		require.NoError(t, get(t, lookup(t, b, "work")).Reject()) // → parked, work's entry counts 2

		b = restart(t, b, fs, time.Hour)
		d := get(t, lookup(t, b, "parked"))
		h := d.Message.Headers
		deaths := h["x-death"].([]any)
		require.Len(t, deaths, 2, "one entry per queue and reason")
		for i, want := range []struct {
			queue string
			count int64
			time  time.Time
		}{{"work", 2, died}, {"parked", 1, died.Add(time.Hour)}} {
			x := deaths[i].(Table)
			require.Equal(t, []any{want.queue, string(ReasonRejected), want.count, "", []any{want.queue}},
				[]any{x["queue"], x["reason"], x["count"], x["exchange"], x["routing-keys"]}, "x-death[%d]", i)
			require.True(t, want.time.Equal(x["time"].(time.Time)), "x-death[%d] time %v, want %v: its first death's", i, x["time"], want.time)
		}
		require.Equal(t, []any{"rejected", "work", "rejected", "work"},
			[]any{h["x-first-death-reason"], h["x-first-death-queue"], h["x-last-death-reason"], h["x-last-death-queue"]})
	})
}

// TestRecoverExpiresLease: a durable queue's Expires lease starts again when the broker opens:
// the time the process was down does not count as unused.
func TestRecoverExpiresLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := wal.NewMemFS()
		b := start(t, fs)
		durableQueue(t, b, "lease", Expires(time.Hour))
		durableQueue(t, b, "other")
		persistent(t, b, "lease", "m")
		time.Sleep(50 * time.Minute) // unused

		b = restart(t, b, fs, 3*time.Hour)
		require.Equal(t, []string{"lease", "other"}, queueNames(b))
		time.Sleep(time.Hour - time.Millisecond)
		synctest.Wait()
		require.Equal(t, []string{"lease", "other"}, queueNames(b), "an hour after the open, not before")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		require.Equal(t, []string{"other"}, queueNames(b))

		b = restart(t, b, fs, time.Minute)
		require.Equal(t, []string{"other"}, queueNames(b), "its deletion is in the log")
	})
}

// TestRecoverPriorities: a priority queue's messages come back in priority order (a priority
// above the maximum counting as the maximum), each at its place within its priority, those out at
// the close too; a message published after the restart goes behind those of its priority.
func TestRecoverPriorities(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := wal.NewMemFS()
		b := start(t, fs)
		q := durableQueue(t, b, "prio", MaxPriority(5))
		publish := func(b *Broker, body string, priority uint8) {
			require.NoError(t, b.Publish(context.Background(), "", "prio", Message{Body: []byte(body), Priority: priority, Persistent: true}))
		}
		publish(b, "a", 0)
		publish(b, "b", 3)
		publish(b, "c", 5)
		publish(b, "d", 10) // counts as 5
		publish(b, "e", 3)
		publish(b, "f", 0)
		require.Equal(t, "c", string(get(t, q).Message.Body)) // out at the close
		require.Equal(t, "d", string(get(t, q).Message.Body))
		require.NoError(t, get(t, q).Nack()) // b, back at its place

		b = restart(t, b, fs, time.Minute)
		publish(b, "g", 5)
		publish(b, "h", 3)
		require.Equal(t, []string{"c(1)", "d(1)", "g", "b(1)", "e", "h", "a", "f"}, held(t, b, "prio"))
	})
}

// TestRecoverFanout: a message published to two durable queues comes back in both, as one
// message; acking it in one, before or after a restart, keeps it in the other, and its body with
// it in the log: later restarts still find it.
func TestRecoverFanout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := wal.NewMemFS()
		opts := logOptions(wal.Options{SegmentSize: 1024}) // segments go as soon as they can
		b := start(t, fs, opts)
		_, err := b.DeclareExchange("fan", ExchangeFanout, Durable())
		require.NoError(t, err)
		for _, name := range []string{"a", "b"} {
			durableQueue(t, b, name)
			require.NoError(t, b.Bind(name, "fan", "", nil))
		}
		_, err = b.DeclareQueue("c") // transient
		require.NoError(t, err)
		require.NoError(t, b.Bind("c", "fan", "", nil))
		durableQueue(t, b, "filler")
		ctx := context.Background()
		for _, body := range []string{"m1", "m2"} {
			require.NoError(t, b.Publish(ctx, "fan", "", Message{Body: []byte(body), Persistent: true}))
		}
		require.NoError(t, get(t, lookup(t, b, "a")).Ack()) // m1

		b = restart(t, b, fs, time.Minute, opts)
		a, bq := lookup(t, b, "a"), lookup(t, b, "b")
		require.Equal(t, []string{"m2"}, ready(a))
		require.Equal(t, []string{"m1", "m2"}, ready(bq))
		da, db := get(t, a), get(t, bq)
		require.Same(t, &da.Message.Body[0], &get(t, bq).Message.Body[0], "m2: one message (one body) in both queues")
		require.NoError(t, da.Ack())
		require.NoError(t, db.Ack()) // m1: now in no queue
		// Enough to fill many segments, each gone once its messages are acked: only those a
		// queue still needs stay.
		filler := lookup(t, b, "filler")
		for i := range 100 {
			persistent(t, b, "filler", fmt.Sprint("filler ", i))
			require.NoError(t, get(t, filler).Ack())
		}
		require.NoError(t, b.store.log.Sync())

		b = restart(t, b, fs, time.Minute, opts)
		require.Empty(t, ready(lookup(t, b, "a")))
		require.Equal(t, []string{"m2(1)"}, held(t, b, "b"), "acked in a after the restart: still in b")
	})
}

// TestRecoverTopology: durable exchanges come back with their alternate exchanges, and so do
// the bindings between durable ends, exchange to exchange included; a transient queue does not,
// nor its bindings: what only it took now goes to the alternate exchange.
func TestRecoverTopology(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := wal.NewMemFS()
		b := start(t, fs)
		ctx := context.Background()
		for _, x := range []struct {
			name, kind string
			opts       []ExchangeOption
		}{
			{"events", ExchangeTopic, []ExchangeOption{Durable(), AlternateExchange("unrouted")}},
			{"unrouted", ExchangeFanout, []ExchangeOption{Durable()}},
			{"audit", ExchangeFanout, []ExchangeOption{Durable(), Internal()}},
		} {
			_, err := b.DeclareExchange(x.name, x.kind, x.opts...)
			require.NoError(t, err)
		}
		for _, name := range []string{"orders", "log", "lost"} {
			durableQueue(t, b, name)
		}
		_, err := b.DeclareQueue("tmp") // transient
		require.NoError(t, err)
		require.NoError(t, b.Bind("orders", "events", "order.*", nil))
		require.NoError(t, b.BindExchange("audit", "events", "#.audit", nil))
		require.NoError(t, b.Bind("log", "audit", "", nil))
		require.NoError(t, b.Bind("lost", "unrouted", "", nil))
		require.NoError(t, b.Bind("tmp", "events", "tmp.*", nil))

		b = restart(t, b, fs, time.Minute)
		require.Equal(t, []string{"log", "lost", "orders"}, queueNames(b))
		for _, p := range []struct{ key, body string }{
			{"order.new", "1"},        // → orders
			{"order.audit", "2"},      // → orders, and audit → log
			{"user.login.audit", "3"}, // audit → log
			{"tmp.x", "4"},            // its queue is gone: → unrouted → lost
			{"nothing", "5"},          // → unrouted → lost
		} {
			require.NoError(t, b.Publish(ctx, "events", p.key, Message{Body: []byte(p.body), Persistent: true}))
		}
		require.ErrorIs(t, b.Publish(ctx, "audit", "", Message{Body: []byte("x")}), ErrAccessRefused, "audit is still internal")
		require.Equal(t, []string{"1", "2"}, held(t, b, "orders"))
		require.Equal(t, []string{"2", "3"}, held(t, b, "log"))
		require.Equal(t, []string{"4", "5"}, held(t, b, "lost"))
	})
}

// TestRecoverQueueArguments: a durable queue's arguments come back with it and act on what it
// got back: its dead-letter exchange, its length limits and overflow policies (the recovered
// messages count), single active consumer; and a declaration that differs from them is refused.
func TestRecoverQueueArguments(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := wal.NewMemFS()
		b := start(t, fs)
		durableQueue(t, b, "dl", DeadLetter("", "dead"))
		durableQueue(t, b, "capped", MaxLength(2), Overflow(RejectPublish))
		durableQueue(t, b, "bytes", MaxLengthBytes(8), Overflow(RejectPublish))
		durableQueue(t, b, "head", MaxLength(2), DeadLetter("", "dead"))
		durableQueue(t, b, "sac", SingleActiveConsumer())
		durableQueue(t, b, "dead")
		persistent(t, b, "dl", "rejected")
		persistent(t, b, "capped", "c1", "c2")
		persistent(t, b, "bytes", "b1__", "b2__")
		persistent(t, b, "head", "h1", "h2")
		persistent(t, b, "sac", "s1", "s2")

		b = restart(t, b, fs, time.Minute)
		ctx := context.Background()
		full := Message{Body: []byte("x"), Persistent: true}
		require.ErrorIs(t, b.Publish(ctx, "", "capped", full), ErrQueueFull, "two messages back: full")
		require.ErrorIs(t, b.Publish(ctx, "", "bytes", full), ErrQueueFull, "eight bytes back: full")
		_, err := b.DeclareQueue("capped", Durable(), MaxLength(3), Overflow(RejectPublish))
		require.ErrorIs(t, err, ErrPreconditionFailed)
		persistent(t, b, "head", "h3") // drops h1
		require.NoError(t, get(t, lookup(t, b, "dl")).Reject())
		dead := lookup(t, b, "dead")
		require.Equal(t, []string{"h1", "rejected"}, ready(dead))
		for _, want := range []string{string(ReasonMaxLen), string(ReasonRejected)} {
			require.Equal(t, want, get(t, dead).Message.Headers["x-last-death-reason"])
		}
		require.Equal(t, []string{"h2", "h3"}, ready(lookup(t, b, "head")))

		sac := lookup(t, b, "sac")
		first, err := sac.Consume(t.Context())
		require.NoError(t, err)
		second, err := sac.Consume(t.Context())
		require.NoError(t, err)
		synctest.Wait()
		require.Len(t, first.Deliveries(), 2)
		require.Empty(t, second.Deliveries(), "one active consumer")
		require.NoError(t, first.Cancel())
		synctest.Wait()
		require.Len(t, second.Deliveries(), 2, "the next takes over")
	})
}

// TestRecoverListener: a listener given with WithListener hears what Open does, before Open
// returns: the torn end of the log it cut, and the messages that expired while the process was
// down, expired or dead-lettered.
func TestRecoverListener(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := wal.NewMemFS()
		b := start(t, fs)
		durableQueue(t, b, "plain", MessageTTL(time.Minute))
		durableQueue(t, b, "dl", MessageTTL(time.Minute), DeadLetter("", "dead"))
		durableQueue(t, b, "dead")
		persistent(t, b, "plain", "p")
		persistent(t, b, "dl", "d")
		require.NoError(t, b.Close())
		segs := segmentNames(t, fs)
		last, err := fs.Open(segs[len(segs)-1])
		require.NoError(t, err)
		_, err = last.Write([]byte{100, 0, 0, 0, 1, 2, 3, 4, 5}) // a torn write: a frame that claims 100 bytes and has 5
		require.NoError(t, err)
		require.NoError(t, last.Close())
		time.Sleep(time.Hour)

		var h heard
		b = start(t, fs, h.listener())
		repaired := h.of(EventLogRepaired)
		require.Len(t, repaired, 1)
		require.Equal(t, int64(9), repaired[0].Value, "the bytes cut")
		require.ErrorIs(t, repaired[0].Err, ErrCorrupt)
		expired := h.of(EventExpired)
		require.Len(t, expired, 1)
		require.Equal(t, []string{"plain", "p"}, []string{expired[0].Queue, string(expired[0].Message.Body)})
		dead := h.of(EventDeadLettered)
		require.Len(t, dead, 1)
		require.Equal(t, []any{"dl", "d", ReasonExpired}, []any{dead[0].Queue, string(dead[0].Message.Body), dead[0].Reason})
		require.Equal(t, []string{"d"}, ready(lookup(t, b, "dead")))
	})
}

// TestRecoverTransientRecord: a publish record whose message says it is not persistent (no
// broker writes one, but the decoder takes it) is restored like any other, not a nil envelope
// state at open.
func TestRecoverTransientRecord(t *testing.T) {
	fs := wal.NewMemFS()
	b := start(t, fs)
	q := durableQueue(t, b, "q")
	env := testEnvelope(Message{Body: []byte("x")}, b.defaultX)
	env.routingKey = "q"
	rec, _ := appendPublish(nil, placement{msgID: 1 << 40, queueID: q.log.qid, seq: 1}, env)
	_, _, err := b.store.log.Append(rec)
	require.NoError(t, err)
	require.NoError(t, b.store.log.WaitWritten(t.Context(), 0))
	require.NoError(t, b.Close())
	// The record went around the queue, which does not hold it: the checkpoint would not
	// either. Without it, Open reads the record.
	require.NoError(t, removeCheckpoints(fs))
	b = start(t, fs)
	defer b.Close()
	require.Equal(t, []string{"x"}, held(t, b, "q"))
}

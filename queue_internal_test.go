package warren

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/btree"
	"github.com/stretchr/testify/require"
)

// checkReadySet verifies that ascend visits every ready entry once, in ascending key order.
func checkReadySet(t *testing.T, r *readySet) []uint64 {
	t.Helper()
	var keys []uint64
	r.ascend(0, func(e entry) bool {
		keys = append(keys, e.key())
		return true
	})
	if len(keys) != r.len() {
		t.Fatalf("ascend visited %d entries, len() = %d", len(keys), r.len())
	}
	if !slices.IsSorted(keys) {
		t.Fatalf("ready set out of order: %v", keys)
	}
	for i := 1; i < len(keys); i++ {
		if keys[i] == keys[i-1] {
			t.Fatalf("key %d twice in the ready set", keys[i])
		}
	}
	return keys
}

// TestReadySetAgainstSortedSlice drives the ready set and a sorted slice with the same random
// pushes, pops, removals from anywhere (a selector's takes, expiries), reinsertions of one
// entry taken and merges of several, and compares them after every step; and checks that the
// tombstones the removals leave stay bounded by what is live (tombstoneErr).
func TestReadySetAgainstSortedSlice(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	for range 20 {
		r := newReadySet(btree.NewFreeListG[entry](8), 1)
		var model []uint64 // ready keys, ascending
		var out []entry    // popped or removed, not yet returned
		next := uint64(1)
		for step := range 1000 {
			switch op := rng.IntN(12); {
			case op < 4:
				r.push(entry{env: testEnv, seq: next})
				model = append(model, next)
				next++
			case op >= 10 && len(model) > 0:
				i := rng.IntN(len(model))
				e, ok := r.remove(model[i])
				if !ok || e.key() != model[i] {
					t.Fatalf("step %d: remove(%d) = %d, %t", step, model[i], e.key(), ok)
				}
				model = slices.Delete(model, i, i+1)
				out = append(out, e)
			case op < 7:
				e, ok := r.popMin()
				if ok != (len(model) > 0) {
					t.Fatalf("step %d: popMin ok = %t, want %t", step, ok, len(model) > 0)
				}
				if !ok {
					continue
				}
				if e.key() != model[0] {
					t.Fatalf("step %d: popMin = %d, want %d", step, e.key(), model[0])
				}
				model = model[1:]
				out = append(out, e)
			case op == 9 && len(out) > 0:
				// several come back together: merged as a sorted run
				k := 1 + rng.IntN(len(out))
				batch := slices.Clone(out[:k])
				out = out[k:]
				slices.SortFunc(batch, func(a, b entry) int { return int(a.key()) - int(b.key()) })
				r.merge(batch)
				for _, e := range batch {
					j, _ := slices.BinarySearch(model, e.key())
					model = slices.Insert(model, j, e.key())
				}
			case len(out) > 0:
				i := rng.IntN(len(out))
				e := out[i]
				out = slices.Delete(out, i, i+1)
				r.reinsert(e)
				j, _ := slices.BinarySearch(model, e.key())
				model = slices.Insert(model, j, e.key())
			}
			if got := checkReadySet(t, &r); !slices.Equal(got, model) {
				t.Fatalf("step %d: ready = %v, want %v", step, got, model)
			}
			if err := tombstoneErr(&r); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
	}
}

// TestSmallMergeBesideLargeRunIsCheap: a bulk return of a few messages (Recover, NackUpTo,
// Cancel's buffered deliveries, an AutoAck feeder's stop, a context end owning little) while a
// large run of earlier returns is still ready must not cost O(run). (A regression test: merge
// copied the whole rest of the run each time, ~1.5 MB per call beside a 64Ki run, so a
// prefetch-1 consumer receiving and Recovering one message at a time went quadratic.)
func TestSmallMergeBesideLargeRunIsCheap(t *testing.T) {
	const n = 1 << 16
	r := newReadySet(btree.NewFreeListG[entry](8), 1)
	big := make([]entry, n)
	for i := range big {
		big[i] = entry{env: testEnv, seq: uint64(i + 1)}
	}
	r.merge(big)
	const rounds = 100
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range rounds {
		e, _ := r.popMin() // the head of the run comes back on its own
		r.merge([]entry{e})
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / rounds; per > 64<<10 {
		t.Fatalf("merging one entry beside a run of %d allocates %d bytes, want O(1)", n, per)
	}
	if got := checkReadySet(t, &r); len(got) != n || got[0] != 1 {
		t.Fatalf("ready set after the rounds: %d entries from %d, want %d from 1", len(got), got[0], n)
	}
}

// TestContextEndIsAtomic: while a consumer's context end returns a large holding, every
// observer sees each message either still held or back in the queue: Len+Unacked stays the
// number published, a Get takes the head, and a purge leaves nothing to come back later.
// (A regression test: returning in chunks once left messages in neither place in between.)
func TestContextEndIsAtomic(t *testing.T) {
	const held, behind = 3000, 10
	b := New()
	defer b.Close()
	q, err := b.DeclareQueue("q")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	a, err := q.Consume(ctx, Prefetch(held))
	if err != nil {
		t.Fatal(err)
	}
	for i := range held + behind {
		if err := b.Publish(t.Context(), "", "q", Message{Body: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	for range held {
		<-a.Deliveries()
	}
	observed := make(chan string)
	go func() {
		for {
			q.mu.Lock()
			n, u := q.core.ready.len(), q.core.unacked
			q.mu.Unlock()
			if n+u != held+behind {
				observed <- fmt.Sprintf("ready %d + unacked %d != %d", n, u, held+behind)
				return
			}
			if u == 0 {
				observed <- ""
				return
			}
		}
	}()
	cancel()
	if msg := <-observed; msg != "" {
		t.Fatal(msg)
	}
	<-a.Done()
	d, err := q.Get(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if string(d.Message.Body) != "0" || !d.Redelivered {
		t.Fatalf("Get after the return = %s (redelivered %t), want 0 redelivered", d.Message.Body, d.Redelivered)
	}
	if n, _ := q.Purge(); n != held+behind-1 {
		t.Fatalf("Purge = %d, want %d", n, held+behind-1)
	}
}

// testEnv is a message for white-box tests of the ready set; an entry without one is a tombstone.
var testEnv = &envelope{}

// TestExpiredSlotsDoNotAccumulate: in a queue nobody takes from (a delay queue), expired
// messages do not leave their slots behind: at the head they are dropped as they expire, and
// behind a long-lived head the ring is compacted once the dead outnumber the living.
// (A regression test: 50k publishes left 50k tombstones.)
func TestExpiredSlotsDoNotAccumulate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := New()
		defer b.Close()
		q, err := b.DeclareQueue("q", MessageTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		head, err := b.DeclareQueue("head")
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Publish(t.Context(), "", "head", Message{Expiration: "86400000"}); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			for range 10000 {
				if err := b.Publish(t.Context(), "", "q", Message{}); err != nil {
					t.Fatal(err)
				}
				if err := b.Publish(t.Context(), "", "head", Message{Expiration: "1000"}); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(time.Second)
			synctest.Wait()
		}
		for _, x := range []*Queue{q, head} {
			x.mu.Lock()
			slots, live := x.core.ready.fresh.len(), x.core.ready.len()
			x.mu.Unlock()
			if slots > 2*live+1024 {
				t.Errorf("queue %s: %d slots for %d live messages", x.name, slots, live)
			}
		}
	})
}

// readySetRNG returns the random source of a randomized ready-set test, seeded from
// WARREN_READYSET_SEED if it is set, else from the clock, and logs the seed.
func readySetRNG(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("WARREN_READYSET_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (WARREN_READYSET_SEED)", seed)
	return rand.New(rand.NewPCG(seed, seed))
}

// TestReadySetLevelsAgainstSortedSlice drives a ready set with priority levels and a sorted
// slice of keys with the same random operations — pushes at random levels, pops, single and bulk
// returns, removals from anywhere (the expiry timer's and a selector's), tidying, and ascents
// from a random key (a selector's scan) — and compares them after every step.
func TestReadySetLevelsAgainstSortedSlice(t *testing.T) {
	rng := readySetRNG(t)
	for round := range 16 {
		levels := 1 + rng.IntN(6)
		r := newReadySet(btree.NewFreeListG[entry](8), levels)
		insert := func(model []uint64, k uint64) []uint64 {
			j, found := slices.BinarySearch(model, k)
			if found {
				t.Fatalf("round %d: key %x inserted twice", round, k)
			}
			return slices.Insert(model, j, k)
		}
		var model []uint64
		var out []entry
		next := uint64(1)
		for step := range 1000 {
			switch op := rng.IntN(20); {
			case op < 7:
				e := entry{env: testEnv, seq: next, rank: uint8(rng.IntN(levels))}
				next++
				r.push(e)
				model = insert(model, e.key())
			case op < 11:
				e, ok := r.popMin()
				if ok != (len(model) > 0) {
					t.Fatalf("round %d step %d: popMin ok = %t, want %t", round, step, ok, len(model) > 0)
				}
				if !ok {
					continue
				}
				if e.key() != model[0] {
					t.Fatalf("round %d step %d: popMin = %x, want %x", round, step, e.key(), model[0])
				}
				model = model[1:]
				out = append(out, e)
			case op < 13 && len(model) > 0:
				i := rng.IntN(len(model))
				e, ok := r.remove(model[i])
				if !ok || e.key() != model[i] {
					t.Fatalf("round %d step %d: remove(%x) = %x, %t", round, step, model[i], e.key(), ok)
				}
				model = slices.Delete(model, i, i+1)
				if _, ok := r.remove(e.key()); ok {
					t.Fatalf("round %d step %d: removed %x twice", round, step, e.key())
				}
				out = append(out, e)
			case op == 13:
				r.tidy()
			case op == 14:
				// A scan from a random key sees exactly the model's keys from there, in order,
				// and stops when told to.
				from := uint64(0)
				if len(model) > 0 && rng.IntN(4) > 0 {
					from = model[rng.IntN(len(model))] + uint64(rng.IntN(2))
				}
				limit := rng.IntN(len(model) + 2)
				var got []uint64
				r.ascend(from, func(e entry) bool {
					got = append(got, e.key())
					return len(got) < limit
				})
				j, _ := slices.BinarySearch(model, from)
				want := model[j:]
				if len(want) > limit {
					want = want[:limit]
				}
				if limit == 0 && len(want) == 0 && len(got) == 0 {
					break
				}
				if limit == 0 {
					want = model[j:min(j+1, len(model))] // fn is called once before it can say stop
				}
				if !slices.Equal(got, want) {
					t.Fatalf("round %d step %d: ascend(%x) = %x, want %x", round, step, from, got, want)
				}
			case op < 17 && len(out) > 0:
				k := 1 + rng.IntN(len(out))
				batch := slices.Clone(out[:k])
				out = out[k:]
				slices.SortFunc(batch, func(a, b entry) int { return cmp.Compare(a.key(), b.key()) })
				r.merge(batch)
				for _, e := range batch {
					model = insert(model, e.key())
				}
			case len(out) > 0:
				i := rng.IntN(len(out))
				e := out[i]
				out = slices.Delete(out, i, i+1)
				r.reinsert(e)
				model = insert(model, e.key())
			}
			if got := checkReadySet(t, &r); !slices.Equal(got, model) {
				t.Fatalf("round %d step %d: ready = %x, want %x", round, step, got, model)
			}
			if err := tombstoneErr(&r); err != nil {
				t.Fatalf("round %d step %d: %v", round, step, err)
			}
			if n := r.expiries.Len(); n != 0 {
				t.Fatalf("round %d step %d: %d expiry entries without deadlines", round, step, n)
			}
		}
	}
}

// TestSearchRing checks the bounded seek into a fresh ring against a plain binary search, for
// every key from before the front to past the back, over rings without gaps in their sequence
// ids, with a few, with many, evenly spread and bunched, with tombstones, of a priority rank, and
// paged.
func TestSearchRing(t *testing.T) {
	rng := readySetRNG(t)
	for _, c := range []struct {
		name string
		n    int
		gap  func() uint64 // how far each sequence id is past the previous one
	}{
		{"contiguous", 100, func() uint64 { return 1 }},
		{"one gap", 100, func() uint64 { return 1 + uint64(rng.IntN(100)/99)*7 }},
		{"gaps", 100, func() uint64 { return 1 + uint64(rng.IntN(3)) }},
		{"sparse", 100, func() uint64 { return 1 + uint64(rng.IntN(1000)) }},
		{"alternating", 100, func() uint64 { return 2 }},
		{"bunched", 300, func() uint64 { return 1 + uint64(rng.IntN(50)/49)*uint64(rng.IntN(1<<20)) }},
		{"paged contiguous", 3 * ringPage, func() uint64 { return 1 }},
		{"paged gaps", 3 * ringPage, func() uint64 { return 1 + uint64(rng.IntN(2)) }},
		{"one", 1, func() uint64 { return 1 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, rank := range []uint8{0, 3} {
				var l ring[entry]
				for range rng.IntN(ringPage) { // start somewhere in the ring's buffer or first page
					l.push(entry{})
				}
				for l.len() > 0 {
					l.pop()
				}
				seq := uint64(rng.IntN(50))
				for range c.n {
					seq += c.gap()
					e := entry{env: &envelope{}, seq: seq, rank: rank}
					if rng.IntN(10) == 0 {
						e.env = nil // a tombstone keeps its key
					}
					l.push(e)
				}
				front, back := l.front().key(), l.at(l.len()-1).key()
				for k := front - min(front, 3); k <= back+3; k++ {
					if got, want := searchRing(&l, k), searchKey(l.len(), l.at, k); got != want {
						t.Fatalf("rank %d, key %x: searchRing = %d, want %d", rank, k, got, want)
					}
				}
				for _, k := range []uint64{0, ^uint64(0)} {
					if got, want := searchRing(&l, k), searchKey(l.len(), l.at, k); got != want {
						t.Fatalf("rank %d, key %x: searchRing = %d, want %d", rank, k, got, want)
					}
				}
			}
		})
	}
	var empty ring[entry]
	if got := searchRing(&empty, 5); got != 0 {
		t.Fatalf("empty ring: searchRing = %d, want 0", got)
	}
}

// TestFeederWaitsWhileAnotherReturns: while a stopped AutoAck consumer's feeder has not yet put
// back what it held (Queue.leaving), another feeder takes nothing itself, even when woken: the
// returning messages are older than anything it could take. Once they are back it takes in order.
func TestFeederWaitsWhileAnotherReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, q, c := queueWithConsumer(t, AutoAck(), Prefetch(4))
		synctest.Wait() // the feeder is parked, waiting
		q.mu.Lock()
		q.leaving = append(q.leaving, &Consumer{}) // as if another feeder were putting messages back
		q.mu.Unlock()
		if err := b.Publish(t.Context(), "", "q", Message{Body: []byte("later")}); err != nil {
			t.Fatal(err)
		}
		q.mu.Lock()
		c.feeder.wakeUp()
		q.mu.Unlock()
		synctest.Wait()
		if n := len(c.Deliveries()); n != 0 || q.Len() != 1 {
			t.Fatalf("while another feeder returns: %d received, %d ready; want 0 and 1", n, q.Len())
		}
		q.mu.Lock()
		q.leaving = nil
		q.dispatchLocked()
		q.commit()
		synctest.Wait()
		if n := len(c.Deliveries()); n != 1 {
			t.Fatalf("after the return: %d received, want 1", n)
		}
	})
}

// TestArrivalWaitsWhileFeederReturns: a message published while a stopped AutoAck consumer's
// feeder has not yet put back what it held stays ready, even for a push consumer with credit
// (the fast path of an arrival, deliverArrivingLocked, heeds Queue.leaving); once they are back
// it is delivered.
func TestArrivalWaitsWhileFeederReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, q, c := queueWithConsumer(t, Prefetch(4))
		q.mu.Lock()
		q.leaving = append(q.leaving, &Consumer{}) // as if a feeder were putting messages back
		q.mu.Unlock()
		if err := b.Publish(t.Context(), "", "q", Message{Body: []byte("later")}); err != nil {
			t.Fatal(err)
		}
		if n := len(c.Deliveries()); n != 0 || q.Len() != 1 {
			t.Fatalf("while a feeder returns: %d delivered, %d ready; want 0 and 1", n, q.Len())
		}
		q.mu.Lock()
		q.leaving = nil
		q.dispatchLocked()
		q.commit()
		if n := len(c.Deliveries()); n != 1 || q.Len() != 0 {
			t.Fatalf("after the return: %d delivered, %d ready; want 1 and 0", n, q.Len())
		}
	})
}

// queueWithConsumer returns a broker, closed at the test's end, with a queue "q" and one
// consumer of it.
func queueWithConsumer(t *testing.T, opts ...ConsumeOption) (*Broker, *Queue, *Consumer) {
	t.Helper()
	b := New()
	t.Cleanup(func() { b.Close() })
	q, err := b.DeclareQueue("q")
	if err != nil {
		t.Fatal(err)
	}
	c, err := q.Consume(t.Context(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b, q, c
}

// TestDeletedQueueKeepsNoMemory: a deleted queue whose *Queue the application still holds keeps
// nothing of what it held: no ring pages, spare or in use, no arrival stamps, no delivery slab.
func TestDeletedQueueKeepsNoMemory(t *testing.T) {
	b := New()
	defer b.Close()
	q, err := b.DeclareQueue("deep")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 * ringPage {
		if err := b.Publish(t.Context(), "", "deep", Message{Body: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	for range ringPage { // a page emptied at the front is kept spare
		d, err := q.Get(t.Context(), AutoAck())
		if err != nil {
			t.Fatal(err)
		}
		_ = d
	}
	if _, err := q.Get(t.Context()); err != nil { // a slab of leases
		t.Fatal(err)
	}
	c, err := q.Consume(t.Context(), Prefetch(2))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		<-c.Deliveries()
	}
	if _, err := b.DeleteQueue("deep"); err != nil {
		t.Fatal(err)
	}
	if err := c.AckUpTo(0); err != nil { // a no-op, which lets go of their leases
		t.Fatal(err)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	r := &q.core.ready
	if n := r.fresh.capacity() + len(r.fresh.spares) + r.returned.Len() + len(r.run) + q.core.stamps.capacity() + len(q.core.stamps.spares) +
		len(q.core.free) + q.core.gets.unacked.capacity(); n != 0 {
		t.Errorf("deleted queue keeps %d slots: ready ring %d (+%d spare pages), stamps %d, free leases %d, gets %d", n,
			r.fresh.capacity(), len(r.fresh.spares), q.core.stamps.capacity(), len(q.core.free), q.core.gets.unacked.capacity())
	}
}

// tombstoneErr checks the ready set's bound on tombstones (see readySet): headsErr, and that dead
// counts the tombstones exactly and oldestSeq is the least live sequence id. It returns what is
// wrong, or nil.
func tombstoneErr(r *readySet) error {
	if err := headsErr(r); err != nil {
		return err
	}
	dead := 0
	for rank := 0; rank <= len(r.lower); rank++ {
		l := r.level(uint8(rank))
		for i := range l.len() {
			if l.at(i).env == nil {
				dead++
			}
		}
	}
	for _, e := range r.run[r.runAt:] {
		if e.env == nil {
			dead++
		}
	}
	if dead != r.dead {
		return fmt.Errorf("%d tombstones, dead = %d", dead, r.dead)
	}
	least, ok := ^uint64(0), false
	r.ascend(0, func(e entry) bool {
		least, ok = min(least, e.seq), true
		return true
	})
	if got, gotOK := r.oldestSeq(); got != least && ok || gotOK != ok {
		return fmt.Errorf("oldestSeq() = %d, %t; want %d, %t", got, gotOK, least, ok)
	}
	return nil
}

// headsErr checks, in O(levels · log n), the parts of the ready set's bound on tombstones that
// oldestSeq relies on: every ring's head and the run's head are live; in the run, a search for
// a rank's least key lands on a live entry; and dead ≤ max(compactAt, live).
func headsErr(r *readySet) error {
	for rank := 0; rank <= len(r.lower); rank++ {
		if l := r.level(uint8(rank)); l.len() > 0 && l.front().env == nil {
			return fmt.Errorf("rank %d: tombstone at the head of the ring", rank)
		}
	}
	run := r.run[r.runAt:]
	if len(run) > 0 && run[0].env == nil {
		return fmt.Errorf("tombstone at the head of the run")
	}
	for rank := 0; rank <= len(r.lower); rank++ {
		k := uint64(rank)<<seqBits | 1
		if i := searchKey(len(run), func(i int) entry { return run[i] }, k); i < len(run) && run[i].rank == uint8(rank) && run[i].env == nil {
			return fmt.Errorf("rank %d: the search for its least key lands on a tombstone of the run, at %d of %d", rank, i, len(run))
		}
	}
	if live := r.len(); r.dead > max(compactAt, live) {
		return fmt.Errorf("%d tombstones beside %d live entries, want at most max(%d, live)", r.dead, live, compactAt)
	}
	return nil
}

// TestReadySetTombstonesBounded drives a ready set with priority levels and a sorted slice of
// keys through long stretches of removals from the middle (a selector's takes, expiries)
// between pushes, pops and returns, and checks after every step that the two agree and that
// the tombstones stay bounded by what is live (tombstoneErr): past the compaction threshold, and
// at the heads that Stats and the Age alert look at.
func TestReadySetTombstonesBounded(t *testing.T) {
	rng := readySetRNG(t)
	for round := range 4 {
		levels := 1 + rng.IntN(4)
		r := newReadySet(btree.NewFreeListG[entry](8), levels)
		var model []uint64
		var out []entry
		next := uint64(1)
		insert := func(k uint64) {
			j, _ := slices.BinarySearch(model, k)
			model = slices.Insert(model, j, k)
		}
		// Phases of growth (pushes, several at a time) and of shrinking (mostly removals from
		// anywhere), so that tombstones pile up past compactAt and are compacted away.
		for step := range 6000 {
			grow := step%3000 < 500
			switch op := rng.IntN(10); {
			case grow && op < 6, len(model) == 0:
				for range 1 + rng.IntN(16) {
					e := entry{env: testEnv, seq: next, rank: uint8(rng.IntN(levels))}
					next++
					r.push(e)
					insert(e.key())
				}
			case op == 6 && len(out) > 0:
				batch := out
				out = nil
				slices.SortFunc(batch, func(a, b entry) int { return cmp.Compare(a.key(), b.key()) })
				r.merge(batch)
				for _, e := range batch {
					insert(e.key())
				}
			case op == 7:
				e, ok := r.popMin()
				if !ok || e.key() != model[0] {
					t.Fatalf("round %d step %d: popMin = %x, %t; want %x", round, step, e.key(), ok, model[0])
				}
				model = model[1:]
				if rng.IntN(8) == 0 {
					out = append(out, e)
				}
			default:
				// Anywhere, or near the head, where selectors out of step take.
				i := rng.IntN(len(model))
				if rng.IntN(3) == 0 {
					i = rng.IntN(min(len(model), 8))
				}
				k := model[i]
				e, ok := r.remove(k)
				if !ok || e.key() != k {
					t.Fatalf("round %d step %d: remove(%x) = %x, %t", round, step, k, e.key(), ok)
				}
				model = slices.Delete(model, i, i+1)
				if rng.IntN(8) == 0 {
					out = append(out, e)
				}
			}
			check := headsErr // every step, and the whole set now and then: it is O(n)
			if step%16 == 0 {
				if got := checkReadySet(t, &r); !slices.Equal(got, model) {
					t.Fatalf("round %d step %d: ready = %x, want %x", round, step, got, model)
				}
				check = tombstoneErr
			}
			if err := check(&r); err != nil {
				t.Fatalf("round %d step %d: %v", round, step, err)
			}
		}
	}
	// A large bulk return of three ranks, taken from anywhere, some from the head: the run's
	// tombstones are buried at the ranks' starts and compacted away.
	r := newReadySet(btree.NewFreeListG[entry](8), 3)
	batch := make([]entry, 4096)
	for i := range batch {
		batch[i] = entry{env: testEnv, seq: uint64(i + 1), rank: uint8(i * 3 / len(batch))}
	}
	var model []uint64
	for _, e := range batch {
		model = append(model, e.key())
	}
	r.merge(batch)
	for step := 0; len(model) > 0; step++ {
		if rng.IntN(16) == 0 {
			if e, ok := r.popMin(); !ok || e.key() != model[0] {
				t.Fatalf("bulk return, step %d: popMin = %x, %t; want %x", step, e.key(), ok, model[0])
			}
			model = model[1:]
		} else {
			i := rng.IntN(len(model))
			if e, ok := r.remove(model[i]); !ok || e.key() != model[i] {
				t.Fatalf("bulk return, step %d: remove(%x) = %x, %t", step, model[i], e.key(), ok)
			}
			model = slices.Delete(model, i, i+1)
		}
		check := headsErr
		if step%16 == 0 {
			if got := checkReadySet(t, &r); !slices.Equal(got, model) {
				t.Fatalf("bulk return, step %d: ready = %x, want %x", step, got, model)
			}
			check = tombstoneErr
		}
		if err := check(&r); err != nil {
			t.Fatalf("bulk return, step %d: %v", step, err)
		}
	}
	if r.run != nil || r.dead != 0 {
		t.Fatalf("bulk return, all taken: run of %d, %d tombstones", len(r.run), r.dead)
	}
}

// TestSelectorsLeaveNoTombstones: a queue consumed only by selective consumers, even and odd,
// with small prefetches so that they fall out of step and take from the middle, keeps its
// tombstones bounded by what is live while it runs, and holds none once everything is acked:
// its rings are empty and small. With an Age alert, oldestSeq runs at the end of every critical
// section, and finds the oldest without walking tombstones. (A regression test: a selector's
// take left a tombstone that only a plain take of the head or an expiry cleared; 1M messages
// kept 30 MiB, and with an Age alert publishing went quadratic.)
func TestSelectorsLeaveNoTombstones(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int
		opts []QueueOption
		prio int // messages get priorities 0..prio-1
	}{
		{"plain", 200_000, nil, 1},
		{"age-alert", 100_000, []QueueOption{WithAlerts(Alerts{Age: time.Hour})}, 1},
		{"priorities", 50_000, []QueueOption{MaxPriority(2), WithAlerts(Alerts{Age: time.Hour})}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { selectorsOnly(t, tc.n, tc.prio, tc.opts...) })
		})
	}
}

// selectorsOnly publishes n messages, with priorities 0..prio-1 in turn, into a queue declared
// with opts that two selective consumers take from, even bodies and odd, each acking what it
// receives; it checks the ready set's tombstones as it goes and once everything is acked.
func selectorsOnly(t *testing.T, n, prio int, opts ...QueueOption) {
	b := New()
	defer b.Close()
	q, err := b.DeclareQueue("q", opts...)
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		q.mu.Lock()
		err := tombstoneErr(&q.core.ready)
		q.mu.Unlock()
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
	}
	for parity, prefetch := range []int{1, 3} {
		c, err := q.Consume(t.Context(), Prefetch(prefetch), Selector(func(m *Message) bool { return int(m.Body[0]) == parity }))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for d := range c.Deliveries() {
				d.Ack() // one that failed shows in the count of acks below
			}
		}()
	}
	bodies := [2][]byte{{0}, {1}}
	for i := range n {
		if err := b.Publish(t.Context(), "", "q", Message{Body: bodies[i%2], Priority: uint8(i % prio)}); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 999 {
			check(fmt.Sprintf("after %d publishes", i+1))
		}
	}
	synctest.Wait() // the consumers have acked everything and wait for more
	if s := q.Stats(); s.Acked != uint64(n) || s.Ready != 0 || s.OldestAge != 0 {
		t.Fatalf("after the run: acked %d, ready %d, oldest age %v; want %d, 0, 0", s.Acked, s.Ready, s.OldestAge, n)
	}
	check("after the run")
	q.mu.Lock()
	defer q.mu.Unlock()
	r := &q.core.ready
	if r.dead != 0 {
		t.Errorf("after the run: %d tombstones, want 0", r.dead)
	}
	for rank := 0; rank <= len(r.lower); rank++ {
		if l := r.level(uint8(rank)); l.len() != 0 || l.capacity() > ringPage {
			t.Errorf("after the run: rank %d's ring holds %d slots of %d, want 0 of at most %d", rank, l.len(), l.capacity(), ringPage)
		}
	}
	if len(r.run) != 0 {
		t.Errorf("after the run: %d entries in the run, want 0", len(r.run))
	}
}

// TestLater: a duration added to a queue's clock is capped at maxWait and saturates, so a
// deadline is never before now, whatever the duration.
func TestLater(t *testing.T) {
	const maxInt = 1<<63 - 1
	for _, tc := range []struct {
		now  int64
		d    time.Duration
		want int64
	}{
		{1, 0, 1},
		{1, 1, 2},
		{1, -1, 1},
		{1, -1 << 63, 1},
		{5, time.Second, 5 + int64(time.Second)},
		{1, maxWait, 1 + int64(maxWait)},
		{1, maxWait + 1, 1 + int64(maxWait)},
		{1, maxInt, 1 + int64(maxWait)},
		{int64(time.Hour), maxInt - 1, int64(time.Hour) + int64(maxWait)},
		{maxInt - int64(maxWait), maxWait, maxInt},
		{maxInt - int64(maxWait) + 1, maxWait, maxInt},
		{maxInt - 1, 2, maxInt},
		{maxInt, maxInt, maxInt},
		{maxInt, 0, maxInt},
	} {
		if got := later(tc.now, tc.d); got != tc.want {
			t.Errorf("later(%d, %d) = %d, want %d", tc.now, int64(tc.d), got, tc.want)
		}
	}
}

// TestSelectorLeavesNothing: a selector's message is the queue's scratch copy only during the
// call; after it the queue holds nothing of it (it kept the last body a selector saw, which a
// purge could not free).
func TestSelectorLeavesNothing(t *testing.T) {
	b := New()
	defer b.Close()
	q, err := b.DeclareQueue("q")
	require.NoError(t, err)
	require.NoError(t, b.Publish(t.Context(), "", "q", Message{Body: []byte("big"), Type: "t"}))
	saw := make(chan string, 1)
	c, err := q.Consume(t.Context(), Selector(func(m *Message) bool {
		select {
		case saw <- string(m.Body) + " " + m.Type:
		default:
		}
		return false
	}))
	require.NoError(t, err)
	require.Equal(t, "big t", <-saw, "the selector sees the whole message")
	var left Message
	q.view(func() { left = q.selecting })
	require.Equal(t, Message{}, left)
	require.NoError(t, c.Cancel())
}

// TestGiveBackAfterLetGo: Serve's giveBack leaves alone a delivery whose lease its consumer's
// list has let go of (an ack timeout or a context end took it back meanwhile), as it leaves
// alone any delivery no longer outstanding. The lease is then on the free list, with no
// holder: giveBack must not look at it as the delivery's. (It dereferenced the lease's nil
// holder, and panicked, before checking the generation.)
func TestGiveBackAfterLetGo(t *testing.T) {
	b, q, c := queueWithConsumer(t, Prefetch(1))
	if err := b.Publish(t.Context(), "", "q", Message{Body: []byte("m")}); err != nil {
		t.Fatal(err)
	}
	d := <-c.Deliveries()
	if err := c.Close(); err != nil { // d back, redelivered; its lease free
		t.Fatal(err)
	}
	func() {
		defer func() {
			if p := recover(); p != nil {
				q.mu.Unlock() // giveBack panicked holding it
				t.Fatalf("giveBack of a delivery taken back panicked: %v", p)
			}
		}()
		d.giveBack()
	}()
	if n, u := q.Len(), q.Unacked(); n != 1 || u != 0 {
		t.Fatalf("after giveBack: %d ready, %d unacked; want 1 and 0", n, u)
	}
}

// TestQueueIndexMirrorsQueues: the lock-free index of the default exchange's publish (byName)
// holds exactly the broker's queues, through declares, deletions of every kind and Close: a
// queue it kept after its deletion would stay reachable for good.
func TestQueueIndexMirrorsQueues(t *testing.T) {
	b := New()
	mirrored := func() {
		t.Helper()
		b.mu.RLock()
		defer b.mu.RUnlock()
		n := 0
		b.byName.Range(func(k, v any) bool {
			n++
			if b.queues[k.(string)] != v.(*Queue) {
				t.Errorf("byName has %q, which queues has not", k)
			}
			return true
		})
		if n != len(b.queues) {
			t.Errorf("byName has %d queues, queues %d", n, len(b.queues))
		}
	}
	for _, name := range []string{"a", "b", "auto", "gone"} {
		var opts []QueueOption
		if name == "auto" {
			opts = append(opts, AutoDelete())
		}
		if _, err := b.DeclareQueue(name, opts...); err != nil {
			t.Fatal(err)
		}
	}
	mirrored()
	if _, err := b.DeleteQueue("gone"); err != nil {
		t.Fatal(err)
	}
	q, err := b.Queue("auto")
	if err != nil {
		t.Fatal(err)
	}
	c, err := q.Consume(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Cancel(); err != nil { // its last consumer: the queue goes
		t.Fatal(err)
	}
	mirrored()
	if _, ok := b.byName.Load("auto"); ok {
		t.Error("the auto-deleted queue is still indexed")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	mirrored()
}

// BenchmarkLockHold times critical sections alone, the lock taken and released around each as
// its caller does: Stats' (statsLocked) against BrowseFrom's (readyPageLocked) for a page of 1
// and of 50 from the middle of a queue of 100 000 messages — the admin page's look at a queue
// must hold the lock no longer than Stats does; and Consumers' (consumersLocked) for 8 consumers,
// which the admin page's queue view shows too. The queues: fifo, its messages enqueued one
// after another (the seek finds its place in a few reads: searchRing); priorities, of two
// priorities alternating (each level's sequence ids have gaps, spread evenly); returned, its
// first 60% delivered and returned, every tenth message alone (the tree), the rest together
// (the run).
//
//	go test -run '^$' -bench LockHold -benchtime 2000000x .
func BenchmarkLockHold(b *testing.B) {
	br := New()
	defer br.Close()
	ctx := context.Background()
	for _, shape := range []string{"fifo", "priorities", "returned"} {
		var opts []QueueOption
		if shape == "priorities" {
			opts = append(opts, MaxPriority(1))
		}
		q, err := br.DeclareQueue(shape, opts...)
		if err != nil {
			b.Fatal(err)
		}
		for i := range 100_000 {
			if err := br.Publish(ctx, "", shape, Message{Body: []byte("x"), Priority: uint8(i % 2)}); err != nil {
				b.Fatal(err)
			}
		}
		if shape == "returned" {
			// 60 000 delivered; every tenth nacked back alone (to the tree), the others by the
			// consumer's close, together (a run); the last 40 000 still in the ring.
			c, err := q.Consume(ctx, Prefetch(0))
			if err != nil {
				b.Fatal(err)
			}
			ds := make([]Delivery, 0, 60_000)
			for len(ds) < cap(ds) {
				ds = append(ds, <-c.Deliveries())
			}
			if err := c.Cancel(); err != nil {
				b.Fatal(err)
			}
			for i := 0; i < len(ds); i += 10 {
				if err := ds[i].Nack(); err != nil {
					b.Fatal(err)
				}
			}
			if err := c.Close(); err != nil {
				b.Fatal(err)
			}
			<-c.Done()
		}
		b.Logf("%s: %d ready", shape, q.Len())
		mid := q.BrowseFrom(0, q.Len()/2)[q.Len()/2-1].ID
		b.Run(shape+"/stats", func(b *testing.B) {
			for b.Loop() {
				q.mu.Lock()
				_ = q.statsLocked()
				q.mu.Unlock()
			}
		})
		if shape == "fifo" {
			for range 8 {
				if _, err := q.Consume(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.Run("fifo/consumers-8", func(b *testing.B) {
				hs := make([]heldBy, 0, 8)
				for b.Loop() {
					q.mu.Lock()
					hs = q.consumersLocked(hs[:0])
					q.mu.Unlock()
				}
			})
		}
		for _, n := range []int{1, 50} {
			b.Run(fmt.Sprintf("%s/browse-%d", shape, n), func(b *testing.B) {
				es := make([]entry, 0, n)
				for b.Loop() {
					q.mu.Lock()
					es = q.readyPageLocked(mid+1, n, es[:0])
					q.mu.Unlock()
				}
			})
		}
	}
}

// BenchmarkBrokerLockHold times what the admin page's reads hold the broker's topology lock for
// (a read lock, which a waiting declaration turns into a wait for publishes to named
// exchanges), with 1,000 queues each bound to a topic exchange: Topology's critical section
// against the whole call (the copies and the sort are after the lock), and Queues'.
//
//	go test -run '^$' -bench BrokerLockHold .
func BenchmarkBrokerLockHold(b *testing.B) {
	br := New()
	defer br.Close()
	if _, err := br.DeclareExchange("events", ExchangeTopic); err != nil {
		b.Fatal(err)
	}
	for i := range 1000 {
		name := fmt.Sprintf("q%04d", i)
		if _, err := br.DeclareQueue(name, MaxLength(1000), DeadLetter("", "dlq")); err != nil {
			b.Fatal(err)
		}
		if err := br.Bind(name, "events", name+".#", nil); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("topology-locked", func(b *testing.B) {
		for b.Loop() {
			br.mu.RLock()
			_, _, _ = br.topologyLocked()
			br.mu.RUnlock()
		}
	})
	b.Run("topology-call", func(b *testing.B) {
		for b.Loop() {
			_ = br.Topology()
		}
	})
	b.Run("queues-locked", func(b *testing.B) {
		for b.Loop() {
			br.mu.RLock()
			_ = slices.Collect(maps.Values(br.queues))
			br.mu.RUnlock()
		}
	})
}

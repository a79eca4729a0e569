package warren

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/btree"
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
// pushes, pops, reinsertions of one popped entry and merges of several, and compares them after
// every step.
func TestReadySetAgainstSortedSlice(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	for range 20 {
		r := newReadySet(btree.NewFreeListG[entry](8), 1)
		var model []uint64 // ready keys, ascending
		var out []entry    // popped, not yet returned
		next := uint64(1)
		for step := range 1000 {
			switch op := rng.IntN(10); {
			case op < 4:
				r.push(entry{env: testEnv, seq: next})
				model = append(model, next)
				next++
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
			n, u := q.ready.len(), q.unacked
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
			slots, live := x.ready.fresh.len(), x.ready.len()
			x.mu.Unlock()
			if slots > 2*live+1024 {
				t.Errorf("queue %s: %d slots for %d live messages", x.name, slots, live)
			}
		}
	})
}

// TestReadySetLevelsAgainstSortedSlice drives a ready set with priority levels and a sorted
// slice of keys with the same random operations — pushes at random levels, pops, single and bulk
// returns, removals from anywhere (the expiry timer's and a selector's), tidying, and ascents
// from a random key (a selector's scan) — and compares them after every step.
func TestReadySetLevelsAgainstSortedSlice(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("WARREN_READYSET_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (WARREN_READYSET_SEED)", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
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
			if n := r.expiries.Len(); n != 0 {
				t.Fatalf("round %d step %d: %d expiry entries without deadlines", round, step, n)
			}
		}
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
		c.wakeLocked()
		q.mu.Unlock()
		synctest.Wait()
		if n := len(c.Deliveries()); n != 0 || q.Len() != 1 {
			t.Fatalf("while another feeder returns: %d received, %d ready; want 0 and 1", n, q.Len())
		}
		q.mu.Lock()
		q.leaving = nil
		q.dispatchLocked()
		q.unlock()
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
		q.unlock()
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

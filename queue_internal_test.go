package warren

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/btree"
)

// checkReadySet verifies the readySet invariant: every returned (tree) entry orders before every
// fresh (ring) entry, both parts ascend, and ascend visits exactly the entries popMin would
// return, in that order.
func checkReadySet(t *testing.T, r *readySet) []uint64 {
	t.Helper()
	var keys []uint64
	r.ascend(func(e entry) bool {
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
// pushes, pops and reinsertions of popped entries, and compares them after every step.
func TestReadySetAgainstSortedSlice(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	for range 20 {
		r := newReadySet(btree.NewFreeListG[entry](8))
		var model []uint64 // ready keys, ascending
		var out []entry    // popped, not yet returned
		next := uint64(1)
		for step := range 1000 {
			switch op := rng.IntN(10); {
			case op < 4:
				r.push(entry{seq: next})
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

// TestReapDispatchesOnlyAtTheEnd: a consumer's context ends while it holds more than one chunk
// of messages; between chunks, when the lock is let go, another consumer acks and so gains
// credit. Nothing may be dispatched to it then: the messages still to come back belong ahead of
// what is ready. Once all are back it receives the head, redelivered.
func TestReapDispatchesOnlyAtTheEnd(t *testing.T) {
	b := New()
	defer b.Close()
	q, err := b.DeclareQueue("q")
	if err != nil {
		t.Fatal(err)
	}
	ctxA, cancelA := context.WithCancel(t.Context())
	a, err := q.Consume(ctxA, Prefetch(2*returnChunk+1))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2*returnChunk + 10 {
		if err := b.Publish(t.Context(), "", "q", Message{Body: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2*returnChunk + 1 {
		<-a.Deliveries() // received: they come back redelivered
	}
	c, err := q.Consume(t.Context(), Prefetch(1))
	if err != nil {
		t.Fatal(err)
	}
	first := <-c.Deliveries() // the first message behind A's holding
	chunks := 0
	q.betweenChunks = func() {
		chunks++
		if chunks == 1 {
			if err := first.Ack(); err != nil { // c has credit again
				t.Error(err)
			}
		}
		if n := len(c.Deliveries()); n != 0 {
			t.Errorf("between chunks %d: %d deliveries dispatched before the return finished", chunks, n)
		}
	}
	cancelA()
	<-a.Done()
	if chunks != 2 {
		t.Fatalf("reap let go of the lock %d times, want 2", chunks)
	}
	d := <-c.Deliveries()
	if string(d.Message.Body) != "0" || !d.Redelivered {
		t.Fatalf("after the return: got %s (redelivered %t), want 0 redelivered", d.Message.Body, d.Redelivered)
	}
}

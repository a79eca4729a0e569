package warren

import (
	"slices"
	"testing"
)

// TestRingAgainstSlice pushes and pops across many wrap-arounds and growths, filters, and
// compares with a slice after every step.
func TestRingAgainstSlice(t *testing.T) {
	var r ring[int]
	var model []int
	next := 0
	contents := func() []int {
		out := make([]int, 0, r.len())
		for i := range r.len() {
			out = append(out, r.at(i))
		}
		return out
	}
	for step := range 5000 {
		switch {
		case step%7 == 3 && r.len() > 0:
			if got, want := r.front(), model[0]; got != want {
				t.Fatalf("step %d: front() = %d, want %d", step, got, want)
			}
			if got, want := r.pop(), model[0]; got != want {
				t.Fatalf("step %d: pop() = %d, want %d", step, got, want)
			}
			model = model[1:]
		case step%500 == 499:
			r.filter(func(v int) bool { return v%3 != 0 })
			model = slices.DeleteFunc(model, func(v int) bool { return v%3 == 0 })
		case step%1700 == 1699:
			r.clear()
			model = nil
		default:
			r.push(next)
			model = append(model, next)
			next++
		}
		if got := contents(); !slices.Equal(got, model) {
			t.Fatalf("step %d: ring = %v, want %v", step, got, model)
		}
	}
}

// TestRingClearsReferences: popped, filtered and cleared slots hold no pointers, so that what
// they pointed to can be collected.
func TestRingClearsReferences(t *testing.T) {
	var r ring[*int]
	for i := range 8 {
		r.push(&i)
	}
	r.pop()
	r.filter(func(p *int) bool { return *p%2 == 0 })
	live := 0
	for _, p := range r.buf {
		if p != nil {
			live++
		}
	}
	if live != r.len() {
		t.Fatalf("%d non-nil slots, want %d (the live elements)", live, r.len())
	}
	r.clear()
	for i, p := range r.buf {
		if p != nil {
			t.Fatalf("slot %d not cleared", i)
		}
	}
}

// TestRingShrinks: after a burst drains, a large ring gives most of its memory back.
func TestRingShrinks(t *testing.T) {
	var r ring[int]
	const n = 4 * ringKeep
	for i := range n {
		r.push(i)
	}
	for i := range n - 10 {
		if got := r.pop(); got != i {
			t.Fatalf("pop() = %d, want %d", got, i)
		}
	}
	if len(r.buf) > ringKeep {
		t.Fatalf("capacity %d after draining to %d elements, want at most %d", len(r.buf), r.len(), ringKeep)
	}
	for i := range 10 {
		if got := r.pop(); got != n-10+i {
			t.Fatalf("pop() = %d after shrinking, want %d", got, n-10+i)
		}
	}
}

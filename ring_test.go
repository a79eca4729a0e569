package warren

import (
	"fmt"
	"math/rand/v2"
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

	// Paged: what pop, popBack and filter free, and clear, is zeroed, in the pages kept for
	// reuse too.
	x := 1
	for range 5 * ringPage {
		r.push(&x)
	}
	for range ringPage + 7 {
		r.pop()
		r.popBack()
	}
	r.filter(func(*int) bool { return false })
	for range 3 * ringPage {
		r.push(&x)
	}
	r.clear()
	for j, page := range append([][]*int{r.buf}, r.spares...) {
		for i, p := range page {
			if p != nil {
				t.Fatalf("page %d slot %d not cleared", j, i)
			}
		}
	}
	if len(r.spares) == 0 {
		t.Fatal("no page kept for reuse")
	}
}

// TestRingShrinks: after a burst drains, a large ring gives its memory back page by page.
func TestRingShrinks(t *testing.T) {
	var r ring[int]
	const n = 4 * ringPage
	for i := range n {
		r.push(i)
	}
	if c := r.capacity(); c != n {
		t.Fatalf("capacity %d holding %d, want %d: pages are filled, not doubled", c, n, n)
	}
	for i := range n - 10 {
		if got := r.pop(); got != i {
			t.Fatalf("pop() = %d, want %d", got, i)
		}
	}
	if c := r.capacity(); c > ringPage || len(r.spares) > ringSpares {
		t.Fatalf("capacity %d and %d spare pages after draining to %d elements, want at most %d and %d",
			c, len(r.spares), r.len(), ringPage, ringSpares)
	}
	for i := range 10 {
		if got := r.pop(); got != n-10+i {
			t.Fatalf("pop() = %d after shrinking, want %d", got, n-10+i)
		}
	}
	if r.pages != nil || len(r.buf) != ringPage {
		t.Fatalf("empty ring: paged %v, buffer %d; want flat with one page kept", r.pages != nil, len(r.buf))
	}
}

// TestRingPagedAgainstSlice drives a ring across the flat and paged layouts and back with every
// operation, against a slice: bursts that fill several pages and drain them, pushes and pops at
// both ends, filters and overwrites; the whole content is compared at every phase's end and the
// ends after every step.
func TestRingPagedAgainstSlice(t *testing.T) {
	var r ring[int]
	var model []int
	next := 0
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(where string) {
		t.Helper()
		if r.len() != len(model) {
			t.Fatalf("%s: len %d, want %d", where, r.len(), len(model))
		}
		for i, v := range model {
			if got := r.at(i); got != v {
				t.Fatalf("%s: at(%d) = %d, want %d", where, i, got, v)
			}
		}
		if c := r.capacity(); len(model) > ringPage && c > len(model)+2*ringPage {
			t.Fatalf("%s: capacity %d for %d elements: pages past the back were kept", where, c, len(model))
		}
	}
	for phase := range 60 {
		target := rng.IntN(3*ringPage + 100)
		for step := 0; len(model) != target && step < 4*ringPage; step++ {
			grow := len(model) < target
			switch op := rng.IntN(10); {
			case grow && op < 8:
				r.push(next)
				model = append(model, next)
				next++
			case grow:
				r.pushFront(-next)
				model = append([]int{-next}, model...)
				next++
			case op < 8:
				if got := r.pop(); got != model[0] {
					t.Fatalf("phase %d: pop() = %d, want %d", phase, got, model[0])
				}
				model = model[1:]
			default:
				if got := r.popBack(); got != model[len(model)-1] {
					t.Fatalf("phase %d: popBack() = %d, want %d", phase, got, model[len(model)-1])
				}
				model = model[:len(model)-1]
			}
			if len(model) > 0 && (r.front() != model[0] || r.at(r.len()-1) != model[len(model)-1]) {
				t.Fatalf("phase %d step %d: ends %d…%d, want %d…%d", phase, step, r.front(), r.at(r.len()-1), model[0], model[len(model)-1])
			}
		}
		check(fmt.Sprintf("phase %d", phase))
		switch phase % 4 {
		case 1:
			m := rng.IntN(7) + 2
			r.filter(func(v int) bool { return v%m != 0 })
			model = slices.DeleteFunc(model, func(v int) bool { return v%m == 0 })
			check(fmt.Sprintf("phase %d filter", phase))
		case 2:
			if len(model) > 0 {
				i := rng.IntN(len(model))
				r.set(i, 1e9+i)
				model[i] = 1e9 + i
			}
			check(fmt.Sprintf("phase %d set", phase))
		case 3:
			if phase%12 == 11 {
				r.clear()
				model = nil
				check(fmt.Sprintf("phase %d clear", phase))
			}
		}
	}
}

package warren

// ring is a growable FIFO of values: push at the back, pop at the front, both amortised O(1).
// Popped slots are zeroed so that the garbage collector can reclaim what they pointed to, and a
// large ring that empties to a quarter shrinks by half, so a burst does not pin its memory. The
// zero ring is empty and ready to use. Unsafe for concurrent use.
type ring[T any] struct {
	buf  []T // len(buf) is zero or a power of two
	head int // index of the front element
	n    int // number of elements
}

func (r *ring[T]) len() int { return r.n }

func (r *ring[T]) push(v T) {
	if r.n == len(r.buf) {
		r.grow()
	}
	r.buf[(r.head+r.n)&(len(r.buf)-1)] = v
	r.n++
}

// front returns the front element; the ring must not be empty.
func (r *ring[T]) front() T { return r.buf[r.head] }

// at returns the i-th element from the front, 0 ≤ i < len.
func (r *ring[T]) at(i int) T { return r.buf[(r.head+i)&(len(r.buf)-1)] }

// set replaces the i-th element from the front, 0 ≤ i < len.
func (r *ring[T]) set(i int, v T) { r.buf[(r.head+i)&(len(r.buf)-1)] = v }

// pop removes and returns the front element; the ring must not be empty.
func (r *ring[T]) pop() T {
	var zero T
	v := r.buf[r.head]
	r.buf[r.head] = zero
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
	if len(r.buf) > ringKeep && r.n < len(r.buf)/4 {
		r.resize(len(r.buf) / 2)
	}
	return v
}

// pushFront adds v at the front.
func (r *ring[T]) pushFront(v T) {
	if r.n == len(r.buf) {
		r.grow()
	}
	r.head = (r.head - 1) & (len(r.buf) - 1)
	r.buf[r.head] = v
	r.n++
}

// popBack removes and returns the back element; the ring must not be empty.
func (r *ring[T]) popBack() T {
	var zero T
	i := (r.head + r.n - 1) & (len(r.buf) - 1)
	v := r.buf[i]
	r.buf[i] = zero
	r.n--
	return v
}

// ringKeep is the capacity (1.5 MiB of entries) below which a ring never shrinks: shrinking
// smaller rings would make a queue whose depth swings reallocate over and over.
const ringKeep = 1 << 16

// filter keeps, in order, the elements for which keep returns true. O(len).
func (r *ring[T]) filter(keep func(T) bool) {
	var zero T
	w := 0
	for i := 0; i < r.n; i++ {
		v := r.at(i)
		if keep(v) {
			r.buf[(r.head+w)&(len(r.buf)-1)] = v
			w++
		}
	}
	for i := w; i < r.n; i++ {
		r.buf[(r.head+i)&(len(r.buf)-1)] = zero
	}
	r.n = w
}

// clear removes every element.
func (r *ring[T]) clear() {
	if len(r.buf) > ringKeep {
		r.buf = nil
	} else {
		clear(r.buf)
	}
	r.head, r.n = 0, 0
}

func (r *ring[T]) grow() {
	r.resize(max(2*len(r.buf), 8))
}

// resize moves the elements into a new buffer of size slots, a power of two ≥ len.
func (r *ring[T]) resize(size int) {
	buf := make([]T, size)
	for i := 0; i < r.n; i++ {
		buf[i] = r.at(i)
	}
	r.buf, r.head = buf, 0
}

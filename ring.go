package warren

// ring is a growable FIFO of values: push at the back, pop at the front, both amortised O(1),
// with indexed access. The zero ring is empty and ready to use. Unsafe for concurrent use.
//
// It has two layouts, which differ only in memory:
//   - flat, up to ringPage elements: one power-of-two buffer that doubles as it fills;
//   - paged, beyond: a FIFO of pages of ringPage elements each. Growing adds a page; nothing is
//     copied, so a push into a queue millions deep costs what it costs into an empty one (a
//     doubling buffer would copy every element under the queue lock, a pause of a tenth of a
//     second at ten million), and no buffer outgrown is left for the garbage collector, so a
//     deep queue's memory is its messages' plus at most a page. A page emptied at the front is
//     kept for reuse, up to ringSpares of them, and freed beyond, so memory follows the depth
//     down while a queue whose depth saw-tooths does not reallocate its pages every time.
//
// Popped, filtered and cleared slots are zeroed so that the garbage collector can reclaim what
// they pointed to.
type ring[T any] struct {
	buf    []T   // flat: len(buf) is zero or a power of two ≤ ringPage; nil when paged
	pages  [][]T // paged: element i is at(head+i) over these; nil when flat
	spares [][]T // emptied (zeroed) pages kept for reuse, at most ringSpares
	head   int   // index of the front element: in buf (flat) or in pages[0] (paged)
	n      int   // number of elements
}

// ringPage is the most elements a flat ring holds and the size of a page (128 KiB of entries).
// Up to ringSpares emptied pages are kept (2 MiB of entries), as much as a ring of 65536
// elements held before it was paged.
const (
	ringPageShift = 12
	ringPage      = 1 << ringPageShift
	ringSpares    = 16
)

func (r *ring[T]) len() int { return r.n }

// slot returns the address of the i-th element from the front, 0 ≤ i < the capacity.
func (r *ring[T]) slot(i int) *T {
	if r.pages != nil {
		j := r.head + i
		return &r.pages[j>>ringPageShift][j&(ringPage-1)]
	}
	return &r.buf[(r.head+i)&(len(r.buf)-1)]
}

func (r *ring[T]) push(v T) {
	if r.pages == nil && r.n == len(r.buf) {
		r.grow()
	}
	if r.pages != nil && r.head+r.n == len(r.pages)*ringPage {
		r.pages = append(r.pages, r.newPage())
	}
	*r.slot(r.n) = v
	r.n++
}

// front returns the front element; the ring must not be empty.
func (r *ring[T]) front() T { return *r.slot(0) }

// at returns the i-th element from the front, 0 ≤ i < len.
func (r *ring[T]) at(i int) T { return *r.slot(i) }

// set replaces the i-th element from the front, 0 ≤ i < len.
func (r *ring[T]) set(i int, v T) { *r.slot(i) = v }

// pop removes and returns the front element; the ring must not be empty.
func (r *ring[T]) pop() T {
	var zero T
	s := r.slot(0)
	v := *s
	*s = zero
	r.n--
	if r.pages == nil {
		r.head = (r.head + 1) & (len(r.buf) - 1)
		return v
	}
	r.head++
	if r.n == 0 {
		r.flatten()
	} else if r.head == ringPage {
		r.freePage(r.pages[0])
		r.pages[0] = nil
		r.pages = r.pages[1:]
		r.head = 0
	}
	return v
}

// pushFront adds v at the front.
func (r *ring[T]) pushFront(v T) {
	if r.pages == nil && r.n == len(r.buf) {
		r.grow()
	}
	if r.pages == nil {
		r.head = (r.head - 1) & (len(r.buf) - 1)
	} else {
		if r.head == 0 {
			r.pages = append([][]T{r.newPage()}, r.pages...)
			r.head = ringPage
		}
		r.head--
	}
	*r.slot(0) = v
	r.n++
}

// popBack removes and returns the back element; the ring must not be empty.
func (r *ring[T]) popBack() T {
	var zero T
	s := r.slot(r.n - 1)
	v := *s
	*s = zero
	r.n--
	r.trimPages()
	return v
}

// filter keeps, in order, the elements for which keep returns true. O(len).
func (r *ring[T]) filter(keep func(T) bool) {
	var zero T
	w := 0
	for i := 0; i < r.n; i++ {
		v := r.at(i)
		if keep(v) {
			r.set(w, v)
			w++
		}
	}
	for i := w; i < r.n; i++ {
		r.set(i, zero)
	}
	r.n = w
	r.trimPages()
}

// clear removes every element. A flat ring keeps its buffer, a paged one its first page as
// the buffer and as many others as it keeps spare.
func (r *ring[T]) clear() {
	if r.pages == nil {
		clear(r.buf)
	} else {
		for _, p := range r.pages {
			clear(p)
		}
		r.flatten()
	}
	r.head, r.n = 0, 0
}

// capacity is how many elements the ring holds without allocating, beyond its spare pages.
func (r *ring[T]) capacity() int {
	if r.pages != nil {
		return len(r.pages) * ringPage
	}
	return len(r.buf)
}

// grow doubles a flat ring, or makes a full ringPage one paged.
func (r *ring[T]) grow() {
	if len(r.buf) < ringPage {
		r.resize(max(2*len(r.buf), 8))
		return
	}
	r.resize(ringPage) // the front at index 0: the buffer becomes the first page
	r.pages, r.buf = [][]T{r.buf}, nil
}

// resize moves the elements of a flat ring into a new buffer of size slots, a power of two ≥ len.
func (r *ring[T]) resize(size int) {
	buf := make([]T, size)
	for i := 0; i < r.n; i++ {
		buf[i] = r.at(i)
	}
	r.buf, r.head = buf, 0
}

// newPage returns an empty page, a spare one if there is one.
func (r *ring[T]) newPage() []T {
	if n := len(r.spares); n > 0 {
		p := r.spares[n-1]
		r.spares[n-1] = nil
		r.spares = r.spares[:n-1]
		return p
	}
	return make([]T, ringPage)
}

// freePage keeps an emptied (zeroed) page for reuse, if fewer than ringSpares are kept.
func (r *ring[T]) freePage(p []T) {
	if len(r.spares) < ringSpares {
		r.spares = append(r.spares, p)
	}
}

// trimPages frees the pages past the back of a paged ring, and makes an empty one flat.
func (r *ring[T]) trimPages() {
	if r.pages == nil {
		return
	}
	if r.n == 0 {
		r.flatten()
		return
	}
	for used := (r.head + r.n + ringPage - 1) >> ringPageShift; len(r.pages) > used; {
		last := len(r.pages) - 1
		r.freePage(r.pages[last])
		r.pages[last] = nil
		r.pages = r.pages[:last]
	}
}

// flatten makes an empty paged ring flat again: its first page becomes the buffer, the others
// spares.
func (r *ring[T]) flatten() {
	for _, p := range r.pages[1:] {
		r.freePage(p)
	}
	r.buf, r.pages, r.head = r.pages[0], nil, 0
}

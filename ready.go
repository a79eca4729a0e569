package warren

import (
	"slices"

	"github.com/google/btree"
)

// entry is one message's place in one queue. It moves by value between the ready set, a
// delivery and back, so a queue allocates nothing per message beyond its rings and nodes.
type entry struct {
	env         *envelope // nil in a tombstone: a slot whose message was removed (see readySet)
	seq         uint64    // position in the queue, assigned at enqueue, never changed
	deadline    int64     // when it expires, on the queue's clock; 0 for never (see ttl.go)
	returns     uint32    // times the message came back after a delivery (x-delivery-count)
	redelivered bool      // delivered before and returned
	rank        uint8     // priority level, 0 first: max priority − message priority; 0 without priorities
}

// seqBits is how many low bits of a key hold the sequence id; the rank takes the top byte.
const seqBits = 56

// key orders the ready set: ascending key = delivery order, (priority desc, seq asc) packed as
// rank<<56 | seq. Without priorities every rank is 0 and the key is the sequence id.
// Sequence ids stay below 2^56: at a billion messages a second, for two years.
func (e entry) key() uint64 { return uint64(e.rank)<<seqBits | e.seq }

func entryLess(a, b entry) bool { return a.key() < b.key() }

// readySet is the ordered store of a queue's ready messages: one set ordered by key, kept in
// three parts. It is unsafe for concurrent use: its Queue's mu guards it.
//   - fresh: FIFO rings that new messages are appended to, one per priority level (fresh for
//     rank 0, the only one without priorities, and lower[rank-1] for the others); keys ascend
//     along each ring.
//   - returned: a btree of messages that came back one at a time (a Nack), each under its
//     original key, so it lands exactly where it was: O(log n) instead of a merge.
//   - run: messages that came back together (a consumer's context ended, Recover, NackUpTo),
//     sorted by key once and merged in O(n) rather than inserted one by one; run[runAt:] are
//     still ready.
//
// popMin takes the least key of the heads. Within a level every returned message is older
// than every fresh one (an entry leaves the set only from its level's minimum, and fresh entries
// are the newest), but popMin does not rely on it.
//
// A message removed from the middle of a ring or the run (it expired, or a selector took it)
// leaves a tombstone there, an entry with a nil env that keeps its key so that the ring or run
// stays sorted for searches; dead counts them. Every operation keeps them bounded by what is
// live, in amortised O(1), and costs no more than a test of dead while it is 0:
//   - The head of every ring and of the run is live: tombstones that reach a head are dropped
//     (trimRing, trimRun).
//   - In the run, which holds every rank, the tombstones before a rank's first live entry are
//     buried: their seq is 0, below every sequence id (ids start at 1), so a search for the
//     rank's least key (rank<<seqBits | 1) lands on its first live entry. A tombstone is
//     buried at most once (bury).
//   - dead ≤ max(compactAt, len()): beyond, the rings and the run are compacted (tidy), which
//     costs O(their slots) < O(2·dead), paid for by the dead removals since the last compaction.
//
// So the oldest entry of each level is found without walking tombstones (oldestSeq: Stats, and
// the Age alert at the end of every critical section), and the rings and the run hold
// O(live + compactAt) slots however selectors take from them. expiries indexes the entries
// with a deadline (ttl.go).
type readySet struct {
	fresh    ring[entry]
	lower    []ring[entry] // priority queues only: the rings of ranks 1 and up
	low      int           // every lower ring before lower[low] is empty
	nLower   int           // entries in the lower rings, tombstones included
	returned *btree.BTreeG[entry]
	run      []entry
	runAt    int
	dead     int
	expiries *btree.BTreeG[expiry]
	bytes    int64 // body bytes of the live entries
	extra    int64 // their footprints beyond their bodies (envelope.footprint)
	// floors[rank] is the least key of that rank put back (not pushed: a push is the newest of
	// its rank) since the queue last read it (see Queue.cursorsLocked): selector cursors of the
	// rank past it must move back. lowered says whether any floor is set.
	floors  []uint64
	lowered bool
	// paged are the messages on disk (paged.go), counted by len and bytes.
	paged pagedTails
}

// noFloor is a floor when nothing was put back.
const noFloor = ^uint64(0)

// compactAt is how many tombstones a ready set may hold, however short it is, before it
// compacts its rings and run: 32 KiB of slots, which spares a short queue a compaction every
// few removals.
const compactAt = 1024

// newReadySet returns an empty ready set with levels priority levels, whose btree takes its
// nodes from free, a free list shared by a broker's queues, so that the nodes one queue's burst
// of returns released serve the next burst anywhere.
func newReadySet(free *btree.FreeListG[entry], levels int) readySet {
	r := readySet{returned: btree.NewWithFreeListG(32, entryLess, free), expiries: newExpiryIndex()}
	r.paged.min = noFloor
	r.floors = make([]uint64, levels)
	for i := range r.floors {
		r.floors[i] = noFloor
	}
	if levels > 1 {
		r.lower = make([]ring[entry], levels-1)
	}
	return r
}

func (r *readySet) len() int { return r.inMemory() + r.paged.n }

// inMemory returns the number of ready entries in memory, not paged.
func (r *readySet) inMemory() int {
	return r.fresh.len() + r.nLower + r.returned.Len() + len(r.run) - r.runAt - r.dead
}

// level returns the fresh ring of a rank.
func (r *readySet) level(rank uint8) *ring[entry] {
	if rank == 0 {
		return &r.fresh
	}
	return &r.lower[rank-1]
}

// push appends a fresh entry, newer than every entry of its level.
func (r *readySet) push(e entry) {
	if e.rank == 0 {
		r.fresh.push(e)
	} else {
		r.lower[e.rank-1].push(e)
		r.nLower++
		r.low = min(r.low, int(e.rank-1))
	}
	r.index(e)
}

// putBack records that an entry that left the set came back, possibly behind a selector's cursor.
func (r *readySet) putBack(e entry) {
	if k := e.key(); k < r.floors[e.rank] {
		r.floors[e.rank] = k
		r.lowered = true
	}
}

// reinsert puts back an entry that left the set, at its original position.
func (r *readySet) reinsert(e entry) {
	r.returned.ReplaceOrInsert(e)
	r.putBack(e)
	r.index(e)
}

// merge adds entries that left the set, sorted by key, at their original positions. A batch
// much smaller than the run still waiting goes into the tree instead: merging copies the run,
// and a few returns beside a large run must not cost O(run) each.
func (r *readySet) merge(sorted []entry) {
	rest := r.run[r.runAt:]
	if len(rest) == 0 {
		for _, e := range sorted {
			r.putBack(e)
			r.index(e)
		}
		r.run, r.runAt = sorted, 0
		return
	}
	if len(sorted)*16 < len(rest) {
		for _, e := range sorted {
			r.reinsert(e)
		}
		return
	}
	for _, e := range sorted {
		r.putBack(e)
		r.index(e)
	}
	// The merge copies the run anyway: it leaves the run's tombstones behind.
	merged := make([]entry, 0, len(rest)+len(sorted))
	for len(rest) > 0 && len(sorted) > 0 {
		switch {
		case rest[0].env == nil:
			rest = rest[1:]
			r.dead--
		case rest[0].key() < sorted[0].key():
			merged, rest = append(merged, rest[0]), rest[1:]
		default:
			merged, sorted = append(merged, sorted[0]), sorted[1:]
		}
	}
	for _, e := range rest {
		if e.env == nil {
			r.dead--
			continue
		}
		merged = append(merged, e)
	}
	r.run, r.runAt = append(merged, sorted...), 0
}

// freshHead returns the fresh ring holding the least fresh key, or nil when every ring is empty.
func (r *readySet) freshHead() *ring[entry] {
	if r.fresh.len() > 0 {
		return &r.fresh
	}
	for ; r.low < len(r.lower); r.low++ {
		if l := &r.lower[r.low]; l.len() > 0 {
			return l
		}
	}
	return nil
}

// popFresh removes the head of a fresh ring.
func (r *readySet) popFresh(l *ring[entry]) entry {
	if l != &r.fresh {
		r.nLower--
	}
	return l.pop()
}

// popMin removes and returns the first entry in delivery order, paging in the chunk that holds
// it if it is paged (fault).
func (r *readySet) popMin() (entry, bool) {
	for {
		if e, ok := r.popMemory(); ok || !r.fault() {
			return e, ok
		}
	}
}

// popMemory is popMin without paging in: it returns none when the first entry is paged.
func (r *readySet) popMemory() (entry, bool) {
	if r.returned.Len() == 0 && r.runAt == len(r.run) {
		if r.fresh.len() > 0 { // the common case: nothing came back
			if r.fresh.front().key() > r.paged.min {
				return entry{}, false
			}
			e := r.fresh.pop()
			if r.dead > 0 {
				r.trimRing(&r.fresh)
				r.tidy()
			}
			r.unindex(e)
			return e, true
		}
		if l := r.freshHead(); l != nil {
			if l.front().key() > r.paged.min {
				return entry{}, false
			}
			e := r.popFresh(l)
			if r.dead > 0 {
				r.trimRing(l)
				r.tidy()
			}
			r.unindex(e)
			return e, true
		}
		return entry{}, false
	}
	const (
		fromTree = iota + 1
		fromRun
		fromFresh
	)
	var (
		best entry
		from int
	)
	if r.returned.Len() > 0 {
		best, _ = r.returned.Min()
		from = fromTree
	}
	if r.runAt < len(r.run) && (from == 0 || r.run[r.runAt].key() < best.key()) {
		best, from = r.run[r.runAt], fromRun
	}
	l := r.freshHead()
	if l != nil && l.front().key() < best.key() {
		best, from = l.front(), fromFresh
	}
	if best.key() > r.paged.min {
		return entry{}, false
	}
	switch from {
	case fromTree:
		r.returned.DeleteMin()
	case fromRun:
		r.run[r.runAt] = entry{}
		r.runAt++
		r.trimRun()
	case fromFresh:
		r.popFresh(l)
		if r.dead > 0 {
			r.trimRing(l)
		}
	}
	if r.dead > 0 {
		r.tidy()
	}
	r.unindex(best)
	return best, true
}

// trimRing drops the tombstones at the head of the fresh ring l.
func (r *readySet) trimRing(l *ring[entry]) {
	for l.len() > 0 && l.front().env == nil {
		r.popFresh(l)
		r.dead--
	}
}

// trimRun drops the tombstones at the head of the run, and the run once nothing in it is ready.
func (r *readySet) trimRun() {
	for r.runAt < len(r.run) && r.run[r.runAt].env == nil {
		r.run[r.runAt] = entry{}
		r.runAt++
		r.dead--
	}
	if r.runAt == len(r.run) {
		r.run, r.runAt = nil, 0
	}
}

// bury gives sequence id 0 to the tombstones at the front of run, a stretch of the run that
// starts where the first live entry of rank was, up to the rank's next live entry: they then
// sort before every key of the rank, and a search for its least key skips them. Only tombstones
// after a rank's first live entry are not yet buried, so each is buried at most once.
func bury(run []entry, rank uint8) {
	for i := range run {
		if run[i].env != nil || run[i].rank != rank {
			return
		}
		run[i].seq = 0
	}
}

// ascend calls fn for each ready entry with a key of at least from, in delivery order, until fn
// returns false. fn must not change the set.
func (r *readySet) ascend(from uint64, fn func(entry) bool) {
	for rank := int(from >> seqBits); rank <= len(r.lower); rank++ {
		if !r.scanRank(uint8(rank), max(from, uint64(rank)<<seqBits), fn) {
			return
		}
	}
}

// scanRank calls fn for each ready entry of one rank with a key of at least from, in order,
// until fn returns false; it reports whether fn never did. The rank's ring and the run are
// searched and walked by index; the tree, only when it holds something, in step with them.
func (r *readySet) scanRank(rank uint8, from uint64, fn func(entry) bool) bool {
	l := r.level(rank)
	run := r.run[r.runAt:]
	// A selector's scan usually finds nothing new: its cursor is past the tails. Those cases
	// skip the binary searches.
	s := rankScan{ring: l, at: searchRing(l, from), limit: uint64(rank)<<seqBits | (1<<seqBits - 1)}
	if len(run) > 0 && run[len(run)-1].key() >= from {
		s.run = run[searchKey(len(run), func(i int) entry { return run[i] }, from):]
	}
	if r.returned.Len() > 0 {
		stopped := false
		r.returned.AscendGreaterOrEqual(keyEntry(from), func(t entry) bool {
			if t.rank != rank {
				return false
			}
			for e, ok := s.next(t.key()); ok; e, ok = s.next(t.key()) {
				if e.env != nil && !fn(e) {
					stopped = true
					return false
				}
			}
			stopped = !fn(t)
			return !stopped
		})
		if stopped {
			return false
		}
	}
	for e, ok := s.next(s.limit); ok; e, ok = s.next(s.limit) {
		if e.env != nil && !fn(e) {
			return false
		}
	}
	return true
}

// rankScan walks one rank's ring and the run together, in key order.
type rankScan struct {
	ring  *ring[entry]
	at    int
	run   []entry
	limit uint64 // the rank's largest key
}

// next returns the lesser of the ring's and the run's next entries if its key is at most upto
// (and within the rank), and moves past it.
func (s *rankScan) next(upto uint64) (entry, bool) {
	upto = min(upto, s.limit)
	inRing := s.at < s.ring.len() && s.ring.at(s.at).key() <= upto
	inRun := len(s.run) > 0 && s.run[0].key() <= upto
	switch {
	case inRun && (!inRing || s.run[0].key() < s.ring.at(s.at).key()):
		e := s.run[0]
		s.run = s.run[1:]
		return e, true
	case inRing:
		e := s.ring.at(s.at)
		s.at++
		return e, true
	}
	return entry{}, false
}

// clear removes every entry and returns how many there were.
func (r *readySet) clear() int {
	n := r.len()
	r.fresh.clear()
	for i := range r.lower {
		r.lower[i].clear()
	}
	r.low, r.nLower = 0, 0
	r.returned.Clear(true)
	r.run, r.runAt = nil, 0
	r.dead = 0
	r.expiries.Clear(false)
	chunks, pending := r.dropPaged()
	r.paged.dropped = append(r.paged.dropped, chunks...)
	r.paged.droppedPending = append(r.paged.droppedPending, pending...)
	r.bytes, r.extra = 0, 0 // after dropPaged, which takes its own share out of bytes
	return n
}

// footprint returns the footprint of the ready messages, paged or not (envelope.footprint).
func (r *readySet) footprint() int64 { return r.bytes + r.extra + r.paged.extra }

// oldestSeq returns the least sequence id of the ready set: the message that has waited longest,
// which with priorities or returns need not be the next one delivered. O(levels · log n): by the
// ready set's invariant, each ring's head and the entry a search for each rank's least key finds
// in the run are live, and they are the oldest of their rank there.
func (r *readySet) oldestSeq() (uint64, bool) {
	if r.len() == 0 {
		return 0, false
	}
	least := ^uint64(0)
	run := r.run[r.runAt:]
	for rank := 0; rank <= len(r.lower); rank++ {
		if l := r.level(uint8(rank)); l.len() > 0 {
			least = min(least, l.front().seq)
		}
		from := uint64(rank) << seqBits
		r.returned.AscendGreaterOrEqual(keyEntry(from), func(e entry) bool {
			if e.rank == uint8(rank) {
				least = min(least, e.seq)
			}
			return false
		})
		// From seq 1, past the rank's buried tombstones.
		if i := searchKey(len(run), func(i int) entry { return run[i] }, from|1); i < len(run) && run[i].rank == uint8(rank) {
			least = min(least, run[i].seq)
		}
	}
	if s, ok := r.oldestPaged(); ok {
		least = min(least, s)
	}
	return least, least != ^uint64(0)
}

// expiry is a key of the expiry index: an entry's deadline and its key in the ready set.
type expiry struct {
	deadline int64
	key      uint64
}

func expiryLess(a, b expiry) bool {
	if a.deadline != b.deadline {
		return a.deadline < b.deadline
	}
	return a.key < b.key
}

// tidy compacts the rings and the run once tombstones outnumber both the live entries and
// compactAt, so that neither a queue nobody takes from (a delay queue) keeps the slots of its
// expired messages nor one whose selectors take from the middle keeps the slots of what they
// took. The compaction's O(slots) is paid for by the removals that made the tombstones, more
// than half the slots. Callers call it when dead > 0, after a removal.
func (r *readySet) tidy() {
	if r.dead <= compactAt || r.dead <= r.inMemory() {
		return
	}
	live := func(e entry) bool { return e.env != nil }
	r.fresh.filter(live)
	r.nLower = 0
	for i := range r.lower {
		r.lower[i].filter(live)
		r.nLower += r.lower[i].len()
	}
	kept := r.run[:0]
	for _, e := range r.run[r.runAt:] {
		if e.env != nil {
			kept = append(kept, e)
		}
	}
	clear(r.run[len(kept):])
	switch {
	case len(kept) == 0:
		kept = nil
	case len(kept) < cap(kept)/4:
		kept = slices.Clone(kept) // not the array of a run mostly gone
	}
	r.run, r.runAt, r.dead = kept, 0, 0
}

// remove takes the ready entry with key k out of the set, wherever it is.
func (r *readySet) remove(k uint64) (entry, bool) {
	e, ok := r.cut(k)
	if !ok {
		return entry{}, false
	}
	if r.dead > 0 {
		r.tidy()
	}
	r.unindex(e)
	return e, true
}

// cut takes the entry with key k out of the ring, the tree or the run that holds it, leaving a
// tombstone in the middle of a ring or the run; remove accounts for it.
func (r *readySet) cut(k uint64) (entry, bool) {
	l := r.level(uint8(k >> seqBits))
	if l.len() > 0 && l.front().key() == k && l.front().env != nil {
		// The common case with a queue TTL alone, or selectors in step: the oldest message
		// of its level.
		e := r.popFresh(l)
		if r.dead > 0 {
			r.trimRing(l)
		}
		return e, true
	}
	if l.len() > 0 && l.at(l.len()-1).key() == k && l.at(l.len()-1).env != nil {
		// An immediate publish that no consumer took: the newest message of its level.
		e := l.popBack()
		if l != &r.fresh {
			r.nLower--
		}
		return e, true
	}
	if e, ok := r.returned.Delete(keyEntry(k)); ok {
		return e, true
	}
	run := r.run[r.runAt:]
	if i := searchKey(len(run), func(i int) entry { return run[i] }, k); i < len(run) && run[i].key() == k && run[i].env != nil {
		e := run[i]
		run[i].env = nil // a tombstone, skipped by ascend
		r.dead++
		switch {
		case i == 0:
			r.trimRun()
		case run[i-1].rank != e.rank || run[i-1].seq == 0:
			bury(run[i:], e.rank) // e was its rank's first live entry
		}
		return e, true
	}
	if i := searchRing(l, k); i < l.len() && l.at(i).key() == k && l.at(i).env != nil {
		// Not at the front, which was checked first: the ring's head stays live.
		e := l.at(i)
		l.set(i, entry{seq: e.seq, rank: e.rank})
		r.dead++
		return e, true
	}
	return entry{}, false
}

// keyEntry returns an entry with key k, to search the tree with.
func keyEntry(k uint64) entry { return entry{seq: k & (1<<seqBits - 1), rank: uint8(k >> seqBits)} }

// searchRing returns the index of the first entry of a fresh ring whose key is at least k, or
// its length if there is none.
//
// A ring's keys are distinct and ascending (one rank; sequence ids only grow; a tombstone keeps
// its key), so its i-th key is at least the front's plus i and at most the back's minus
// len−1−i: the answer lies in [len−1−(back−k), k−front]. When the ring's sequence ids have no
// gaps — its messages were enqueued one after another and left only from the front, the usual
// case — that is a single index. Otherwise the search starts where k would be if the gaps were
// spread evenly (as they are when messages of two priorities alternate) and widens its steps
// from there, so that it reads a few entries unless the gaps are bunched: O(log len) at worst.
func searchRing(l *ring[entry], k uint64) int {
	n := l.len()
	if n == 0 || k <= l.front().key() {
		return 0
	}
	front, back := l.front().key(), l.at(n-1).key()
	if k > back {
		return n
	}
	// front < k ≤ back: the differences are below 2^64 and capped at n before conversion.
	// Throughout, key(lo−1) < k ≤ key(hi).
	lo := n - 1 - int(min(back-k, uint64(n-1)))
	hi := int(min(k-front, uint64(n-1)))
	if lo == hi {
		return lo
	}
	g := min(max(int(float64(k-front)/float64(back-front)*float64(n-1)), lo), hi)
	if l.at(g).key() < k {
		lo = g + 1
		for step := 1; lo+step-1 < hi; step *= 2 {
			p := lo + step - 1
			if l.at(p).key() >= k {
				hi = p
				break
			}
			lo = p + 1
		}
	} else {
		hi = g
		for step := 1; hi-step >= lo; step *= 2 {
			p := hi - step
			if l.at(p).key() < k {
				lo = p + 1
				break
			}
			hi = p
		}
	}
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if l.at(m).key() < k {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// searchKey returns the index of the first of n entries sorted by key whose key is at least k.
func searchKey(n int, at func(int) entry, k uint64) int {
	lo, hi := 0, n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if at(m).key() < k {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// index accounts for an entry entering the ready set: its body bytes and its deadline.
func (r *readySet) index(e entry) {
	r.bytes += int64(int(e.env.size))
	r.extra += e.env.overhead()
	if e.deadline != 0 {
		r.expiries.ReplaceOrInsert(expiry{e.deadline, e.key()})
	}
}

// unindex accounts for an entry leaving the ready set.
func (r *readySet) unindex(e entry) {
	r.bytes -= int64(int(e.env.size))
	r.extra -= e.env.overhead()
	if e.deadline != 0 {
		r.expiries.Delete(expiry{e.deadline, e.key()})
	}
}

func newExpiryIndex() *btree.BTreeG[expiry] { return btree.NewG(32, expiryLess) }

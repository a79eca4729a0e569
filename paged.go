package warren

import (
	"slices"
	"time"

	"github.com/google/btree"
)

// Paging: the part of a durable queue's backlog that is on disk (docs/DURABILITY.md, "The memory
// budget and paging").
//
// A ready set with a window (pagedTails.window > 0) keeps at most about window messages in
// memory; past it, each priority level's newest messages are paged out as they arrive: their
// envelopes are let go and their level's tail, a FIFO of chunks, describes them — sequence
// bounds, count, bytes, the earliest deadline, and where the shell can read them back (a
// pageLoc: the core does no I/O). Invariants, which the core's model tests check with windows of
// one to four messages:
//   - Every key in a level's tail is greater than every key of that level's fresh ring: only the
//     newest message of a level is paged out, behind a non-empty tail or a full window, and a
//     page-in takes a level's first chunk. (A message that rejoins the set, from a consumer or a
//     delay, goes to the tree or the run at its original position, which may be past the tail's
//     head.)
//   - The ready set hands out no entry while a paged entry has a lesser key (popMin): when the
//     least key is paged (a fault: the level's ring ran dry, or a message rejoined the set newer
//     than the tail's head, a delayed one come due), popMin reads the chunk back through the
//     pager and brings it into memory first, so the delivery order is the order without
//     paging. An expiry due in a chunk reads it likewise (expireDue). The read happens under the
//     queue's lock, as a RabbitMQ queue process reads its backlog itself: the shell pages a
//     chunk in ahead of need, with no lock held (faulted, pageIn), so that a fault is rare.
//   - len, bytes and the length limits count paged messages, and so does the queue's footprint
//     (held, memory.go); what the broker's budget counts is the footprint less the paged
//     messages' (pagedTails.footprint): a paged message's memory is its chunk's share.

// pageLoc is where a chunk's messages can be read back: the shell's business, kept by the core.
type pageLoc struct {
	seg uint64 // the log segment their records are in: a chunk never spans two; 0: pending
	lsn uint64 // the log position after its newest record, to wait for before reading it
}

// A chunk paged out in a critical section is pending (its loc.seg 0) until the log has written
// its messages' records: only then is their segment known and a read of it sure to find them.
// Until then the envelopes stay in pagedTails.pending, from which a read takes them. The
// section's commit stamps the chunk with the log position after its records (loc.lsn), and a
// stamped chunk takes no more messages: a pending chunk extends only one of its own section.
// A later commit that finds the log written up to the stamp places the chunk (placePending),
// and merges it into the chunk before it when they are in one segment and at most maxGap ids
// apart (the ids between go into its gone). A chunk whose records the log did not take (a failed log) stays pending,
// its envelopes in memory.

// chunk describes paged messages of one level, consecutive in that level's order.
type chunk struct {
	first, last uint64   // the least sequence id of its live messages; the greatest it was given
	n           int      // its live messages
	bytes       int64    // their body bytes
	extra       int64    // their footprints beyond their bodies: what they take once paged in
	deadline    int64    // the earliest deadline among them; 0 for none
	loc         pageLoc  // where to read them
	gone        []uint64 // ids in (first, last] not its live messages: taken out since, or skipped (skipTo); ascending
	disk        int64    // the bytes of its live messages' records, for the store's liveness
}

// firstKey is the key of the chunk's first live message, at rank.
func (c *chunk) firstKey(rank uint8) uint64 { return uint64(rank)<<seqBits | c.first }

// reaches reports whether the chunk may take the message with sequence id seq, its level's
// next: the ids between it and the chunk's last, which are other messages (of other levels, or
// delayed), are at most maxGap, for its gone.
func (c *chunk) reaches(seq uint64) bool { return seq > c.last && seq-c.last-1 <= maxGap }

// skipTo puts the ids between the chunk's last and seq, none of its messages, into its gone: a
// chunk's ids that are not in gone are exactly its live messages, so that it can be settled on
// disk by id, unread (settleDroppedLocked).
func (c *chunk) skipTo(seq uint64) {
	for s := c.last + 1; s < seq; s++ {
		c.gone = append(c.gone, s)
	}
}

// drop takes seq, one of its live messages, out of the chunk unread, for a replay from a
// checkpoint (checkpoint.go): its bytes, footprint and record bytes are not known there, so it
// takes its share of the chunk's, and the last message the rest.
func (c *chunk) drop(seq uint64) {
	n := int64(c.n)
	c.bytes -= c.bytes / n
	c.extra -= c.extra / n
	c.disk -= c.disk / n
	if c.n--; c.n == 0 {
		c.bytes, c.extra, c.disk = 0, 0, 0
		return
	}
	if seq != c.first {
		i, _ := slices.BinarySearch(c.gone, seq)
		c.gone = slices.Insert(c.gone, i, seq)
		return
	}
	// The next live id is the first: the ids before it leave gone, which holds (first, last].
	first := seq + 1
	i := 0
	for i < len(c.gone) && c.gone[i] == first {
		i++
		first++
	}
	c.first, c.gone = first, slices.Delete(c.gone, 0, i)
}

// maxGap is the most sequence ids, none of its messages, between two messages of a chunk: each
// is kept in the chunk's gone.
const maxGap = 16

// holds reports whether a message read back with sequence id seq is one of the chunk's live
// messages.
func (c *chunk) holds(seq uint64) bool {
	if seq < c.first || seq > c.last {
		return false
	}
	_, gone := slices.BinarySearch(c.gone, seq)
	return !gone
}

// pagedTails are a ready set's paged messages.
type pagedTails struct {
	window   int                   // the messages a ready set keeps in memory before it pages; 0: it never pages
	levels   []ring[chunk]         // a tail per priority level; nil while nothing was paged
	n        int                   // paged messages
	bytes    int64                 // their body bytes
	min      uint64                // the least key of a paged message: noFloor when none
	expiries *btree.BTreeG[expiry] // each chunk with a deadline: (its deadline, its first key)
	extra    int64                 // the paged messages' footprints beyond their bodies
	// read reads a chunk's live messages back (in sequence order, their envelopes made again):
	// the pager, set by whoever sets window. An error leaves the chunk paged, and is kept in err.
	read func(rank uint8, c *chunk) ([]entry, error)
	err  error // the last read's error, nil once a read succeeds
	// pending are the messages of pending chunks, with their envelopes, each level's in
	// sequence order (and some taken out of their chunks since, which a read passes over)
	pending []entry
	placeAt uint64 // the least log position a pending chunk waits for the log to write; 0: none
	// dropped are chunks let go of whole (a purge, the queue's end), whose messages the shell
	// settles on disk; it takes them (takeDropped).
	dropped        []chunk
	droppedPending []entry // the messages of those that were pending, with their envelopes
	why            Reason  // why the last were: the purge's or the end's reason
}

// footprint returns the paged messages' footprint (memory.go): what they would take in memory.
func (p *pagedTails) footprint() int64 { return p.bytes + p.extra }

// maxChunk is the most messages a chunk describes: a page-in brings at most a window's worth.
func (p *pagedTails) maxChunk() int { return max(p.window, 1) }

// pages reports whether a message arriving at rank must be paged out, were it pageable: its
// level has a tail, or the set holds a window's worth in memory.
func (r *readySet) pages(rank uint8) bool {
	p := &r.paged
	return p.window > 0 && (p.n > 0 && p.levels[rank].len() > 0 || r.len()-p.n >= p.window)
}

// arrive puts an arriving entry, the newest of its level, into the set: paged out if it may be
// (pageable: the shell says whether letting go of its envelope frees its memory) and the set
// pages; else in memory, behind the level's paged messages if it has any. Those go to the tree
// at their key, not to the fresh ring, whose keys are all less than the tail's (popMin takes
// the ring's head; a message pushed there behind a tail would go out before the paged ones).
func (r *readySet) arrive(e entry, pageable bool) {
	switch {
	case pageable && r.pages(e.rank):
		r.pageOut(e, pageLoc{}) // pending until commit has logged it
	case r.paged.n > 0 && r.paged.levels[e.rank].len() > 0:
		r.reinsert(e)
	default:
		r.push(e)
	}
}

// pageOut adds an arriving entry, the newest of its level, to its level's tail, its messages
// at loc; the caller lets go of its envelope. pages(e.rank) must have said so.
func (r *readySet) pageOut(e entry, loc pageLoc) {
	p := &r.paged
	t := r.tail(e.rank)
	var c *chunk
	if t.len() > 0 {
		if last := t.slot(t.len() - 1); last.loc.seg == loc.seg && (loc.seg != 0 || last.loc.lsn == 0) &&
			last.n < p.maxChunk() && last.reaches(e.seq) {
			c = last
			c.skipTo(e.seq)
		}
	}
	if c == nil {
		t.push(chunk{first: e.seq, loc: loc})
		c = t.slot(t.len() - 1)
	}
	if loc.seg == 0 {
		p.pending = append(p.pending, e)
	}
	c.loc.lsn = max(c.loc.lsn, loc.lsn)
	r.addToChunk(c, e)
}

// tail returns rank's tail, making the tails on the set's first page-out.
func (r *readySet) tail(rank uint8) *ring[chunk] {
	p := &r.paged
	if p.levels == nil {
		p.levels = make([]ring[chunk], len(r.lower)+1)
		p.expiries = newExpiryIndex()
		p.min = noFloor
	}
	return &p.levels[rank]
}

// addToChunk adds e, newer than its messages, to c, the last chunk of e's level, and counts it
// as paged. Its record's bytes count once it is placed (a pending chunk's, at placePending).
func (r *readySet) addToChunk(c *chunk, e entry) {
	p := &r.paged
	r.unindexChunk(e.rank, c)
	c.last, c.n = e.seq, c.n+1
	size := int64(int(e.env.size))
	c.bytes += size
	c.extra += e.env.overhead()
	if c.loc.seg != 0 {
		c.disk += recordSize(e)
	}
	if e.deadline != 0 && (c.deadline == 0 || e.deadline < c.deadline) {
		c.deadline = e.deadline
	}
	r.indexChunk(e.rank, c)
	p.n++
	p.bytes += size
	p.extra += e.env.overhead()
	r.bytes += size
	p.min = min(p.min, e.key())
}

// indexChunk and unindexChunk keep a chunk's deadline in the expiry index of the tails.
func (r *readySet) indexChunk(rank uint8, c *chunk) {
	if c.deadline != 0 && c.n > 0 {
		r.paged.expiries.ReplaceOrInsert(expiry{c.deadline, c.firstKey(rank)})
	}
}

func (r *readySet) unindexChunk(rank uint8, c *chunk) {
	if c.deadline != 0 && c.n > 0 {
		r.paged.expiries.Delete(expiry{c.deadline, c.firstKey(rank)})
	}
}

// hasDeadlines reports whether a ready message has a deadline, in memory or paged.
func (r *readySet) hasDeadlines() bool {
	return r.expiries.Len() > 0 || r.paged.n > 0 && r.paged.expiries.Len() > 0
}

// faulted returns the rank whose first chunk must be paged in before popMin can go on: the least
// paged key is less than every key in memory (or nothing is in memory). ok is false when popMin
// is not held up by paging.
func (r *readySet) faulted() (rank uint8, ok bool) {
	p := &r.paged
	if p.n == 0 {
		return 0, false
	}
	if k, ok := r.minKey(); ok && k < p.min {
		return 0, false
	}
	return uint8(p.min >> seqBits), true
}

// minKey returns the least key in memory, if any.
func (r *readySet) minKey() (uint64, bool) {
	least, ok := noFloor, false
	if r.returned.Len() > 0 {
		e, _ := r.returned.Min()
		least, ok = e.key(), true
	}
	if r.runAt < len(r.run) {
		least, ok = min(least, r.run[r.runAt].key()), true
	}
	if l := r.freshHead(); l != nil {
		least, ok = min(least, l.front().key()), true
	}
	return least, ok
}

// firstChunk returns the first chunk of rank's tail; it must have one.
func (r *readySet) firstChunk(rank uint8) *chunk { return r.paged.levels[rank].slot(0) }

// pageIn brings rank's first chunk into memory: ents are its live messages as read back, in
// sequence order, their envelopes made again. It reports false, changing nothing, if they are
// not the chunk's: a pager that read something else (fault reports it as an error).
func (r *readySet) pageIn(rank uint8, ents []entry) bool {
	p := &r.paged
	if p.n == 0 || p.levels[rank].len() == 0 {
		return false
	}
	c := r.firstChunk(rank)
	if !c.matches(rank, ents) {
		return false
	}
	r.unindexChunk(rank, c)
	r.bytes -= c.bytes // index counts them again
	p.n -= c.n
	p.bytes -= c.bytes
	p.extra -= c.extra
	p.levels[rank].pop()
	r.putBack(ents[0]) // they may be behind a selector's cursor: a due delay's key can be past them
	l := r.level(rank)
	for _, e := range ents {
		l.push(e)
		r.index(e)
	}
	if rank > 0 {
		r.nLower += len(ents)
		r.low = min(r.low, int(rank-1))
	}
	r.resetMin()
	return true
}

// matches reports whether ents are the chunk's live messages, in order.
func (c *chunk) matches(rank uint8, ents []entry) bool {
	if len(ents) != c.n {
		return false
	}
	for i, e := range ents {
		if e.env == nil || e.rank != rank || !c.holds(e.seq) || i > 0 && e.seq <= ents[i-1].seq {
			return false
		}
	}
	return true
}

// resetMin computes the least paged key again.
func (r *readySet) resetMin() {
	p := &r.paged
	p.min = noFloor
	if p.n == 0 {
		return
	}
	for rank := range p.levels {
		if t := &p.levels[rank]; t.len() > 0 {
			p.min = min(p.min, t.slot(0).firstKey(uint8(rank)))
		}
	}
}

// chunkAt returns rank's chunk whose first key is first, and its index in the tail.
func (r *readySet) chunkAt(rank uint8, first uint64) (*chunk, int, bool) {
	if r.paged.n == 0 || int(rank) >= len(r.paged.levels) {
		return nil, 0, false
	}
	t := &r.paged.levels[rank]
	i := searchKey(t.len(), func(i int) entry { return entry{seq: t.at(i).first, rank: rank} }, first)
	if i == t.len() || t.slot(i).firstKey(rank) != first {
		return nil, 0, false
	}
	return t.slot(i), i, true
}

// takeFromChunk takes out of rank's chunk that starts at first the messages ents (its live
// messages as read back, in order) for which take says so, and returns them; the others stay
// paged. It reports false, changing nothing, if ents are not the chunk's.
func (r *readySet) takeFromChunk(rank uint8, first uint64, ents []entry, take func(entry) bool) ([]entry, bool) {
	c, i, ok := r.chunkAt(rank, first)
	if !ok || !c.matches(rank, ents) {
		return nil, false
	}
	var taken []entry
	kept := ents[:0:0]
	for _, e := range ents {
		if take(e) {
			taken = append(taken, e)
		} else {
			kept = append(kept, e)
		}
	}
	p := &r.paged
	r.unindexChunk(rank, c)
	for _, e := range taken {
		size := int64(int(e.env.size))
		if c.loc.seg != 0 {
			c.disk -= recordSize(e)
		}
		c.bytes -= size
		c.extra -= e.env.overhead()
		p.bytes -= size
		p.extra -= e.env.overhead()
		r.bytes -= size
		c.gone = append(c.gone, e.seq)
	}
	slices.Sort(c.gone)
	p.n -= len(taken)
	c.n = len(kept)
	if c.n == 0 {
		t := &p.levels[rank]
		t.filter(func(o chunk) bool { return o.n > 0 })
		r.resetMin()
		return taken, true
	}
	// last stays: were it lowered, a message paged out later would extend the chunk over the
	// ones taken here, and a read would bring them back.
	c.first, c.deadline = kept[0].seq, 0
	c.gone = slices.DeleteFunc(c.gone, func(s uint64) bool { return s < c.first })
	for _, e := range kept {
		if e.deadline != 0 && (c.deadline == 0 || e.deadline < c.deadline) {
			c.deadline = e.deadline
		}
	}
	r.indexChunk(rank, c)
	if i == 0 {
		r.resetMin()
	}
	return taken, true
}

// oldestPaged returns the least sequence id of a paged message.
func (r *readySet) oldestPaged() (uint64, bool) {
	least := noFloor
	for rank := range r.paged.levels {
		if t := &r.paged.levels[rank]; t.len() > 0 {
			least = min(least, t.slot(0).first)
		}
	}
	return least, least != noFloor
}

// dropPaged lets go of every paged message and returns the chunks they were in, for the shell
// to settle on disk, and the envelopes of those in pending chunks (whose liveness the store
// counts by envelope until they are placed).
func (r *readySet) dropPaged() ([]chunk, []entry) {
	p := &r.paged
	if p.n == 0 {
		return nil, nil
	}
	var all []chunk
	var pending []entry
	for rank := range p.levels {
		t := &p.levels[rank]
		for t.len() > 0 {
			c := t.pop()
			if c.loc.seg == 0 {
				for _, e := range p.pending {
					if e.rank == uint8(rank) && c.holds(e.seq) {
						pending = append(pending, e)
					}
				}
			}
			all = append(all, c)
		}
	}
	r.bytes -= p.bytes
	p.n, p.bytes, p.extra, p.min = 0, 0, 0, noFloor
	p.expiries.Clear(false)
	clear(p.pending)
	p.pending, p.placeAt = p.pending[:0], 0
	return all, pending
}

// takeDropped returns and forgets the chunks let go of whole since it was last called, the
// envelopes of their pending messages, and why they were.
func (r *readySet) takeDropped() ([]chunk, []entry, Reason) {
	p := &r.paged
	d, e := p.dropped, p.droppedPending
	p.dropped, p.droppedPending = nil, nil
	return d, e, p.why
}

// fault brings into memory the chunk popMin is held up by, reading it through the pager, and
// reports whether it did.
func (r *readySet) fault() bool {
	rank, ok := r.faulted()
	if !ok || r.paged.read == nil {
		return false
	}
	ents, err := r.readChunk(rank, r.firstChunk(rank))
	if err == nil && !r.pageIn(rank, ents) {
		err = r.firstChunk(rank).misread(ents)
	}
	r.paged.err = err
	return err == nil
}

// pageInAll brings every paged message into memory, for an operation that must see each one
// (an observed purge). A chunk the pager fails to read stays paged.
func (r *readySet) pageInAll() {
	p := &r.paged
	for rank := 0; p.n > 0 && rank < len(p.levels); rank++ {
		for p.levels[rank].len() > 0 {
			ents, err := r.readChunk(uint8(rank), r.firstChunk(uint8(rank)))
			if p.err = err; err != nil || !r.pageIn(uint8(rank), ents) {
				break
			}
		}
	}
}

// unpageNewest takes back e, the newest paged message of its level, which an Immediate publish
// paged out and no consumer took; it reports false if e is not that message.
func (r *readySet) unpageNewest(e entry) bool {
	p := &r.paged
	if p.n == 0 || p.levels[e.rank].len() == 0 {
		return false
	}
	t := &p.levels[e.rank]
	last := t.slot(t.len() - 1)
	if last.last != e.seq || !last.holds(e.seq) {
		return false
	}
	r.unindexChunk(e.rank, last)
	size := int64(int(e.env.size))
	last.n--
	if last.loc.seg != 0 {
		last.disk -= recordSize(e)
	}
	last.bytes -= size
	last.extra -= e.env.overhead()
	last.gone = append(last.gone, e.seq) // its deadline may stay the chunk's: an early bound, made exact when it is read
	p.n--
	p.bytes -= size
	p.extra -= e.env.overhead()
	r.bytes -= size
	if last.n == 0 {
		t.popBack()
	} else {
		r.indexChunk(e.rank, last)
	}
	r.resetMin()
	return true
}

// pageRetry is how long a chunk the pager failed to read for an expiry waits to be read again.
const pageRetry = time.Second

// readDue reads back the chunks holding a message whose deadline is at or before now, and takes
// those messages out of them (they are in memory again), for expireDue. A chunk the pager fails
// to read stays, its error kept, and is read again after pageRetry: its messages expire late.
func (r *readySet) readDue(now int64) []entry {
	p := &r.paged
	if p.n == 0 {
		return nil
	}
	var due []uint64 // the chunks' first keys
	p.expiries.Ascend(func(k expiry) bool {
		if k.deadline > now {
			return false
		}
		due = append(due, k.key)
		return true
	})
	var taken []entry
	for _, first := range due {
		rank := uint8(first >> seqBits)
		c, _, ok := r.chunkAt(rank, first)
		if !ok {
			continue
		}
		ents, err := r.readChunk(rank, c)
		var t []entry
		if err == nil {
			var ok bool
			if t, ok = r.takeFromChunk(rank, first, ents, func(e entry) bool { return e.deadline != 0 && e.deadline <= now }); !ok {
				err = c.misread(ents) // not its messages: a read that failed, the chunk unchanged
			}
		}
		p.err = err
		if err != nil { // try again later, not at once: the timer would spin on a chunk it cannot read
			r.unindexChunk(rank, c)
			c.deadline = later(now, pageRetry)
			r.indexChunk(rank, c)
			continue
		}
		taken = append(taken, t...)
	}
	return taken
}

// misread returns the error of a read of the chunk that brought back ents, which are not its
// messages.
func (c *chunk) misread(ents []entry) error {
	return errorf("%w: %d messages read back from segment %d for %d paged there (%d..%d)", ErrStorage, len(ents), c.loc.seg, c.n, c.first, c.last)
}

// recordSize returns the bytes of e's record in the log, as the store counts them; 0 before it
// is logged.
func recordSize(e entry) int64 {
	if e.env.more == nil {
		return 0
	}
	return e.env.more.size
}

// readChunk reads rank's chunk c back: a pending chunk from pending, else through the pager.
func (r *readySet) readChunk(rank uint8, c *chunk) ([]entry, error) {
	if c.loc.seg != 0 {
		if r.paged.read == nil {
			return nil, errNoPager
		}
		return r.paged.read(rank, c)
	}
	var ents []entry
	for _, e := range r.paged.pending {
		if e.rank == rank && c.holds(e.seq) {
			ents = append(ents, e)
		}
	}
	return ents, nil
}

// errNoPager is a read of a chunk on disk by a set given no pager: it cannot happen.
var errNoPager = errorf("%w: a paged chunk but no pager", ErrStorage)

// placePending is commit's, after it logged the section's records: lsn is the log position
// after them (0: it logged nothing), written the position the log has written up to. It stamps
// the chunks paged out in the section with lsn, and places the pending chunks whose records are
// written: each takes the segment its messages' envelopes say (store.go), and their envelopes
// go. A chunk stays pending, its envelopes in memory, until then: a read of a placed chunk
// finds its records in its segment at once, where the log's buffer (a full disk stalls it)
// would keep a read waiting under the queue's lock. Pending chunks are the last of their tails,
// in the order they were logged, and placed in that order; a chunk whose records the log did
// not take (a failed log) stays pending, and so do those after it.
//
// Cost: a commit with nothing to place does O(levels); a placement goes once over the pending
// messages, which are those the log had not written at the commit before.
func (r *readySet) placePending(lsn, written uint64) {
	p := &r.paged
	if len(p.pending) == 0 {
		return
	}
	if lsn != 0 {
		for rank := range p.levels {
			t := &p.levels[rank]
			for i := t.len() - 1; i >= 0; i-- {
				c := t.slot(i)
				if c.loc.seg != 0 || c.loc.lsn != 0 {
					break
				}
				c.loc.lsn = lsn
			}
		}
		if p.placeAt == 0 {
			p.placeAt = lsn
		}
	}
	if p.placeAt == 0 || p.placeAt > written {
		return
	}
	p.placeAt = 0
	kept := p.pending[:0:0]
	for rank := range p.levels {
		t := &p.levels[rank]
		k := t.len()
		for k > 0 && t.slot(k-1).loc.seg == 0 {
			k--
		}
		if k == t.len() {
			continue
		}
		type pendingChunk struct {
			c      chunk
			seg    uint64 // its messages' segment; 0 while one is not logged, or they are in two
			disk   int64
			bad    bool
			placed bool
		}
		cs := make([]pendingChunk, t.len()-k)
		for i := len(cs) - 1; i >= 0; i-- {
			cs[i].c = t.popBack()
		}
		// each calls fn with each pending message of the level that is in one of cs, and its chunk
		each := func(fn func(e entry, pc *pendingChunk)) {
			i := 0
			for _, e := range p.pending {
				if e.rank != uint8(rank) {
					continue
				}
				for i < len(cs) && e.seq > cs[i].c.last {
					i++
				}
				if i < len(cs) && cs[i].c.holds(e.seq) { // else taken out of its chunk since
					fn(e, &cs[i])
				}
			}
		}
		each(func(e entry, pc *pendingChunk) {
			if m := e.env.more; m == nil || m.seg == 0 || pc.seg != 0 && m.seg != pc.seg {
				pc.bad = true
			} else {
				pc.seg, pc.disk = m.seg, pc.disk+m.size
			}
		})
		placing := true
		for i := range cs {
			pc := &cs[i]
			placing = placing && pc.c.loc.lsn != 0 && pc.c.loc.lsn <= written && !pc.bad && pc.seg != 0
			if pc.placed = placing; placing {
				pc.c.loc.seg, pc.c.disk = pc.seg, pc.disk
			} else if lsn := pc.c.loc.lsn; lsn != 0 && (p.placeAt == 0 || lsn < p.placeAt) {
				p.placeAt = lsn
			}
			t.push(pc.c)
			if placing {
				r.mergeBack(uint8(rank), t.len()-1)
			}
		}
		each(func(e entry, pc *pendingChunk) {
			if !pc.placed {
				kept = append(kept, e)
			}
		})
	}
	clear(p.pending)
	p.pending = append(p.pending[:0], kept...)
}

// mergeBack merges rank's chunk i, just placed, into the chunk before it, if they are in one
// segment, at most maxGap ids apart, and a chunk's size.
func (r *readySet) mergeBack(rank uint8, i int) {
	t := &r.paged.levels[rank]
	if i == 0 || i != t.len()-1 {
		return
	}
	c, prev := t.slot(i), t.slot(i-1)
	if prev.loc.seg != c.loc.seg || prev.n+c.n > r.paged.maxChunk() || !prev.reaches(c.first) {
		return
	}
	r.unindexChunk(rank, prev)
	r.unindexChunk(rank, c)
	prev.skipTo(c.first)
	prev.last, prev.n = c.last, prev.n+c.n
	prev.bytes += c.bytes
	prev.extra += c.extra
	prev.disk += c.disk
	prev.loc.lsn = max(prev.loc.lsn, c.loc.lsn)
	if c.deadline != 0 && (prev.deadline == 0 || c.deadline < prev.deadline) {
		prev.deadline = c.deadline
	}
	prev.gone = append(prev.gone, c.gone...)
	t.popBack()
	r.indexChunk(rank, prev)
}

// scanWithPaged is scanRank over the paged messages too: it calls fn for each ready entry of rank
// with a key of at least from, in order, those on disk read back (and left there) a chunk at a
// time, until fn returns false; it reports whether fn never did. A chunk that cannot be read
// stops it, with the pager's error.
func (r *readySet) scanWithPaged(rank uint8, from uint64, fn func(entry) bool) (bool, error) {
	p := &r.paged
	if p.n == 0 || int(rank) >= len(p.levels) || p.levels[rank].len() == 0 {
		return r.scanRank(rank, from, fn), nil
	}
	t := &p.levels[rank]
	ci := 0
	for ci < t.len() && uint64(rank)<<seqBits|t.slot(ci).last < from {
		ci++
	}
	var (
		buf []entry
		at  int
		err error
	)
	next := func() (entry, bool) { // the next paged entry from from on
		for at >= len(buf) {
			if ci >= t.len() || err != nil {
				return entry{}, false
			}
			buf, err = r.readChunk(rank, t.slot(ci))
			ci, at = ci+1, 0
			for at < len(buf) && buf[at].key() < from {
				at++
			}
		}
		return buf[at], true
	}
	stopped := false
	r.scanRank(rank, from, func(m entry) bool {
		for e, ok := next(); ok && e.key() < m.key(); e, ok = next() {
			at++
			if !fn(e) {
				stopped = true
				return false
			}
		}
		stopped = !fn(m)
		return !stopped
	})
	for e, ok := next(); ok && !stopped; e, ok = next() {
		at++
		stopped = !fn(e)
	}
	if err != nil {
		p.err = err
	}
	return !stopped && err == nil, err
}

// ascendWithPaged is ascend over the paged messages too (scanWithPaged).
func (r *readySet) ascendWithPaged(from uint64, fn func(entry) bool) error {
	for rank := int(from >> seqBits); rank <= len(r.lower); rank++ {
		if ok, err := r.scanWithPaged(uint8(rank), max(from, uint64(rank)<<seqBits), fn); !ok {
			return err
		}
	}
	return nil
}

// takePaged takes the paged message e (as a scan read it back) out of its chunk, reading the
// chunk again, and returns it; false if it is not paged.
func (r *readySet) takePaged(e entry) (entry, bool) {
	p := &r.paged
	if p.n == 0 || int(e.rank) >= len(p.levels) {
		return entry{}, false
	}
	t := &p.levels[e.rank]
	for i := range t.len() {
		c := t.slot(i)
		if !c.holds(e.seq) {
			continue
		}
		ents, err := r.readChunk(e.rank, c)
		if p.err = err; err != nil {
			return entry{}, false
		}
		taken, ok := r.takeFromChunk(e.rank, c.firstKey(e.rank), ents, func(o entry) bool { return o.seq == e.seq })
		if !ok || len(taken) != 1 {
			return entry{}, false
		}
		return taken[0], true
	}
	return entry{}, false
}

// remove is readySet.remove over the paged messages too: a message on disk is read back and
// taken out of its chunk.
func (r *readySet) removeWithPaged(key uint64) (entry, bool) {
	if e, ok := r.remove(key); ok {
		return e, true
	}
	return r.takePaged(keyEntry(key))
}

// restorePaged adds to the ready set, as the core's restore does, messages a durable queue
// restores from the log that stay there: each newer than every message of its level restored
// into memory, in key order, each with its envelope as made from its publish record (its
// segment and size). Their chunks are cut at each segment and at each gap of more than
// maxGap sequence ids in a level: the ids in a gap may be other messages of the queue
// (settled, or in memory), so each one a chunk spans goes into its gone.
func (c *queueCore) restorePaged(ents []entry) {
	if len(ents) == 0 {
		return
	}
	r := &c.ready
	p := &r.paged
	c.count(EventEnqueued, "", uint64(len(ents)))
	for _, e := range ents {
		c.held += e.env.footprint()
		t := r.tail(e.rank)
		var ch *chunk
		if t.len() > 0 {
			last := t.slot(t.len() - 1)
			if last.loc.seg == e.env.more.seg && last.n < p.maxChunk() && last.reaches(e.seq) {
				ch = last
				ch.skipTo(e.seq)
			}
		}
		if ch == nil {
			t.push(chunk{first: e.seq, loc: pageLoc{seg: e.env.more.seg}})
			ch = t.slot(t.len() - 1)
		}
		r.addToChunk(ch, e)
	}
}

// restoreChunks adds to the ready set, after the core's restore, the chunks a checkpoint kept of
// the tails of a durable queue (checkpoint.go), in each level's order, their deadlines moved to
// the queue's clock by onClock. Those of a level are newer than every message of that level in
// the fresh ring, which the restore left empty.
func (c *queueCore) restoreChunks(cs []ckChunk, onClock func(int64) int64) error {
	r := &c.ready
	p := &r.paged
	for _, k := range cs {
		if int(k.rank) > len(r.lower) || p.window == 0 {
			return errorf("%w: a chunk of level %d", errBadCheckpoint, k.rank)
		}
		ch := k.chunk
		if ch.deadline != 0 {
			ch.deadline = onClock(ch.deadline)
		}
		t := r.tail(k.rank)
		if t.len() > 0 && t.slot(t.len()-1).last >= ch.first {
			return errorf("%w: chunks of level %d out of order: %+v after %+v", errBadCheckpoint, k.rank, ch, *t.slot(t.len() - 1))
		}
		t.push(ch)
		r.indexChunk(k.rank, t.slot(t.len()-1))
		p.n += ch.n
		p.bytes += ch.bytes
		p.extra += ch.extra
		r.bytes += ch.bytes
		p.min = min(p.min, ch.firstKey(k.rank))
		c.held += ch.bytes + ch.extra
		c.count(EventEnqueued, "", uint64(ch.n))
	}
	return nil
}

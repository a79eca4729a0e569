package warren

import (
	"cmp"
	"maps"
	"slices"
	"time"
)

// Recovery: the picture of the durable queues that the log's records leave, RabbitMQ's picture
// after a restart. Records are replayed in log order into a replay; what it holds at the end is
// what each durable queue gets back:
//   - every message published and not settled, at its sequence id, so in its original order;
//   - a message delivered and not settled when the log ends was out with a consumer at the
//     crash: it comes back redelivered, its delivery count one higher, as if its consumer's
//     channel had closed; so a poison message still reaches its delivery limit across restarts.
//     A delivery is in the log once the application received it, as far as warren can see:
//     at dispatch, but for Serve's, whose record a worker writes as it takes it (store.received),
//     so a message only buffered for Serve's workers comes back unchanged;
//   - a returned message keeps its count, a delayed one its due time, every message its deadline
//     (wall-clock times: what passed them while the process was down expires when it starts).
//
// A replay also knows, once finished, for each segment of the log, how many of the messages it
// holds are live, so that the store can remove a segment none of whose messages is.
//
// When Open skips part of a damaged log (WithSalvage), the replay is told where, in order with
// the records (skipped), and says what it can of what that cost each queue (damage): the
// messages whose placement it read and whose body was skipped, or whose queue's declaration
// was; and the messages it puts back that were placed before a skipped stretch, whose
// settlement may have been in it: they come back redelivered, as a message whose consumer's
// channel closed does. A message whose own records were skipped is not known at all: the
// stretch's record count bounds them.

// replay is the state recovery builds from the log's records.
type replay struct {
	queues map[uint64]*replayQueue
	bodies idTable[replayBody] // by message id
	live   liveSegments        // what each segment holds that is live
	arena  []byte              // holds the bodies' encodings: one allocation per MiB, not per body

	maxMsg    uint64 // the greatest message id seen
	nextQueue uint64 // a checkpoint's last queue id given (queue ids are in the records too)
	// checkpoints is the number of the newest checkpoint there is (the next one follows it)
	checkpoints uint64

	// The durable topology, as declared and not deleted.
	queueDecls    map[uint64]decl // by queue id
	exchangeDecls map[string]decl
	bindings      []decl // in the order they were made

	// undeclared counts, by queue id, the messages of queues whose declaration was not read
	// (finish): after a skip, their declaration may have been in it.
	undeclared map[uint64]int
}

// replayQueue is one durable queue's messages during a replay.
type replayQueue struct {
	msgs idTable[replayMsg] // by sequence id
	last uint64             // the greatest sequence id seen, live or not
	// suspect is the greatest sequence id seen before the last skipped stretch (skipped): a
	// message at or below it may have been settled in the stretch. orphans counts the
	// placements finish dropped because their body was not read.
	suspect uint64
	orphans int
	// chunks are its messages on disk, from a checkpoint: they go back as they are, less what
	// the records after its mark took out (checkpoint.go). fetch are the messages those
	// records took out to be messages of their own, by sequence id: the segment whose records
	// hold their placement and body.
	chunks []ckChunk
	fetch  map[uint64]uint64
}

// replayMsg is one message in one queue during a replay.
type replayMsg struct {
	msgID       uint64
	seq         uint64
	deadline    int64 // wall-clock Unix nanoseconds; 0 for none
	returns     uint32
	redelivered bool
	delivered   bool  // out with a consumer or a Get
	returned    bool  // messages: it was out when the log ended, and comes back one return more
	due         int64 // delayed until, wall-clock Unix nanoseconds; 0 for not delayed
}

// replayBody is a message's encoding, with the placements that still need it.
type replayBody struct {
	msg  []byte    // copied out of the log's buffer into the replay's arena
	seg  uint64    // the segment its publish record is in
	qid  uint64    // the queue of that record's placement, and its sequence id there: a
	qseq uint64    // queue whose message it is may leave it paged (Queue.restore)
	refs int       // the placements that need it (finish)
	env  *envelope // made by the first queue restored that holds it; shared by the others
}

// arenaChunk is the size of the arena's allocations.
const arenaChunk = 1 << 20

// keep copies b into the arena: the replay lives only while the broker opens, so the bodies'
// encodings need not be freed one by one (restore decodes them into memory of their own).
func (r *replay) keep(b []byte) []byte {
	if len(b) > arenaChunk/8 {
		return slices.Clone(b)
	}
	if cap(r.arena)-len(r.arena) < len(b) {
		r.arena = make([]byte, 0, arenaChunk)
	}
	start := len(r.arena)
	r.arena = append(r.arena, b...)
	return r.arena[start:len(r.arena):len(r.arena)]
}

// idTable maps ids that are given in increasing order and mostly live in runs (sequence ids,
// message ids) to values, in pages of idPage consecutive ids: a replay of a million messages
// makes thousands of map entries rather than a million, and reads its values in id order.
type idTable[V any] struct {
	pages map[uint64]*idPageOf[V]
	n     int
}

const idPage = 256

type idPageOf[V any] struct {
	used [idPage / 64]uint64 // which slots hold a value
	n    int
	v    [idPage]V
}

// get returns the value of id, or nil.
func (t *idTable[V]) get(id uint64) *V {
	p := t.pages[id/idPage]
	if p == nil || p.used[id%idPage/64]&(1<<(id%64)) == 0 {
		return nil
	}
	return &p.v[id%idPage]
}

// put returns the slot of id, zeroed if it was empty.
func (t *idTable[V]) put(id uint64) *V {
	if t.pages == nil {
		t.pages = map[uint64]*idPageOf[V]{}
	}
	p := t.pages[id/idPage]
	if p == nil {
		p = new(idPageOf[V])
		t.pages[id/idPage] = p
	}
	i := id % idPage
	if p.used[i/64]&(1<<(i%64)) == 0 {
		p.used[i/64] |= 1 << (i % 64)
		p.n++
		t.n++
		var zero V
		p.v[i] = zero
	}
	return &p.v[i]
}

// del removes id, and its page with its last value.
func (t *idTable[V]) del(id uint64) {
	p := t.pages[id/idPage]
	i := id % idPage
	if p == nil || p.used[i/64]&(1<<(i%64)) == 0 {
		return
	}
	p.used[i/64] &^= 1 << (i % 64)
	var zero V
	p.v[i] = zero
	t.n--
	if p.n--; p.n == 0 {
		delete(t.pages, id/idPage)
	}
}

// ascend calls fn with each id and its value, in id order.
func (t *idTable[V]) ascend(fn func(id uint64, v *V)) {
	for _, k := range slices.Sorted(maps.Keys(t.pages)) {
		p := t.pages[k]
		for i := range uint64(idPage) {
			if p.used[i/64]&(1<<(i%64)) != 0 {
				fn(k*idPage+i, &p.v[i])
			}
		}
	}
}

func newReplay() *replay {
	return &replay{queues: map[uint64]*replayQueue{}, live: liveSegments{},
		queueDecls: map[uint64]decl{}, exchangeDecls: map[string]decl{}}
}

// apply replays one record read from segment seg. Placements and bodies are matched once the
// log is read (finish), not as they come: a placement may come before the body's record it
// needs (a queue took a message while compaction was moving its body) or after every other
// placement of the body was settled (a queue took it while another let go of it); a placement
// whose body never comes was in a segment removed because nothing in it was live.
func (r *replay) apply(seg uint64, rec record) {
	switch rec.typ {
	case recPublish:
		r.maxMsg = max(r.maxMsg, rec.msgID)
		if r.chunked(rec.placement, seg) {
			return
		}
		if b := r.bodies.get(rec.msgID); b != nil {
			b.seg, b.qid, b.qseq = seg, rec.queueID, rec.seq // written again by compaction: the message's current state follows
			if b.msg == nil {
				b.msg = r.keep(rec.msg) // a checkpoint's, not read back yet: here it is
			}
		} else {
			*r.bodies.put(rec.msgID) = replayBody{msg: r.keep(rec.msg), seg: seg, qid: rec.queueID, qseq: rec.seq}
		}
		r.place(rec.placement)
	case recEnqueue:
		if !r.chunked(rec.placement, seg) {
			r.place(rec.placement)
		}
	case recQueue:
		r.queueDecls[rec.id] = rec.decl
	case recUnqueue:
		delete(r.queues, rec.id) // even if its declaration is gone: its placements are void
		if d, ok := r.queueDecls[rec.id]; ok {
			delete(r.queueDecls, rec.id)
			r.unbind(func(b decl) bool { return b.flags&flagToQueue != 0 && b.dest == d.name })
		}
	case recExchange:
		r.exchangeDecls[rec.name] = rec.decl
	case recUnexchange:
		delete(r.exchangeDecls, rec.name)
		r.unbind(func(b decl) bool { return b.name == rec.name || b.flags&flagToQueue == 0 && b.dest == rec.name })
	case recBind:
		if !slices.ContainsFunc(r.bindings, rec.decl.sameBinding) {
			r.bindings = append(r.bindings, rec.decl)
		}
	case recUnbind:
		r.unbind(rec.decl.sameBinding)
	default:
		q := r.queues[rec.queueID]
		if q == nil {
			return
		}
		m := q.msgs.get(rec.seq)
		if m == nil && len(q.chunks) > 0 {
			if rec.typ == recSettle {
				if c := q.chunkHolding(rec.seq); c != nil {
					c.take(rec.seq)
				}
				return
			}
			m = q.unchunk(rec.seq)
		}
		if m == nil {
			return
		}
		switch rec.typ {
		case recDeliver:
			m.delivered, m.due = true, 0 // a delayed message is delivered once it is due
		case recReturn:
			// As the queue has it: a delivery its consumer never read comes back unchanged,
			// not redelivered, when it was not before (returns 0).
			m.delivered, m.redelivered, m.returns = false, rec.n > 0, uint32(rec.n)
		case recDelay:
			m.delivered, m.due = false, rec.n
		case recSettle:
			q.msgs.del(rec.seq)
		}
	}
}

// finish matches placements with bodies once every record is replayed: a placement whose body
// is not in the log, or whose queue is not declared, is dropped; a body no placement needs is
// let go; live says which segments hold the bodies that are needed.
func (r *replay) finish() {
	for id, q := range r.queues {
		if _, ok := r.queueDecls[id]; !ok {
			if q.msgs.n > 0 {
				if r.undeclared == nil {
					r.undeclared = map[uint64]int{}
				}
				r.undeclared[id] = q.msgs.n
			}
			delete(r.queues, id)
			continue
		}
		var orphans []uint64
		q.msgs.ascend(func(seq uint64, m *replayMsg) {
			if b := r.bodies.get(m.msgID); b != nil {
				b.refs++
			} else {
				orphans = append(orphans, seq)
			}
		})
		for _, seq := range orphans {
			q.msgs.del(seq)
		}
		q.orphans = len(orphans)
		q.chunks = slices.DeleteFunc(q.chunks, func(c ckChunk) bool { return c.n == 0 })
		for _, c := range q.chunks {
			r.live.add(c.loc.seg, c.n, c.disk)
		}
	}
	var dead []uint64
	r.bodies.ascend(func(id uint64, b *replayBody) {
		if b.refs == 0 {
			dead = append(dead, id)
		} else {
			r.live.add(b.seg, 1, int64(len(b.msg)))
		}
	})
	for _, id := range dead {
		r.bodies.del(id)
	}
}

// skipped notes that Open skipped a stretch of the log here, after the records applied so far:
// what each queue was placed before it may have been settled in it.
func (r *replay) skipped() {
	for _, q := range r.queues {
		q.suspect = q.last
	}
}

// damage returns what the skipped stretches cost each queue that lost messages or may get
// settled ones back, in queue id order, once finished.
func (r *replay) damage() []QueueDamage {
	var ds []QueueDamage
	for _, id := range slices.Sorted(maps.Keys(r.queues)) {
		q := r.queues[id]
		d := QueueDamage{Queue: r.queueDecls[id].name, QueueID: id, Lost: q.orphans}
		q.msgs.ascend(func(seq uint64, _ *replayMsg) {
			if seq <= q.suspect {
				d.MaybeSettled++
			}
		})
		if d.Lost > 0 || d.MaybeSettled > 0 {
			ds = append(ds, d)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(r.undeclared)) {
		ds = append(ds, QueueDamage{QueueID: id, Lost: r.undeclared[id]})
	}
	return ds
}

// unbind removes the bindings for which drop returns true.
func (r *replay) unbind(drop func(decl) bool) {
	r.bindings = slices.DeleteFunc(r.bindings, drop)
}

// sameBinding reports whether b binds what d binds: the same ends, key and arguments.
func (d decl) sameBinding(b decl) bool {
	return b.name == d.name && b.dest == d.dest && b.flags == d.flags && b.kind == d.kind && sameField(b.args, d.args)
}

// place puts a message into a queue, or replaces its state there (compaction writes it again).
func (r *replay) place(p placement) {
	q := r.queues[p.queueID]
	if q == nil {
		q = &replayQueue{}
		r.queues[p.queueID] = q
	}
	q.last = max(q.last, p.seq)
	delete(q.fetch, p.seq) // placed from this record
	*q.msgs.put(p.seq) = replayMsg{msgID: p.msgID, seq: p.seq, deadline: p.deadline, returns: p.returns, redelivered: p.returns > 0}
}

// messages calls fn with what queueID gets back, in sequence order: each message as it is to be
// put back, a delivery outstanding at the end of the log returned (redelivered, one return
// more), one that may have been settled in a skipped stretch redelivered.
func (r *replay) messages(queueID uint64, fn func(m replayMsg)) {
	q := r.queues[queueID]
	if q == nil {
		return
	}
	q.msgs.ascend(func(_ uint64, m *replayMsg) {
		back := *m
		if back.delivered {
			back.delivered, back.redelivered, back.returned = false, true, true
			back.returns = min(back.returns+1, 1<<32-1)
		}
		if back.seq <= q.suspect {
			back.redelivered = true // it may have been settled in a skipped stretch
		}
		fn(back)
	})
}

// body returns the encoding of a message held by the replay.
func (r *replay) body(msgID uint64) []byte {
	if b := r.bodies.get(msgID); b != nil {
		return b.msg
	}
	return nil
}

// restore puts back into q, a durable queue just declared again, what the replay holds for it:
// messages at their sequence ids, deadlines and due times moved from the wall clock to the
// queue's (what passed them while the process was down is due at once), envelopes shared by
// the queues a message went to.
func (q *Queue) restore(r *replay) error {
	rq := r.queues[q.log.qid]
	if rq == nil {
		return nil
	}
	now, wall := q.core.clock(), time.Now().UnixNano()
	onClock := func(t int64) int64 { return max(1, now+(t-wall)) }
	var (
		ready []entry
		stay  map[uint64]bool // the messages that stay in memory past the page window, if it pages
		// With a checkpoint's chunks, which go back as they were, the messages of their own
		// (what the records after its mark brought) may be older than them: those stay in
		// memory, and those newer than the chunks of their level go on disk behind them
		// (behind).
		pages  = q.core.ready.paged.window > 0 && len(rq.chunks) == 0
		behind []entry
		after  = map[uint8]uint64{} // the last sequence id of each level's chunks

		delayed []delayedEntry
		err     error
		// A queue without priorities gets its messages in delivery order: past its window, a
		// message that may stay on disk goes into its chunk as it comes, in batches, and its
		// envelope and body go at once, rather than once every message is decoded (the peak of
		// an Open of a long backlog).
		stream = pages && q.cfg.maxPriority == 0
		batch  []entry
		bodies []*replayBody // batch's
	)
	if stream { // the run keeps the array: a window's worth, not one the size of the backlog
		ready = make([]entry, 0, min(rq.msgs.n, q.core.ready.paged.window))
	} else {
		ready = make([]entry, 0, rq.msgs.n)
	}
	pageBatch := func() {
		q.mu.Lock()
		q.core.restorePaged(batch)
		q.release()
		for i, b := range bodies {
			b.env, b.msg = nil, nil // its only placement: nothing else needs them
			bodies[i] = nil
		}
		clear(batch)
		batch, bodies = batch[:0], bodies[:0]
	}
	var returns [][]byte // the records of the returns: they must outlive this life too
	for i := range rq.chunks {
		c := &rq.chunks[i]
		after[c.rank] = max(after[c.rank], c.last)
		if c.inexact {
			q.exact(c)
		}
	}
	r.messages(q.log.qid, func(m replayMsg) {
		if err != nil {
			return
		}
		if m.returned {
			returns = append(returns, appendSeqRecord(nil, recReturn, q.log.qid, m.seq, int64(m.returns)))
		}
		b := r.bodies.get(m.msgID)
		if b.env == nil {
			x, key, msg, derr := decodeEnvelope(b.msg)
			if derr != nil {
				err = errorf("queue %q, message %d: %w", q.name, m.seq, derr)
				return
			}
			ex := q.b.exchanges[x]
			if ex == nil {
				ex = &Exchange{name: x} // gone since: its name is all a delivery says of it
			}
			b.env = q.b.envelopeOf(&msg, ex, key, true)
			if msg.Headers != nil {
				b.env.countHeaders(tableCost(msg.Headers, 0))
			}
			b.env.more.logID, b.env.more.seg, b.env.more.size = m.msgID, b.seg, int64(len(b.msg))
		}
		b.env.more.refs.Add(1)
		e := entry{env: b.env, seq: m.seq, returns: m.returns, redelivered: m.redelivered}
		own := b.refs == 1 && b.qid == q.log.qid && b.qseq == m.seq && !m.returned
		if pages && !stream && !own {
			if stay == nil {
				stay = map[uint64]bool{}
			}
			stay[m.seq] = true // its publish record is not its own in this queue: it cannot be paged
		}
		if p := q.cfg.maxPriority; p > 0 {
			e.rank = uint8(p - min(p, int(b.env.priority)))
		}
		if m.due <= wall {
			// Its delay ran out, while the process was down or before it stopped (the queue
			// made it ready then, which no record says, and a checkpoint has it ready): it is
			// ready, and expires at resume among the others if its deadline passed too.
			m.due = 0
		}
		if m.deadline != 0 {
			e.deadline = onClock(m.deadline)
		}
		switch {
		case m.due != 0:
			delayed = append(delayed, delayedEntry{onClock(m.due), e})
		case len(rq.chunks) > 0 && own && e.returns == 0 && !e.redelivered && e.seq > after[e.rank]:
			behind = append(behind, e)
		case stream && len(ready) >= q.core.ready.paged.window && own && e.returns == 0 && !e.redelivered:
			batch, bodies = append(batch, e), append(bodies, b)
			if len(batch) == restoreBatch {
				pageBatch()
			}
		default:
			ready = append(ready, e)
		}
	})
	if err != nil {
		return err
	}
	if len(batch) > 0 {
		pageBatch()
	}
	if q.cfg.maxPriority > 0 { // in seq order already otherwise
		slices.SortFunc(ready, func(a, b entry) int { return cmp.Compare(a.key(), b.key()) })
	}
	// Past the page window, the messages whose publish record is theirs in this queue, and which
	// never left it, stay on disk: their envelopes go once the chunks are made.
	var paged []entry
	if w := q.core.ready.paged.window; pages && !stream && len(ready) > w {
		kept := ready[:w]
		for _, e := range ready[w:] {
			if !stay[e.seq] && e.returns == 0 && !e.redelivered {
				paged = append(paged, e)
			} else {
				kept = append(kept, e)
			}
		}
		ready = slices.Clone(kept) // the run keeps its array: not one the size of the whole backlog
	}
	q.mu.Lock()
	if len(returns) > 0 {
		q.b.store.log.Append(returns...) // written with what this life writes first
	}
	q.core.restore(ready, delayed, rq.last+1)
	q.core.restorePaged(paged)
	if err := q.core.restoreChunks(rq.chunks, onClock); err != nil {
		q.release()
		return errorf("queue %q: %w", q.name, err)
	}
	slices.SortFunc(behind, func(a, b entry) int { return cmp.Compare(a.key(), b.key()) })
	q.core.restorePaged(behind)
	// What the restore did (dead letters of messages past their delivery limit or their
	// deadline), and what the downtime made due, waits for every durable queue and binding to
	// be back: openBroker resumes the queue then (resume).
	q.release()
	return nil
}

// restoreBatch is how many messages restore pages out at a time.
const restoreBatch = 4096

// resume starts q, restored, once every durable queue and binding is back: what the restore
// did (dead letters of messages past their delivery limit or their deadline) is flushed, and
// what the time the process was down made due happens now, in this critical section rather
// than on the queue's timer, so that it is done when Open returns and its listeners heard it:
// delayed messages whose due time passed rejoin the queue (or expire), and the timer is armed
// for what comes later.
func (q *Queue) resume() {
	q.mu.Lock()
	now := q.core.clock()
	q.core.expireDue(now)
	q.core.promoteDue(now)
	q.commit()
}

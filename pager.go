package warren

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/warrenmq/warren/internal/wal"
)

// The pager: how a durable queue's backlog goes to disk and comes back (docs/DURABILITY.md, "The
// memory budget and paging"). The core keeps the paged messages' chunks (paged.go); this is the
// shell's side of it.
//
// A durable queue of a durable broker with a page window pages out an arriving message that is
// persistent and routed to it alone (envelopeMore.solo: no other queue shares its envelope, so
// letting go of it frees its memory) when its ready set holds a window's worth in memory, or
// the message's priority level has messages on disk already. The message's publish record, which
// holds its body, is its copy on disk: commit logs it and places the chunk (placePending), and
// then the envelope is gone. A read brings the messages back from that record: the core calls
// readPaged, under the queue's lock, when a delivery, an expiry or a selector reaches a chunk.

// pushArrivingLocked puts an arriving message into the ready set: paged out if it may be, else in
// memory. The caller holds q's lock.
func (q *Queue) pushArrivingLocked(e entry) {
	r := &q.core.ready
	r.arrive(e, r.paged.window > 0 && e.env.persistent && e.env.more != nil && e.env.more.solo)
}

// pageReadTimeout bounds a read's wait for the log to write a chunk's records (they may still be
// in the writer's buffer, or behind a full disk): the read holds the queue's lock.
const pageReadTimeout = time.Second

// readPaged is a durable queue's pager (pagedTails.read): it reads rank's chunk c back from the
// log and returns its live messages in sequence order, each with an envelope made again from
// its publish record. The caller holds q's lock.
func (q *Queue) readPaged(rank uint8, c *chunk) ([]entry, error) {
	s := q.b.store
	ctx, cancel := context.WithTimeout(context.Background(), pageReadTimeout)
	defer cancel()
	var (
		ents []entry
		bad  error
	)
	now, wall := q.core.clock(), time.Now().UnixNano()
	err := s.log.Scan(ctx, c.loc.seg, wal.LSN(c.loc.lsn), func(seg uint64, b []byte) bool {
		if seg != c.loc.seg {
			return false
		}
		if len(b) == 0 || recordType(b[0]) != recPublish {
			return true
		}
		rec, err := decodeRecord(b)
		if err != nil {
			bad = err
			return false
		}
		if rec.queueID != q.log.qid || !c.holds(rec.seq) {
			return true
		}
		e, err := q.pagedEntry(rec, seg, now, wall)
		if err != nil {
			bad = err
			return false
		}
		if e.rank == rank {
			ents = append(ents, e)
		}
		return true
	})
	if err == nil {
		err = bad
	}
	if err != nil {
		return nil, errorf("queue %q: reading %d paged messages back from segment %d: %w: %w", q.name, c.n, c.loc.seg, ErrStorage, err)
	}
	// A segment holds a queue's records in the order they were written, which is not always
	// the queue's (compaction writes the ready messages before the delivered ones, which may
	// come back older), and a message written twice there counts once: the later record.
	slices.SortStableFunc(ents, func(a, b entry) int { return cmp.Compare(a.seq, b.seq) })
	out := ents[:0]
	for i, e := range ents {
		if i+1 < len(ents) && ents[i+1].seq == e.seq {
			continue
		}
		out = append(out, e)
	}
	return out, nil
}

// pagedEntry makes the entry of a paged message again from its publish record rec, found in
// segment seg; now and wall are the queue's clock and the wall clock, read together.
func (q *Queue) pagedEntry(rec record, seg uint64, now, wall int64) (entry, error) {
	x, key, msg, err := decodeEnvelope(rec.msg)
	if err != nil {
		return entry{}, errorf("message %d: %w", rec.seq, err)
	}
	env := q.b.envelopeOf(&msg, q.b.store.exchangeNamed(x), key, true)
	if msg.Headers != nil {
		env.countHeaders(tableCost(msg.Headers, 0))
	}
	env.more.logID, env.more.seg, env.more.size = rec.msgID, seg, int64(len(rec.msg))
	env.more.solo = true
	env.more.refs.Store(1) // this queue's: the message was routed to it alone
	e := entry{env: env, seq: rec.seq, returns: rec.returns}
	if p := q.cfg.maxPriority; p > 0 {
		e.rank = uint8(p - min(p, int(env.priority)))
	}
	if rec.deadline != 0 {
		e.deadline = max(1, now+(rec.deadline-wall))
	}
	return e, nil
}

// exchangeNamed returns an exchange that stands for the one named name in a message read back
// from the log: a delivery says only its name. One per name, made once.
func (s *store) exchangeNamed(name string) *Exchange {
	if x, ok := s.exchanges.Load(name); ok {
		return x.(*Exchange)
	}
	x, _ := s.exchanges.LoadOrStore(name, &Exchange{name: name})
	return x.(*Exchange)
}

// settleDroppedLocked settles on disk the paged messages of the chunks q's ready set let go of
// whole, unread (a purge or the queue's end, when a chunk could not be read back to drop each
// message with its event): a purge writes their settle records, as for the messages it dropped
// in memory; a deleted queue needs none (its deletion says it); both free their segments. At the
// broker's close they stay in the log, as every message does. The caller holds q's lock.
func (q *Queue) settleDroppedLocked() {
	chunks, pending, why := q.core.ready.takeDropped()
	if len(chunks) == 0 || why == ReasonClosed {
		return
	}
	s := q.b.store
	s.mu.Lock() // the settle records before the counts that free their segments
	if why != ReasonQueueDeleted {
		// In batches: a purge of a long backlog must not build all its records at once. A
		// failed log takes none: the messages come back at the next Open, as acks do.
		buf, recs := q.log.buf[:0], q.log.recs[:0]
		for i := range chunks {
			c := &chunks[i]
			for seq := c.first; seq <= c.last; seq++ {
				if !c.holds(seq) {
					continue
				}
				start := len(buf)
				buf = appendSeqRecord(buf, recSettle, q.log.qid, seq, 0)
				recs = append(recs, buf[start:len(buf):len(buf)])
				if len(recs) == settleBatch {
					s.log.Append(recs...)
					buf, recs = buf[:0], recs[:0]
				}
			}
		}
		if len(recs) > 0 {
			s.log.Append(recs...)
		}
		q.log.buf, q.log.recs = buf, recs[:0]
	}
	for i := range chunks {
		if c := &chunks[i]; c.loc.seg != 0 {
			s.live.add(c.loc.seg, -c.n, -c.disk)
		}
	}
	for _, e := range pending {
		if e.env.more.seg != 0 { // else the log never took it (failed): nothing counts it
			s.live.add(e.env.more.seg, -1, -e.env.more.size)
		}
	}
	s.advanceLocked()
	s.mu.Unlock()
}

// settleBatch is how many settle records settleDroppedLocked appends at a time.
const settleBatch = 4096

package warren

import (
	"time"
)

// Compaction. A segment of the log goes once it and every segment before it hold no body of a
// message a durable queue holds (store.advanceLocked): a later segment may hold such a
// message's state (a return, a delay), so segments go in order. A message held for long — a
// delayed retry, a delivery a consumer keeps for hours, the front of a backlog nobody consumes
// — would keep its segment and every later one. So when the log holds more than twice what is
// live (plus two segments: the head being written, and an oldest one that may be mostly live),
// the store's compactor writes the live messages of its oldest segments again at the head, and
// those segments go.
//
// A message is written again whole, queue by queue, each under its queue's lock (one at a time,
// as everywhere): the first queue that holds it writes its body with its own placement, the
// others their placements, each followed by the message's state in that queue (out with a
// consumer: a deliver record; delayed: a delay record). Its sequence id is its order, not its
// place in the log, so moving it changes nothing a consumer sees. Replay takes a publish record
// of a message it holds as such a rewrite (replay.apply): the body moves, and each placement
// written again replaces the old one. Until the pass has gone through every queue, no segment
// goes (store.compacting): a queue not yet visited still has its placements only there.
//
// The cost: a pass walks every durable queue's messages under its lock (skipping those newer
// than the cut at a few nanoseconds each) and writes what it moves. Each pass frees at least
// as much as the log held beyond its bound, so the bytes written again are at most those
// written meanwhile: the log's writes at most double.

// compactChunk is how many bytes of records a pass appends at once (at most a segment's).
const compactChunk = 1 << 20

// compactor runs the store's compaction passes, one at a time, on its own goroutine, from open
// to close.
type compactor struct {
	wake chan struct{} // a segment was started: maybe the log outgrew its bound
	quit chan struct{}
	done chan struct{}
}

// startCompactor starts b's compactor.
func (s *store) startCompactor(b *Broker) {
	s.compactor = compactor{wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.compactor.done)
		for {
			select {
			case <-s.compactor.quit:
				return
			case <-s.compactor.wake:
				if s.compact(b, 2) || s.checkpointDue() {
					s.checkpoint(b) // a pass moved records: a replay from the last checkpoint would read them all
				}
			}
		}
	}()
	s.mu.Lock()
	s.wakeIfLong() // a log left long by its last life is compacted now
	s.mu.Unlock()
}

// closing stops the compactor, once its pass (or checkpoint) in progress is done. It runs no
// last pass: the next Open reads the checkpoint Close writes, not the log, and a pass to a
// tighter bound would write a long backlog again whole (100M messages: two minutes).
func (s *store) closing() {
	if s.compactor.quit == nil {
		return
	}
	close(s.compactor.quit)
	<-s.compactor.done
}

// wrote records that the log appended to segment seg, and wakes the compactor when the log has
// grown past its bound. The caller holds mu.
func (s *store) wrote(seg uint64) {
	if seg <= s.lastSeg {
		return // the log grows past its bound only by new segments: nothing to check
	}
	s.lastSeg = seg
	if s.sinceCheckpoint++; s.sinceCheckpoint >= s.every { // until one is written: a snapshot may have to wait
		s.wake()
	}
	if s.compacting {
		// A pass is running (its bound is not checked meanwhile): it checks again when it
		// is done, for this segment's sake.
		s.grewInPass = true
		return
	}
	s.wakeIfLong()
}

// wakeIfLong wakes the compactor if the log holds more than its bound. The caller holds mu.
func (s *store) wakeIfLong() {
	if s.cutoffLocked(2) != 0 {
		s.wake()
	}
}

// wake wakes the compactor, if it runs: to compact, or to take a checkpoint.
func (s *store) wake() {
	if s.compactor.wake != nil {
		select {
		case s.compactor.wake <- struct{}{}:
		default:
		}
	}
}

// checkpointDue reports whether the log started every segments since the last checkpoint.
func (s *store) checkpointDue() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sinceCheckpoint >= s.every
}

// cutoffLocked returns the segment below which a pass should move every live body, 0 when the
// log is within its bound (or a pass is running): the fewest oldest segments that free what the
// log holds beyond factor times the live bytes and two segments. The caller holds mu.
func (s *store) cutoffLocked(factor int64) uint64 {
	if s.compacting {
		return 0
	}
	size := s.log.SegmentSize()
	var live int64
	for _, u := range s.live {
		live += u.bytes
	}
	excess := int64(s.lastSeg-s.oldest+1)*size - factor*live - 2*size
	if excess <= 0 {
		return 0
	}
	c := s.oldest
	for freed := int64(0); c < s.lastSeg && freed < excess; c++ {
		freed += size - s.live[c].bytes
	}
	return c
}

// compact runs one pass, if the log holds more than factor times its live bytes and two
// segments: every live message whose body is in a segment below the cut is written again at
// the head, in each durable queue that holds it; then the segments that hold nothing live go.
// It reports whether it ran one.
func (s *store) compact(b *Broker, factor int64) bool {
	if s.refusing() != nil {
		// A full disk (or a failed log): a pass would add bodies to what the log keeps for
		// its retry. The next segment started wakes the compactor again.
		return false
	}
	s.mu.Lock()
	cut := s.cutoffLocked(factor)
	var pass uint64
	if cut != 0 {
		pass = s.beginPassLocked()
	}
	s.mu.Unlock()
	if cut == 0 {
		return false
	}
	b.mu.RLock()
	queues := b.durableQueues()
	b.mu.RUnlock()
	for _, q := range queues {
		q.view(func() { s.moveLocked(q, cut, pass) })
	}
	s.endPass()
	return true
}

// beginPassLocked starts a pass and returns its number: until endPass, no segment is released
// and the log's bound is not checked. The caller holds mu.
func (s *store) beginPassLocked() uint64 {
	s.compacting = true
	s.pass++
	return s.pass
}

// endPass ends the pass: the segments nothing needs any more go, and if others started
// segments meanwhile, which woke nothing, the bound is checked now; else the log could stay past
// it until the next segment.
func (s *store) endPass() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.compacting = false
	s.advanceLocked()
	if s.grewInPass {
		s.grewInPass = false
		s.wakeIfLong()
	}
}

// moveLocked writes again, at the head of the log, q's placements of the messages whose bodies
// are below cut or were moved by this pass, with their state in q; the first queue of the pass
// to hold a message writes its body too. The caller holds q's lock.
func (s *store) moveLocked(q *Queue, cut, pass uint64) {
	if q.endErr != nil {
		return // its deletion is in the log: its placements are void
	}
	now, wall := q.core.clock(), time.Now().UnixNano()
	onWall := func(t int64) int64 { return wall + (t - now) }
	buf, recs := q.log.buf[:0], q.log.recs[:0]
	s.mu.Lock()
	defer s.mu.Unlock()
	flush := func() {
		if len(recs) == 0 {
			return
		}
		_, seg, err := s.log.Append(recs...)
		for _, b := range q.log.bodies {
			if err == nil {
				s.live.add(b.env.more.seg, -1, -b.size)
				s.live.add(seg, 1, b.size)
				b.env.more.seg = seg
			}
		}
		if err == nil {
			s.lastSeg = max(s.lastSeg, seg) // the pass's own segments wake no pass
		}
		clear(q.log.bodies)
		q.log.bodies = q.log.bodies[:0]
		buf, recs = buf[:0], recs[:0]
	}
	q.core.each(func(e entry, due int64, out bool) {
		env := e.env
		if !env.persistent || env.more == nil || env.more.logID == 0 {
			return
		}
		body := env.more.seg < cut && env.more.pass != pass
		if !body && env.more.pass != pass {
			return // its body, and so its placements, are newer than the cut
		}
		p := placement{msgID: env.more.logID, queueID: q.log.qid, seq: e.seq, returns: e.returns}
		if e.deadline != 0 {
			p.deadline = onWall(e.deadline)
		}
		start := len(buf)
		if body {
			buf, _ = appendPublish(buf, p, env)
			env.more.pass = pass
			q.log.bodies = append(q.log.bodies, loggedBody{env, env.more.size})
		} else {
			buf = appendPlacement(buf, p, nil)
		}
		recs = append(recs, buf[start:len(buf):len(buf)])
		if out {
			start = len(buf)
			buf = appendSeqRecord(buf, recDeliver, q.log.qid, e.seq, 0)
			recs = append(recs, buf[start:len(buf):len(buf)])
		}
		if due != 0 {
			start = len(buf)
			buf = appendSeqRecord(buf, recDelay, q.log.qid, e.seq, onWall(due))
			recs = append(recs, buf[start:len(buf):len(buf)])
		}
		if len(buf) >= min(compactChunk, int(s.log.SegmentSize())) {
			flush()
		}
	})
	flush()
	q.log.buf, q.log.recs = buf, recs
	s.movePagedLocked(q, cut, onWall)
}

// movePagedLocked writes again, at the head of the log, q's paged messages whose chunks are in a
// segment below cut: each chunk read back and written whole in one append, so that it is still
// in one segment, which it then points to. The pending chunks the log has written are placed
// first (those of a queue gone quiet since it paged them out). A chunk that cannot be read
// stays, and keeps its segment. The caller holds q's lock and mu.
func (s *store) movePagedLocked(q *Queue, cut uint64, onWall func(int64) int64) {
	r := &q.core.ready
	r.placePending(0, uint64(s.log.Written())) // a queue gone quiet since its last page-out: its last chunks
	for rank := range r.paged.levels {
		t := &r.paged.levels[rank]
		for i := range t.len() {
			c := t.slot(i)
			if c.loc.seg == 0 || c.loc.seg >= cut {
				continue
			}
			ents, err := r.readChunk(uint8(rank), c)
			if err != nil {
				s.logger.Warn("warren: compaction could not read paged messages back; their segment stays", "queue", q.name, "err", err)
				continue
			}
			buf, recs := q.log.buf[:0], q.log.recs[:0]
			var disk int64
			for _, e := range ents {
				p := placement{msgID: e.env.more.logID, queueID: q.log.qid, seq: e.seq, returns: e.returns}
				if e.deadline != 0 {
					p.deadline = onWall(e.deadline)
				}
				start := len(buf)
				var size int64
				buf, size = appendPublish(buf, p, e.env)
				disk += size
				recs = append(recs, buf[start:len(buf):len(buf)])
			}
			q.log.buf, q.log.recs = buf, recs
			lsn, seg, err := s.log.Append(recs...)
			if err != nil {
				return
			}
			s.live.add(c.loc.seg, -c.n, -c.disk)
			s.live.add(seg, c.n, disk)
			c.loc, c.disk = pageLoc{seg: seg, lsn: uint64(lsn)}, disk
			s.lastSeg = max(s.lastSeg, seg) // the pass's own segments wake no pass
		}
	}
}

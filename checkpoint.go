package warren

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	iofs "io/fs"
	"maps"
	"slices"
	"time"

	"github.com/warrenmq/warren/internal/wal"
)

// Checkpoints: the durable queues' state, written beside the log from time to time, so that
// Open reads the checkpoint and the records after it rather than the whole log
// (docs/DURABILITY.md, "Checkpoints").
//
// A checkpoint is taken (store.checkpoint) every checkpointEvery segments the log starts, and
// at Close: first a mark (wal.Log.MarkNow: the start of the segment being written, before every
// record appended from then on), then each durable queue's state under its lock, one queue at a
// time — its messages in memory by reference (message id, sequence id, returns, deadline, due
// time, out or not, and where the body's record is) and its paged chunks as they are — then the
// topology and the store's ids. The log is synced (what the snapshots show is durable), and the
// checkpoint is written, under a checksum, to the older of two files, so that a torn write
// leaves the other.
//
// Open tries the newest checkpoint first (wal.Options.ResumeAt): if its mark is still in the log
// (the segments from the log's start to it are there), it starts from the checkpoint's state and
// replays the records from the mark on over it. Those include records whose effect a snapshot
// already shows (appended between the mark and the snapshot): replaying one is harmless, as each
// record sets what it sets (a placement the whole state, a delivery "out", a settle "gone"), so
// the last record about a message decides, as it did in the queue. Records about a message the
// checkpoint holds in a chunk, without per-message state, are taken so (replay.chunked, and
// apply): the publish record the chunk stands for is skipped; a settle takes the message out of
// its chunk; a delivery, a return or a delay (the message was read back since) takes it out and
// makes it a message of its own, whose placement and body are read back from the chunk's
// segment (loadBodies); a placement elsewhere (compaction wrote it again) does the same from its
// own record. Then Open reads back the bodies of the messages that go back into memory, segment
// by segment, and puts the chunks back into the tails as they were. If no checkpoint's mark is
// in the log any more, or a checkpoint is damaged, or a body is not where it says, Open replays
// the whole log, as without one.
//
// A queue whose state is not yet the log's (dead letters on their way: they leave their queue's
// log only once in their targets, and stay there if the closing broker refuses them) makes the
// checkpoint wait for the next trigger. So a checkpoint can make Open faster, never different:
// what it restores is what the replay of the log restores (TestCheckpointSameAsReplay).

// checkpointFiles are the checkpoints' names in the log's directory: a checkpoint goes to the one
// not holding the newest.
var checkpointFiles = [2]string{"checkpoint.0", "checkpoint.1"}

// checkpointEvery is how many segments the log starts between two checkpoints, by default: with 512 KiB
// segments, a kill -9 replays at most about 64 MiB of records, and a checkpoint (a few
// milliseconds under each queue's lock) comes at most a few times a second at full speed.
const checkpointEvery = 128

// checkpointMaxHeld is the most messages held in memory (each listed in a checkpoint) for which
// the broker takes a checkpoint while it runs: past it (a broker that does not page, a fan-out
// backlog), a checkpoint would cost about what the replay it saves does, rewritten every
// interval, under each queue's lock for as long as it takes to list its messages. Close takes
// one whatever it holds.
const checkpointMaxHeld = 1 << 18

// checkpointMagic starts a checkpoint: its format's name and version.
const checkpointMagic = "warren checkpoint 2\n"

// checkpoint is the durable queues' state at a mark of the log.
type checkpoint struct {
	seq       uint64   // its number: the newest is tried first
	mark      wal.Mark // every record before it is reflected; those after it are replayed over it
	nextMsg   uint64   // the last message id given
	nextQueue uint64   // the last queue id given
	topo      [][]byte // the durable topology, as records
	bodies    []ckBody // the bodies of the messages held in memory, by message id
	queues    []ckQueue
}

// ckBody is where a message's body is: the segment of its publish record, and its size.
type ckBody struct {
	msgID, seg uint64
	size       int64
}

// ckQueue is a durable queue's state: its messages held in memory, as a replay would have them
// (deadlines and due times on the wall clock), and its chunks on disk, by level, each level's
// in order.
type ckQueue struct {
	qid, last uint64
	msgs      []replayMsg
	chunks    []ckChunk
}

// ckChunk is a chunk of a level's tail, its deadline on the wall clock.
type ckChunk struct {
	rank uint8
	chunk
	// inexact: the replay took messages out of it, each with its share of the chunk's bytes,
	// footprint and record bytes; restore reads it back for the exact ones (Queue.exact).
	inexact bool
}

// take takes seq, one of its messages, out of the chunk, for a record replayed after the
// checkpoint's mark.
func (c *ckChunk) take(seq uint64) {
	c.drop(seq)
	c.inexact = true
}

// snapshot returns the state of queues, durable queues of b, for a checkpoint at mark, or nil if
// a queue's state is not yet the log's. Queues declared or deleted meanwhile are in the records
// after the mark.
func (s *store) snapshot(queues []*Queue, mark wal.Mark, nextQueue uint64) *checkpoint {
	ck := &checkpoint{mark: mark, nextQueue: nextQueue}
	bodies := map[uint64]ckBody{}
	for _, q := range queues {
		var cq ckQueue
		ok := true
		q.view(func() {
			if q.endErr == nil {
				cq, ok = q.snapshotLocked(bodies)
			}
		})
		if !ok {
			return nil
		}
		if q.endErr == nil {
			ck.queues = append(ck.queues, cq)
		}
	}
	ck.nextMsg = s.nextMsg.Load()
	slices.SortFunc(ck.queues, func(a, b ckQueue) int { return cmp.Compare(a.qid, b.qid) })
	for _, bd := range bodies {
		ck.bodies = append(ck.bodies, bd)
	}
	slices.SortFunc(ck.bodies, func(a, b ckBody) int { return cmp.Compare(a.msgID, b.msgID) })
	s.mu.Lock()
	ck.topo = s.topologyRecords()
	s.mu.Unlock()
	return ck
}

// checkpoint takes a checkpoint of b's durable queues and writes it, unless a queue's state is
// not yet the log's (the next trigger tries again) or the log cannot sync. The compactor's
// goroutine calls it, between its passes.
func (s *store) checkpoint(b *Broker) {
	s.mu.Lock()
	s.sinceCheckpoint = 0 // counted from the mark on: segments started meanwhile count for the next
	s.mu.Unlock()
	mark := s.log.MarkNow()
	b.mu.RLock()
	queues, nextQueue := b.durableQueues(), s.nextQueue
	b.mu.RUnlock()
	held := 0
	for _, q := range queues {
		q.view(func() { held += q.core.ready.inMemory() + q.core.unacked + delayedLen(&q.core) })
	}
	s.mu.Lock()
	over := held > s.maxHeld
	s.mu.Unlock()
	if over {
		return // until the next interval: the backlog may have gone to disk, or been consumed
	}
	ck := s.snapshot(queues, mark, nextQueue)
	if ck == nil || s.log.Sync() != nil {
		s.mu.Lock()
		s.sinceCheckpoint += s.every / 2 // due again halfway through the next interval
		s.mu.Unlock()
		return
	}
	s.write(ck)
}

// write writes ck, numbered after the last, to the file not holding the newest checkpoint.
func (s *store) write(ck *checkpoint) {
	s.mu.Lock()
	s.checkpoints++
	ck.seq = s.checkpoints
	s.mu.Unlock()
	if err := writeCheckpoint(s.fs, ck); err != nil {
		s.logger.Warn("warren: durable log: writing a checkpoint; the next Open replays more of the log", "err", err)
	}
}

// snapshotLocked returns q's state for a checkpoint, adding the bodies of its messages in memory
// to bodies; ok is false if q's state is not yet the log's (dead letters on their way, chunks
// dropped and not yet settled, a message whose record has no segment yet). The caller holds q's
// lock.
func (q *Queue) snapshotLocked(bodies map[uint64]ckBody) (cq ckQueue, ok bool) {
	c := &q.core
	if q.flushing || len(c.effects) > 0 || q.flushedDead != c.queuedDead {
		// Dead letters on their way: their messages left the core, and leave the log only once
		// in their targets; refused by the closing broker, they stay in it.
		return cq, false
	}
	now, wall := c.clock(), time.Now().UnixNano()
	toWall := func(t int64) int64 {
		if t == 0 {
			return 0
		}
		return wall + (t - now)
	}
	cq = ckQueue{qid: q.log.qid, last: c.nextSeq - 1}
	ok = true
	s := q.b.store
	add := func(e entry, due int64, out bool) {
		env := e.env
		if !env.persistent || env.more == nil {
			return // not in the log: gone at a restart
		}
		s.mu.Lock() // where the first queue to log the body set them
		body := ckBody{env.more.logID, env.more.seg, env.more.size}
		s.mu.Unlock()
		if body.msgID == 0 || body.seg == 0 {
			ok = false
			return
		}
		cq.msgs = append(cq.msgs, replayMsg{msgID: body.msgID, seq: e.seq, deadline: toWall(e.deadline),
			returns: e.returns, redelivered: e.redelivered, delivered: out, due: toWall(due)})
		bodies[body.msgID] = body
	}
	c.each(add)
	p := &c.ready.paged
	if len(p.dropped) > 0 || len(p.droppedPending) > 0 {
		return cq, false
	}
	for rank := range p.levels {
		t := &p.levels[rank]
		for i := range t.len() {
			ch := t.slot(i)
			if ch.n == 0 {
				continue
			}
			if ch.loc.seg == 0 { // pending: its messages are in memory, each written
				for _, e := range p.pending {
					if int(e.rank) == rank && ch.holds(e.seq) {
						add(e, 0, false)
					}
				}
				continue
			}
			k := ckChunk{rank: uint8(rank), chunk: *ch}
			k.deadline, k.gone, k.loc.lsn = toWall(ch.deadline), slices.Clone(ch.gone), 0
			cq.chunks = append(cq.chunks, k)
		}
	}
	slices.SortFunc(cq.msgs, func(a, b replayMsg) int { return cmp.Compare(a.seq, b.seq) })
	return cq, ok
}

// encode returns the checkpoint's bytes: the magic, the fields as uvarints (signed ones
// zigzagged), and a CRC-32C of all of it.
func (ck *checkpoint) encode() []byte {
	b := []byte(checkpointMagic)
	u := func(x uint64) { b = binary.AppendUvarint(b, x) }
	v := func(x int64) { b = binary.AppendVarint(b, x) }
	u(ck.seq)
	u(ck.mark.Seg)
	u(ck.mark.Record)
	u(ck.mark.Start)
	u(uint64(len(ck.mark.Firsts)))
	var last uint64
	for _, f := range ck.mark.Firsts { // ascending: the differences are short
		u(f - last)
		last = f
	}
	u(ck.nextMsg)
	u(ck.nextQueue)
	u(uint64(len(ck.topo)))
	for _, r := range ck.topo {
		u(uint64(len(r)))
		b = append(b, r...)
	}
	u(uint64(len(ck.bodies)))
	for _, bd := range ck.bodies {
		u(bd.msgID)
		u(bd.seg)
		u(uint64(bd.size))
	}
	u(uint64(len(ck.queues)))
	for _, q := range ck.queues {
		u(q.qid)
		u(q.last)
		u(uint64(len(q.msgs)))
		for _, m := range q.msgs {
			u(m.msgID)
			u(m.seq)
			v(m.deadline)
			u(uint64(m.returns))
			var flags uint64
			if m.redelivered {
				flags |= 1
			}
			if m.delivered {
				flags |= 2
			}
			u(flags)
			v(m.due)
		}
		u(uint64(len(q.chunks)))
		for _, c := range q.chunks {
			u(uint64(c.rank))
			u(c.first)
			u(c.last)
			u(uint64(c.n))
			u(uint64(c.bytes))
			u(uint64(c.extra))
			v(c.deadline)
			u(c.loc.seg)
			u(uint64(c.disk))
			u(uint64(len(c.gone)))
			for _, g := range c.gone {
				u(g)
			}
		}
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// errBadCheckpoint is why a checkpoint is not used: Open replays the log instead.
var errBadCheckpoint = errors.New("bad checkpoint")

// decodeCheckpoint decodes a checkpoint's bytes.
func decodeCheckpoint(b []byte) (*checkpoint, error) {
	if len(b) < len(checkpointMagic)+4 || string(b[:len(checkpointMagic)]) != checkpointMagic {
		return nil, errorf("%w: not a checkpoint", errBadCheckpoint)
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, crcTable) != binary.LittleEndian.Uint32(b[len(body):]) {
		return nil, errorf("%w: checksum", errBadCheckpoint)
	}
	d := decoder{b: body, off: len(checkpointMagic)}
	// n reads a count, bounded by what is left: a damaged one fails, not allocates.
	n := func() int { return int(d.unsigned(uint64(len(body) - d.off))) }
	ck := &checkpoint{seq: d.uvarint()}
	ck.mark.Seg, ck.mark.Record, ck.mark.Start = d.uvarint(), d.uvarint(), d.uvarint()
	var last uint64
	for range n() {
		last += d.uvarint()
		ck.mark.Firsts = append(ck.mark.Firsts, last)
	}
	ck.nextMsg, ck.nextQueue = d.uvarint(), d.uvarint()
	for range n() {
		ck.topo = append(ck.topo, d.next(d.uvarint()))
	}
	for range n() {
		ck.bodies = append(ck.bodies, ckBody{msgID: d.uvarint(), seg: d.uvarint(), size: int64(d.unsigned(1 << 40))})
	}
	for range n() {
		q := ckQueue{qid: d.uvarint(), last: d.uvarint()}
		for range n() {
			m := replayMsg{msgID: d.uvarint(), seq: d.uvarint(), deadline: d.varint(), returns: uint32(d.unsigned(1<<32 - 1))}
			flags := d.unsigned(3)
			m.redelivered, m.delivered, m.due = flags&1 != 0, flags&2 != 0, d.varint()
			q.msgs = append(q.msgs, m)
		}
		for range n() {
			var c ckChunk
			c.rank = uint8(d.unsigned(maxPriority))
			c.first, c.last, c.n = d.uvarint(), d.uvarint(), int(d.unsigned(1<<40))
			c.bytes, c.extra = int64(d.unsigned(1<<62)), int64(d.unsigned(1<<62))
			c.deadline, c.loc.seg, c.disk = d.varint(), d.uvarint(), int64(d.unsigned(1<<62))
			for range n() {
				c.gone = append(c.gone, d.uvarint())
			}
			if d.err == nil && (c.loc.seg == 0 || c.n == 0 || c.first > c.last || !slices.IsSorted(c.gone) ||
				uint64(c.n) != c.last-c.first+1-uint64(len(c.gone)) || // its ids not gone are its messages
				len(c.gone) > 0 && (c.gone[0] <= c.first || c.gone[len(c.gone)-1] > c.last) ||
				len(q.chunks) > 0 && (q.chunks[len(q.chunks)-1].rank > c.rank ||
					q.chunks[len(q.chunks)-1].rank == c.rank && q.chunks[len(q.chunks)-1].last >= c.first)) {
				d.fail("chunk %d-%d", c.first, c.last)
			}
			q.chunks = append(q.chunks, c)
		}
		ck.queues = append(ck.queues, q)
	}
	if d.err == nil && d.off != len(body) {
		d.fail("trailing bytes")
	}
	if d.err != nil {
		return nil, errorf("%w: %w", errBadCheckpoint, d.err)
	}
	return ck, nil
}

// writeCheckpoint writes ck to its file in fs, synced; a failure leaves a file a later Open
// ignores (its checksum fails) or none.
func writeCheckpoint(fs wal.FS, ck *checkpoint) error {
	name := checkpointFiles[ck.seq%2]
	if err := fs.Remove(name); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return err
	}
	f, err := fs.Create(name)
	if err != nil {
		return err
	}
	_, err = f.Write(ck.encode())
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fs.SyncDir()
	}
	if err != nil {
		fs.Remove(name)
	}
	return err
}

// readCheckpoints returns the checkpoints in fs that decode, the newest first, and the errors of
// those that do not.
func readCheckpoints(fs wal.FS) ([]*checkpoint, []error) {
	var (
		cks  []*checkpoint
		errs []error
	)
	for _, name := range checkpointFiles {
		ck, err := readCheckpoint(fs, name)
		if err != nil {
			errs = append(errs, errorf("%s: %w", name, err))
		} else if ck != nil {
			cks = append(cks, ck)
		}
	}
	slices.SortFunc(cks, func(a, b *checkpoint) int { return cmp.Compare(b.seq, a.seq) })
	return cks, errs
}

// removeCheckpoints removes the checkpoints in fs.
func removeCheckpoints(fs wal.FS) error {
	for _, name := range checkpointFiles {
		if err := fs.Remove(name); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			return err
		}
	}
	return fs.SyncDir()
}

// readCheckpoint reads the checkpoint name in fs: nil, nil if there is none.
func readCheckpoint(fs wal.FS, name string) (*checkpoint, error) {
	f, err := fs.Open(name)
	if errors.Is(err, iofs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, err
	}
	b := make([]byte, size)
	if k, err := f.ReadAt(b, 0); int64(k) != size {
		return nil, err
	}
	return decodeCheckpoint(b)
}

// replay returns the replay the checkpoint stands for, for the records after its mark to be
// applied to, with the bodies of its messages not yet read (loadBodies).
func (ck *checkpoint) replay() (*replay, error) {
	r := newReplay()
	for _, raw := range ck.topo {
		rec, err := decodeRecord(raw)
		if err != nil {
			return nil, errorf("%w: topology: %w", errBadCheckpoint, err)
		}
		r.apply(0, rec)
	}
	r.maxMsg = ck.nextMsg
	r.nextQueue = ck.nextQueue
	for _, bd := range ck.bodies {
		*r.bodies.put(bd.msgID) = replayBody{seg: bd.seg}
	}
	for _, cq := range ck.queues {
		q := &replayQueue{last: cq.last, chunks: slices.Clone(cq.chunks)}
		for _, m := range cq.msgs {
			*q.msgs.put(m.seq) = m
		}
		r.queues[cq.qid] = q
	}
	return r, nil
}

// chunkHolding returns the chunk of q that holds seq, or nil.
func (q *replayQueue) chunkHolding(seq uint64) *ckChunk {
	cs := q.chunks
	for len(cs) > 0 {
		rank := cs[0].rank
		n, _ := slices.BinarySearchFunc(cs, rank+1, func(c ckChunk, r uint8) int { return cmp.Compare(c.rank, r) })
		level := cs[:n]
		i, _ := slices.BinarySearchFunc(level, seq, func(c ckChunk, s uint64) int { return cmp.Compare(c.last, s) })
		if i < len(level) && level[i].n > 0 && level[i].holds(seq) {
			return &level[i]
		}
		cs = cs[n:]
	}
	return nil
}

// chunked reports whether a placement read from segment seg is that of a message a
// checkpoint's chunk holds, which stays there: the record the chunk stands for. A placement of
// such a message elsewhere (compaction wrote it again) takes it out of its chunk: it is placed
// from this record, as any other.
func (r *replay) chunked(p placement, seg uint64) bool {
	q := r.queues[p.queueID]
	if q == nil || len(q.chunks) == 0 {
		return false
	}
	c := q.chunkHolding(p.seq)
	if c == nil {
		return false
	}
	if c.loc.seg == seg {
		return true
	}
	c.take(p.seq)
	return false
}

// unchunk takes seq out of the checkpoint's chunk that holds it, if one does, for a record that
// changes its state (a delivery, a return, a delay: it was read back since): it becomes a
// message of its own, whose placement and body loadBodies reads from the chunk's segment. It
// returns the message, or nil if no chunk holds seq.
func (q *replayQueue) unchunk(seq uint64) *replayMsg {
	c := q.chunkHolding(seq)
	if c == nil {
		return nil
	}
	c.take(seq)
	if q.fetch == nil {
		q.fetch = map[uint64]uint64{}
	}
	q.fetch[seq] = c.loc.seg
	m := q.msgs.put(seq)
	*m = replayMsg{seq: seq}
	return m
}

// loadBodies reads back from log what a replay from a checkpoint needs of the records before its
// mark: the bodies of the messages that go back into memory, and the placements of those taken
// out of a chunk since (unchunk); each segment that holds one is read once. It fails if one is
// not in the segment the checkpoint says.
func (r *replay) loadBodies(log *wal.Log) error {
	want := map[uint64]int{} // what each segment must yield
	r.bodies.ascend(func(_ uint64, b *replayBody) { b.refs = 0 })
	for _, q := range r.queues {
		q.msgs.ascend(func(_ uint64, m *replayMsg) {
			if b := r.bodies.get(m.msgID); m.msgID != 0 && b != nil && b.msg == nil && b.refs == 0 {
				b.refs = 1
				want[b.seg]++
			}
		})
		for seq, seg := range q.fetch {
			if m := q.msgs.get(seq); m != nil && m.msgID == 0 {
				want[seg]++
			} else {
				delete(q.fetch, seq)
			}
		}
	}
	for _, seg := range slices.Sorted(maps.Keys(want)) {
		left := want[seg]
		var derr error
		err := log.Scan(context.Background(), seg, 0, func(at uint64, raw []byte) bool {
			if at != seg {
				return false
			}
			if len(raw) == 0 || recordType(raw[0]) != recPublish {
				return true
			}
			rec, err := decodeRecord(raw)
			if err != nil {
				derr = err
				return false
			}
			if b := r.bodies.get(rec.msgID); b != nil && b.seg == seg && b.msg == nil && b.refs == 1 {
				b.msg, b.refs = r.keep(rec.msg), 0
				left--
			}
			if q := r.queues[rec.queueID]; q != nil && q.fetch[rec.seq] == seg {
				delete(q.fetch, rec.seq)
				if m := q.msgs.get(rec.seq); m != nil && m.msgID == 0 {
					m.msgID, m.deadline = rec.msgID, rec.deadline
					*r.bodies.put(rec.msgID) = replayBody{msg: r.keep(rec.msg), seg: seg, qid: rec.queueID, qseq: rec.seq}
					left--
				}
			}
			return left > 0
		})
		if err == nil {
			err = derr
		}
		if err == nil && left > 0 {
			err = errorf("%d records not in segment %d", left, seg)
		}
		if err != nil {
			return errorf("%w: %w", errBadCheckpoint, err)
		}
	}
	r.bodies.ascend(func(_ uint64, b *replayBody) { b.refs = 0 })
	return nil
}

// exact makes the sizes of c, a chunk of q's that the replay took messages out of, exact again:
// it reads its messages back and counts theirs. If they cannot be read (the read fails, or finds
// other messages than c's count), c keeps its shares: a queue's byte count and footprint are
// estimated for those messages until they are read back.
func (q *Queue) exact(c *ckChunk) {
	ents, err := q.readPaged(c.rank, &c.chunk)
	if err != nil || len(ents) != c.n {
		return
	}
	disk := c.disk
	c.bytes, c.extra, c.disk = 0, 0, 0
	for _, e := range ents {
		c.bytes += int64(int(e.env.size))
		c.extra += e.env.overhead()
		c.disk += recordSize(e)
	}
	c.inexact = false
	s := q.b.store
	s.mu.Lock()
	s.live.add(c.loc.seg, 0, c.disk-disk) // the replay counted the shares
	s.mu.Unlock()
}

// delayedLen returns how many messages c holds delayed.
func delayedLen(c *queueCore) int {
	if c.delayed == nil {
		return 0
	}
	return c.delayed.Len()
}

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

// Checkpoints: what a clean Close leaves beside the log, so that the next Open need not read it
// (docs/DURABILITY.md, "Checkpoints").
//
// Close, once no publisher or consumer can change a durable queue any more, takes each one's
// state under its lock: its messages in memory by reference (message id, sequence id, returns,
// deadline, due time, out or not, and where the body's record is), and its paged chunks as
// they are. Once the log is closed, if nothing was appended since the first of those snapshots,
// it writes them, with the durable topology, the store's ids and where the log ends
// (wal.Log.Mark), to the file "checkpoint" beside the segments, synced, under a checksum.
//
// Open reads it and opens the log resuming at that end (wal.Options.ResumeAt). If the log still
// ends there, nothing was written since, and the checkpoint's state is the log's: Open reads
// back only the bodies of the messages that go back into memory (a window a queue), segment by
// segment; a paged backlog stays on disk as the chunks it was. Otherwise (a later life wrote
// to the log and did not close cleanly, or the file is damaged, or a body is not where it says)
// Open replays the whole log, as without a checkpoint. Open removes the file once it has read
// it: the log goes on from there, and only the next clean Close writes another.
//
// So a checkpoint can make Open faster, never different: what it restores is what the replay
// of the log it stands for restores (TestCheckpointSameAsReplay).

// checkpointFile is the checkpoint's name in the log's directory.
const checkpointFile = "checkpoint"

// checkpointMagic starts a checkpoint: its format's name and version.
const checkpointMagic = "warren checkpoint 1\n"

// checkpoint is the durable state at a clean Close.
type checkpoint struct {
	mark      wal.Mark // where the log ended
	nextMsg   uint64   // the last message id given
	nextQueue uint64   // the last queue id given
	topo      [][]byte // the durable topology, as records
	bodies    []ckBody // the bodies of the messages held in memory, by message id
	queues    []ckQueue
	// at is the log position when the snapshots began: the checkpoint stands for the log only
	// if nothing was appended after it. Not written.
	at wal.LSN
}

// ckBody is where a message's body is: the segment of its publish record, and its size.
type ckBody struct {
	msgID, seg uint64
	size       int64
}

// ckQueue is a durable queue's state: its messages held in memory, as a replay would have them
// (deadlines and due times on the wall clock), and its chunks on disk.
type ckQueue struct {
	qid, last uint64
	msgs      []replayMsg
	chunks    []ckChunk
}

// ckChunk is a chunk of a level's tail, its deadline on the wall clock.
type ckChunk struct {
	rank uint8
	chunk
}

// snapshot returns the durable queues' state for a checkpoint, or nil if a queue holds what a
// checkpoint cannot stand for. The caller holds the broker's topology lock, and the broker is
// closed: no queue is declared or deleted meanwhile.
func (s *store) snapshot(b *Broker) *checkpoint {
	ck := &checkpoint{at: s.log.Appended(), nextQueue: s.nextQueue}
	bodies := map[uint64]ckBody{}
	for _, q := range b.queues {
		if q.log == nil {
			continue
		}
		var cq ckQueue
		ok := true
		q.view(func() { cq, ok = q.snapshotLocked(bodies) })
		if !ok {
			return nil
		}
		ck.queues = append(ck.queues, cq)
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
	add := func(e entry, due int64, out bool) {
		env := e.env
		if !env.persistent || env.more == nil {
			return // not in the log: gone at a restart
		}
		if env.more.logID == 0 || env.more.seg == 0 {
			ok = false
			return
		}
		cq.msgs = append(cq.msgs, replayMsg{msgID: env.more.logID, seq: e.seq, deadline: toWall(e.deadline),
			returns: e.returns, redelivered: e.redelivered, delivered: out, due: toWall(due)})
		bodies[env.more.logID] = ckBody{env.more.logID, env.more.seg, env.more.size}
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
	u(ck.mark.Seg)
	u(ck.mark.Record)
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
	ck := &checkpoint{}
	ck.mark.Seg, ck.mark.Record = d.uvarint(), d.uvarint()
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
			if d.err == nil && (c.loc.seg == 0 || c.n == 0 || c.first > c.last || !slices.IsSorted(c.gone)) {
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

// writeCheckpoint writes ck to fs, synced; a failure leaves a file a later Open ignores (its
// checksum fails) or none.
func writeCheckpoint(fs wal.FS, ck *checkpoint) error {
	f, err := fs.Create(checkpointFile)
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
		fs.Remove(checkpointFile)
	}
	return err
}

// readCheckpoint reads the checkpoint in fs: nil, nil if there is none.
func readCheckpoint(fs wal.FS) (*checkpoint, error) {
	f, err := fs.Open(checkpointFile)
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

// replay returns the replay the checkpoint stands for, with the bodies of its messages not yet
// read (loadBodies).
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
	for _, bd := range ck.bodies {
		*r.bodies.put(bd.msgID) = replayBody{seg: bd.seg}
	}
	for _, cq := range ck.queues {
		q := &replayQueue{last: cq.last, chunks: cq.chunks}
		for _, m := range cq.msgs {
			*q.msgs.put(m.seq) = m
		}
		r.queues[cq.qid] = q
	}
	return r, nil
}

// loadBodies reads back from log the bodies of the replay's messages, which a checkpoint's
// replay holds by segment: each segment that holds one is read once. It fails if a body is not
// in the segment the checkpoint says.
func (r *replay) loadBodies(log *wal.Log) error {
	want := map[uint64][]uint64{} // message ids by segment
	r.bodies.ascend(func(id uint64, b *replayBody) {
		want[b.seg] = append(want[b.seg], id)
	})
	for _, seg := range slices.Sorted(maps.Keys(want)) {
		left := len(want[seg])
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
			if b := r.bodies.get(rec.msgID); b != nil && b.seg == seg && b.msg == nil {
				b.msg = r.keep(rec.msg)
				left--
			}
			return left > 0
		})
		if err == nil {
			err = derr
		}
		if err == nil && left > 0 {
			err = errorf("%d bodies not in segment %d", left, seg)
		}
		if err != nil {
			return errorf("%w: %w", errBadCheckpoint, err)
		}
	}
	return nil
}

package wal

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Recovery is what Open found, and what it dropped.
type Recovery struct {
	Segments int // segments read
	Records  int // records handed to replay
	// Cut are the torn ends Open cut off: of the last segment, or of the one before it when a
	// crash came while the log moved from one to the next (see Open); bytes that nothing
	// written after them says were synced.
	Cut []Damage
	// Skipped are the damaged stretches and missing segments Options.Salvage skipped, in the
	// log's order.
	Skipped []Damage
	// Last is the segment appends go to: the last one read, or a new one.
	Last uint64
	// Resumed says Open resumed at ResumedAt, one of Options.ResumeAt: the records before it
	// were not read.
	Resumed   bool
	ResumedAt Mark
}

// Damage is a stretch of the log that Open dropped.
type Damage struct {
	File   string // the segment's file name
	Offset int64  // where the stretch starts
	Bytes  int64  // how long it is, as far as the file says (0 when the bytes are gone)
	// Records is how many records the stretch held, when the log can tell: it numbers its
	// records, so it can when a record after the stretch, or the header of the next segment,
	// was read. -1 when it cannot: a torn end, a missing last segment, or several stretches
	// with nothing readable between them.
	Records int
	// Missing says the whole segment file is missing.
	Missing bool
	// GoodAfter counts the good batches a cut dropped because they came after the damage: after
	// a power loss, unsynced writes reach the disk in any order, so a hole may precede batches
	// that landed (see Open).
	GoodAfter int
	// Reason says what was wrong.
	Reason string
}

// Open opens the log in fs, creating it if it is empty, and hands every record it holds to
// replay, in order, with the number of the segment it is in; rec is valid only during the call.
// An error from replay stops Open and is returned.
//
// Open never drops a record a sync made durable without saying so: it fails with an error
// wrapping ErrCorrupt, naming the file and the offset, or, with Options.Salvage, skips the
// damage and returns it in the Recovery (and calls Options.OnSkip). What it may drop and still
// open is a torn end, which it returns in Recovery.Cut: bytes at the end of the log that nothing
// written after them says were synced, which is what a crash of the process or of the machine
// tears. The log knows which bytes were synced from what it wrote:
//
//   - It knows where it starts: each segment's header, and a start batch written before any
//     segment is removed, say which is the oldest segment the log needs. Each segment from that
//     one to the last must be there: a missing one is corruption.
//   - It knows where it ends: moving to a new segment, the log creates it and then writes a
//     seal at the end of the one before, synced (Log.rotate); no record goes to the new one
//     before. So a segment with a seal is complete, and the next one exists: a missing last
//     segment is corruption. A segment without a seal is the last one, or the one before a last
//     one that holds no batch (a crash during the move): either may have a torn end.
//   - It knows how far each segment was synced: each batch says how many bytes of its segment
//     were durable when it was written, and a segment's header says how many bytes of the one
//     before were. In a segment that may have a torn end, a bad batch is a torn write when no
//     later batch (and no header) says its bytes were synced: it is cut there, with every batch
//     after it (which, after a power loss, can have landed while an earlier unsynced write did
//     not: Damage.GoodAfter counts them), and the cut is reported in Recovery.Cut. A bad batch
//     that a later batch says was synced, and any damage in a segment that cannot have a torn
//     end (one with a seal, or followed by a segment holding batches), is corruption.
//   - It numbers its records, so that what it drops is counted (Damage.Records).
//
// So after a clean Close, which seals the last segment that holds batches and starts an empty
// one, every byte of the log is checked. After a crash, the end of the last segment that no
// sync covered may be cut; so may synced batches at its very end that nothing written after
// them marks as synced: the log cannot tell them from a torn write, and cuts them too.
//
// Open writes nothing unless it opens: the cuts, the seal of a segment the crash left unsealed
// and the header of an empty last segment are written once the whole log was read.
func Open(fs FS, opts Options, replay func(seg uint64, rec []byte) error) (*Log, Recovery, error) {
	if opts.SegmentSize <= 0 {
		opts.SegmentSize = 512 << 10
	}
	if opts.FlushDelay <= 0 {
		opts.FlushDelay = time.Millisecond
	}
	if opts.Interval <= 0 {
		opts.Interval = 100 * time.Millisecond
	}
	l := &Log{fs: fs, opts: opts, segFirst: map[uint64]uint64{}, segLSN: map[uint64]LSN{}}
	l.cond.L = &l.mu
	o := &opener{l: l, replay: replay, data: map[uint64][]byte{}, present: map[uint64]bool{}}
	err := o.list()
	if err == nil && len(o.segs) == 0 {
		err = o.create()
	} else if err == nil {
		err = o.findStart()
		if err == nil {
			err = o.read()
		}
		if err == nil {
			err = o.repair()
		}
	}
	for _, d := range o.found {
		o.rec.Skipped = append(o.rec.Skipped, *d)
	}
	for _, d := range o.cuts {
		o.rec.Cut = append(o.rec.Cut, *d)
	}
	if err != nil {
		return nil, o.rec, err
	}
	o.rec.Last = l.fileSeg
	l.openAt = pos{l.fileSeg, l.fileOff}
	l.skipped, l.gaps, l.unsealed = skippedStretches(o.rec.Skipped), o.gaps, o.unsealedBefore(l.fileSeg)
	return l, o.rec, nil
}

// opener is the state of an Open.
type opener struct {
	l       *Log
	replay  func(uint64, []byte) error
	rec     Recovery
	segs    []uint64 // the segments there, in order
	present map[uint64]bool
	last    uint64
	data    map[uint64][]byte // segments read and still needed

	// The log's start, from the last good header and the start batches after it.
	start, startFirst uint64
	startKnown        bool

	// next is the number of the next record, if nextKnown; pending are the stretches dropped
	// since the last record read, whose records are counted once the next record's number is
	// known (learn).
	next      uint64
	nextKnown bool
	pending   []*Damage
	unsealed  *Damage   // the end of an unsealed segment before the last: a torn end if records are missing after it
	found     []*Damage // what Salvage skipped
	gaps      []gap     // the segments it skipped as missing
	ends      []uint64  // the segments read to their end without a seal
	cuts      []*Damage // the torn ends

	// What read found to write, for repair.
	cutAt     map[uint64]cutPlan
	seal      uint64 // a segment to seal: a crash came while the log moved past it
	sealNext  uint64 // the number of the record after what is kept of it
	extend    bool   // start a segment after the last (Salvage: the last is sealed, or its header bad)
	lastMarks int64  // the last segment's bytes known durable
}

// cutPlan is a cut of a segment: at off; under its header's size, the segment is written again
// with the header h.
type cutPlan struct {
	off int64
	h   header
}

// list finds the segments.
func (o *opener) list() error {
	names, err := o.l.fs.List()
	if err != nil {
		return err
	}
	for _, name := range names {
		if n, ok := segmentNumber(name); ok {
			o.segs = append(o.segs, n)
			o.present[n] = true
		}
	}
	slices.Sort(o.segs)
	if len(o.segs) > 0 {
		o.last = o.segs[len(o.segs)-1]
	}
	return nil
}

// create starts a new log.
func (o *opener) create() error {
	l := o.l
	if err := l.startSegment(header{seg: 1, start: 1}); err != nil {
		return err
	}
	l.segFirst[1] = 0
	l.syncedTo = pos{1, 0}
	l.lastSeg, l.segBytes, l.writtenSeg = 1, headerSize, 1
	l.setStart(1, 1, 1)
	return nil
}

// load returns segment n's bytes.
func (o *opener) load(n uint64) ([]byte, error) {
	if b, ok := o.data[n]; ok {
		return b, nil
	}
	name := segmentName(n)
	f, err := o.l.fs.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, err
	}
	data := make([]byte, size)
	if k, err := f.ReadAt(data, 0); int64(k) != size {
		return nil, fmt.Errorf("wal: read %s: %w", name, err)
	}
	o.data[n] = data
	return data, nil
}

// findStart finds where the log starts: the last good header says, and any start batch after
// it. Segments before the start were released and may still be there (a crash while they were
// removed): they are not read, and the log removes them.
func (o *opener) findStart() error {
	o.start = o.segs[0] // if no header is good, nothing says otherwise
	for i := len(o.segs) - 1; i >= 0; i-- {
		n := o.segs[i]
		data, err := o.load(n)
		if err != nil {
			return err
		}
		h, err := parseHeader(data, n)
		if errors.Is(err, ErrVersion) {
			return err
		}
		if err != nil {
			continue
		}
		o.start, o.startFirst, o.startKnown = h.start, h.startFirst, true
		for off := int64(headerSize); ; {
			b, ok := batchAt(data, off, n)
			if !ok {
				break
			}
			if b.kind == batchStart && b.start > o.start {
				o.start, o.startFirst = b.start, b.startFirst
			}
			off = b.next
		}
		break
	}
	o.next, o.nextKnown = o.startFirst, o.startKnown
	for n := range o.data {
		if n < o.start {
			delete(o.data, n)
		}
	}
	return nil
}

// read reads the segments from the start to the last, handing their records to replay.
func (o *opener) read() error {
	o.cutAt = map[uint64]cutPlan{}
	i, _ := slices.BinarySearch(o.segs, o.start)
	want := o.start // the next segment the log needs
	for _, at := range o.l.opts.ResumeAt {
		if o.resumable(at) {
			i, _ = slices.BinarySearch(o.segs, at.Seg)
			want, o.next, o.nextKnown, o.rec.Resumed, o.rec.ResumedAt = at.Seg, at.Record, true, true, at
			if o.l.opts.OnResume != nil {
				o.l.opts.OnResume(at)
			}
			break
		}
	}
	for _, n := range o.segs[i:] {
		if n > want {
			if err := o.missing(want, n-1); err != nil {
				return err
			}
			o.gaps = append(o.gaps, gap{want, n - 1}) // skipped: Scan skips them too
		}
		if err := o.segment(n); err != nil {
			return err
		}
		o.rec.Segments++
		if n+1 < o.last {
			delete(o.data, n) // the last two are needed to the end
		}
		want = n + 1
	}
	if want <= o.start { // the start is past the last segment
		return o.missing(o.start, o.start)
	}
	return nil
}

// resumable reports whether Open may resume at m: its segment is in the log, between the start
// and the last, numbered from m's record, and every segment from the start to it is there with
// a good header (which it reads, and nothing more, for the numbers of their first records,
// unless m knows them: then it reads only the mark's segment).
func (o *opener) resumable(m Mark) bool {
	if m.Seg == 0 || m.Seg > o.last || m.Seg < o.start || !o.present[m.Seg] {
		return false
	}
	if h, err := readHeader(o.l.fs, m.Seg); err != nil || h.first != m.Record {
		return false
	}
	known := m.Start <= o.start && uint64(len(m.Firsts)) == m.Seg-m.Start
	firsts := make(map[uint64]uint64, m.Seg-o.start)
	for n := o.start; n < m.Seg; n++ {
		if !o.present[n] {
			return false
		}
		if known {
			firsts[n] = m.Firsts[n-m.Start]
			continue
		}
		h, err := readHeader(o.l.fs, n)
		if err != nil {
			return false
		}
		firsts[n] = h.first
	}
	maps.Copy(o.l.segFirst, firsts)
	return true
}

// readHeader reads segment n's header, and nothing else of it.
func readHeader(fs FS, n uint64) (header, error) {
	f, err := fs.Open(segmentName(n))
	if err != nil {
		return header{}, err
	}
	defer f.Close()
	b := make([]byte, headerSize)
	if k, err := f.ReadAt(b, 0); k != headerSize {
		return header{}, fmt.Errorf("wal: read %s: %w", segmentName(n), err)
	}
	return parseHeader(b, n)
}

// missing handles segments from to to, absent between the start and the last.
func (o *opener) missing(from, to uint64) error {
	what := segmentName(from) + " is missing"
	if to > from {
		what = fmt.Sprintf("segments %s to %s are missing", segmentName(from), segmentName(to))
	}
	if !o.l.opts.Salvage {
		return fmt.Errorf("wal: %s: the log starts at %s and its last segment is %s: %w", what, segmentName(o.start), segmentName(o.last), ErrCorrupt)
	}
	o.skip(&Damage{File: segmentName(from), Missing: true, Reason: what}, -1)
	return nil
}

// skip records a stretch Salvage skipped, which held records records, or an unknown number
// (-1), counted at the next record read if it can be.
func (o *opener) skip(d *Damage, records int) {
	d.Records = records
	if records < 0 {
		o.pending = append(o.pending, d)
	}
	o.found = append(o.found, d)
	if o.l.opts.OnSkip != nil {
		o.l.opts.OnSkip(*d)
	}
}

// learn notes that the next record read is number rn: the stretches dropped since the last
// record read held the records before it. With none dropped, the numbers must follow on.
func (o *opener) learn(rn uint64, where string) error {
	unsealed := o.unsealed
	o.unsealed = nil
	switch {
	case unsealed != nil && len(o.pending) == 0:
		// The records after the end of an unsealed segment a crash left were never synced.
		if o.nextKnown && rn > o.next {
			unsealed.Records = int(rn - o.next)
			o.cuts = append(o.cuts, unsealed)
		}
	case len(o.pending) > 0:
		if len(o.pending) == 1 && o.nextKnown && rn >= o.next {
			o.pending[0].Records = int(rn - o.next)
		}
		o.pending = o.pending[:0]
	case o.nextKnown && rn != o.next:
		if !o.l.opts.Salvage {
			return fmt.Errorf("wal: %s: the record after number %d is number %d: %w", where, int64(o.next)-1, rn, ErrCorrupt)
		}
		// A skipped stretch whose records were not counted: the numbers say how many.
		records := 0
		if rn > o.next {
			records = int(rn - o.next)
		}
		o.skip(&Damage{File: where, Reason: "records missing"}, records)
	}
	o.next, o.nextKnown = rn, true
	return nil
}

// segment reads segment n.
func (o *opener) segment(n uint64) error {
	data, err := o.load(n)
	if err != nil {
		return err
	}
	name, size := segmentName(n), int64(len(data))
	salvage := o.l.opts.Salvage
	// A segment may end torn if it is the last, or the one before a last one that holds no
	// batch (the move to the last was under way: Log.rotate).
	tornEnd := n == o.last
	var synced int64 // bytes of it known durable, from the next segment's header
	if n+1 == o.last {
		next, err := o.load(o.last)
		if err != nil {
			return err
		}
		tornEnd = !anyBatch(next, o.last)
		if h, err := parseHeader(next, o.last); err == nil {
			synced = h.prevSynced
		}
	}

	h, err := parseHeader(data, n)
	if errors.Is(err, ErrVersion) {
		return err
	}
	firstKnown := o.nextKnown && len(o.pending) == 0
	first := o.next
	if err == nil {
		if err := o.learn(h.first, name); err != nil {
			return err
		}
		first, firstKnown = h.first, true
	} else {
		if tornEnd && max(synced, marksAfter(data, 0, n)) == 0 {
			// Nothing of it was synced (a sync covers its header): a power loss tore it, or
			// it was created and never written past its header. It starts again empty.
			o.cut(n, 0, data, "torn segment header")
			return nil
		}
		if !salvage {
			return fmt.Errorf("wal: %s offset 0: bad segment header: %w", name, ErrCorrupt)
		}
		o.skip(&Damage{File: name, Bytes: min(size, headerSize), Reason: "bad segment header"}, 0)
		o.extend = o.extend || n == o.last // appends go to a segment with a good header
	}
	if firstKnown {
		o.l.segFirst[n] = first
	}

	off, sealed := int64(headerSize), false
	var marks int64
	var tail *Damage // a stretch skipped up to the segment's end
	for off < size {
		b, ok := batchAt(data, off, n)
		if ok && !sealed {
			if firstKnown {
				if err := o.learn(first+b.index, name); err != nil {
					return err
				}
			} else {
				o.pending, o.nextKnown = o.pending[:0], false // uncounted: where it starts is unknown
			}
			for recs := b.body; len(recs) > 0; {
				r, rest, _ := nextRecord(recs)
				if err := o.replay(n, r); err != nil {
					return err
				}
				o.rec.Records++
				recs = rest
			}
			o.next += uint64(b.n)
			marks = max(marks, b.synced)
			sealed = b.kind == batchSeal
			off = b.next
			continue
		}
		if sealed {
			if !salvage {
				return fmt.Errorf("wal: %s offset %d: bytes after the segment's seal: %w", name, off, ErrCorrupt)
			}
			o.skip(&Damage{File: name, Offset: off, Bytes: size - off, Reason: "bytes after the seal"}, 0)
			break
		}
		if tornEnd && off >= max(synced, marksAfter(data, off, n)) {
			o.cut(n, off, data, "torn end")
			return nil
		}
		if !salvage {
			why := "bad batch"
			if tornEnd {
				why = "bad batch before bytes that were synced"
			}
			return fmt.Errorf("wal: %s offset %d: %s: %w", name, off, why, ErrCorrupt)
		}
		skip := nextGood(data, off+1, n)
		tail = &Damage{File: name, Offset: off, Bytes: skip - off, Reason: "bad batch"}
		o.skip(tail, -1)
		off = skip
		if skip < size {
			tail = nil
		}
	}
	// endMissing records that the segment's end is gone: with the stretch skipped up to it, if
	// any, so that the records of both are counted together.
	endMissing := func() {
		if tail != nil {
			tail.Reason += ", then the end of the segment is missing"
			return
		}
		o.skip(&Damage{File: name, Offset: size, Bytes: max(synced-size, 0), Reason: "end of segment missing"}, -1)
	}
	switch {
	case tornEnd && size < synced:
		// Synced bytes are gone: the segment was cut short after the log moved past it.
		if !salvage {
			return fmt.Errorf("wal: %s offset %d: the segment ends, but %d bytes of it were synced: %w", name, size, synced, ErrCorrupt)
		}
		endMissing()
	case !tornEnd && !sealed:
		if !salvage {
			return fmt.Errorf("wal: %s offset %d: the segment ends without its seal, and the log goes on: %w", name, size, ErrCorrupt)
		}
		endMissing()
	case n == o.last && sealed:
		// Sealed: the log went on to the next segment, which is gone.
		next := segmentName(n + 1)
		if !salvage {
			return fmt.Errorf("wal: %s is missing: %s is sealed, so the log went on to it: %w", next, name, ErrCorrupt)
		}
		o.skip(&Damage{File: next, Missing: true, Reason: "last segment missing"}, -1)
		o.extend = true
	}
	if tornEnd && n+1 == o.last && !sealed {
		// A crash came while the log moved to the last segment: the move is finished. What it
		// wrote to this segment and did not sync may be gone: the last segment's header counts
		// the records (learn).
		o.seal, o.sealNext = n, o.next
		o.unsealed = &Damage{File: name, Offset: size, Records: -1, Reason: "torn end"}
	}
	if n == o.last {
		o.lastMarks = marks
	}
	if !sealed {
		o.ends = append(o.ends, n)
	}
	return nil
}

// unsealedBefore returns the segments before segment cur, the one appended to, that stay
// without a seal: Salvage took them so (their end is missing, or the last one's header was
// bad, so appends go to a new one). A segment whose seal a crash kept from being written is
// sealed by repair.
func (o *opener) unsealedBefore(cur uint64) map[uint64]bool {
	var m map[uint64]bool
	for _, n := range o.ends {
		if n < cur && n != o.seal {
			if m == nil {
				m = map[uint64]bool{}
			}
			m[n] = true
		}
	}
	return m
}

// cut plans to cut segment n at off, where a torn end begins.
func (o *opener) cut(n uint64, off int64, data []byte, why string) {
	good := 0
	for at := nextGood(data, max(off+1, headerSize), n); at < int64(len(data)); at = nextGood(data, at+1, n) {
		good++
	}
	d := &Damage{File: segmentName(n), Offset: off, Bytes: int64(len(data)) - off, Records: -1, GoodAfter: good, Reason: why}
	o.cuts = append(o.cuts, d)
	plan := cutPlan{off: off}
	if off < headerSize {
		// Numbered from what is kept before it (0 if that is not known: counts are lost then).
		plan.h = header{seg: n, start: o.start, startFirst: o.startFirst}
		if o.nextKnown {
			plan.h.first = o.next
		}
		o.l.segFirst[n] = plan.h.first
	}
	o.cutAt[n] = plan
	if n < o.last {
		o.pending = append(o.pending, d) // the last segment's header counts its records
		o.seal, o.sealNext = n, o.next
	}
}

// anyBatch reports whether segment seg's data holds a good batch anywhere.
func anyBatch(data []byte, seg uint64) bool {
	return nextGood(data, headerSize, seg) < int64(len(data))
}

// nextGood returns the offset of the first good batch at or after off, or the data's length.
func nextGood(data []byte, off int64, seg uint64) int64 {
	for ; off+frameSize <= int64(len(data)); off++ {
		if _, ok := batchAt(data, off, seg); ok {
			return off
		}
	}
	return int64(len(data))
}

// marksAfter returns the most bytes of segment seg that a good batch after off says were
// synced: damage before that is not a torn write.
func marksAfter(data []byte, off int64, seg uint64) int64 {
	var synced int64
	for at := nextGood(data, off+1, seg); at < int64(len(data)); at = nextGood(data, at+1, seg) {
		b, _ := batchAt(data, at, seg)
		synced = max(synced, b.synced)
	}
	return synced
}

// repair writes what read found to write, now that the log opens, each step synced and in an
// order that a crash at any point leaves a log that opens: the cuts; the segment before the
// last synced, if a crash left it unsealed; the last segment written again with only its
// header if it holds no batch (numbered from where the one before now ends, and saying that
// one is durable); that seal; the segment after the last if Salvage needs one. Then the last
// segment is the one appended to.
func (o *opener) repair() error {
	l, fs := o.l, o.l.fs
	if o.seal != 0 {
		// The last segment holds no batch: the log goes on from what is kept before it.
		o.next = o.sealNext
	}
	for n, c := range o.cutAt {
		var err error
		if c.off < headerSize {
			err = rewrite(fs, c.h)
		} else {
			err = truncate(fs, n, c.off)
		}
		if err != nil {
			return err
		}
	}
	cur := o.last
	lastCut, cutLast := o.cutAt[cur]
	if o.seal != 0 {
		if _, cut := o.cutAt[o.seal]; !cut {
			if err := syncSegment(fs, o.seal); err != nil {
				return err
			}
		}
		if !cutLast || lastCut.off >= headerSize {
			h := header{seg: cur, first: o.next, start: o.start, startFirst: o.startFirst, prevSynced: o.size(o.seal)}
			if err := rewrite(fs, h); err != nil {
				return err
			}
			l.segFirst[cur], cutLast = o.next, true
		}
		if err := o.sealSegment(o.seal); err != nil {
			return err
		}
	}
	if o.extend {
		cur++
		h := header{seg: cur, first: o.next, start: o.start, startFirst: o.startFirst, prevSynced: o.size(o.last)}
		if err := l.startSegment(h); err != nil {
			return err
		}
		l.segFirst[cur] = o.next
		l.syncedTo = pos{cur, 0}
	} else {
		f, err := fs.Open(segmentName(cur))
		if err != nil {
			return err
		}
		size, err := f.Size()
		if err != nil {
			f.Close()
			return err
		}
		// Its tail may be unsynced (a crash of the last life): it is synced before the log
		// moves past it, as every segment is.
		l.file, l.fileSeg, l.fileOff, l.dirty = f, cur, size, true
		l.cur, l.curAt = f, pos{cur, size}
		l.syncedTo = pos{cur, o.lastMarks}
		if cutLast {
			l.syncedTo.off = size // written and synced since
		}
	}
	l.fileFirst = l.segFirst[cur]
	l.fileRecords = 0
	if o.next > l.fileFirst {
		l.fileRecords = o.next - l.fileFirst
	}
	l.lastSeg, l.segBytes, l.writtenSeg = l.fileSeg, l.fileOff, l.fileSeg
	marked := o.start
	if !o.startKnown {
		marked = 0 // nothing durable says where the log starts: the next removal says it
	}
	l.setStart(o.start, marked, o.segs[0])
	return nil
}

// size returns segment n's size after its cut.
func (o *opener) size(n uint64) int64 {
	if c, ok := o.cutAt[n]; ok {
		return max(c.off, headerSize)
	}
	return int64(len(o.data[n]))
}

// sealSegment appends a seal to segment n, synced before and after (so that it says the truth:
// everything before it is durable).
func (o *opener) sealSegment(n uint64) error {
	size := o.size(n)
	f, err := o.l.fs.Open(segmentName(n))
	if err != nil {
		return err
	}
	defer f.Close()
	var records uint64
	if first := o.l.segFirst[n]; o.next > first {
		records = o.next - first
	}
	if _, err := f.Write(frame(sealBatch(), batchSeal, n, size, size, records)); err != nil {
		return err
	}
	return f.Sync()
}

// syncSegment syncs segment n.
func syncSegment(fs FS, n uint64) error {
	f, err := fs.Open(segmentName(n))
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// truncate cuts segment n to size bytes, synced.
func truncate(fs FS, n uint64, size int64) error {
	f, err := fs.Open(segmentName(n))
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return err
	}
	return f.Sync()
}

// rewrite writes segment h.seg again with only its header h, synced.
func rewrite(fs FS, h header) error {
	f, err := fs.Open(segmentName(h.seg))
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.Write(h.encode()); err != nil {
		return err
	}
	return f.Sync()
}

package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	iofs "io/fs"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Errors. Each works with errors.Is.
var (
	// ErrCorrupt is wrapped by the error of Open when a segment is damaged other than by a
	// torn write at its end; the error names the file and the offset.
	ErrCorrupt = errors.New("wal: corrupt log")
	// ErrFailed is wrapped, with the first I/O error, by every call once a write or a sync
	// failed: what reached the file is unknown, so the log takes nothing more.
	ErrFailed = errors.New("wal: log failed")
	// ErrLocked is returned by LockDir when another log holds the directory.
	ErrLocked = errors.New("wal: directory in use by another log")
	// ErrClosed is returned by calls after Close.
	ErrClosed = errors.New("wal: log closed")
)

// SyncMode says when the log syncs what it wrote (see Options.Sync).
type SyncMode uint8

const (
	// SyncAlways syncs every batch before its waiters return: concurrent writers share a
	// batch and one sync (group commit).
	SyncAlways SyncMode = iota
	// SyncInterval syncs at most Options.Interval after a write.
	SyncInterval
	// SyncNever leaves syncing to the operating system, and to Close.
	SyncNever
)

func (m SyncMode) String() string {
	switch m {
	case SyncAlways:
		return "always"
	case SyncInterval:
		return "interval"
	case SyncNever:
		return "never"
	}
	return "unknown"
}

// Options configure a Log.
type Options struct {
	Sync     SyncMode
	Interval time.Duration // SyncInterval's bound; default 100 ms
	// FlushDelay bounds how long records nobody waits for stay in the log's buffer before
	// they are written (and synced, under SyncAlways); default 1 ms. It is the window in
	// which such a record (an acknowledgement) can be lost by a process crash.
	FlushDelay time.Duration
	// SegmentSize is the size past which the log starts a new segment; default 512 KiB.
	SegmentSize int64
	// Salvage makes Open skip damaged batches instead of failing, reporting what it skipped.
	Salvage bool
}

// SegmentSize returns the size past which the log starts a new segment.
func (l *Log) SegmentSize() int64 { return l.opts.SegmentSize }

// LSN is a position in the log: the number of record bytes appended before it since Open.
// It orders appends; it is not a file offset.
type LSN uint64

// Recovery is what Open found.
type Recovery struct {
	Segments int // segments read
	Records  int // records handed to replay
	// Truncated is set when the last segment was cut at a bad batch (see Open).
	Truncated *Damage
	// Skipped are the damaged stretches Salvage skipped.
	Skipped []Damage
	// Last is the segment appends go to: the last one read, or the first, created.
	Last uint64
}

// Damage is a damaged stretch of a segment.
type Damage struct {
	File   string
	Offset int64 // where it starts
	Bytes  int64 // how long it is
	// GoodAfter counts the good batches a cut at the end of the last segment dropped because
	// they came after the damage: after a power loss, unsynced writes reach the disk in any
	// order, so a hole may precede batches that landed (see Open).
	GoodAfter int
}

const (
	headerSize = 16 // segment header: magic (8 bytes), segment number (8)
	frameSize  = 8  // batch frame: length (4), checksum (4)
	magic      = "WARRENW1"
	suffix     = ".wal"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Log is a segmented, append-only log of records. It is safe for concurrent use.
//
// Append copies records into the log's buffer under the log's own lock, a leaf: a caller may
// hold its own locks, and the log's order is the order of the Append calls. Wait returns once
// the records before a position are written to the operating system (and synced, under
// SyncAlways); the first waiter to find no write in progress writes everything buffered as one
// batch per segment, so concurrent writers share writes and syncs.
type Log struct {
	fs   FS
	opts Options

	mu       sync.Mutex
	cond     sync.Cond // on mu: written or synced advanced, or the log failed
	pending  []chunk   // appended, not yet taken by a writer, in order
	spare    [][]byte  // emptied chunk buffers, for reuse
	appended LSN
	written  LSN
	// writtenNow is written, for waiters that read it without mu: it is stored under mu with
	// written, and only grows.
	writtenNow atomic.Uint64
	synced     LSN
	segBytes   int64  // bytes in the last segment, pending included
	lastSeg    uint64 // the segment appends go to
	writing    bool   // a writer owns the files
	// unsynced says the current segment was written since it was last synced, as far as the
	// syncer is concerned; syncing, that the syncer's fsync is in flight (syncBeside).
	unsynced, syncing bool
	err               error          // the log failed: ErrFailed wrapping the first I/O error; or ErrClosed
	release           uint64         // segments before it may be removed (ReleaseBelow)
	releasedAt        LSN            // appended when release last grew: what replaced the released records is before it
	first             uint64         // the first segment not removed
	writtenSeg        uint64         // the segment the writer last wrote to; those before it were synced whole
	removing          bool           // removeBeside's I/O is in flight
	syncer            background     // SyncInterval: syncs what was written
	flusher           background     // writes what nobody waits for, after FlushDelay
	remover           background     // removes released segments, after FlushDelay
	timers            sync.WaitGroup // the background timers' callbacks in flight

	// Owned by the writer.
	file    File   // the segment being appended to
	fileSeg uint64 // its number
	fileOff int64  // its size
	dirty   bool   // written since the last sync

}

// chunk is records appended for one segment, behind a reserved frame.
type chunk struct {
	seg uint64
	buf []byte // frameSize reserved bytes, then the records
	end LSN    // the position after its last record
}

// Open opens the log in fs, creating it if it is empty, and hands every record it holds to
// replay, in order, with the number of the segment it is in; rec is valid only during the call.
// An error from replay stops Open and is returned.
//
// The last segment is cut at its first bad batch, and the cut is reported in the Recovery: a
// crash tore the write in progress, or, after a power loss, left unsynced writes on the disk in
// any order, so a hole may come before batches that landed (Damage.GoodAfter counts them). None
// of that was synced, since a sync covers everything before it; so the cut loses nothing
// SyncAlways confirmed. (Damage to synced bytes of the last segment looks the same, and is
// treated the same: reported, not refused.) Every other segment was synced whole when the log
// moved past it, so damage there is corruption: Open fails with an error wrapping ErrCorrupt that
// names the file and the offset, unless Options.Salvage, which skips the damaged batch.
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
	l := &Log{fs: fs, opts: opts}
	l.cond.L = &l.mu
	var rec Recovery
	names, err := fs.List()
	if err != nil {
		return nil, rec, err
	}
	var segs []uint64
	for _, name := range names {
		if n, ok := segmentNumber(name); ok {
			segs = append(segs, n)
		}
	}
	for i, n := range segs {
		last := i == len(segs)-1
		if err := l.recover(n, last, &rec, replay); err != nil {
			return nil, rec, err
		}
		rec.Segments++
	}
	if len(segs) == 0 {
		if err := l.startSegment(1); err != nil {
			return nil, rec, err
		}
	} else {
		n := segs[len(segs)-1]
		f, err := fs.Open(segmentName(n))
		if err != nil {
			return nil, rec, err
		}
		size, err := f.Size()
		if err != nil {
			f.Close()
			return nil, rec, err
		}
		// Its tail may be unsynced (a crash of the last life): it is synced before the log
		// moves past it, as every segment is.
		l.file, l.fileSeg, l.fileOff, l.dirty = f, n, size, true
	}
	l.lastSeg, l.segBytes = l.fileSeg, l.fileOff
	l.writtenSeg = l.fileSeg
	rec.Last = l.fileSeg
	l.first = l.fileSeg
	if len(segs) > 0 {
		l.first = segs[0]
	}
	return l, rec, nil
}

// segmentName is the file name of segment n.
func segmentName(n uint64) string { return fmt.Sprintf("%016x%s", n, suffix) }

// segmentNumber parses a segment's file name.
func segmentNumber(name string) (uint64, bool) {
	hex, ok := strings.CutSuffix(name, suffix)
	if !ok || len(hex) != 16 {
		return 0, false
	}
	n, err := strconv.ParseUint(hex, 16, 64)
	return n, err == nil && n > 0
}

// recover reads segment n, handing its records to replay; last says whether it is the last
// segment, whose torn tail is cut off.
func (l *Log) recover(n uint64, last bool, rec *Recovery, replay func(uint64, []byte) error) error {
	name := segmentName(n)
	f, err := l.fs.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return err
	}
	data := make([]byte, size)
	if n, err := f.ReadAt(data, 0); int64(n) != size {
		return fmt.Errorf("wal: read %s: %w", name, err)
	}
	if len(data) < headerSize || string(data[:8]) != magic || binary.LittleEndian.Uint64(data[8:16]) != n {
		if last {
			// Nothing of it was synced (a sync covers its header): a power loss tore it, or
			// it was created and never written past its header. It starts again empty.
			return l.cut(f, name, 0, size, rec, n, goodAfter(data, headerSize-1, n))
		}
		return fmt.Errorf("wal: %s offset 0: bad segment header: %w", name, ErrCorrupt)
	}
	off := int64(headerSize)
	for off < size {
		recs, next, ok := batchAt(data, off, n)
		if ok {
			for len(recs) > 0 {
				r, rest, ok := nextRecord(recs)
				if !ok {
					return fmt.Errorf("wal: %s offset %d: bad record in a good batch: %w", name, off, ErrCorrupt)
				}
				if err := replay(n, r); err != nil {
					return err
				}
				rec.Records++
				recs = rest
			}
			off = next
			continue
		}
		if last {
			return l.cut(f, name, off, size, rec, n, goodAfter(data, off, n))
		}
		if !l.opts.Salvage {
			return fmt.Errorf("wal: %s offset %d: bad batch: %w", name, off, ErrCorrupt)
		}
		skip := off + 1
		for skip < size {
			if _, _, ok := batchAt(data, skip, n); ok {
				break
			}
			skip++
		}
		rec.Skipped = append(rec.Skipped, Damage{File: name, Offset: off, Bytes: skip - off})
		off = skip
	}
	return nil
}

// cut truncates the last segment at off, where a torn write begins.
func (l *Log) cut(f File, name string, off, size int64, rec *Recovery, n uint64, goodAfter int) error {
	if off < headerSize {
		// Nothing of it is usable: it is written again with a header.
		if err := f.Truncate(0); err != nil {
			return err
		}
		if _, err := f.Write(segmentHeader(n)); err != nil {
			return err
		}
		rec.Truncated = &Damage{File: name, Offset: 0, Bytes: size, GoodAfter: goodAfter}
		return f.Sync()
	}
	if err := f.Truncate(off); err != nil {
		return err
	}
	rec.Truncated = &Damage{File: name, Offset: off, Bytes: size - off, GoodAfter: goodAfter}
	return f.Sync()
}

// batchAt checks the batch at off in a segment's data, and returns its records and where the
// next batch starts.
func batchAt(data []byte, off int64, seg uint64) (recs []byte, next int64, ok bool) {
	if int64(len(data))-off < frameSize {
		return nil, 0, false
	}
	n := int64(binary.LittleEndian.Uint32(data[off:]))
	sum := binary.LittleEndian.Uint32(data[off+4:])
	end := off + frameSize + n
	if n == 0 || end > int64(len(data)) {
		return nil, 0, false
	}
	recs = data[off+frameSize : end]
	if checksum(seg, off, recs) != sum {
		return nil, 0, false
	}
	return recs, end, true
}

// goodAfter counts the good batches after the bad one at off.
func goodAfter(data []byte, off int64, seg uint64) int {
	n := 0
	for at := off + 1; at+frameSize <= int64(len(data)); at++ {
		if _, next, ok := batchAt(data, at, seg); ok {
			n++
			at = next - 1
		}
	}
	return n
}

// checksum is the CRC-32C of a batch's records, seeded with its segment and offset, so that a
// batch found elsewhere than where it was written fails its check.
func checksum(seg uint64, off int64, recs []byte) uint32 {
	var seed [16]byte
	binary.LittleEndian.PutUint64(seed[:8], seg)
	binary.LittleEndian.PutUint64(seed[8:], uint64(off))
	return crc32.Update(crc32Seed(&seed), castagnoli, recs)
}

// crc32Seed is the CRC-32C of a batch's seed, computed here byte by byte from the table so that
// the seed stays on the stack (crc32.Checksum would move it to the heap, once per batch).
func crc32Seed(seed *[16]byte) uint32 {
	crc := ^uint32(0)
	for _, b := range seed {
		crc = castagnoli[byte(crc)^b] ^ crc>>8
	}
	return ^crc
}

// nextRecord splits the first record off a batch's records.
func nextRecord(b []byte) (rec, rest []byte, ok bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil, nil, false
	}
	return b[k : k+int(n)], b[k+int(n):], true
}

func segmentHeader(n uint64) []byte {
	h := make([]byte, headerSize)
	copy(h, magic)
	binary.LittleEndian.PutUint64(h[8:], n)
	return h
}

// startSegment creates segment n and makes it the one written to. Only the writer, or Open,
// calls it.
func (l *Log) startSegment(n uint64) error {
	f, err := l.fs.Create(segmentName(n))
	if err != nil {
		return err
	}
	if _, err := f.Write(segmentHeader(n)); err != nil {
		f.Close()
		return err
	}
	if err := l.fs.SyncDir(); err != nil {
		f.Close()
		return err
	}
	l.file, l.fileSeg, l.fileOff, l.dirty = f, n, headerSize, true
	return nil
}

// Append copies recs into the log, and returns the position after them and the segment they go
// to. They are written once someone Waits for a position at or after it.
func (l *Log) Append(recs ...[]byte) (LSN, uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return 0, 0, l.err
	}
	var size int64
	for _, r := range recs {
		size += int64(uvarintLen(uint64(len(r))) + len(r))
	}
	if l.segBytes > headerSize && l.segBytes+frameSize+size > l.opts.SegmentSize {
		l.lastSeg++ // a new segment, started by the writer when it gets there
		l.segBytes = headerSize
	}
	if len(l.pending) == 0 || l.pending[len(l.pending)-1].seg != l.lastSeg {
		l.pending = append(l.pending, chunk{seg: l.lastSeg, buf: l.newBuffer()})
		l.segBytes += frameSize
	}
	c := &l.pending[len(l.pending)-1]
	for _, r := range recs {
		c.buf = binary.AppendUvarint(c.buf, uint64(len(r)))
		c.buf = append(c.buf, r...)
	}
	l.segBytes += size
	l.appended += LSN(size)
	c.end = l.appended
	l.arm(&l.flusher, l.opts.FlushDelay, (*Log).flushTick)
	return l.appended, l.lastSeg, nil
}

// uvarintLen returns the length of x's uvarint encoding.
func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// newBuffer returns an empty chunk buffer with its frame reserved.
func (l *Log) newBuffer() []byte {
	if n := len(l.spare); n > 0 {
		b := l.spare[n-1]
		l.spare = l.spare[:n-1]
		return b[:frameSize]
	}
	return make([]byte, frameSize, 4096)
}

// Wait returns once everything appended before lsn is written (and synced, under SyncAlways),
// or the error that prevents it.
func (l *Log) Wait(lsn LSN) error { return l.await(lsn, l.opts.Sync == SyncAlways) }

// WaitWritten returns once everything before lsn (0: everything appended so far) is written,
// synced or not: safe from a crash of the process, not from a power loss.
func (l *Log) WaitWritten(lsn LSN) error { return l.await(lsn, false) }

// Sync writes and syncs everything appended so far, and removes the segments released so far.
func (l *Log) Sync() error { return l.await(0, true) }

// await returns once everything before lsn (0: everything appended) is written, and synced if
// sync, writing it if nobody is.
func (l *Log) await(lsn LSN, sync bool) error {
	if !sync && lsn != 0 && LSN(l.writtenNow.Load()) >= lsn {
		return nil // the common case of a streaming publisher's confirm: no lock
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	all := lsn == 0
	if all {
		lsn = l.appended
	}
	for {
		switch {
		case sync && l.synced >= lsn && !(all && l.releasing()), !sync && l.written >= lsn:
			return nil // before the error: what was written before a failure, or Close, was
		case l.err != nil:
			return l.err
		case !l.writing && !(sync && l.synced >= lsn):
			l.writeLocked(sync)
		case !l.writing && !l.removing:
			l.removeBeside() // Sync: what was released goes too
		default:
			l.cond.Wait()
		}
	}
}

// writeLocked writes everything pending, and syncs it if sync; it releases mu during the I/O.
func (l *Log) writeLocked(sync bool) {
	l.writing = true
	chunks := l.pending
	l.pending = nil
	end := l.appended
	l.mu.Unlock()
	err := l.write(chunks)
	if err == nil && sync {
		err = l.syncFile()
	}
	l.mu.Lock()
	l.writtenSeg = l.fileSeg
	l.writing = false
	if err == nil && len(chunks) > 0 {
		l.unsynced = !sync
	}
	for _, c := range chunks {
		if cap(c.buf) <= 1<<20 {
			l.spare = append(l.spare, c.buf)
		}
	}
	if l.pending == nil {
		clear(chunks)
		l.pending = chunks[:0] // the next appends reuse it
	}
	switch {
	case err != nil:
		if l.err == nil {
			l.err = fmt.Errorf("%w: %w", ErrFailed, err)
		}
	default:
		l.written = end
		l.writtenNow.Store(uint64(end))
		if sync {
			l.synced = end
		} else if l.opts.Sync == SyncInterval {
			l.arm(&l.syncer, l.opts.Interval, (*Log).syncTick)
		}
	}
	l.cond.Broadcast()
}

// write writes chunks, each as one batch, starting segments as they come. Only the writer
// calls it, with mu released.
func (l *Log) write(chunks []chunk) error {
	for _, c := range chunks {
		if len(c.buf) == frameSize {
			continue
		}
		if c.seg != l.fileSeg {
			if err := l.rotate(c.seg); err != nil {
				return err
			}
		}
		recs := c.buf[frameSize:]
		binary.LittleEndian.PutUint32(c.buf, uint32(len(recs)))
		binary.LittleEndian.PutUint32(c.buf[4:], checksum(l.fileSeg, l.fileOff, recs))
		if _, err := l.file.Write(c.buf); err != nil {
			return err
		}
		l.fileOff += int64(len(c.buf))
		l.dirty = true
	}
	return nil
}

// rotate finishes the current segment, synced whatever the policy (once per segment: so that
// damage in any segment but the last is corruption, never a crash's doing), and starts segment
// n.
func (l *Log) rotate(n uint64) error {
	if err := l.syncFile(); err != nil {
		return err
	}
	if err := l.file.Close(); err != nil {
		return err
	}
	return l.startSegment(n)
}

// syncFile syncs the current segment if it was written since the last sync.
func (l *Log) syncFile() error {
	if !l.dirty {
		return nil
	}
	if err := l.file.Sync(); err != nil {
		return err
	}
	l.dirty = false
	return nil
}

// background is one of the log's timers: armed, it runs its work once after a delay.
type background struct {
	timer *time.Timer
	armed bool
}

// arm arms b to run fn after d, unless it is armed already. The caller holds mu. (fn is the
// log's flushTick or syncTick; callers pass it as a method expression, which allocates
// nothing, unlike a method value made per call.)
func (l *Log) arm(b *background, d time.Duration, fn func(*Log)) {
	if b.armed {
		return
	}
	b.armed = true
	l.timers.Add(1)
	if b.timer == nil {
		b.timer = time.AfterFunc(d, func() { fn(l) })
	} else {
		b.timer.Reset(d)
	}
}

// stop stops b for Close; the caller holds mu.
func (l *Log) stop(b *background) {
	if b.timer != nil && b.timer.Stop() && b.armed {
		l.timers.Done() // its callback will not run
	}
}

// syncTick is SyncInterval's timer: it syncs what was written, beside the writer.
func (l *Log) syncTick() { l.background(&l.syncer, true) }

// removeTick is the remover's timer: it removes released segments, beside the writer.
func (l *Log) removeTick() { l.background(&l.remover, false) }

// flushTick writes what was appended and nobody waited for.
func (l *Log) flushTick() { l.background(&l.flusher, l.opts.Sync == SyncAlways) }

// background runs b's work: it writes what is pending, and syncs if sync.
func (l *Log) background(b *background, sync bool) {
	defer l.timers.Done()
	l.mu.Lock()
	defer l.mu.Unlock()
	b.armed = false
	for l.writing && l.err == nil {
		l.cond.Wait()
	}
	switch {
	case l.err != nil:
	case b == &l.syncer:
		if len(l.pending) > 0 {
			l.writeLocked(false)
		}
		l.syncBeside()
	case b == &l.remover:
		if !l.removing {
			l.removeBeside()
		}
	case len(l.pending) > 0 || sync:
		l.writeLocked(sync)
	}
}

// syncBeside syncs the current segment without holding the writer's turn, so that writes (an
// acknowledgement's flush, a publish's) go on during the fsync, which on a slow disk can take
// tens of milliseconds. The caller holds mu, and no writer is active; mu is released during
// the fsync. A writer that rotates meanwhile syncs the segment itself before it closes it (and
// the fsync here then fails with fs.ErrClosed, or covers it anyway); one that must sync (under
// SyncAlways) syncs whatever this one does.
func (l *Log) syncBeside() {
	if !l.unsynced || l.syncing {
		return
	}
	f, end := l.file, l.written
	l.unsynced, l.syncing = false, true
	l.mu.Unlock()
	err := f.Sync()
	l.mu.Lock()
	l.syncing = false
	switch {
	case err == nil:
		l.synced = max(l.synced, end)
	case errors.Is(err, iofs.ErrClosed):
		l.unsynced = true // rotated or closed meanwhile: the next sync covers what is left
	case l.err == nil:
		l.err = fmt.Errorf("%w: %w", ErrFailed, err)
	}
	l.cond.Broadcast()
}

// ReleaseBelow says that nothing in the segments before segment n is needed any more: the
// log removes them (never the segment being appended to) within FlushDelay, beside the writer
// (removeBeside), or at the next Sync.
func (l *Log) ReleaseBelow(n uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return // failed or closed: no timer is armed any more
	}
	if n > l.release {
		l.release, l.releasedAt = n, l.appended
		l.arm(&l.remover, l.opts.FlushDelay, (*Log).removeTick)
	}
}

// releasing reports whether released segments wait to be removed. The caller holds mu.
func (l *Log) releasing() bool { return min(l.release, l.lastSeg) > l.first }

// removeBeside removes the released segments without holding the writer's turn, so that
// neither a publisher's confirm nor an acknowledgement's flush waits for the fsyncs a removal
// takes. The caller holds mu, no writer is active and no removal is in flight; mu is released
// during the I/O.
//
// What the log's user appended again before releasing the segments (the topology, moved
// messages: releasedAt) replaces their records, so it is written and synced before any
// removal: first written (by this goroutine, as the writer, if nobody has), then synced beside
// a writer as syncBeside does (a segment the writer rotates past meanwhile is synced by the
// rotation). Only segments before writtenSeg go: each was synced whole when the writer moved
// past it, and none is the one being written.
func (l *Log) removeBeside() {
	for l.err == nil && (l.writing || l.removing || l.written < l.releasedAt) {
		if l.writing || l.removing {
			l.cond.Wait()
		} else {
			l.writeLocked(false)
		}
	}
	first, below := l.first, min(l.release, l.writtenSeg)
	if l.err != nil || first >= below {
		return
	}
	l.removing = true
	f, need := l.file, l.synced < l.releasedAt
	l.mu.Unlock()
	var err error
	if need {
		if err = f.Sync(); errors.Is(err, iofs.ErrClosed) {
			err = nil // rotated (and synced) or closed meanwhile
		}
	}
	for ; err == nil && first < below; first++ {
		if err = l.fs.Remove(segmentName(first)); errors.Is(err, iofs.ErrNotExist) {
			err = nil
		}
	}
	if err == nil {
		err = l.fs.SyncDir()
	}
	l.mu.Lock()
	l.removing = false
	l.first = first
	if err != nil && l.err == nil {
		l.err = fmt.Errorf("%w: %w", ErrFailed, err)
	}
	l.cond.Broadcast()
}

// Close writes and syncs everything appended, and closes the log. It returns the error that
// kept it from doing so, if any. Later calls return ErrClosed.
func (l *Log) Close() error {
	err := l.Sync()
	l.mu.Lock()
	if errors.Is(l.err, ErrClosed) {
		l.mu.Unlock()
		return nil
	}
	for l.writing {
		l.cond.Wait()
	}
	l.stop(&l.syncer)
	l.stop(&l.flusher)
	l.stop(&l.remover)
	l.err = ErrClosed
	f := l.file
	l.file = nil
	l.mu.Unlock()
	l.timers.Wait()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

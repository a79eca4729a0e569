package wal

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	iofs "io/fs"
	"slices"
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
	// ErrFailed is wrapped, with the first I/O error, by every call once a sync failed, or a
	// write failed other than for want of space: what reached the disk is unknown (after a
	// failed fsync, Linux may have dropped the unsynced pages and reports the error once:
	// "fsyncgate"), so the log takes nothing more until it is opened again. A write that still
	// finds no space when the log is closing fails it too.
	ErrFailed = errors.New("wal: log failed")
	// ErrStalled is wrapped, with the write's error, by Err and Sync while the log is stalled: a
	// write failed for want of space (ENOSPC, EDQUOT, MemFS's ErrNoSpace), and the log keeps what
	// it could not write and tries again until a write succeeds (see Log).
	ErrStalled = errors.New("wal: log stalled: no space to write")
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
	// they are written (and then synced, under SyncAlways); default 1 ms. A record nobody
	// waits for (an acknowledgement) can be lost by a process crash for FlushDelay plus the
	// write(2) in progress, if any, after it was appended: the flush waits for no fsync, except
	// the ones a writer moving to a new segment makes (the finished segment's, the
	// directory's), once per SegmentSize.
	FlushDelay time.Duration
	// SegmentSize is the size past which the log starts a new segment; default 512 KiB.
	SegmentSize int64
	// Salvage makes Open skip damaged batches instead of failing, reporting what it skipped.
	Salvage bool
	// OnStall, if set, is called when the log stalls, with the error of the write that found
	// no space, and with nil when a write succeeds again. Calls are made in order, one at a
	// time, with no lock of the log held, on the goroutine whose write changed the state; it
	// must not call the log.
	OnStall func(err error)
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
// batch per segment, so concurrent writers share writes and syncs. The writer's turn covers
// its write(2) (and, when it moves to a new segment, the finished segment's fsync), not the
// fsync a waiter under SyncAlways needs: that one runs beside the writer (syncBeside), one at a
// time, so that a write waits for no fsync in flight, and a waiter whose records it does not
// cover waits for it and syncs again.
//
// A write that fails for want of space (ENOSPC, EDQUOT) stalls the log instead of failing it:
// the part of a batch that reached the file is cut off (the segment is truncated back to its
// last whole batch), the records not written are kept, in order, ahead of those appended since,
// and the log tries again after a backoff (10 ms, doubling to 1 s), until a write succeeds.
// Meanwhile Append still takes records (a caller that must not add to the log checks Err
// first), Wait and WaitWritten wait for the retry (or their ctx), Sync returns ErrStalled, and
// nothing else writes. A failed fsync, or another write error, fails the log instead (see
// ErrFailed). Closing ends a stall: it tries once more, and fails the log if the write still
// finds no space.
type Log struct {
	fs   FS
	opts Options

	mu       sync.Mutex
	cond     sync.Cond // on mu: written or synced advanced, a turn ended, the log stalled, resumed, failed or closed
	pending  []chunk   // appended, not yet written, in order (a stall's kept records first)
	spare    [][]byte  // emptied chunk buffers, for reuse
	appended LSN
	written  LSN
	// writtenNow is written, for waiters that read it without mu: it is stored under mu with
	// written, and only grows.
	writtenNow atomic.Uint64
	synced     LSN
	segBytes   int64  // bytes in the last segment, pending included
	lastSeg    uint64 // the segment appends go to
	writing    bool   // a writer owns the files (writeLocked)
	rotating   bool   // the writer is moving to a new segment: cur is about to be closed
	syncing    bool   // syncBeside's fsync is in flight
	cur        File   // the segment the last writer's turn ended in: what syncBeside syncs
	// stall is ErrStalled wrapping the error of the write that found no space, while the log
	// is stalled; backoff is the delay before the next retry (retrier).
	stall   error
	backoff time.Duration
	closing bool  // Closing was called: a write that finds no space fails the log
	closed  bool  // Close was called
	err     error // the log failed: ErrFailed wrapping the first I/O error
	// health is what Err returns: err, ErrClosed, stall or nil; stored under mu when they change.
	health     atomic.Pointer[error]
	release    uint64         // segments before it may be removed (ReleaseBelow)
	releasedAt LSN            // appended when release last grew: what replaced the released records is before it
	first      uint64         // the first segment not removed
	writtenSeg uint64         // the segment the writer last wrote to; those before it were synced whole
	removing   bool           // removeBeside's I/O is in flight
	syncer     background     // SyncInterval: syncs what was written
	flusher    background     // writes what nobody waits for, after FlushDelay (and syncs it, under SyncAlways)
	remover    background     // removes released segments, after FlushDelay
	retrier    background     // writes what a stall kept, after backoff
	timers     sync.WaitGroup // the background timers' callbacks in flight

	// OnStall's calls: notifyMu orders them; told is the state last told. Taken with no other
	// lock held; mu is taken under it.
	notifyMu sync.Mutex
	told     bool

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
// calls it. A segment whose header it could not write is removed again, so that the writer can
// start it again once there is space.
func (l *Log) startSegment(n uint64) error {
	name := segmentName(n)
	f, err := l.fs.Create(name)
	if err != nil {
		return err
	}
	if _, err := f.Write(segmentHeader(n)); err != nil {
		f.Close()
		if rerr := l.fs.Remove(name); rerr != nil {
			return fmt.Errorf("wal: remove %s, whose header failed (%v): %w", name, err, rerr)
		}
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
// to. They are written once someone Waits for a position at or after it, or within FlushDelay.
// A stalled log takes them too (they are written when it resumes); a failed or closed one
// returns its error.
func (l *Log) Append(recs ...[]byte) (LSN, uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.err != nil:
		return 0, 0, l.err
	case l.closed:
		return 0, 0, ErrClosed
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
	if l.stall == nil {
		l.arm(&l.flusher, l.opts.FlushDelay, (*Log).flushTick) // in a stall, the retrier writes it
	}
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
// or with the error that prevents it: the log's failure, ErrClosed, or ctx.Err() (unwrapped)
// once ctx ends first; the records are then still in the log, and may yet be written. It
// waits out a stall (see Log).
func (l *Log) Wait(ctx context.Context, lsn LSN) error {
	return l.await(ctx, lsn, l.opts.Sync == SyncAlways)
}

// WaitWritten is Wait without the sync: it returns once everything before lsn (0: everything
// appended so far) is written, synced or not: safe from a crash of the process, not from a
// power loss.
func (l *Log) WaitWritten(ctx context.Context, lsn LSN) error { return l.await(ctx, lsn, false) }

// await is Wait, and WaitWritten when not sync.
func (l *Log) await(ctx context.Context, lsn LSN, sync bool) error {
	if !sync && lsn != 0 && LSN(l.writtenNow.Load()) >= lsn {
		return nil // the common case of a streaming publisher's confirm: no lock
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if lsn == 0 {
		lsn = l.appended
	}
	return l.awaitLocked(ctx, lsn, sync, true)
}

// Sync writes and syncs everything appended so far, and removes the segments released so far.
// It does not wait out a stall: it returns an error wrapping ErrStalled.
func (l *Log) Sync() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.syncAllLocked()
}

// syncAllLocked is Sync; the caller holds mu.
func (l *Log) syncAllLocked() error {
	if err := l.awaitLocked(context.Background(), l.appended, true, false); err != nil {
		return err
	}
	for l.releasing() {
		switch {
		case l.err != nil:
			return l.err
		case l.closed:
			return ErrClosed
		case l.writing || l.removing:
			l.cond.Wait()
		default:
			first := l.first
			l.removeBeside()
			if l.first == first && !l.removing && l.err == nil {
				return nil // nothing more it may remove yet: the writer has not reached the segment
			}
		}
	}
	return nil
}

// awaitLocked returns once everything before lsn is written, and synced if sync, writing and
// syncing it itself when nobody is: a waiter that needs a sync leaves the write to after the
// sync in flight, whose waiters it joins, so that concurrent waiters share a write and a sync
// as before. While the log is stalled it waits for the retry if through, and returns the
// stall's error if not. It returns ctx.Err() once ctx ends first. The caller holds mu.
func (l *Log) awaitLocked(ctx context.Context, lsn LSN, sync, through bool) error {
	var stop func() bool // wakes this waiter when ctx ends, once it waits out a stall
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	for {
		switch {
		case sync && l.synced >= lsn, !sync && l.written >= lsn:
			return nil // before the error: what was written before a failure, or Close, was
		case l.err != nil:
			return l.err
		case l.closed:
			return ErrClosed
		case l.stall != nil && l.written < lsn && !through:
			return l.stall
		case ctx.Err() != nil:
			return ctx.Err()
		case l.written < lsn && l.stall == nil && !l.writing && !(sync && l.syncing):
			l.writeLocked()
		case sync && l.written >= lsn && !l.syncing && !l.rotating:
			l.syncBeside()
		default:
			if stop == nil && l.stall != nil && ctx.Done() != nil {
				stop = context.AfterFunc(ctx, l.wake)
			}
			l.cond.Wait()
		}
	}
}

// wake wakes every waiter, so that one whose ctx ended returns.
func (l *Log) wake() {
	l.mu.Lock()
	l.cond.Broadcast()
	l.mu.Unlock()
}

// writeLocked takes the writer's turn and writes everything pending, each segment's records as
// one batch; it releases mu during the I/O. The caller holds mu, and no writer is active. A
// write that fails for want of space stalls the log (keeping what it did not write); any other
// error fails it.
func (l *Log) writeLocked() {
	l.writing = true
	chunks, before, wasStalled := l.pending, l.written, l.stall != nil
	l.pending = nil
	l.rotating = len(chunks) > 0 && chunks[len(chunks)-1].seg != l.fileSeg
	l.mu.Unlock()
	done, rotated, err := l.write(chunks)
	l.mu.Lock()
	l.writing, l.rotating = false, false
	l.cur, l.writtenSeg = l.file, l.fileSeg
	if done > 0 {
		l.written = chunks[done-1].end
		l.writtenNow.Store(uint64(l.written))
	}
	if rotated >= 0 {
		// The rotation synced the segment it left, and every one before it was synced when
		// the writer left it: everything before the first chunk of the new segment is on
		// the disk.
		at := before
		if rotated > 0 {
			at = chunks[rotated-1].end
		}
		l.synced = max(l.synced, at)
	}
	for _, c := range chunks[:done] {
		if cap(c.buf) <= 1<<20 {
			l.spare = append(l.spare, c.buf)
		}
	}
	switch {
	case err == nil:
		l.stall, l.backoff = nil, 0
		if l.pending == nil {
			clear(chunks)
			l.pending = chunks[:0] // the next appends reuse it
		} else if wasStalled {
			l.arm(&l.flusher, l.opts.FlushDelay, (*Log).flushTick) // appended during the retry
		}
		if wasStalled && l.releasing() {
			l.arm(&l.remover, l.opts.FlushDelay, (*Log).removeTick) // it waited for this write
		}
		if l.opts.Sync == SyncInterval {
			l.arm(&l.syncer, l.opts.Interval, (*Log).syncTick)
		}
	case noSpace(err) && !l.closing:
		l.pending = append(slices.Clone(chunks[done:]), l.pending...)
		l.stallLocked(err)
	default:
		l.failLocked(err)
	}
	l.noteHealthLocked()
	l.cond.Broadcast()
	if wasStalled != (l.stall != nil) && l.opts.OnStall != nil {
		l.mu.Unlock()
		l.notify()
		l.mu.Lock()
	}
}

// failLocked fails the log with err, unless it failed before. The caller holds mu.
func (l *Log) failLocked(err error) {
	if l.err == nil {
		l.err = fmt.Errorf("%w: %w", ErrFailed, err)
	}
}

// write writes chunks, each as one batch, starting segments as they come. Only the writer
// calls it, with mu released. It returns how many chunks it wrote, the index of the chunk
// before which it last started a segment (-1 if it started none), and the error that stopped
// it.
func (l *Log) write(chunks []chunk) (done, rotated int, err error) {
	rotated = -1
	for i, c := range chunks {
		if len(c.buf) == frameSize {
			continue
		}
		if c.seg != l.fileSeg {
			if err := l.rotate(c.seg); err != nil {
				return i, rotated, err
			}
			rotated = i
		}
		recs := c.buf[frameSize:]
		binary.LittleEndian.PutUint32(c.buf, uint32(len(recs)))
		binary.LittleEndian.PutUint32(c.buf[4:], checksum(l.fileSeg, l.fileOff, recs))
		if n, err := l.file.Write(c.buf); err != nil {
			return i, rotated, l.cutBack(n, err)
		}
		l.fileOff += int64(len(c.buf))
		l.dirty = true
	}
	return len(chunks), rotated, nil
}

// cutBack deals with a write that failed after n of its bytes reached the segment: when it
// failed for want of space, they are cut off, so that the retry writes the batch whole where
// it belongs and no later batch follows a torn one. It returns the write's error, or the
// truncation's, which fails the log.
func (l *Log) cutBack(n int, err error) error {
	if n == 0 || !noSpace(err) {
		return err // another error fails the log: Open cuts the torn batch
	}
	if terr := l.file.Truncate(l.fileOff); terr != nil {
		// Not wrapped: whatever terr is, this must fail the log, not stall it, since the
		// retry would follow the torn bytes.
		return fmt.Errorf("wal: cut back a write that found no space (%v): %v", err, terr)
	}
	return err
}

// rotate finishes the current segment, synced whatever the policy (once per segment: so that
// damage in any segment but the last is corruption, never a crash's doing), and starts segment
// n. If n cannot be started, the current segment stays the one written to.
func (l *Log) rotate(n uint64) error {
	if err := l.syncFile(); err != nil {
		return err
	}
	old := l.file
	if err := l.startSegment(n); err != nil {
		return err
	}
	return old.Close()
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
// log's flushTick, syncTick, …; callers pass it as a method expression, which allocates
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
func (l *Log) syncTick() { l.background(&l.syncer) }

// removeTick is the remover's timer: it removes released segments, beside the writer.
func (l *Log) removeTick() { l.background(&l.remover) }

// flushTick writes what was appended and nobody waited for.
func (l *Log) flushTick() { l.background(&l.flusher) }

// retryTick writes what a stall kept (stall.go).
func (l *Log) retryTick() { l.background(&l.retrier) }

// background runs b's work. The flusher and the syncer write what is pending, unless the log
// is stalled (the retrier writes it then); the retrier writes it during a stall. Then the
// syncer, and the others under SyncAlways, sync what was written (during a stall too) beside
// the writer; if a sync is in flight, which may not cover it, the timer is armed again rather
// than waiting, so that a record appended meanwhile is not held up by an fsync.
func (l *Log) background(b *background) {
	defer l.timers.Done()
	l.mu.Lock()
	defer l.mu.Unlock()
	b.armed = false
	for l.writing { // a write(2), or a rotation's I/O
		l.cond.Wait()
	}
	if l.err != nil || l.closed {
		return
	}
	switch b {
	case &l.remover:
		if !l.removing {
			l.removeBeside()
		}
		return
	case &l.retrier:
		if l.stall == nil {
			return
		}
		l.writeLocked()
	default:
		if l.stall == nil && len(l.pending) > 0 {
			l.writeLocked()
		}
	}
	if b != &l.syncer && l.opts.Sync != SyncAlways || l.err != nil || l.synced >= l.written {
		return
	}
	if l.syncing || l.rotating || l.writing {
		if b == &l.syncer {
			l.arm(b, l.opts.Interval, (*Log).syncTick)
		} else {
			l.arm(&l.flusher, l.opts.FlushDelay, (*Log).flushTick)
		}
		return
	}
	l.syncBeside()
}

// syncBeside syncs the segment the last writer's turn ended in without holding the writer's
// turn, so that writes (an acknowledgement's flush, a publish's) go on during the fsync, which
// on a slow disk can take tens of milliseconds. The caller holds mu; no sync is in flight, and
// the writer, if any, is not moving to a new segment; mu is released during the fsync. A
// writer that rotates meanwhile syncs the segment itself before it closes it (and the fsync
// here then fails with fs.ErrClosed, or covers it anyway): the next sync covers the rest.
func (l *Log) syncBeside() {
	f, end := l.cur, l.written
	l.syncing = true
	l.mu.Unlock()
	err := f.Sync()
	l.mu.Lock()
	l.syncing = false
	switch {
	case err == nil:
		l.synced = max(l.synced, end)
	case errors.Is(err, iofs.ErrClosed):
		// Rotated (and synced) or closed meanwhile: the next sync covers what is left.
	default:
		l.failLocked(err)
		l.noteHealthLocked()
	}
	l.cond.Broadcast()
}

// ReleaseBelow says that nothing in the segments before segment n is needed any more: the
// log removes them (never the segment being appended to) within FlushDelay, beside the writer
// (removeBeside), or at the next Sync.
func (l *Log) ReleaseBelow(n uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil || l.closed {
		return // no timer is armed any more
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
// removal: first written (by this goroutine, as the writer, if nobody has; during a stall it
// waits for the retrier), then synced beside a writer as syncBeside does (a segment the writer
// rotates past meanwhile is synced by the rotation). Only segments before writtenSeg go: each
// was synced whole when the writer moved past it, and none is the one being written.
func (l *Log) removeBeside() {
	for l.err == nil && !l.closed && (l.writing || l.removing || l.written < l.releasedAt) {
		switch {
		case l.writing || l.removing:
			l.cond.Wait()
		case l.stall != nil:
			return // the retrier writes first, and arms nothing here: Sync or the next release removes
		default:
			l.writeLocked()
		}
	}
	first, below := l.first, min(l.release, l.writtenSeg)
	if l.err != nil || l.closed || first >= below {
		return
	}
	l.removing = true
	f, need := l.cur, l.synced < l.releasedAt
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
	if err != nil {
		l.failLocked(err)
		l.noteHealthLocked()
	}
	l.cond.Broadcast()
}

// Close writes and syncs everything appended, and closes the log. A stall does not hold it
// up: it tries once more (Closing), and if the write still finds no space, what it could not
// write is lost and Close returns an error wrapping ErrFailed and the want of space. It
// returns the log's failure, if it failed before. Later calls return nil; the log's other
// methods return ErrClosed, and a Wait for a position Close wrote returns nil.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closingLocked()
	err := l.syncAllLocked()
	for l.writing || l.syncing || l.removing {
		l.cond.Wait()
	}
	if l.closed { // a concurrent Close finished first
		l.mu.Unlock()
		return nil
	}
	l.stop(&l.syncer)
	l.stop(&l.flusher)
	l.stop(&l.remover)
	l.stop(&l.retrier)
	l.closed = true
	l.noteHealthLocked()
	l.cond.Broadcast()
	f := l.file
	l.file = nil
	l.mu.Unlock()
	l.timers.Wait()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

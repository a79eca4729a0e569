package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	iofs "io/fs"
	"sync"
	"sync/atomic"
	"time"
)

// Errors. Each works with errors.Is.
var (
	// ErrCorrupt is wrapped by the error of Open when the log lost something a sync had made
	// durable: damage other than a torn write at its end, a missing segment; the error names
	// the file and the offset.
	ErrCorrupt = errors.New("wal: corrupt log")
	// ErrVersion is wrapped by the error of Open when a segment is in a format this version of
	// the log does not read; the error names the file and the format.
	ErrVersion = errors.New("wal: unsupported log format")
	// ErrFailed is wrapped, with the first I/O error, by every call once a write or a sync
	// failed: what reached the file is unknown, so the log takes nothing more.
	ErrFailed = errors.New("wal: log failed")
	// ErrLocked is returned by LockDir when another log holds the directory.
	ErrLocked = errors.New("wal: directory in use by another log")
	// ErrClosed is returned by calls after Close.
	ErrClosed = errors.New("wal: log closed")

	errBadHeader = errors.New("wal: bad segment header")
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
	// Salvage makes Open skip damage (bad batches, bad segment headers, missing segments)
	// instead of failing, and report what it skipped (Recovery.Skipped).
	Salvage bool
	// OnSkip, if set, is called by Open at each stretch Salvage skips, in order with replay:
	// the records replay was handed before the call come before the stretch in the log, those
	// after, after it. The Damage's Records is not known yet (-1) when they are counted only
	// at the next record read: Recovery.Skipped has the count.
	OnSkip func(Damage)
}

// SegmentSize returns the size past which the log starts a new segment.
func (l *Log) SegmentSize() int64 { return l.opts.SegmentSize }

// LSN is a position in the log: the number of record bytes appended before it since Open.
// It orders appends; it is not a file offset.
type LSN uint64

// pos is a place in the log: a segment and an offset in it.
type pos struct {
	seg uint64
	off int64
}

// after reports whether p is after q.
func (p pos) after(q pos) bool { return p.seg > q.seg || p.seg == q.seg && p.off > q.off }

// Log is a segmented, append-only log of records. It is safe for concurrent use.
//
// Append copies records into the log's buffer under the log's own lock, a leaf: a caller may
// hold its own locks, and the log's order is the order of the Append calls. Wait returns once
// the records before a position are written to the operating system (and synced, under
// SyncAlways); the first waiter to find no write in progress writes everything buffered as one
// batch per segment, so concurrent writers share writes and syncs.
//
// What it writes lets Open tell a torn write from damage (see Open and format.go): each batch
// says how much of its segment was durable when it was written (syncedTo); a segment the log
// moves past is sealed, after the next one exists (rotate); Close seals the last segment that
// holds batches, so that every byte written is checked at the next Open; a segment goes only
// once a synced batch or header says the log starts after it (markedStart, removeBeside).
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
	// start is the oldest segment the log needs; markedStart, the start the last batch or
	// header written says (a segment before it may go once that is synced).
	start, markedStart uint64
	markedAt           pos               // the end of the batch or header that says markedStart
	syncedTo           pos               // what is known durable: the segments before it, and its bytes before off
	segFirst           map[uint64]uint64 // the number of each segment's first record (for start batches)

	// Owned by the writer.
	file        File   // the segment being appended to
	fileSeg     uint64 // its number
	fileOff     int64  // its size
	fileFirst   uint64 // the number of its first record
	fileRecords uint64 // the records in it
	dirty       bool   // written since the last sync
}

// chunk is records appended for one segment, behind the room for their batch's frame.
type chunk struct {
	seg uint64
	buf []byte // reserve bytes, then the records
	n   int    // how many records
	end LSN    // the position after its last record
}

// setStart sets where the log starts, what the last header or batch written says of it, and
// the first segment there. Open calls it.
func (l *Log) setStart(start, marked, first uint64) {
	l.start, l.markedStart, l.release, l.first = start, marked, start, first
}

// startSegment creates the segment of header h and makes it the one written to. Only the
// writer, or Open, calls it.
func (l *Log) startSegment(h header) error {
	f, err := l.fs.Create(segmentName(h.seg))
	if err != nil {
		return err
	}
	if _, err := f.Write(h.encode()); err != nil {
		f.Close()
		return err
	}
	if err := l.fs.SyncDir(); err != nil {
		f.Close()
		return err
	}
	l.file, l.fileSeg, l.fileOff, l.dirty = f, h.seg, headerSize, true
	l.fileFirst, l.fileRecords = h.first, 0
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
		l.segBytes += reserve
	}
	c := &l.pending[len(l.pending)-1]
	for _, r := range recs {
		c.buf = binary.AppendUvarint(c.buf, uint64(len(r)))
		c.buf = append(c.buf, r...)
	}
	c.n += len(recs)
	l.segBytes += size
	l.appended += LSN(size)
	c.end = l.appended
	l.arm(&l.flusher, l.opts.FlushDelay, (*Log).flushTick)
	return l.appended, l.lastSeg, nil
}

// newBuffer returns an empty chunk buffer with the room for its frame reserved.
func (l *Log) newBuffer() []byte {
	if n := len(l.spare); n > 0 {
		b := l.spare[n-1]
		l.spare = l.spare[:n-1]
		return b[:reserve]
	}
	return make([]byte, reserve, 4096)
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
// It writes a start batch too if the log's start moved since a batch or header last said it
// (removeBeside).
func (l *Log) writeLocked(sync bool) {
	l.writing = true
	chunks := l.pending
	l.pending = nil
	end := l.appended
	w := writeState{start: l.start, startFirst: l.segFirst[l.start], needStart: l.markedStart < l.start}
	if l.syncedTo.seg == l.fileSeg {
		w.synced = l.syncedTo.off
	}
	l.mu.Unlock()
	err := l.write(chunks, &w)
	if err == nil && sync {
		err = l.syncFile()
	}
	l.mu.Lock()
	for _, c := range w.created {
		l.segFirst[c.seg] = c.first
	}
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
		if w.markedAt.seg != 0 {
			l.markedStart, l.markedAt = w.start, w.markedAt
		}
		if sync {
			l.synced = end
			l.syncedTo = pos{l.fileSeg, l.fileOff}
		} else if l.opts.Sync == SyncInterval {
			l.arm(&l.syncer, l.opts.Interval, (*Log).syncTick)
		}
	}
	l.cond.Broadcast()
}

// writeState is what a writer knows, from the log's state under mu, while it writes with mu
// released.
type writeState struct {
	start, startFirst uint64 // the log's start, and its first record's number
	needStart         bool   // no batch or header written says start yet
	markedAt          pos    // where this write said start, if it did
	synced            int64  // the bytes of the current segment known durable
	created           []segStart
}

// segStart is a segment a writer started, and its first record's number.
type segStart struct{ seg, first uint64 }

// write writes chunks, each as one batch, starting segments as they come, and then a start
// batch if one is needed. Only the writer calls it, with mu released.
func (l *Log) write(chunks []chunk, w *writeState) error {
	for _, c := range chunks {
		if c.n == 0 {
			continue
		}
		if c.seg != l.fileSeg {
			if err := l.rotate(c.seg, w); err != nil {
				return err
			}
		}
		if err := l.writeBatch(batchData, c.buf, c.n, w); err != nil {
			return err
		}
	}
	if w.needStart {
		if err := l.writeBatch(batchStart, startBatch(w.start, w.startFirst), 0, w); err != nil {
			return err
		}
		w.needStart, w.markedAt = false, pos{l.fileSeg, l.fileOff}
	}
	return nil
}

// writeBatch writes a batch of n records, or a seal or start batch, whose body follows
// buf[:reserve], to the current segment.
func (l *Log) writeBatch(kind byte, buf []byte, n int, w *writeState) error {
	b := frame(buf, kind, l.fileSeg, l.fileOff, w.synced, l.fileRecords)
	if _, err := l.file.Write(b); err != nil {
		return err
	}
	l.fileOff += int64(len(b))
	l.fileRecords += uint64(n)
	l.dirty = true
	return nil
}

// rotate moves the log from its current segment to segment n, in an order that lets Open tell
// a crash during the move from damage:
//
//  1. segment n is created with its header, and its name made durable: its header says how
//     much of the current segment is known durable;
//  2. the current segment gets a seal, and is synced, whatever the policy: once per segment,
//     so that damage in a sealed segment is corruption, never a crash's doing;
//  3. records go to segment n.
//
// So a sealed segment is complete and has a next one (a missing last segment is corruption),
// and a segment that holds a batch follows a sealed one. A crash between 1 and 2 leaves an
// unsealed segment, maybe torn, and after it one without batches: Open finishes the move.
// Closing (Close), the current segment was synced whole, and segment n's header is synced too.
func (l *Log) rotate(n uint64, w *writeState) error {
	h := header{seg: n, first: l.fileFirst + l.fileRecords, start: w.start, startFirst: w.startFirst, prevSynced: w.synced}
	f, err := l.fs.Create(segmentName(n))
	if err != nil {
		return err
	}
	if _, err := f.Write(h.encode()); err != nil {
		f.Close()
		return err
	}
	if err := l.fs.SyncDir(); err != nil {
		f.Close()
		return err
	}
	err = l.writeBatch(batchSeal, sealBatch(), 0, w)
	if err == nil {
		err = l.syncFile()
	}
	if err == nil {
		err = l.file.Close()
	}
	if err != nil {
		f.Close()
		return err
	}
	l.file, l.fileSeg, l.fileOff, l.dirty = f, n, headerSize, true
	l.fileFirst, l.fileRecords = h.first, 0
	if w.needStart {
		w.needStart, w.markedAt = false, pos{n, headerSize} // its header says start
	}
	w.synced = 0 // nothing of n is known durable
	w.created = append(w.created, segStart{n, h.first})
	return nil
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
	f, end, at := l.file, l.written, pos{l.fileSeg, l.fileOff}
	l.unsynced, l.syncing = false, true
	l.mu.Unlock()
	err := f.Sync()
	l.mu.Lock()
	l.syncing = false
	switch {
	case err == nil:
		l.synced = max(l.synced, end)
		l.syncedUpTo(at)
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

// syncedUpTo notes that what comes before p is durable. The caller holds mu.
func (l *Log) syncedUpTo(p pos) {
	if p.after(l.syncedTo) {
		l.syncedTo = p
	}
}

// removeBeside removes the released segments without holding the writer's turn, so that
// neither a publisher's confirm nor an acknowledgement's flush waits for the fsyncs a removal
// takes. The caller holds mu, no writer is active and no removal is in flight; mu is released
// during the I/O.
//
// What the log's user appended again before releasing the segments (the topology, moved
// messages: releasedAt) replaces their records, and a start batch (or a header) must say that
// the log starts after them, or Open would take them for missing; so both are written and
// synced before any removal: first written (by this goroutine, as the writer, if nobody has),
// then synced beside a writer as syncBeside does (a segment the writer rotates past meanwhile
// is synced by the rotation). Only segments before writtenSeg go: each was synced whole when
// the writer moved past it, and none is the one being written.
func (l *Log) removeBeside() {
	for l.err == nil {
		below := min(l.release, l.writtenSeg)
		if l.writing || l.removing {
			l.cond.Wait()
		} else if l.written < l.releasedAt || l.first < below && l.markedStart < below {
			l.start = max(l.start, below)
			l.writeLocked(false)
		} else {
			break
		}
	}
	first, below := l.first, min(l.release, l.writtenSeg)
	if l.err != nil || first >= below {
		return
	}
	l.removing = true
	f, at := l.file, pos{l.fileSeg, l.fileOff}
	need := l.synced < l.releasedAt || l.markedAt.after(l.syncedTo)
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
	if need && err == nil {
		l.syncedUpTo(at)
	}
	for n := l.first; n < first; n++ {
		delete(l.segFirst, n)
	}
	l.first = first
	if err != nil && l.err == nil {
		l.err = fmt.Errorf("%w: %w", ErrFailed, err)
	}
	l.cond.Broadcast()
}

// Close writes and syncs everything appended, and closes the log. It returns the error that
// kept it from doing so, if any. Later calls return ErrClosed.
//
// Closing, the log seals its last segment if it holds batches and starts an empty one after
// it (rotate), with both synced: every segment that holds a record is then sealed, so that the
// next Open checks every byte of them, and finds any damage since, even to their end.
func (l *Log) Close() error {
	err := l.Sync()
	l.mu.Lock()
	if errors.Is(l.err, ErrClosed) {
		l.mu.Unlock()
		return nil
	}
	for l.writing || l.removing {
		l.cond.Wait()
	}
	l.stop(&l.syncer)
	l.stop(&l.flusher)
	l.stop(&l.remover)
	failed := l.err != nil
	l.err = ErrClosed
	w := writeState{start: l.start, startFirst: l.segFirst[l.start]}
	l.mu.Unlock()
	l.timers.Wait()
	// The log is closed: nobody else writes, syncs or removes any more.
	if err == nil && !failed && l.fileOff > headerSize {
		err = l.seal(&w)
	}
	if cerr := l.file.Close(); err == nil {
		err = cerr
	}
	return err
}

// seal seals the last segment of a closing log, synced whole, and starts an empty one after it,
// whose header is synced too.
func (l *Log) seal(w *writeState) error {
	if err := l.syncFile(); err != nil {
		return err
	}
	w.synced = l.fileOff
	if err := l.rotate(l.fileSeg+1, w); err != nil {
		return err
	}
	return l.syncFile()
}

package wal

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	iofs "io/fs"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Errors. Each works with errors.Is.
var (
	// ErrCorrupt is wrapped by the error of Open when the log lost something a sync had made
	// durable: damage other than a torn write at its end, a missing segment; and by the error of
	// Scan when what it reads is damaged: a bad batch or header, a segment cut short or
	// missing. The error names the file and the offset.
	ErrCorrupt = errors.New("wal: corrupt log")
	// ErrVersion is wrapped by the error of Open when a segment is in a format this version of
	// the log does not read; the error names the file and the format.
	ErrVersion = errors.New("wal: unsupported log format")
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
	// ErrReleased is wrapped by the error of Scan when it is asked for a segment the log was
	// released below (ReleaseBelow), removed or about to be; the error names the segment.
	ErrReleased = errors.New("wal: segment released")

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
	// they are written (and then synced, under SyncAlways); default 1 ms. A record nobody
	// waits for (an acknowledgement) can be lost by a process crash for FlushDelay plus the
	// write(2) in progress, if any, after it was appended: the flush waits for no fsync, except
	// the ones a writer moving to a new segment makes (the finished segment's, the
	// directory's), once per SegmentSize.
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
	// ResumeAt are places in the log (Log.MarkNow) from which the caller can rebuild what it
	// needs of the records before them (a checkpoint), in the order to try them. Open resumes
	// at the first that is still in the log — from the log's start to its last segment, its
	// segment there numbered from its record, every segment from the start to it there with a
	// good header, which is all Open reads of them — and hands replay the records from there on
	// only (Recovery.Resumed, ResumedAt). If none is, it reads the log whole.
	ResumeAt []Mark
	// OnResume, if set, is called by Open when it resumes at m, before it hands replay the
	// first record after m.
	OnResume func(m Mark)
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
// batch per segment, so concurrent writers share writes and syncs. The writer's turn covers
// its write(2) (and, when it moves to a new segment, the finished segment's fsync), not the
// fsync a waiter under SyncAlways needs: that one runs beside the writer (syncBeside), one at a
// time, so that a write waits for no fsync in flight, and a waiter whose records it does not
// cover waits for it and syncs again.
//
// What it writes lets Open tell a torn write from damage (see Open and format.go): each batch
// says how much of its segment was durable when it was written (syncedTo, which only an fsync
// that covered the bytes advances, whoever ran it: syncBeside, the remover, a rotation); a
// segment the log moves past is sealed, after the next one exists (rotate); Close seals the
// last segment that holds batches, so that every byte written is checked at the next Open; a
// segment goes only once a synced batch or header says the log starts after it (markedStart,
// removeBeside).
//
// A write that fails for want of space (ENOSPC, EDQUOT) stalls the log instead of failing it:
// the part of a batch that reached the file is cut off (the segment is truncated back to its
// last whole batch, which no mark of a synced offset goes past), the records not written are
// kept, in order, ahead of those appended since, and the log tries again after a backoff (10
// ms, doubling to 1 s), until a write succeeds. Meanwhile Append still takes records (a caller
// that must not add to the log checks Err first), Wait and WaitWritten wait for the retry (or
// their ctx), Sync returns ErrStalled, and nothing else writes: no segment is removed whose
// start batch the stall holds back. A segment whose header, or whose predecessor's seal, found
// no space is removed again, so the log is as before the move and the retry starts it anew. A
// failed fsync, or another write error, fails the log instead (see ErrFailed). Closing ends a
// stall: it tries once more, and fails the log if the write still finds no space.
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
	// cur is the segment the last writer's turn ended in: what syncBeside syncs; curAt, where
	// that turn ended in it (an fsync of cur that starts after the turn covers the bytes
	// before curAt).
	cur   File
	curAt pos
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
	// start is the oldest segment the log needs; markedStart, the start the last batch or
	// header written says (a segment before it may go once that is synced).
	start, markedStart uint64
	markedAt           pos               // the end of the batch or header that says markedStart
	syncedTo           pos               // what is known durable: the segments before it, and its bytes before off
	segFirst           map[uint64]uint64 // the number of each segment's first record (for start batches)

	// What Scan needs (read.go). openAt is where the log ended at Open: LSN 0 is there; segLSN,
	// the LSN before the first record of each segment started since (set by Append as it moves
	// to a new one); skipped, the stretches of segments that Open's Salvage skipped, gaps, the
	// segments it skipped as missing, and unsealed, the segments it took without a seal. Guarded
	// by mu; the map entries go with their segments (removeBeside); openAt, skipped's slices and
	// gaps are set by Open and not changed after.
	openAt   pos
	segLSN   map[uint64]LSN
	skipped  map[uint64][]stretch
	gaps     []gap
	unsealed map[uint64]bool
	// readers are Scan's buffers, for reuse.
	readers sync.Pool

	// OnStall's calls: notifyMu orders them; told is the state last told. Taken with no other
	// lock held; mu is taken under it.
	notifyMu sync.Mutex
	told     bool

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

// startSegment creates the segment of header h and makes it the one written to. Only Open calls
// it (the writer moves to a new segment with rotate).
func (l *Log) startSegment(h header) error {
	f, err := l.createSegment(h)
	if err != nil {
		return err
	}
	l.file, l.fileSeg, l.fileOff, l.dirty = f, h.seg, headerSize, true
	l.fileFirst, l.fileRecords = h.first, 0
	l.cur, l.curAt = f, pos{h.seg, headerSize}
	return nil
}

// createSegment creates the segment of header h, writes its header and makes its name durable.
// A segment it could not finish is removed again (dropSegment), so that the writer can create
// it again once there is space.
func (l *Log) createSegment(h header) (File, error) {
	f, err := l.fs.Create(segmentName(h.seg))
	if err != nil {
		return nil, err
	}
	if _, err = f.Write(h.encode()); err == nil {
		err = l.fs.SyncDir()
	}
	if err != nil {
		return nil, l.dropSegment(f, h.seg, err)
	}
	return f, nil
}

// dropSegment closes and removes segment n, which the writer created and could not move to
// because of err, with the removal durable (a power loss then leaves no empty segment behind),
// and returns err; or an error that does not wrap it, so that the log fails rather than
// stalls, if the segment cannot be removed (the retry could not create it again).
func (l *Log) dropSegment(f File, n uint64, err error) error {
	f.Close()
	rerr := l.fs.Remove(segmentName(n))
	if rerr == nil {
		rerr = l.fs.SyncDir()
	}
	if rerr != nil {
		return fmt.Errorf("wal: remove %s, which could not be started (%v): %v", segmentName(n), err, rerr)
	}
	return err
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
		l.segLSN[l.lastSeg] = l.appended
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
	if l.stall == nil {
		l.arm(&l.flusher, l.opts.FlushDelay, (*Log).flushTick) // in a stall, the retrier writes it
	}
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
// or with the error that prevents it: the log's failure, ErrClosed, or ctx.Err() (unwrapped)
// once ctx ends first; the records are then still in the log, and may yet be written. It
// waits out a stall (see Log).
func (l *Log) Wait(ctx context.Context, lsn LSN) error {
	return l.await(ctx, lsn, l.opts.Sync == SyncAlways)
}

// Written returns the log position before which everything appended is written, synced or
// not: a Scan up to it waits for nothing. It takes no lock.
func (l *Log) Written() LSN { return LSN(l.writtenNow.Load()) }

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
				// Nothing more it may remove yet: the writer has not reached the segment, or
				// a stall holds the start batch the removal needs.
				return l.stall
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
// one batch, and then a start batch if the log's start moved since a batch or header last said
// it (removeBeside); it releases mu during the I/O. The caller holds mu, and no writer is
// active. A write that fails for want of space stalls the log (keeping what it did not write,
// the start batch included); any other error fails it.
func (l *Log) writeLocked() {
	l.writing = true
	chunks, before, wasStalled := l.pending, l.written, l.stall != nil
	l.pending = nil
	l.rotating = len(chunks) > 0 && chunks[len(chunks)-1].seg != l.fileSeg
	w := writeState{start: l.start, startFirst: l.segFirst[l.start], needStart: l.markedStart < l.start}
	if l.syncedTo.seg == l.fileSeg {
		w.synced = l.syncedTo.off
	}
	l.mu.Unlock()
	done, rotated, err := l.write(chunks, &w)
	l.mu.Lock()
	for _, c := range w.created {
		l.segFirst[c.seg] = c.first
	}
	if w.markedAt.seg != 0 {
		l.markedStart, l.markedAt = w.start, w.markedAt
	}
	l.writing, l.rotating = false, false
	l.cur, l.curAt, l.writtenSeg = l.file, pos{l.fileSeg, l.fileOff}, l.fileSeg
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
	case stalls(err) && !l.closing:
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

// writeState is what a writer knows, from the log's state under mu, while it writes with mu
// released.
type writeState struct {
	start, startFirst uint64 // the log's start, and its first record's number
	needStart         bool   // no batch or header written says start yet
	markedAt          pos    // where this write said start, if it did
	// synced is how many bytes of the current segment are known durable: syncedTo when the
	// turn began (an fsync that ends during the turn is not counted: the next turn's batches
	// say it).
	synced  int64
	created []segStart
}

// segStart is a segment a writer started, and its first record's number.
type segStart struct{ seg, first uint64 }

// write writes chunks, each as one batch, starting segments as they come, and then a start
// batch if one is needed. Only the writer calls it, with mu released. It returns how many
// chunks it wrote, the index of the chunk before which it last started a segment (-1 if it
// started none), and the error that stopped it.
func (l *Log) write(chunks []chunk, w *writeState) (done, rotated int, err error) {
	rotated = -1
	for i, c := range chunks {
		if c.n == 0 {
			continue
		}
		if c.seg != l.fileSeg {
			if err := l.rotate(c.seg, w); err != nil {
				return i, rotated, err
			}
			rotated = i
		}
		if err := l.writeBatch(batchData, c.buf, c.n, w); err != nil {
			return i, rotated, err
		}
	}
	if w.needStart {
		if err := l.writeBatch(batchStart, startBatch(w.start, w.startFirst), 0, w); err != nil {
			return len(chunks), rotated, err
		}
		w.needStart, w.markedAt = false, pos{l.fileSeg, l.fileOff}
	}
	return len(chunks), rotated, nil
}

// writeBatch writes a batch of n records, or a seal or start batch, whose body follows
// buf[:reserve], to the current segment. A batch kept by a stall is framed again when it is
// written again: its body does not move.
func (l *Log) writeBatch(kind byte, buf []byte, n int, w *writeState) error {
	b := frame(buf, kind, l.fileSeg, l.fileOff, w.synced, l.fileRecords)
	if k, err := l.file.Write(b); err != nil {
		return l.cutBack(k, err)
	}
	l.fileOff += int64(len(b))
	l.fileRecords += uint64(n)
	l.dirty = true
	return nil
}

// cutBack deals with a write that failed after n of its bytes reached the segment: when it
// failed for want of space, they are cut off, so that the retry writes the batch whole where
// it belongs and no later batch follows a torn one. (They are past fileOff, so no batch's mark
// of the synced bytes covers them.) It returns the write's error, or the truncation's, which
// fails the log.
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
//
// If 1 fails, or the seal finds no space (no whole seal reached the file: its torn part is cut
// off), segment n is removed again and the current segment stays the one written to, unsealed,
// as before the move; a stall's retry moves again. A failed sync fails the log (syncError),
// and segment n stays: the seal may be on the disk, and a sealed segment needs a next one.
func (l *Log) rotate(n uint64, w *writeState) error {
	h := header{seg: n, first: l.fileFirst + l.fileRecords, start: w.start, startFirst: w.startFirst, prevSynced: w.synced}
	f, err := l.createSegment(h)
	if err != nil {
		return err
	}
	if err := l.writeBatch(batchSeal, sealBatch(), 0, w); err != nil {
		if noSpace(err) {
			return l.dropSegment(f, n, err)
		}
		f.Close()
		return err
	}
	err = l.syncFile()
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

// syncFile syncs the current segment if it was written since the last sync. Its error is a
// syncError: a failed fsync fails the log, whatever its cause.
func (l *Log) syncFile() error {
	if !l.dirty {
		return nil
	}
	if err := l.file.Sync(); err != nil {
		return syncError{err}
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
// Once the fsync returns, what it covered is synced, and syncedTo says so: the bytes of cur
// before curAt, written before it began (not those of a write beside it).
func (l *Log) syncBeside() {
	f, end, at := l.cur, l.written, l.curAt
	l.syncing = true
	l.mu.Unlock()
	err := f.Sync()
	l.mu.Lock()
	l.syncing = false
	switch {
	case err == nil:
		l.synced = max(l.synced, end)
		l.syncedUpTo(at)
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
// synced before any removal: first written (by this goroutine, as the writer, if nobody has;
// during a stall it removes nothing and leaves the writing to the retrier, whose success arms
// the remover again), then synced beside a writer as syncBeside does (a segment the writer
// rotates past meanwhile is synced by the rotation). Only segments before writtenSeg go: each
// was synced whole when the writer moved past it, and none is the one being written.
func (l *Log) removeBeside() {
	for l.err == nil && !l.closed {
		below := min(l.release, l.writtenSeg)
		if l.writing || l.removing {
			l.cond.Wait()
		} else if l.written < l.releasedAt || l.first < below && l.markedStart < below {
			if l.stall != nil {
				return
			}
			l.start = max(l.start, below)
			l.writeLocked()
		} else {
			break
		}
	}
	first, below := l.first, min(l.release, l.writtenSeg, l.markedStart)
	if l.err != nil || l.closed || first >= below {
		return
	}
	l.removing = true
	f, at := l.cur, l.curAt
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
		delete(l.segLSN, n)
		delete(l.skipped, n)
		delete(l.unsealed, n)
	}
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
//
// Closing, the log seals its last segment if it holds batches and starts an empty one after
// it (rotate), with both synced: every segment that holds a record is then sealed, so that the
// next Open checks every byte of them, and finds any damage since, even to their end. If the
// seal or the new segment finds no space, nothing is lost (everything was synced before), and
// the log is left as a crash would leave it, which opens: Close fails it and returns an error
// wrapping ErrFailed and the want of space.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closingLocked()
	err := l.syncAllLocked()
	if !l.shutLocked() { // a concurrent Close finished first
		l.mu.Unlock()
		return nil
	}
	seal := err == nil && l.err == nil && l.fileOff > headerSize
	if l.syncedTo == (pos{l.fileSeg, l.fileOff}) {
		l.dirty = false // an fsync beside the writer covered all of it: seal syncs it no more
	}
	w := writeState{start: l.start, startFirst: l.segFirst[l.start]}
	l.mu.Unlock()
	l.timers.Wait()
	// The log is closed: nobody else writes, syncs or removes any more.
	if seal {
		if err = l.seal(&w); err != nil {
			l.mu.Lock()
			l.failLocked(err)
			err = l.err
			l.noteHealthLocked()
			l.mu.Unlock()
		}
	}
	if cerr := l.file.Close(); err == nil {
		err = cerr
	}
	return err
}

// Mark is a place in the log: a segment, and the number of the record that goes first in it.
type Mark struct {
	Seg, Record uint64
	// Firsts are the numbers of the first records of the segments from Start to Seg, before
	// it, if known: Open resuming at the mark need not read their headers (a cold page cache
	// makes that a disk read each: 30,000 segments, 6 s).
	Start  uint64
	Firsts []uint64
}

// At reports whether m and o are the same place.
func (m Mark) At(o Mark) bool { return m.Seg == o.Seg && m.Record == o.Record }

// MarkNow returns a place in the log at or before every record appended from now on: the start
// of the last segment written to (its records, and those after it, are after it).
func (l *Log) MarkNow() Mark {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := Mark{Seg: l.writtenSeg, Record: l.segFirst[l.writtenSeg], Start: l.first}
	for n := l.first; n < l.writtenSeg; n++ {
		first, ok := l.segFirst[n]
		if !ok {
			return Mark{Seg: m.Seg, Record: m.Record}
		}
		m.Firsts = append(m.Firsts, first)
	}
	return m
}

// Appended returns the position after the last record appended.
func (l *Log) Appended() LSN {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.appended
}

// shutLocked closes the log to its callers once no write, sync or removal is in flight, and
// stops its timers (their callbacks in flight return at once; the caller waits for them with mu
// released). It reports false if the log was closed meanwhile. The caller holds mu.
func (l *Log) shutLocked() bool {
	for l.writing || l.syncing || l.removing {
		l.cond.Wait()
	}
	if l.closed {
		return false
	}
	l.stop(&l.syncer)
	l.stop(&l.flusher)
	l.stop(&l.remover)
	l.stop(&l.retrier)
	l.closed = true
	l.noteHealthLocked()
	l.cond.Broadcast()
	return true
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

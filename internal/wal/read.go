package wal

import (
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"math"
)

// Reading the log back while it is written. Scan reads the segment files through the FS seam
// with handles of its own, beside the writer: the log's lock only tells it what is written and
// where (its writer's last turn ended at curAt, with everything before written), and it reads
// nothing past that, so it never sees a batch being written, nor the pending buffer. Batches
// are checked as Open checks them (parseBatch).
//
// A record's position (LSN) counts record bytes appended since Open, and a data batch's body
// is its records as Append encoded them, so the LSN after each record follows from the LSN at
// the start of its segment: 0 where the log ended at Open (openAt), and for each segment
// started since, what Append noted when it moved to it (segLSN). Records from before Open come
// before every LSN.

// readAhead is how many bytes Scan reads from a segment at a time, when the batch it needs is
// not bigger, once it handed on a record of the segment: a 512 KiB segment is read in 9 or so
// reads. Before that it reads only what it needs and the next batch's frame, so that a Scan
// stopped at the first record of the next segment reads little of it. (BenchmarkScan read the
// page cache as fast with 16, 64 or 256 KiB, within its noise: the reads' copy, the checksums
// and the records' parsing take the time.)
const readAhead = 64 << 10

// maxPooled is the largest buffer Scan keeps for reuse: one grown for a bigger batch goes.
const maxPooled = 1 << 20

// stretch is a part of a segment, [off, end), that Open's Salvage skipped: Scan skips it too.
type stretch struct{ off, end int64 }

// gap is a run of segments, from to to, that Open's Salvage skipped as missing: Scan skips
// them too.
type gap struct{ from, to uint64 }

// skippedStretches returns the stretches of each segment that Open skipped, from its Damage.
// One that starts in the header covers it: the header was bad. A Damage of no bytes (a missing
// segment, records found missing, a segment's end gone) skips nothing here.
func skippedStretches(damage []Damage) map[uint64][]stretch {
	var m map[uint64][]stretch
	for _, d := range damage {
		n, ok := segmentNumber(d.File)
		if !ok || d.Missing || d.Bytes == 0 {
			continue
		}
		s := stretch{d.Offset, d.Offset + d.Bytes}
		if s.off < headerSize {
			s = stretch{0, max(s.end, headerSize)}
		}
		if m == nil {
			m = map[uint64][]stretch{}
		}
		m[n] = append(m[n], s)
	}
	return m
}

// Scan calls fn with each data record of the log from the first record of segment seg on, in
// log order, with the number of the segment it is in; rec is valid only during the call, and
// fn runs with no lock of the log held. Scan stops when fn returns false, or after the last
// record before the position upto (an LSN Append returned; 0: everything appended when Scan is
// called), and returns nil either way, as it does when seg is past the segments written.
// Records from before Open come before every LSN, so Scan hands on all of them.
//
// It first waits for upto to be written, as WaitWritten does: it writes it itself if no writer
// is at work, waits out a stall, or returns ctx.Err() (unwrapped) once ctx ends first, and
// before reading anything if ctx is done already. When upto is written already (a position
// Wait or WaitWritten returned for), Scan waits on nothing the writer holds: it takes the
// log's lock briefly, once per segment, to learn what is written and where, and reads the
// files with handles of its own (one per segment), beside the writer, the flusher and the
// removal; it never reads the pending buffer, nor a batch being written. So it may be called
// with the caller's own locks held, concurrently with every other method, and with other
// Scans. ctx ending while it reads stops it at the next segment.
//
// To read one segment, stop at the first record of a later one: fn has the segment of each
// record, and of a later segment Scan reads only its header and first batch (and the next
// frame) before it hands on that record. A segment that holds no record is passed over.
//
// It checks every batch it reads as Open does: a bad one stops it with an error wrapping
// ErrCorrupt, naming the file and the offset, and so do a segment the log moved past that ends
// without its seal (cut short), and a segment file missing. What Open's Salvage skipped
// (stretches of segments, missing segments, a segment's missing end), Scan skips too. Seal and
// start batches hold no records.
//
// A segment the log was released below (ReleaseBelow) is refused with an error wrapping
// ErrReleased, whether or not it is removed yet: its records are not the log's any more. (A
// segment released while Scan reads it is read to its end: its file is open.) After Close, or
// once the log failed, Scan returns ErrClosed or the failure (ErrFailed), at the next segment
// it reads if it is under way. An I/O error is returned wrapped, naming the file.
//
// Scan allocates nothing per record: it reads into a buffer the log keeps for reuse.
func (l *Log) Scan(ctx context.Context, seg uint64, upto LSN, fn func(seg uint64, rec []byte) bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if upto == 0 {
		l.mu.Lock()
		upto = l.appended
		l.mu.Unlock()
	}
	if err := l.WaitWritten(ctx, upto); err != nil {
		return err
	}
	l.mu.Lock()
	end := l.curAt // everything before it is written, upto's record included
	l.mu.Unlock()
	r, _ := l.readers.Get().(*reader)
	if r == nil {
		r = &reader{}
	}
	defer func() {
		if cap(r.buf) <= maxPooled {
			r.win = nil
			l.readers.Put(r)
		}
	}()
	for n := seg; n <= end.seg; n++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		s, err := l.span(n, end)
		if err != nil {
			return err
		}
		if s.gapTo != 0 {
			n = s.gapTo
			continue
		}
		more, err := r.segment(l.fs, s, upto, fn)
		if errors.Is(err, iofs.ErrNotExist) {
			if _, rerr := l.span(n, end); rerr != nil {
				err = rerr // released and removed since
			} else {
				err = fmt.Errorf("%w: %w", err, ErrCorrupt)
			}
		}
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// span is what Scan reads of a segment, and where its records' LSNs start.
type span struct {
	seg uint64
	end int64 // where what is written of it ends; -1: at the end of its file (it is complete)
	// count is the offset from which its records have LSNs: they start at base there. Records
	// before it are from before Open (count is math.MaxInt64 if all of them are).
	count int64
	base  LSN
	skip  []stretch // what Open's Salvage skipped, in order
	// sealed says the segment is complete and ends with its seal: it is not the last one
	// written, nor one Open's Salvage took without a seal.
	sealed bool
	// gapTo is not 0 when the segment is in a gap Open's Salvage skipped: the last segment of
	// the gap. There is nothing to read.
	gapTo uint64
}

// span returns what Scan reads of segment n, the writer's last turn having ended at end; or
// why it may not be read.
func (l *Log) span(n uint64, end pos) (span, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.err != nil:
		return span{}, l.err
	case l.closed:
		return span{}, ErrClosed
	case n < l.release:
		return span{}, fmt.Errorf("wal: scan %s: the log was released below %s: %w", segmentName(n), segmentName(l.release), ErrReleased)
	}
	for _, g := range l.gaps {
		if g.from <= n && n <= g.to {
			return span{seg: n, gapTo: g.to}, nil
		}
	}
	s := span{seg: n, end: -1, count: math.MaxInt64, skip: l.skipped[n], sealed: !l.unsealed[n]}
	if n == end.seg {
		s.end, s.sealed = end.off, false
	}
	switch {
	case n == l.openAt.seg:
		s.count = l.openAt.off
	case n > l.openAt.seg:
		s.count, s.base = headerSize, l.segLSN[n]
	}
	return s, nil
}

// reader is Scan's buffer: win holds the bytes of the segment being read from offset winOff on.
// The zero reader is ready to use; a reader is used by one Scan at a time.
type reader struct {
	buf    []byte
	win    []byte // buf[:k]
	winOff int64
}

// segment hands fn the records of span s, and reports whether Scan goes on to the next
// segment: false once fn said stop or upto was reached.
func (r *reader) segment(fs FS, s span, upto LSN, fn func(uint64, []byte) bool) (more bool, err error) {
	name := segmentName(s.seg)
	f, err := fs.Open(name)
	if err != nil {
		return false, fmt.Errorf("wal: scan %s: %w", name, err)
	}
	defer f.Close() // read only: nothing to lose
	end := s.end
	if end < 0 {
		if end, err = f.Size(); err != nil {
			return false, fmt.Errorf("wal: scan %s: %w", name, err)
		}
	}
	r.win = r.win[:0]
	lsn, off, skip := s.base, int64(0), s.skip
	var ahead int64 // how far a read goes past what it needs: readAhead once a record is handed on
	for {
		for len(skip) > 0 && skip[0].off <= off {
			off = max(off, skip[0].end)
			skip = skip[1:]
		}
		if off >= end {
			if s.sealed {
				return false, fmt.Errorf("wal: %s offset %d: the segment ends without its seal, and the log goes on: %w", name, off, ErrCorrupt)
			}
			return true, nil
		}
		if off == 0 {
			p, err := r.read(f, name, 0, headerSize, end, ahead)
			if err != nil {
				return false, err
			}
			if _, err := parseHeader(p, s.seg); err != nil {
				return false, fmt.Errorf("wal: %s offset 0: bad segment header: %w", name, ErrCorrupt)
			}
			off = headerSize
			continue
		}
		p, err := r.read(f, name, off, frameSize, end, ahead)
		if err == nil {
			p, err = r.read(f, name, off, batchSize(p), end, ahead)
		}
		if err != nil {
			return false, err
		}
		b, ok := parseBatch(p, off, s.seg)
		if !ok {
			return false, fmt.Errorf("wal: %s offset %d: bad batch: %w", name, off, ErrCorrupt)
		}
		switch b.kind {
		case batchSeal:
			return true, nil // nothing follows it
		case batchData:
			counted := off >= s.count
			for recs := b.body; len(recs) > 0; {
				rec, rest, _ := nextRecord(recs) // parseBatch checked them
				if counted {
					if lsn += LSN(len(recs) - len(rest)); lsn > upto {
						return false, nil
					}
				}
				if !fn(s.seg, rec) || counted && lsn == upto {
					return false, nil
				}
				recs = rest
			}
			ahead = readAhead
		}
		off = b.next
	}
}

// read returns the bytes [off, off+n) of segment file f, of which the bytes before end are
// written: from the window if it holds them, or else reading the window again from off, as
// far as n and the next batch's frame, or ahead if more, and end allow. Bytes the window holds
// from off on are kept. A batch that would go past end is corrupt: the log wrote whole batches
// only.
func (r *reader) read(f File, name string, off, n, end, ahead int64) ([]byte, error) {
	if off+n > end {
		return nil, fmt.Errorf("wal: %s offset %d: bad batch: its %d bytes go past the end of what the log wrote (%d): %w", name, off, n, end, ErrCorrupt)
	}
	if off >= r.winOff && off+n <= r.winOff+int64(len(r.win)) {
		return r.win[off-r.winOff:][:n], nil
	}
	size := min(max(n+frameSize, ahead), end-off)
	var kept int64
	if off >= r.winOff && off < r.winOff+int64(len(r.win)) {
		kept = int64(len(r.win)) - (off - r.winOff)
	}
	if int64(cap(r.buf)) < size {
		buf := make([]byte, max(size, readAhead))
		copy(buf, r.win[len(r.win)-int(kept):])
		r.buf = buf
	} else {
		copy(r.buf, r.win[len(r.win)-int(kept):]) // memmove: the window may overlap
	}
	k, err := f.ReadAt(r.buf[kept:size], off+kept)
	if int64(k) < size-kept {
		r.win = r.win[:0]
		if err == nil || errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("wal: %s offset %d: the file ends before what the log wrote (%d): %w", name, off+kept+int64(k), end, ErrCorrupt)
		}
		return nil, fmt.Errorf("wal: scan %s offset %d: %w", name, off+kept+int64(k), err)
	}
	r.win, r.winOff = r.buf[:size], off
	return r.win[:n], nil
}

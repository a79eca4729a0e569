package wal

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// Reading the log back (read.go): Scan hands on what was appended, in order, from a segment on,
// up to a position, beside the writer; it checks what it reads, and skips what Open skipped.

// scanned is fn for Scan: it adds each record to r, and goes on.
func (r *replayed) scanned(seg uint64, rec []byte) bool {
	r.add(seg, rec)
	return true
}

// scan returns what Scan hands on from segment seg up to upto, and its error.
func scan(ctx context.Context, l *Log, seg uint64, upto LSN) (*replayed, error) {
	var r replayed
	err := l.Scan(ctx, seg, upto, r.scanned)
	return &r, err
}

// scanSegment returns what Scan hands on of segment seg alone, stopping at the first record of
// a later segment, as the broker's store reads one.
func scanSegment(t *testing.T, l *Log, seg uint64) *replayed {
	t.Helper()
	var r replayed
	require.NoError(t, l.Scan(t.Context(), seg, 0, func(n uint64, rec []byte) bool {
		if n != seg {
			return false
		}
		return r.scanned(n, rec)
	}))
	return &r
}

// TestScanRoundTrip: a log written in three lives, over many segments, the first ended by
// Close, the second by a crash (so that the third goes on in a segment the second wrote to).
// Scan hands on every record of all three, in order, each with its segment; from each segment
// on, and of each segment alone, what is there; up to each position Append returned, exactly
// the records before it.
func TestScanRoundTrip(t *testing.T) {
	fs := NewMemFS()
	opts := Options{Sync: SyncNever, SegmentSize: 2048}
	l, _, _ := openLog(t, fs, opts)
	segs, _ := appendEach(t, l, 0, 100)
	require.NoError(t, l.Close())
	l, _, _ = openLog(t, fs, opts)
	more, _ := appendEach(t, l, 100, 150)
	segs = append(segs, more...)
	crash(t, l)
	l, r, _ := openLog(t, fs, opts)
	requireRecords(t, r, 150)
	more, lsns := appendEach(t, l, 150, 400)
	require.Equal(t, segs[149], more[0], "the third life goes on in the segment the second left")
	segs = append(segs, more...)
	last := segs[len(segs)-1]
	require.Greater(t, last, segs[149]+10, "many segments after Open")

	all, err := scan(t.Context(), l, 1, 0)
	require.NoError(t, err)
	requireRecords(t, all, 400)
	require.Equal(t, segs, all.segs)

	for seg := uint64(1); seg <= last; seg++ {
		var want replayed
		from := -1
		for i, s := range segs {
			if s == seg {
				want.add(s, record(i))
			}
			if s >= seg && from < 0 {
				from = i
			}
		}
		require.NotEmpty(t, want.recs, "segment %d", seg)
		require.Equal(t, &want, scanSegment(t, l, seg), "segment %d alone", seg)
		got, err := scan(t.Context(), l, seg, 0)
		require.NoError(t, err)
		require.Equal(t, all.recs[from:], got.recs, "from segment %d on", seg)
	}

	for i := 0; i < len(lsns); i += 1 + i%23 {
		got, err := scan(t.Context(), l, 1, lsns[i])
		require.NoError(t, err)
		requireRecords(t, got, 150+i+1)
	}
	got, err := scan(t.Context(), l, last, lsns[0])
	require.NoError(t, err)
	require.Empty(t, got.recs, "upto is before the segment")
	for _, seg := range []uint64{last + 1, last + 100} {
		got, err := scan(t.Context(), l, seg, 0)
		require.NoError(t, err)
		require.Empty(t, got.recs, "past the last segment")
	}
	require.NoError(t, l.Close())
}

// prefix reports whether r holds records 0..n-1 for some n, in order; n is the number of them.
func prefix(r *replayed) (n int, ok bool) {
	for i, rec := range r.recs {
		if !bytes.Equal(record(i), rec) {
			return i, false
		}
	}
	return len(r.recs), true
}

// TestScanBesideAppend: Scans run while records are appended one at a time (and now and then
// waited for), moving the log over many segments. A Scan up to the position after record i
// hands on exactly records 0 to i, in order; one up to everything appended, at least the
// records appended before it began.
func TestScanBesideAppend(t *testing.T) {
	const total = 3000
	l, _, _ := openLog(t, NewMemFS(), Options{Sync: SyncNever, SegmentSize: 4096})
	var (
		mu   sync.Mutex
		lsns []LSN // after each record appended
		done atomic.Bool
		wg   sync.WaitGroup
	)
	appended := func() []LSN {
		mu.Lock()
		defer mu.Unlock()
		return lsns
	}
	wg.Go(func() {
		defer done.Store(true)
		for i := range total {
			lsn, _, err := l.Append(record(i))
			if err == nil && i%10 == 0 {
				err = l.WaitWritten(t.Context(), lsn)
			}
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			lsns = append(lsns, lsn)
			mu.Unlock()
		}
	})
	var scans [2]int
	for reader := range scans {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(reader), 7))
			for !done.Load() || scans[reader] < 5 {
				scans[reader]++
				before := appended()
				var upto LSN
				want := len(before)
				if reader == 0 && len(before) > 0 {
					i := rng.IntN(len(before))
					upto, want = before[i], i+1
				}
				r, err := scan(t.Context(), l, 1, upto)
				n, ok := prefix(r)
				switch {
				case err != nil:
					t.Error(err)
				case !ok:
					t.Errorf("reader %d: record %d is not in its place", reader, n)
				case upto != 0 && n != want, n < want:
					t.Errorf("reader %d: %d records up to %d, want %d", reader, n, upto, want)
				}
				if t.Failed() {
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("scans: %v", scans)
	got, err := scan(t.Context(), l, 1, 0)
	require.NoError(t, err)
	requireRecords(t, got, total)
	require.Greater(t, got.segs[total-1], uint64(50), "read over many segments")
	require.NoError(t, l.Close())
}

// scanFor runs Scan on a goroutine of its own, and returns where its error goes; r has what it
// handed on once the error is received.
func scanFor(ctx context.Context, l *Log, upto LSN, r *replayed) <-chan error {
	c := make(chan error, 1)
	go func() { c <- l.Scan(ctx, 1, upto, r.scanned) }()
	return c
}

// TestScanStalled: on a log stalled by a full disk, Scan reads what was written at once; a Scan
// up to a record the stall holds waits for it, until its ctx ends (and returns ctx.Err()) or
// the log resumes and writes it. A ctx done already fails Scan even when nothing needs waiting.
func TestScanStalled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := openStallLog(t, Options{Sync: SyncAlways, SegmentSize: 1024})
		_, lsns := appendEach(t, l.Log, 0, 20)
		l.mem.Capacity(l.mem.Used())
		held, _, err := l.Append(record(20))
		require.NoError(t, err)
		time.Sleep(time.Millisecond) // the flusher
		synctest.Wait()
		require.ErrorIs(t, l.Err(), ErrStalled)

		r, err := scan(t.Context(), l.Log, 1, lsns[19])
		require.NoError(t, err)
		requireRecords(t, r, 20)

		ctx, cancel := context.WithCancel(t.Context())
		var waiting replayed
		c := scanFor(ctx, l.Log, held, &waiting)
		synctest.Wait()
		requirePending(t, c, "the record is held by the stall")
		cancel()
		require.Equal(t, context.Canceled, <-c, "ctx.Err(), unwrapped")
		require.Empty(t, waiting.recs, "nothing read before upto is written")

		ctx, cancel = context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		require.Equal(t, context.DeadlineExceeded, l.Scan(ctx, 1, held, waiting.scanned))
		require.Empty(t, waiting.recs)

		c = scanFor(t.Context(), l.Log, held, &waiting)
		synctest.Wait()
		requirePending(t, c, "still no space")
		l.mem.Capacity(-1)
		require.NoError(t, <-c, "the retry wrote it")
		requireRecords(t, &waiting, 21)

		ctx, cancel = context.WithCancel(t.Context())
		_, err = scan(ctx, l.Log, 1, lsns[0])
		require.NoError(t, err)
		cancel()
		_, err = scan(ctx, l.Log, 1, lsns[0])
		require.Equal(t, context.Canceled, err, "a ctx done already fails it")
		require.NoError(t, l.Close())
	})
}

// TestScanReleased: a segment below what ReleaseBelow released is refused with ErrReleased,
// before and after it is removed; the segments after are read. A segment released while Scan
// reads it is read to its end, and the next one, released too, refused.
func TestScanReleased(t *testing.T) {
	l, _, _ := openLog(t, NewMemFS(), Options{Sync: SyncNever, SegmentSize: 1024})
	segs, _ := appendEach(t, l, 0, 200)
	require.Greater(t, segs[len(segs)-1], uint64(8))
	l.ReleaseBelow(3)
	for _, seg := range []uint64{0, 1, 2} {
		_, err := scan(t.Context(), l, seg, 0)
		require.ErrorIs(t, err, ErrReleased, "segment %d, not removed yet", seg)
		require.ErrorContains(t, err, segmentName(seg))
	}
	require.NoError(t, l.Sync())
	_, err := scan(t.Context(), l, 2, 0)
	require.ErrorIs(t, err, ErrReleased, "removed")
	require.ErrorContains(t, err, segmentName(2))
	first := 0
	for segs[first] < 3 {
		first++
	}
	r := scanSegment(t, l, 3)
	require.NotEmpty(t, r.recs)
	require.Equal(t, record(first), r.recs[0], "segment 3 is read from its first record")

	var got replayed
	err = l.Scan(t.Context(), 3, 0, func(seg uint64, rec []byte) bool {
		if len(got.recs) == 0 {
			l.ReleaseBelow(6)
			require.NoError(t, l.Sync()) // removes segments 3 to 5, the one being read too
		}
		return got.scanned(seg, rec)
	})
	require.ErrorIs(t, err, ErrReleased)
	require.ErrorContains(t, err, segmentName(4))
	require.Equal(t, r.recs, got.recs, "segment 3 read to its end")
	require.NoError(t, l.Close())
}

// TestScanClosedOrFailed: after Close, Scan returns ErrClosed, also when Close comes while it
// reads (at the next segment); once the log failed, the failure.
func TestScanClosedOrFailed(t *testing.T) {
	fs := NewMemFS()
	l, _, _ := openLog(t, fs, Options{Sync: SyncNever, SegmentSize: 1024})
	segs, lsns := appendEach(t, l, 0, 50)
	require.Greater(t, segs[len(segs)-1], uint64(2))
	first := 0 // the records of segment 1
	for segs[first] == 1 {
		first++
	}
	var got replayed
	err := l.Scan(t.Context(), 1, 0, func(seg uint64, rec []byte) bool {
		if len(got.recs) == 0 {
			require.NoError(t, l.Close())
		}
		return got.scanned(seg, rec)
	})
	require.ErrorIs(t, err, ErrClosed)
	requireRecords(t, &got, first) // the segment under way is read to its end
	_, err = scan(t.Context(), l, 1, lsns[0])
	require.ErrorIs(t, err, ErrClosed)

	l, _, _ = openLog(t, fs, Options{Sync: SyncAlways})
	fs.FailSync(0, errInjected, KeepUnsynced)
	lsn, _, err := l.Append(record(50))
	require.NoError(t, err)
	require.ErrorIs(t, l.Wait(t.Context(), lsn), ErrFailed)
	_, err = scan(t.Context(), l, 1, lsn) // written, not synced
	require.ErrorIs(t, err, ErrFailed)
	require.ErrorIs(t, err, errInjected)
	require.ErrorIs(t, l.Close(), ErrFailed)
}

// batchOffsets returns the offsets of the batches of a segment's data, and how many records
// each holds.
func batchOffsets(t *testing.T, data []byte, seg uint64) (offs []int64, recs []int) {
	t.Helper()
	for off := int64(headerSize); off < int64(len(data)); {
		b, ok := batchAt(data, off, seg)
		require.True(t, ok, "segment %d offset %d", seg, off)
		offs, recs = append(offs, off), append(recs, b.n)
		off = b.next
	}
	return offs, recs
}

// TestScanCorrupt: damage Scan reads stops it with ErrCorrupt, naming the file and the offset,
// after the records before it: a flipped byte in a batch, in a header, a segment cut short
// where a batch ends (its seal gone), a segment file gone.
func TestScanCorrupt(t *testing.T) {
	src := t.TempDir()
	l, _, _ := openLog(t, OSFS{Dir: src}, Options{Sync: SyncNever, SegmentSize: 2048})
	segs, _ := appendEach(t, l, 0, 100)
	require.Greater(t, segs[len(segs)-1], uint64(4))
	require.NoError(t, l.Close())
	before, in2 := 0, 0 // the records of segment 1, of segment 2
	for _, seg := range segs {
		switch seg {
		case 1:
			before++
		case 2:
			in2++
		}
	}
	data, err := os.ReadFile(filepath.Join(src, segmentName(2)))
	require.NoError(t, err)
	offs, recs := batchOffsets(t, data, 2)
	require.Greater(t, len(offs), 3)

	for _, tc := range []struct {
		name   string
		damage func(fs OSFS)
		off    int64 // where the error says it is
		recs   int   // the records handed on before it
	}{
		{"flipped byte", func(fs OSFS) { corrupt(t, fs, 2, offs[1]+frameSize+1) }, offs[1], before + recs[0]},
		{"header", func(fs OSFS) { corrupt(t, fs, 2, 20) }, 0, before},
		{"cut short", func(fs OSFS) {
			editFile(t, filepath.Join(fs.Dir, segmentName(2)), func(b []byte) []byte { return b[:offs[len(offs)-1]] })
		}, offs[len(offs)-1], before + in2},
		{"missing", func(fs OSFS) { require.NoError(t, os.Remove(filepath.Join(fs.Dir, segmentName(2)))) }, -1, before},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := OSFS{Dir: copyDir(t, src)}
			// Opened before the damage: Open would refuse it.
			l, _, _ := openLog(t, fs, Options{Sync: SyncNever, SegmentSize: 2048})
			tc.damage(fs)
			r, err := scan(t.Context(), l, 1, 0)
			require.ErrorIs(t, err, ErrCorrupt)
			require.ErrorContains(t, err, segmentName(2))
			if tc.off >= 0 {
				require.ErrorContains(t, err, fmt.Sprintf("offset %d:", tc.off))
			}
			requireRecords(t, r, tc.recs)
			require.NoError(t, l.Close())
		})
	}
}

// TestScanSalvaged: a log that Open salvaged (a bad batch, a bad header, a segment cut short
// where its seal was, a missing segment skipped) is read as Open read it, the records appended
// since after; a Scan from the missing segment starts at the next.
func TestScanSalvaged(t *testing.T) {
	fs := OSFS{Dir: t.TempDir()}
	opts := Options{Sync: SyncNever, SegmentSize: 2048}
	l, _, _ := openLog(t, fs, opts)
	segs, _ := appendEach(t, l, 0, 150)
	require.NoError(t, l.Close())
	require.Greater(t, segs[len(segs)-1], uint64(8))
	corrupt(t, fs, 2, headerSize+frameSize+1)
	corrupt(t, fs, 4, 20)
	data, err := os.ReadFile(filepath.Join(fs.Dir, segmentName(5)))
	require.NoError(t, err)
	offs, _ := batchOffsets(t, data, 5)
	require.NoError(t, os.WriteFile(filepath.Join(fs.Dir, segmentName(5)), data[:offs[len(offs)-1]], 0o644))
	require.NoError(t, os.Remove(filepath.Join(fs.Dir, segmentName(7))))

	opts.Salvage = true
	l, r, rec := openLog(t, fs, opts)
	require.Len(t, rec.Skipped, 4, "%+v", rec.Skipped)
	requireInOrder(t, r)
	require.Less(t, len(r.recs), 150)
	_, err = scan(t.Context(), l, 1, 0)
	require.NoError(t, err, "nothing appended since Open: what Open read")
	appendAll(t, l, 150, 200, 4)

	got, err := scan(t.Context(), l, 1, 0)
	require.NoError(t, err)
	n := len(r.recs)
	require.Equal(t, r.segs, got.segs[:n])
	require.Equal(t, r.recs, got.recs[:n])
	require.Len(t, got.recs, n+50)
	for i, rec := range got.recs[n:] {
		require.Equal(t, record(150+i), rec)
	}

	got, err = scan(t.Context(), l, 7, 0)
	require.NoError(t, err)
	from := 0
	for r.segs[from] < 8 {
		from++
	}
	require.Equal(t, r.recs[from:], got.recs[:n-from], "the missing segment is passed over")
	require.NoError(t, l.Close())
}

// TestScanReadError: an I/O error reading a segment stops Scan with it, wrapped and naming the
// file, and no ErrCorrupt; the next Scan reads on.
func TestScanReadError(t *testing.T) {
	fs := NewMemFS()
	l, _, _ := openLog(t, fs, Options{Sync: SyncNever, SegmentSize: 1024})
	segs, _ := appendEach(t, l, 0, 60)
	for _, after := range []int{0, 1, 2, 5} {
		fs.FailRead(after, errInjected)
		r, err := scan(t.Context(), l, 1, 0)
		require.ErrorIs(t, err, errInjected, "the read %d", after+1)
		require.NotErrorIs(t, err, ErrCorrupt)
		require.ErrorContains(t, err, ".wal")
		n, ok := prefix(r)
		require.True(t, ok)
		require.Less(t, n, len(segs))
	}
	r, err := scan(t.Context(), l, 1, 0)
	require.NoError(t, err)
	requireRecords(t, r, len(segs))
	require.NoError(t, l.Close())
}

// TestScanReads: Scan opens each segment once, reads it readAhead bytes at a time, and of the
// segment after one read alone (stopped at its first record), only its header and first batch,
// and the next batch's frame.
func TestScanReads(t *testing.T) {
	mem, read := NewMemFS(), new(readStats)
	l, _, _ := openLog(t, countingFS{FS: mem, syncs: new(atomic.Int64), read: read}, Options{Sync: SyncNever})
	appendAll(t, l, 0, 12000, 20)
	require.Greater(t, l.fileSeg, uint64(3))
	size := int64(len(mem.Contents(segmentName(1))))
	data := mem.Contents(segmentName(2))
	offs, _ := batchOffsets(t, data, 2)
	firstBatch := offs[1] - offs[0]

	read.opens.Store(0)
	read.reads.Store(0)
	read.bytes.Store(0)
	r := scanSegment(t, l, 1)
	require.NotEmpty(t, r.recs)
	require.EqualValues(t, 2, read.opens.Load(), "segment 1, and 2 for its first record")
	require.Equal(t, size+headerSize+firstBatch+frameSize, read.bytes.Load(), "segment 1 whole, and the start of 2")
	// Two reads at the start of each segment (its header, its first batch), then one per
	// readAhead bytes, less the part of a batch a read ends in, which the next one reads again.
	require.LessOrEqual(t, read.reads.Load(), 2+size/(readAhead-4096)+1+2)

	read.opens.Store(0)
	_, err := scan(t.Context(), l, 1, 0)
	require.NoError(t, err)
	require.EqualValues(t, l.fileSeg, read.opens.Load(), "each segment once")
	require.NoError(t, l.Close())
}

// TestScanAllocs: Scan allocates per Scan and per segment, never per record.
func TestScanAllocs(t *testing.T) {
	l, _, _ := openLog(t, NewMemFS(), Options{Sync: SyncNever, SegmentSize: 1 << 20})
	appendAll(t, l, 0, 2000, 50)
	count := 0
	allocs := testing.AllocsPerRun(20, func() {
		count = 0
		if err := l.Scan(t.Context(), 1, 0, func(uint64, []byte) bool { count++; return true }); err != nil {
			t.Fatal(err)
		}
	})
	require.Equal(t, 2000, count)
	require.Less(t, allocs, 40.0, "2000 records in one segment")
	require.NoError(t, l.Close())
}

// BenchmarkScan: 64 MiB of 128-byte records, in segments of the default size on the real file
// system (in the page cache, as a log just written is), read back by Scan: MB/s.
func BenchmarkScan(b *testing.B) {
	const total = 64 << 20
	rec := bytes.Repeat([]byte{'x'}, 128)
	l, _, err := Open(OSFS{Dir: b.TempDir()}, Options{Sync: SyncNever}, func(uint64, []byte) error { return nil })
	require.NoError(b, err)
	batch := make([][]byte, 256)
	for i := range batch {
		batch[i] = rec
	}
	for range total / len(rec) / len(batch) {
		_, _, err := l.Append(batch...)
		require.NoError(b, err)
	}
	require.NoError(b, l.WaitWritten(b.Context(), 0))
	b.SetBytes(total)
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		if err := l.Scan(b.Context(), 1, 0, func(_ uint64, r []byte) bool { n += len(r); return true }); err != nil || n != total {
			b.Fatalf("Scan: %d bytes, %v", n, err)
		}
	}
	require.NoError(b, l.Close())
}

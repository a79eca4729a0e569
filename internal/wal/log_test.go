package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
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

// The log against the real file system: what it wrote comes back, in order, after a reopen; a
// torn tail is cut off; damage elsewhere is reported; concurrent writers share syncs.

// replayed is every record Open handed to replay, with its segment.
type replayed struct {
	segs []uint64
	recs [][]byte
}

func (r *replayed) add(seg uint64, rec []byte) error {
	r.segs = append(r.segs, seg)
	r.recs = append(r.recs, bytes.Clone(rec))
	return nil
}

// openLog opens the log in fs and returns it with what it replayed.
func openLog(t *testing.T, fs FS, opts Options) (*Log, *replayed, Recovery) {
	t.Helper()
	var r replayed
	l, rec, err := Open(fs, opts, r.add)
	require.NoError(t, err)
	return l, &r, rec
}

// record returns the i-th test record: its number, then some bytes of varying length.
func record(i int) []byte {
	return fmt.Appendf(nil, "record %d %s", i, bytes.Repeat([]byte{byte('a' + i%26)}, i%300))
}

// appendAll appends records from..to-1, in batches of up to batch, waiting for each batch.
func appendAll(t testing.TB, l *Log, from, to, batch int) {
	t.Helper()
	for i := from; i < to; {
		var recs [][]byte
		for ; i < to && len(recs) < batch; i++ {
			recs = append(recs, record(i))
		}
		lsn, _, err := l.Append(recs...)
		require.NoError(t, err)
		require.NoError(t, l.Wait(t.Context(), lsn))
	}
}

// appendEach appends records from..to-1 one at a time, waiting for each, and returns the
// segment each went to and the position after each.
func appendEach(t *testing.T, l *Log, from, to int) (segs []uint64, lsns []LSN) {
	t.Helper()
	for i := from; i < to; i++ {
		lsn, seg, err := l.Append(record(i))
		require.NoError(t, err)
		require.NoError(t, l.Wait(t.Context(), lsn))
		segs, lsns = append(segs, seg), append(lsns, lsn)
	}
	return segs, lsns
}

// crash stops l as a crash of the process does: what it wrote stays as it is, unsynced and
// unsealed, and nothing more is written.
func crash(t testing.TB, l *Log) {
	t.Helper()
	require.NoError(t, l.WaitWritten(context.Background(), 0))
	l.mu.Lock()
	l.shutLocked()
	l.mu.Unlock()
	l.timers.Wait()
	require.NoError(t, l.file.Close())
}

// requireRecords checks that r holds records 0..n-1 in order.
func requireRecords(t *testing.T, r *replayed, n int) {
	t.Helper()
	require.Len(t, r.recs, n)
	for i, rec := range r.recs {
		require.Equal(t, record(i), rec, "record %d", i)
	}
}

func TestLogRoundTrip(t *testing.T) {
	for _, mode := range []SyncMode{SyncAlways, SyncInterval, SyncNever} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			fs := OSFS{Dir: t.TempDir()}
			l, r, _ := openLog(t, fs, Options{Sync: mode})
			require.Empty(t, r.recs)
			appendAll(t, l, 0, 500, 7)
			require.NoError(t, l.Close())
			_, _, err := l.Append(record(0))
			require.ErrorIs(t, err, ErrClosed)

			l, r, rec := openLog(t, fs, Options{Sync: mode})
			requireRecords(t, r, 500)
			require.Empty(t, rec.Cut)
			appendAll(t, l, 500, 600, 3) // appends to the recovered last segment
			require.NoError(t, l.Close())
			_, r, _ = openLog(t, fs, Options{Sync: mode})
			requireRecords(t, r, 600)
		})
	}
}

func TestLogSegments(t *testing.T) {
	fs := OSFS{Dir: t.TempDir()}
	opts := Options{SegmentSize: 4096}
	l, _, _ := openLog(t, fs, opts)
	segs, _ := appendEach(t, l, 0, 400)
	require.NoError(t, l.Close())
	names, err := fs.List()
	require.NoError(t, err)
	require.Greater(t, len(names), 10, "segments of 4 KiB")
	for _, name := range names {
		info, err := os.Stat(filepath.Join(fs.Dir, name))
		require.NoError(t, err)
		require.LessOrEqual(t, info.Size(), int64(4096+400), "%s: a segment ends with the batch that passes its size", name)
	}

	l, r, _ := openLog(t, fs, opts)
	requireRecords(t, r, 400)
	require.Equal(t, segs, r.segs, "each record is replayed with the segment Append said")

	// Releasing the first segments removes them, and leaves the others readable; the last
	// segment never goes.
	l.ReleaseBelow(4)
	require.NoError(t, l.Sync())
	names, err = fs.List()
	require.NoError(t, err)
	require.NotContains(t, names, segmentName(1))
	require.NotContains(t, names, segmentName(3))
	require.Contains(t, names, segmentName(4))
	require.NoError(t, l.Close())
	l, r2, _ := openLog(t, fs, opts)
	first := 0
	for segs[first] < 4 {
		first++
	}
	require.Equal(t, r.recs[first:], r2.recs)
	l.ReleaseBelow(1 << 40)
	require.NoError(t, l.Sync())
	names, err = fs.List()
	require.NoError(t, err)
	require.Len(t, names, 1, "all but the last")
	require.Equal(t, segmentName(l.fileSeg), names[0])
	require.NoError(t, l.Close())
}

// blockingRemoveFS is a MemFS whose Remove, once armed, announces itself on entered and waits
// for leave.
type blockingRemoveFS struct {
	*MemFS
	armed          atomic.Bool
	entered, leave chan struct{}
}

func (fs *blockingRemoveFS) Remove(name string) error {
	if fs.armed.CompareAndSwap(true, false) {
		fs.entered <- struct{}{}
		<-fs.leave
	}
	return fs.MemFS.Remove(name)
}

// Removing released segments is not a writer's work: a publisher waiting for its record, under
// every policy, is confirmed while a removal (its fsyncs, its unlinks) is still in flight, and
// the removal finishes afterwards, within FlushDelay, or at Sync.
func TestLogRemovesBesideTheWriter(t *testing.T) {
	for _, mode := range []SyncMode{SyncAlways, SyncInterval, SyncNever} {
		t.Run(mode.String(), func(t *testing.T) {
			fs := &blockingRemoveFS{MemFS: NewMemFS(), entered: make(chan struct{}), leave: make(chan struct{})}
			l, _, _ := openLog(t, fs, Options{Sync: mode, SegmentSize: 4096})
			appendAll(t, l, 0, 200, 8)
			names, err := fs.List()
			require.NoError(t, err)
			require.Greater(t, len(names), 3)

			fs.armed.Store(true)
			l.ReleaseBelow(3)
			<-fs.entered // the remover is in Remove, and stays there
			lsn, _, err := l.Append(record(200))
			require.NoError(t, err)
			require.NoError(t, l.Wait(t.Context(), lsn), "confirmed while the removal is blocked")
			close(fs.leave)

			require.NoError(t, l.Sync())
			names, err = fs.List()
			require.NoError(t, err)
			require.NotContains(t, names, segmentName(1))
			require.NotContains(t, names, segmentName(2))
			require.Contains(t, names, segmentName(3))
			require.NoError(t, l.Close())

			_, r, _ := openLog(t, fs.MemFS, Options{Sync: mode, SegmentSize: 4096})
			require.NotEmpty(t, r.recs)
			require.Equal(t, record(200), r.recs[len(r.recs)-1])
		})
	}
}

// countingFS counts the syncs of its files, and calls hook (if set) before each; and counts
// the writes tried, failed or not, if writes is set, and the opens and reads if read is.
type countingFS struct {
	FS
	syncs  *atomic.Int64
	hook   func()
	writes *atomic.Int64
	read   *readStats
}

// readStats counts the files a countingFS opened, their reads and the bytes read.
type readStats struct{ opens, reads, bytes atomic.Int64 }

func (fs countingFS) Create(name string) (File, error) {
	f, err := fs.FS.Create(name)
	return countingFile{f, fs}, err
}

func (fs countingFS) Open(name string) (File, error) {
	f, err := fs.FS.Open(name)
	if fs.read != nil {
		fs.read.opens.Add(1)
	}
	return countingFile{f, fs}, err
}

type countingFile struct {
	File
	fs countingFS
}

func (f countingFile) Write(p []byte) (int, error) {
	if f.fs.writes != nil {
		f.fs.writes.Add(1)
	}
	return f.File.Write(p)
}

func (f countingFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	if f.fs.read != nil {
		f.fs.read.reads.Add(1)
		f.fs.read.bytes.Add(int64(n))
	}
	return n, err
}

func (f countingFile) Sync() error {
	f.fs.syncs.Add(1)
	if f.fs.hook != nil {
		f.fs.hook()
	}
	return f.File.Sync()
}

// TestSyncBesideWrites: SyncInterval's fsync does not hold up writes: a record appended while
// the syncer's fsync is in flight (slow disk) is written, and its waiter told, at once.
func TestSyncBesideWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var syncs atomic.Int64
		entered, release := make(chan struct{}), make(chan struct{})
		var blocking atomic.Bool
		fs := countingFS{FS: NewMemFS(), syncs: &syncs}
		fs.hook = func() {
			if blocking.CompareAndSwap(true, false) {
				close(entered)
				<-release
			}
		}
		l, _, _ := openLog(t, fs, Options{Sync: SyncInterval, Interval: 10 * time.Millisecond})
		lsn, _, err := l.Append(record(1))
		require.NoError(t, err)
		require.NoError(t, l.Wait(t.Context(), lsn))
		blocking.Store(true)
		<-entered // the syncer's fsync, stuck on the disk
		lsn, _, err = l.Append(record(2))
		require.NoError(t, err)
		require.NoError(t, l.Wait(t.Context(), lsn), "written beside the fsync")
		close(release)
		require.NoError(t, l.Close())
	})
}

// TestLogFlushBesideSync: under SyncAlways, a record nobody waits for (an acknowledgement) is
// written FlushDelay after it was appended even while a waiter's fsync is stuck on the disk:
// the flush waits for the write in progress, if any, never for an fsync. (It waited for the
// writer's write and fsync both: acks were lost up to 23.5 ms before a SIGKILL.)
func TestLogFlushBesideSync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var syncs atomic.Int64
		entered, release := make(chan struct{}), make(chan struct{})
		var blocking atomic.Bool
		mem := NewMemFS()
		fs := countingFS{FS: mem, syncs: &syncs}
		fs.hook = func() {
			if blocking.CompareAndSwap(true, false) {
				close(entered)
				<-release
			}
		}
		l, _, _ := openLog(t, fs, Options{Sync: SyncAlways, FlushDelay: time.Millisecond})
		appendAll(t, l, 0, 1, 1)
		blocking.Store(true)
		lsn, _, err := l.Append(record(1))
		require.NoError(t, err)
		confirmed := make(chan error, 1)
		go func() { confirmed <- l.Wait(t.Context(), lsn) }()
		<-entered // the publisher's fsync, stuck on the disk
		_, _, err = l.Append(record(2))
		require.NoError(t, err)
		time.Sleep(time.Millisecond)
		synctest.Wait()
		require.True(t, bytes.Contains(mem.Contents(segmentName(1)), record(2)),
			"written FlushDelay after it was appended, beside the fsync in flight")
		select {
		case err := <-confirmed:
			t.Fatalf("Wait = %v before its fsync returned", err)
		default:
		}
		close(release)
		require.NoError(t, <-confirmed)
		require.NoError(t, l.Close())
		_, r, _ := openLog(t, mem, Options{})
		requireRecords(t, r, 3)
	})
}

func TestLogGroupCommit(t *testing.T) {
	var syncs atomic.Int64
	fs := countingFS{FS: OSFS{Dir: t.TempDir()}, syncs: &syncs}
	l, _, _ := openLog(t, fs, Options{Sync: SyncAlways})
	const writers, each = 64, 20
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				lsn, _, err := l.Append(record(w*each + i))
				require.NoError(t, err)
				require.NoError(t, l.Wait(t.Context(), lsn))
			}
		})
	}
	wg.Wait()
	require.NoError(t, l.Close())
	t.Logf("%d records, %d syncs", writers*each, syncs.Load())
	require.Less(t, syncs.Load(), int64(writers*each), "concurrent writers share syncs")

	_, r, _ := openLog(t, fs, Options{})
	require.Len(t, r.recs, writers*each)
	seen := map[string]bool{}
	for _, rec := range r.recs {
		seen[string(rec)] = true
	}
	for i := range writers * each {
		require.True(t, seen[string(record(i))], "record %d", i)
	}
}

// closeSyncs is how many syncs Close does after writes: the last segment, its seal (Close
// seals it), the header of the empty segment after it.
const closeSyncs = 3

func TestLogSyncInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var syncs atomic.Int64
		fs := countingFS{FS: OSFS{Dir: t.TempDir()}, syncs: &syncs}
		l, _, _ := openLog(t, fs, Options{Sync: SyncInterval, Interval: time.Second})
		base := syncs.Load()
		appendAll(t, l, 0, 10, 1)
		require.Equal(t, base, syncs.Load(), "written, not yet synced")
		time.Sleep(time.Second)
		synctest.Wait()
		require.Equal(t, base+1, syncs.Load(), "synced once, a second after the first write")
		time.Sleep(time.Hour)
		require.Equal(t, base+1, syncs.Load(), "idle: no timer runs")
		appendAll(t, l, 10, 11, 1)
		require.NoError(t, l.Close())
		require.Equal(t, base+1+closeSyncs, syncs.Load(), "Close syncs")
	})
}

func TestLogSyncNever(t *testing.T) {
	var syncs atomic.Int64
	fs := countingFS{FS: OSFS{Dir: t.TempDir()}, syncs: &syncs}
	l, _, _ := openLog(t, fs, Options{Sync: SyncNever, SegmentSize: 1 << 20})
	base := syncs.Load()
	appendAll(t, l, 0, 100, 1)
	require.Equal(t, base, syncs.Load())
	require.NoError(t, l.Close())
	require.Equal(t, base+closeSyncs, syncs.Load(), "Close syncs")
}

// TestLogRandomBatches appends random records in random batches from a few writers and
// checks, after a reopen, that each writer's records come back in its order.
func TestLogRandomBatches(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	fs := OSFS{Dir: t.TempDir()}
	l, _, _ := openLog(t, fs, Options{SegmentSize: 1 << 14})
	var want [][]byte
	for i := range 2000 {
		n := 1 + rng.IntN(5)
		var recs [][]byte
		for j := range n {
			rec := make([]byte, rng.IntN(700))
			for k := range rec {
				rec[k] = byte(rng.Uint32())
			}
			rec = append(rec, byte(i), byte(j))
			recs = append(recs, rec)
		}
		want = append(want, recs...)
		lsn, _, err := l.Append(recs...)
		require.NoError(t, err)
		if rng.IntN(3) == 0 {
			require.NoError(t, l.Wait(t.Context(), lsn))
		}
	}
	require.NoError(t, l.Close())
	_, r, _ := openLog(t, fs, Options{})
	require.Equal(t, len(want), len(r.recs))
	for i := range want {
		require.Equal(t, want[i], r.recs[i], "record %d", i)
	}
}

// TestLogFlushDelay: records nobody waits for (acknowledgements) are written FlushDelay after
// they were appended, and synced then under SyncAlways.
func TestLogFlushDelay(t *testing.T) {
	for _, mode := range []SyncMode{SyncAlways, SyncNever} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var syncs atomic.Int64
				dir := t.TempDir()
				fs := countingFS{FS: OSFS{Dir: dir}, syncs: &syncs}
				l, _, _ := openLog(t, fs, Options{Sync: mode, FlushDelay: 5 * time.Millisecond})
				size := func() int64 {
					info, err := os.Stat(filepath.Join(dir, segmentName(1)))
					require.NoError(t, err)
					return info.Size()
				}
				before, base := size(), syncs.Load()
				_, _, err := l.Append(record(1), record(2))
				require.NoError(t, err)
				time.Sleep(4 * time.Millisecond)
				synctest.Wait()
				require.Equal(t, before, size(), "not yet")
				time.Sleep(time.Millisecond)
				synctest.Wait()
				require.Greater(t, size(), before, "written after FlushDelay")
				wantSyncs := base
				if mode == SyncAlways {
					wantSyncs++
				}
				require.Equal(t, wantSyncs, syncs.Load())
				require.NoError(t, l.Close())
				_, r, _ := openLog(t, fs, Options{})
				require.Equal(t, [][]byte{record(1), record(2)}, r.recs)
			})
		})
	}
}

// Crashes and faults, on MemFS.

// crashRun appends records one batch at a time and remembers which were confirmed (their Wait
// returned nil).
type crashRun struct {
	l         *Log
	appended  int // records appended: record(0) … record(appended-1)
	confirmed int // records 0 … confirmed-1 were confirmed
}

func (c *crashRun) batch(t *testing.T, rng *rand.Rand) {
	n := 1 + rng.IntN(4)
	var recs [][]byte
	for range n {
		recs = append(recs, record(c.appended))
		c.appended++
	}
	lsn, _, err := c.l.Append(recs...)
	require.NoError(t, err)
	if rng.IntN(4) > 0 { // some batches nobody waits for, like acks
		require.NoError(t, c.l.Wait(t.Context(), lsn))
		c.confirmed = c.appended
	}
}

// TestLogCrashes: after any crash, the log opens (a torn tail is cut, never refused), and what
// it holds is a prefix of what was appended, in order, with nothing invented; it holds every
// confirmed record when the mode promised it: SyncAlways against a power loss, every mode
// against a process crash.
func TestLogCrashes(t *testing.T) {
	for _, mode := range []SyncMode{SyncAlways, SyncInterval, SyncNever} {
		for _, crash := range []CrashMode{KeepSynced, KeepPrefix, TornTail, KeepWritten} {
			t.Run(fmt.Sprint(mode, "/", crash), func(t *testing.T) {
				for seed := range uint64(40) {
					rng := rand.New(rand.NewPCG(seed, 7))
					fs := NewMemFS()
					opts := Options{Sync: mode, SegmentSize: 1 << 12, Interval: time.Hour, FlushDelay: time.Hour}
					l, _, _ := openLog(t, fs, opts)
					run := &crashRun{l: l}
					for range 1 + rng.IntN(60) {
						run.batch(t, rng)
					}
					fs.Crash(crash, rng)
					l2, r, _ := openLog(t, fs, opts)
					require.LessOrEqual(t, len(r.recs), run.appended, "seed %d", seed)
					requireRecords(t, r, len(r.recs)) // a prefix, in order
					if mode == SyncAlways || crash == KeepWritten {
						require.GreaterOrEqual(t, len(r.recs), run.confirmed, "seed %d: a confirmed record is lost", seed)
					}
					// The log goes on from what it recovered.
					lsn, _, err := l2.Append(record(len(r.recs)))
					require.NoError(t, err)
					require.NoError(t, l2.Wait(t.Context(), lsn))
					require.NoError(t, l2.Close())
					_, r, rec := openLog(t, fs, opts)
					require.Empty(t, rec.Cut)
					requireRecords(t, r, len(r.recs))
				}
			})
		}
	}
}

// TestLogSyncIntervalLoss: under SyncInterval, a power loss loses at most what was confirmed in
// the last interval.
func TestLogSyncIntervalLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(3, 4))
		fs := NewMemFS()
		opts := Options{Sync: SyncInterval, Interval: 100 * time.Millisecond}
		l, _, _ := openLog(t, fs, opts)
		run := &crashRun{l: l}
		var confirmedAt []time.Time // when each record was confirmed
		for range 200 {
			run.batch(t, rng)
			for len(confirmedAt) < run.confirmed {
				confirmedAt = append(confirmedAt, time.Now())
			}
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
			synctest.Wait()
		}
		crashed := time.Now()
		fs.Crash(KeepSynced, rng)
		_, r, _ := openLog(t, fs, opts)
		requireRecords(t, r, len(r.recs))
		for i, at := range confirmedAt {
			if crashed.Sub(at) > opts.Interval {
				require.Greater(t, len(r.recs), i, "record %d, confirmed %v before the crash, is lost", i, crashed.Sub(at))
			}
		}
		t.Logf("%d confirmed, %d recovered", run.confirmed, len(r.recs))
	})
}

// TestLogFaults: a failed sync, or a write that failed other than for want of space, fails its
// waiters and the log (nothing is confirmed that did not reach the file), Close says so, and a
// reopen recovers what was confirmed. (A full disk stalls the log instead: stall_test.go.)
func TestLogFaults(t *testing.T) {
	boom := errors.New("injected")
	for _, tc := range []struct {
		name   string
		inject func(fs *MemFS, rng *rand.Rand)
		crash  CrashMode
	}{
		{"a failed write", func(fs *MemFS, rng *rand.Rand) { fs.FailWrite(0, boom, rng) }, KeepWritten},
		{"a failed sync", func(fs *MemFS, rng *rand.Rand) { fs.FailSync(0, boom, KeepUnsynced) }, KeepSynced},
		{"a failed sync dropping pages", func(fs *MemFS, rng *rand.Rand) { fs.FailSync(0, boom, DropUnsynced) }, KeepSynced},
		// A sync that finds no space (delayed allocation) is a failed sync, not a stall: the
		// pages it could not write back may be gone.
		{"a sync finding no space", func(fs *MemFS, rng *rand.Rand) { fs.FailSync(0, ErrNoSpace, DropUnsynced) }, KeepSynced},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, 6))
			fs := NewMemFS()
			opts := Options{Sync: SyncAlways}
			l, _, _ := openLog(t, fs, opts)
			run := &crashRun{l: l}
			for range 20 {
				run.batch(t, rng)
			}
			require.NoError(t, l.Sync())
			tc.inject(fs, rng)
			lsn2, _, err := l.Append(record(run.appended))
			require.NoError(t, err)
			err = l.Wait(t.Context(), lsn2)
			require.ErrorIs(t, err, ErrFailed)
			_, _, err = l.Append(record(0))
			require.ErrorIs(t, err, ErrFailed, "the log fails closed")
			require.ErrorIs(t, l.Close(), ErrFailed)

			fs.Crash(tc.crash, rng)
			fs.Capacity(-1)
			l, r, _ := openLog(t, fs, opts)
			require.GreaterOrEqual(t, len(r.recs), run.confirmed)
			requireRecords(t, r, len(r.recs))
			require.NoError(t, l.Close())
		})
	}
}

// BenchmarkAppendWait: records of 128 bytes appended and waited for, one at a time per writer,
// by 1 or 64 concurrent writers, on the real file system, under each sync policy: what a durable
// broker's publishers see. Under SyncAlways the writers share fsyncs (group commit).
func BenchmarkAppendWait(b *testing.B) {
	rec := bytes.Repeat([]byte{'x'}, 128)
	for _, mode := range []SyncMode{SyncNever, SyncInterval, SyncAlways} {
		for _, writers := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/writers=%d", mode, writers), func(b *testing.B) {
				var syncs atomic.Int64
				l, _, err := Open(countingFS{FS: OSFS{Dir: b.TempDir()}, syncs: &syncs}, Options{Sync: mode}, func(uint64, []byte) error { return nil })
				require.NoError(b, err)
				b.SetParallelism((writers + 1) / 2)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						lsn, _, err := l.Append(rec)
						if err == nil {
							err = l.Wait(context.Background(), lsn)
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
				b.ReportMetric(float64(b.N)/float64(max(syncs.Load(), 1)), "records/sync")
				require.NoError(b, l.Close())
			})
		}
	}
}

func TestChecksumSeed(t *testing.T) {
	var seed [16]byte
	for i := range seed {
		seed[i] = byte(i * 37)
	}
	require.Equal(t, crc32.Checksum(seed[:], castagnoli), crc32Seed(&seed), "CRC-32C, as the library computes it")
}

// A process crash leaves the last segment's unsynced tail in the page cache. The next life opens
// it with dirty false, so when its first batch goes to a new segment, rotate closes the old one
// without syncing it: a power loss then tears a segment that is no longer the last, and Open
// refuses the log as corrupt.
func TestLogRotateAfterCrashUnsynced(t *testing.T) {
	opts := Options{Sync: SyncInterval, Interval: time.Hour, SegmentSize: 256}
	failures := 0
	for seed := range uint64(50) {
		fs := NewMemFS()
		l, _, _ := openLog(t, fs, opts)
		_, _, err := l.Append(make([]byte, 30))
		require.NoError(t, err)
		require.NoError(t, l.Sync()) // the header and a first batch are synced
		for range 5 {
			_, _, err := l.Append(make([]byte, 30))
			require.NoError(t, err)
			require.NoError(t, l.WaitWritten(t.Context(), 0))
		}
		fs.Crash(KeepWritten, nil) // kill -9
		l.Close()
		l, _, _ = openLog(t, fs, opts)
		// A batch too big for the last segment's room: it goes to a new segment.
		lsn, _, err := l.Append(make([]byte, 200))
		require.NoError(t, err)
		require.NoError(t, l.Wait(t.Context(), lsn))
		require.NoError(t, l.Sync())
		fs.Crash(TornTail, rand.New(rand.NewPCG(seed, 1))) // power loss
		l.Close()
		if _, _, err := Open(fs, opts, func(uint64, []byte) error { return nil }); err != nil {
			failures++
			if failures == 1 {
				t.Logf("seed %d: %v", seed, err)
			}
		}
	}
	require.Zero(t, failures, "opens refused as corrupt after a crash, a restart and a power loss")
}

// TestLogWaitAfterClose: a record Close wrote is confirmed to a late waiter, not refused as
// closed (a publisher told "closed" might publish it again); a later one is refused.
func TestLogWaitAfterClose(t *testing.T) {
	l, _, _ := openLog(t, NewMemFS(), Options{Sync: SyncAlways})
	lsn, _, err := l.Append(record(1))
	require.NoError(t, err)
	require.NoError(t, l.Close())
	require.NoError(t, l.Wait(t.Context(), lsn), "Close wrote and synced it")
	_, _, err = l.Append(record(2))
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, l.Wait(t.Context(), lsn+1), ErrClosed)
	l.ReleaseBelow(5) // arms nothing on a closed log
}

package wal

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// stallLog is a log on a MemFS whose writes are counted, and what its OnStall was told.
type stallLog struct {
	*Log
	mem    *MemFS
	writes *atomic.Int64

	mu   sync.Mutex
	told []error
}

func openStallLog(t *testing.T, opts Options) *stallLog {
	t.Helper()
	s := &stallLog{mem: NewMemFS(), writes: new(atomic.Int64)}
	opts.OnStall = func(err error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.told = append(s.told, err)
	}
	s.Log, _, _ = openLog(t, countingFS{FS: s.mem, syncs: new(atomic.Int64), writes: s.writes}, opts)
	return s
}

// heard returns what OnStall was told so far.
func (s *stallLog) heard() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.told...)
}

// requireCrashOpens checks that mem, crashed now in each of modes (with the disk's room back),
// opens without Salvage with nothing cut or skipped, and holds records 0 to n-1.
func requireCrashOpens(t *testing.T, mem *MemFS, n int, modes ...CrashMode) {
	t.Helper()
	for _, mode := range modes {
		fs := mem.Clone()
		fs.Crash(mode, nil)
		fs.Capacity(-1)
		l, r, rec := openLog(t, fs, Options{})
		require.Empty(t, rec.Cut, mode)
		require.Empty(t, rec.Skipped, mode)
		requireRecords(t, r, n)
		require.NoError(t, l.Close())
	}
}

// waitFor waits for lsn on a goroutine of its own, and returns where its result goes.
func waitFor(ctx context.Context, l *Log, lsn LSN) <-chan error {
	c := make(chan error, 1)
	go func() { c <- l.Wait(ctx, lsn) }()
	return c
}

// requirePending checks that a waiter has not returned.
func requirePending(t *testing.T, c <-chan error, msg string) {
	t.Helper()
	select {
	case err := <-c:
		t.Fatalf("%s: Wait returned %v", msg, err)
	default:
	}
}

// TestLogStallResumes: a write that finds no space stalls the log rather than failing it: the
// part of the batch that reached the file is cut off, its waiter waits (or returns its ctx's
// error), Err and Sync say so, appends go on; the log retries with a backoff of 10 ms doubling
// to 1 s, and once space comes back it writes what it kept, in order, confirms the waiters, and
// stops retrying. OnStall hears both.
func TestLogStallResumes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := openStallLog(t, Options{Sync: SyncAlways})
		appendAll(t, l.Log, 0, 10, 3)
		seg := segmentName(1)
		size := len(l.mem.Contents(seg))
		l.mem.Capacity(l.mem.Used() + 5) // the next batch's first 5 bytes fit

		lsn, _, err := l.Append(record(10))
		require.NoError(t, err)
		first := waitFor(t.Context(), l.Log, lsn)
		synctest.Wait()
		requirePending(t, first, "stalled")
		written := l.Written()
		require.Less(t, written, lsn, "Written: not what the stall holds")
		require.ErrorIs(t, l.Err(), ErrStalled)
		require.ErrorIs(t, l.Err(), ErrNoSpace, "the cause is kept")
		require.Len(t, l.mem.Contents(seg), size, "the torn part of the batch is cut off")
		require.ErrorIs(t, l.Sync(), ErrStalled, "Sync does not wait out a stall")
		told := l.heard()
		require.Len(t, told, 1)
		require.ErrorIs(t, told[0], ErrNoSpace)

		lsn2, _, err := l.Append(record(11))
		require.NoError(t, err, "a stalled log takes appends")
		ctx, cancel := context.WithCancel(t.Context())
		second := waitFor(ctx, l.Log, lsn2)
		synctest.Wait()
		cancel()
		require.ErrorIs(t, <-second, context.Canceled, "a waiter's ctx ends its wait")

		tries := func(d time.Duration) int64 {
			before := l.writes.Load()
			time.Sleep(d)
			synctest.Wait()
			return l.writes.Load() - before
		}
		for _, d := range []time.Duration{10, 20, 40, 80, 160, 320, 640} {
			require.Zero(t, tries(d*time.Millisecond-time.Nanosecond), "no retry before %v", d*time.Millisecond)
			require.EqualValues(t, 1, tries(time.Nanosecond), "a retry after %v", d*time.Millisecond)
		}
		require.EqualValues(t, 1, tries(time.Second), "then once a second")
		requirePending(t, first, "still no space")

		l.mem.Capacity(-1)
		require.EqualValues(t, 1, tries(time.Second), "the retry that finds space")
		require.NoError(t, <-first, "confirmed once written, and synced")
		require.GreaterOrEqual(t, l.Written(), lsn, "Written moves on with the write")
		require.NoError(t, l.Err())
		require.NoError(t, l.Wait(t.Context(), lsn2), "the record appended during the stall is written too")
		told = l.heard()
		require.Len(t, told, 2)
		require.NoError(t, told[1], "told it resumed")
		require.Zero(t, tries(time.Hour), "no retry once resumed, nor any write with nothing appended")

		require.NoError(t, l.Close())
		_, r, rec := openLog(t, l.mem, Options{})
		requireRecords(t, r, 12)
		require.Empty(t, rec.Cut, "nothing torn was left")
	})
}

// TestLogStallNewSegment: moving to a new segment, the log creates it (header) and then seals
// the one before; if either finds no space, the new segment is removed again and the one before
// is left as it was, unsealed and the last (the seal's torn part cut off), so that a crash now
// opens as if the move had not begun; the move starts again when the log resumes.
func TestLogStallNewSegment(t *testing.T) {
	for _, tc := range []struct {
		name string
		room int64 // bytes free when the move begins
	}{
		{"the header", 4},
		{"the seal", headerSize + 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := openStallLog(t, Options{Sync: SyncNever, SegmentSize: 512})
				appendAll(t, l.Log, 0, 3, 1)
				before := l.mem.Contents(segmentName(1))
				l.mem.Capacity(l.mem.Used() + tc.room)
				lsn, _, err := l.Append(make([]byte, 500))
				require.NoError(t, err)
				done := waitFor(t.Context(), l.Log, lsn)
				synctest.Wait()
				requirePending(t, done, "stalled")
				require.ErrorIs(t, l.Err(), ErrStalled)
				names, err := l.mem.List()
				require.NoError(t, err)
				require.Equal(t, []string{segmentName(1)}, names, "the segment that could not start is gone")
				require.Equal(t, before, l.mem.Contents(segmentName(1)), "the segment left is as it was: no seal, nothing torn")

				requireCrashOpens(t, l.mem, 3, KeepWritten)

				l.mem.Capacity(-1)
				time.Sleep(10 * time.Millisecond)
				synctest.Wait()
				require.NoError(t, <-done)
				require.NoError(t, l.Close())
				_, r, rec := openLog(t, l.mem, Options{})
				require.Empty(t, rec.Cut)
				require.Len(t, r.recs, 4)
				require.Equal(t, []uint64{1, 1, 1, 2}, r.segs)
			})
		})
	}
}

// TestLogRotationSyncNoSpace: the fsync a move to a new segment makes of the segment it leaves
// fails the log when it finds no space, as every failed fsync does: the pages it could not
// write back may be gone, so it is no stall to wait out. (It stalled the log, whose retry then
// synced what was left and confirmed records the failed fsync had dropped.)
func TestLogRotationSyncNoSpace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := openStallLog(t, Options{Sync: SyncNever, SegmentSize: 512})
		appendAll(t, l.Log, 0, 3, 1)
		l.mem.FailSync(0, ErrNoSpace, DropUnsynced)
		lsn, _, err := l.Append(make([]byte, 500))
		require.NoError(t, err)
		done := waitFor(t.Context(), l.Log, lsn)
		time.Sleep(time.Second)
		synctest.Wait()
		err = <-done
		require.ErrorIs(t, err, ErrFailed)
		require.ErrorIs(t, err, ErrNoSpace)
		require.False(t, errors.Is(l.Err(), ErrStalled), "a failure, not a stall")
		require.ErrorIs(t, l.Close(), ErrFailed)
	})
}

// TestLogCloseStalled: Close does not wait for space: it tries once more, and either writes
// what the stall kept (space came back) or fails the log (it did not): the waiters get the
// failure, Close returns it, and what was confirmed before is all a reopen finds, with nothing
// torn.
func TestLogCloseStalled(t *testing.T) {
	for _, space := range []bool{true, false} {
		t.Run(map[bool]string{true: "space back", false: "still full"}[space], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := openStallLog(t, Options{Sync: SyncAlways})
				appendAll(t, l.Log, 0, 5, 1)
				l.mem.Capacity(l.mem.Used() + 3)
				lsn, _, err := l.Append(record(5))
				require.NoError(t, err)
				done := waitFor(t.Context(), l.Log, lsn)
				synctest.Wait()
				requirePending(t, done, "stalled")
				if space {
					l.mem.Capacity(-1)
					require.NoError(t, l.Close(), "the last try wrote it")
					require.NoError(t, <-done)
				} else {
					err := l.Close()
					require.ErrorIs(t, err, ErrFailed, "Close reports what it could not write")
					require.ErrorIs(t, err, ErrNoSpace)
					err = <-done
					require.ErrorIs(t, err, ErrFailed, "the waiter is told, not left waiting")
					require.False(t, errors.Is(err, ErrStalled), "a failure, not a stall")
					l.mem.Capacity(-1)
				}
				require.ErrorIs(t, l.Err(), map[bool]error{true: ErrClosed, false: ErrFailed}[space])
				_, r, rec := openLog(t, l.mem, Options{})
				require.Empty(t, rec.Cut)
				requireRecords(t, r, map[bool]int{true: 6, false: 5}[space])
			})
		})
	}
}

// TestLogCloseFull: everything is written and synced, and Close's seal (the empty segment's
// header, or the seal itself) finds no space: Close fails with the want of space, loses nothing,
// and leaves the log as a crash would, which opens whole without Salvage, the crash or not.
func TestLogCloseFull(t *testing.T) {
	for _, tc := range []struct {
		name string
		room int64
	}{
		{"the next header", 0},
		{"the seal", headerSize + 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := openStallLog(t, Options{Sync: SyncAlways})
				appendAll(t, l.Log, 0, 5, 1)
				l.mem.Capacity(l.mem.Used() + tc.room)
				err := l.Close()
				require.ErrorIs(t, err, ErrFailed)
				require.ErrorIs(t, err, ErrNoSpace)
				require.Len(t, l.heard(), 0, "no stall: nothing was left to write")
				names, err := l.mem.List()
				require.NoError(t, err)
				require.Equal(t, []string{segmentName(1)}, names, "the segment that could not start is gone")

				requireCrashOpens(t, l.mem, 5, KeepWritten, KeepSynced)
			})
		})
	}
}

// TestLogStallRelease: segments released go only after a synced start batch says the log
// starts after them; when that start batch finds no space, the log stalls and removes nothing
// (a crash then opens the whole log, none of it missing), and once it resumes the start batch is
// written and the segments go, with nothing asking for them again.
func TestLogStallRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := openStallLog(t, Options{Sync: SyncAlways, SegmentSize: 1024})
		segs, _ := appendEach(t, l.Log, 0, 80)
		last := segs[len(segs)-1]
		require.Greater(t, last, uint64(3))
		require.NoError(t, l.Sync())
		names, err := l.mem.List()
		require.NoError(t, err)

		l.mem.Capacity(l.mem.Used() + 5) // the start batch's first 5 bytes fit
		l.ReleaseBelow(3)
		time.Sleep(time.Millisecond) // the remover
		synctest.Wait()
		require.ErrorIs(t, l.Err(), ErrStalled, "the start batch found no space")
		after, err := l.mem.List()
		require.NoError(t, err)
		require.Equal(t, names, after, "nothing removed while its start batch is not written")
		require.ErrorIs(t, l.Sync(), ErrStalled, "Sync cannot remove them either, and says why")
		requireCrashOpens(t, l.mem, 80, KeepWritten, KeepSynced)

		l.mem.Capacity(-1)
		time.Sleep(time.Second)
		synctest.Wait()
		require.NoError(t, l.Err(), "resumed")
		after, err = l.mem.List()
		require.NoError(t, err)
		require.Equal(t, names[2:], after, "released segments go once the log resumes")
		require.NoError(t, l.Close())

		_, r, rec := openLog(t, l.mem, Options{})
		require.Empty(t, rec.Cut)
		require.Empty(t, rec.Skipped)
		want := 0
		for _, s := range segs {
			if s >= 3 {
				want++
			}
		}
		require.Len(t, r.recs, want)
		require.Equal(t, record(80-want), r.recs[0])
	})
}

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
		require.NoError(t, l.Err())
		require.NoError(t, l.Wait(t.Context(), lsn2), "the record appended during the stall is written too")
		told = l.heard()
		require.Len(t, told, 2)
		require.NoError(t, told[1], "told it resumed")
		require.Zero(t, tries(time.Hour), "no retry once resumed, nor any write with nothing appended")

		require.NoError(t, l.Close())
		_, r, rec := openLog(t, l.mem, Options{})
		requireRecords(t, r, 12)
		require.Nil(t, rec.Truncated, "nothing torn was left")
	})
}

// TestLogStallNewSegment: a segment whose header finds no space is removed again, and started
// again when the log resumes; the segment before it was synced whole before the log moved on.
func TestLogStallNewSegment(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := openStallLog(t, Options{Sync: SyncNever, SegmentSize: 512})
		appendAll(t, l.Log, 0, 3, 1)
		l.mem.Capacity(l.mem.Used() + 4) // not even a header
		lsn, _, err := l.Append(make([]byte, 500))
		require.NoError(t, err)
		done := waitFor(t.Context(), l.Log, lsn)
		synctest.Wait()
		requirePending(t, done, "stalled")
		require.ErrorIs(t, l.Err(), ErrStalled)
		names, err := l.mem.List()
		require.NoError(t, err)
		require.Equal(t, []string{segmentName(1)}, names, "the segment that could not start is gone")
		require.Equal(t, l.mem.Contents(segmentName(1)), l.mem.Synced(segmentName(1)), "the segment left is synced whole")

		l.mem.Capacity(-1)
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		require.NoError(t, <-done)
		require.NoError(t, l.Close())
		_, r, rec := openLog(t, l.mem, Options{})
		require.Nil(t, rec.Truncated)
		require.Len(t, r.recs, 4)
		require.Equal(t, []uint64{1, 1, 1, 2}, r.segs)
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
				require.Nil(t, rec.Truncated)
				requireRecords(t, r, map[bool]int{true: 6, false: 5}[space])
			})
		})
	}
}

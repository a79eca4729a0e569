package warren

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/wal"
)

// Paged durable queues (pager.go): a durable queue with a page window of a few messages, on
// small segments, so that nearly every message crosses the disk. Each test checks a rule that
// holds without paging, and that the backlog was indeed on disk (pagedLen).

// pagedLen returns how many of q's ready messages are on disk.
func pagedLen(q *Queue) (n int) {
	q.view(func() { n = q.core.ready.paged.n })
	return n
}

// liveHeap returns the Go heap's live bytes after a collection (runtime/metrics).
func liveHeap() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// pagedOptions are a durable broker's options for the paging tests: a window of window
// messages, 4 KiB segments.
func pagedOptions(window int) []BrokerOption {
	return []BrokerOption{WithPageWindow(window), logOptions(wal.Options{SegmentSize: 4096, Sync: wal.SyncNever})}
}

// pagedBacklog opens a broker on MemFS with a page window of window messages and fills its
// durable queue "jobs" with n persistent messages, "m000" on; the broker closes with the test.
func pagedBacklog(t *testing.T, window, n int) (*Broker, *Queue) {
	t.Helper()
	b := openTest(t, wal.NewMemFS(), pagedOptions(window)...)
	t.Cleanup(func() { b.Close() })
	q := durableQueue(t, b, "jobs")
	for i := range n {
		persistent(t, b, "jobs", fmt.Sprintf("m%03d", i))
	}
	return b, q
}

// TestPagedDefaultWindow: a durable queue of a broker from Open keeps DefaultPageWindow ready
// messages in memory, and pages the rest; WithPageWindow(0) keeps them all.
func TestPagedDefaultWindow(t *testing.T) {
	for _, opts := range [][]BrokerOption{nil, {WithPageWindow(0)}} {
		b := openTest(t, wal.NewMemFS(), opts...)
		q := durableQueue(t, b, "jobs")
		ps := make([]Publishing, DefaultPageWindow+100)
		for i := range ps {
			ps[i] = Publishing{Key: "jobs", Message: Message{Body: []byte{byte(i)}, Persistent: true}}
		}
		require.NoError(t, b.PublishBatch(context.Background(), ps))
		require.Equal(t, len(ps), q.Len())
		if opts == nil {
			assert.Equal(t, 100, pagedLen(q), "past the default window, on disk")
		} else {
			assert.Zero(t, pagedLen(q), "a window of 0: all in memory")
		}
		require.NoError(t, b.Close())
	}
}

// TestPagedDeliversInOrder: a backlog of 2,000 messages, all but the window on disk, is
// delivered once each, in order, also after a reopen; its memory is the window's, not the
// backlog's; once drained, its segments go.
func TestPagedDeliversInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := wal.NewMemFS()
		b := openTest(t, fs, pagedOptions(8)...)
		defer b.Close()
		ctx := context.Background()
		q := durableQueue(t, b, "jobs")
		const n = 2000
		for i := range n {
			m := Message{Body: fmt.Appendf(nil, "job %04d", i), Persistent: true}
			if i%7 == 0 {
				m.Headers = Table{"i": int64(i)}
			}
			require.NoError(t, b.Publish(ctx, "", "jobs", m))
		}
		assert.Equal(t, n, q.Len())
		assert.Equal(t, n-8, pagedLen(q), "all but the window on disk")
		assert.Less(t, b.Memory().Used, int64(64<<10), "what the broker counts: the window and the chunks, not 2,000 messages")

		get := func(q *Queue, i int) {
			t.Helper()
			d, err := q.Get(ctx)
			require.NoError(t, err)
			require.Equal(t, fmt.Sprintf("job %04d", i), string(d.Message.Body))
			if i%7 == 0 {
				require.Equal(t, int64(i), d.Message.Headers["i"])
			}
			require.NoError(t, d.Ack())
		}
		for i := range n / 2 {
			get(q, i)
		}
		onDisk := pagedLen(q)
		require.Greater(t, onDisk, n/2-8)
		require.NoError(t, b.Close())

		b = openTest(t, fs, pagedOptions(8)...)
		defer b.Close()
		q, err := b.Queue("jobs")
		require.NoError(t, err)
		require.Equal(t, n/2, q.Len())
		assert.True(t, b.Recovery().Checkpoint, "opened from the checkpoint of the clean Close")
		assert.Equal(t, onDisk, pagedLen(q), "restored: what was on disk stays there")
		assert.Less(t, b.Memory().Used, int64(64<<10), "after the reopen too")
		for i := n / 2; i < n; i++ {
			get(q, i)
		}
		_, err = q.Get(ctx)
		require.ErrorIs(t, err, ErrEmpty)
		synctest.Wait()
		require.NoError(t, b.store.log.Sync())
		assert.LessOrEqual(t, len(segmentNames(t, fs)), 3, "a drained backlog's segments go")
	})
}

// TestPagedRules: the rules a backlog on disk keeps as one in memory: priorities, a nacked
// message back at its place, per-message and queue TTLs that dead-letter on time, a purge and a
// deletion that free the segments.
func TestPagedRules(t *testing.T) {
	ctx := context.Background()
	body := func(d Delivery) string { return string(d.Message.Body) }
	t.Run("priorities", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := openTest(t, wal.NewMemFS(), pagedOptions(4)...)
			defer b.Close()
			q := durableQueue(t, b, "jobs", MaxPriority(3))
			var want [4][]string
			for i := range 200 {
				p := uint8(i % 4)
				m := Message{Body: fmt.Appendf(nil, "p%d-%03d", p, i), Persistent: true, Priority: p}
				require.NoError(t, b.Publish(ctx, "", "jobs", m))
				want[3-p] = append(want[3-p], string(m.Body))
			}
			require.Positive(t, pagedLen(q))
			var got []string
			for range 200 {
				d, err := q.Get(ctx)
				require.NoError(t, err)
				got = append(got, body(d))
				require.NoError(t, d.Ack())
			}
			assert.Equal(t, append(append(append(want[0], want[1]...), want[2]...), want[3]...), got)
		})
	})
	t.Run("nack returns to its place", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, q := pagedBacklog(t, 4, 100)
			var out []Delivery
			for range 10 {
				d, err := q.Get(ctx)
				require.NoError(t, err)
				out = append(out, d)
			}
			require.NoError(t, out[3].Nack())
			require.NoError(t, out[7].Nack())
			var got []string
			for {
				d, err := q.Get(ctx)
				if err != nil {
					require.ErrorIs(t, err, ErrEmpty)
					break
				}
				got = append(got, body(d))
				require.NoError(t, d.Ack())
			}
			require.Len(t, got, 92)
			assert.Equal(t, []string{"m003", "m007", "m010", "m011"}, got[:4], "the nacked ones first, at their places")
		})
	})
	t.Run("TTL dead-letters on time", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := openTest(t, wal.NewMemFS(), pagedOptions(4)...)
			defer b.Close()
			durableQueue(t, b, "dead")
			q := durableQueue(t, b, "jobs", MessageTTL(time.Minute), DeadLetter("", "dead"))
			for i := range 50 {
				m := Message{Body: fmt.Appendf(nil, "m%03d", i), Persistent: true}
				if i%10 == 5 {
					m.Expiration = "1000" // a second
				}
				require.NoError(t, b.Publish(ctx, "", "jobs", m))
			}
			require.Positive(t, pagedLen(q))
			dead, err := b.Queue("dead")
			require.NoError(t, err)
			time.Sleep(time.Second)
			synctest.Wait()
			assert.Equal(t, 5, dead.Len(), "the five with a second's TTL, read back from disk when due")
			assert.Equal(t, 45, q.Len())
			time.Sleep(time.Minute)
			synctest.Wait()
			assert.Equal(t, 50, dead.Len(), "the queue's TTL")
			assert.Zero(t, q.Len())
			assert.Zero(t, pagedLen(q))

			// Only paged messages have a deadline: WaitIdle waits for them too.
			q = durableQueue(t, b, "later", DeadLetter("", "dead"))
			for i := range 20 {
				m := Message{Body: fmt.Appendf(nil, "l%03d", i), Persistent: true}
				if i >= 4 {
					m.Expiration = "60000"
				}
				require.NoError(t, b.Publish(ctx, "", "later", m))
			}
			require.Equal(t, 16, pagedLen(q))
			require.NoError(t, b.WaitIdle(ctx))
			assert.Equal(t, 66, dead.Len(), "WaitIdle returned once the paged messages expired")
			assert.Equal(t, 4, q.Len())
		})
	})
	// A purge reads the messages on disk back only for listeners, which hear of each with its
	// message; unheard, their chunks are settled by sequence id, unread.
	for _, listening := range []bool{false, true} {
		t.Run(fmt.Sprint("purge and delete, listening ", listening), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				fs := wal.NewMemFS()
				b := openTest(t, fs, pagedOptions(4)...)
				defer b.Close()
				q := durableQueue(t, b, "jobs")
				durableQueue(t, b, "other")
				for i := range 300 {
					persistent(t, b, "jobs", fmt.Sprintf("job %03d", i))
					persistent(t, b, "other", fmt.Sprintf("other %03d", i))
				}
				require.Positive(t, pagedLen(q))
				var purged []string
				if listening {
					b.Listen(func(e Event) {
						if e.Kind == EventDropped && e.Reason == ReasonPurged {
							purged = append(purged, string(e.Message.Body))
						}
					})
				}
				reads := 0
				q.view(func() {
					read := q.core.ready.paged.read
					q.core.ready.paged.read = func(rank uint8, c *chunk) ([]entry, error) {
						reads++
						return read(rank, c)
					}
				})
				n, err := q.Purge()
				require.NoError(t, err)
				assert.Equal(t, 300, n)
				assert.Zero(t, q.Len())
				assert.Zero(t, pagedLen(q))
				assert.EqualValues(t, 300, q.Stats().Dropped)
				if listening {
					synctest.Wait()
					assert.Positive(t, reads)
					assert.Len(t, purged, 300, "an event with each message")
				} else {
					assert.Zero(t, reads, "nothing read back")
				}
				_, err = b.DeleteQueue("other")
				require.NoError(t, err)
				synctest.Wait()
				require.NoError(t, b.store.log.Sync())
				assert.LessOrEqual(t, len(segmentNames(t, fs)), 3, "nothing live: the segments go")
				require.NoError(t, b.Close())
				b = openTest(t, fs, pagedOptions(4)...)
				defer b.Close()
				q, err = b.Queue("jobs")
				require.NoError(t, err)
				assert.Zero(t, q.Len(), "the purge holds after a reopen")
			})
		})
	}
}

// TestPagedRestore: a backlog restored by Open past the window goes to disk as the restore
// reads it, but for what must stay in memory (a message in two queues, one out with a consumer
// at the close, one delayed); what each queue then delivers, in what order and with what
// counts, is the same as without paging.
func TestPagedRestore(t *testing.T) {
	run := func(window int) (got []string, paged int) {
		synctest.Test(t, func(t *testing.T) {
			fs := wal.NewMemFS()
			opts := []BrokerOption{WithPageWindow(window), logOptions(wal.Options{SegmentSize: 4096, Sync: wal.SyncNever})}
			b := openTest(t, fs, opts...)
			ctx := context.Background()
			jobs := durableQueue(t, b, "jobs")
			durableQueue(t, b, "copy")
			require.NoError(t, b.Bind("jobs", "amq.fanout", "", nil))
			require.NoError(t, b.Bind("copy", "amq.fanout", "", nil))
			for i := range 60 {
				m := Message{Body: fmt.Appendf(nil, "m%02d", i), Persistent: true}
				var err error
				switch {
				case i%5 == 0:
					err = b.Publish(ctx, "amq.fanout", "", m) // in both queues
				case i%7 == 0:
					err = b.Publish(ctx, "", "jobs", m, DeliverAfter(time.Minute))
				default:
					err = b.Publish(ctx, "", "jobs", m)
				}
				require.NoError(t, err)
			}
			// Ten out: six nacked back to their places, four out at the close (back, redelivered).
			var out []Delivery
			for range 10 {
				d, err := jobs.Get(ctx)
				require.NoError(t, err)
				out = append(out, d)
			}
			for _, d := range out[:6] {
				require.NoError(t, d.Nack())
			}
			require.NoError(t, b.Close())

			b = openTest(t, fs, opts...)
			defer b.Close()
			jobs = lookup(t, b, "jobs")
			paged = pagedLen(jobs)
			time.Sleep(time.Minute) // the delayed ones are due
			synctest.Wait()
			for {
				d, err := jobs.Get(ctx)
				if errors.Is(err, ErrEmpty) {
					break
				}
				require.NoError(t, err)
				got = append(got, fmt.Sprintf("%s/%d", d.Message.Body, d.DeliveryCount))
				require.NoError(t, d.Ack())
			}
		})
		return got, paged
	}
	want, paged := run(0)
	require.Zero(t, paged)
	got, paged := run(4)
	assert.Greater(t, paged, 20, "restored past the window: on disk")
	assert.Equal(t, want, got)
	assert.Len(t, got, 60)
}

// TestPagedPurgeKeepsOtherLevels: a purge that settles a chunk on disk unread settles its own
// messages only. A chunk of one priority level spans the ids of messages of the other levels
// published in between; one of them, delivered and unacknowledged, is not the purge's, and is
// back after a reopen.
func TestPagedPurgeKeepsOtherLevels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := wal.NewMemFS()
		b := openTest(t, fs, pagedOptions(2)...)
		defer b.Close()
		ctx := context.Background()
		q := durableQueue(t, b, "jobs", MaxPriority(1))
		for i, prio := range []uint8{0, 0, 0, 1, 0} {
			m := Message{Body: fmt.Appendf(nil, "m%d", i), Priority: prio, Persistent: true}
			require.NoError(t, b.Publish(ctx, "", "jobs", m))
		}
		require.Equal(t, 3, pagedLen(q))
		d, err := q.Get(ctx)
		require.NoError(t, err)
		require.Equal(t, "m3", string(d.Message.Body), "the higher priority first")
		var first, last uint64
		q.view(func() {
			if q.core.ready.paged.levels[1].len() > 0 {
				c := q.core.ready.firstChunk(1)
				first, last = c.first, c.last
			}
		})
		require.True(t, first < 4 && last > 4, "a chunk of the lower level spans m3's id: %d..%d", first, last)
		n, err := q.Purge()
		require.NoError(t, err)
		require.Equal(t, 4, n)
		require.NoError(t, b.Close()) // m3 goes back to the queue, in the log

		b = openTest(t, fs, pagedOptions(2)...)
		defer b.Close()
		q, err = b.Queue("jobs")
		require.NoError(t, err)
		assert.Equal(t, []string{"m3"}, ready(q), "the delivered message, not purged, is back")
	})
}

// TestPagedReads: what reads a queue without taking from its head sees the backlog on disk as
// one in memory: Browse and BrowseFrom in delivery order, a Move from the head and by id, a
// selective consumer that takes from the middle of the disk.
func TestPagedReads(t *testing.T) {
	ctx := context.Background()
	bodies := func(ms []ReadyMessage) []string {
		var out []string
		for _, m := range ms {
			out = append(out, string(m.Message.Body))
		}
		return out
	}
	names := func(from, to int) []string {
		var out []string
		for i := from; i < to; i++ {
			out = append(out, fmt.Sprintf("m%03d", i))
		}
		return out
	}
	synctest.Test(t, func(t *testing.T) {
		b, q := pagedBacklog(t, 4, 100)
		dest := durableQueue(t, b, "dest")
		require.Equal(t, 96, pagedLen(q))

		var browsed []string
		for m := range q.Browse() {
			browsed = append(browsed, string(m.Body))
		}
		assert.Equal(t, names(0, 100), browsed, "Browse")
		page := q.BrowseFrom(0, 10)
		assert.Equal(t, names(0, 10), bodies(page))
		page = q.BrowseFrom(page[9].ID, 10)
		assert.Equal(t, names(10, 20), bodies(page), "BrowseFrom, past the window")
		assert.Equal(t, 96, pagedLen(q), "browsing reads the disk, and leaves it there")

		n, err := q.Move(ctx, "", "dest", MoveIDs(page[5].ID, page[6].ID))
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		n, err = q.Move(ctx, "", "dest", MoveLimit(3))
		require.NoError(t, err)
		assert.Equal(t, 3, n)
		var moved []string
		for m := range dest.Browse() {
			moved = append(moved, string(m.Body))
		}
		assert.Equal(t, []string{"m015", "m016", "m000", "m001", "m002"}, moved, "by id, then from the head")

		c, err := q.Consume(ctx, Selector(func(m *Message) bool { return string(m.Body) == "m077" }))
		require.NoError(t, err)
		select {
		case d := <-c.Deliveries():
			assert.Equal(t, "m077", string(d.Message.Body), "found on disk")
			require.NoError(t, d.Ack())
		case <-time.After(time.Second):
			t.Fatal("the selective consumer got nothing")
		}
		require.NoError(t, c.Cancel())
		browsed = browsed[:0]
		for m := range q.Browse() {
			browsed = append(browsed, string(m.Body))
		}
		want := append(names(3, 15), names(17, 77)...)
		assert.Equal(t, append(want, names(78, 100)...), browsed, "what is left, in order")
	})
}

// TestPagedCompaction: a paged backlog in the oldest segments does not keep the log growing
// while other messages churn through it: compaction writes its chunks again at the head, whole,
// and the backlog is still there, in order, after a reopen.
func TestPagedCompaction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := wal.NewMemFS()
		b := openTest(t, fs, pagedOptions(4)...)
		defer b.Close()
		ctx := context.Background()
		jobs := durableQueue(t, b, "jobs")
		busy := durableQueue(t, b, "busy")
		for i := range 300 {
			persistent(t, b, "jobs", fmt.Sprintf("job %03d", i))
		}
		require.Equal(t, 296, pagedLen(jobs))
		most := 0
		for i := range 3000 {
			persistent(t, b, "busy", fmt.Sprintf("churn %04d", i))
			d, err := busy.Get(ctx)
			require.NoError(t, err)
			require.NoError(t, d.Ack())
			if i%100 == 99 {
				synctest.Wait()
				require.NoError(t, b.store.log.Sync())
				most = max(most, len(segmentNames(t, fs)))
			}
		}
		// The backlog's records take about 5 segments of 4 KiB; the churn wrote about 30.
		assert.LessOrEqual(t, most, 16, "the log stays within twice what is live and a few segments")
		require.Equal(t, 296, pagedLen(jobs))
		require.NoError(t, b.Close())

		b = openTest(t, fs, pagedOptions(4)...)
		defer b.Close()
		jobs, err := b.Queue("jobs")
		require.NoError(t, err)
		for i := range 300 {
			d, err := jobs.Get(ctx)
			require.NoError(t, err)
			require.Equal(t, fmt.Sprintf("job %03d", i), string(d.Message.Body))
			require.NoError(t, d.Ack())
		}
	})
}

// TestPagedBacklogHeap: a backlog far larger than the window, through a durable queue on the
// real file system with a small page window and a small broker budget: the Go heap stays
// bounded while it fills and while it drains (runtime/metrics, live heap after a GC), and every
// message is delivered once, in order. WARREN_BACKLOG sets the messages (1M by default; 100k
// with -short).
func TestPagedBacklogHeap(t *testing.T) {
	n := 1_000_000
	if testing.Short() {
		n = 100_000
	}
	if s := os.Getenv("WARREN_BACKLOG"); s != "" {
		var err error
		n, err = strconv.Atoi(s)
		require.NoError(t, err, "WARREN_BACKLOG")
	}
	const bound = 48 << 20 // the heap a 1M backlog took unpaged: about 300 MB
	base := int64(liveHeap())
	b, err := Open(t.TempDir(), WithPageWindow(512), WithMemoryLimit(16<<20), WithSync(SyncNever))
	require.NoError(t, err)
	defer b.Close()
	ctx := context.Background()
	q := durableQueue(t, b, "backlog")
	body := make([]byte, 128)
	batch := make([]Publishing, 256)
	most := int64(0) // the most live heap seen, less base
	for i := 0; i < n; i += len(batch) {
		k := min(len(batch), n-i)
		for j := range k {
			m := Message{Body: slices.Clone(body), Persistent: true}
			binary.BigEndian.PutUint64(m.Body, uint64(i+j))
			batch[j] = Publishing{Key: "backlog", Message: m}
		}
		require.NoError(t, b.PublishBatch(ctx, batch[:k]))
		if i%(n/8) < len(batch) {
			most = max(most, int64(liveHeap())-base)
		}
	}
	require.Equal(t, n, q.Len())
	most = max(most, int64(liveHeap())-base)
	t.Logf("%d messages: %d on disk; live heap at most %d KiB over the %d KiB before", n, pagedLen(q), most>>10, base>>10)
	assert.Less(t, most, int64(bound), "the heap while filling")
	assert.False(t, b.Memory().Alarm, "the broker's budget counts what is in memory, not on disk")

	c, err := q.Consume(ctx, Prefetch(256))
	require.NoError(t, err)
	for i := range n {
		d := <-c.Deliveries()
		require.Equal(t, uint64(i), binary.BigEndian.Uint64(d.Message.Body), "in order, once")
		require.NoError(t, d.Ack())
		if i%(n/8) == 0 {
			most = max(most, int64(liveHeap())-base)
		}
	}
	require.NoError(t, c.Cancel())
	assert.Zero(t, q.Len())
	assert.Less(t, most, int64(bound), "the heap while draining")
}

// TestReadPagedOrder: a segment may hold a queue's records out of its order, and a message's
// record twice (compaction writes the ready messages it moves after newer ones already there):
// a chunk reads back in sequence order, each message once.
func TestReadPagedOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, q := pagedBacklog(t, 4, 8)
		require.Equal(t, 4, pagedLen(q))
		q.mu.Lock()
		defer q.mu.Unlock()
		r := &q.core.ready
		ents, err := r.readChunk(0, r.firstChunk(0))
		require.NoError(t, err)
		require.Greater(t, len(ents), 2, "a chunk of several messages")
		// Write them again in one append, newest first and the oldest twice, and point the
		// chunk there, as compaction would.
		var recs [][]byte
		order := slices.Clone(ents)
		slices.Reverse(order)
		for _, e := range append(order, ents[0]) {
			p := placement{msgID: e.env.more.logID, queueID: q.log.qid, seq: e.seq}
			rec, _ := appendPublish(nil, p, e.env)
			recs = append(recs, rec)
		}
		lsn, seg, err := b.store.log.Append(recs...)
		require.NoError(t, err)
		c := r.firstChunk(0)
		c.loc = pageLoc{seg: seg, lsn: uint64(lsn)}
		again, err := q.readPaged(0, c)
		require.NoError(t, err)
		require.Len(t, again, len(ents))
		for i := range ents {
			assert.Equal(t, ents[i].seq, again[i].seq)
			assert.Equal(t, string(ents[i].env.message().Body), string(again[i].env.message().Body))
		}
	})
}

// TestPagedChurn: a paged queue under publishers and consumers, purged and then deleted while
// they run, on the real file system: nothing panics or races, every publish either lands or is
// refused with the queue's deletion, and once the queue is gone and the broker closed, the log
// holds no live segment of it (a reopen finds no queue and a log of a few segments).
func TestPagedChurn(t *testing.T) {
	dir := t.TempDir()
	opts := []BrokerOption{WithPageWindow(8), WithSync(SyncNever), logOptions(wal.Options{SegmentSize: 16 << 10, Sync: wal.SyncNever})}
	b, err := Open(dir, opts...)
	require.NoError(t, err)
	q := durableQueue(t, b, "jobs", MaxPriority(2))
	for i := range 100 { // a backlog on disk before the consumers start
		require.NoError(t, b.Publish(context.Background(), "", "jobs", Message{Body: fmt.Appendf(nil, "pre-%03d", i), Persistent: true, Priority: uint8(i % 3)}))
	}
	most := pagedLen(q)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for p := range 3 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				m := Message{Body: fmt.Appendf(nil, "p%d-%06d", p, i), Persistent: i%5 != 0, Priority: uint8(i % 3)}
				if err := b.Publish(ctx, "", "jobs", m); err != nil && ctx.Err() == nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrQueueDeleted) {
					t.Errorf("publish: %v", err)
					return
				}
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			c, err := q.Consume(ctx, Prefetch(16))
			if err != nil {
				return
			}
			for d := range c.Deliveries() {
				if d.Message.Priority == 1 {
					_ = d.Nack() // back to its place, among the paged ones
					continue
				}
				_ = d.Ack()
			}
		})
	}
	for range 20 {
		time.Sleep(20 * time.Millisecond)
		most = max(most, pagedLen(q))
		_, err := q.Purge()
		require.NoError(t, err)
	}
	assert.Positive(t, most, "the backlog was on disk")
	assert.Positive(t, q.Stats().Dropped, "purged along the way")
	_, err = b.DeleteQueue("jobs")
	require.NoError(t, err)
	cancel()
	wg.Wait()
	require.NoError(t, b.Close())

	b, err = Open(dir, opts...)
	require.NoError(t, err)
	defer b.Close()
	_, err = b.Queue("jobs")
	require.ErrorIs(t, err, ErrNotFound)
	require.NoError(t, b.Close())
	assert.LessOrEqual(t, len(segmentNames(t, wal.OSFS{Dir: dir})), 3, "nothing of the queue is live: its segments went")
}

// TestPagedCloseMidway: Close in the middle of publishers and consumers on a paged queue (nacks
// return messages among the paged ones): after a reopen, the queue holds every persistent
// message whose publish was confirmed and whose ack did not return, once each, in order per
// publisher, and nothing else.
func TestPagedCloseMidway(t *testing.T) {
	dir := t.TempDir()
	opts := []BrokerOption{WithPageWindow(8), WithSync(SyncNever), logOptions(wal.Options{SegmentSize: 16 << 10, Sync: wal.SyncNever})}
	b, err := Open(dir, opts...)
	require.NoError(t, err)
	q := durableQueue(t, b, "jobs")
	var (
		mu        sync.Mutex
		confirmed = map[string]bool{}
		acked     = map[string]bool{}
		wg        sync.WaitGroup
	)
	ctx := context.Background()
	for i := range 100 { // a backlog on disk before the consumers start
		body := fmt.Sprintf("p9-%06d", i)
		require.NoError(t, b.Publish(ctx, "", "jobs", Message{Body: []byte(body), Persistent: true}))
		confirmed[body] = true
	}
	most := pagedLen(q)
	for p := range 3 {
		wg.Go(func() {
			for i := 0; ; i++ {
				body := fmt.Sprintf("p%d-%06d", p, i)
				err := b.Publish(ctx, "", "jobs", Message{Body: []byte(body), Persistent: true})
				if err != nil {
					if !errors.Is(err, ErrClosed) {
						t.Errorf("publish: %v", err)
					}
					return
				}
				mu.Lock()
				confirmed[body] = true
				mu.Unlock()
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			c, err := q.Consume(ctx, Prefetch(16))
			if err != nil {
				return
			}
			for n := 0; ; n++ {
				d, ok := <-c.Deliveries()
				if !ok {
					return
				}
				if n%7 == 0 {
					_ = d.Nack() // back to its place, among the paged ones
					continue
				}
				if d.Ack() == nil {
					mu.Lock()
					acked[string(d.Message.Body)] = true
					mu.Unlock()
				}
			}
		})
	}
	for range 10 {
		time.Sleep(20 * time.Millisecond)
		most = max(most, pagedLen(q))
	}
	require.NoError(t, b.Close())
	wg.Wait()
	require.Positive(t, most, "the backlog was on disk")

	b, err = Open(dir, opts...)
	require.NoError(t, err)
	defer b.Close()
	q = lookup(t, b, "jobs")
	last := map[string]int{}
	held := map[string]bool{}
	for {
		d, err := q.Get(ctx)
		if errors.Is(err, ErrEmpty) {
			break
		}
		require.NoError(t, err)
		body := string(d.Message.Body)
		require.False(t, held[body], "%s twice", body)
		held[body] = true
		require.False(t, acked[body], "%s: its ack returned, and it is back", body)
		var p, i int
		_, err = fmt.Sscanf(body, "p%d-%d", &p, &i)
		require.NoError(t, err)
		if !d.Redelivered {
			require.Greater(t, i, last[fmt.Sprint(p)]-1, "%s after a later one of its publisher", body)
			last[fmt.Sprint(p)] = i
		}
		require.NoError(t, d.Ack())
	}
	for body := range confirmed {
		if !acked[body] {
			require.True(t, held[body], "%s: confirmed, not acked, and lost", body)
		}
	}
	t.Logf("%d confirmed, %d acked, %d back; %d on disk at most", len(confirmed), len(acked), len(held), most)
}

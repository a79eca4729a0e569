package warren

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/wal"
)

// Opening a durable broker (durable.go): the directory, its lock, the options, and what Open
// does with a damaged log. What a restart brings back is in recovery_test.go and store_test.go.

func TestOpenDirectory(t *testing.T) {
	dir := t.TempDir() + "/data" // created by Open
	b, err := Open(dir, WithSync(SyncNever))
	require.NoError(t, err)
	durableQueue(t, b, "jobs")
	persistent(t, b, "jobs", "m1", "m2")

	_, err = Open(dir)
	require.ErrorIs(t, err, ErrResourceLocked, "a directory is one broker's at a time")
	require.NoError(t, b.Close())

	b, err = Open(dir, WithSync(SyncInterval(0)))
	require.NoError(t, err, "Close let go of the directory")
	defer b.Close()
	require.Equal(t, []string{"m1", "m2"}, held(t, b, "jobs"))
}

// corruptByte flips a byte of a file of fs in the middle of its batches.
func corruptByte(t *testing.T, fs *wal.MemFS, name string, off int) {
	t.Helper()
	data := fs.Contents(name)
	require.Greater(t, len(data), off)
	data[off] ^= 0xff
	rewrite(t, fs, name, data)
}

// rewrite replaces the file name of fs with data, synced.
func rewrite(t *testing.T, fs *wal.MemFS, name string, data []byte) {
	t.Helper()
	require.NoError(t, fs.Remove(name))
	f, err := fs.Create(name)
	require.NoError(t, err)
	_, err = f.Write(data)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
}

// segmentNames lists the log's segment files.
func segmentNames(t *testing.T, fs wal.FS) []string {
	t.Helper()
	names, err := fs.List()
	require.NoError(t, err)
	var segs []string
	for _, n := range names {
		if strings.HasSuffix(n, ".wal") {
			segs = append(segs, n)
		}
	}
	return segs
}

// repairs collects the EventLogRepaired events of a broker opened with it as its listener.
type repairs struct {
	mu  sync.Mutex
	evs []Event
}

func (r *repairs) listen(e Event) {
	if e.Kind == EventLogRepaired {
		r.mu.Lock()
		r.evs = append(r.evs, e)
		r.mu.Unlock()
	}
}

func TestOpenCorrupt(t *testing.T) {
	fs := wal.NewMemFS()
	opts := logOptions(wal.Options{SegmentSize: 512})
	b := openTest(t, fs, opts)
	stopCompactor(b) // the log keeps its records in the order they were written
	durableQueue(t, b, "jobs")
	var bodies []string
	for i := range 40 {
		bodies = append(bodies, fmt.Sprintf("message %02d", i))
	}
	persistent(t, b, "jobs", bodies...)
	require.NoError(t, b.Close())
	segs := segmentNames(t, fs)
	require.Greater(t, len(segs), 2)
	corruptByte(t, fs, segs[1], 100) // the second segment, past its header and its first frame's

	_, err := openBroker(fs, opts)
	require.ErrorIs(t, err, ErrCorrupt, "damage before the last segment is refused")
	require.ErrorContains(t, err, segs[1], "the error names the file")

	var heard repairs
	b, err = openBroker(fs, opts, WithSalvage(), WithListener(heard.listen))
	require.NoError(t, err, "WithSalvage opens it")
	defer b.Close()
	var got []string
	suspects := 0 // put back redelivered: placed before the skipped stretch
	for _, m := range held(t, b, "jobs") {
		body, cut := strings.CutSuffix(m, "(0)")
		if cut {
			suspects++
		}
		got = append(got, body)
	}
	require.Less(t, len(got), len(bodies), "what the damaged batch held is lost")
	require.Subset(t, bodies, got)
	require.Equal(t, bodies[0], got[0], "the first segment is whole")
	require.Equal(t, bodies[len(bodies)-1], got[len(got)-1], "and so is the last")
	rec := b.Recovery()
	require.Len(t, rec.Skipped, 1)
	require.Equal(t, segs[1], rec.Skipped[0].File)
	require.Equal(t, len(bodies)-len(got), rec.Skipped[0].Records, "one record per message lost")
	require.Equal(t, len(got), rec.Messages)
	require.Equal(t, []QueueDamage{{Queue: "jobs", QueueID: 1, MaybeSettled: suspects}}, rec.Queues)
	require.Len(t, heard.evs, 2, "the stretch, and the queue's")
	require.ErrorIs(t, heard.evs[0].Err, ErrCorrupt)
	require.ErrorContains(t, heard.evs[0].Err, segs[1])
	require.Positive(t, heard.evs[0].Value, "the bytes skipped")
	require.Equal(t, "jobs", heard.evs[1].Queue)
	require.Zero(t, heard.evs[1].Value, "no message known lost: their records were skipped")
	require.Positive(t, heard.evs[1].Limit, "the messages before the damage may have been acked in it")
}

// TestOpenTornTail: a torn write at the end of the log, which a crash leaves, is cut, and
// Open says so in an event; every batch before it is kept.
func TestOpenTornTail(t *testing.T) {
	fs := wal.NewMemFS()
	b := openTest(t, fs)
	durableQueue(t, b, "jobs")
	persistent(t, b, "jobs", "m1", "m2")
	require.NoError(t, b.Close())
	segs := segmentNames(t, fs)
	f, err := fs.Open(segs[len(segs)-1])
	require.NoError(t, err)
	_, err = f.Write([]byte{40, 0, 0, 0, 1, 2, 3, 4, 5}) // a frame that claims 40 bytes and has 5
	require.NoError(t, err)
	require.NoError(t, f.Close())

	var heard repairs
	b = openTest(t, fs, WithListener(heard.listen))
	defer b.Close()
	require.Len(t, heard.evs, 1)
	require.ErrorIs(t, heard.evs[0].Err, ErrCorrupt)
	require.EqualValues(t, 9, heard.evs[0].Value)
	require.Equal(t, []string{"m1", "m2"}, held(t, b, "jobs"))
	persistent(t, b, "jobs", "m3")
	require.NoError(t, b.Close())
	b = openTest(t, fs)
	defer b.Close()
	require.Equal(t, []string{"m3"}, held(t, b, "jobs"), "the log goes on after the cut")
}

// TestDurableStorageFails: once a write of the log fails (an I/O error, not a full disk), no
// publish to a durable queue is confirmed (ErrStorage), a later one is refused before it enters
// the queue, and Close says the log failed; the broker goes on serving what it holds and what is
// transient.
func TestDurableStorageFails(t *testing.T) {
	fs := wal.NewMemFS()
	b := openTest(t, fs)
	defer b.Close()
	ctx := context.Background()
	durableQueue(t, b, "jobs")
	_, err := b.DeclareQueue("temp")
	require.NoError(t, err)
	persistent(t, b, "jobs", "m1")

	errIO := errors.New("injected I/O error")
	fs.FailWrite(0, errIO, nil)
	err = b.Publish(ctx, "", "jobs", Message{Body: []byte("m2"), Persistent: true})
	require.ErrorIs(t, err, ErrStorage, "not confirmed (in memory, it may be delivered: its outcome is unknown)")
	require.ErrorIs(t, err, errIO, "the cause is kept")
	err = b.Publish(ctx, "", "jobs", Message{Body: []byte("m3"), Persistent: true})
	require.ErrorIs(t, err, ErrStorage, "and every later one")
	require.ErrorIs(t, err, wal.ErrFailed)
	require.NoError(t, b.Publish(ctx, "", "jobs", Message{Body: []byte("t1")}), "a transient message is not logged")
	require.NoError(t, b.Publish(ctx, "", "temp", Message{Body: []byte("t2"), Persistent: true}), "nor is a transient queue's")
	require.Equal(t, []string{"t2"}, held(t, b, "temp"))
	jobs, err := b.Queue("jobs")
	require.NoError(t, err)
	got := ready(jobs) // held would ack, and acks of its persistent messages are refused too
	require.Equal(t, "m1", got[0], "what the queue held is served")
	require.Contains(t, got, "t1")
	require.NotContains(t, got, "m3", "refused before it entered the queue")
	err = b.Close()
	require.ErrorIs(t, err, ErrStorage, "Close says the log failed")
	require.ErrorIs(t, err, errIO)
	require.ErrorIs(t, b.Close(), ErrStorage, "every time")
}

// TestDurableDiskFullTmpfs: a full disk on a real file system, an 8 MiB tmpfs, where write(2)
// fails with ENOSPC. The publish whose write finds no space waits (until its ctx ends: its
// outcome is unknown, and its record is kept); the next is refused with ErrStorage; once a file
// is removed, the log writes again by itself, with no reopen; and the reopened log holds every
// message confirmed, the kept one, and the one published after.
func TestDurableDiskFullTmpfs(t *testing.T) {
	dir := mountTmpfs(t, 8<<20)
	ballast := filepath.Join(dir, "ballast")
	require.NoError(t, os.WriteFile(ballast, make([]byte, 1<<20), 0o644))
	data := filepath.Join(dir, "data")
	b, err := Open(data)
	require.NoError(t, err)
	defer func() { b.Close() }()
	jobs := durableQueue(t, b, "jobs")
	publish := func(ctx context.Context, name string) error {
		body := append([]byte(name+" "), bytes.Repeat([]byte{'x'}, 32<<10)...)
		return b.Publish(ctx, "", "jobs", Message{Body: body, Persistent: true})
	}
	var want []string
	for i := 0; ; i++ {
		require.Less(t, i, 1000, "8 MiB should be full by now")
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		err = publish(ctx, fmt.Sprint(i))
		cancel()
		want = append(want, fmt.Sprint(i))
		if err != nil {
			break
		}
	}
	require.ErrorIs(t, err, context.DeadlineExceeded, "the publish whose write found the disk full waits for space")
	require.ErrorIs(t, b.store.log.Err(), syscall.ENOSPC)
	err = publish(t.Context(), "refused")
	require.ErrorIs(t, err, ErrStorage)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.Len(t, ready(jobs), len(want), "the refused one is in no queue")

	require.NoError(t, os.Remove(ballast))
	require.NoError(t, b.store.log.WaitWritten(t.Context(), 0), "the log writes again by itself")
	require.NoError(t, b.store.log.Err())
	require.NoError(t, publish(t.Context(), "after"))
	want = append(want, "after")
	require.NoError(t, b.Close())

	b, err = Open(data)
	require.NoError(t, err)
	var got []string
	for _, body := range held(t, b, "jobs") {
		got = append(got, strings.Fields(body)[0])
	}
	require.Equal(t, want, got)
}

// mountTmpfs mounts a tmpfs of size bytes on a new directory, unmounted at cleanup. Where it
// cannot (not root, not Linux, no mount(8)), the test is skipped, saying why; with WARREN_TMPFS=1
// (CI, where it must run) it fails instead.
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprint("size=", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		msg := fmt.Sprintf("cannot mount a tmpfs (it takes root on Linux): %v: %s", err, bytes.TrimSpace(out))
		if os.Getenv("WARREN_TMPFS") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, bytes.TrimSpace(out))
		}
	})
	return dir
}

// TestPublishBatchConfirmsOnce: a batch waits for the log once; under SyncAlways a lone
// publisher's batch costs one sync, where a publish per message costs one each.
func TestPublishBatchConfirmsOnce(t *testing.T) {
	fs := &syncCounter{MemFS: wal.NewMemFS()}
	// The log's flush timer writes (and, under SyncAlways, syncs) what nobody waits for: given
	// its 1 ms, it could take part of a batch that takes longer to append (under -race).
	b := openTest(t, fs, logOptions(wal.Options{FlushDelay: time.Hour}))
	defer b.Close()
	durableQueue(t, b, "jobs")
	var batch []Publishing
	for i := range 50 {
		batch = append(batch, Publishing{Key: "jobs", Message: Message{Body: fmt.Appendf(nil, "m%d", i), Persistent: true}})
	}
	require.NoError(t, b.store.log.Sync()) // the declaration's record
	before := fs.syncs()
	require.NoError(t, b.PublishBatch(context.Background(), batch))
	require.Equal(t, 1, fs.syncs()-before, "one sync for the batch")
	before = fs.syncs()
	persistent(t, b, "jobs", "a", "b", "c")
	require.Equal(t, 3, fs.syncs()-before, "one per Publish")
	require.Len(t, held(t, b, "jobs"), 53)
}

// syncCounter is a MemFS that counts the syncs of its files.
type syncCounter struct {
	*wal.MemFS
	mu sync.Mutex
	n  int
}

func (c *syncCounter) syncs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (c *syncCounter) Create(name string) (wal.File, error) { return c.wrap(c.MemFS.Create(name)) }
func (c *syncCounter) Open(name string) (wal.File, error)   { return c.wrap(c.MemFS.Open(name)) }

func (c *syncCounter) wrap(f wal.File, err error) (wal.File, error) {
	if err != nil {
		return nil, err
	}
	return countedFile{f, c}, nil
}

type countedFile struct {
	wal.File
	c *syncCounter
}

func (f countedFile) Sync() error {
	f.c.mu.Lock()
	f.c.n++
	f.c.mu.Unlock()
	return f.File.Sync()
}

// TestPublishDeferred: a deferred publish is in its queue at once, and confirmed by its
// Confirmation: before Wait a crash may lose it, after Wait a power loss under SyncAlways may
// not; a Wait confirms every publish before it.
func TestPublishDeferred(t *testing.T) {
	ctx := context.Background()
	fs := wal.NewMemFS()
	slow := logOptions(wal.Options{FlushDelay: time.Hour}) // only a Wait writes
	b := openTest(t, fs, slow)
	durableQueue(t, b, "jobs")
	deferred := func(bodies ...string) []Confirmation {
		var cs []Confirmation
		for _, body := range bodies {
			c, err := b.PublishDeferred(ctx, "", "jobs", Message{Body: []byte(body), Persistent: true})
			require.NoError(t, err)
			require.NotEqual(t, Confirmation{}, c, "a durable publish has a confirm to wait for")
			cs = append(cs, c)
		}
		return cs
	}

	deferred("lost1", "lost2")
	q, err := b.Queue("jobs")
	require.NoError(t, err)
	require.Equal(t, 2, q.Len(), "in the queue before the confirm")
	fs.Crash(wal.KeepWritten, nil)
	b = openTest(t, fs, slow)
	require.Empty(t, held(t, b, "jobs"), "not written, not confirmed: a process crash loses them")

	cs := deferred("m1", "m2", "m3")
	require.NoError(t, cs[2].Wait(), "the last one confirms the others")
	fs.Crash(wal.KeepSynced, nil)
	b = openTest(t, fs, slow)
	defer func() { b.Close() }()
	require.Equal(t, []string{"m1", "m2", "m3"}, held(t, b, "jobs"))
	require.NoError(t, cs[0].Wait(), "a Wait after the crash of an earlier life is already confirmed")

	deferred("m4")
	c, err := b.PublishDeferred(ctx, "", "jobs", Message{Body: []byte("transient")})
	require.NoError(t, err)
	require.NotEqual(t, Confirmation{}, c, "nothing of its own to wait for, but m4 before it")
	require.NoError(t, c.Wait(), "it confirms m4")
	fs.Crash(wal.KeepWritten, nil)
	b = openTest(t, fs, slow)
	require.Equal(t, []string{"m4"}, held(t, b, "jobs"))
	c, err = b.PublishDeferred(ctx, "", "jobs", Message{Body: []byte("transient")})
	require.NoError(t, err)
	require.Equal(t, Confirmation{}, c, "no deferred publish before it in this life: nothing to wait for")

	mem := New()
	defer mem.Close()
	durableQueue(t, mem, "jobs")
	c, err = mem.PublishDeferred(ctx, "", "jobs", Message{Body: []byte("m"), Persistent: true})
	require.NoError(t, err)
	require.Equal(t, Confirmation{}, c, "a broker from New confirms on return")

	_, err = b.PublishDeferred(ctx, "", "nowhere", Message{Persistent: true}, Mandatory())
	require.ErrorIs(t, err, ErrUnroutable, "a routing error is returned at once")
}

// TestPublishDeferredPartial: a publish that a reject-publish queue refused is confirmed for
// the queues that took it; a failed log refuses the confirm.
func TestPublishDeferredPartial(t *testing.T) {
	ctx := context.Background()
	fs := wal.NewMemFS()
	b := openTest(t, fs)
	_, err := b.DeclareExchange("fan", "fanout", Durable())
	require.NoError(t, err)
	for _, name := range []string{"a", "full"} {
		_, err := b.DeclareQueue(name, Durable(), MaxLength(1), Overflow(RejectPublish))
		require.NoError(t, err)
		require.NoError(t, b.Bind(name, "fan", "", nil))
	}
	persistent(t, b, "full", "f1")
	c, err := b.PublishDeferred(ctx, "fan", "", Message{Body: []byte("m1"), Persistent: true})
	require.ErrorIs(t, err, ErrQueueFull)
	require.NotEqual(t, Confirmation{}, c, "queue a took it")
	require.NoError(t, c.Wait())
	fs.Crash(wal.KeepSynced, nil)
	b = openTest(t, fs)
	defer func() { b.Close() }()
	require.Equal(t, []string{"m1"}, held(t, b, "a"))
	require.Equal(t, []string{"f1"}, held(t, b, "full"))

	fs.FailWrite(0, errors.New("injected I/O error"), nil)
	c, err = b.PublishDeferred(ctx, "fan", "", Message{Body: []byte("m2"), Persistent: true})
	require.NoError(t, err, "routing succeeded")
	require.ErrorIs(t, c.Wait(), ErrStorage)
	require.ErrorIs(t, c.Wait(), ErrStorage, "and again")
}

// TestPublishBatchStops: a batch stops at the first publish that fails and says which; the
// messages before it are published, the ones after it are not.
func TestPublishBatchStops(t *testing.T) {
	b := New()
	defer b.Close()
	_, err := b.DeclareQueue("jobs")
	require.NoError(t, err)
	batch := []Publishing{
		{Key: "jobs", Message: Message{Body: []byte("m1")}},
		{Key: "jobs", Message: Message{Body: []byte("m2")}},
		{Key: "nowhere", Message: Message{Body: []byte("lost")}},
		{Key: "jobs", Message: Message{Body: []byte("m3")}},
	}
	err = b.PublishBatch(context.Background(), batch, Mandatory())
	require.ErrorIs(t, err, ErrUnroutable)
	var be *BatchError
	require.True(t, errors.As(err, &be))
	require.Equal(t, 2, be.Index)
	require.Equal(t, []string{"m1", "m2"}, held(t, b, "jobs"))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = b.PublishBatch(ctx, batch)
	require.ErrorIs(t, err, context.Canceled)
	require.True(t, errors.As(err, &be))
	require.Equal(t, 0, be.Index)
	require.NoError(t, b.PublishBatch(context.Background(), nil), "an empty batch")
}

// FuzzOpenDamaged: a durable broker's log, closed cleanly, damaged anywhere (a run of bytes
// flipped, the end of a file cut off). Without WithSalvage, Open fails with ErrCorrupt, or opens
// with every queue as it was: nothing lost, nothing back. With it, Open opens, the queues
// work, and what they lost or got back is within what its Recovery says: the live messages
// missing at most the records it skipped plus the messages it knows lost, each acked message
// back redelivered and counted in MaybeSettled. Never a panic.
func FuzzOpenDamaged(f *testing.F) {
	// A log with every kind of record: topology, publishes to two queues, deliveries, returns,
	// a delay, acks; in three segments or more. Queue a acks m0 and m3, and delays m2 and m5.
	base := wal.NewMemFS()
	opts := logOptions(wal.Options{SegmentSize: 400})
	b, err := openBroker(base, opts)
	if err != nil {
		f.Fatal(err)
	}
	stopCompactor(b) // the same log on every run
	ctx := context.Background()
	b.DeclareExchange("x", ExchangeFanout, Durable())
	for _, name := range []string{"a", "b"} {
		b.DeclareQueue(name, Durable(), DeliveryLimit(3), MessageTTL(time.Hour))
		b.Bind(name, "x", "", nil)
	}
	for i := range 12 {
		b.Publish(ctx, "x", "", Message{Body: fmt.Appendf(nil, "m%d", i), Persistent: true, Headers: Table{"i": int32(i)}})
	}
	qa, _ := b.Queue("a")
	for i := range 6 {
		d, err := qa.Get(ctx)
		if err != nil {
			f.Fatal(err)
		}
		switch i % 3 {
		case 0:
			d.Ack()
		case 1:
			d.Nack()
		default:
			d.NackWithDelay(time.Minute)
		}
	}
	b.Close()
	acked := map[string]map[string]bool{"a": {"m0": true, "m3": true}, "b": {}}
	// picture is what a queue holds: its ready messages, as Browse shows them, and how many are
	// delayed; nil if the broker has no such queue.
	type picture struct {
		ready   []ReadyMessage
		delayed int
	}
	pictureOf := func(b *Broker, name string) *picture {
		q, err := b.Queue(name)
		if err != nil {
			return nil
		}
		p := &picture{ready: q.BrowseFrom(0, 100), delayed: q.Stats().Delayed}
		for i := range p.ready {
			p.ready[i].Message = &Message{Body: p.ready[i].Message.Body} // the body is all that counts
		}
		return p
	}
	b, err = openBroker(base.Clone(), opts)
	if err != nil {
		f.Fatal(err)
	}
	want := map[string]*picture{"a": pictureOf(b, "a"), "b": pictureOf(b, "b")}
	b.Close()
	segs, _ := base.List()
	f.Add(uint8(0), uint16(100), uint8(1), uint8(1), uint16(0))
	f.Add(uint8(1), uint16(20), uint8(0xff), uint8(4), uint16(0))
	f.Add(uint8(2), uint16(0), uint8(0), uint8(0), uint16(30))
	f.Add(uint8(3), uint16(60), uint8(0x40), uint8(2), uint16(0))
	f.Add(uint8(255), uint16(8), uint8(0x01), uint8(1), uint16(0))
	f.Fuzz(func(t *testing.T, file uint8, off uint16, mask, run uint8, cut uint16) {
		fs := base.Clone()
		name := segs[int(file)%len(segs)]
		data := fs.Contents(name)
		for i := int(off); i < int(off)+int(run) && i < len(data); i++ {
			data[i] ^= mask
		}
		rewrite(t, fs, name, data[:len(data)-min(len(data), int(cut))])

		b, err := openBroker(fs.Clone(), opts)
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
		} else {
			for _, name := range []string{"a", "b"} {
				require.Equal(t, want[name], pictureOf(b, name), "queue %s: opened without WithSalvage, it is whole", name)
			}
			require.NoError(t, b.Close())
		}

		b, err = openBroker(fs.Clone(), opts, WithSalvage())
		require.NoError(t, err, "WithSalvage opens it")
		defer b.Close()
		rec := b.Recovery()
		bound, counted, maybeSettled := 0, true, 0
		for _, d := range rec.Skipped {
			bound += d.Records
			counted = counted && d.Records >= 0
		}
		for _, d := range rec.Queues {
			bound += d.Lost
			maybeSettled += d.MaybeSettled
		}
		missing, back := 0, 0
		for _, name := range []string{"a", "b"} {
			live := len(want[name].ready) + want[name].delayed // as the undamaged log has them
			p := pictureOf(b, name)
			if p == nil {
				missing += live
				continue
			}
			seen := map[string]bool{}
			restored := p.delayed // delayed, then: m2 or m5 of a, live
			for _, m := range p.ready {
				body := string(m.Message.Body)
				require.False(t, seen[body], "queue %s: %s twice", name, body)
				seen[body] = true
				if acked[name][body] {
					back++
					require.True(t, m.Redelivered, "queue %s: %s, acked, is back: redelivered", name, body)
				} else {
					restored++
				}
			}
			missing += live - restored
		}
		require.GreaterOrEqual(t, missing, 0)
		if counted {
			require.LessOrEqual(t, missing, bound, "every loss is in the Recovery: %+v", rec)
		}
		require.LessOrEqual(t, back, maybeSettled, "every acked message back is in the Recovery: %+v", rec)
		for _, name := range []string{"a", "b"} {
			if q, err := b.Queue(name); err == nil {
				for range q.Len() {
					d, err := q.Get(ctx)
					require.NoError(t, err)
					require.NoError(t, d.Ack())
				}
			}
		}
	})
}

// TestOpenDamagedLog: the log of a durable broker on the real file system, 20,000 small
// persistent messages in a queue over 6 segments or more, 2,000 of them acked and 1,000 out
// with a consumer when the broker closed; then each kind of damage (a flipped byte, a run of
// zeros, the file cut in half, the file deleted, a flipped byte of its header) at each place
// (the first segment, a middle one, the last one holding records, the empty one Close leaves
// after it). Without WithSalvage, Open loses no confirmed message without saying so: it fails
// with ErrCorrupt, naming the file, and leaves the directory as it was, unless the damage held
// nothing (the empty segment's header), when every message is back. With it, Open opens, and:
// the confirmed messages not acked that are missing are at most the records its Recovery says
// it skipped, plus the messages it knows lost; every acked message that comes back is
// redelivered, and they are at most the MaybeSettled it reports.
func TestOpenDamagedLog(t *testing.T) {
	const total, acks, outs = 20000, 2000, 1000
	src := t.TempDir()
	opts := logOptions(wal.Options{Sync: wal.SyncNever, SegmentSize: 64 << 10})
	// The backlog crosses the disk before the damage, and after it what may be paged is (a
	// message that may have been settled in a skipped stretch comes back redelivered, in memory).
	paged := WithPageWindow(64)
	b, err := Open(src, opts, paged)
	require.NoError(t, err)
	stopCompactor(b) // the log keeps every record where it was written: acks among publishes
	q := durableQueue(t, b, "jobs")
	ctx := context.Background()
	acked := map[int]bool{}
	for i := range total {
		require.NoError(t, b.Publish(ctx, "", "jobs", Message{Body: fmt.Appendf(nil, "m%05d", i), Persistent: true}))
		if i%20 != 19 {
			continue
		}
		for k := range 3 { // two acked, one left out: their records are all along the log
			d, err := q.Get(ctx)
			require.NoError(t, err)
			if k < 2 {
				require.NoError(t, d.Ack())
				var i int
				_, err = fmt.Sscanf(string(d.Message.Body), "m%d", &i)
				require.NoError(t, err)
				acked[i] = true
			}
		}
	}
	require.Len(t, acked, acks)
	require.Equal(t, outs, q.Unacked())
	require.Greater(t, pagedLen(q), total/2, "the backlog on disk")
	require.NoError(t, b.Close())
	segs := segmentNames(t, wal.OSFS{Dir: src})
	require.GreaterOrEqual(t, len(segs), 7, "6 segments of messages, and the empty one after them")
	places := []struct{ name, file string }{
		{"first", segs[0]},
		{"middle", segs[len(segs)/2]},
		{"last", segs[len(segs)-2]},
		{"empty last", segs[len(segs)-1]},
	}
	kinds := []struct {
		name   string
		damage func(data []byte) []byte // nil: delete the file
	}{
		{"flip", func(b []byte) []byte { b[len(b)/2] ^= 0x10; return b }},
		{"zero", func(b []byte) []byte { clear(b[len(b)/2 : min(len(b), len(b)/2+64)]); return b }},
		{"truncate", func(b []byte) []byte { return b[:len(b)/2] }},
		{"delete", nil},
		{"header", func(b []byte) []byte { b[20] ^= 0x01; return b }},
	}
	for _, place := range places {
		for _, kind := range kinds {
			t.Run(place.name+"/"+kind.name, func(t *testing.T) {
				t.Parallel()
				dir := t.TempDir()
				files := map[string][]byte{}
				for _, name := range segmentNames(t, wal.OSFS{Dir: src}) {
					data, err := os.ReadFile(filepath.Join(src, name))
					require.NoError(t, err)
					if name == place.file {
						if kind.damage == nil {
							continue
						}
						data = kind.damage(data)
					}
					files[name] = data
					require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o644))
				}

				b, err := Open(dir, opts, paged)
				if place.file == segs[len(segs)-1] && kind.damage != nil {
					require.NoError(t, err, "the empty segment held nothing")
					stopCompactor(b) // nothing to compact: the close is quicker
					require.Equal(t, total-acks, lookup(t, b, "jobs").Len(), "all back, the ones out too")
					require.Len(t, b.Recovery().Cut, 1)
					require.NoError(t, b.Close())
					return
				}
				require.ErrorIs(t, err, ErrCorrupt)
				require.ErrorContains(t, err, place.file)
				for _, name := range segmentNames(t, wal.OSFS{Dir: dir}) {
					data, err := os.ReadFile(filepath.Join(dir, name))
					require.NoError(t, err)
					require.Equal(t, files[name], data, "a failed Open writes nothing: %s", name)
					delete(files, name)
				}
				require.Empty(t, files, "a failed Open removes nothing")

				b, err = Open(dir, opts, paged, WithSalvage())
				require.NoError(t, err)
				stopCompactor(b)
				defer b.Close()
				rec := b.Recovery()
				require.NotEmpty(t, rec.Skipped)
				bound, maybeSettled := 0, 0
				for _, d := range rec.Skipped {
					if d.Records < 0 {
						require.Equal(t, segs[len(segs)-1], d.File, "only the empty last segment's records are not counted")
						continue
					}
					bound += d.Records
				}
				for _, d := range rec.Queues {
					bound += d.Lost
					maybeSettled += d.MaybeSettled
				}
				restored := map[int]bool{}
				back := 0
				if q, err := b.Queue("jobs"); err == nil {
					for after := uint64(0); ; {
						page := q.BrowseFrom(after, 1000)
						if len(page) == 0 {
							break
						}
						for _, m := range page {
							var i int
							_, err := fmt.Sscanf(string(m.Message.Body), "m%d", &i)
							require.NoError(t, err)
							require.False(t, restored[i], "m%05d back twice", i)
							restored[i] = true
							if acked[i] {
								back++
								require.True(t, m.Redelivered, "m%05d, acked, is back: redelivered", i)
							}
							after = m.ID
						}
					}
				}
				missing := 0
				for i := range total {
					if !acked[i] && !restored[i] {
						missing++
					}
				}
				t.Logf("%d confirmed messages missing (bound %d), %d acked back (bound %d); %+v", missing, bound, back, maybeSettled, rec.Skipped)
				require.LessOrEqual(t, missing, bound, "every loss is in the Recovery")
				require.LessOrEqual(t, back, maybeSettled, "every acked message back is in the Recovery")
				require.Equal(t, len(restored), rec.Messages)
			})
		}
	}
}

// TestOpenDamagedBacklogFromCheckpoint: after a clean Close, Open reads the checkpoint, not the
// segments of the backlog on disk, so damage to one of them is found when the queue reads it
// back: Get says so with ErrStorage (not ErrEmpty, with the messages still counted), and keeps
// saying so; the messages before it come out in order. WithSalvage reads the whole log, and
// says what the damage cost, as without a checkpoint.
func TestOpenDamagedBacklogFromCheckpoint(t *testing.T) {
	const total = 5000
	dir := t.TempDir()
	opts := []BrokerOption{logOptions(wal.Options{Sync: wal.SyncNever, SegmentSize: 16 << 10}), WithPageWindow(64)}
	b, err := Open(dir, opts...)
	require.NoError(t, err)
	stopCompactor(b)
	q := durableQueue(t, b, "jobs")
	ctx := context.Background()
	for i := range total {
		require.NoError(t, b.Publish(ctx, "", "jobs", Message{Body: fmt.Appendf(nil, "m%05d", i), Persistent: true}))
	}
	require.Greater(t, pagedLen(q), total-100)
	require.NoError(t, b.Close())
	segs := segmentNames(t, wal.OSFS{Dir: dir})
	require.Greater(t, len(segs), 8)
	damaged := segs[len(segs)/2]
	data, err := os.ReadFile(filepath.Join(dir, damaged))
	require.NoError(t, err)
	data[len(data)/2] ^= 0x10
	require.NoError(t, os.WriteFile(filepath.Join(dir, damaged), data, 0o644))

	b, err = Open(dir, opts...)
	require.NoError(t, err)
	require.True(t, b.Recovery().Checkpoint)
	q = lookup(t, b, "jobs")
	require.Equal(t, total, q.Len())
	got := 0
	for ; ; got++ {
		d, err := q.Get(ctx)
		if err != nil {
			require.ErrorIs(t, err, ErrStorage, "after m%05d", got-1)
			require.ErrorContains(t, err, "segment")
			break
		}
		require.Equal(t, fmt.Sprintf("m%05d", got), string(d.Message.Body))
		require.NoError(t, d.Ack())
	}
	require.Greater(t, got, 0)
	require.Less(t, got, total)
	require.Equal(t, total-got, q.Len(), "the rest is still counted")
	_, err = q.Get(ctx)
	require.ErrorIs(t, err, ErrStorage, "and still said")
	require.NoError(t, b.Close())

	b, err = Open(dir, append(opts, WithSalvage())...)
	require.NoError(t, err)
	defer b.Close()
	rec := b.Recovery()
	require.False(t, rec.Checkpoint, "salvage reads the whole log")
	require.NotEmpty(t, rec.Skipped)
	require.Equal(t, damaged, rec.Skipped[0].File)
}

// TestOpenLetsGoOfTheReplay: after Open, the heap holds the restored messages, not also the
// replay's copy of every body (the log kept it through a callback of its options: a 1M backlog
// took 535 B a message after Open, 288 after the fill).
func TestOpenLetsGoOfTheReplay(t *testing.T) {
	const n = 100_000
	dir := t.TempDir()
	base := liveHeap()
	b, err := Open(dir, WithSync(SyncNever), WithMemoryLimit(NoMemoryLimit))
	require.NoError(t, err)
	durableQueue(t, b, "backlog")
	batch := make([]Publishing, 250)
	for i := 0; i < n; i += len(batch) {
		for j := range batch {
			batch[j] = Publishing{Key: "backlog", Message: Message{Body: make([]byte, 128), Persistent: true}}
		}
		require.NoError(t, b.PublishBatch(context.Background(), batch))
	}
	filled := int64(liveHeap() - base)
	require.NoError(t, b.Close())
	require.NoError(t, removeCheckpoints(wal.OSFS{Dir: dir})) // the replay is what this is about
	base = liveHeap()
	b, err = Open(dir, WithSync(SyncNever), WithMemoryLimit(NoMemoryLimit))
	require.NoError(t, err)
	defer b.Close()
	opened := int64(liveHeap() - base)
	t.Logf("heap: %d B a message after the fill, %d after Open", filled/n, opened/n)
	assert.Less(t, opened, filled*13/10, "Open keeps what the fill kept, not also the replay")
}

package warren

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/wal"
)

// TestCheckpointsWhileRunning: a broker publishing into a paged backlog takes a checkpoint every
// few segments, whatever it is doing meanwhile (a checkpoint taken while the next one came due
// used to swallow the trigger, and none followed); a crash after them opens from the newest,
// replaying only the records after it, with every confirmed message back once, in order, and the
// backlog on disk but for about a window.
func TestCheckpointsWhileRunning(t *testing.T) {
	const every, batches = 4, 120
	fs := wal.NewMemFS()
	opts := []BrokerOption{checkpointEveryOption(every), WithPageWindow(64),
		logOptions(wal.Options{SegmentSize: 16 << 10, Sync: wal.SyncNever})}
	b, err := openBroker(fs, opts...)
	require.NoError(t, err)
	durableQueue(t, b, "q")
	batch := make([]Publishing, 256)
	n := 0
	publish := func(batches int) {
		for range batches {
			for j := range batch {
				batch[j] = Publishing{Key: "q", Message: Message{Body: fmt.Appendf(nil, "m%06d", n), Persistent: true}}
				n++
			}
			require.NoError(t, b.PublishBatch(context.Background(), batch))
		}
	}
	publish(batches)
	q := lookup(t, b, "q")
	acked := n / 4
	for i := range acked { // acks among them: settles of messages in the checkpoints' chunks
		d, err := q.Get(context.Background())
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("m%06d", i), string(d.Message.Body))
		require.NoError(t, d.Ack())
	}
	b.store.mu.Lock()
	segs, written := b.store.lastSeg, b.store.checkpoints
	b.store.mu.Unlock()
	require.Greater(t, segs, uint64(40))
	require.GreaterOrEqual(t, written, segs/every/2, "a checkpoint every %d segments or so, over %d", every, segs)
	stopCompactor(b) // no checkpoint after this: the crash replays 20 batches over the last one
	publish(20)
	require.NoError(t, b.store.log.Sync())

	crashed := fs.Clone() // what a kill -9 leaves: what was written stays
	r, err := openBroker(crashed, opts...)
	require.NoError(t, err)
	defer r.Close()
	require.True(t, r.Recovery().Checkpoint)
	rq := lookup(t, r, "q")
	require.Equal(t, n-acked, rq.Len())
	require.Greater(t, pagedLen(rq), rq.Len()-4*64, "what the records after the mark brought, newer than the chunks, is on disk too")
	for i := acked; i < n; i++ {
		d, err := rq.Get(context.Background())
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("m%06d", i), string(d.Message.Body))
		require.NoError(t, d.Ack())
	}
	_, err = rq.Get(context.Background())
	require.ErrorIs(t, err, ErrEmpty)
	require.NoError(t, b.Close())
}

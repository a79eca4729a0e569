package warren

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/wal"
)

// A durable broker against MemFS: what survives a restart, a process crash and a power loss
// (store.go, recovery.go). The log itself is tested in internal/wal.

func openTest(t *testing.T, fs wal.FS, opts ...BrokerOption) *Broker {
	t.Helper()
	b, err := openBroker(fs, opts...)
	require.NoError(t, err)
	return b
}

// persistent publishes persistent messages to queue through the default exchange.
func persistent(t *testing.T, b *Broker, queue string, bodies ...string) {
	t.Helper()
	for _, body := range bodies {
		require.NoError(t, b.Publish(context.Background(), "", queue, Message{Body: []byte(body), Persistent: true}))
	}
}

// held describes the ready messages of a queue: body, and the delivery count when not 0.
func held(t *testing.T, b *Broker, queue string) []string {
	t.Helper()
	q, err := b.Queue(queue)
	require.NoError(t, err)
	var out []string
	for {
		d, err := q.Get(context.Background())
		if err != nil {
			require.ErrorIs(t, err, ErrEmpty)
			return out
		}
		s := string(d.Message.Body)
		if d.Redelivered {
			s += fmt.Sprintf("(%d)", d.DeliveryCount)
		}
		out = append(out, s)
		require.NoError(t, d.Ack())
	}
}

func TestDurableRestart(t *testing.T) {
	fs := wal.NewMemFS()
	b := openTest(t, fs)
	ctx := context.Background()
	jobs, err := b.DeclareQueue("jobs", Durable())
	require.NoError(t, err)
	_, err = b.DeclareQueue("temp")
	require.NoError(t, err)
	persistent(t, b, "jobs", "m1", "m2", "m3")
	require.NoError(t, b.Publish(ctx, "", "jobs", Message{Body: []byte("transient")}))
	persistent(t, b, "jobs", "m4", "m5")
	persistent(t, b, "temp", "p1")

	d1, err := jobs.Get(ctx)
	require.NoError(t, err)
	require.NoError(t, d1.Ack())
	d2, err := jobs.Get(ctx)
	require.NoError(t, err)
	require.NoError(t, d2.Nack())
	d2, err = jobs.Get(ctx)
	require.NoError(t, err)
	require.NoError(t, d2.Nack()) // m2: returned twice
	_, err = jobs.Get(ctx)        // m2 again, out when the broker closes
	require.NoError(t, err)
	require.NoError(t, b.Close())

	b = openTest(t, fs)
	defer b.Close()
	_, err = b.Queue("temp")
	require.ErrorIs(t, err, ErrNotFound, "a transient queue does not survive")
	require.Equal(t, []string{"m2(3)", "m3", "m4", "m5"}, held(t, b, "jobs"),
		"acked gone, transient gone; m2 was out at the restart: redelivered, its count one higher")

	// The new life goes on from the recovered one.
	persistent(t, b, "jobs", "m6")
	require.NoError(t, b.Close())
	b = openTest(t, fs)
	defer b.Close()
	require.Equal(t, []string{"m6"}, held(t, b, "jobs"), "the acks of the second life stayed acked")
}

func TestDurableCrashes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sync  wal.SyncMode
		crash wal.CrashMode
	}{
		{"kill -9, SyncNever", wal.SyncNever, wal.KeepWritten},
		{"kill -9, SyncAlways", wal.SyncAlways, wal.KeepWritten},
		{"power loss, SyncAlways", wal.SyncAlways, wal.KeepSynced},
		{"torn power loss, SyncAlways", wal.SyncAlways, wal.TornTail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			fs := wal.NewMemFS()
			opts := logOptions(wal.Options{Sync: tc.sync})
			b := openTest(t, fs, opts)
			q, err := b.DeclareQueue("jobs", Durable(), DeliveryLimit(5))
			require.NoError(t, err)
			var want []string // what must be there after the crash, in order
			for i := range 50 {
				body := fmt.Sprint("m", i)
				persistent(t, b, "jobs", body)
				want = append(want, body)
			}
			// Take the first ten and ack them; the acks may be lost (at least once), so the
			// recovered queue may hold them again, redelivered, at its front.
			for range 10 {
				d, err := q.Get(context.Background())
				require.NoError(t, err)
				require.NoError(t, d.Ack())
			}
			require.NoError(t, b.store.log.Sync()) // the acks too, for this test
			fs.Crash(tc.crash, rng)
			b.Close() // the crashed log fails; the broker still closes

			b = openTest(t, fs, opts)
			defer b.Close()
			require.Equal(t, want[10:], held(t, b, "jobs"))
		})
	}
}

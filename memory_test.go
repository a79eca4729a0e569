package warren_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// footprintOf returns what one message of body costs b's budget: publish it into a scratch
// queue, read Memory, purge.
func footprintOf(t *testing.T, b *warren.Broker, m warren.Message) int64 {
	t.Helper()
	q := declare(t, b, "footprint")
	before := b.Memory().Used
	publishMsg(t, b, "footprint", m)
	n := b.Memory().Used - before
	_, err := q.Purge()
	require.NoError(t, err)
	deleteQueue(t, b, "footprint")
	require.Equal(t, before, b.Memory().Used, "purged: back where it was")
	return n
}

// TestMemoryAlarm: above the budget the alarm is set, a publish waits (told through
// WhileBlocked) until consumers bring the broker back within it, and the alarm's setting and
// clearing are events, in that order, with the memory and the budget.
func TestMemoryAlarm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// A message's cost on a broker with a listener (which keeps every message's Message).
		b := newBroker(t, warren.WithMemoryLimit(warren.NoMemoryLimit))
		recordEvents(t, b)
		body := warren.Message{Body: bytes.Repeat([]byte("x"), 1000)}
		one := footprintOf(t, b, body)
		require.Greater(t, one, int64(1000), "the body and the bookkeeping")
		b.Close()

		var logs strings.Builder
		b = newBroker(t, warren.WithMemoryLimit(3*one+one/2),
			warren.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		events := recordEvents(t, b)
		q := declare(t, b, "q")
		for range 3 {
			publishMsg(t, b, "q", body)
		}
		require.Equal(t, warren.MemoryStats{Used: 3 * one, Limit: 3*one + one/2}, b.Memory(), "within the budget")
		publishMsg(t, b, "q", body) // over it now: this one went in, the next waits
		m := b.Memory()
		require.True(t, m.Alarm)
		require.Equal(t, 4*one, m.Used)
		require.Equal(t, uint64(1), m.Alarms)
		synctest.Wait()
		require.Len(t, events.ofKind(warren.EventMemoryAlarm), 1)
		require.Contains(t, logs.String(), "memory alarm set")

		var mu sync.Mutex
		var told []bool
		tell := warren.WhileBlocked(func(blocked bool) {
			mu.Lock()
			told = append(told, blocked)
			mu.Unlock()
		})
		published := make(chan error, 1)
		go func() { published <- b.Publish(t.Context(), "", "q", body, tell) }()
		synctest.Wait()
		select {
		case err := <-published:
			t.Fatalf("a publish over the budget returned %v", err)
		default:
		}
		require.Equal(t, 1, b.Memory().Waiting)
		require.Equal(t, []bool{true}, told)
		require.Equal(t, 4, q.Len(), "the waiting publish is in no queue")

		d, err := q.Get(t.Context()) // out for delivery: still held
		require.NoError(t, err)
		synctest.Wait()
		require.True(t, b.Memory().Alarm, "a delivery not yet settled still counts")
		require.NoError(t, d.Ack())
		require.NoError(t, <-published, "back within the budget: it goes on")
		require.Equal(t, []bool{true, false}, told)
		require.Equal(t, 4, q.Len())
		synctest.Wait()
		m = b.Memory()
		require.True(t, m.Alarm, "the publish that waited took the broker over again")
		require.Equal(t, 4*one, m.Used)
		require.Equal(t, uint64(2), m.Alarms)

		_, err = q.Purge()
		require.NoError(t, err)
		synctest.Wait()
		require.Equal(t, warren.MemoryStats{Limit: 3*one + one/2, Alarms: 2}, b.Memory())
		var kinds []warren.EventKind
		for _, e := range events.where(func(e warren.Event) bool {
			return e.Kind == warren.EventMemoryAlarm || e.Kind == warren.EventMemoryAlarmCleared
		}) {
			kinds = append(kinds, e.Kind)
			require.Equal(t, 3*one+one/2, e.Limit)
			if e.Kind == warren.EventMemoryAlarm {
				require.Greater(t, e.Value, e.Limit)
			} else {
				require.LessOrEqual(t, e.Value, e.Limit)
			}
		}
		require.Equal(t, []warren.EventKind{warren.EventMemoryAlarm, warren.EventMemoryAlarmCleared,
			warren.EventMemoryAlarm, warren.EventMemoryAlarmCleared}, kinds, "set and cleared, alternating")
		require.Contains(t, logs.String(), "memory alarm cleared")
	})
}

// overBudget returns a broker whose memory alarm is set: a budget of one byte, and a queue
// "hold" holding one message.
func overBudget(t *testing.T, opts ...warren.BrokerOption) *warren.Broker {
	t.Helper()
	b := newBroker(t, append([]warren.BrokerOption{warren.WithMemoryLimit(1)}, opts...)...)
	declare(t, b, "hold")
	publish(t, b, "hold", "over")
	require.True(t, b.Memory().Alarm)
	return b
}

// TestMemoryAlarmContext: a publish waiting for memory fails with its context's error once the
// context ends, and no queue has the message.
func TestMemoryAlarmContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := overBudget(t)
		q := declare(t, b, "q")
		events := recordEvents(t, b)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start := time.Now()
		err := b.Publish(ctx, "", "q", msg("late"))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorContains(t, err, "memory limit")
		require.Equal(t, time.Second, time.Since(start))
		require.Zero(t, q.Len())
		require.Empty(t, events.ofKind(warren.EventPublished), "it was never published")
		require.Zero(t, b.Memory().Waiting)

		// The same through an exchange's routing.
		require.NoError(t, b.Bind("q", "amq.direct", "k", nil))
		ctx, cancel = context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		require.ErrorIs(t, b.Publish(ctx, "amq.direct", "k", msg("late")), context.DeadlineExceeded)
		require.Zero(t, q.Len())
	})
}

// TestMemoryAlarmRejectPublish: while the alarm is set a queue with a reject-publish policy
// refuses a publish at once (ErrQueueFull, dropped with reason memory-alarm: not dead-lettered,
// since the dead letter would take the memory the refusal saves); a publish routed to such a
// queue and to another waits, and then both take it.
func TestMemoryAlarmRejectPublish(t *testing.T) {
	for _, policy := range []warren.OverflowPolicy{warren.RejectPublish, warren.RejectPublishDLX} {
		t.Run(string(policy), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := overBudget(t)
				declare(t, b, "dlq")
				strict := declare(t, b, "strict", warren.Overflow(policy), warren.DeadLetter("", "dlq"))
				events := recordEvents(t, b)
				err := b.Publish(t.Context(), "", "strict", msg("refused"))
				require.ErrorIs(t, err, warren.ErrQueueFull)
				require.ErrorContains(t, err, "memory limit")
				require.Zero(t, strict.Len())
				dropped := events.of(warren.EventDropped, "strict")
				require.Len(t, dropped, 1)
				require.Equal(t, warren.ReasonMemoryAlarm, dropped[0].Reason)
				require.Empty(t, events.of(warren.EventEnqueued, "dlq"), "not dead-lettered")

				lax := declare(t, b, "lax")
				for _, name := range []string{"strict", "lax"} {
					require.NoError(t, b.Bind(name, "amq.fanout", "", nil))
				}
				published := make(chan error, 1)
				go func() { published <- b.Publish(t.Context(), "amq.fanout", "", msg("both")) }()
				synctest.Wait()
				require.Zero(t, lax.Len()+strict.Len(), "waiting: in no queue yet")
				hold, err := b.Queue("hold")
				require.NoError(t, err)
				_, err = hold.Purge()
				require.NoError(t, err)
				require.NoError(t, <-published)
				require.Equal(t, "both", drain(t, lax))
				require.Equal(t, "both", drain(t, strict))
			})
		})
	}
}

// TestMemoryAlarmLetsThrough: while the alarm is set, what carries a message the broker holds
// already goes on: dead letters and moves; and consumers keep taking and settling.
func TestMemoryAlarmLetsThrough(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		one := footprintOf(t, newBroker(t), msg("a"))
		b := newBroker(t, warren.WithMemoryLimit(one+one/2)) // over with two messages
		main, dead := deadTopology(t, b, warren.MessageTTL(time.Second))
		other := declare(t, b, "other")
		publish(t, b, main.Name(), "a")
		publish(t, b, main.Name(), "b")
		require.True(t, b.Memory().Alarm)
		time.Sleep(time.Second)
		synctest.Wait()
		require.Equal(t, 2, dead.Len(), "expired and dead-lettered under the alarm")
		n, err := dead.Move(t.Context(), "", other.Name(), warren.MoveLimit(1))
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, "a", drain(t, other))
		require.Equal(t, "b", drain(t, dead))
		synctest.Wait()
		require.False(t, b.Memory().Alarm)
		require.Zero(t, b.Memory().Used)
	})
}

// TestMemoryAlarmClose: Close lets a publish waiting for memory go with ErrClosed, and leaves
// no goroutine behind (the bubble checks).
func TestMemoryAlarmClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := overBudget(t)
		declare(t, b, "q")
		published := make(chan error, 1)
		go func() { published <- b.Publish(t.Context(), "", "q", msg("late")) }()
		synctest.Wait()
		require.NoError(t, b.Close())
		require.ErrorIs(t, <-published, warren.ErrClosed)
	})
}

// TestMemoryUsedFollowsQueues: the broker's total is the sum of what its queues hold, whatever
// the path a message takes out (ack, nack and redelivery, reject, expiry, purge, deletion, a
// queue's end), and each queue a message is in counts it.
func TestMemoryUsedFollowsQueues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, warren.WithMemoryLimit(warren.NoMemoryLimit))
		body := msg("0123456789")
		one := footprintOf(t, b, body)
		require.Zero(t, b.Memory().Limit, "no budget")

		a := declare(t, b, "a", warren.MessageTTL(time.Minute))
		declare(t, b, "b")
		for _, name := range []string{"a", "b"} {
			require.NoError(t, b.Bind(name, "amq.fanout", "", nil))
		}
		for range 4 {
			require.NoError(t, b.Publish(t.Context(), "amq.fanout", "", body))
		}
		require.Equal(t, 8*one, b.Memory().Used, "a message in two queues counts twice")
		c, err := a.Consume(t.Context(), warren.Prefetch(3))
		require.NoError(t, err)
		ds := receive(t, c, 3)
		require.Equal(t, 8*one, b.Memory().Used, "delivered, not settled")
		require.NoError(t, ds[0].Ack())
		require.NoError(t, ds[1].Nack())
		require.NoError(t, ds[2].Reject())
		synctest.Wait()
		require.Equal(t, 6*one, b.Memory().Used)
		c.Close()
		time.Sleep(time.Minute)
		synctest.Wait()
		require.Equal(t, 4*one, b.Memory().Used, "a's messages expired")
		require.Zero(t, b.Memory().Alarms, "no budget, no alarm")
		deleteQueue(t, b, "b")
		require.Zero(t, b.Memory().Used)
		require.NoError(t, b.Publish(t.Context(), "amq.fanout", "", body))
		require.NoError(t, b.Close())
		require.Zero(t, b.Memory().Used, "the queues' end")
	})
}

// TestMemoryFootprint: headers and properties count, so a message with large headers takes its
// share of the budget.
func TestMemoryFootprint(t *testing.T) {
	b := newBroker(t, warren.WithMemoryLimit(warren.NoMemoryLimit))
	plain := footprintOf(t, b, msg("x"))
	typed := footprintOf(t, b, warren.Message{Body: []byte("x"), ContentType: strings.Repeat("t", 100)})
	headed := footprintOf(t, b, warren.Message{Body: []byte("x"), Headers: warren.Table{
		"big": strings.Repeat("h", 10_000), "nested": warren.Table{"deep": []any{strings.Repeat("d", 1000)}}}})
	require.Greater(t, typed, plain+100)
	require.Greater(t, headed, plain+11_000)
}

// TestMemoryDefault: without WithMemoryLimit the budget is 40% of what the process may use;
// GOMEMLIMIT, when lower than the machine's memory, is what it may use.
func TestMemoryDefault(t *testing.T) {
	machine := warren.New().Memory().Limit
	t.Logf("default budget on this machine: %d MiB", machine>>20)
	prev := debug.SetMemoryLimit(1 << 30)
	defer debug.SetMemoryLimit(prev)
	b := warren.New()
	defer b.Close()
	want := int64(1<<30) * 4 / 10
	if machine > 0 && machine < want {
		want = machine
	}
	require.Equal(t, want, b.Memory().Limit)
	require.Equal(t, int64(12345), warren.New(warren.WithMemoryLimit(12345)).Memory().Limit)
}

// TestMemoryOfSystem: what the default reads of the machine and the cgroup.
func TestMemoryOfSystem(t *testing.T) {
	dir := t.TempDir()
	file := func(name, text string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
		return p
	}
	require.Equal(t, int64(16_303_340)<<10, warren.ReadMemTotal(file("meminfo",
		"MemTotal:       16303340 kB\nMemFree:         1234 kB\n")))
	require.Zero(t, warren.ReadMemTotal(file("garbled", "MemTotal: lots\n")))
	require.Zero(t, warren.ReadMemTotal(filepath.Join(dir, "missing")))
	require.Equal(t, int64(536870912), warren.ReadCgroupLimit(file("memory.max", "536870912\n")))
	require.Zero(t, warren.ReadCgroupLimit(file("unlimited", "max\n")), "no limit")
	require.Zero(t, warren.ReadCgroupLimit(filepath.Join(dir, "missing")))
}

// TestMemoryDurable: a durable broker counts what it restored at Open, so a backlog larger than
// the budget sets the alarm as soon as the broker opens; persistent publishes wait like the
// others, and the alarm clears as the backlog drains.
func TestMemoryDurable(t *testing.T) {
	dir := t.TempDir()
	b, err := warren.Open(dir, warren.WithMemoryLimit(warren.NoMemoryLimit))
	require.NoError(t, err)
	declare(t, b, "q", warren.Durable())
	for range 100 {
		publishMsg(t, b, "q", warren.Message{Body: []byte("0123456789"), Persistent: true})
	}
	used := b.Memory().Used
	require.NoError(t, b.Close())

	b, err = warren.Open(dir, warren.WithMemoryLimit(used/2))
	require.NoError(t, err)
	defer b.Close()
	m := b.Memory()
	require.Equal(t, used, m.Used, "what Open restored counts as what was published did")
	require.True(t, m.Alarm)
	q, err := b.Queue("q")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, b.Publish(ctx, "", "q", warren.Message{Body: []byte("late"), Persistent: true}),
		context.DeadlineExceeded)
	require.Equal(t, 100, q.Len())
	for range 100 {
		d, err := q.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, d.Ack())
	}
	m = b.Memory()
	require.False(t, m.Alarm)
	require.Zero(t, m.Used)
}

// TestMemoryHeaderCosts: a publish's headers are counted by the walk that checks them, a dead
// letter's and a replayed message's by tableCost: both count the same.
func TestMemoryHeaderCosts(t *testing.T) {
	for _, h := range []warren.Table{
		{},
		{"a": "b"},
		{"n": int32(1), "s": strings.Repeat("s", 100), "b": []byte("bytes"), "t": time.Unix(1, 0)},
		{"x-death": []any{warren.Table{"queue": "q", "count": int64(1), "routing-keys": []any{"k"}}}},
		{"deep": warren.Table{"er": map[string]any{"still": []any{[]any{"x"}, nil}}}},
	} {
		walked, estimated := warren.HeaderCosts(h)
		require.Equal(t, estimated, walked, "%v", h)
	}
}

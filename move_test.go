package warren_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// rejectAll rejects every message of q (with its dead-letter exchange: dead-letters them).
func rejectAll(t *testing.T, q *warren.Queue) {
	t.Helper()
	for {
		d, err := q.Get(t.Context())
		if err != nil {
			require.ErrorIs(t, err, warren.ErrEmpty)
			return
		}
		require.NoError(t, d.Reject())
	}
}

// Moving the dead letters back after a fix: every one leaves the DLQ and enters the work queue
// as it is (properties, headers, x-death), in order, evented as moved on both sides.
func TestMoveBackFromDeadLetterQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		events := recordEvents(t, b)
		main, dead := deadTopology(t, b)
		for i := range 5 {
			publishMsg(t, b, "main", warren.Message{Body: []byte(strconv.Itoa(i)), ContentType: "text/plain",
				MessageID: "m" + strconv.Itoa(i), Headers: warren.Table{"attempt": int32(i)}})
		}
		rejectAll(t, main)
		require.Equal(t, 5, dead.Len())

		n, err := dead.Move(t.Context(), "", "main")
		require.NoError(t, err)
		require.Equal(t, 5, n)
		require.Equal(t, 0, dead.Len())
		require.Equal(t, 0, dead.Unacked())
		ds := getAll(t, main)
		require.Equal(t, "0 1 2 3 4", bodies(ds))
		for i, d := range ds {
			require.Equal(t, "text/plain", d.Message.ContentType)
			require.Equal(t, "m"+strconv.Itoa(i), d.Message.MessageID)
			require.Equal(t, int32(i), d.Message.Headers["attempt"])
			deaths := xDeath(t, d)
			require.Len(t, deaths, 1, "x-death kept")
			require.Equal(t, "main", deaths[0]["queue"])
			require.Equal(t, "rejected", deaths[0]["reason"])
			require.False(t, d.Redelivered, "a new message in its new queue")
		}
		synctest.Wait()
		require.Len(t, events.of(warren.EventMoved, "dead"), 5)
		require.True(t, warren.EventMoved.Terminal())
		moved := events.where(func(e warren.Event) bool {
			return e.Kind == warren.EventEnqueued && e.Queue == "main" && e.Reason == warren.ReasonMoved
		})
		require.Len(t, moved, 5)
	})
}

// MoveLimit moves the first n; MoveIDs the messages BrowseFrom named, skipping those no longer
// ready; the others keep their places.
func TestMoveSelected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		src := declare(t, b, "src")
		dst := declare(t, b, "dst")
		publishN(t, b, src, 8)

		n, err := src.Move(t.Context(), "", "dst", warren.MoveLimit(2))
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.Equal(t, []string{"2", "3", "4", "5", "6", "7"}, browse(src))

		page := src.BrowseFrom(0, 3)
		require.Len(t, page, 3)
		require.Equal(t, "2 3 4", readyBodies(page))
		next := src.BrowseFrom(page[2].ID, 10)
		require.Equal(t, "5 6 7", readyBodies(next))
		require.Empty(t, src.BrowseFrom(next[2].ID, 10))

		// "3", "6" and "2" are named, and "2" is out with a Get by then.
		d, err := src.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, d.Nack()) // back to its place, redelivered: still ready, same ID
		require.Equal(t, page[0].ID, src.BrowseFrom(0, 1)[0].ID, "the same ID after coming back")
		got, err := src.Get(t.Context()) // "2": out with a Get, not ready
		require.NoError(t, err)
		n, err = src.Move(t.Context(), "", "dst", warren.MoveIDs(next[1].ID, page[1].ID, page[0].ID))
		require.NoError(t, err)
		require.Equal(t, 2, n, `"2" is out with a Get`)
		require.NoError(t, got.Nack())
		require.Equal(t, []string{"2", "4", "5", "7"}, browse(src))
		require.Equal(t, []string{"0", "1", "3", "6"}, browse(dst))

		_, err = src.Move(t.Context(), "", "dst", warren.MoveLimit(0))
		require.ErrorIs(t, err, warren.ErrInvalidArgument)
	})
}

// A destination that refuses stops the move; the message it refused stays in its place,
// unchanged, and nothing is lost.
func TestMoveRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		src := declare(t, b, "src")
		full := declare(t, b, "full", warren.MaxLength(1), warren.Overflow(warren.RejectPublish))
		publishN(t, b, src, 3)

		_, err := src.Move(t.Context(), "", "nowhere")
		require.ErrorIs(t, err, warren.ErrUnroutable)
		_, err = src.Move(t.Context(), "missing", "k")
		require.ErrorIs(t, err, warren.ErrNotFound)
		n, err := src.Move(t.Context(), "", "full")
		require.ErrorIs(t, err, warren.ErrQueueFull)
		require.Equal(t, 1, n)
		require.Equal(t, 1, full.Len())
		require.Equal(t, 0, src.Unacked())
		ds := getAll(t, src)
		require.Equal(t, "1 2", bodies(ds))
		for _, d := range ds {
			require.False(t, d.Redelivered, "a refused message goes back unchanged")
		}
	})
}

// An exclusive queue is moved from only with its owner's context; a deleted one not at all.
func TestMoveOwnerAndDeleted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		owner, cancel := warren.NewOwner(t.Context())
		defer cancel()
		q := declare(t, b, "mine", warren.ExclusiveTo(owner))
		declare(t, b, "dst")
		publish(t, b, "mine", "x")
		_, err := q.Move(t.Context(), "", "dst")
		require.ErrorIs(t, err, warren.ErrResourceLocked)
		n, err := q.Move(owner, "", "dst")
		require.NoError(t, err)
		require.Equal(t, 1, n)
		deleteQueue(t, b, "dst")
		src := declare(t, b, "src")
		deleteQueue(t, b, "src")
		_, err = src.Move(t.Context(), "", "mine")
		require.ErrorIs(t, err, warren.ErrQueueDeleted)
	})
}

// Under concurrent consumers of both queues and moves back and forth, every message is acked
// exactly once and none is lost. A failure anywhere is reported with t.Error (FailNow is for the
// test's goroutine) and ends the others through ctx.
func TestMoveUnderLoad(t *testing.T) {
	b := warren.New()
	defer b.Close()
	a, err := b.DeclareQueue("a")
	require.NoError(t, err)
	z, err := b.DeclareQueue("z")
	require.NoError(t, err)
	const n = 20000
	var acks [n]atomic.Int32
	var acked atomic.Int64
	all := make(chan struct{}) // closed when the last message is acked
	ctx, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	ok := func(err error) bool {
		if err != nil {
			t.Error(err)
			stop()
		}
		return err == nil
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range n {
			if !ok(b.Publish(ctx, "", "a", warren.Message{Body: []byte(strconv.Itoa(i))})) {
				return
			}
		}
	})
	consume := func(q *warren.Queue) {
		c, err := q.Consume(ctx, warren.Prefetch(8))
		if !ok(err) {
			return
		}
		defer c.Cancel()
		for {
			select {
			case d := <-c.Deliveries():
				i, _ := strconv.Atoi(string(d.Message.Body))
				if i%7 == 0 && !d.Redelivered {
					if !ok(d.Nack()) {
						return
					}
					continue
				}
				if !ok(d.Ack()) {
					return
				}
				acks[i].Add(1)
				if acked.Add(1) == n {
					close(all)
				}
			case <-all:
				return
			case <-ctx.Done():
				return
			}
		}
	}
	wg.Go(func() { consume(a) })
	wg.Go(func() { consume(z) })
	for _, pair := range [][2]*warren.Queue{{a, z}, {z, a}} {
		wg.Go(func() {
			for {
				select {
				case <-all:
					return
				case <-ctx.Done():
					return
				default:
				}
				if _, err := pair[0].Move(ctx, "", pair[1].Name(), warren.MoveLimit(50)); !ok(err) {
					return
				}
				time.Sleep(100 * time.Microsecond) // real time: a stress test, not a timing test
			}
		})
	}
	wg.Wait()
	require.NoError(t, ctx.Err(), "the messages were all acked before the timeout")
	require.Equal(t, int64(n), acked.Load(), "every message acked")
	for i := range n {
		require.Equal(t, int32(1), acks[i].Load(), "message %d acked once", i)
	}
	require.Zero(t, a.Len()+z.Len()+a.Unacked()+z.Unacked())
	sa, sz := a.Stats(), z.Stats()
	require.Positive(t, sa.Moved+sz.Moved, "messages moved")
}

// readyBodies renders ready messages' bodies space-separated.
func readyBodies(ms []warren.ReadyMessage) string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m.Message.Body)
	}
	return strings.Join(out, " ")
}

// A source deleted while its message is on the way: the message reached the destination, so
// it counts as moved, once — EventMoved, not also dropped with the queue — and Move says why it
// stopped. One that the destination refused instead goes with its queue, dropped once.
func TestMoveSourceDeletedMidway(t *testing.T) {
	for _, refused := range []bool{false, true} {
		t.Run(fmt.Sprint("refused=", refused), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				events := recordEvents(t, b)
				src := declare(t, b, "src")
				dst := declare(t, b, "dst", warren.MaxLength(1), warren.Overflow(warren.RejectPublish))
				if refused {
					publish(t, b, "dst", "filler")
				}
				publishN(t, b, src, 3)
				b.Listen(func(e warren.Event) {
					// On Move's goroutine, between its publish and settle.
					if e.Queue == "dst" && (e.Kind == warren.EventEnqueued && e.Reason == warren.ReasonMoved ||
						e.Kind == warren.EventDropped && e.Reason == warren.ReasonQueueFull) {
						_, err := b.DeleteQueue("src")
						require.NoError(t, err)
					}
				})
				n, err := src.Move(t.Context(), "", "dst")
				require.ErrorIs(t, err, warren.ErrQueueDeleted)
				synctest.Wait()
				dropped := events.of(warren.EventDropped, "src")
				moved := events.of(warren.EventMoved, "src")
				if refused {
					require.Zero(t, n)
					require.Equal(t, []string{"filler"}, browse(dst))
					require.Empty(t, moved)
					require.Len(t, dropped, 3, "each message of src dropped once")
				} else {
					require.Equal(t, 1, n, "the first message reached dst before its source went")
					require.Equal(t, []string{"0"}, browse(dst))
					require.Len(t, moved, 1)
					require.Equal(t, "0", string(moved[0].Message.Body))
					require.Len(t, dropped, 2, "the moved message is not dropped too")
				}
				for _, e := range dropped {
					require.Equal(t, warren.ReasonQueueDeleted, e.Reason)
				}
				s := src.Stats()
				require.Equal(t, uint64(len(moved)), s.Moved)
				require.Equal(t, uint64(len(dropped)), s.Dropped)
			})
		})
	}
}

// A move to a destination that routes back to the source moves each message that was there
// when it began once, and stops: what it moved in, and what is published meanwhile, stays.
func TestMoveBackIntoItself(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishRange(t, b, q, 0, 5)
		// The limit only keeps a broken move from spinning for ever.
		n, err := q.Move(t.Context(), "", "q", warren.MoveLimit(100))
		require.NoError(t, err)
		require.Equal(t, 5, n)
		require.Equal(t, "0 1 2 3 4", strings.Join(browse(q), " "), "moved to the tail, in order")

		// Through a fanout to itself and another queue, with a message published during the move.
		other := declare(t, b, "other")
		_, err = b.DeclareExchange("both", warren.ExchangeFanout)
		require.NoError(t, err)
		require.NoError(t, b.Bind("q", "both", "", nil))
		require.NoError(t, b.Bind("other", "both", "", nil))
		var once sync.Once
		b.Listen(func(e warren.Event) {
			if e.Kind == warren.EventMoved {
				once.Do(func() { publish(t, b, "q", "late") }) // on Move's goroutine, mid-move
			}
		})
		n, err = q.Move(t.Context(), "both", "", warren.MoveLimit(100))
		require.NoError(t, err)
		require.Equal(t, 5, n)
		require.Equal(t, "0 late 1 2 3 4", strings.Join(browse(q), " "), "published after the first move, late was not moved")
		require.Equal(t, "0 1 2 3 4", strings.Join(browse(other), " "))
		require.Equal(t, uint64(10), q.Stats().Moved)
	})
}

// With priorities, a move from the head passes over newer messages of a higher priority, which
// stay, and moves the older ones behind them.
func TestMoveBackIntoItselfWithPriorities(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.MaxPriority(5))
		for i, p := range []uint8{1, 5, 3} {
			publishMsg(t, b, "q", warren.Message{Body: []byte(strconv.Itoa(i)), Priority: p})
		}
		require.Equal(t, "1 2 0", strings.Join(browse(q), " "))
		n, err := q.Move(t.Context(), "", "q", warren.MoveLimit(100))
		require.NoError(t, err)
		require.Equal(t, 3, n)
		require.Equal(t, "1 2 0", strings.Join(browse(q), " "), "each moved once, back to its priority's tail")

		// Many, of every priority, one of them expired first: each of the others moved once, the
		// queue's order unchanged.
		many := declare(t, b, "many", warren.MaxPriority(3))
		for i := range 300 {
			m := warren.Message{Body: []byte(strconv.Itoa(i)), Priority: uint8(i % 4)}
			if i == 150 {
				m.Expiration = "1000"
			}
			publishMsg(t, b, "many", m)
		}
		time.Sleep(2 * time.Second) // only the bubble's clock: message 150 expires
		want := slices.DeleteFunc(browse(many), func(s string) bool { return s == "150" })
		n, err = many.Move(t.Context(), "", "many", warren.MoveLimit(1000))
		require.NoError(t, err)
		require.Equal(t, 299, n)
		require.Equal(t, want, browse(many))
		require.Equal(t, uint64(299), many.Stats().Moved)
	})
}

// A destination that routes a message to several queues, one of them full: the message counts
// as moved once a queue took it, and leaves the source; the full queue refuses its copy as it
// refuses any publish's (reject-publish-dlx dead-letters it). Move stops there with the
// refusal, and each retry moves the next message once: no copy grows with retries. A full
// queue that is the only destination takes nothing, and the message stays, with no copy
// anywhere (none in the full queue's dead-letter queue either).
func TestMovePartlyRefused(t *testing.T) {
	for _, overflow := range []warren.OverflowPolicy{warren.RejectPublish, warren.RejectPublishDLX} {
		t.Run(string(overflow), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				events := recordEvents(t, b)
				src := declare(t, b, "src")
				ok := declare(t, b, "ok")
				_, err := b.DeclareExchange("full-dead", warren.ExchangeFanout)
				require.NoError(t, err)
				dead := declare(t, b, "dead")
				require.NoError(t, b.Bind("dead", "full-dead", "", nil))
				full := declare(t, b, "full", warren.MaxLength(1), warren.Overflow(overflow),
					warren.DeadLetter("full-dead", ""))
				publish(t, b, "full", "filler")
				_, err = b.DeclareExchange("both", warren.ExchangeFanout)
				require.NoError(t, err)
				require.NoError(t, b.Bind("ok", "both", "", nil))
				require.NoError(t, b.Bind("full", "both", "", nil))
				publishN(t, b, src, 3)

				// The full queue alone: refused, the message stays, nothing is copied.
				for range 3 {
					n, err := src.Move(t.Context(), "", "full")
					require.ErrorIs(t, err, warren.ErrQueueFull)
					require.Zero(t, n)
				}
				require.Equal(t, []string{"0", "1", "2"}, browse(src))
				require.Equal(t, []string{"filler"}, browse(full))
				require.Empty(t, browse(dead), "a refusal that left the message in its source copies it nowhere")

				// Through the fanout: each Move moves one, partly.
				for i := range 3 {
					n, err := src.Move(t.Context(), "both", "")
					require.ErrorIs(t, err, warren.ErrQueueFull, "Move(both) #%d", i)
					require.ErrorContains(t, err, `moved, but queue "full"`, "the error says the message moved")
					require.Equal(t, 1, n, "Move(both) #%d moved the message the ok queue took", i)
				}
				n, err := src.Move(t.Context(), "both", "")
				require.NoError(t, err)
				require.Zero(t, n)
				require.Empty(t, browse(src))
				require.Zero(t, src.Unacked())
				require.Equal(t, []string{"0", "1", "2"}, browse(ok), "each moved once")
				require.Equal(t, []string{"filler"}, browse(full))
				if overflow == warren.RejectPublishDLX {
					require.Equal(t, []string{"0", "1", "2"}, browse(dead), "the full queue dead-lettered its copy, once")
				} else {
					require.Empty(t, browse(dead))
				}

				synctest.Wait()
				require.Len(t, events.of(warren.EventMoved, "src"), 3)
				require.Empty(t, events.of(warren.EventDropped, "src"))
				require.Equal(t, uint64(3), src.Stats().Moved)
				// Three refusals alone, three beside the ok queue's copy.
				refused := events.of(warren.EventDropped, "full")
				if overflow == warren.RejectPublishDLX {
					require.Len(t, refused, 3)
					require.Len(t, events.of(warren.EventDeadLettered, "full"), 3)
				} else {
					require.Len(t, refused, 6)
				}
				for _, e := range refused {
					require.Equal(t, warren.ReasonQueueFull, e.Reason)
				}
			})
		})
	}
}

// openMoveBroker opens the durable broker in dir and declares its durable queues src and dst.
func openMoveBroker(t *testing.T, dir string) (b *warren.Broker, src, dst *warren.Queue) {
	t.Helper()
	b, err := warren.Open(dir, warren.WithSync(warren.SyncNever))
	require.NoError(t, err)
	return b, declare(t, b, "src", warren.Durable()), declare(t, b, "dst", warren.Durable())
}

// publishPersistent publishes persistent messages "0".."n-1" to q.
func publishPersistent(t *testing.T, b *warren.Broker, q *warren.Queue, n int) {
	t.Helper()
	for i := range n {
		publishMsg(t, b, q.Name(), warren.Message{Body: []byte(strconv.Itoa(i)), Persistent: true})
	}
}

// requireHeldOnce reopens the durable broker in dir and requires that its queues src and dst
// together hold each of the messages "0".."n-1" exactly once.
func requireHeldOnce(t *testing.T, dir string, n int) {
	t.Helper()
	b, src, dst := openMoveBroker(t, dir)
	defer b.Close()
	want := make([]string, n)
	for i := range want {
		want[i] = strconv.Itoa(i)
	}
	s, d := browse(src), browse(dst)
	require.ElementsMatch(t, want, append(s, d...), "after reopen: src %v, dst %v", s, d)
}

// A clean Close while a message is on its way — published to the destination, not yet settled
// in the source, which Close ends — leaves it in exactly one queue after reopen: the move is
// settled in the log before Close closes it.
func TestMoveCloseMidway(t *testing.T) {
	dir := t.TempDir()
	b, src, _ := openMoveBroker(t, dir)
	publishPersistent(t, b, src, 3)
	srcEnded, closed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b.Listen(func(e warren.Event) {
		switch {
		case e.Kind == warren.EventQueueDeleted && e.Queue == "src": // on Close's goroutine
			close(srcEnded)
		case e.Kind == warren.EventEnqueued && e.Queue == "dst": // on Move's, after the publish
			once.Do(func() {
				// Close on a goroutine of its own (a listener must not wait for the broker);
				// the move goes on once Close has ended the source.
				go func() {
					b.Close()
					close(closed)
				}()
				<-srcEnded
			})
		}
	})
	n, err := src.Move(context.Background(), "", "dst")
	require.ErrorIs(t, err, warren.ErrClosed)
	require.Equal(t, 1, n, "the message on its way when Close came is moved")
	<-closed
	requireHeldOnce(t, dir, 3)
}

// Close racing a run of moves, round after round: after reopen every message is in exactly one
// of the two queues — none in both, none lost.
func TestMoveCloseRacing(t *testing.T) {
	const rounds, n = 20, 20
	for round := range rounds {
		dir := t.TempDir()
		b, src, _ := openMoveBroker(t, dir)
		publishPersistent(t, b, src, n)
		started := make(chan struct{})
		var moveErr error
		var wg sync.WaitGroup
		wg.Go(func() {
			for i := 0; ; i++ {
				moved, err := src.Move(context.Background(), "", "dst", warren.MoveLimit(1))
				if i == 0 {
					close(started)
				}
				if err != nil || moved == 0 {
					moveErr = err
					return
				}
			}
		})
		<-started
		require.NoError(t, b.Close())
		wg.Wait()
		if moveErr != nil {
			require.ErrorIs(t, moveErr, warren.ErrClosed, "round %d", round)
		}
		requireHeldOnce(t, dir, n)
	}
}

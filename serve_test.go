package warren_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warrenmq/warren"
)

// Tests of (*Queue).Serve. Everything that involves time or blocking handlers runs in a
// synctest bubble, which also fails the test if Serve leaves a goroutine behind; the stress
// test runs real concurrency and checks for leaks with goleak.

// serveRun is a Serve running on its own goroutine.
type serveRun struct {
	done chan struct{}
	err  error
}

// startServe runs q.Serve(ctx, h, opts...) on a goroutine of its own.
func startServe(ctx context.Context, q *warren.Queue, h warren.Handler, opts ...warren.ServeOption) *serveRun {
	r := &serveRun{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = q.Serve(ctx, h, opts...)
	}()
	return r
}

// returned reports whether Serve has returned, without waiting.
func (r *serveRun) returned() bool { return isClosed(r.done) }

// wait waits for Serve to return and returns its result.
func (r *serveRun) wait() error {
	<-r.done
	return r.err
}

// dlqTopology declares queue "dlq" and queue "main" dead-lettering to it through the default
// exchange (DeadLetter("", "dlq")), with opts.
func dlqTopology(t *testing.T, b *warren.Broker, opts ...warren.QueueOption) (main, dlq *warren.Queue) {
	t.Helper()
	dlq = declare(t, b, "dlq")
	main = declare(t, b, "main", append([]warren.QueueOption{warren.DeadLetter("", "dlq")}, opts...)...)
	return main, dlq
}

// panicEvents records the events a broker tells its listeners.
type panicEvents struct {
	mu   sync.Mutex
	list []warren.Event
}

func (e *panicEvents) add(ev warren.Event) {
	if ev.Kind != warren.EventHandlerPanicked {
		return // the panic events are what these tests count
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, ev)
}

func (e *panicEvents) all() []warren.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.list)
}

// handlerTrace records what handlers saw, as "body/deliverycount" strings.
type handlerTrace struct {
	mu   sync.Mutex
	list []string
}

func (r *handlerTrace) add(d warren.Delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, fmt.Sprintf("%s/%d", d.Message.Body, d.DeliveryCount))
}

func (r *handlerTrace) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.list)
}

func bodyID(t *testing.T, d warren.Delivery) int {
	id, err := strconv.Atoi(string(d.Message.Body))
	if err != nil {
		t.Errorf("body %q: %v", d.Message.Body, err)
	}
	return id
}

// TestServePanicIsRetriedThenDeadLettered: a handler that panics on one message and succeeds on
// the others. The service survives, the panicking message is retried up to the delivery limit
// and then dead-lettered with reason "delivery_limit"; each panic is logged with its stack and
// reported to listeners.
func TestServePanicIsRetriedThenDeadLettered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs logBuffer
		b := newBroker(t, warren.WithLogger(slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
		var events panicEvents
		stop := b.Listen(events.add)
		defer stop()
		main, dlq := dlqTopology(t, b, warren.DeliveryLimit(2))
		publishN(t, b, main, 5)

		var seen handlerTrace
		h := func(ctx context.Context, d warren.Delivery) error {
			seen.add(d)
			if string(d.Message.Body) == "2" {
				panic("poison message 2")
			}
			return nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		run := startServe(ctx, main, h, warren.ConsumerTag("svc"))
		synctest.Wait()

		require.False(t, run.returned(), "Serve survives the handler's panics: %v", run.err)
		require.Equal(t, []string{"0/0", "1/0", "2/0", "2/1", "2/2", "3/0", "4/0"}, seen.get(),
			"2 is retried at once, at the head, three deliveries in all; the others are acked")
		require.Equal(t, 0, main.Len())
		require.Equal(t, 0, main.Unacked())

		dead := getAll(t, dlq)
		require.Equal(t, "2", bodies(dead))
		x := xDeath(t, dead[0])
		require.Len(t, x, 1)
		require.Equal(t, "delivery_limit", x[0]["reason"])
		require.Equal(t, "main", x[0]["queue"])
		require.Equal(t, int64(1), x[0]["count"])

		evs := events.all()
		require.Len(t, evs, 3, "one event per panic")
		for _, ev := range evs {
			require.Equal(t, warren.EventHandlerPanicked, ev.Kind)
			require.Equal(t, "handler-panicked", ev.Kind.String())
			require.Equal(t, "main", ev.Queue)
			require.Equal(t, "svc", ev.Consumer)
			require.NotNil(t, ev.Message)
			require.Equal(t, "2", string(ev.Message.Body))
			require.Error(t, ev.Err)
			require.Contains(t, ev.Err.Error(), "poison message 2")
		}

		recs := logs.records(t, "warren: handler panicked")
		require.Len(t, recs, 3, "one log record per panic")
		for _, r := range recs {
			require.Equal(t, "ERROR", r["level"])
			require.Equal(t, "main", r["queue"])
			require.Equal(t, "svc", r["consumer"])
			require.Contains(t, fmt.Sprint(r["panic"]), "poison message 2")
			stack, _ := r["stack"].(string)
			require.Contains(t, stack, "panic(", "the stack of the panic")
			require.Contains(t, stack, "serve_test.go", "the stack reaches the handler")
		}

		cancel()
		require.NoError(t, run.wait())
	})
}

// TestServePanicWithErrorValue: a handler panicking with an error value, on a queue without a
// delivery limit, is retried until it succeeds; the event says what the panic value was.
func TestServePanicWithErrorValue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		var events panicEvents
		defer b.Listen(events.add)()
		q := declare(t, b, "q")
		publishN(t, b, q, 1)
		boom := errors.New("boom")
		var seen handlerTrace
		h := func(ctx context.Context, d warren.Delivery) error {
			seen.add(d)
			if d.DeliveryCount < 3 {
				panic(boom)
			}
			return nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, q, h)
		synctest.Wait()
		require.Equal(t, []string{"0/0", "0/1", "0/2", "0/3"}, seen.get())
		require.Equal(t, 0, q.Len()+q.Unacked(), "acked at the fourth attempt")
		evs := events.all()
		require.Len(t, evs, 3)
		for _, ev := range evs {
			require.ErrorIs(t, ev.Err, boom)
			require.NotErrorIs(t, ev.Err, warren.ErrPermanent)
		}
		cancel()
		require.NoError(t, run.wait())
	})
}

// opError is an error type as os.PathError is: pointer methods that read its fields, so that a
// nil *opError panics in each of them.
type opError struct {
	op  string
	err error
}

func (e *opError) Error() string { return e.op + ": " + e.err.Error() }
func (e *opError) Unwrap() error { return e.err }

// TestServeTypedNilError: a handler that returns a nil *opError in a non-nil error (the typed
// nil mistake), bare or wrapped, fails its delivery like any error: the message is retried up to
// the delivery limit and dead-lettered, the log names the type, and the process lives on,
// though looking for ErrPermanent in such an error calls its Unwrap on the nil pointer.
func TestServeTypedNilError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs logBuffer
		b := newBroker(t, warren.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
		main, dlq := dlqTopology(t, b, warren.DeliveryLimit(1))
		publishN(t, b, main, 3)
		var seen handlerTrace
		h := func(ctx context.Context, d warren.Delivery) error {
			seen.add(d)
			var nilErr *opError
			switch string(d.Message.Body) {
			case "0":
				return nilErr
			case "1":
				return errors.Join(nilErr)
			}
			return nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, main, h, warren.ConsumerTag("svc"))
		synctest.Wait()
		require.False(t, run.returned(), "Serve goes on: %v", run.err)
		require.Equal(t, []string{"0/0", "0/1", "1/0", "1/1", "2/0"}, seen.get(), "each failure retried once")
		require.Equal(t, "0 1", bodies(getAll(t, dlq)), "dead-lettered past the delivery limit")
		require.Equal(t, 0, main.Len()+main.Unacked())

		bare := logs.records(t, "warren: handler returned a typed nil error; delivery failed")
		require.Len(t, bare, 2, "one record per attempt")
		for _, r := range bare {
			require.Equal(t, "ERROR", r["level"])
			require.Equal(t, "svc", r["consumer"])
			require.Equal(t, "warren: handler returned a nil *warren_test.opError", r["err"])
		}
		wrapped := logs.records(t, "warren: handler's error panicked when inspected; delivery failed")
		require.Len(t, wrapped, 2, "one record per attempt")
		for _, r := range wrapped {
			require.Equal(t, "*errors.joinError", r["type"])
			require.Contains(t, fmt.Sprint(r["panic"]), "nil pointer dereference")
		}
		cancel()
		require.NoError(t, run.wait())
	})
}

// TestServeGracefulDrain: several workers hold deliveries and more are buffered when ctx ends.
// The buffered ones go back unchanged at once; Serve waits for the running handlers, which see
// ctx done, applies their results, and returns nil with nothing outstanding.
func TestServeGracefulDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 20)
		gate := make(chan struct{})
		var (
			mu      sync.Mutex
			started []string
			ctxErrs = map[string]error{}
		)
		h := func(ctx context.Context, d warren.Delivery) error {
			body := string(d.Message.Body)
			mu.Lock()
			started = append(started, body)
			mu.Unlock()
			<-gate
			mu.Lock()
			ctxErrs[body] = ctx.Err()
			mu.Unlock()
			if bodyID(t, d)%2 == 1 {
				return errors.New("odd ones fail")
			}
			return nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, q, h, warren.Workers(4), warren.Prefetch(8))
		synctest.Wait()
		mu.Lock()
		require.ElementsMatch(t, []string{"0", "1", "2", "3"}, started)
		mu.Unlock()
		require.Equal(t, 8, q.Unacked(), "4 in handlers, 4 buffered")
		require.Equal(t, 12, q.Len())

		cancel()
		synctest.Wait()
		require.False(t, run.returned(), "Serve waits for its running handlers")
		require.Equal(t, 4, q.Unacked(), "only the deliveries in handlers are outstanding")
		require.Equal(t, 16, q.Len(), "the buffered deliveries are back")

		close(gate)
		require.NoError(t, run.wait())
		mu.Lock()
		require.ElementsMatch(t, []string{"0", "1", "2", "3"}, started, "no handler starts after ctx ends")
		require.Len(t, ctxErrs, 4)
		for body, err := range ctxErrs {
			require.ErrorIs(t, err, context.Canceled, "handler of %s sees ctx done", body)
		}
		mu.Unlock()
		require.Equal(t, 0, q.Unacked())
		require.Equal(t, 18, q.Len(), "0 and 2 acked, 1 and 3 back")
		want := []string{"1*", "3*"}
		for i := 4; i < 20; i++ {
			want = append(want, strconv.Itoa(i))
		}
		require.Equal(t, strings.Join(want, " "), drain(t, q),
			"failed ones back in place, redelivered; buffered ones back unchanged")
	})
}

// TestServeDrainAccountsForEveryMessage: workers with handlers of varied durations, some of
// which fail, are stopped mid-flight. Every message ends up exactly once either acked or back
// in the queue in its place; those never handled come back unchanged; handlers finishing after
// the cancellation see ctx done and have their results applied; Serve returns when the last of
// them finishes.
func TestServeDrainAccountsForEveryMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			n        = 200
			workers  = 5
			prefetch = 10
			cancelAt = 3050 * time.Millisecond // no handler starts or ends at this instant
		)
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, n)
		type call struct {
			id, count   int
			redelivered bool
			start, end  time.Duration
			ok, ctxDone bool
		}
		var (
			mu    sync.Mutex
			calls []call
		)
		start := time.Now()
		h := func(ctx context.Context, d warren.Delivery) error {
			c := call{id: bodyID(t, d), count: d.DeliveryCount, redelivered: d.Redelivered, start: time.Since(start)}
			time.Sleep(time.Duration(c.id%7+1) * 100 * time.Millisecond)
			c.end = time.Since(start)
			c.ctxDone = ctx.Err() != nil
			c.ok = (c.id+c.count)%3 != 0
			mu.Lock()
			calls = append(calls, c)
			mu.Unlock()
			if !c.ok {
				return errors.New("try again")
			}
			return nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, q, h, warren.Workers(workers), warren.Prefetch(prefetch))
		time.Sleep(cancelAt)
		require.Equal(t, prefetch, q.Unacked(), "workers busy, the rest of the prefetch buffered")
		cancel()
		synctest.Wait()
		require.False(t, run.returned(), "handlers are still running")
		require.Equal(t, workers, q.Unacked(), "the buffered deliveries went back at once")

		require.NoError(t, run.wait())
		returnedAt := time.Since(start)
		require.Equal(t, 0, q.Unacked())

		mu.Lock()
		defer mu.Unlock()
		var lastEnd time.Duration
		running := 0
		perID := make([][]call, n)
		acked := make([]int, n)
		for _, c := range calls {
			require.Less(t, c.start, cancelAt, "no handler starts after ctx ends")
			if c.end > cancelAt {
				running++
				require.True(t, c.ctxDone, "a handler running at cancellation sees ctx done")
			} else {
				require.False(t, c.ctxDone)
			}
			lastEnd = max(lastEnd, c.end)
			perID[c.id] = append(perID[c.id], c)
			if c.ok {
				acked[c.id]++
			}
		}
		require.Equal(t, workers, running, "every worker was busy at cancellation")
		require.Equal(t, lastEnd, returnedAt, "Serve returns as the last handler finishes")

		rest := getAll(t, q)
		inQueue := make([]int, n)
		var order []int
		for _, d := range rest {
			id := bodyID(t, d)
			inQueue[id]++
			order = append(order, id)
			k := len(perID[id])
			require.Equal(t, k, d.DeliveryCount, "message %d: returned once per failed attempt", id)
			require.Equal(t, k > 0, d.Redelivered, "message %d: redelivered iff a handler saw it", id)
		}
		require.True(t, slices.IsSorted(order), "back at their original positions: %v", order)
		nAcked := 0
		for id := range n {
			require.Equal(t, 1, acked[id]+inQueue[id], "message %d: acked %d, in queue %d", id, acked[id], inQueue[id])
			nAcked += acked[id]
			for i, c := range perID[id] {
				require.Equal(t, i, c.count, "message %d attempt %d", id, i)
				require.Equal(t, i > 0, c.redelivered)
				if i < len(perID[id])-1 {
					require.False(t, c.ok, "message %d handled again after success", id)
				}
			}
		}
		require.Equal(t, n, nAcked+len(rest))
		require.Greater(t, nAcked, 0)
		require.Greater(t, len(rest), workers)
		t.Logf("%d acked, %d back (%d handler calls)", nAcked, len(rest), len(calls))
	})
}

// TestServeHandlerGoexitFailsDeliveryAndKeepsPool: a handler that ends its goroutine with
// runtime.Goexit (as t.FailNow or require does in a handler) instead of returning fails its
// delivery — back at its place, redelivered — and its worker is replaced, so the pool keeps
// serving: with one worker, the message is tried again and the rest are handled.
func TestServeHandlerGoexitFailsDeliveryAndKeepsPool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 3)
		var seen handlerTrace
		h := func(ctx context.Context, d warren.Delivery) error {
			seen.add(d)
			if string(d.Message.Body) == "0" && d.DeliveryCount == 0 {
				runtime.Goexit()
			}
			return nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, q, h, warren.Workers(1))
		synctest.Wait()
		require.Equal(t, 0, q.Unacked(), "nothing left outstanding")
		require.Equal(t, 0, q.Len(), "everything handled by the replacement worker")
		require.Equal(t, []string{"0/0", "0/1", "1/0", "2/0"}, seen.get())
		cancel()
		require.NoError(t, run.wait())
	})
}

// TestServeErrorNacksInPlace: an error returns the message to its original position,
// redelivered, ahead of the messages after it.
func TestServeErrorNacksInPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 4)
		var (
			seen        handlerTrace
			mu          sync.Mutex
			redelivered []bool
		)
		h := func(ctx context.Context, d warren.Delivery) error {
			seen.add(d)
			if string(d.Message.Body) == "1" {
				mu.Lock()
				redelivered = append(redelivered, d.Redelivered)
				mu.Unlock()
				if d.DeliveryCount == 0 {
					return errors.New("transient")
				}
			}
			return nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, q, h)
		synctest.Wait()
		require.Equal(t, []string{"0/0", "1/0", "1/1", "2/0", "3/0"}, seen.get())
		mu.Lock()
		require.Equal(t, []bool{false, true}, redelivered)
		mu.Unlock()
		require.Equal(t, 0, q.Len()+q.Unacked())
		cancel()
		require.NoError(t, run.wait())
	})
}

// TestServeErrorReturnsMessageToItsPlace: a failed message that comes back goes ahead of later
// messages in the queue (seen from the queue, with several deliveries buffered).
func TestServeErrorReturnsMessageToItsPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 6)
		gate := make(chan struct{})
		h := func(ctx context.Context, d warren.Delivery) error {
			switch string(d.Message.Body) {
			case "0":
				return nil
			case "1":
				if d.DeliveryCount == 0 {
					return errors.New("transient")
				}
				return nil
			}
			<-gate // 2 and the rest wait
			return errors.New("transient")
		}
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, q, h, warren.Workers(1), warren.Prefetch(3))
		synctest.Wait()
		cancel()
		synctest.Wait()
		close(gate)
		require.NoError(t, run.wait())
		require.Equal(t, "1* 2* 3 4 5", drain(t, q))
	})
}

// TestServePermanentRejects: Permanent(err) and errors wrapping ErrPermanent reject the message
// at once: dead-lettered with reason "rejected", never retried.
func TestServePermanentRejects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		main, dlq := dlqTopology(t, b, warren.DeliveryLimit(5))
		publishN(t, b, main, 5)
		var seen handlerTrace
		h := func(ctx context.Context, d warren.Delivery) error {
			seen.add(d)
			switch string(d.Message.Body) {
			case "1":
				return warren.Permanent(errors.New("malformed"))
			case "3":
				return fmt.Errorf("decoding: %w", warren.ErrPermanent)
			}
			return nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, main, h, warren.Workers(2))
		synctest.Wait()
		got := seen.get()
		slices.Sort(got)
		require.Equal(t, []string{"0/0", "1/0", "2/0", "3/0", "4/0"}, got, "each handled once")
		require.Equal(t, 0, main.Len()+main.Unacked())
		dead := getAll(t, dlq)
		require.ElementsMatch(t, []string{"1", "3"}, strings.Fields(bodies(dead)))
		for _, d := range dead {
			x := xDeath(t, d)
			require.Len(t, x, 1)
			require.Equal(t, "rejected", x[0]["reason"])
			require.Equal(t, "main", x[0]["queue"])
		}
		cancel()
		require.NoError(t, run.wait())
	})
}

// TestServePermanentWithoutDeadLetterDrops: without a dead-letter exchange a permanent failure
// drops the message: it is not attempted again.
func TestServePermanentWithoutDeadLetterDrops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 3)
		var calls atomic.Int32
		h := func(ctx context.Context, d warren.Delivery) error {
			calls.Add(1)
			if d.DeliveryCount > 0 {
				return nil // a retry would succeed: there must be none
			}
			return warren.Permanent(errors.New("no"))
		}
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, q, h)
		synctest.Wait()
		require.Equal(t, int32(3), calls.Load())
		require.Equal(t, 0, q.Len()+q.Unacked())
		cancel()
		require.NoError(t, run.wait())
	})
}

// TestServeBackoffTiming: with Backoff(1s, 5s) a message that keeps failing is attempted at 0,
// 1, 3, 7, 12 and 17 s (delays 1, 2, 4, 5, 5 s), hidden meanwhile, and dead-lettered at once
// when it comes back past the delivery limit.
func TestServeBackoffTiming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		main, dlq := dlqTopology(t, b, warren.DeliveryLimit(5))
		start := time.Now()
		var (
			mu     sync.Mutex
			at     []time.Duration
			counts []int
			others []time.Duration
		)
		h := func(ctx context.Context, d warren.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			if string(d.Message.Body) != "0" {
				others = append(others, time.Since(start))
				return nil
			}
			at = append(at, time.Since(start))
			counts = append(counts, d.DeliveryCount)
			return errors.New("downstream unavailable")
		}
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, main, h, warren.Backoff(time.Second, 5*time.Second))
		publishN(t, b, main, 1)
		synctest.Wait()
		require.Equal(t, 0, main.Len(), "hidden while it waits")
		require.Equal(t, 0, main.Unacked())

		time.Sleep(2 * time.Second)
		// Others are not held up by the waiting message.
		require.NoError(t, b.Publish(t.Context(), "", "main", warren.Message{Body: []byte("x")}))
		synctest.Wait()

		time.Sleep(17*time.Second - time.Millisecond - time.Since(start))
		synctest.Wait()
		require.Equal(t, 0, dlq.Len())
		time.Sleep(time.Millisecond)
		synctest.Wait()
		mu.Lock()
		require.Equal(t, []time.Duration{0, time.Second, 3 * time.Second, 7 * time.Second, 12 * time.Second, 17 * time.Second}, at)
		require.Equal(t, []int{0, 1, 2, 3, 4, 5}, counts)
		require.Equal(t, []time.Duration{2 * time.Second}, others)
		mu.Unlock()
		require.Equal(t, 0, main.Len()+main.Unacked())
		dead := getAll(t, dlq)
		require.Equal(t, "0", bodies(dead), "dead-lettered at 17 s, past the limit, without waiting")
		require.Equal(t, "delivery_limit", xDeath(t, dead[0])[0]["reason"])
		cancel()
		require.NoError(t, run.wait())
	})
}

// TestServeBackoffKeepsPlace: a message waiting out its backoff keeps its place: when its delay
// has passed it is ahead of everything published after it.
func TestServeBackoffKeepsPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 3)
		gate := make(chan struct{})
		h := func(ctx context.Context, d warren.Delivery) error {
			switch string(d.Message.Body) {
			case "0":
				if d.DeliveryCount == 0 {
					return errors.New("fail")
				}
			case "1":
				<-gate
			}
			return nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, q, h, warren.Backoff(10*time.Second, time.Minute))
		synctest.Wait() // 0 failed and waits; 1 is in its handler; 2 is ready
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("3")}))
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("4")}))
		cancel()
		synctest.Wait()
		close(gate)
		require.NoError(t, run.wait())
		require.Equal(t, 3, q.Len(), "0 still hidden")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		require.Equal(t, "0* 2 3 4", drain(t, q))
	})
}

// TestServeBackoffHugeMax: the backoff doubles up to max without overflowing: a message that
// has come back many times and fails again waits max (here close to the largest Duration, i.e.
// practically forever), not 0.
func TestServeBackoffHugeMax(t *testing.T) {
	for _, tc := range []struct {
		name string
		max  time.Duration
	}{
		{"max 280 years", 280 * 365 * 24 * time.Hour},
		{"max MaxInt64", time.Duration(math.MaxInt64)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				q := declare(t, b, "q")
				publishN(t, b, q, 1)
				for range 40 {
					d, err := q.Get(t.Context())
					require.NoError(t, err)
					require.NoError(t, d.Nack())
				}
				var seen handlerTrace
				h := func(ctx context.Context, d warren.Delivery) error {
					seen.add(d)
					if d.DeliveryCount == 40 {
						return errors.New("fail")
					}
					return nil // acked, so that a wrong delay cannot loop
				}
				ctx, cancel := context.WithCancel(t.Context())
				run := startServe(ctx, q, h, warren.Backoff(time.Second, tc.max))
				synctest.Wait()
				time.Sleep(time.Hour)
				synctest.Wait()
				assert.Equal(t, []string{"0/40"}, seen.get(), "the retry must wait %v, not happen at once", tc.max)
				cancel()
				require.NoError(t, run.wait())
			})
		})
	}
}

// TestServeBackoffHugeKeepsTimers: a Backoff whose delays are huge, up to the largest Duration,
// hides a failed message practically forever without overflowing its due time on the queue's
// clock, which would freeze the queue's one timer: a message delayed by 10 ms is still handled at
// 10 ms.
func TestServeBackoffHugeKeepsTimers(t *testing.T) {
	for _, backoff := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1} {
		t.Run(fmt.Sprint(backoff), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				q := declare(t, b, "q")
				var seen handlerTrace
				at := map[string]time.Duration{}
				var mu sync.Mutex
				start := time.Now()
				h := func(ctx context.Context, d warren.Delivery) error {
					seen.add(d)
					mu.Lock()
					at[string(d.Message.Body)] = time.Since(start)
					mu.Unlock()
					if string(d.Message.Body) == "fails" {
						return errors.New("fail")
					}
					return nil
				}
				ctx, cancel := context.WithCancel(t.Context())
				run := startServe(ctx, q, h, warren.Backoff(backoff, backoff))
				time.Sleep(time.Millisecond) // the queue's clock away from its start
				require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("fails")}))
				synctest.Wait()
				require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("soon")}, warren.DeliverAfter(10*time.Millisecond)))
				time.Sleep(time.Hour)
				synctest.Wait()
				assert.Equal(t, []string{"fails/0", "soon/0"}, seen.get())
				mu.Lock()
				assert.Equal(t, 11*time.Millisecond, at["soon"], "Backoff(%v): DeliverAfter(10ms) handled at", backoff)
				mu.Unlock()
				require.Equal(t, 1, q.Stats().Delayed)
				cancel()
				require.NoError(t, run.wait())
			})
		})
	}
}

// TestServeWorkersBoundConcurrency: Workers(3) runs at most, and indeed, 3 handlers at once,
// even with a larger prefetch.
func TestServeWorkersBoundConcurrency(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    []warren.ServeOption
		workers int32
		took    time.Duration
	}{
		{"default one worker", nil, 1, 12 * time.Second},
		{"3 workers", []warren.ServeOption{warren.Workers(3)}, 3, 4 * time.Second},
		{"3 workers prefetch 10", []warren.ServeOption{warren.Workers(3), warren.Prefetch(10)}, 3, 4 * time.Second},
		{"4 workers prefetch 2", []warren.ServeOption{warren.Workers(4), warren.Prefetch(2)}, 2, 6 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				q := declare(t, b, "q")
				publishN(t, b, q, 12)
				var cur, peak, done atomic.Int32
				var last atomic.Int64
				start := time.Now()
				h := func(ctx context.Context, d warren.Delivery) error {
					n := cur.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					time.Sleep(time.Second)
					cur.Add(-1)
					done.Add(1)
					last.Store(int64(time.Since(start)))
					return nil
				}
				ctx, cancel := context.WithCancel(t.Context())
				run := startServe(ctx, q, h, tc.opts...)
				time.Sleep(time.Minute)
				require.Equal(t, int32(12), done.Load())
				require.Equal(t, tc.workers, peak.Load(), "peak concurrency")
				require.Equal(t, tc.took, time.Duration(last.Load()))
				require.Equal(t, 0, q.Len()+q.Unacked())
				cancel()
				require.NoError(t, run.wait())
			})
		})
	}
}

// TestServePrefetchDefaultsToWorkers: the consumer's prefetch is the worker count unless set.
func TestServePrefetchDefaultsToWorkers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    []warren.ServeOption
		holding int
	}{
		{"default", nil, 1},
		{"Workers(3)", []warren.ServeOption{warren.Workers(3)}, 3},
		{"Workers(3) Prefetch(5)", []warren.ServeOption{warren.Workers(3), warren.Prefetch(5)}, 5},
		{"Prefetch before Workers", []warren.ServeOption{warren.Prefetch(7), warren.Workers(2)}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				q := declare(t, b, "q")
				publishN(t, b, q, 10)
				gate := make(chan struct{})
				h := func(ctx context.Context, d warren.Delivery) error {
					<-gate
					return nil
				}
				ctx, cancel := context.WithCancel(t.Context())
				run := startServe(ctx, q, h, tc.opts...)
				synctest.Wait()
				require.Equal(t, tc.holding, q.Unacked())
				require.Equal(t, 10-tc.holding, q.Len())
				cancel()
				close(gate)
				require.NoError(t, run.wait())
			})
		})
	}
}

// TestServeFailsAtOnce: invalid arguments, a done context, a queue that is gone and a closed
// broker make Serve return at once, starting nothing.
func TestServeFailsAtOnce(t *testing.T) {
	ok := func(ctx context.Context, d warren.Delivery) error { return nil }
	for _, tc := range []struct {
		name string
		h    warren.Handler
		opts []warren.ServeOption
		want error
	}{
		{"nil handler", nil, nil, warren.ErrInvalidArgument},
		{"Workers(0)", ok, []warren.ServeOption{warren.Workers(0)}, warren.ErrInvalidArgument},
		{"Workers(-1)", ok, []warren.ServeOption{warren.Workers(-1)}, warren.ErrInvalidArgument},
		{"Workers(65536)", ok, []warren.ServeOption{warren.Workers(65536)}, warren.ErrInvalidArgument},
		{"Backoff(0, 1s)", ok, []warren.ServeOption{warren.Backoff(0, time.Second)}, warren.ErrInvalidArgument},
		{"Backoff(-1s, 1s)", ok, []warren.ServeOption{warren.Backoff(-time.Second, time.Second)}, warren.ErrInvalidArgument},
		{"Backoff(2s, 1s)", ok, []warren.ServeOption{warren.Backoff(2*time.Second, time.Second)}, warren.ErrInvalidArgument},
		{"Prefetch(-1)", ok, []warren.ServeOption{warren.Prefetch(-1)}, warren.ErrInvalidArgument},
		{"Prefetch(65536)", ok, []warren.ServeOption{warren.Prefetch(65536)}, warren.ErrInvalidArgument},
		{"Selector(nil)", ok, []warren.ServeOption{warren.Selector(nil)}, warren.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				q := declare(t, b, "q")
				publishN(t, b, q, 1)
				run := startServe(t.Context(), q, tc.h, tc.opts...)
				synctest.Wait()
				require.True(t, run.returned(), "Serve must fail at once")
				require.ErrorIs(t, run.err, tc.want)
				require.Equal(t, 0, q.ConsumerCount())
				require.Equal(t, 1, q.Len())
			})
		})
	}

	t.Run("context done", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newBroker(t)
			q := declare(t, b, "q")
			publishN(t, b, q, 1)
			ctx, cancel := context.WithCancelCause(t.Context())
			cancel(errors.New("shutting down"))
			var calls atomic.Int32
			run := startServe(ctx, q, func(context.Context, warren.Delivery) error { calls.Add(1); return nil })
			synctest.Wait()
			require.True(t, run.returned())
			require.ErrorIs(t, run.err, context.Canceled)
			require.Zero(t, calls.Load())
			require.Equal(t, 1, q.Len())
			require.Equal(t, 0, q.ConsumerCount())

			tctx, tcancel := context.WithTimeout(t.Context(), time.Second)
			defer tcancel()
			time.Sleep(time.Second)
			synctest.Wait()
			late := startServe(tctx, q, ok)
			synctest.Wait()
			require.True(t, late.returned())
			require.ErrorIs(t, late.err, context.DeadlineExceeded)
		})
	})
	t.Run("queue deleted", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newBroker(t)
			q := declare(t, b, "q")
			deleteQueue(t, b, "q")
			run := startServe(t.Context(), q, ok)
			synctest.Wait()
			require.True(t, run.returned())
			require.ErrorIs(t, run.err, warren.ErrNotFound)
		})
	})
	t.Run("broker closed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newBroker(t)
			q := declare(t, b, "q")
			require.NoError(t, b.Close())
			run := startServe(t.Context(), q, ok)
			synctest.Wait()
			require.True(t, run.returned())
			require.ErrorIs(t, run.err, warren.ErrClosed)
		})
	})
}

// TestServePrefetchZeroIsInvalid: Prefetch(0), a consumer's unlimited prefetch, is refused by
// Serve, whose workers take what its consumer buffers (an unlimited buffer would take the whole
// backlog from the queue for them): it fails at once, rather than take it as "unset".
func TestServePrefetchZeroIsInvalid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		run := startServe(ctx, q, func(context.Context, warren.Delivery) error { return nil }, warren.Workers(2), warren.Prefetch(0))
		synctest.Wait()
		if !run.returned() {
			consumers := q.ConsumerCount()
			cancel()
			t.Fatalf("Serve with Prefetch(0) started (ConsumerCount %d, Serve returned %v after cancel); want ErrInvalidArgument at once",
				consumers, run.wait())
		}
		require.ErrorIs(t, run.err, warren.ErrInvalidArgument)
	})
}

// blockUntilDone is a handler that waits for its context to end, reports the cause and
// returns the context's error.
func blockUntilDone(causes chan<- error) warren.Handler {
	return func(ctx context.Context, d warren.Delivery) error {
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return ctx.Err()
	}
}

// TestServeQueueDeleted: deleting the queue under Serve cancels the handlers' context with
// ErrQueueDeleted, and Serve returns it once they finish.
func TestServeQueueDeleted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 3)
		causes := make(chan error, 3)
		run := startServe(t.Context(), q, blockUntilDone(causes), warren.Workers(2))
		synctest.Wait()
		require.Equal(t, 2, q.Unacked())
		deleteQueue(t, b, "q")
		err := run.wait()
		require.ErrorIs(t, err, warren.ErrQueueDeleted)
		require.ErrorIs(t, err, warren.ErrNotFound)
		require.Len(t, causes, 2, "both running handlers saw their context end")
		for range 2 {
			require.ErrorIs(t, <-causes, warren.ErrQueueDeleted)
		}
	})
}

// TestServeBrokerClosed: closing the broker under Serve cancels the handlers' context with
// ErrClosed, and Serve returns it once they finish.
func TestServeBrokerClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 3)
		causes := make(chan error, 3)
		run := startServe(t.Context(), q, blockUntilDone(causes), warren.Workers(2))
		synctest.Wait()
		require.NoError(t, b.Close())
		err := run.wait()
		require.ErrorIs(t, err, warren.ErrClosed)
		require.Len(t, causes, 2)
		for range 2 {
			require.ErrorIs(t, <-causes, warren.ErrClosed)
		}
	})
}

// TestServeAckTimeout: a handler stuck past the ack timeout ends the consumer: the handler's
// context is cancelled with ErrAckTimeout, the message goes back redelivered (and one buffered
// behind it unchanged), and Serve returns ErrAckTimeout once the handler returns; the handler's
// late success does not ack the message.
func TestServeAckTimeout(t *testing.T) {
	for _, tc := range []struct {
		name  string
		queue []warren.QueueOption
		opts  []warren.ServeOption
	}{
		{"AckTimeout option", nil, []warren.ServeOption{warren.AckTimeout(30 * time.Second), warren.Prefetch(2)}},
		{"x-consumer-timeout", []warren.QueueOption{warren.Arguments(warren.Table{"x-consumer-timeout": int64(30000)})},
			[]warren.ServeOption{warren.Prefetch(2)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				q := declare(t, b, "q", tc.queue...)
				publishN(t, b, q, 3)
				gate := make(chan struct{})
				causes := make(chan error, 1)
				h := func(ctx context.Context, d warren.Delivery) error {
					select {
					case <-gate:
					case <-ctx.Done():
						causes <- context.Cause(ctx)
						<-gate // stuck regardless
					}
					return nil
				}
				run := startServe(t.Context(), q, h, tc.opts...)
				synctest.Wait()
				require.Equal(t, 2, q.Unacked(), "0 in the handler, 1 buffered")
				time.Sleep(30*time.Second - time.Millisecond)
				synctest.Wait()
				require.False(t, run.returned())
				require.Empty(t, causes)
				time.Sleep(time.Millisecond)
				synctest.Wait()
				require.Len(t, causes, 1, "the handler's context is cancelled at the timeout")
				require.ErrorIs(t, <-causes, warren.ErrAckTimeout)
				require.False(t, run.returned(), "Serve waits for the stuck handler")
				require.Equal(t, 3, q.Len(), "everything is back")
				require.Equal(t, 0, q.Unacked())

				close(gate)
				err := run.wait()
				require.ErrorIs(t, err, warren.ErrAckTimeout)
				require.ErrorIs(t, err, warren.ErrPreconditionFailed)
				ds := getAll(t, q)
				require.Equal(t, "0* 1 2", picture(ds), "the late success did not ack 0")
				require.Equal(t, 1, ds[0].DeliveryCount)
				require.Equal(t, 0, ds[1].DeliveryCount)
			})
		})
	}
}

// TestServeHandlerSettlesItself: a handler that settles its delivery itself is left alone:
// Serve's own settlement has no effect.
func TestServeHandlerSettlesItself(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		main, dlq := dlqTopology(t, b)
		publishN(t, b, main, 4)
		var (
			seen handlerTrace
			errs []error
			mu   sync.Mutex
		)
		h := func(ctx context.Context, d warren.Delivery) error {
			seen.add(d)
			var err error
			var result error
			switch {
			case string(d.Message.Body) == "0":
				err = d.Ack()
				result = warren.Permanent(errors.New("would reject"))
			case string(d.Message.Body) == "1":
				err = d.Reject()
				result = errors.New("would nack")
			case string(d.Message.Body) == "2" && d.DeliveryCount == 0:
				err = d.Nack()
				result = nil // would ack
			}
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			return result
		}
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, main, h)
		synctest.Wait()
		require.Equal(t, []string{"0/0", "1/0", "2/0", "2/1", "3/0"}, seen.get())
		mu.Lock()
		for _, err := range errs {
			require.NoError(t, err, "the handler's own settlement")
		}
		mu.Unlock()
		require.Equal(t, 0, main.Len()+main.Unacked())
		dead := getAll(t, dlq)
		require.Equal(t, "1", bodies(dead), "only the handler's own reject dead-letters")
		x := xDeath(t, dead[0])
		require.Len(t, x, 1)
		require.Equal(t, "rejected", x[0]["reason"])
		require.Equal(t, int64(1), x[0]["count"])
		cancel()
		require.NoError(t, run.wait())
	})
}

// TestServeSelector: a Serve with a Selector handles only the messages it accepts; the others
// keep their places.
func TestServeSelector(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 10)
		var seen handlerTrace
		h := func(ctx context.Context, d warren.Delivery) error {
			seen.add(d)
			return nil
		}
		even := func(m *warren.Message) bool {
			n, err := strconv.Atoi(string(m.Body))
			return err == nil && n%2 == 0
		}
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, q, h, warren.Selector(even))
		synctest.Wait()
		require.Equal(t, []string{"0/0", "2/0", "4/0", "6/0", "8/0"}, seen.get())
		require.Equal(t, 5, q.Len())
		cancel()
		require.NoError(t, run.wait())
		require.Equal(t, "1 3 5 7 9", drain(t, q))
	})
}

// TestServeConsumerTag: the tag reaches the deliveries and is held while Serve runs.
func TestServeConsumerTag(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 2)
		var (
			mu   sync.Mutex
			tags []string
		)
		h := func(ctx context.Context, d warren.Delivery) error {
			mu.Lock()
			tags = append(tags, d.ConsumerTag)
			mu.Unlock()
			return nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, q, h, warren.ConsumerTag("svc"))
		synctest.Wait()
		mu.Lock()
		require.Equal(t, []string{"svc", "svc"}, tags)
		mu.Unlock()
		require.Equal(t, 1, q.ConsumerCount())
		_, err := q.Consume(t.Context(), warren.ConsumerTag("svc"))
		require.ErrorIs(t, err, warren.ErrPreconditionFailed)
		again := startServe(t.Context(), q, h, warren.ConsumerTag("svc"))
		synctest.Wait()
		require.True(t, again.returned())
		require.ErrorIs(t, again.err, warren.ErrPreconditionFailed)
		cancel()
		require.NoError(t, run.wait())
		require.Equal(t, 0, q.ConsumerCount())
		c, err := q.Consume(t.Context(), warren.ConsumerTag("svc"))
		require.NoError(t, err, "the tag is free once Serve returned")
		require.NoError(t, c.Cancel())
	})
}

// TestServeConsumerPriority: a higher-priority Serve receives everything while it has credit,
// though it started after a lower one.
func TestServeConsumerPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		gate := make(chan struct{})
		var (
			mu  sync.Mutex
			got = map[string][]string{}
		)
		handler := func(name string) warren.Handler {
			return func(ctx context.Context, d warren.Delivery) error {
				mu.Lock()
				got[name] = append(got[name], string(d.Message.Body))
				mu.Unlock()
				<-gate
				return nil
			}
		}
		ctx, cancel := context.WithCancel(t.Context())
		low := startServe(ctx, q, handler("low"))
		synctest.Wait()
		high := startServe(ctx, q, handler("high"), warren.Workers(2), warren.ConsumerPriority(10))
		synctest.Wait()
		require.Equal(t, 2, q.ConsumerCount())
		publishN(t, b, q, 4)
		synctest.Wait()
		mu.Lock()
		require.ElementsMatch(t, []string{"0", "1"}, got["high"])
		require.Equal(t, []string{"2"}, got["low"], "low gets a message only when high has no credit")
		mu.Unlock()
		require.Equal(t, 1, q.Len())
		cancel()
		close(gate)
		require.NoError(t, low.wait())
		require.NoError(t, high.wait())
	})
}

// TestServeExclusiveConsumer: Exclusive() is passed on: while Serve runs no one else may
// consume, and it cannot start on a queue with consumers.
func TestServeExclusiveConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		ok := func(context.Context, warren.Delivery) error { return nil }
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, q, ok, warren.Exclusive())
		synctest.Wait()
		_, err := q.Consume(t.Context())
		require.ErrorIs(t, err, warren.ErrAccessRefused)
		other := startServe(t.Context(), q, ok)
		synctest.Wait()
		require.True(t, other.returned())
		require.ErrorIs(t, other.err, warren.ErrAccessRefused)
		cancel()
		require.NoError(t, run.wait())

		c, err := q.Consume(t.Context())
		require.NoError(t, err)
		refused := startServe(t.Context(), q, ok, warren.Exclusive())
		synctest.Wait()
		require.True(t, refused.returned())
		require.ErrorIs(t, refused.err, warren.ErrAccessRefused)
		require.NoError(t, c.Cancel())
	})
}

// TestServeExclusiveQueue: Serve on a queue exclusive to a context works with that context (or
// one sharing its Done channel) and fails with ErrResourceLocked with any other.
func TestServeExclusiveQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		owner, endOwner := context.WithCancel(t.Context())
		q := declare(t, b, "ex", warren.ExclusiveTo(owner))
		publishN(t, b, q, 4)
		var seen handlerTrace
		h := func(ctx context.Context, d warren.Delivery) error {
			seen.add(d)
			return nil
		}

		derived, cancelDerived := context.WithCancel(owner)
		defer cancelDerived()
		for name, ctx := range map[string]context.Context{"another context": t.Context(), "a cancellable child of the owner": derived} {
			run := startServe(ctx, q, h)
			synctest.Wait()
			require.True(t, run.returned(), name)
			require.ErrorIs(t, run.err, warren.ErrResourceLocked, name)
		}
		require.Equal(t, 4, q.Len())
		require.Equal(t, 0, q.ConsumerCount())
		require.Empty(t, seen.get())

		type key struct{}
		run := startServe(owner, q, h)
		run2 := startServe(context.WithValue(owner, key{}, 1), q, h)
		synctest.Wait()
		require.False(t, run.returned())
		require.False(t, run2.returned())
		require.Equal(t, 2, q.ConsumerCount())
		require.Len(t, seen.get(), 4)
		require.Equal(t, 0, q.Len()+q.Unacked())

		endOwner()
		require.NoError(t, run.wait())
		require.NoError(t, run2.wait())
		synctest.Wait()
		_, err := b.Queue("ex")
		require.ErrorIs(t, err, warren.ErrNotFound, "the queue went with its owner")
	})
}

// TestServeStress: 8 workers with real concurrency randomly ack, fail, panic or fail
// permanently, each attempt's outcome a function of the seed, the message and its delivery
// count, while publishers run; a second Serve drains the dead-letter queue. Every message is
// acked or dead-lettered exactly once, with the outcome and number of attempts its fate
// predicts, and nothing is left behind: no message, no delivery, no goroutine.
func TestServeStress(t *testing.T) {
	n := 20_000
	if testing.Short() {
		n = 5_000
	}
	const limit = 2
	seed := testSeed(t, "WARREN_SERVE_SEED")
	leak := goleak.IgnoreCurrent()

	const (
		doAck = iota
		doPermanent
		doFail
		doPanic
	)
	kind := func(id, attempt int) int {
		v := rand.New(rand.NewPCG(seed, uint64(id)<<8|uint64(attempt))).IntN(100)
		switch {
		case v < 50:
			return doAck
		case v < 65:
			return doPermanent
		case v < 85:
			return doFail
		}
		return doPanic
	}
	// The fate of each message, known in advance.
	want := make([]string, n)
	wantCalls := make([]int32, n)
	var wantPanics int64
	for id := range n {
	attempts:
		for a := 0; ; a++ {
			k := kind(id, a)
			if k == doPanic {
				wantPanics++
			}
			switch {
			case k == doAck:
				want[id] = "acked"
			case k == doPermanent:
				want[id] = "rejected"
			case a == limit:
				want[id] = "delivery_limit"
			default:
				continue
			}
			wantCalls[id] = int32(a + 1)
			break attempts
		}
	}

	b := warren.New()
	var panics atomic.Int64
	stopListen := b.Listen(func(ev warren.Event) {
		if ev.Kind == warren.EventHandlerPanicked && ev.Queue == "main" {
			panics.Add(1)
		}
	})
	main, err := b.DeclareQueue("main", warren.DeliveryLimit(limit), warren.DeadLetter("", "dlq"))
	require.NoError(t, err)
	dlq, err := b.DeclareQueue("dlq")
	require.NoError(t, err)

	var (
		calls    = make([]atomic.Int32, n)
		acked    = make([]atomic.Int32, n)
		dead     = make([]atomic.Int32, n)
		reasonMu sync.Mutex
		reasons  = make([]string, n)
		bad      atomic.Int32
		finished atomic.Int64
		done     = make(chan struct{})
	)
	finish := func() {
		if finished.Add(1) == int64(n) {
			close(done)
		}
	}
	report := func(format string, args ...any) {
		if bad.Add(1) <= 10 {
			t.Errorf(format, args...)
		}
	}
	work := func(ctx context.Context, d warren.Delivery) error {
		id, err := strconv.Atoi(string(d.Message.Body))
		if err != nil || id < 0 || id >= n {
			report("main: body %q", d.Message.Body)
			return nil
		}
		prev := int(calls[id].Add(1)) - 1
		if d.DeliveryCount != prev || d.Redelivered != (prev > 0) {
			report("message %d: attempt %d has DeliveryCount %d, Redelivered %v", id, prev, d.DeliveryCount, d.Redelivered)
		}
		switch kind(id, d.DeliveryCount) {
		case doAck:
			acked[id].Add(1)
			finish()
			return nil
		case doPermanent:
			if id%2 == 0 {
				return warren.Permanent(errors.New("bad input"))
			}
			return fmt.Errorf("message %d: %w", id, warren.ErrPermanent)
		case doFail:
			return errors.New("transient")
		}
		panic(fmt.Sprintf("boom %d", id))
	}
	collect := func(ctx context.Context, d warren.Delivery) error {
		id, err := strconv.Atoi(string(d.Message.Body))
		if err != nil || id < 0 || id >= n {
			report("dlq: body %q", d.Message.Body)
			return nil
		}
		dead[id].Add(1)
		reason := "?"
		if x, ok := d.Message.Headers["x-death"].([]any); ok && len(x) == 1 {
			if e, ok := x[0].(warren.Table); ok {
				reason, _ = e["reason"].(string)
			}
		}
		reasonMu.Lock()
		reasons[id] = reason
		reasonMu.Unlock()
		finish()
		return nil
	}

	prefetch := 1 + rand.New(rand.NewPCG(seed, math.MaxUint64)).IntN(32)
	t.Logf("%d messages, 8 workers, prefetch %d", n, prefetch)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	mainRun := startServe(ctx, main, work, warren.Workers(8), warren.Prefetch(prefetch))
	dlqRun := startServe(ctx, dlq, collect, warren.Workers(2))

	const publishers = 4
	var pubs sync.WaitGroup
	for p := range publishers {
		pubs.Go(func() {
			for id := p; id < n; id += publishers {
				if err := b.Publish(ctx, "", "main", warren.Message{Body: strconv.AppendInt(nil, int64(id), 10)}); err != nil {
					report("publish %d: %v", id, err)
					return
				}
			}
		})
	}
	pubs.Wait()

	var timeout <-chan time.Time
	if deadline, ok := t.Deadline(); ok { // a watchdog for a clearer failure than the test binary's
		timer := time.NewTimer(time.Until(deadline) * 9 / 10)
		defer timer.Stop()
		timeout = timer.C
	}
	select {
	case <-done:
	case <-timeout:
		cancel()
		t.Fatalf("only %d of %d messages finished; main: %d ready, %d unacked; dlq: %d ready",
			finished.Load(), n, main.Len(), main.Unacked(), dlq.Len())
	}
	cancel()
	require.NoError(t, mainRun.wait())
	require.NoError(t, dlqRun.wait())

	require.Zero(t, bad.Load())
	require.Equal(t, 0, main.Len())
	require.Equal(t, 0, main.Unacked())
	require.Equal(t, 0, dlq.Len())
	require.Equal(t, 0, dlq.Unacked())
	var nAcked, nDead int
	counts := map[string]int{}
	for id := range n {
		a, d := int(acked[id].Load()), int(dead[id].Load())
		nAcked += a
		nDead += d
		got := "acked"
		if d > 0 {
			got = reasons[id]
		}
		counts[got]++
		if a+d != 1 || got != want[id] || calls[id].Load() != wantCalls[id] {
			report("message %d: acked %d, dead-lettered %d (%s), %d attempts; want %s after %d attempts",
				id, a, d, got, calls[id].Load(), want[id], wantCalls[id])
		}
	}
	require.Zero(t, bad.Load())
	require.Equal(t, n, nAcked+nDead)
	require.Equal(t, wantPanics, panics.Load(), "one event per panic")
	t.Logf("outcomes %v, %d panics", counts, wantPanics)

	stopListen()
	require.NoError(t, b.Close())
	goleak.VerifyNone(t, leak)
}

// TestServePanicWithPermanentError: a handler that panics with an error value fails with an
// error that wraps it, in the event and in the settlement: a panic with a permanent error rejects the
// message (dead-lettered "rejected") instead of retrying it.
func TestServePanicWithPermanentError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		dlq := declare(t, b, "dlq")
		q := declare(t, b, "q", warren.DeadLetter("", "dlq"))
		publishN(t, b, q, 1)
		var events []warren.Event
		stop := b.Listen(func(e warren.Event) {
			if e.Kind == warren.EventHandlerPanicked {
				events = append(events, e)
			}
		})
		defer stop()
		bad := fmt.Errorf("corrupt input: %w", warren.ErrPermanent)
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, q, func(context.Context, warren.Delivery) error { panic(bad) })
		synctest.Wait()
		cancel()
		require.NoError(t, run.wait())
		require.Len(t, events, 1)
		require.ErrorIs(t, events[0].Err, bad)
		ds := getAll(t, dlq)
		require.Len(t, ds, 1)
		require.Equal(t, "rejected", ds[0].Message.Headers["x-first-death-reason"])
	})
}

// TestServeStopMeansStop: after Serve's context ends no handler is started again, and a message
// whose handler was interrupted goes back to its place once: a handler that waits for its context
// and returns its error, cancelled after 100 ms, runs once, and its message comes back
// redelivered with one more delivery — not handed to a handler again and again until the
// delivery limit dead-letters it. With the default prefetch and with prefetch 1, with and
// without a delivery limit, and with a backoff (which an interruption does not wait for).
func TestServeStopMeansStop(t *testing.T) {
	for _, tc := range []struct {
		name  string
		qopts []warren.QueueOption
		sopts []warren.ServeOption
	}{
		{"delivery limit", []warren.QueueOption{warren.DeliveryLimit(5)}, nil},
		{"delivery limit, prefetch 1", []warren.QueueOption{warren.DeliveryLimit(5)}, []warren.ServeOption{warren.Prefetch(1)}},
		{"no delivery limit", nil, nil},
		{"backoff", nil, []warren.ServeOption{warren.Backoff(time.Hour, time.Hour)}},
		{"four workers", nil, []warren.ServeOption{warren.Workers(4)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for round := range 20 { // the old bug lost a race most of the time, not always
				synctest.Test(t, func(t *testing.T) {
					b := newBroker(t)
					q, dlq := dlqTopology(t, b, tc.qopts...)
					publishN(t, b, q, 2)
					var calls, lateCalls atomic.Int32
					ctx, cancel := context.WithCancel(t.Context())
					run := startServe(ctx, q, func(hctx context.Context, d warren.Delivery) error {
						calls.Add(1)
						if ctx.Err() != nil {
							lateCalls.Add(1)
						}
						<-hctx.Done()
						return hctx.Err()
					}, tc.sopts...)
					time.Sleep(100 * time.Millisecond)
					started := calls.Load()
					cancel()
					require.NoError(t, run.wait())
					require.Zero(t, lateCalls.Load(), "round %d: handlers started after the context ended", round)
					require.Equal(t, started, calls.Load(), "round %d", round)
					st := q.Stats()
					require.Equal(t, uint64(started), st.Nacked, "round %d: each interrupted message went back once", round)
					require.Equal(t, 2, st.Ready, "round %d: both messages are back, at once", round)
					require.Zero(t, dlq.Len(), "round %d: nothing dead-lettered", round)
					for i := range 2 {
						d, err := q.Get(t.Context())
						require.NoError(t, err)
						require.Equal(t, strconv.Itoa(i), string(d.Message.Body), "round %d: back in its place", round)
						wantCount := 0
						if i < int(started) {
							wantCount = 1
						}
						require.Equal(t, wantCount, d.DeliveryCount, "round %d: message %d's deliveries", round, i)
					}
				})
			}
		})
	}
}

// TestServeGracePeriod: with a grace period, handlers running when Serve's context ends keep
// their context: one that finishes within the period has its result applied with its context
// intact, one that waits for its context is cancelled when the period ends, and its message goes
// back at once. No handler starts meanwhile, and Serve returns when the last one has finished.
func TestServeGracePeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 3)
		var mu sync.Mutex
		seen := map[string]error{} // body → the handler context's error when it returned
		ctx, cancel := context.WithCancel(t.Context())
		start := time.Now()
		run := startServe(ctx, q, func(hctx context.Context, d warren.Delivery) error {
			var err error
			switch string(d.Message.Body) {
			case "0":
				time.Sleep(2 * time.Second) // finishes within the grace period
			case "1":
				<-hctx.Done() // only the end of the grace period ends it
				err = hctx.Err()
			}
			mu.Lock()
			seen[string(d.Message.Body)] = hctx.Err()
			mu.Unlock()
			return err
		}, warren.Workers(2), warren.GracePeriod(5*time.Second), warren.Backoff(time.Hour, time.Hour))
		synctest.Wait()
		cancel()
		synctest.Wait()
		require.Equal(t, 1, q.Len(), "message 2, buffered for nobody, is back at once")
		require.NoError(t, run.wait())
		require.Equal(t, 5*time.Second, time.Since(start), "Serve waited for the grace period")
		require.Equal(t, map[string]error{"0": nil, "1": context.Canceled}, seen)
		st := q.Stats()
		require.Equal(t, uint64(1), st.Acked, "the handler that finished in time was acked")
		require.Equal(t, [2]int{2, 0}, [2]int{st.Ready, st.Delayed}, "the interrupted one is back at once, no backoff")
	})
}

// TestServeOnStart: OnStart runs once the consumer is in place and before any handler, so a
// caller that runs Serve on its own goroutine can publish and wait without polling; not when
// Serve fails to start.
func TestServeOnStart(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	started := make(chan struct{})
	handled := make(chan string, 1)
	consumers := -1
	go q.Serve(ctx, func(_ context.Context, d warren.Delivery) error {
		handled <- string(d.Message.Body)
		return nil
	}, warren.OnStart(func() {
		consumers = q.ConsumerCount()
		close(started)
	}))
	<-started
	require.Equal(t, 1, consumers, "the consumer is in place when OnStart runs")
	require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("hello")}))
	require.NoError(t, b.WaitIdle(t.Context()))
	require.Equal(t, "hello", <-handled)

	called := false
	err := q.Serve(ctx, func(context.Context, warren.Delivery) error { return nil },
		warren.Exclusive(), warren.OnStart(func() { called = true }))
	require.ErrorIs(t, err, warren.ErrAccessRefused, "the queue has a consumer")
	require.False(t, called)
}

// TestServeAutoDeleteQueueOutlivesHandlers: an auto-delete queue served by Serve alone is not
// deleted when Serve stops taking messages but once its handlers are done, so that their results
// settle (an ack is counted, a failure goes back) before it goes.
func TestServeAutoDeleteQueueOutlivesHandlers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "tmp", warren.AutoDelete())
		publishN(t, b, q, 3)
		gate := make(chan struct{})
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, q, func(_ context.Context, d warren.Delivery) error {
			<-gate
			if string(d.Message.Body) == "1" {
				return errors.New("fails")
			}
			return nil
		}, warren.Workers(2), warren.GracePeriod(time.Minute))
		synctest.Wait()
		cancel()
		synctest.Wait()
		require.True(t, queueExists(t, b, "tmp"), "the handlers are still running")
		close(gate)
		require.NoError(t, run.wait())
		st := q.Stats()
		require.Equal(t, uint64(1), st.Acked, "the handler's ack was applied")
		require.Equal(t, uint64(1), st.Nacked, "the failure went back")
		require.False(t, queueExists(t, b, "tmp"), "deleted once its handlers were done")
	})
}

// TestServeStopRacesAckTimeout: a worker that takes a delivery as Serve stops gives it back;
// when an ack timeout has taken it back first, and its record is free for reuse, the give-back
// leaves it alone. Real concurrency: Serve's context ends as a message arrives, with an ack
// timeout so short that it often passes in between. (giveBack read the free record's nil
// holder, and panicked, within a few hundred rounds.)
func TestServeStopRacesAckTimeout(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	for round := range 1000 {
		ctx, cancel := context.WithCancel(t.Context())
		started := make(chan struct{})
		run := startServe(ctx, q, func(context.Context, warren.Delivery) error { return nil },
			warren.Prefetch(1), warren.AckTimeout(time.Duration(round%50+1)*time.Microsecond),
			warren.OnStart(func() { close(started) }))
		<-started
		go cancel()
		publish(t, b, "q", "m")
		_ = run.wait() // nil, or the ack timeout
		require.Zero(t, q.Unacked(), "round %d", round)
		_, err := q.Purge()
		require.NoError(t, err)
	}
}

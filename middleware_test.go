package warren_test

// Tests of Serve's middleware (middleware.go): the order of the chain, what each layer sees,
// the per-attempt timeout, and panics in and around the chain.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// chainTrace records the steps of a middleware chain, in order.
type chainTrace struct {
	mu    sync.Mutex
	steps []string
}

func (c *chainTrace) add(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.steps = append(c.steps, fmt.Sprintf(format, args...))
}

func (c *chainTrace) take() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := strings.Join(c.steps, " ")
	c.steps = nil
	return s
}

type serveValueKey struct{}

// attempts is a middleware that records every attempt Serve makes: the body, the delivery
// count, and the chain's result.
type attempts struct {
	mu   sync.Mutex
	list []attempt
}

type attempt struct {
	body  string
	count int
	err   error
}

func (a *attempts) middleware(next warren.Handler) warren.Handler {
	return func(ctx context.Context, d warren.Delivery) error {
		err := next(ctx, d)
		a.mu.Lock()
		defer a.mu.Unlock()
		a.list = append(a.list, attempt{string(d.Message.Body), d.DeliveryCount, err})
		return err
	}
}

// of returns the attempts at the message with body.
func (a *attempts) of(body string) []attempt {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []attempt
	for _, at := range a.list {
		if at.body == body {
			out = append(out, at)
		}
	}
	return out
}

// TestMiddlewareOrder: Middleware(a, nil, b), Middleware(c) runs a(b(c(h))) on each delivery —
// the first outermost, a later option inside an earlier one, nil ignored; each middleware is
// called once per Serve, and each layer sees the delivery and the values of Serve's context.
// A middleware's result settles the delivery: c turns the handler's error into an ack.
func TestMiddlewareOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		var (
			trace chainTrace
			made  atomic.Int32
		)
		layer := func(name string) func(warren.Handler) warren.Handler {
			return func(next warren.Handler) warren.Handler {
				made.Add(1)
				return func(ctx context.Context, d warren.Delivery) error {
					trace.add("%s>%s:%v", name, d.Message.Body, ctx.Value(serveValueKey{}))
					err := next(ctx, d)
					trace.add("<%s", name)
					if name == "c" {
						return nil // c decides: an ack whatever the handler said
					}
					return err
				}
			}
		}
		h := func(ctx context.Context, d warren.Delivery) error {
			trace.add("h:%d", d.DeliveryCount)
			return errors.New("swallowed by c")
		}
		ctx, cancel := context.WithCancel(context.WithValue(t.Context(), serveValueKey{}, "v"))
		run := startServe(ctx, q, h, warren.Middleware(layer("a"), nil, layer("b")), warren.Middleware(layer("c")))
		synctest.Wait()
		require.Equal(t, int32(3), made.Load(), "each middleware is called once when Serve starts")

		publishN(t, b, q, 2)
		synctest.Wait()
		require.Equal(t, "a>0:v b>0:v c>0:v h:0 <c <b <a a>1:v b>1:v c>1:v h:0 <c <b <a", trace.take())
		s := q.Stats()
		require.Equal(t, [2]uint64{2, 0}, [2]uint64{s.Acked, s.Nacked}, "Acked, Nacked: c's result settles")
		require.Equal(t, int32(3), made.Load(), "not per message")
		cancel()
		require.NoError(t, run.wait())
	})
}

// TestMiddlewareNilHandler: a middleware that returns a nil Handler makes Serve and ServeSource
// fail at once with ErrInvalidArgument, before Serve's consumer starts; ServeSource runs a valid
// chain as Serve does.
func TestMiddlewareNilHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 1)
		ok := func(context.Context, warren.Delivery) error { return nil }
		broken := warren.Middleware(func(warren.Handler) warren.Handler { return nil })

		err := q.Serve(t.Context(), ok, warren.Middleware(warren.HandlerTimeout(time.Second)), broken)
		require.ErrorIs(t, err, warren.ErrInvalidArgument)
		require.ErrorContains(t, err, "middleware 2 of 2 returned a nil handler")
		requireOnePrefix(t, err)
		require.Equal(t, 0, q.ConsumerCount())
		require.Equal(t, 1, q.Len())

		c, err := q.Consume(t.Context())
		require.NoError(t, err)
		require.ErrorIs(t, warren.ServeSource(t.Context(), c, ok, broken), warren.ErrInvalidArgument)

		var trace chainTrace
		mw := func(next warren.Handler) warren.Handler {
			return func(ctx context.Context, d warren.Delivery) error {
				trace.add("mw:%s", d.Message.Body)
				return next(ctx, d)
			}
		}
		ctx, cancel := context.WithCancel(t.Context())
		served := make(chan error, 1)
		go func() { served <- warren.ServeSource(ctx, c, ok, warren.Middleware(mw)) }()
		synctest.Wait()
		require.Equal(t, "mw:0", trace.take())
		require.Equal(t, 0, q.Len()+q.Unacked(), "acked")
		cancel()
		require.NoError(t, <-served)
	})
}

// TestHandlerTimeout: a handler slower than HandlerTimeout(5s) has its context cancelled at 5 s
// (DeadlineExceeded, with the timeout as the cause); the attempt fails as any error does — the
// message goes back after the Backoff (2 s), not at once as an interrupted one would — and the
// next attempt, which is quick, acks it at 7 s. Serve goes on meanwhile. HandlerTimeout(0) is
// no timeout.
func TestHandlerTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		start := time.Now()
		var (
			trace chainTrace
			tries attempts
		)
		h := func(ctx context.Context, d warren.Delivery) error {
			trace.add("start@%v", time.Since(start))
			if d.DeliveryCount == 0 {
				<-ctx.Done() // slow: it would take longer than the timeout
				trace.add("cancelled@%v:%v", time.Since(start), context.Cause(ctx))
				return ctx.Err()
			}
			return nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, q, h, warren.Backoff(2*time.Second, time.Minute),
			warren.Middleware(tries.middleware, warren.HandlerTimeout(5*time.Second)))
		publishN(t, b, q, 1)
		time.Sleep(time.Minute)
		synctest.Wait()

		require.Equal(t, "start@0s cancelled@5s:warren: handler timed out after 5s: context deadline exceeded start@7s", trace.take())
		a := tries.of("0")
		require.Len(t, a, 2)
		require.ErrorIs(t, a[0].err, context.DeadlineExceeded)
		require.NotErrorIs(t, a[0].err, warren.ErrPermanent)
		require.NoError(t, a[1].err)
		require.Equal(t, []int{0, 1}, []int{a[0].count, a[1].count})
		s := q.Stats()
		require.Equal(t, [2]uint64{1, 1}, [2]uint64{s.Nacked, s.Acked}, "Nacked, Acked")
		require.False(t, run.returned(), "a handler timeout fails the attempt, not Serve")
		cancel()
		require.NoError(t, run.wait())

		// No timeout: the handler's context has no deadline.
		var deadline atomic.Bool
		none := func(ctx context.Context, d warren.Delivery) error {
			_, ok := ctx.Deadline()
			deadline.Store(ok)
			return nil
		}
		ctx, cancel = context.WithCancel(t.Context())
		run = startServe(ctx, q, none, warren.Middleware(warren.HandlerTimeout(0), warren.HandlerTimeout(-time.Second)))
		publishN(t, b, q, 1)
		synctest.Wait()
		require.Equal(t, 0, q.Len()+q.Unacked())
		require.False(t, deadline.Load())
		cancel()
		require.NoError(t, run.wait())
	})
}

// TestHandlerTimeoutIgnored: the timeout does not stop a handler that ignores its context, and
// one that returns nil after it is acked.
func TestHandlerTimeoutIgnored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		var late atomic.Bool
		h := func(ctx context.Context, d warren.Delivery) error {
			time.Sleep(10 * time.Second) // ignores ctx
			late.Store(ctx.Err() != nil)
			return nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, q, h, warren.Middleware(warren.HandlerTimeout(time.Second)))
		publishN(t, b, q, 1)
		time.Sleep(time.Minute)
		synctest.Wait()
		require.True(t, late.Load(), "the context was cancelled under it")
		s := q.Stats()
		require.Equal(t, [2]uint64{1, 0}, [2]uint64{s.Acked, s.Nacked}, "Acked, Nacked")
		cancel()
		require.NoError(t, run.wait())
	})
}

// TestMiddlewarePanics: Serve handles a panic anywhere in the chain as a handler's panic —
// logged with its stack, an EventHandlerPanicked event, a failed attempt (retried up to the
// delivery limit, then dead-lettered) — whether the middleware itself panics, or a middleware
// that observes the handler's panic re-panics; a middleware that recovers takes the panic over,
// and its result settles the delivery (here, a rejection), with no panic event.
func TestMiddlewarePanics(t *testing.T) {
	panicking := func(next warren.Handler) warren.Handler {
		return func(ctx context.Context, d warren.Delivery) error { panic("middleware broke") }
	}
	var observed atomic.Int32
	observing := func(next warren.Handler) warren.Handler { // as a metrics middleware counts panics
		return func(ctx context.Context, d warren.Delivery) error {
			defer func() {
				if p := recover(); p != nil {
					observed.Add(1)
					panic(p)
				}
			}()
			return next(ctx, d)
		}
	}
	recovering := func(next warren.Handler) warren.Handler {
		return func(ctx context.Context, d warren.Delivery) (err error) {
			defer func() {
				if p := recover(); p != nil {
					err = warren.Permanent(fmt.Errorf("recovered: %v", p))
				}
			}()
			return next(ctx, d)
		}
	}
	for _, tc := range []struct {
		name     string
		mw       []func(warren.Handler) warren.Handler
		handler  bool   // the handler runs (and panics)
		panicked string // what the panic says; "" for no panic seen by Serve
		reason   string // the x-death reason
	}{
		{"middleware panics", []func(warren.Handler) warren.Handler{panicking}, false, "middleware broke", "delivery_limit"},
		{"observed and re-panicked", []func(warren.Handler) warren.Handler{observing}, true, "handler broke", "delivery_limit"},
		{"recovered", []func(warren.Handler) warren.Handler{observing, recovering}, true, "", "rejected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				observed.Store(0)
				var logs logBuffer
				b := newBroker(t, warren.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
				var events panicEvents
				defer b.Listen(events.add)()
				main, dlq := dlqTopology(t, b, warren.DeliveryLimit(1))
				publishN(t, b, main, 1)
				var calls atomic.Int32
				h := func(ctx context.Context, d warren.Delivery) error {
					calls.Add(1)
					panic("handler broke")
				}
				ctx, cancel := context.WithCancel(t.Context())
				run := startServe(ctx, main, h, warren.Middleware(tc.mw...))
				synctest.Wait()

				attempts := 2 // the delivery limit's
				if tc.reason == "rejected" {
					attempts = 1
				}
				if tc.handler {
					require.Equal(t, int32(attempts), calls.Load())
				} else {
					require.Zero(t, calls.Load())
				}
				dead := getAll(t, dlq)
				require.Equal(t, "0", bodies(dead))
				require.Equal(t, tc.reason, xDeath(t, dead[0])[0]["reason"])
				require.False(t, run.returned(), "Serve survives")

				evs, recs := events.all(), logs.records(t, "warren: handler panicked")
				if tc.panicked == "" {
					require.Empty(t, evs)
					require.Empty(t, recs)
					require.Equal(t, int32(0), observed.Load(), "the recovering middleware is inside the observer")
					rejected := logs.records(t, "warren: handler failed permanently; delivery rejected")
					require.Len(t, rejected, 1)
					require.Contains(t, rejected[0]["err"], "recovered: handler broke")
				} else {
					require.Len(t, evs, attempts)
					require.Len(t, recs, attempts)
					for i := range attempts {
						require.ErrorContains(t, evs[i].Err, tc.panicked)
						require.Contains(t, fmt.Sprint(recs[i]["panic"]), tc.panicked)
						require.Contains(t, recs[i]["stack"], "middleware_test.go")
					}
					if tc.handler {
						require.Equal(t, int32(attempts), observed.Load(), "the observer saw each panic unwind")
					}
				}
				cancel()
				require.NoError(t, run.wait())
			})
		})
	}
}

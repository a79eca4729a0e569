package warren

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime/debug"
	"sync"
	"time"
)

// Handler processes one delivery for [Queue.Serve]. Its result settles the delivery: nil acks
// it; an error wrapping [ErrPermanent] rejects it; any other error, or a panic, returns it for
// another attempt. ctx carries the values of the context given to Serve; it is cancelled, with a
// cause, when Serve stops (at once, or at the end of its [GracePeriod]).
type Handler func(ctx context.Context, d Delivery) error

type serveConfig struct {
	consume consumeConfig
	workers int
	backoff func(attempt int) time.Duration // nil: a failed message goes back at once
	longest time.Duration                   // backoff's longest delay
	grace   time.Duration                   // how long running handlers keep their context after Serve's ends
	started func()                          // OnStart
	err     error

	middleware []func(Handler) Handler // Middleware, the first outermost; none: the handler alone
}

// Workers sets how many handlers [Queue.Serve] runs at once: a fixed pool of n goroutines, none
// per message. Default 1; the consumer's [Prefetch] defaults to n.
func Workers(n int) ServeOption { return serveOption(func(c *serveConfig) { c.workers = n }) }

// Backoff makes [Queue.Serve] return a failed message with a delay ([Delivery.NackWithDelay])
// instead of at once: initial after the first failure, doubling with each further delivery of
// the message ([Delivery.DeliveryCount]), at most max. The message keeps its place in the queue
// meanwhile. Delays are capped at about 146 years (1<<62 ns), as [Delivery.NackWithDelay] caps them, so a
// huge max, up to the largest Duration, means practically never. Default: no delay.
func Backoff(initial, max time.Duration) ServeOption {
	return serveOption(func(c *serveConfig) {
		if initial <= 0 || max < initial {
			c.err = errorf("serve: backoff %v to %v: want 0 < initial ≤ max: %w", initial, max, ErrInvalidArgument)
			return
		}
		c.longest = max
		c.backoff = func(attempt int) time.Duration {
			d := initial
			for ; attempt > 0 && d < max; attempt-- {
				if d > max/2 {
					return max
				}
				d *= 2
			}
			return min(d, max)
		}
	})
}

// GracePeriod lets the handlers running when Serve's context ends finish with their context
// intact, for up to d, as http.Server.Shutdown does: Serve stops taking messages at once, and
// cancels the handlers' context only when d has passed (their results are applied either way).
// Default 0: the handlers' context is cancelled as Serve's ends. d < 0 is an error wrapping
// [ErrInvalidArgument].
func GracePeriod(d time.Duration) ServeOption {
	return serveOption(func(c *serveConfig) {
		if d < 0 {
			c.err = errorf("serve: grace period %v: negative: %w", d, ErrInvalidArgument)
		}
		c.grace = d
	})
}

// OnStart makes [Queue.Serve] call fn once its consumer is in place, before any handler runs, on
// Serve's goroutine: so a caller that runs Serve on a goroutine of its own knows when a message
// published from then on will be handled (close a channel in fn and wait for it). fn is not
// called when Serve fails to start.
func OnStart(fn func()) ServeOption { return serveOption(func(c *serveConfig) { c.started = fn }) }

type serveOption func(*serveConfig)

func (o serveOption) applyServe(c *serveConfig) { o(c) }

// Serve consumes from the queue with a pool of workers that run h on each delivery, and settles
// each delivery by h's result:
//   - nil: [Delivery.Ack].
//   - an error wrapping [ErrPermanent]: [Delivery.Reject] — dead-lettered with reason
//     "rejected", or dropped without a dead-letter exchange — and the error logged at warn
//     level on the broker's logger ([WithLogger]), since the message carries no reason but
//     "rejected" (a [JSONHandler]'s decode error is one).
//   - any other error: [Delivery.Nack], or NackWithDelay with [Backoff]; the message goes back
//     to its original position, redelivered, and the queue's [DeliveryLimit] bounds the attempts
//     (past it the message is dead-lettered with reason "delivery_limit"). Without a delivery
//     limit a message that always fails is retried forever.
//   - a panic: recovered, logged with its stack on the broker's logger ([WithLogger]), reported
//     to listeners as an [EventHandlerPanicked] event (whose Err wraps the panic value when it is
//     an error), and treated as that error.
//   - a handler that ends its goroutine (runtime.Goexit, as t.FailNow does): logged, treated as
//     an error, and its worker replaced.
//   - a typed nil error (`var e *MyErr; return e`: a nil pointer, map, slice, func or chan in a
//     non-nil error): an error like any other, never permanent, and logged at error level with
//     its type named ("handler returned a nil *main.MyErr"); its methods, which may dereference
//     the nil receiver, are never called. An error whose Is or Unwrap method panics when Serve
//     looks for ErrPermanent in it is logged and treated as an error that is not permanent.
//
// A handler may settle its delivery itself; Serve then leaves it alone.
//
// On a durable queue of a broker from [Open], a persistent message's delivery is written to the
// log as a worker takes it, before the handler runs, so that a handler that takes the process
// down still counts towards the [DeliveryLimit] after the restart; a delivery buffered for the
// pool that no worker took does not count (it comes back unchanged). While the disk is full
// ([ErrStorage]), a worker waits before it runs a persistent message's handler, and a
// settlement the log refused is made again once the log writes; if ctx ends first, the delivery
// goes back to its place.
//
// Serve blocks until ctx ends, then stops: it takes no more messages — deliveries buffered for
// the pool go back to their places unchanged, and no handler is started again — and waits for
// the handlers still running. Their context is cancelled at once, or after the [GracePeriod];
// their results are applied, except that a handler that fails once its context was cancelled
// was interrupted, and its message goes back to its place at once (redelivered, one delivery
// more), without a Backoff. Serve returns nil once every delivery is settled or back in place.
// The queue outlives the handlers: an [AutoDelete] queue is deleted once they are done. To finish
// the messages already in the queue before stopping, wait for [Queue.WaitEmpty] before ending
// ctx.
//
// If the consumer ends for another reason — the queue is deleted, the broker closes, an
// [AckTimeout] passes — the handlers' context is cancelled with that reason, and Serve returns
// it once they finish; a result that comes too late to settle its delivery is dropped (logged at
// debug level). So an ack timeout ends the whole pool, as it ends a consumer: run Serve in a loop
// to keep serving after one. ([Broker.Close] does not wait for handlers; Serve does.) If ctx ends
// together with such a reason, Serve returns nil.
//
// opts are [Workers], [Backoff], [GracePeriod], [OnStart], [Middleware], and the consumer
// options: [Prefetch], [ConsumerTag], [ConsumerPriority], [Selector], [AckTimeout], [Exclusive].
// Serve fails at once, as [Queue.Consume] does, if the consumer cannot start.
func (q *Queue) Serve(ctx context.Context, h Handler, opts ...ServeOption) error {
	cfg, err := serveOptions(opts)
	switch {
	case err != nil:
		return err
	case h == nil:
		return errorf("serve: nil handler: %w", ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if h, err = cfg.chain(h); err != nil {
		return err
	}
	if !cfg.consume.prefetchSet {
		cfg.consume.prefetch = cfg.workers
	}
	// The consumer outlives ctx by the handlers' finish: its own context does not end with ctx,
	// and Serve closes it once they are done. The pool's use of an exclusive queue is ctx's.
	cfg.consume.owner = ctx
	cfg.consume.served = true
	c, err := q.consume(context.WithoutCancel(ctx), cfg.consume)
	if err != nil {
		return err
	}
	// What is left goes back before Serve returns (nothing, unless a settlement failed), and an
	// auto-delete queue that Serve alone consumed goes.
	defer c.Close()
	s := server{src: c, h: h, ctx: ctx, backoff: cfg.backoff, log: q.b.cfg.logger.With("queue", q.name)}
	if q.log != nil {
		// A persistent message's delivery record is written as a worker takes the delivery,
		// before the handler runs, and not when it is dispatched into the consumer's buffer
		// (store.received): a handler that takes the process down (a crash, the OOM killer)
		// still counts towards the delivery limit after the restart, which a poison message
		// must reach, while a delivery no handler took does not. The cost, a critical section
		// and a write(2) per handler run or per group of them.
		s.before = func(d Delivery) {
			if d.Message.Persistent {
				if q.b.store.refusing() != nil {
					q.b.store.log.WaitWritten(ctx, 0) // the disk is full: until it is not, or ctx ends
				}
				if lsn := q.b.store.received(q, &d); lsn != 0 {
					q.b.store.log.WaitWritten(ctx, lsn)
				}
			}
		}
		// A settlement the log refused while the disk was full is made again once the log
		// writes again (or not, if Serve stops first: the delivery then goes back).
		s.resume = func() bool {
			return q.b.store.log.WaitWritten(ctx, 0) == nil && q.b.store.refusing() == nil
		}
	}
	if q.b.listening() {
		s.panicked = func(d Delivery, err error) { // in order with the queue's events: after the delivery's
			q.mu.Lock()
			m := d.Message
			q.eventLocked(Event{Kind: EventHandlerPanicked, Consumer: d.ConsumerTag, Message: &m, Err: err})
			q.commit()
		}
	}
	return s.run(cfg)
}

// Source is a stream of deliveries for [ServeSource]: a consumer of a backend other than
// warren's own (contrib/rabbitmq's). A [Consumer] is one.
type Source interface {
	// Deliveries is where deliveries arrive; it is closed when the source stops.
	Deliveries() <-chan Delivery
	// Cancel stops the source: no more deliveries, and Deliveries is closed.
	Cancel() error
	// Done is closed when the source has ended, on its own or after Cancel.
	Done() <-chan struct{}
	// Err says why the source ended on its own; nil after Cancel.
	Err() error
}

// ServeSource is [Queue.Serve] for the deliveries of src: a pool of workers runs h on each and
// settles it by the result, as Serve does, with the same [Workers], [Backoff], [GracePeriod],
// [OnStart] and [Middleware] (the consumer options are src's business, and ignored here). A
// panic, and a permanent failure's error, are logged on slog's default logger. Once ctx ends,
// deliveries received and not handled are given back ([Delivery.Nack] for those of a
// [NewDelivery]). ServeSource does not stop src when it returns because src ended on its own.
func ServeSource(ctx context.Context, src Source, h Handler, opts ...ServeOption) error {
	cfg, err := serveOptions(opts)
	switch {
	case err != nil:
		return err
	case h == nil:
		return errorf("serve: nil handler: %w", ErrInvalidArgument)
	case src == nil:
		return errorf("serve: nil source: %w", ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if h, err = cfg.chain(h); err != nil {
		return err
	}
	s := server{src: src, h: h, ctx: ctx, backoff: cfg.backoff, log: slog.Default()}
	return s.run(cfg)
}

// serveOptions applies opts over Serve's defaults, and checks what every Serve checks.
func serveOptions(opts []ServeOption) (serveConfig, error) {
	cfg := serveConfig{consume: defaultConsumeConfig(), workers: 1}
	for _, o := range opts {
		if o != nil {
			o.applyServe(&cfg)
		}
	}
	switch {
	case cfg.err != nil:
		return cfg, cfg.err
	case cfg.consume.autoAck:
		return cfg, errorf("serve: AutoAck does not apply: Serve settles each delivery by its handler's result: %w", ErrInvalidArgument)
	case cfg.workers < 1 || cfg.workers > maxPrefetch:
		return cfg, errorf("serve: workers %d not in [1, %d]: %w", cfg.workers, maxPrefetch, ErrInvalidArgument)
	case cfg.consume.prefetchSet && cfg.consume.prefetch < 1:
		// Unlimited would take the queue's whole backlog for the workers.
		return cfg, errorf("serve: prefetch %d not in [1, %d]: %w", cfg.consume.prefetch, maxPrefetch, ErrInvalidArgument)
	}
	return cfg, nil
}

// run runs the pool until ctx ends or the source does, and returns as Serve does.
func (s *server) run(cfg serveConfig) error {
	ctx, c := s.ctx, s.src
	if cfg.started != nil {
		cfg.started()
	}
	// The handlers' context keeps ctx's values, and is cancelled when ctx ends (after the grace
	// period) or when the source ends.
	hctx, stopHandlers := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopHandlers(nil)
	s.hctx = hctx
	var (
		workers sync.WaitGroup
		work    func()
	)
	work = func() {
		exited := true // until the loop ends: a handler that calls runtime.Goexit ends this goroutine
		defer func() {
			if exited {
				workers.Go(work) // the pool keeps its size
			}
		}()
		for d := range c.Deliveries() {
			s.serveOne(d)
		}
		exited = false
	}
	for range cfg.workers {
		workers.Go(work)
	}
	select {
	case <-ctx.Done():
		c.Cancel() // no more deliveries; those buffered go back unchanged
		if cfg.grace == 0 {
			stopHandlers(context.Cause(ctx))
		} else {
			t := time.AfterFunc(cfg.grace, func() { stopHandlers(context.Cause(ctx)) })
			defer t.Stop()
		}
	case <-c.Done():
		stopHandlers(c.Err())
	}
	workers.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return c.Err()
}

// server is one Serve's pool: what its workers share.
type server struct {
	src      Source
	h        Handler
	ctx      context.Context // Serve's: once it ends, no handler starts
	hctx     context.Context // the handlers'
	backoff  func(attempt int) time.Duration
	log      *slog.Logger
	before   func(Delivery)        // before a handler runs; nil for nothing
	panicked func(Delivery, error) // after a handler panicked and it was logged; nil for nothing
	// resume waits until a settlement refused with ErrStorage (a full disk) may be made again,
	// and reports whether it may; nil for never.
	resume func() bool
}

// serveOne runs the handler on d and settles d by the result; or, once Serve is stopping, gives
// d back unchanged, never handled.
func (s *server) serveOne(d Delivery) {
	if s.ctx.Err() != nil {
		s.src.Cancel() // Serve's own goroutine may not have yet: nothing more must come this way
		d.giveBack()
		return
	}
	if s.before != nil {
		s.before(d)
		if s.ctx.Err() != nil { // it waited for the log (a full disk) until Serve stopped
			s.src.Cancel()
			d.giveBack()
			return
		}
	}
	err := s.runHandler(d)
	s.settle(d, err)
}

// settle settles d by its handler's result. A failure once the handlers' context was cancelled
// is an interruption: the message goes back at once, with no backoff. A failure once Serve is
// stopping stops the consumer first, if Serve's own goroutine has not yet, so that the message
// does not come straight back this way.
func (s *server) settle(d Delivery, err error) {
	interrupted := err != nil && s.hctx.Err() != nil
	if err != nil && s.ctx.Err() != nil {
		s.src.Cancel()
	}
	var settled error
	permanent := err != nil && s.permanent(d, err)
	for {
		switch {
		case err == nil:
			settled = d.Ack()
		case permanent:
			if settled = d.Reject(); settled == nil {
				s.log.Warn("warren: handler failed permanently; delivery rejected", "consumer", d.ConsumerTag,
					"tag", d.DeliveryTag, "err", err)
			}
		case s.backoff != nil && !interrupted:
			settled = d.NackWithDelay(s.backoff(d.DeliveryCount))
		default:
			settled = d.Nack()
		}
		if !errors.Is(settled, ErrStorage) || s.resume == nil || !s.resume() {
			break
		}
	}
	if settled != nil && !errors.Is(settled, ErrAlreadySettled) {
		s.log.Debug("warren: serve: settlement failed", "tag", d.DeliveryTag, "err", settled)
	}
}

// permanent reports whether the handler's error err wraps [ErrPermanent]. Its Is and Unwrap
// methods are the handler's code, run here outside runHandler's recovery: one that panics (on a
// nil pointer wrapped inside err, say) would end the process. Such an error is logged and is
// not permanent: a failure like any other.
func (s *server) permanent(d Delivery, err error) (permanent bool) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("warren: handler's error panicked when inspected; delivery failed", "consumer", d.ConsumerTag,
				"tag", d.DeliveryTag, "type", fmt.Sprintf("%T", err), "panic", p)
			permanent = false
		}
	}()
	return errors.Is(err, ErrPermanent)
}

// nilError returns the failure of a handler that returned err, an error holding a nil pointer
// (map, slice, func, chan): `var e *MyErr; return e`. Such an interface is not nil, so the
// handler failed; but its methods may dereference their nil receiver, so the error itself is
// never looked at again, only its type named. It returns nil for any other err.
func nilError(err error) error {
	if err == nil {
		return nil
	}
	switch v := reflect.ValueOf(err); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.UnsafePointer:
		if v.IsNil() {
			return errorf("handler returned a nil %T", err)
		}
	}
	return nil
}

// errHandlerExited is the failure of a handler that ended its goroutine with runtime.Goexit (as
// t.FailNow does) instead of returning.
var errHandlerExited = newError("handler called runtime.Goexit")

// runHandler calls h. A panic becomes an error (wrapping the panic value when it is an error),
// after it is logged and told to listeners. A handler that ends its goroutine instead of
// returning fails its delivery here, and its worker is replaced (see Serve).
func (s *server) runHandler(d Delivery) (err error) {
	returned := false
	defer func() {
		p := recover()
		switch {
		case p != nil:
			if pe, ok := p.(error); ok {
				err = errorf("handler panicked: %w", pe)
			} else {
				err = errorf("handler panicked: %v", p)
			}
			s.log.Error("warren: handler panicked", "consumer", d.ConsumerTag,
				"tag", d.DeliveryTag, "panic", p, "stack", string(debug.Stack()))
			if s.panicked != nil {
				s.panicked(d, err)
			}
		case !returned:
			s.log.Error("warren: handler called runtime.Goexit; delivery failed, worker replaced",
				"consumer", d.ConsumerTag, "tag", d.DeliveryTag)
			s.settle(d, errHandlerExited)
		}
	}()
	err = s.h(s.hctx, d)
	returned = true
	if nerr := nilError(err); nerr != nil {
		s.log.Error("warren: handler returned a typed nil error; delivery failed", "consumer", d.ConsumerTag,
			"tag", d.DeliveryTag, "err", nerr)
		return nerr
	}
	return err
}

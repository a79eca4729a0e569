package warren

import (
	"context"
	"errors"
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
	grace   time.Duration                   // how long running handlers keep their context after Serve's ends
	started func()                          // OnStart
	err     error
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
//     "rejected", or dropped without a dead-letter exchange.
//   - any other error: [Delivery.Nack], or NackWithDelay with [Backoff]; the message goes back
//     to its original position, redelivered, and the queue's [DeliveryLimit] bounds the attempts
//     (past it the message is dead-lettered with reason "delivery_limit"). Without a delivery
//     limit a message that always fails is retried forever.
//   - a panic: recovered, logged with its stack on the broker's logger ([WithLogger]), reported
//     to listeners as an [EventHandlerPanicked] event (whose Err wraps the panic value when it is
//     an error), and treated as that error.
//   - a handler that ends its goroutine (runtime.Goexit, as t.FailNow does): logged, treated as
//     an error, and its worker replaced.
//
// A handler may settle its delivery itself; Serve then leaves it alone.
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
// opts are [Workers], [Backoff], [GracePeriod], [OnStart], and the consumer options: [Prefetch],
// [ConsumerTag], [ConsumerPriority], [Selector], [AckTimeout], [Exclusive]. Serve fails at once,
// as [Queue.Consume] does, if the consumer cannot start.
func (q *Queue) Serve(ctx context.Context, h Handler, opts ...ServeOption) error {
	cfg := serveConfig{consume: defaultConsumeConfig(), workers: 1}
	for _, o := range opts {
		if o != nil {
			o.applyServe(&cfg)
		}
	}
	switch {
	case cfg.err != nil:
		return cfg.err
	case cfg.consume.autoAck:
		return errorf("serve: AutoAck does not apply: Serve settles each delivery by its handler's result: %w", ErrInvalidArgument)
	case h == nil:
		return errorf("serve: nil handler: %w", ErrInvalidArgument)
	case cfg.workers < 1 || cfg.workers > maxPrefetch:
		return errorf("serve: workers %d not in [1, %d]: %w", cfg.workers, maxPrefetch, ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
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
	if cfg.started != nil {
		cfg.started()
	}
	// The handlers' context keeps ctx's values, and is cancelled when ctx ends (after the grace
	// period) or when the consumer ends.
	hctx, stopHandlers := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopHandlers(nil)
	s := server{q: q, c: c, h: h, ctx: ctx, hctx: hctx, backoff: cfg.backoff}
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
	q       *Queue
	c       *Consumer
	h       Handler
	ctx     context.Context // Serve's: once it ends, no handler starts
	hctx    context.Context // the handlers'
	backoff func(attempt int) time.Duration
}

// serveOne runs the handler on d and settles d by the result; or, once Serve is stopping, gives
// d back unchanged, never handled.
func (s *server) serveOne(d Delivery) {
	if s.ctx.Err() != nil {
		s.c.Cancel() // Serve's own goroutine may not have yet: nothing more must come this way
		d.giveBack()
		return
	}
	if s.q.log != nil && d.Message.Persistent {
		// Its delivery's record is written before the handler runs: a handler that takes the
		// process down (a crash, the OOM killer) still counts towards the delivery limit after
		// the restart, which a poison message must reach. The cost, a write(2) per handler
		// run or per group of them: Serve on a durable queue measured ~420k msg/s against
		// ~1.3M without it (SyncNever, 4 workers).
		s.q.b.store.log.WaitWritten(0)
	}
	err := s.q.runHandler(s.hctx, s.h, d, s.settle)
	s.settle(d, err)
}

// settle settles d by its handler's result. A failure once the handlers' context was cancelled
// is an interruption: the message goes back at once, with no backoff. A failure once Serve is
// stopping stops the consumer first, if Serve's own goroutine has not yet, so that the message
// does not come straight back this way.
func (s *server) settle(d Delivery, err error) {
	interrupted := err != nil && s.hctx.Err() != nil
	if err != nil && s.ctx.Err() != nil {
		s.c.Cancel()
	}
	var settled error
	switch {
	case err == nil:
		settled = d.Ack()
	case errors.Is(err, ErrPermanent):
		settled = d.Reject()
	case s.backoff != nil && !interrupted:
		settled = d.NackWithDelay(s.backoff(d.DeliveryCount))
	default:
		settled = d.Nack()
	}
	if settled != nil && !errors.Is(settled, ErrAlreadySettled) {
		s.q.b.cfg.logger.Debug("warren: serve: settlement failed", "queue", s.q.name, "tag", d.DeliveryTag, "err", settled)
	}
}

// errHandlerExited is the failure of a handler that ended its goroutine with runtime.Goexit (as
// t.FailNow does) instead of returning.
var errHandlerExited = newError("handler called runtime.Goexit")

// runHandler calls h. A panic becomes an error (wrapping the panic value when it is an error),
// after it is logged and told to listeners. A handler that ends its goroutine instead of
// returning fails its delivery here, and its worker is replaced (see Serve).
func (q *Queue) runHandler(ctx context.Context, h Handler, d Delivery, settle func(Delivery, error)) (err error) {
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
			q.b.cfg.logger.Error("warren: handler panicked", "queue", q.name, "consumer", d.ConsumerTag,
				"tag", d.DeliveryTag, "panic", p, "stack", string(debug.Stack()))
			if q.b.listening() { // in order with the queue's events: after the delivery's
				q.mu.Lock()
				m := d.Message
				q.eventLocked(Event{Kind: EventHandlerPanicked, Consumer: d.ConsumerTag, Message: &m, Err: err})
				q.commit()
			}
		case !returned:
			q.b.cfg.logger.Error("warren: handler called runtime.Goexit; delivery failed, worker replaced",
				"queue", q.name, "consumer", d.ConsumerTag, "tag", d.DeliveryTag)
			settle(d, errHandlerExited)
		}
	}()
	err = h(ctx, d)
	returned = true
	return err
}

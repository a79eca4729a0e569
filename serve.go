package warren

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// Handler processes one delivery for [Queue.Serve]. Its result settles the delivery: nil acks
// it; an error wrapping [ErrPermanent] rejects it; any other error, or a panic, returns it for
// another attempt. ctx is the context given to Serve, cancelled with a cause when Serve stops.
type Handler func(ctx context.Context, d *Delivery) error

type serveConfig struct {
	consume consumeConfig
	workers int
	backoff func(attempt int) time.Duration // nil: a failed message goes back at once
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
			c.err = fmt.Errorf("warren: serve: backoff %v to %v: want 0 < initial ≤ max: %w", initial, max, ErrInvalidArgument)
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
// Serve blocks until ctx ends, then stops gracefully: no new deliveries, deliveries buffered
// for the pool go back to their places unchanged, handlers still running finish (they see ctx
// done) and their results are applied, and anything still outstanding goes back to its place
// before Serve returns nil. If the consumer ends for another reason — the queue is deleted, the
// broker closes, an [AckTimeout] passes — the handlers' context is cancelled with that reason,
// and Serve returns it once they finish; a result that comes too late to settle its delivery is
// dropped (logged at debug level). So an ack timeout ends the whole pool, as it ends a consumer:
// run Serve in a loop to keep serving after one. ([Broker.Close] does not wait for handlers;
// Serve does.) If ctx ends together with such a reason, Serve returns nil.
//
// opts are [Workers], [Backoff], and the consumer options: [Prefetch], [ConsumerTag],
// [ConsumerPriority], [Selector], [AckTimeout], [Exclusive]. Serve fails at once, as
// [Queue.Consume] does, if the consumer cannot start.
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
	case h == nil:
		return fmt.Errorf("warren: serve: nil handler: %w", ErrInvalidArgument)
	case cfg.workers < 1 || cfg.workers > maxPrefetch:
		return fmt.Errorf("warren: serve: workers %d not in [1, %d]: %w", cfg.workers, maxPrefetch, ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if !cfg.consume.prefetchSet {
		cfg.consume.prefetch = cfg.workers
	}
	// The consumer outlives ctx by the drain: its own context ends only once every handler
	// has finished, and takes back whatever is left.
	owner, release := context.WithCancel(context.WithoutCancel(ctx))
	defer release()
	cfg.consume.owner = ctx // the pool's use of an exclusive queue is ctx's
	cfg.consume.served = true
	c, err := q.consume(owner, cfg.consume)
	if err != nil {
		return err
	}
	hctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
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
			q.serveOne(hctx, h, d, cfg.backoff)
		}
		exited = false
	}
	for range cfg.workers {
		workers.Go(work)
	}
	select {
	case <-ctx.Done():
		c.Cancel()
	case <-c.Done():
		stop(c.Err())
	}
	workers.Wait()
	// Anything still outstanding (none, unless a settlement failed) goes back now, before
	// Serve returns; then the consumer's context ends with nothing left.
	_ = c.Recover()
	release()
	if ctx.Err() != nil {
		return nil
	}
	return c.Err()
}

// serveOne runs h on d and settles d by the result.
func (q *Queue) serveOne(ctx context.Context, h Handler, d *Delivery, backoff func(int) time.Duration) {
	q.settleServed(d, q.runHandler(ctx, h, d, backoff), backoff)
}

// settleServed settles d by its handler's result.
func (q *Queue) settleServed(d *Delivery, err error, backoff func(int) time.Duration) {
	var settled error
	switch {
	case err == nil:
		settled = d.Ack()
	case errors.Is(err, ErrPermanent):
		settled = d.Reject()
	case backoff != nil:
		settled = d.NackWithDelay(backoff(d.DeliveryCount))
	default:
		settled = d.Nack()
	}
	if settled != nil && !errors.Is(settled, ErrAlreadySettled) {
		q.b.cfg.logger.Debug("warren: serve: settlement failed", "queue", q.name, "tag", d.DeliveryTag, "err", settled)
	}
}

// errHandlerExited is the failure of a handler that ended its goroutine with runtime.Goexit (as
// t.FailNow does) instead of returning.
var errHandlerExited = errors.New("warren: handler called runtime.Goexit")

// runHandler calls h. A panic becomes an error (wrapping the panic value when it is an error),
// after it is logged and told to listeners. A handler that ends its goroutine instead of
// returning fails its delivery here, and its worker is replaced (see Serve).
func (q *Queue) runHandler(ctx context.Context, h Handler, d *Delivery, backoff func(int) time.Duration) (err error) {
	returned := false
	defer func() {
		p := recover()
		switch {
		case p != nil:
			if pe, ok := p.(error); ok {
				err = fmt.Errorf("warren: handler panicked: %w", pe)
			} else {
				err = fmt.Errorf("warren: handler panicked: %v", p)
			}
			q.b.cfg.logger.Error("warren: handler panicked", "queue", q.name, "consumer", d.ConsumerTag,
				"tag", d.DeliveryTag, "panic", p, "stack", string(debug.Stack()))
			if q.b.listening() { // in order with the queue's events: after the delivery's
				q.mu.Lock()
				q.eventLocked(Event{Kind: EventHandlerPanicked, Consumer: d.ConsumerTag, Message: d.Message, Err: err})
				q.unlock()
			}
		case !returned:
			q.b.cfg.logger.Error("warren: handler called runtime.Goexit; delivery failed, worker replaced",
				"queue", q.name, "consumer", d.ConsumerTag, "tag", d.DeliveryTag)
			q.settleServed(d, errHandlerExited, backoff)
		}
	}()
	err = h(ctx, d)
	returned = true
	return err
}

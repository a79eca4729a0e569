package warren

import (
	"context"
	"time"
)

// Middleware wraps the handler of [Queue.Serve] (and of [Broker.Serve], any [Backend]'s Serve,
// [ServeSource]) in mw, in the func(Handler) Handler shape of net/http middleware: for
// per-attempt timeouts ([HandlerTimeout]), logging, metrics, tracing. The first is outermost:
// Middleware(a, b) runs a, which calls b, which calls the handler, as a(b(h)); a second
// Middleware option adds its mw inside the first's. Nil entries are ignored.
//
// Each middleware is called once, on the goroutine that calls Serve, when Serve starts (before
// its consumer: one that returns a nil Handler makes Serve fail with [ErrInvalidArgument]). The
// Handler they make up runs once per delivery, that is once per attempt at a message, on a
// worker, with the handlers' context and the [Delivery]; what it returns settles the delivery,
// as a handler's result does. So a middleware may change the result: wrap an error in
// [ErrPermanent] to reject, or return nil to ack.
//
// Serve recovers a panic anywhere in the chain, a middleware's own included, as it recovers a
// handler's: logged, reported as an [EventHandlerPanicked] event, and a failed attempt. There is
// no recovering middleware to add; a middleware's deferred functions see a panic unwind through
// them (one that recovers takes the panic over, and its result settles the delivery; re-panic
// to leave it to Serve). Without Middleware, Serve calls the handler directly.
func Middleware(mw ...func(Handler) Handler) ServeOption {
	return serveOption(func(c *serveConfig) { c.middleware = append(c.middleware, mw...) })
}

// chain returns h wrapped in the configuration's middleware, the first outermost, or an error
// if one of them returns nil.
func (c *serveConfig) chain(h Handler) (Handler, error) {
	for i := len(c.middleware) - 1; i >= 0; i-- {
		mw := c.middleware[i]
		if mw == nil {
			continue
		}
		if h = mw(h); h == nil {
			return nil, errorf("serve: middleware %d of %d returned a nil handler: %w", i+1, len(c.middleware), ErrInvalidArgument)
		}
	}
	return h, nil
}

// HandlerTimeout returns a middleware that gives each attempt at a message at most d: the
// handler's context is cancelled after d (ctx.Err() is [context.DeadlineExceeded], and
// [context.Cause] says it was the handler timeout). A handler that fails then — with ctx.Err()
// or anything else not wrapping [ErrPermanent] — fails the attempt as any error does: the
// message goes back to its place, after the [Backoff] if there is one, and the queue's
// [DeliveryLimit] bounds the attempts. The timeout does not stop a handler that ignores its
// context, and a handler that returns nil after it is acked.
//
// Unlike a consumer's [AckTimeout], which ends the consumer and so the whole Serve, a handler
// timeout fails only the attempt: give the handlers a timeout below the ack timeout. Once
// Serve's own context ends, the handlers' context is cancelled as usual, and an interrupted
// attempt goes back at once, without a backoff ([Queue.Serve]). d ≤ 0 means no timeout: the
// middleware returns the handler unchanged.
func HandlerTimeout(d time.Duration) func(Handler) Handler {
	cause := errorf("handler timed out after %v: %w", d, context.DeadlineExceeded)
	return func(next Handler) Handler {
		if d <= 0 {
			return next
		}
		return func(ctx context.Context, dv Delivery) error {
			ctx, cancel := context.WithTimeoutCause(ctx, d, cause)
			defer cancel()
			return next(ctx, dv)
		}
	}
}

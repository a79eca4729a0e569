package warren_test

import (
	"context"
	"testing"
	"time"

	"github.com/warrenmq/warren"
)

// BenchmarkServeMiddleware: BenchmarkServe's workers=1 flow (see benchServe) with a chain of
// middleware around the trivial handler. none is Serve without Middleware, whose handler is
// called directly; noop is one middleware that calls the next handler; timeout is
// HandlerTimeout, whose context.WithTimeout (a context and a timer per attempt) is its cost.
func BenchmarkServeMiddleware(b *testing.B) {
	noop := func(next warren.Handler) warren.Handler {
		return func(ctx context.Context, d warren.Delivery) error { return next(ctx, d) }
	}
	b.Run("none", func(b *testing.B) { benchServe(b, 1, false) })
	b.Run("noop", func(b *testing.B) { benchServe(b, 1, false, warren.Middleware(noop)) })
	b.Run("noop×4", func(b *testing.B) { benchServe(b, 1, false, warren.Middleware(noop, noop, noop, noop)) })
	b.Run("timeout", func(b *testing.B) { benchServe(b, 1, false, warren.Middleware(warren.HandlerTimeout(time.Minute))) })
}

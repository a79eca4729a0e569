package warren_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warrenmq/warren"
)

// Typed payloads and middleware (typed.go, middleware.go). The examples are here rather than in
// example_test.go to keep this change to files of its own.

// A typed handler: JSONHandler decodes each body into an order before the handler sees it, and a
// body that does not decode is rejected on its first attempt (here into the dead-letter queue)
// instead of being retried up to the delivery limit. Middleware wraps every attempt, the first
// outermost: here an outcome log around a per-attempt timeout.
func ExampleJSONHandler() {
	type order struct {
		ID   int    `json:"id"`
		Item string `json:"item"`
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	b := warren.New()
	defer b.Close()
	dead, _ := b.DeclareQueue("orders.dead")
	q, _ := b.DeclareQueue("orders", warren.DeliveryLimit(3), warren.DeadLetter("", "orders.dead"))

	logOutcome := func(next warren.Handler) warren.Handler {
		return func(ctx context.Context, d warren.Delivery) error {
			err := next(ctx, d)
			outcome := "ack"
			switch {
			case errors.Is(err, warren.ErrPermanent):
				outcome = "reject"
			case err != nil:
				outcome = "retry"
			}
			fmt.Printf("attempt %d at %s: %s\n", d.DeliveryCount+1, d.Message.Body, outcome)
			return err
		}
	}
	handle := warren.JSONHandler(func(ctx context.Context, o order, d warren.Delivery) error {
		fmt.Printf("order %d: %s\n", o.ID, o.Item)
		return nil
	})
	served := make(chan error)
	started := make(chan struct{})
	go func() {
		served <- q.Serve(ctx, handle, warren.OnStart(func() { close(started) }),
			warren.Middleware(logOutcome, warren.HandlerTimeout(10*time.Second)))
	}()
	<-started

	_ = warren.PublishJSON(ctx, b, "", "orders", order{ID: 1, Item: "tea"})
	_ = b.Publish(ctx, "", "orders", warren.Message{Body: []byte("{not json")})
	_ = b.WaitIdle(ctx)

	d, _ := dead.Get(ctx)
	fmt.Println("dead-lettered:", string(d.Message.Body), d.Message.Headers["x-first-death-reason"])
	stop()
	fmt.Println("serve:", <-served)
	// Output:
	// order 1: tea
	// attempt 1 at {"id":1,"item":"tea"}: ack
	// attempt 1 at {not json: reject
	// dead-lettered: {not json rejected
	// serve: <nil>
}

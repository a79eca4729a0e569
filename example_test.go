package warren_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warrenmq/warren"
)

// The quick start: declare a queue, publish through the default exchange, consume and ack.
func Example() {
	ctx := context.Background()
	b := warren.New()
	defer b.Close()

	q, _ := b.DeclareQueue("jobs")
	_ = b.Publish(ctx, "", "jobs", warren.Message{Body: []byte("hello")}) // default exchange: by queue name

	c, _ := q.Consume(ctx, warren.Prefetch(10))
	d := <-c.Deliveries()
	fmt.Println(string(d.Message.Body))
	_ = d.Ack() // or d.Nack(): back to its original position, redelivered
	// Output: hello
}

// A nacked message goes back to its original position, ahead of everything published after it.
func ExampleDelivery_Nack() {
	ctx := context.Background()
	b := warren.New()
	defer b.Close()
	q, _ := b.DeclareQueue("jobs")
	for _, body := range []string{"a", "b", "c"} {
		_ = b.Publish(ctx, "", "jobs", warren.Message{Body: []byte(body)})
	}

	first, _ := q.Get(ctx)  // a
	second, _ := q.Get(ctx) // b
	_ = second.Nack()
	_ = first.Nack()

	for {
		d, err := q.Get(ctx)
		if err != nil { // warren.ErrEmpty
			break
		}
		fmt.Println(string(d.Message.Body), d.Redelivered, d.DeliveryCount)
		_ = d.Ack()
	}
	// Output:
	// a true 1
	// b true 1
	// c false 0
}

// A consumer whose context ends gives back what it holds: AMQP's channel close.
func ExampleQueue_Consume_contextEnd() {
	b := warren.New()
	defer b.Close()
	q, _ := b.DeclareQueue("jobs")
	for _, body := range []string{"a", "b", "c"} {
		_ = b.Publish(context.Background(), "", "jobs", warren.Message{Body: []byte(body)})
	}

	ctx, cancel := context.WithCancel(context.Background())
	c, _ := q.Consume(ctx, warren.Prefetch(2))
	<-c.Deliveries() // a, never acked
	<-c.Deliveries() // b, never acked
	cancel()
	<-c.Done() // a and b are back in their places

	d, _ := q.Get(context.Background(), warren.AutoAck())
	fmt.Println(string(d.Message.Body), d.Redelivered, d.MessageCount)
	// Output: a true 2
}

// A fanout exchange copies each message to every bound queue; a topic exchange routes by
// dotted-word patterns.
func ExampleBroker_Bind() {
	ctx := context.Background()
	b := warren.New()
	defer b.Close()

	_, _ = b.DeclareExchange("logs", warren.ExchangeTopic)
	all, _ := b.DeclareQueue("all")
	errs, _ := b.DeclareQueue("errors")
	_ = b.Bind("all", "logs", "#", nil)
	_ = b.Bind("errors", "logs", "*.error", nil)

	_ = b.Publish(ctx, "logs", "db.error", warren.Message{Body: []byte("disk full")})
	_ = b.Publish(ctx, "logs", "db.info", warren.Message{Body: []byte("vacuumed")})
	fmt.Println(all.Len(), errs.Len())
	// Output: 2 1
}

// Close ends every consumer: its channel closes and Err says why.
func ExampleBroker_Close() {
	b := warren.New()
	q, _ := b.DeclareQueue("jobs")
	c, _ := q.Consume(context.Background())
	_ = b.Close()

	_, open := <-c.Deliveries()
	fmt.Println(open, c.Err())
	fmt.Println(b.Publish(context.Background(), "", "jobs", warren.Message{}))
	// Output:
	// false warren: broker closed
	// warren: broker closed
}

// Serve runs a handler on a fixed pool of workers and settles each delivery by its result: nil
// acks, an error nacks (the message is tried again at its place, here after a backoff), and past
// the queue's delivery limit the message is dead-lettered.
func ExampleQueue_Serve() {
	b := warren.New()
	defer b.Close()
	dead, _ := b.DeclareQueue("jobs.dead")
	q, _ := b.DeclareQueue("jobs", warren.DeliveryLimit(1), warren.DeadLetter("", "jobs.dead"))
	for _, body := range []string{"ok", "broken"} {
		_ = b.Publish(context.Background(), "", "jobs", warren.Message{Body: []byte(body)})
	}

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = q.Serve(ctx, func(ctx context.Context, d warren.Delivery) error {
			fmt.Println("handling", string(d.Message.Body), "attempt", d.DeliveryCount+1)
			if string(d.Message.Body) == "broken" {
				if d.DeliveryCount == 1 {
					defer stop() // the last attempt: stop serving once it is settled
				}
				return errors.New("cannot handle it")
			}
			return nil
		}, warren.Workers(1), warren.Backoff(time.Millisecond, time.Second))
	}()
	<-done // Serve returns once ctx ends and its handlers have finished and been settled

	d, _ := dead.Get(context.Background())
	fmt.Println("dead-lettered:", string(d.Message.Body), d.Message.Headers["x-first-death-reason"])
	// Output:
	// handling ok attempt 1
	// handling broken attempt 1
	// handling broken attempt 2
	// dead-lettered: broken delivery_limit
}

// A test of a message flow without sleeps: publish, wait until the broker is idle, assert. A
// handler fails the first attempt of each job; WaitIdle returns once both jobs are done, and
// Stats and Listen tell what happened.
func ExampleBroker_WaitIdle() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	b := warren.New()
	defer b.Close()
	q, _ := b.DeclareQueue("jobs")

	var acked []string
	defer b.Listen(func(e warren.Event) { // called in order for one queue, with no lock held
		if e.Kind == warren.EventAcked {
			acked = append(acked, string(e.Message.Body))
		}
	})()
	served := make(chan error)
	started := make(chan struct{})
	go func() {
		served <- q.Serve(ctx, func(_ context.Context, d warren.Delivery) error {
			if !d.Redelivered {
				return errors.New("transient") // nacked: back to its place, redelivered
			}
			return nil
		}, warren.OnStart(func() { close(started) }))
	}()
	<-started // Serve's consumer is in place: what is published now is handled

	_ = b.Publish(ctx, "", "jobs", warren.Message{Body: []byte("a")})
	_ = b.Publish(ctx, "", "jobs", warren.Message{Body: []byte("b")})
	_ = b.WaitIdle(ctx)

	s := q.Stats()
	fmt.Println("acked:", acked)
	fmt.Println("delivered:", s.Delivered, "nacked:", s.Nacked, "ready:", s.Ready)
	stop()
	fmt.Println("serve:", <-served)
	// Output:
	// acked: [a b]
	// delivered: 4 nacked: 2 ready: 0
	// serve: <nil>
}

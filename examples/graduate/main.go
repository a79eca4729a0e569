// Command graduate runs one program on two backends: warren in the process by default, or a
// RabbitMQ with -rabbitmq URL, through the same warren.Backend interface. The topology, the
// publisher and the handlers are the same code, and so is what it prints.
//
//	go run .                                                  # in process
//	go run . -rabbitmq amqp://guest:guest@127.0.0.1:5672/     # on RabbitMQ (quorum queues)
//
// It is its own module, beside warren's, because it imports contrib/rabbitmq (amqp091-go).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/contrib/rabbitmq"
)

func main() {
	url := flag.String("rabbitmq", "", "a RabbitMQ to run on (amqp://user:password@host:port/vhost); in process when empty")
	flag.Parse()
	var (
		b   warren.Backend
		err error
	)
	if *url == "" {
		b = warren.New()
	} else if b, err = rabbitmq.Dial(*url, rabbitmq.WithQueueType(rabbitmq.Quorum)); err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	if err := run(context.Background(), b, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// topology: orders arrive on a topic exchange; the work queue retries a failed order at most
// twice, then dead-letters it. Both queues go once unused for a minute, so that runs on a
// shared RabbitMQ leave nothing behind.
var topology = warren.Topology{
	Exchanges: []warren.ExchangeDecl{{Name: "shop", Kind: warren.ExchangeTopic, Durable: true}},
	Queues: []warren.QueueDecl{
		{Name: "shop.orders", Durable: true, Arguments: warren.Table{"x-delivery-limit": int64(2), "x-expires": int64(60_000),
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "shop.orders.dead"}},
		{Name: "shop.orders.dead", Durable: true, Arguments: warren.Table{"x-expires": int64(60_000)}},
	},
	Bindings: []warren.BindingDecl{{Source: "shop", Destination: "shop.orders", RoutingKey: "order.*"}},
}

// run declares the topology, publishes the orders, handles them until every one is shipped or
// dead, and writes what happened to w.
func run(ctx context.Context, b warren.Backend, w io.Writer) error {
	if err := b.DeclareTopology(topology); err != nil {
		return err
	}
	orders := []string{"apples", "bread", "flaky-cheese", "dates", "bad-eggs", "figs", "always-out-of-grapes"}
	var (
		mu       sync.Mutex
		attempts = map[string]int{}
		shipped  []string
		dead     []string
		done     = make(chan struct{})
	)
	finish := func() { // the caller holds mu
		if len(shipped)+len(dead) == len(orders) {
			close(done)
		}
	}
	ship := func(_ context.Context, d warren.Delivery) error {
		order := string(d.Message.Body)
		mu.Lock()
		defer mu.Unlock()
		attempts[order]++
		switch {
		case order == "bad-eggs":
			return warren.Permanent(errors.New("cannot be shipped")) // dead-lettered at once
		case order == "flaky-cheese" && attempts[order] < 2:
			return errors.New("warehouse busy") // returned, and handled again
		case order == "always-out-of-grapes":
			return errors.New("out of stock") // returned until the delivery limit dead-letters it
		}
		shipped = append(shipped, order)
		finish()
		return nil
	}
	bury := func(_ context.Context, d warren.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		dead = append(dead, string(d.Message.Body))
		finish()
		return nil
	}

	serving, stop := context.WithCancel(ctx)
	defer stop()
	var workers sync.WaitGroup
	errs := make(chan error, 2)
	for queue, h := range map[string]warren.Handler{"shop.orders": ship, "shop.orders.dead": bury} {
		workers.Go(func() { errs <- b.Serve(serving, queue, h, warren.Workers(2)) })
	}
	for _, order := range orders {
		if err := b.Publish(ctx, "shop", "order.new", warren.Message{Body: []byte(order), Persistent: true}); err != nil {
			return err
		}
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		return errors.New("not every order was shipped or dead after a minute")
	}
	stop()
	workers.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}

	mu.Lock()
	defer mu.Unlock()
	slices.Sort(shipped)
	slices.Sort(dead)
	fmt.Fprintf(w, "shipped: %v\n", shipped)
	fmt.Fprintf(w, "dead:    %v\n", dead)
	for _, order := range orders {
		fmt.Fprintf(w, "%-22s %d attempt(s)\n", order, attempts[order])
	}
	return nil
}

// Command workqueue shows warren as an in-process work queue: a producer, a pool of workers
// that acknowledge what they finish, a worker that crashes while holding jobs, and a job whose
// handler fails once. Jobs that come back are redelivered at their original positions, ahead of
// everything published after them.
//
//	go run ./examples/workqueue
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenmq/warren"
)

const jobs = 8

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx := context.Background()
	b := warren.New()
	defer b.Close()

	q, err := b.DeclareQueue("jobs")
	if err != nil {
		return err
	}
	for i := 1; i <= jobs; i++ {
		// The default exchange "" routes to the queue named by the routing key.
		if err := b.Publish(ctx, "", "jobs", warren.Message{Body: fmt.Appendf(nil, "job-%d", i)}); err != nil {
			return err
		}
	}
	fmt.Printf("published %d jobs; queue holds %d\n", jobs, q.Len())

	// A worker takes three jobs and crashes before acknowledging them: its context ends, and the
	// three jobs go back to the head of the queue, marked redelivered.
	crashCtx, crash := context.WithCancel(ctx)
	defer crash()
	c, err := q.Consume(crashCtx, warren.Prefetch(3), warren.ConsumerTag("flaky-worker"))
	if err != nil {
		return err
	}
	for range 3 {
		d := <-c.Deliveries()
		fmt.Printf("flaky-worker took %s and crashed before acking it\n", d.Message.Body)
	}
	crash()
	<-c.Done() // closed once the three jobs are back in the queue
	fmt.Printf("queue holds %d ready, %d unacked\n\n", q.Len(), q.Unacked())

	// A pool of three workers, one job at a time each. job-5's handler fails on its first
	// attempt; the worker nacks it and it goes back to its original position.
	poolCtx, stopPool := context.WithCancel(ctx)
	defer stopPool()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex // serialises printing and the delivery log
		order   []string   // jobs in the order workers received them
		acked   atomic.Int32
		allDone = make(chan struct{})
	)
	for w := 1; w <= 3; w++ {
		c, err := q.Consume(poolCtx, warren.Prefetch(1), warren.ConsumerTag(fmt.Sprintf("worker-%d", w)))
		if err != nil {
			return err
		}
		wg.Go(func() {
			for d := range c.Deliveries() {
				job := string(d.Message.Body)
				mu.Lock()
				if d.Redelivered {
					job += "*"
					fmt.Printf("%s received %s (redelivered, delivery count %d)\n", c.Tag(), d.Message.Body, d.DeliveryCount)
				} else {
					fmt.Printf("%s received %s\n", c.Tag(), d.Message.Body)
				}
				order = append(order, job)
				mu.Unlock()
				if err := handle(d); err != nil {
					fmt.Printf("%s: %s failed (%v): nack, back to its place in the queue\n", c.Tag(), d.Message.Body, err)
					_ = d.Nack()
					continue
				}
				_ = d.Ack()
				if acked.Add(1) == jobs {
					close(allDone)
				}
			}
		})
	}
	select {
	case <-allDone:
	case <-time.After(10 * time.Second):
		return errors.New("workqueue: jobs did not finish in 10s")
	}
	stopPool()
	wg.Wait()
	fmt.Printf("\ndelivery order (* = redelivered): %s\n", strings.Join(order, " "))
	fmt.Printf("all %d jobs acknowledged; queue holds %d ready, %d unacked\n", jobs, q.Len(), q.Unacked())
	return nil
}

var failedOnce atomic.Bool

// handle does the work of one job. job-5 fails the first time it is tried.
func handle(d *warren.Delivery) error {
	time.Sleep(5 * time.Millisecond) // the work
	if string(d.Message.Body) == "job-5" && failedOnce.CompareAndSwap(false, true) {
		return errors.New("transient error")
	}
	return nil
}

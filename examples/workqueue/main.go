// Command workqueue shows warren as an in-process work queue: a producer, a worker that crashes
// while holding jobs, and a pool of workers run by Queue.Serve, with a job whose handler fails
// once and a poison job whose handler panics every time. Jobs that come back are redelivered at
// their original positions, ahead of everything published after them; the poison job is
// dead-lettered after its delivery limit.
//
//	go run ./examples/workqueue
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenmq/warren"
)

const jobs = 8

func main() {
	if err := run(os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run runs the example, writing what happens to w.
func run(w io.Writer) error {
	ctx := context.Background()
	b := warren.New()
	defer b.Close()

	// Failed jobs are retried at most twice, then dead-lettered through the default exchange
	// to "jobs.dead".
	dlq, err := b.DeclareQueue("jobs.dead")
	if err != nil {
		return err
	}
	q, err := b.DeclareQueue("jobs", warren.DeliveryLimit(2), warren.DeadLetter("", "jobs.dead"))
	if err != nil {
		return err
	}
	for i := 1; i <= jobs; i++ {
		// The default exchange "" routes to the queue named by the routing key.
		if err := b.Publish(ctx, "", "jobs", warren.Message{Body: fmt.Appendf(nil, "job-%d", i)}); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "published %d jobs; queue holds %d\n", jobs, q.Len())

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
		fmt.Fprintf(w, "flaky-worker took %s and crashed before acking it\n", d.Message.Body)
	}
	crash()
	<-c.Done() // closed once the three jobs are back in the queue
	fmt.Fprintf(w, "queue holds %d ready, %d unacked\n\n", q.Len(), q.Unacked())

	// A pool of three workers run by Serve, one job at a time each. A handler's error nacks
	// the job: it goes back to its original position and is tried again. job-5 fails once;
	// job-7 panics every time: the panic is recovered and counted as a failure, and after its
	// delivery limit the job is dead-lettered to "jobs.dead" instead of looping forever.
	var (
		mu         sync.Mutex // serialises printing and the delivery log
		order      []string   // jobs in the order workers received them
		settled    atomic.Int32
		failedOnce atomic.Bool // job-5 has failed
		allDone    = make(chan struct{})
	)
	stop := b.Listen(func(e warren.Event) {
		if e.Kind == warren.EventHandlerPanicked {
			mu.Lock()
			fmt.Fprintf(w, "handler panicked on %s: recovered (%v)\n", e.Message.Body, e.Err)
			mu.Unlock()
		}
	})
	defer stop()
	serveCtx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	served := make(chan error, 1)
	go func() {
		served <- q.Serve(serveCtx, func(ctx context.Context, d warren.Delivery) error {
			job := string(d.Message.Body)
			mu.Lock()
			if d.Redelivered {
				fmt.Fprintf(w, "received %s (redelivered, delivery count %d)\n", job, d.DeliveryCount)
				job += "*"
			} else {
				fmt.Fprintf(w, "received %s\n", job)
			}
			order = append(order, job)
			mu.Unlock()
			defer func() {
				if settled.Add(1) == jobs+1+2 { // each job once, job-5 once more, job-7 twice more
					close(allDone)
				}
			}()
			err := handle(d, &failedOnce) // a panic in it is reported by the listener above
			if err != nil {
				mu.Lock()
				fmt.Fprintf(w, "%s failed: %v (nacked: back to its place, to be tried again)\n", d.Message.Body, err)
				mu.Unlock()
			}
			return err
		}, warren.Workers(3))
	}()
	select {
	case <-allDone:
	case <-time.After(10 * time.Second):
		return errors.New("workqueue: jobs did not finish in 10s")
	}
	stopServing()
	if err := <-served; err != nil {
		return err
	}
	dead, err := dlq.Get(ctx)
	if err != nil {
		return fmt.Errorf("workqueue: dead-letter queue: %w", err)
	}
	death := dead.Message.Deaths()[0] // the x-death history, typed; newest first
	fmt.Fprintf(w, "\norder handlers started (* = redelivered): %s\n", strings.Join(order, " "))
	fmt.Fprintf(w, "dead-lettered: %s from %q (reason %s)\n", dead.Message.Body, death.Queue, death.Reason)
	fmt.Fprintf(w, "queue holds %d ready, %d unacked\n", q.Len(), q.Unacked())
	return dead.Ack()
}

// handle does the work of one job. job-5 fails the first time it is tried; job-7 always panics.
func handle(d warren.Delivery, failedOnce *atomic.Bool) error {
	time.Sleep(5 * time.Millisecond) // the work
	switch string(d.Message.Body) {
	case "job-5":
		if failedOnce.CompareAndSwap(false, true) {
			return errors.New("transient error")
		}
	case "job-7":
		panic("job-7 cannot be processed")
	}
	return nil
}

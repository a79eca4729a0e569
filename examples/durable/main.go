// Command durable shows jobs surviving the process: a durable broker (warren.Open) keeps a
// durable queue's persistent messages in a directory, so a job published before a crash or a
// deploy is still there when the service starts again, and a job that was being worked on when
// the process died comes back redelivered.
//
// Run it, kill it while it works (Ctrl-C, or kill -9 from another terminal), and run it again:
//
//	go run ./examples/durable                # publishes 10 e-mail jobs, sends them slowly
//	go run ./examples/durable                # after a kill: finishes what was left
//	go run ./examples/durable -kill-after 3  # kills itself (SIGKILL) after the third e-mail
//	go run ./examples/durable -reset         # starts again: removes the directory first
//
// The directory (-dir, by default warren-durable-example in the system's temporary directory)
// holds the broker's own directory, broker/, which nothing else writes to, and sent.log, where
// the e-mails "sent" are appended: after any number of kills, every job is sent, and only a job
// whose sending was interrupted by a kill can be sent twice (at least once delivery, as with
// RabbitMQ). Once every job is sent, a run says so and does nothing: -reset starts again.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/warrenmq/warren"
)

const jobs = 10

func main() {
	dir := flag.String("dir", filepath.Join(os.TempDir(), "warren-durable-example"), "the example's directory: the broker's (broker/) and sent.log")
	reset := flag.Bool("reset", false, "remove the directory first, to start again")
	killAfter := flag.Int("kill-after", 0, "kill this process with SIGKILL after sending this many e-mails (0: never)")
	pace := flag.Duration("pace", 300*time.Millisecond, "how long sending one e-mail takes")
	flag.Parse()
	if *reset {
		if err := os.RemoveAll(*dir); err != nil {
			log.Fatal(err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	kill := func() {
		// What a crash or `kill -9` does: no Close, no deferred function runs.
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	if err := run(ctx, os.Stdout, *dir, *pace, *killAfter, kill); err != nil {
		log.Fatal(err)
	}
}

// run opens the broker in dir/broker, publishes the jobs if this is the first run, and sends
// e-mails, appending them to dir/sent.log, until the queue is empty or ctx ends. After killAfter
// e-mails (if not 0) it calls kill while holding the next job.
func run(ctx context.Context, w io.Writer, dir string, pace time.Duration, killAfter int, kill func()) error {
	// The broker's directory is its own: warren.Open locks it, and its log is all it holds.
	b, err := warren.Open(filepath.Join(dir, "broker")) // SyncAlways: a job, once published, survives even a power loss
	if err != nil {
		return err
	}
	defer b.Close()

	// Durable queues; their persistent messages survive restarts. A job that fails three times
	// goes to the dead-letter queue, which is durable too.
	if _, err := b.DeclareQueue("emails.dead", warren.Durable()); err != nil {
		return err
	}
	q, err := b.DeclareQueue("emails", warren.Durable(), warren.DeliveryLimit(3), warren.DeadLetter("", "emails.dead"))
	if err != nil {
		return err
	}
	sentLog := filepath.Join(dir, "sent.log")
	if _, err := os.Stat(sentLog); errors.Is(err, os.ErrNotExist) && q.Len() == 0 {
		// The first run: publish the jobs, all confirmed by one sync of the log.
		batch := make([]warren.Publishing, jobs)
		for i := range batch {
			batch[i] = warren.Publishing{Key: "emails", Message: warren.Message{
				Body:       fmt.Appendf(nil, "welcome e-mail to user %d", i+1),
				Persistent: true, // delivery mode 2: kept in a durable queue
			}}
		}
		if err := b.PublishBatch(ctx, batch); err != nil {
			return err
		}
		fmt.Fprintf(w, "published %d jobs\n", jobs)
	} else if q.Len() == 0 {
		fmt.Fprintf(w, "every job was sent in an earlier run (see %s); run with -reset to start again\n", sentLog)
		return nil
	} else {
		fmt.Fprintf(w, "reopened %s: %d jobs left\n", dir, q.Len())
	}
	sent, err := os.OpenFile(sentLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer sent.Close()

	done := 0
	serveCtx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	go func() {
		// Stop serving once every job is done (or the example is interrupted).
		q.WaitEmpty(serveCtx)
		stopServing()
	}()
	err = q.Serve(serveCtx, func(ctx context.Context, d warren.Delivery) error {
		select {
		case <-time.After(pace): // sending
		case <-ctx.Done():
			return ctx.Err() // interrupted: the job goes back to its place
		}
		if killAfter > 0 && done == killAfter {
			fmt.Fprintf(w, "killed while sending %s\n", d.Message.Body)
			kill()
		}
		again := ""
		if d.Redelivered {
			again = fmt.Sprintf(" (again: delivered %d time(s) before, when the process stopped)", d.DeliveryCount)
		}
		fmt.Fprintf(w, "sent %s%s\n", d.Message.Body, again)
		fmt.Fprintf(sent, "%s\n", d.Message.Body)
		done++
		return nil // acknowledged: gone from the queue, and from the log
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%d e-mails sent in this run; %d jobs left\n", done, q.Len())
	return nil
}

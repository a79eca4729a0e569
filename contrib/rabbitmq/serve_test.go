package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of Client.Serve (serve.go): the same handler code on warren and on RabbitMQ.

// jobsTopology is a work queue with a delivery limit that dead-letters into a queue of dead
// jobs.
func jobsTopology() warren.Topology {
	return warren.Topology{Queues: []warren.QueueDecl{
		{Name: "jobs", Durable: true, Arguments: warren.Table{"x-delivery-limit": int64(3),
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}},
		{Name: "dead", Durable: true},
	}}
}

// runJobs runs four jobs through any backend with one handler: one that succeeds, one that
// fails once, one that is permanently bad, one that always fails. It returns how many attempts
// each took and what was dead-lettered, once all four are done.
func runJobs(t *testing.T, b warren.Backend, top warren.Topology) (attempts map[string]int, dead []string) {
	t.Helper()
	jobs, deadQ := top.Queues[0].Name, top.Queues[1].Name
	require.NoError(t, b.DeclareTopology(top))
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu       sync.Mutex
		finished = make(chan string, 8)
	)
	attempts = map[string]int{}
	handler := func(_ context.Context, d warren.Delivery) error {
		body := string(d.Message.Body)
		mu.Lock()
		attempts[body]++
		n := attempts[body]
		mu.Unlock()
		switch body {
		case "ok":
		case "fails-once":
			if n == 1 {
				return errors.New("not yet")
			}
		case "bad":
			return warren.Permanent(errors.New("cannot be done"))
		case "always":
			return errors.New("never")
		}
		finished <- body
		return nil
	}
	deadHandler := func(_ context.Context, d warren.Delivery) error {
		finished <- "dead:" + string(d.Message.Body)
		return nil
	}
	var served sync.WaitGroup
	for queue, h := range map[string]warren.Handler{jobs: handler, deadQ: deadHandler} {
		served.Go(func() {
			if err := b.Serve(ctx, queue, h, warren.Workers(2)); err != nil {
				t.Errorf("serve %s: %v", queue, err)
			}
		})
	}
	for _, body := range []string{"ok", "fails-once", "bad", "always"} {
		require.NoError(t, b.Publish(ctx, "", jobs, warren.Message{Body: []byte(body), Persistent: true}))
	}
	var done []string
	timeout := time.After(30 * time.Second)
	for len(done) < 4 {
		select {
		case f := <-finished:
			done = append(done, f)
			if len(f) > 5 && f[:5] == "dead:" {
				dead = append(dead, f[5:])
			}
		case <-timeout:
			t.Fatalf("not done: %v, attempts %v", done, attempts)
		}
	}
	cancel()
	served.Wait()
	mu.Lock()
	defer mu.Unlock()
	return attempts, dead
}

// The same handler on warren and on RabbitMQ (quorum queues): the same attempts, the same
// dead letters.
func TestServeAsWarren(t *testing.T) {
	conn := dial(t)
	top := unique(t, conn, jobsTopology())

	b := warren.New()
	defer b.Close()
	inWarren, deadInWarren := runJobs(t, b, top)

	c, err := Dial(rabbitURL(t), WithQueueType(Quorum))
	require.NoError(t, err)
	defer c.Close()
	inRabbit, deadInRabbit := runJobs(t, c, top)

	require.Equal(t, map[string]int{"ok": 1, "fails-once": 2, "bad": 1, "always": 4}, inWarren)
	require.Equal(t, inWarren, inRabbit)
	require.ElementsMatch(t, []string{"bad", "always"}, deadInWarren)
	require.ElementsMatch(t, deadInWarren, deadInRabbit)
}

// What RabbitMQ has no counterpart for is refused.
func TestServeRefuses(t *testing.T) {
	conn := dial(t)
	top := unique(t, conn, jobsTopology())
	c, err := Dial(rabbitURL(t), WithQueueType(Quorum))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.DeclareTopology(top))
	ok := func(context.Context, warren.Delivery) error { return nil }
	ctx := context.Background()
	for _, opt := range []warren.ServeOption{warren.Selector(func(*warren.Message) bool { return true }), warren.AckTimeout(time.Minute),
		warren.Backoff(time.Second, time.Minute)} {
		require.ErrorIs(t, c.Serve(ctx, top.Queues[0].Name, ok, opt), warren.ErrUnsupported)
	}
	require.ErrorIs(t, c.Serve(ctx, top.Queues[0].Name, ok, warren.Workers(0)), warren.ErrInvalidArgument)
	require.ErrorIs(t, c.Serve(ctx, "no-such-queue-"+top.Queues[0].Name, ok), warren.ErrNotFound)
}

// Serve goes on through cut connections: what its handlers held comes back redelivered, and
// every message is handled at least once.
func TestServeSurvivesCutConnections(t *testing.T) {
	conn := dial(t)
	// No delivery limit here: every cut returns what the consumer holds, which counts.
	top := unique(t, conn, warren.Topology{Queues: []warren.QueueDecl{{Name: "work", Durable: true}}})
	jobs := top.Queues[0].Name
	p, c := proxied(t, WithQueueType(Quorum))
	require.NoError(t, c.DeclareTopology(top))
	const n = 600
	ctx, cancel := context.WithCancel(context.Background())
	for i := range n {
		require.NoError(t, c.Publish(ctx, "", jobs, warren.Message{Body: fmt.Appendf(nil, "%d", i), Persistent: true}))
	}
	var (
		mu        sync.Mutex
		handled   = map[string]int{}
		redeliver int
		cuts      int
		all       = make(chan struct{})
	)
	h := func(_ context.Context, d warren.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		handled[string(d.Message.Body)]++
		if d.Redelivered {
			redeliver++
		}
		if cuts < 2 && len(handled) >= (cuts+1)*n/3 {
			cuts++
			go p.cut()
		}
		if len(handled) == n {
			select {
			case <-all:
			default:
				close(all)
			}
		}
		return nil
	}
	served := make(chan error, 1)
	go func() { served <- c.Serve(ctx, jobs, h, warren.Workers(4), warren.Prefetch(32)) }()
	select {
	case <-all:
	case err := <-served:
		t.Fatalf("Serve returned before ctx ended: %v", err)
	case <-time.After(30 * time.Second):
		mu.Lock()
		t.Fatalf("handled %d of %d", len(handled), n)
	}
	cancel()
	require.NoError(t, <-served)
	mu.Lock()
	defer mu.Unlock()
	require.Positive(t, redeliver, "the cuts returned what was unacked: the test cut something")
	t.Logf("%d messages handled through 2 cut connections; %d deliveries were redeliveries", n, redeliver)
}

package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of Client.Serve (serve.go) and its retries (retry.go), beyond the suite of
// warren.Backend (backend_test.go).

// jobsTopology is a work queue with a delivery limit that dead-letters into a queue of dead
// jobs.
func jobsTopology() warren.Topology {
	return warren.Topology{Queues: []warren.QueueDecl{
		{Name: "jobs", Durable: true, Arguments: warren.Table{"x-delivery-limit": int64(3),
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}},
		{Name: "dead", Durable: true},
	}}
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
		warren.Backoff(time.Second, 50*24*time.Hour)} {
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

// A retry waits in a retry queue the client declared ("<queue>.retry.<ms>", a quorum queue for
// a quorum client, its TTL the delay) and comes back with RabbitMQ's x-death entry of it.
func TestServeRetryQueues(t *testing.T) {
	conn := dial(t)
	top := unique(t, conn, warren.Topology{Queues: []warren.QueueDecl{{Name: "work", Durable: true}}})
	q := top.Queues[0].Name
	c, err := Dial(rabbitURL(t), WithQueueType(Quorum), WithLogger(quiet))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.DeclareTopology(top))
	retryQ := q + ".retry.150"
	t.Cleanup(func() { channel(t, conn).QueueDelete(retryQ, false, false, false) })

	require.NoError(t, c.Publish(context.Background(), "", q, warren.Message{Body: []byte("m")}))
	attempts := make(chan warren.Delivery, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() {
		served <- c.Serve(ctx, q, func(_ context.Context, d warren.Delivery) error {
			attempts <- d
			if d.DeliveryCount == 0 {
				return errors.New("later")
			}
			return nil
		}, warren.Backoff(150*time.Millisecond, time.Second))
	}()
	<-attempts
	second := <-attempts
	cancel()
	require.NoError(t, <-served)
	require.Equal(t, 1, second.DeliveryCount)
	deaths, _ := second.Message.Headers["x-death"].([]any)
	require.Len(t, deaths, 1)
	death := deaths[0].(warren.Table)
	require.Equal(t, []any{retryQ, "expired"}, []any{death["queue"], death["reason"]})
	require.NotContains(t, second.Message.Headers, retriesHeader, "the client's own header is not shown")

	ch := channel(t, conn)
	_, err = ch.QueueDeclare(retryQ, true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-message-ttl": int64(150),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": q, "x-overflow": "reject-publish",
		"x-dead-letter-strategy": "at-least-once", "x-delivery-limit": int64(noDeliveryLimit)})
	require.NoError(t, err, "declared as the client says")
}

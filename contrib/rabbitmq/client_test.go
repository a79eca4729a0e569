package rabbitmq

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warrenmq/warren"
)

// Tests of Client (client.go) against a real RabbitMQ.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clientTopology is an exchange with a queue, a queue that refuses a second message, and a
// durable queue.
func clientTopology() warren.Topology {
	return warren.Topology{
		Exchanges: []warren.ExchangeDecl{{Name: "x", Kind: warren.ExchangeDirect}},
		Queues: []warren.QueueDecl{{Name: "q"}, {Name: "full", Arguments: warren.Table{"x-max-length": int64(1), "x-overflow": "reject-publish"}},
			{Name: "jobs", Durable: true}},
		Bindings: []warren.BindingDecl{{Source: "x", Destination: "q", RoutingKey: "k"}, {Source: "x", Destination: "full", RoutingKey: "full"}},
	}
}

// getAll takes every message from queue on ch.
func getAll(t *testing.T, ch *amqp.Channel, queue string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

func TestClientPublish(t *testing.T) {
	conn := dial(t)
	top := unique(t, conn, clientTopology())
	x, q, full := top.Exchanges[0].Name, top.Queues[0].Name, top.Queues[1].Name
	c, err := Dial(rabbitURL(t))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.DeclareTopology(top))
	ctx := context.Background()

	at := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	require.NoError(t, c.Publish(ctx, x, "k", warren.Message{Body: []byte("hello"), Headers: warren.Table{"n": int64(7), "nested": warren.Table{"d": warren.Decimal{Scale: 1, Value: 15}}},
		ContentType: "text/plain", Persistent: true, Priority: 3, CorrelationID: "c1", ReplyTo: "r", MessageID: "m1", Timestamp: at,
		Type: "greeting", AppID: "app"}, warren.ExpireAfter(time.Hour)))
	require.NoError(t, c.Publish(ctx, "", q, warren.Message{Body: []byte("direct")}), "the default exchange")
	ch := channel(t, conn)
	got := getAll(t, ch, q)
	require.Len(t, got, 2)
	d := got[0]
	require.Equal(t, "hello", string(d.Body))
	require.Equal(t, amqp.Table{"n": int64(7), "nested": amqp.Table{"d": amqp.Decimal{Scale: 1, Value: 15}}}, d.Headers, "no correlation header on a publish that is not mandatory")
	require.Equal(t, []any{"text/plain", amqp.Persistent, uint8(3), "c1", "r", "m1", "greeting", "app", "3600000"},
		[]any{d.ContentType, d.DeliveryMode, d.Priority, d.CorrelationId, d.ReplyTo, d.MessageId, d.Type, d.AppId, d.Expiration})
	require.True(t, at.Equal(d.Timestamp))
	require.Equal(t, "direct", string(got[1].Body))

	// Mandatory: a return is ErrUnroutable; without it, an unroutable publish is confirmed.
	require.ErrorIs(t, c.Publish(ctx, x, "nobody", warren.Message{Body: []byte("lost")}, warren.Mandatory()), warren.ErrUnroutable)
	require.NoError(t, c.Publish(ctx, x, "nobody", warren.Message{Body: []byte("dropped")}))
	require.NoError(t, c.Publish(ctx, x, "k", warren.Message{Body: []byte("routed")}, warren.Mandatory()))
	got = getAll(t, ch, q)
	require.Len(t, got, 1)
	require.Equal(t, "routed", string(got[0].Body))

	// A queue's reject-publish nacks: ErrQueueFull.
	require.NoError(t, c.Publish(ctx, x, "full", warren.Message{Body: []byte("one")}))
	require.ErrorIs(t, c.Publish(ctx, x, "full", warren.Message{Body: []byte("two")}), warren.ErrQueueFull)
	require.Len(t, getAll(t, ch, full), 1)

	// A missing exchange: ErrNotFound, and the client goes on.
	require.ErrorIs(t, c.Publish(ctx, "no-such-exchange-"+x, "k", warren.Message{Body: []byte("nowhere")}), warren.ErrNotFound)
	require.NoError(t, c.Publish(ctx, x, "k", warren.Message{Body: []byte("after")}))
	require.Len(t, getAll(t, ch, q), 1)

	// What RabbitMQ has no counterpart for.
	require.ErrorIs(t, c.Publish(ctx, x, "k", warren.Message{}, warren.Immediate()), warren.ErrUnsupported)
	require.ErrorIs(t, c.Publish(ctx, x, "k", warren.Message{}, warren.DeliverAfter(time.Second)), warren.ErrUnsupported)
	require.ErrorIs(t, c.Publish(ctx, x, "k", warren.Message{}, warren.ExpireAfter(time.Nanosecond)), warren.ErrInvalidArgument)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, c.Publish(cancelled, x, "k", warren.Message{}), context.Canceled)

	require.NoError(t, c.Close())
	require.ErrorIs(t, c.Publish(ctx, x, "k", warren.Message{}), warren.ErrClosed)
	require.ErrorIs(t, c.DeclareTopology(top), warren.ErrClosed)
	require.NoError(t, c.Close(), "twice")
}

// Publishers under load while the connection is cut, three times: every publish returns nil
// once confirmed, on a later connection if need be, and every confirmed message is in the
// queue, at least once.
func TestClientSurvivesCutConnections(t *testing.T) {
	conn := dial(t)
	top := unique(t, conn, clientTopology())
	jobs := top.Queues[2].Name
	p, c := proxied(t, ReconnectBackoff(10*time.Millisecond, 100*time.Millisecond), MaxInFlight(64))
	require.NoError(t, c.DeclareTopology(top))

	const publishers, each = 8, 250
	var confirmed atomic.Int64
	cuts := make(chan struct{})
	go func() {
		defer close(cuts)
		for _, at := range []int64{publishers * each / 4, publishers * each / 2, 3 * publishers * each / 4} {
			for confirmed.Load() < at {
				time.Sleep(time.Millisecond)
			}
			p.cut()
		}
	}()
	var wg sync.WaitGroup
	ctx := context.Background()
	for i := range publishers {
		wg.Go(func() {
			for j := range each {
				body := fmt.Sprintf("%d-%d", i, j)
				if err := c.Publish(ctx, "", jobs, warren.Message{Body: []byte(body), Persistent: true}); err != nil {
					t.Errorf("publish %s: %v", body, err)
					return
				}
				confirmed.Add(1)
			}
		})
	}
	wg.Wait()
	<-cuts

	seen := map[string]int{}
	for _, d := range getAll(t, channel(t, conn), jobs) {
		seen[string(d.Body)]++
	}
	duplicates := 0
	for i := range publishers {
		for j := range each {
			n := seen[fmt.Sprintf("%d-%d", i, j)]
			require.GreaterOrEqual(t, n, 1, "message %d-%d was confirmed and is not in the queue", i, j)
			duplicates += n - 1
		}
	}
	require.Len(t, seen, publishers*each, "nothing else")
	t.Logf("%d messages confirmed through 3 cut connections; %d delivered twice (sent again after a cut)", publishers*each, duplicates)
}

// PublishDeferred streams: confirmations kept in a window resolve through cut connections,
// every confirmed message in the queue; a return or a nack comes with the confirmation, and a
// client closed before the confirm makes it ErrClosed.
func TestClientPublishDeferred(t *testing.T) {
	conn := dial(t)
	top := unique(t, conn, clientTopology())
	x, full, jobs := top.Exchanges[0].Name, top.Queues[1].Name, top.Queues[2].Name
	p, c := proxied(t, MaxInFlight(128))
	require.NoError(t, c.DeclareTopology(top))
	ctx := context.Background()
	require.NoError(t, Confirmation{}.Wait(), "the zero value is complete")

	const n = 3000
	var window []Confirmation
	for i := range n {
		if i == n/3 || i == 2*n/3 {
			p.cut()
		}
		f, err := c.PublishDeferred(ctx, "", jobs, warren.Message{Body: fmt.Appendf(nil, "%d", i), Persistent: true})
		require.NoError(t, err)
		window = append(window, f)
		if len(window) == 512 {
			require.NoError(t, window[0].Wait())
			window = window[1:]
		}
	}
	for _, f := range window {
		require.NoError(t, f.Wait())
		require.NoError(t, f.Wait(), "again")
	}
	seen := map[string]bool{}
	for _, d := range getAll(t, channel(t, conn), jobs) {
		seen[string(d.Body)] = true
	}
	require.Len(t, seen, n, "every confirmed message, at least once")

	unroutable, err := c.PublishDeferred(ctx, x, "nobody", warren.Message{Body: []byte("lost")}, warren.Mandatory())
	require.NoError(t, err)
	require.NoError(t, c.Publish(ctx, "", full, warren.Message{Body: []byte("one")}))
	refused, err := c.PublishDeferred(ctx, "", full, warren.Message{Body: []byte("two")})
	require.NoError(t, err)
	require.ErrorIs(t, unroutable.Wait(), warren.ErrUnroutable)
	require.ErrorIs(t, refused.Wait(), warren.ErrQueueFull)
	_, err = c.PublishDeferred(ctx, "no-such-exchange-"+x, "k", warren.Message{})
	require.ErrorIs(t, err, warren.ErrNotFound, "returned at once")

	p.pause(fromServer, true) // the confirm waits in the proxy
	pending, err := c.PublishDeferred(ctx, "", jobs, warren.Message{Body: []byte("late")})
	require.NoError(t, err)
	c.Close() // RabbitMQ's close-ok waits in the proxy too: an error is fine, returning is not
	require.ErrorIs(t, pending.Wait(), warren.ErrClosed)
	p.pause(fromServer, false)
}

// Thousands of first publishes at once to an exchange the client did not declare share one
// question about it (a channel each would exhaust the connection's 2047).
func TestClientSharesExchangeChecks(t *testing.T) {
	conn := dial(t)
	top := unique(t, conn, clientTopology())
	x, q := top.Exchanges[0].Name, top.Queues[0].Name
	require.NoError(t, DeclareTopology(channel(t, conn), top, Classic))
	c, err := Dial(rabbitURL(t), MaxInFlight(4096))
	require.NoError(t, err)
	defer c.Close()

	const n = 3000
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() { errs <- c.Publish(context.Background(), x, "k", warren.Message{Body: []byte("m")}) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, n, messageCount(t, conn, q))
}

// After a reconnect the client declares its topologies again: a queue deleted while it was
// disconnected is back.
func TestClientDeclaresAgain(t *testing.T) {
	conn := dial(t)
	top := unique(t, conn, clientTopology())
	q := top.Queues[0].Name
	p, c := proxied(t, WithLogger(testLogger(t))) // its reconnections explain a failure
	defer c.Close()
	require.NoError(t, c.DeclareTopology(top))

	p.setDown(true)
	p.cut()
	ch := channel(t, conn)
	_, err := ch.QueueDelete(q, false, false, false)
	require.NoError(t, err)
	p.setDown(false)
	declared := func() error {
		probe, err := conn.Channel()
		if err != nil {
			return err
		}
		defer probe.Close()
		_, err = probe.QueueDeclarePassive(q, false, false, false, false, nil)
		return err
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) { require.NoError(c, declared()) },
		10*time.Second, 10*time.Millisecond, "declared again")
	require.NoError(t, c.Publish(context.Background(), top.Exchanges[0].Name, "k", warren.Message{Body: []byte("again")}))
	require.Len(t, getAll(t, ch, q), 1, "with its binding")
}

func TestDialRefuses(t *testing.T) {
	for _, o := range []Option{WithQueueType("stream"), MaxInFlight(0), ReconnectBackoff(0, time.Second), ReconnectBackoff(time.Second, time.Millisecond)} {
		_, err := Dial("amqp://127.0.0.1:1/", o)
		require.ErrorIs(t, err, warren.ErrInvalidArgument)
	}
	_, err := Dial("amqp://127.0.0.1:1/")
	require.Error(t, err, "nothing listens there")
}

// An exchange deleted after the client knew it, one the client did not declare (it would
// declare its own again): RabbitMQ closes the publishing channel (404) at the publish; the
// client starts over on a new connection, fails that publish with ErrNotFound, and goes on.
// An exchange of its own topology comes back with the reconnection.
func TestClientExchangeDeletedUnderIt(t *testing.T) {
	conn := dial(t)
	all := clientTopology()
	all.Exchanges = append(all.Exchanges, warren.ExchangeDecl{Name: "other", Kind: warren.ExchangeFanout})
	all.Bindings = append(all.Bindings, warren.BindingDecl{Source: "other", Destination: "q"})
	all = unique(t, conn, all)
	top := warren.Topology{Exchanges: all.Exchanges[:1], Queues: all.Queues, Bindings: all.Bindings[:2]}
	other := warren.Topology{Exchanges: all.Exchanges[1:], Bindings: all.Bindings[2:]}
	x, q, o := top.Exchanges[0].Name, top.Queues[0].Name, other.Exchanges[0].Name
	c, err := Dial(rabbitURL(t), ReconnectBackoff(10*time.Millisecond, 50*time.Millisecond), WithLogger(quiet))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.DeclareTopology(top))
	ch := channel(t, conn)
	require.NoError(t, DeclareTopology(ch, other, Classic))
	ctx := context.Background()
	require.NoError(t, c.Publish(ctx, o, "", warren.Message{Body: []byte("before")}))

	require.NoError(t, ch.ExchangeDelete(o, false, false))
	require.ErrorIs(t, c.Publish(ctx, o, "", warren.Message{Body: []byte("nowhere")}), warren.ErrNotFound)
	require.NoError(t, c.Publish(ctx, "", q, warren.Message{Body: []byte("after")}), "the client goes on")

	require.NoError(t, ch.ExchangeDelete(x, false, false))
	require.NoError(t, c.Publish(ctx, x, "k", warren.Message{Body: []byte("declared again")}),
		"its own exchange: the reconnection the publish caused declared it again, with its binding")
	var bodies []string
	for _, d := range getAll(t, ch, q) {
		bodies = append(bodies, string(d.Body))
	}
	require.Equal(t, []string{"before", "after", "declared again"}, bodies)
}

// While one publish's write stalls (TCP backpressure: RabbitMQ's flow control or a resource
// alarm stop it reading), the confirms of earlier publishes still reach their callers. Were the
// client's lock held across the write, the confirm listener would wait for it, and amqp091-go's
// reader, which gives up handing a confirm over after 5 s, would drop one: its Publish would
// never return.
func TestClientConfirmsWhileAWriteStalls(t *testing.T) {
	conn := dial(t)
	top := unique(t, conn, clientTopology())
	q := top.Queues[0].Name
	p, c := proxied(t)
	require.NoError(t, c.DeclareTopology(top))
	ctx := context.Background()

	p.pause(fromServer, true) // the confirms of m1 and m2 wait in the proxy
	results := make(chan error, 2)
	for _, b := range []string{"m1", "m2"} {
		go func() { results <- c.Publish(ctx, "", q, warren.Message{Body: []byte(b)}) }()
	}
	require.Eventually(t, func() bool { return messageCount(t, conn, q) == 2 }, 5*time.Second, 10*time.Millisecond)

	p.pause(fromClient, true) // the next write stalls once the socket buffers are full
	big := make(chan error, 1)
	go func() { big <- c.Publish(ctx, "", q, warren.Message{Body: make([]byte, 24<<20)}) }()
	time.Sleep(500 * time.Millisecond)
	p.pause(fromServer, false) // the confirms of m1 and m2 reach the client
	time.Sleep(6 * time.Second)
	p.pause(fromClient, false)

	select {
	case err := <-big:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the big publish did not return")
	}
	for range 2 {
		select {
		case err := <-results:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("a publish RabbitMQ confirmed never returns: its confirm was dropped while the listener waited for c.mu")
		}
	}
}

// While one publish's write stalls, another Publish, waiting its turn to write, returns when its
// ctx ends, and Close returns within its deadline.
func TestClientWhileAWriteStalls(t *testing.T) {
	conn := dial(t)
	top := unique(t, conn, clientTopology())
	q := top.Queues[0].Name
	p, c := proxied(t)
	require.NoError(t, c.DeclareTopology(top))

	big := stallAWrite(t, p, c, q)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	err := c.Publish(ctx, "", q, warren.Message{Body: []byte("small")})
	took := time.Since(start)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, took, 3*time.Second, "Publish returns when its ctx ends, not when the write does (took %v)", took)

	start = time.Now()
	c.Close() // an error is fine here; returning is not
	took = time.Since(start)
	<-big
	require.Less(t, took, 3*time.Second, "Close does not wait for a stalled write (took %v)", took)
}

// stallAWrite publishes a 24 MiB message through p while p holds back what the client sends,
// so that the write stalls once the socket buffers are full; p lets it through after 8 s. It
// returns the publish's result.
func stallAWrite(t *testing.T, p *proxy, c *Client, q string) <-chan error {
	t.Helper()
	p.pause(fromClient, true)
	release := time.AfterFunc(8*time.Second, func() { p.pause(fromClient, false) })
	t.Cleanup(func() { release.Stop() })
	big := make(chan error, 1)
	go func() { big <- c.Publish(context.Background(), "", q, warren.Message{Body: make([]byte, 24<<20)}) }()
	time.Sleep(500 * time.Millisecond)
	return big
}

// A connection lost in the middle of DeclareTopology (amqp091-go reports a FrameError, 501, not
// ErrClosed) does not fail it: it declares on the next connection.
func TestClientDeclareTopologyThroughALostConnection(t *testing.T) {
	conn := dial(t)
	top := unique(t, conn, clientTopology())
	p, c := proxied(t)

	p.pause(fromServer, true) // RabbitMQ's replies wait: the declaration is under way
	done := make(chan error, 1)
	go func() { done <- c.DeclareTopology(top) }()
	time.Sleep(300 * time.Millisecond)
	p.cut()
	p.pause(fromServer, false)
	select {
	case err := <-done:
		require.NoError(t, err, "declared on the next connection")
	case <-time.After(10 * time.Second):
		t.Fatal("DeclareTopology did not return")
	}
}

// A mandatory publish returned on a connection that is lost before its confirm is sent again on
// the next one, where it is routed (a binding was added meanwhile): the first connection's
// basic.return does not count, and Publish returns nil for a message that is in the queue.
func TestClientReturnOnALostConnectionDoesNotCount(t *testing.T) {
	conn := dial(t)
	top := unique(t, conn, clientTopology())
	x, q := top.Exchanges[0].Name, top.Queues[0].Name
	p, c := proxied(t)
	require.NoError(t, c.DeclareTopology(top))

	p.setDropAcks(true)
	res := make(chan error, 1)
	go func() {
		res <- c.Publish(context.Background(), x, "later", warren.Message{Body: []byte("m")}, warren.Mandatory())
	}()
	time.Sleep(500 * time.Millisecond) // its basic.return reached the client; its ack was dropped
	require.NoError(t, channel(t, conn).QueueBind(q, "later", x, false, nil))
	p.setDropAcks(false)
	p.cut()
	select {
	case err := <-res:
		require.Equal(t, 1, messageCount(t, conn, q), "the message was routed on the next connection")
		require.NoError(t, err, "routed and confirmed on the next connection")
	case <-time.After(10 * time.Second):
		t.Fatal("Publish did not return")
	}
}

// Confirms out of order (a quorum queue's come later than a classic queue's) are all handed
// over. amqp091-go's reader hands a confirm to the listener while it holds the lock that
// GetNextPublishSeqNo takes (resequencing); a publisher that held the client's lock while
// calling it, with the listener waiting for the client's lock, would stall both until the
// reader's 5 s timeout dropped the confirm.
func TestClientOutOfOrderConfirms(t *testing.T) {
	conn := dial(t)
	top := unique(t, conn, warren.Topology{Queues: []warren.QueueDecl{{Name: "qq", Durable: true}, {Name: "cq"}}})
	qq, cq := top.Queues[0].Name, top.Queues[1].Name
	c, err := Dial(rabbitURL(t), WithQueueType(Quorum), MaxInFlight(1024), WithLogger(quiet))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.DeclareTopology(top))

	const publishers, each = 32, 300
	var slow atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for i := range publishers {
		wg.Go(func() {
			for j := range each {
				ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
				q, persistent := cq, false
				if (i+j)%2 == 0 {
					q, persistent = qq, true
				}
				start := time.Now()
				err := c.Publish(ctx, "", q, warren.Message{Body: []byte("x"), Persistent: persistent})
				cancel()
				if time.Since(start) > 4*time.Second {
					slow.Add(1)
				}
				if err != nil {
					errs <- fmt.Errorf("publish %d-%d: %w", i, j, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.Zero(t, slow.Load(), "publishes that took more than 4 s")
}

// A reconnection whose connection is lost in its handshake (a node going down as the client
// connects) is one more failed attempt: the client goes on reconnecting, and a publish waiting
// for it goes through.
func TestClientReconnectsThroughLostHandshakes(t *testing.T) {
	conn := dial(t)
	top := unique(t, conn, clientTopology())
	p, c := proxied(t, WithLogger(testLogger(t)))
	defer c.Close()
	require.NoError(t, c.DeclareTopology(top))

	for _, frames := range []int{1, 2, 3, 4} { // lost in the handshake, before a channel, before confirms
		p.cutEarly(3, frames)
		p.cut()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		require.NoError(t, c.Publish(ctx, top.Exchanges[0].Name, "k", warren.Message{Body: []byte("after")}), "cut after %d frames", frames)
		cancel()
	}
	require.Len(t, getAll(t, channel(t, conn), top.Queues[0].Name), 4)
}

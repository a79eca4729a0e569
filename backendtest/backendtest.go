// Package backendtest is the behaviour suite of [warren.Backend]: what application code written
// against the interface may rely on, whichever broker is behind it. warren's own tests run it
// on a [warren.Broker]; contrib/rabbitmq's run it on a RabbitMQ through its Client, so that the
// two backends are held to the same behaviour, scenario by scenario. Another backend can run it
// too.
//
// Every scenario gets a backend of its own from the function given to [Run], declares what it
// needs under names unique to the run (a RabbitMQ outlives its tests), and closes the backend
// when it ends. Queues are durable and not auto-delete, so that a RabbitMQ client declaring
// quorum queues makes quorum queues of them (priority queues stay classic).
package backendtest

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

// Run runs every scenario of the suite as a subtest of t, each on a backend from open.
func Run(t *testing.T, open func(t *testing.T) warren.Backend) {
	for _, sc := range Scenarios() {
		t.Run(sc.Name, func(t *testing.T) { sc.Run(t, open(t)) })
	}
}

// Scenario is one behaviour of the suite.
type Scenario struct {
	Name string
	// Run checks the behaviour on b, which it closes before it returns (after everything it
	// started has stopped).
	Run func(t *testing.T, b warren.Backend)
}

// Scenarios returns the suite's scenarios, in the order Run runs them, for a test that runs them
// its own way (in a synctest bubble, for one).
func Scenarios() []Scenario {
	out := make([]Scenario, len(scenarios))
	for i, sc := range scenarios {
		out[i] = Scenario{Name: sc.name, Run: func(t *testing.T, b warren.Backend) {
			e := &env{t: t, b: b, prefix: fmt.Sprintf("backendtest.%d.%s.", time.Now().UnixNano(), sc.name)}
			defer func() {
				e.stop()
				b.Close()
			}()
			sc.run(e)
		}}
	}
	return out
}

// wait is how long a scenario waits for something that is to happen.
const wait = 15 * time.Second

// env is one scenario's backend and what it started.
type env struct {
	t      *testing.T
	b      warren.Backend
	prefix string
	mu     sync.Mutex
	stops  []func()
}

// name returns s made unique to this run.
func (e *env) name(s string) string { return e.prefix + s }

// declare declares top, failing the scenario if the backend refuses.
func (e *env) declare(top warren.Topology) {
	e.t.Helper()
	require.NoError(e.t, e.b.DeclareTopology(top))
}

// queue declares a durable queue with args and returns its name.
func (e *env) queue(name string, args warren.Table) string {
	e.t.Helper()
	q := e.name(name)
	e.declare(warren.Topology{Queues: []warren.QueueDecl{{Name: q, Durable: true, Arguments: args}}})
	return q
}

// publish publishes msg, failing the scenario unless it is confirmed.
func (e *env) publish(exchange, key string, msg warren.Message, opts ...warren.PublishOption) {
	e.t.Helper()
	require.NoError(e.t, e.b.Publish(context.Background(), exchange, key, msg, opts...))
}

// serve runs h on queue until the scenario ends or the returned stop is called; stop returns
// Serve's result.
func (e *env) serve(queue string, h warren.Handler, opts ...warren.ServeOption) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() { res <- e.b.Serve(ctx, queue, h, opts...) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-res:
			case <-time.After(wait):
				err = errors.New("backendtest: Serve did not return after its ctx ended")
			}
		})
		return err
	}
	e.mu.Lock()
	e.stops = append(e.stops, func() { stop() })
	e.mu.Unlock()
	return stop
}

// stop stops every Serve the scenario started.
func (e *env) stop() {
	e.mu.Lock()
	stops := e.stops
	e.stops = nil
	e.mu.Unlock()
	for _, s := range stops {
		s()
	}
}

// received is what a handler saw of a delivery, and when.
type received struct {
	warren.Delivery
	at time.Time
}

// collect serves queue with a handler that acks every delivery and hands it over.
func (e *env) collect(queue string, opts ...warren.ServeOption) <-chan received {
	out := make(chan received, 1024)
	e.serve(queue, func(_ context.Context, d warren.Delivery) error {
		out <- received{d, time.Now()}
		return nil
	}, opts...)
	return out
}

// next returns the next of ch, failing the scenario if none comes.
func (e *env) next(ch <-chan received, what string) received {
	e.t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(wait):
		e.t.Fatalf("no delivery: %s", what)
		return received{}
	}
}

// none checks that nothing comes on ch for a while.
func (e *env) none(ch <-chan received, what string) {
	e.t.Helper()
	select {
	case r := <-ch:
		e.t.Fatalf("%s: got %q", what, r.Message.Body)
	case <-time.After(300 * time.Millisecond):
	}
}

// bodies returns the bodies of the next n of ch, in order.
func (e *env) bodies(ch <-chan received, n int) []string {
	e.t.Helper()
	var out []string
	for range n {
		out = append(out, string(e.next(ch, fmt.Sprintf("%d of %d", len(out)+1, n)).Message.Body))
	}
	return out
}

// death returns the newest x-death entry of m: its reason, queue and count.
func death(t *testing.T, m warren.Message) (reason, queue string, count int64) {
	t.Helper()
	deaths, ok := m.Headers["x-death"].([]any)
	require.True(t, ok && len(deaths) > 0, "an x-death header: %v", m.Headers)
	entry, ok := deaths[0].(warren.Table)
	require.True(t, ok, "x-death entries are tables: %T", deaths[0])
	reason, _ = entry["reason"].(string)
	queue, _ = entry["queue"].(string)
	count, _ = entry["count"].(int64)
	return reason, queue, count
}

// deadLettering returns queue arguments that dead-letter into a new queue, whose name it
// returns too, with the routing key dead.
func (e *env) deadLettering(args warren.Table) (warren.Table, string) {
	dead := e.queue("dead", nil)
	if args == nil {
		args = warren.Table{}
	}
	args["x-dead-letter-exchange"] = ""
	args["x-dead-letter-routing-key"] = dead
	return args, dead
}

type scenario struct {
	name string
	run  func(e *env)
}

var scenarios = []scenario{
	{"PublishAndServe", publishAndServe},
	{"Order", order},
	{"Routing", routing},
	{"MandatoryUnroutable", mandatoryUnroutable},
	{"AlternateExchange", alternateExchange},
	{"MissingExchange", missingExchange},
	{"RejectPublish", rejectPublish},
	{"DropHead", dropHead},
	{"HandlerError", handlerError},
	{"HandlerPanic", handlerPanic},
	{"Permanent", permanent},
	{"DeliveryLimit", deliveryLimit},
	{"Backoff", backoff},
	{"BackoffAndDeliveryLimit", backoffAndDeliveryLimit},
	{"MessageTTL", messageTTL},
	{"ExpireAfter", expireAfter},
	{"Priority", priority},
	{"Workers", workers},
	{"ConsumerTag", consumerTag},
	{"ServeEnds", serveEnds},
	{"GracePeriod", gracePeriod},
	{"ServeMissingQueue", serveMissingQueue},
	{"DeclareAgain", declareAgain},
	{"Closed", closed},
}

// A message arrives as it was published, with its properties and headers.
func publishAndServe(e *env) {
	q := e.queue("q", nil)
	ts := time.Date(2026, 12, 2, 10, 30, 0, 0, time.UTC)
	msg := warren.Message{Body: []byte("hello"), ContentType: "text/plain", ContentEncoding: "identity", Persistent: true,
		Priority: 3, CorrelationID: "c-1", ReplyTo: "replies", MessageID: "m-1", Timestamp: ts, Type: "greeting", AppID: "suite",
		Headers: warren.Table{"s": "v", "n": int64(7), "b": true, "t": warren.Table{"inner": "x"}, "a": []any{"x", int64(1)}}}
	e.publish("", q, msg)
	r := e.next(e.collect(q), "the message")
	got := r.Message
	got.Timestamp = got.Timestamp.UTC()
	require.Equal(e.t, msg, got)
	require.Equal(e.t, "", r.Exchange)
	require.Equal(e.t, q, r.RoutingKey)
	require.False(e.t, r.Redelivered)
	require.Zero(e.t, r.DeliveryCount)
}

// One consumer with one worker gets a queue's messages in publish order.
func order(e *env) {
	q := e.queue("q", nil)
	var want []string
	for i := range 50 {
		want = append(want, fmt.Sprint(i))
		e.publish("", q, warren.Message{Body: []byte(want[i])})
	}
	require.Equal(e.t, want, e.bodies(e.collect(q, warren.Workers(1), warren.Prefetch(1)), 50))
}

// Direct, fanout, topic and headers exchanges route as AMQP says.
func routing(e *env) {
	x := func(n string) string { return e.name(n) }
	top := warren.Topology{
		Exchanges: []warren.ExchangeDecl{
			{Name: x("direct"), Kind: warren.ExchangeDirect, Durable: true},
			{Name: x("fanout"), Kind: warren.ExchangeFanout, Durable: true},
			{Name: x("topic"), Kind: warren.ExchangeTopic, Durable: true},
			{Name: x("headers"), Kind: warren.ExchangeHeaders, Durable: true},
		},
		Bindings: []warren.BindingDecl{
			{Source: x("direct"), Destination: x("a"), RoutingKey: "k1"},
			{Source: x("direct"), Destination: x("b"), RoutingKey: "k2"},
			{Source: x("fanout"), Destination: x("a")},
			{Source: x("fanout"), Destination: x("b")},
			{Source: x("topic"), Destination: x("a"), RoutingKey: "orders.*.eu"},
			{Source: x("topic"), Destination: x("b"), RoutingKey: "orders.#"},
			{Source: x("headers"), Destination: x("a"), Arguments: warren.Table{"x-match": "all", "kind": "invoice", "region": "eu"}},
			{Source: x("headers"), Destination: x("b"), Arguments: warren.Table{"x-match": "any", "kind": "invoice", "region": "eu"}},
		},
	}
	for _, q := range []string{"a", "b"} {
		top.Queues = append(top.Queues, warren.QueueDecl{Name: x(q), Durable: true})
	}
	e.declare(top)
	probes := []struct {
		exchange, key string
		headers       warren.Table
	}{
		{"direct", "k1", nil}, {"direct", "k2", nil}, {"direct", "k3", nil},
		{"fanout", "whatever", nil},
		{"topic", "orders.new.eu", nil}, {"topic", "orders.new.us", nil}, {"topic", "orders", nil}, {"topic", "order.new.eu", nil},
		{"headers", "", warren.Table{"kind": "invoice", "region": "eu"}}, {"headers", "", warren.Table{"kind": "invoice"}},
		{"headers", "", warren.Table{"kind": "receipt"}},
	}
	for i, p := range probes {
		e.publish(x(p.exchange), p.key, warren.Message{Body: fmt.Append(nil, i), Headers: p.headers})
	}
	// a: k1, fanout, orders.new.eu, headers all; b: k2, fanout, orders.new.eu, orders.new.us,
	// orders, headers any (twice).
	require.Equal(e.t, []string{"0", "3", "4", "8"}, e.bodies(e.collect(x("a")), 4))
	require.Equal(e.t, []string{"1", "3", "4", "5", "6", "8", "9"}, e.bodies(e.collect(x("b")), 7))
}

// A mandatory publish that reaches no queue fails with ErrUnroutable; without Mandatory it is
// confirmed and dropped.
func mandatoryUnroutable(e *env) {
	x := e.name("x")
	e.declare(warren.Topology{Exchanges: []warren.ExchangeDecl{{Name: x, Kind: warren.ExchangeDirect, Durable: true}}})
	err := e.b.Publish(context.Background(), x, "nowhere", warren.Message{Body: []byte("m")}, warren.Mandatory())
	require.ErrorIs(e.t, err, warren.ErrUnroutable)
	e.publish(x, "nowhere", warren.Message{Body: []byte("dropped")})
	q := e.queue("q", nil)
	e.publish("", q, warren.Message{Body: []byte("routed")}, warren.Mandatory())
	require.Equal(e.t, []string{"routed"}, e.bodies(e.collect(q), 1), "the backend goes on")
}

// What an exchange cannot route goes to its alternate exchange; a mandatory publish that
// reaches a queue that way is routed.
func alternateExchange(e *env) {
	x, ae, q := e.name("x"), e.name("ae"), e.name("unrouted")
	e.declare(warren.Topology{
		Exchanges: []warren.ExchangeDecl{
			{Name: ae, Kind: warren.ExchangeFanout, Durable: true},
			{Name: x, Kind: warren.ExchangeDirect, Durable: true, Arguments: warren.Table{"alternate-exchange": ae}},
		},
		Queues:   []warren.QueueDecl{{Name: q, Durable: true}},
		Bindings: []warren.BindingDecl{{Source: ae, Destination: q}},
	})
	e.publish(x, "nowhere", warren.Message{Body: []byte("m")}, warren.Mandatory())
	r := e.next(e.collect(q), "the unroutable message")
	require.Equal(e.t, "nowhere", r.RoutingKey)
	require.Equal(e.t, x, r.Exchange)
}

// A publish to an exchange that does not exist fails with ErrNotFound; the backend goes on.
func missingExchange(e *env) {
	err := e.b.Publish(context.Background(), e.name("missing"), "k", warren.Message{Body: []byte("m")})
	require.ErrorIs(e.t, err, warren.ErrNotFound)
	q := e.queue("q", nil)
	e.publish("", q, warren.Message{Body: []byte("after")})
	require.Equal(e.t, []string{"after"}, e.bodies(e.collect(q), 1))
}

// A full queue whose overflow is reject-publish refuses a publish with ErrQueueFull, and holds
// what it confirmed. (A RabbitMQ quorum queue checks its length before it takes a message, so
// it takes one over its limit: the third publish here may be confirmed.)
func rejectPublish(e *env) {
	q := e.queue("q", warren.Table{"x-max-length": int64(2), "x-overflow": string(warren.RejectPublish)})
	var confirmed []string
	for i := range 4 {
		b := fmt.Sprint(i)
		err := e.b.Publish(context.Background(), "", q, warren.Message{Body: []byte(b)})
		switch {
		case err == nil:
			confirmed = append(confirmed, b)
		case i < 2:
			e.t.Fatalf("publish %d of 2 to a queue of 2: %v", i+1, err)
		default:
			require.ErrorIs(e.t, err, warren.ErrQueueFull)
		}
	}
	require.Less(e.t, len(confirmed), 4, "the last publish was refused")
	require.Equal(e.t, confirmed, e.bodies(e.collect(q), len(confirmed)))
}

// A full queue whose overflow is drop-head dead-letters its oldest message (reason "maxlen").
func dropHead(e *env) {
	args, dead := e.deadLettering(warren.Table{"x-max-length": int64(2)})
	q := e.queue("q", args)
	for _, b := range []string{"1", "2", "3"} {
		e.publish("", q, warren.Message{Body: []byte(b)})
	}
	r := e.next(e.collect(dead), "the dropped head")
	require.Equal(e.t, "1", string(r.Message.Body))
	reason, from, _ := death(e.t, r.Message)
	require.Equal(e.t, "maxlen", reason)
	require.Equal(e.t, q, from)
	require.Equal(e.t, []string{"2", "3"}, e.bodies(e.collect(q), 2))
}

// A handler's error returns the message: it comes again, redelivered, counted.
func handlerError(e *env) {
	q := e.queue("q", nil)
	e.publish("", q, warren.Message{Body: []byte("m")})
	seen := make(chan received, 4)
	e.serve(q, func(_ context.Context, d warren.Delivery) error {
		seen <- received{d, time.Now()}
		if d.DeliveryCount == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	first, second := e.next(seen, "first"), e.next(seen, "second")
	require.False(e.t, first.Redelivered)
	require.True(e.t, second.Redelivered)
	require.Equal(e.t, 1, second.DeliveryCount)
	e.none(seen, "acked: not again")
}

// A handler's panic returns the message as an error does.
func handlerPanic(e *env) {
	q := e.queue("q", nil)
	e.publish("", q, warren.Message{Body: []byte("m")})
	seen := make(chan received, 4)
	e.serve(q, func(_ context.Context, d warren.Delivery) error {
		seen <- received{d, time.Now()}
		if !d.Redelivered {
			panic("handler bug")
		}
		return nil
	})
	e.next(seen, "first")
	require.True(e.t, e.next(seen, "after the panic").Redelivered)
	e.none(seen, "acked: not again")
}

// A Permanent error rejects the message: dead-lettered at once, reason "rejected".
func permanent(e *env) {
	args, dead := e.deadLettering(nil)
	q := e.queue("q", args)
	e.publish("", q, warren.Message{Body: []byte("bad")})
	attempts := make(chan received, 4)
	e.serve(q, func(_ context.Context, d warren.Delivery) error {
		attempts <- received{d, time.Now()}
		return warren.Permanent(errors.New("cannot be done"))
	})
	r := e.next(e.collect(dead), "the dead letter")
	reason, from, count := death(e.t, r.Message)
	require.Equal(e.t, []any{"rejected", q, int64(1)}, []any{reason, from, count})
	e.next(attempts, "the attempt")
	e.none(attempts, "one attempt only")
}

// A queue's delivery limit dead-letters a message that keeps failing after limit returns,
// reason "delivery_limit".
func deliveryLimit(e *env) {
	dead, q := poison(e)
	reason, from, _ := death(e.t, dead.Message)
	require.Equal(e.t, []any{"delivery_limit", q}, []any{reason, from})
}

// poison serves a message that always fails from a queue with a delivery limit of 2, with
// opts, and returns its dead letter and the queue's name, once three attempts, no more, have
// been made.
func poison(e *env, opts ...warren.ServeOption) (dead received, queue string) {
	args, deadQ := e.deadLettering(warren.Table{"x-delivery-limit": int64(2)})
	q := e.queue("q", args)
	e.publish("", q, warren.Message{Body: []byte("poison")})
	attempts := make(chan received, 8)
	e.serve(q, func(_ context.Context, d warren.Delivery) error {
		attempts <- received{d, time.Now()}
		return errors.New("never")
	}, opts...)
	dead = e.next(e.collect(deadQ), "the dead letter")
	require.Equal(e.t, "poison", string(dead.Message.Body))
	var counts []int
	for range 3 {
		counts = append(counts, e.next(attempts, "an attempt").DeliveryCount)
	}
	require.Equal(e.t, []int{0, 1, 2}, counts)
	e.none(attempts, "three attempts only")
	return dead, q
}

// Backoff brings a failed message back after a delay that doubles with each failure.
func backoff(e *env) {
	q := e.queue("q", nil)
	e.publish("", q, warren.Message{Body: []byte("m"), Headers: warren.Table{"kept": "yes"}})
	attempts := make(chan received, 8)
	e.serve(q, func(_ context.Context, d warren.Delivery) error {
		attempts <- received{d, time.Now()}
		if d.DeliveryCount < 3 {
			return errors.New("not yet")
		}
		return nil
	}, warren.Backoff(100*time.Millisecond, 250*time.Millisecond))
	var prev received
	for i, want := range []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 250 * time.Millisecond} {
		r := e.next(attempts, fmt.Sprintf("attempt %d", i+1))
		require.Equal(e.t, i, r.DeliveryCount)
		require.Equal(e.t, "yes", r.Message.Headers["kept"])
		if i > 0 {
			require.True(e.t, r.Redelivered)
			require.GreaterOrEqual(e.t, r.at.Sub(prev.at), want, "attempt %d came back after its delay", i+1)
		}
		prev = r
	}
	e.none(attempts, "acked: not again")
}

// With Backoff, the queue's delivery limit still ends a message that keeps failing. (On
// RabbitMQ the reason is "rejected": the client rejects it.)
func backoffAndDeliveryLimit(e *env) {
	dead, q := poison(e, warren.Backoff(20*time.Millisecond, 40*time.Millisecond))
	_, from, _ := death(e.t, dead.Message)
	require.Equal(e.t, q, from)
}

// A queue's message TTL dead-letters what nobody consumed in time, reason "expired".
func messageTTL(e *env) {
	args, dead := e.deadLettering(warren.Table{"x-message-ttl": int64(50)})
	q := e.queue("q", args)
	e.publish("", q, warren.Message{Body: []byte("stale")})
	r := e.next(e.collect(dead), "the expired message")
	reason, from, _ := death(e.t, r.Message)
	require.Equal(e.t, []any{"expired", q}, []any{reason, from})
}

// A message's own expiration (ExpireAfter) dead-letters it as the queue's TTL does.
func expireAfter(e *env) {
	args, dead := e.deadLettering(nil)
	q := e.queue("q", args)
	e.publish("", q, warren.Message{Body: []byte("stale")}, warren.ExpireAfter(50*time.Millisecond))
	r := e.next(e.collect(dead), "the expired message")
	reason, _, _ := death(e.t, r.Message)
	require.Equal(e.t, "expired", reason)
}

// A priority queue delivers its higher priorities first.
func priority(e *env) {
	q := e.queue("q", warren.Table{"x-max-priority": int64(5)})
	for i, p := range []uint8{1, 5, 3} {
		e.publish("", q, warren.Message{Body: fmt.Append(nil, i), Priority: p})
	}
	require.Equal(e.t, []string{"1", "2", "0"}, e.bodies(e.collect(q, warren.Workers(1), warren.Prefetch(1)), 3))
}

// Workers run that many handlers at once.
func workers(e *env) {
	q := e.queue("q", nil)
	for i := range 3 {
		e.publish("", q, warren.Message{Body: fmt.Append(nil, i)})
	}
	var mu sync.Mutex
	running, most := 0, 0
	all := make(chan struct{})
	done := make(chan received, 3)
	e.serve(q, func(_ context.Context, d warren.Delivery) error {
		mu.Lock()
		running++
		most = max(most, running)
		if running == 3 {
			close(all)
		}
		mu.Unlock()
		select {
		case <-all:
		case <-time.After(wait):
		}
		mu.Lock()
		running--
		mu.Unlock()
		done <- received{d, time.Now()}
		return nil
	}, warren.Workers(3))
	e.bodies(done, 3)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(e.t, 3, most)
}

// A consumer tag given to Serve is the deliveries' ConsumerTag.
func consumerTag(e *env) {
	q := e.queue("q", nil)
	e.publish("", q, warren.Message{Body: []byte("m")})
	require.Equal(e.t, "billing-1", e.next(e.collect(q, warren.ConsumerTag("billing-1")), "the message").ConsumerTag)
}

// Serve returns nil once its ctx ends; a handler interrupted then returns its message, which
// the next Serve gets, redelivered.
func serveEnds(e *env) {
	q := e.queue("q", nil)
	e.publish("", q, warren.Message{Body: []byte("m")})
	started := make(chan struct{})
	stop := e.serve(q, func(ctx context.Context, d warren.Delivery) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	})
	select {
	case <-started:
	case <-time.After(wait):
		e.t.Fatal("the handler did not start")
	}
	require.NoError(e.t, stop())
	r := e.next(e.collect(q), "the interrupted message")
	require.True(e.t, r.Redelivered)
}

// A handler running when Serve's ctx ends keeps its ctx for the grace period, and its result
// stands.
func gracePeriod(e *env) {
	q := e.queue("q", nil)
	e.publish("", q, warren.Message{Body: []byte("m")})
	started, finish := make(chan struct{}), make(chan struct{})
	var ctxErr error
	stop := e.serve(q, func(ctx context.Context, d warren.Delivery) error {
		close(started)
		<-finish
		ctxErr = ctx.Err()
		return nil
	}, warren.GracePeriod(wait))
	select {
	case <-started:
	case <-time.After(wait):
		e.t.Fatal("the handler did not start")
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	time.Sleep(100 * time.Millisecond)
	close(finish)
	require.NoError(e.t, <-stopped)
	require.NoError(e.t, ctxErr, "the handler's ctx lived on")
	e.publish("", q, warren.Message{Body: []byte("next")})
	require.Equal(e.t, []string{"next"}, e.bodies(e.collect(q), 1), "the first was acked")
}

// Serve on a queue that does not exist fails with ErrNotFound.
func serveMissingQueue(e *env) {
	err := e.b.Serve(context.Background(), e.name("missing"), func(context.Context, warren.Delivery) error { return nil })
	require.ErrorIs(e.t, err, warren.ErrNotFound)
}

// Declaring a topology again changes nothing; declaring a queue again with other arguments
// fails with ErrPreconditionFailed.
func declareAgain(e *env) {
	q := e.queue("q", warren.Table{"x-max-length": int64(10)})
	e.publish("", q, warren.Message{Body: []byte("kept")})
	e.queue("q", warren.Table{"x-max-length": int64(10)})
	err := e.b.DeclareTopology(warren.Topology{Queues: []warren.QueueDecl{{Name: q, Durable: true, Arguments: warren.Table{"x-max-length": int64(20)}}}})
	require.ErrorIs(e.t, err, warren.ErrPreconditionFailed)
	require.Equal(e.t, []string{"kept"}, e.bodies(e.collect(q), 1))
}

// A closed backend refuses with ErrClosed.
func closed(e *env) {
	q := e.queue("q", nil)
	require.NoError(e.t, e.b.Close())
	err := e.b.Publish(context.Background(), "", q, warren.Message{Body: []byte("m")})
	require.ErrorIs(e.t, err, warren.ErrClosed)
	err = e.b.Serve(context.Background(), q, func(context.Context, warren.Delivery) error { return nil })
	require.ErrorIs(e.t, err, warren.ErrClosed)
}

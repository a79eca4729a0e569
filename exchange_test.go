package warren_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Routing tests (SEMANTICS R6.1–R6.15), observed through which queues end up with a message.
// Helpers are prefixed "ex" so that they do not collide with other test files of the package.

// exDeclare declares an exchange and fails the test on error.
func exDeclare(t *testing.T, b *warren.Broker, name, kind string, opts ...warren.ExchangeOption) *warren.Exchange {
	t.Helper()
	x, err := b.DeclareExchange(name, kind, opts...)
	require.NoError(t, err)
	return x
}

// exBind binds a queue to an exchange and fails the test on error.
func exBind(t *testing.T, b *warren.Broker, queue, exchange, key string, args warren.Table) {
	t.Helper()
	require.NoError(t, b.Bind(queue, exchange, key, args))
}

// exBindX binds destination exchange dst to source exchange src and fails the test on error.
func exBindX(t *testing.T, b *warren.Broker, dst, src, key string, args warren.Table) {
	t.Helper()
	require.NoError(t, b.BindExchange(dst, src, key, args))
}

// exPub publishes body through exchange with key and returns the publish's error.
func exPub(t *testing.T, b *warren.Broker, exchange, key, body string, opts ...warren.PublishOption) error {
	t.Helper()
	return b.Publish(t.Context(), exchange, key, warren.Message{Body: []byte(body)}, opts...)
}

// exMust publishes body through exchange with key and fails the test on error.
func exMust(t *testing.T, b *warren.Broker, exchange, key, body string, opts ...warren.PublishOption) {
	t.Helper()
	require.NoError(t, exPub(t, b, exchange, key, body, opts...))
}

// exLens returns the ready counts of qs.
func exLens(qs ...*warren.Queue) []int {
	out := make([]int, len(qs))
	for i, q := range qs {
		out[i] = q.Len()
	}
	return out
}

// exTake takes every ready message of q with auto-ack Gets, in order.
func exTake(t *testing.T, q *warren.Queue) []*warren.Delivery {
	t.Helper()
	var out []*warren.Delivery
	for {
		d, err := q.Get(t.Context(), warren.AutoAck())
		if errors.Is(err, warren.ErrEmpty) {
			return out
		}
		require.NoError(t, err)
		out = append(out, d)
	}
}

// exBodies takes every ready message of q and returns their bodies.
func exBodies(t *testing.T, q *warren.Queue) []string {
	t.Helper()
	var out []string
	for _, d := range exTake(t, q) {
		out = append(out, string(d.Message.Body))
	}
	return out
}

// exOne takes the only ready message of q.
func exOne(t *testing.T, q *warren.Queue) *warren.Delivery {
	t.Helper()
	ds := exTake(t, q)
	require.Len(t, ds, 1, "queue %q", q.Name())
	return ds[0]
}

// exGone asserts that the exchange name no longer exists.
func exGone(t *testing.T, b *warren.Broker, name string) {
	t.Helper()
	_, err := b.Exchange(name)
	require.ErrorIs(t, err, warren.ErrNotFound, "exchange %q should be deleted", name)
}

// exExists asserts that the exchange name exists.
func exExists(t *testing.T, b *warren.Broker, name string) {
	t.Helper()
	_, err := b.Exchange(name)
	require.NoError(t, err, "exchange %q should exist", name)
}

// R6.1: the default exchange routes by queue name only; other keys drop or fail with Mandatory.
func TestRoutingDefaultExchange(t *testing.T) {
	b := newBroker(t)
	orders := declare(t, b, "orders")
	audit := declare(t, b, "audit")
	// An explicit binding elsewhere with key "orders" must not make the default exchange route
	// to audit.
	exBind(t, b, "audit", "amq.direct", "orders", nil)

	exMust(t, b, "", "orders", "m1")
	require.Equal(t, []int{1, 0}, exLens(orders, audit))
	d := exOne(t, orders)
	assert.Equal(t, "m1", string(d.Message.Body))
	assert.Equal(t, "", d.Exchange)
	assert.Equal(t, "orders", d.RoutingKey)

	// Case-sensitive, no partial names, no queue named by the key: dropped with a nil error.
	for _, key := range []string{"nobody", "ORDERS", "order", "orders.x", ""} {
		require.NoError(t, exPub(t, b, "", key, "drop"), "key %q", key)
		require.ErrorIs(t, exPub(t, b, "", key, "drop", warren.Mandatory()), warren.ErrUnroutable, "key %q", key)
	}
	require.Equal(t, []int{0, 0}, exLens(orders, audit))

	// Mandatory to an existing queue succeeds.
	exMust(t, b, "", "audit", "m2", warren.Mandatory())
	require.Equal(t, []int{0, 1}, exLens(orders, audit))

	// The default exchange cannot be declared, deleted, bound or unbound.
	_, err := b.DeclareExchange("", warren.ExchangeDirect)
	require.ErrorIs(t, err, warren.ErrAccessRefused)
	require.ErrorIs(t, b.DeleteExchange(""), warren.ErrAccessRefused)
	require.ErrorIs(t, b.Bind("orders", "", "x", nil), warren.ErrAccessRefused)
	require.ErrorIs(t, b.Unbind("orders", "", "orders", nil), warren.ErrAccessRefused)
	require.ErrorIs(t, b.BindExchange("amq.direct", "", "x", nil), warren.ErrAccessRefused)

	// A deleted queue is no longer reachable by its name.
	deleteQueue(t, b, "orders")
	require.ErrorIs(t, exPub(t, b, "", "orders", "gone", warren.Mandatory()), warren.ErrUnroutable)
}

// R6.14: the predeclared exchanges exist with the right kinds.
func TestRoutingPredeclaredExchanges(t *testing.T) {
	b := newBroker(t)
	for name, kind := range map[string]string{
		"":            warren.ExchangeDirect,
		"amq.direct":  warren.ExchangeDirect,
		"amq.fanout":  warren.ExchangeFanout,
		"amq.topic":   warren.ExchangeTopic,
		"amq.headers": warren.ExchangeHeaders,
		"amq.match":   warren.ExchangeHeaders,
	} {
		x, err := b.Exchange(name)
		require.NoError(t, err, "exchange %q", name)
		assert.Equal(t, name, x.Name())
		assert.Equal(t, kind, x.Kind(), "exchange %q", name)
		if name != "" {
			require.ErrorIs(t, b.DeleteExchange(name), warren.ErrAccessRefused, "exchange %q", name)
		}
	}
	_, err := b.Exchange("amq.nothing")
	require.ErrorIs(t, err, warren.ErrNotFound)
	_, err = b.DeclareExchange("amq.mine", warren.ExchangeFanout)
	require.ErrorIs(t, err, warren.ErrAccessRefused)

	// They route as their kinds do.
	q := declare(t, b, "q")
	exBind(t, b, "q", "amq.direct", "k", nil)
	exBind(t, b, "q", "amq.fanout", "ignored", nil)
	exBind(t, b, "q", "amq.topic", "a.*", nil)
	exBind(t, b, "q", "amq.headers", "", warren.Table{"h": "1"})
	exBind(t, b, "q", "amq.match", "", warren.Table{"x-match": "any", "m": "1"})
	exMust(t, b, "amq.direct", "k", "direct", warren.Mandatory())
	exMust(t, b, "amq.fanout", "whatever", "fanout", warren.Mandatory())
	exMust(t, b, "amq.topic", "a.b", "topic", warren.Mandatory())
	require.NoError(t, b.Publish(t.Context(), "amq.headers", "", warren.Message{Body: []byte("headers"), Headers: warren.Table{"h": "1"}}, warren.Mandatory()))
	require.NoError(t, b.Publish(t.Context(), "amq.match", "", warren.Message{Body: []byte("match"), Headers: warren.Table{"m": "1"}}, warren.Mandatory()))
	require.ErrorIs(t, exPub(t, b, "amq.direct", "K", "no", warren.Mandatory()), warren.ErrUnroutable)
	require.ErrorIs(t, exPub(t, b, "amq.topic", "b.a", "no", warren.Mandatory()), warren.ErrUnroutable)
	require.Equal(t, []string{"direct", "fanout", "topic", "headers", "match"}, exBodies(t, q))
}

// R6.2: direct exchanges route by exact, case-sensitive key equality.
func TestRoutingDirect(t *testing.T) {
	b := newBroker(t)
	exDeclare(t, b, "dx", warren.ExchangeDirect)
	upper := declare(t, b, "upper")
	lowerA := declare(t, b, "lowerA")
	lowerB := declare(t, b, "lowerB")
	sub := declare(t, b, "sub")
	empty := declare(t, b, "empty")
	exBind(t, b, "upper", "dx", "Key", nil)
	exBind(t, b, "lowerA", "dx", "key", nil)
	exBind(t, b, "lowerB", "dx", "key", nil) // several bindings with the same key
	exBind(t, b, "sub", "dx", "key.sub", nil)
	exBind(t, b, "empty", "dx", "", nil)
	all := []*warren.Queue{upper, lowerA, lowerB, sub, empty}

	cases := []struct {
		key  string
		want []int
	}{
		{"key", []int{0, 1, 1, 0, 0}},
		{"Key", []int{1, 0, 0, 0, 0}},
		{"KEY", []int{0, 0, 0, 0, 0}},
		{"key.sub", []int{0, 0, 0, 1, 0}},
		{"key.", []int{0, 0, 0, 0, 0}},
		{"key ", []int{0, 0, 0, 0, 0}},
		{"ke", []int{0, 0, 0, 0, 0}},
		{"key.*", []int{0, 0, 0, 0, 0}}, // no wildcards in a direct exchange
		{"#", []int{0, 0, 0, 0, 0}},
		{"", []int{0, 0, 0, 0, 1}},
	}
	for _, c := range cases {
		err := exPub(t, b, "dx", c.key, c.key, warren.Mandatory())
		if slices.Contains(c.want, 1) {
			require.NoError(t, err, "key %q", c.key)
		} else {
			require.ErrorIs(t, err, warren.ErrUnroutable, "key %q", c.key)
		}
		require.Equal(t, c.want, exLens(all...), "key %q", c.key)
		for _, q := range all {
			for _, d := range exTake(t, q) {
				assert.Equal(t, c.key, d.RoutingKey)
				assert.Equal(t, "dx", d.Exchange)
			}
		}
	}

	// A queue bound twice with different keys, matched by both (the key and a CC key), gets
	// one copy.
	twice := declare(t, b, "twice")
	exBind(t, b, "twice", "dx", "k1", nil)
	exBind(t, b, "twice", "dx", "k2", nil)
	require.NoError(t, b.Publish(t.Context(), "dx", "k1", warren.Message{Body: []byte("both"), Headers: warren.Table{"CC": []any{"k2"}}}))
	require.Equal(t, []string{"both"}, exBodies(t, twice))
	exMust(t, b, "dx", "k2", "k2 only")
	require.Equal(t, []string{"k2 only"}, exBodies(t, twice))
}

// R6.3: fanout exchanges ignore the key and give every bound queue one copy.
func TestRoutingFanout(t *testing.T) {
	b := newBroker(t)
	exDeclare(t, b, "fx", warren.ExchangeFanout)
	require.ErrorIs(t, exPub(t, b, "fx", "k", "none", warren.Mandatory()), warren.ErrUnroutable)

	q1 := declare(t, b, "q1")
	q2 := declare(t, b, "q2")
	q3 := declare(t, b, "q3")
	other := declare(t, b, "other")
	exBind(t, b, "q1", "fx", "a", nil)
	exBind(t, b, "q2", "fx", "", nil)
	exBind(t, b, "q3", "fx", "x", nil)
	exBind(t, b, "q3", "fx", "y", nil) // two bindings: still one copy
	for _, key := range []string{"a", "zzz", "", "#", "x"} {
		exMust(t, b, "fx", key, key, warren.Mandatory())
	}
	want := []string{"a", "zzz", "", "#", "x"}
	for _, q := range []*warren.Queue{q1, q2, q3} {
		var bodies []string
		for _, d := range exTake(t, q) {
			bodies = append(bodies, string(d.Message.Body))
			assert.Equal(t, string(d.Message.Body), d.RoutingKey)
			assert.Equal(t, "fx", d.Exchange)
		}
		require.Equal(t, want, bodies, "queue %q", q.Name())
	}
	require.Zero(t, other.Len())
}

// R6.4, through the broker: representative patterns (the full word-rule table is in
// topic_test.go).
func TestRoutingTopicPatterns(t *testing.T) {
	b := newBroker(t)
	exDeclare(t, b, "tx", warren.ExchangeTopic)
	patterns := []string{
		"a.b.c", // 0
		"a.*.c", // 1
		"a.#",   // 2
		"#.c",   // 3
		"*",     // 4
		"#",     // 5
		"*.*",   // 6
		"a.*",   // 7
		"#.b.#", // 8
		"a.b*",  // 9: a literal word, not a wildcard
		"*.#",   // 10
		"a..c",  // 11: empty middle word
	}
	qs := make([]*warren.Queue, len(patterns))
	for i, p := range patterns {
		qs[i] = declare(t, b, "p"+p) // "p" prefix: "" and "amq." are not usable as names
		exBind(t, b, qs[i].Name(), "tx", p, nil)
	}
	cases := []struct {
		key     string
		matches []int
	}{
		{"a.b.c", []int{0, 1, 2, 3, 5, 8, 10}},
		{"a.x.c", []int{1, 2, 3, 5, 10}},
		{"a", []int{2, 4, 5, 10}},
		{"a.b", []int{2, 5, 6, 7, 8, 10}},
		{"", []int{5}},
		{"c", []int{3, 4, 5, 10}},
		{"a..c", []int{1, 2, 3, 5, 10, 11}},
		{".", []int{5, 6, 10}},
		{"a.b*", []int{2, 5, 6, 7, 9, 10}},
		{"x.b.y", []int{5, 8, 10}},
		{"b", []int{4, 5, 8, 10}},
		{"A.B.C", []int{5, 10}},
	}
	for _, c := range cases {
		exMust(t, b, "tx", c.key, c.key, warren.Mandatory())
		want := make([]int, len(patterns))
		for _, i := range c.matches {
			want[i] = 1
		}
		got := exLens(qs...)
		if !assert.Equal(t, want, got, "key %q", c.key) {
			for i, p := range patterns {
				if want[i] != got[i] {
					t.Errorf("key %q pattern %q: got %d copies, want %d", c.key, p, got[i], want[i])
				}
			}
		}
		for _, q := range qs {
			_, err := q.Purge()
			require.NoError(t, err)
		}
	}
}

// R6.4, wiring: bind and unbind change routing; several matching patterns give one copy; `#`
// gets the empty key.
func TestRoutingTopicWiring(t *testing.T) {
	b := newBroker(t)
	exDeclare(t, b, "tx", warren.ExchangeTopic)
	q := declare(t, b, "q")

	// Bind and unbind affect routing.
	require.ErrorIs(t, exPub(t, b, "tx", "x.y", "before", warren.Mandatory()), warren.ErrUnroutable)
	exBind(t, b, "q", "tx", "x.#", nil)
	exMust(t, b, "tx", "x.y", "bound", warren.Mandatory())
	require.Equal(t, []string{"bound"}, exBodies(t, q))
	require.NoError(t, b.Unbind("q", "tx", "x.*", nil)) // a different pattern: not removed
	exMust(t, b, "tx", "x.y", "still", warren.Mandatory())
	require.Equal(t, []string{"still"}, exBodies(t, q))
	require.NoError(t, b.Unbind("q", "tx", "x.#", nil))
	require.ErrorIs(t, exPub(t, b, "tx", "x.y", "after", warren.Mandatory()), warren.ErrUnroutable)
	require.Zero(t, q.Len())

	// Two matching patterns of one queue: one copy; unbinding one leaves the other working.
	exBind(t, b, "q", "tx", "a.*", nil)
	exBind(t, b, "q", "tx", "*.b", nil)
	exBind(t, b, "q", "tx", "#", nil)
	exMust(t, b, "tx", "a.b", "three patterns")
	require.Equal(t, []string{"three patterns"}, exBodies(t, q))
	require.NoError(t, b.Unbind("q", "tx", "#", nil))
	require.NoError(t, b.Unbind("q", "tx", "a.*", nil))
	exMust(t, b, "tx", "a.b", "via *.b", warren.Mandatory())
	require.ErrorIs(t, exPub(t, b, "tx", "a.c", "was a.*", warren.Mandatory()), warren.ErrUnroutable)
	require.Equal(t, []string{"via *.b"}, exBodies(t, q))

	// `#` receives the empty routing key; `*` does not.
	star := declare(t, b, "star")
	hash := declare(t, b, "hash")
	exBind(t, b, "star", "tx", "*", nil)
	exBind(t, b, "hash", "tx", "#", nil)
	exMust(t, b, "tx", "", "empty key", warren.Mandatory())
	require.Equal(t, []int{0, 0, 1}, exLens(q, star, hash))
	d := exOne(t, hash)
	assert.Equal(t, "", d.RoutingKey)
	assert.Equal(t, "tx", d.Exchange)

	// Two queues bound with the same pattern both get it; unbinding one leaves the other.
	exBind(t, b, "star", "tx", "#", nil)
	exMust(t, b, "tx", "", "both")
	require.Equal(t, []int{1, 1}, exLens(star, hash))
	require.NoError(t, b.Unbind("hash", "tx", "#", nil))
	exMust(t, b, "tx", "", "star only")
	require.Equal(t, []string{"both", "star only"}, exBodies(t, star))
	require.Equal(t, []string{"both"}, exBodies(t, hash))
}

// R6.5: headers exchanges match x-match all/any/all-with-x/any-with-x against message headers.
func TestRoutingHeaders(t *testing.T) {
	b := newBroker(t)
	exDeclare(t, b, "hx", warren.ExchangeHeaders)
	bindings := []struct {
		name string
		args warren.Table
	}{
		{"all", warren.Table{"x-match": "all", "format": "pdf", "type": "report"}},                 // 0
		{"any", warren.Table{"x-match": "any", "format": "zip", "type": "report"}},                 // 1
		{"default-all", warren.Table{"format": "pdf", "type": "report"}},                           // 2
		{"all-with-x", warren.Table{"x-match": "all-with-x", "format": "pdf", "x-tenant": "acme"}}, // 3
		{"any-with-x", warren.Table{"x-match": "any-with-x", "format": "zip", "x-tenant": "acme"}}, // 4
		{"all-ignores-x", warren.Table{"x-match": "all", "format": "pdf", "x-tenant": "globex"}},   // 5
		{"any-only-x", warren.Table{"x-match": "any", "x-tenant": "acme"}},                         // 6: nothing considered
		{"size-int32", warren.Table{"size": int32(1024)}},                                          // 7
		{"presence", warren.Table{"x-match": "all", "trace-id": nil}},                              // 8
		{"catch-all", nil}, // 9
		{"negative", warren.Table{"x-match": "any", "delta": int32(-5)}}, // 10
	}
	qs := make([]*warren.Queue, len(bindings))
	for i, bd := range bindings {
		qs[i] = declare(t, b, bd.name)
		// The key is ignored by a headers exchange.
		exBind(t, b, bd.name, "hx", "some.key", bd.args)
	}
	cases := []struct {
		name    string
		headers warren.Table
		matches []int
	}{
		{"pdf report acme int64", warren.Table{"format": "pdf", "type": "report", "x-tenant": "acme", "size": int64(1024)},
			[]int{0, 1, 2, 3, 4, 5, 7, 9}},
		{"zip invoice globex float64", warren.Table{"format": "zip", "type": "invoice", "x-tenant": "globex", "size": float64(1024)},
			[]int{1, 4, 7, 9}},
		{"PDF report fractional size traced", warren.Table{"format": "PDF", "type": "report", "size": 1024.5, "trace-id": "abc"},
			[]int{1, 8, 9}},
		{"acme string size nil trace", warren.Table{"x-tenant": "acme", "size": "1024", "trace-id": nil},
			[]int{4, 8, 9}},
		{"no headers", nil, []int{9}},
		{"pdf int size", warren.Table{"format": "pdf", "size": int(1024), "Type": "report"},
			[]int{5, 7, 9}},
		{"uint16 size and negative float", warren.Table{"size": uint16(1024), "delta": float64(-5)},
			[]int{7, 9, 10}},
		{"negative int8 and unsigned size mismatch", warren.Table{"size": uint32(1023), "delta": int8(-5)},
			[]int{9, 10}},
		{"bytes are not strings", warren.Table{"format": []byte("pdf"), "type": []byte("report")},
			[]int{9}},
	}
	for _, c := range cases {
		err := b.Publish(t.Context(), "hx", "other.key", warren.Message{Body: []byte(c.name), Headers: c.headers}, warren.Mandatory())
		require.NoError(t, err, c.name) // catch-all always matches
		want := make([]int, len(bindings))
		for _, i := range c.matches {
			want[i] = 1
		}
		got := exLens(qs...)
		if !assert.Equal(t, want, got, c.name) {
			for i, bd := range bindings {
				if want[i] != got[i] {
					t.Errorf("%s: binding %s: got %d copies, want %d", c.name, bd.name, got[i], want[i])
				}
			}
		}
		for _, q := range qs {
			for _, d := range exTake(t, q) {
				assert.Equal(t, "other.key", d.RoutingKey)
				assert.Equal(t, "hx", d.Exchange)
			}
		}
	}

	// Without the catch-all, a message matching nothing is unroutable.
	require.NoError(t, b.Unbind("catch-all", "hx", "some.key", nil))
	err := b.Publish(t.Context(), "hx", "", warren.Message{Headers: warren.Table{"format": "doc"}}, warren.Mandatory())
	require.ErrorIs(t, err, warren.ErrUnroutable)
}

// R6.5: an invalid x-match fails at Bind with ErrPreconditionFailed and creates no binding.
func TestRoutingHeadersInvalidXMatch(t *testing.T) {
	for _, v := range []any{"bogus", "ALL", "", "all ", []byte("all"), 1, true, nil} {
		b := newBroker(t)
		exDeclare(t, b, "hx", warren.ExchangeHeaders, warren.AutoDelete())
		q := declare(t, b, "q")
		err := b.Bind("q", "hx", "", warren.Table{"x-match": v, "a": "1"})
		require.ErrorIs(t, err, warren.ErrPreconditionFailed, "x-match %#v", v)
		err = b.Publish(t.Context(), "hx", "", warren.Message{Headers: warren.Table{"a": "1"}}, warren.Mandatory())
		require.ErrorIs(t, err, warren.ErrUnroutable, "x-match %#v", v)
		require.Zero(t, q.Len())
		// No binding: not deleted as an auto-delete exchange that had one, and deletable if unused.
		exExists(t, b, "hx")
		require.NoError(t, b.DeleteExchange("hx", warren.IfUnused()), "x-match %#v", v)
	}
}

// R6.6: exchange-to-exchange bindings route over the whole graph, one copy per queue.
func TestRoutingExchangeToExchange(t *testing.T) {
	t.Run("chain", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "A", warren.ExchangeDirect)
		exDeclare(t, b, "B", warren.ExchangeFanout)
		q := declare(t, b, "q")
		exBindX(t, b, "B", "A", "k", nil)
		exBind(t, b, "q", "B", "", nil)
		exMust(t, b, "A", "k", "through", warren.Mandatory())
		require.ErrorIs(t, exPub(t, b, "A", "other", "no", warren.Mandatory()), warren.ErrUnroutable)
		d := exOne(t, q)
		assert.Equal(t, "through", string(d.Message.Body))
		assert.Equal(t, "A", d.Exchange)
		assert.Equal(t, "k", d.RoutingKey)
	})
	t.Run("key kept along the chain", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "A", warren.ExchangeTopic)
		exDeclare(t, b, "B", warren.ExchangeDirect)
		q := declare(t, b, "q")
		exBindX(t, b, "B", "A", "logs.#", nil)
		exBind(t, b, "q", "B", "logs.error", nil)
		exMust(t, b, "A", "logs.error", "error", warren.Mandatory())
		exMust(t, b, "A", "logs.info", "info")    // reaches B, which routes it nowhere
		exMust(t, b, "A", "metrics.error", "met") // does not reach B
		require.Equal(t, []string{"error"}, exBodies(t, q))
	})
	t.Run("headers destination sees the headers", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "A", warren.ExchangeFanout)
		exDeclare(t, b, "H", warren.ExchangeHeaders)
		q := declare(t, b, "q")
		exBindX(t, b, "H", "A", "", nil)
		exBind(t, b, "q", "H", "", warren.Table{"kind": "x"})
		require.NoError(t, b.Publish(t.Context(), "A", "k", warren.Message{Body: []byte("x"), Headers: warren.Table{"kind": "x"}}, warren.Mandatory()))
		require.NoError(t, b.Publish(t.Context(), "A", "k", warren.Message{Body: []byte("y"), Headers: warren.Table{"kind": "y"}}))
		require.Equal(t, []string{"x"}, exBodies(t, q))
	})
	t.Run("CC keys apply at every exchange", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "A", warren.ExchangeTopic)
		exDeclare(t, b, "B", warren.ExchangeDirect)
		q := declare(t, b, "q")
		exBindX(t, b, "B", "A", "#", nil)
		exBind(t, b, "q", "B", "k2", nil)
		require.NoError(t, b.Publish(t.Context(), "A", "k1", warren.Message{Body: []byte("cc"), Headers: warren.Table{"CC": []any{"k2"}}}, warren.Mandatory()))
		d := exOne(t, q)
		assert.Equal(t, "k1", d.RoutingKey)
		assert.Equal(t, "A", d.Exchange)
	})
	t.Run("diamond", func(t *testing.T) {
		b := newBroker(t)
		for _, x := range []string{"A", "B", "C"} {
			exDeclare(t, b, x, warren.ExchangeFanout)
		}
		q := declare(t, b, "q")
		exBindX(t, b, "B", "A", "", nil)
		exBindX(t, b, "C", "A", "", nil)
		exBind(t, b, "q", "B", "", nil)
		exBind(t, b, "q", "C", "", nil)
		exBind(t, b, "q", "A", "", nil) // and directly
		exMust(t, b, "A", "k", "once", warren.Mandatory())
		require.Equal(t, []string{"once"}, exBodies(t, q))
	})
	t.Run("cycle", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "A", warren.ExchangeFanout)
		exDeclare(t, b, "B", warren.ExchangeFanout)
		onB := declare(t, b, "onB")
		onA := declare(t, b, "onA")
		exBindX(t, b, "B", "A", "", nil)
		exBindX(t, b, "A", "B", "", nil)
		exBind(t, b, "onB", "B", "", nil)
		exMust(t, b, "A", "k", "from A", warren.Mandatory())
		require.Equal(t, []int{1, 0}, exLens(onB, onA))
		exBind(t, b, "onA", "A", "", nil)
		exMust(t, b, "B", "k", "from B", warren.Mandatory())
		require.Equal(t, []string{"from A", "from B"}, exBodies(t, onB))
		require.Equal(t, []string{"from B"}, exBodies(t, onA))
	})
	t.Run("self loop", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "A", warren.ExchangeFanout)
		q := declare(t, b, "q")
		exBindX(t, b, "A", "A", "", nil)
		exBind(t, b, "q", "A", "", nil)
		exMust(t, b, "A", "k", "once", warren.Mandatory())
		require.Equal(t, []string{"once"}, exBodies(t, q))
	})
	t.Run("unbind stops the path", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "A", warren.ExchangeDirect)
		exDeclare(t, b, "B", warren.ExchangeFanout)
		q := declare(t, b, "q")
		exBindX(t, b, "B", "A", "k", nil)
		exBind(t, b, "q", "B", "", nil)
		require.NoError(t, b.UnbindExchange("B", "A", "other", nil)) // not the binding
		exMust(t, b, "A", "k", "still", warren.Mandatory())
		require.NoError(t, b.UnbindExchange("B", "A", "k", nil))
		require.ErrorIs(t, exPub(t, b, "A", "k", "cut", warren.Mandatory()), warren.ErrUnroutable)
		exMust(t, b, "B", "k", "direct to B", warren.Mandatory())
		require.Equal(t, []string{"still", "direct to B"}, exBodies(t, q))
	})
	t.Run("missing ends", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "A", warren.ExchangeFanout)
		require.ErrorIs(t, b.BindExchange("nope", "A", "", nil), warren.ErrNotFound)
		require.ErrorIs(t, b.BindExchange("A", "nope", "", nil), warren.ErrNotFound)
		require.ErrorIs(t, exPub(t, b, "A", "", "x", warren.Mandatory()), warren.ErrUnroutable)
	})
}

// R6.7: alternate exchanges take what an exchange routes nowhere.
func TestRoutingAlternateExchange(t *testing.T) {
	for _, how := range []struct {
		name string
		opt  func(ae string) warren.ExchangeOption
	}{
		{"option", warren.AlternateExchange},
		{"argument", func(ae string) warren.ExchangeOption {
			return warren.Arguments(warren.Table{"alternate-exchange": ae})
		}},
	} {
		t.Run(how.name, func(t *testing.T) {
			b := newBroker(t)
			exDeclare(t, b, "X", warren.ExchangeDirect, how.opt("ae"))
			exDeclare(t, b, "ae", warren.ExchangeFanout)
			qx := declare(t, b, "qx")
			qae := declare(t, b, "qae")
			exBind(t, b, "qx", "X", "k", nil)
			exBind(t, b, "qae", "ae", "", nil)

			exMust(t, b, "X", "k", "routed", warren.Mandatory())
			require.Equal(t, []int{1, 0}, exLens(qx, qae))
			// Unroutable by X: to the AE, and that counts as routed for Mandatory.
			exMust(t, b, "X", "nope", "alternate", warren.Mandatory())
			require.Equal(t, []int{1, 1}, exLens(qx, qae))
			d := exOne(t, qae)
			assert.Equal(t, "alternate", string(d.Message.Body))
			assert.Equal(t, "X", d.Exchange) // the exchange published to
			assert.Equal(t, "nope", d.RoutingKey)
			require.Equal(t, []string{"routed"}, exBodies(t, qx))

			// The AE routing nowhere either: unroutable.
			require.NoError(t, b.Unbind("qae", "ae", "", nil))
			require.ErrorIs(t, exPub(t, b, "X", "nope", "lost", warren.Mandatory()), warren.ErrUnroutable)
			require.Equal(t, []int{0, 0}, exLens(qx, qae))
		})
	}
	t.Run("AE declared later", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "X", warren.ExchangeDirect, warren.AlternateExchange("later"))
		q := declare(t, b, "q")
		require.ErrorIs(t, exPub(t, b, "X", "k", "missing AE", warren.Mandatory()), warren.ErrUnroutable)
		exMust(t, b, "X", "k", "missing AE, dropped")
		exDeclare(t, b, "later", warren.ExchangeFanout)
		exBind(t, b, "q", "later", "", nil)
		exMust(t, b, "X", "k", "via later", warren.Mandatory())
		require.Equal(t, []string{"via later"}, exBodies(t, q))
	})
	t.Run("chain", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "X", warren.ExchangeDirect, warren.AlternateExchange("ae1"))
		exDeclare(t, b, "ae1", warren.ExchangeDirect, warren.AlternateExchange("ae2"))
		exDeclare(t, b, "ae2", warren.ExchangeFanout)
		qx := declare(t, b, "qx")
		q1 := declare(t, b, "q1")
		q2 := declare(t, b, "q2")
		exBind(t, b, "qx", "X", "x", nil)
		exBind(t, b, "q1", "ae1", "one", nil)
		exBind(t, b, "q2", "ae2", "", nil)
		exMust(t, b, "X", "x", "x", warren.Mandatory())
		exMust(t, b, "X", "one", "one", warren.Mandatory())
		exMust(t, b, "X", "other", "other", warren.Mandatory())
		require.Equal(t, []string{"x"}, exBodies(t, qx))
		require.Equal(t, []string{"one"}, exBodies(t, q1))
		require.Equal(t, []string{"other"}, exBodies(t, q2))
	})
	t.Run("cycle", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "X", warren.ExchangeDirect, warren.AlternateExchange("Y"))
		exDeclare(t, b, "Y", warren.ExchangeDirect, warren.AlternateExchange("X"))
		q := declare(t, b, "q")
		// Both unroutable: dropped, no hang.
		exMust(t, b, "X", "k", "dropped")
		exMust(t, b, "Y", "k", "dropped")
		require.ErrorIs(t, exPub(t, b, "X", "k", "lost", warren.Mandatory()), warren.ErrUnroutable)
		require.ErrorIs(t, exPub(t, b, "Y", "k", "lost", warren.Mandatory()), warren.ErrUnroutable)
		// Y routes what X cannot, once.
		exBind(t, b, "q", "Y", "hit", nil)
		exMust(t, b, "X", "hit", "via Y", warren.Mandatory())
		require.Equal(t, []string{"via Y"}, exBodies(t, q))
		// X as Y's AE: a queue on X gets a message published to Y that Y cannot route.
		exBind(t, b, "q", "X", "back", nil)
		exMust(t, b, "Y", "back", "via X", warren.Mandatory())
		require.Equal(t, []string{"via X"}, exBodies(t, q))
	})
	t.Run("self AE", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "X", warren.ExchangeDirect, warren.AlternateExchange("X"))
		require.ErrorIs(t, exPub(t, b, "X", "k", "lost", warren.Mandatory()), warren.ErrUnroutable)
	})
	t.Run("missing AE", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "X", warren.ExchangeFanout, warren.AlternateExchange("ghost"))
		exMust(t, b, "X", "k", "dropped")
		require.ErrorIs(t, exPub(t, b, "X", "k", "lost", warren.Mandatory()), warren.ErrUnroutable)
	})
	t.Run("not used when routed", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "X", warren.ExchangeTopic, warren.AlternateExchange("ae"))
		exDeclare(t, b, "ae", warren.ExchangeFanout)
		q := declare(t, b, "q")
		qae := declare(t, b, "qae")
		exBind(t, b, "q", "X", "a.#", nil)
		exBind(t, b, "qae", "ae", "", nil)
		exMust(t, b, "X", "a.b", "a")
		exMust(t, b, "X", "b.a", "b")
		require.Equal(t, []string{"a"}, exBodies(t, q))
		require.Equal(t, []string{"b"}, exBodies(t, qae))
	})
	t.Run("non-string argument", func(t *testing.T) {
		b := newBroker(t)
		_, err := b.DeclareExchange("X", warren.ExchangeFanout, warren.Arguments(warren.Table{"alternate-exchange": []byte("ae")}))
		require.ErrorIs(t, err, warren.ErrPreconditionFailed)
		exGone(t, b, "X")
	})
}

// R6.9: internal exchanges refuse publishes and are reached through exchange bindings.
func TestRoutingInternalExchange(t *testing.T) {
	b := newBroker(t)
	ix := exDeclare(t, b, "ix", warren.ExchangeFanout, warren.Internal())
	exDeclare(t, b, "front", warren.ExchangeDirect)
	q := declare(t, b, "q")
	exBind(t, b, "q", "ix", "", nil)

	require.ErrorIs(t, exPub(t, b, "ix", "k", "refused"), warren.ErrAccessRefused)
	require.ErrorIs(t, ix.Publish(t.Context(), "k", warren.Message{Body: []byte("refused")}), warren.ErrAccessRefused)
	require.Zero(t, q.Len())

	exBindX(t, b, "ix", "front", "k", nil)
	exMust(t, b, "front", "k", "through front", warren.Mandatory())
	d := exOne(t, q)
	assert.Equal(t, "through front", string(d.Message.Body))
	assert.Equal(t, "front", d.Exchange)

	// An internal exchange works as an alternate exchange too.
	exDeclare(t, b, "withAE", warren.ExchangeDirect, warren.AlternateExchange("ix"))
	exMust(t, b, "withAE", "nothing", "via AE", warren.Mandatory())
	require.Equal(t, []string{"via AE"}, exBodies(t, q))
}

// R6.10: auto-delete exchanges go when their last source binding is removed.
func TestRoutingAutoDeleteExchange(t *testing.T) {
	t.Run("unbind", func(t *testing.T) {
		b := newBroker(t)
		ad := exDeclare(t, b, "ad", warren.ExchangeFanout, warren.AutoDelete())
		declare(t, b, "q1")
		declare(t, b, "q2")
		exBind(t, b, "q1", "ad", "", nil)
		exBind(t, b, "q2", "ad", "", nil)
		require.NoError(t, b.Unbind("q1", "ad", "", nil))
		exExists(t, b, "ad")
		require.NoError(t, b.Unbind("q2", "ad", "", nil))
		exGone(t, b, "ad")
		require.ErrorIs(t, ad.Publish(t.Context(), "", warren.Message{}), warren.ErrNotFound)
		require.ErrorIs(t, exPub(t, b, "ad", "", "x"), warren.ErrNotFound)
	})
	t.Run("unbind exchange", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "ad", warren.ExchangeFanout, warren.AutoDelete())
		exDeclare(t, b, "dst", warren.ExchangeFanout)
		exBindX(t, b, "dst", "ad", "", nil)
		require.NoError(t, b.UnbindExchange("dst", "ad", "", nil))
		exGone(t, b, "ad")
		exExists(t, b, "dst")
	})
	t.Run("delete destination queue", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "ad", warren.ExchangeDirect, warren.AutoDelete())
		declare(t, b, "q")
		exBind(t, b, "q", "ad", "a", nil)
		exBind(t, b, "q", "ad", "b", nil)
		deleteQueue(t, b, "q")
		exGone(t, b, "ad")
	})
	t.Run("delete destination exchange", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "ad", warren.ExchangeFanout, warren.AutoDelete())
		exDeclare(t, b, "dst", warren.ExchangeFanout)
		exBindX(t, b, "dst", "ad", "", nil)
		require.NoError(t, b.DeleteExchange("dst"))
		exGone(t, b, "ad")
	})
	t.Run("cascade", func(t *testing.T) {
		b := newBroker(t)
		// keep → A(ad) → B(ad) → q; keep is not auto-delete.
		exDeclare(t, b, "keep", warren.ExchangeFanout)
		exDeclare(t, b, "A", warren.ExchangeFanout, warren.AutoDelete())
		exDeclare(t, b, "B", warren.ExchangeFanout, warren.AutoDelete())
		declare(t, b, "q")
		exBindX(t, b, "A", "keep", "", nil)
		exBindX(t, b, "B", "A", "", nil)
		exBind(t, b, "q", "B", "", nil)
		exMust(t, b, "keep", "", "before", warren.Mandatory())
		deleteQueue(t, b, "q")
		exGone(t, b, "B")
		exGone(t, b, "A")
		exExists(t, b, "keep")
		require.ErrorIs(t, exPub(t, b, "keep", "", "after", warren.Mandatory()), warren.ErrUnroutable)
		// keep has no binding left.
		require.NoError(t, b.DeleteExchange("keep", warren.IfUnused()))
	})
	t.Run("cascade by unbind", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "A", warren.ExchangeFanout, warren.AutoDelete())
		exDeclare(t, b, "B", warren.ExchangeFanout, warren.AutoDelete())
		exDeclare(t, b, "C", warren.ExchangeFanout, warren.AutoDelete())
		declare(t, b, "q")
		exBindX(t, b, "B", "A", "", nil)
		exBindX(t, b, "C", "B", "", nil)
		exBind(t, b, "q", "C", "", nil)
		require.NoError(t, b.Unbind("q", "C", "", nil))
		exGone(t, b, "C")
		exGone(t, b, "B")
		exGone(t, b, "A")
	})
	t.Run("stops at an exchange with other bindings", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "A", warren.ExchangeFanout, warren.AutoDelete())
		exDeclare(t, b, "B", warren.ExchangeFanout, warren.AutoDelete())
		q := declare(t, b, "q")
		declare(t, b, "other")
		exBindX(t, b, "B", "A", "", nil)
		exBind(t, b, "q", "A", "", nil)
		exBind(t, b, "other", "B", "", nil)
		deleteQueue(t, b, "other")
		exGone(t, b, "B")
		exExists(t, b, "A")
		exMust(t, b, "A", "", "A still routes", warren.Mandatory())
		require.Equal(t, []string{"A still routes"}, exBodies(t, q))
	})
	t.Run("never had a binding", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "ad", warren.ExchangeDirect, warren.AutoDelete())
		exDeclare(t, b, "adh", warren.ExchangeHeaders, warren.AutoDelete())
		exDeclare(t, b, "unrelated", warren.ExchangeFanout)
		declare(t, b, "q")
		declare(t, b, "r")
		exBind(t, b, "r", "unrelated", "", nil)
		require.NoError(t, b.Unbind("q", "ad", "missing", nil))
		require.NoError(t, b.UnbindExchange("unrelated", "ad", "missing", nil))
		require.ErrorIs(t, b.Bind("q", "adh", "", warren.Table{"x-match": "bogus"}), warren.ErrPreconditionFailed)
		require.NoError(t, b.Unbind("r", "unrelated", "", nil))
		deleteQueue(t, b, "r")
		require.NoError(t, b.DeleteExchange("unrelated"))
		deleteQueue(t, b, "q")
		exExists(t, b, "ad")
		exExists(t, b, "adh")
	})
	t.Run("destination only", func(t *testing.T) {
		// Only bindings where the exchange is the source count.
		b := newBroker(t)
		exDeclare(t, b, "src", warren.ExchangeFanout)
		exDeclare(t, b, "ad", warren.ExchangeFanout, warren.AutoDelete())
		exBindX(t, b, "ad", "src", "", nil)
		require.NoError(t, b.UnbindExchange("ad", "src", "", nil))
		exExists(t, b, "ad")
		exBindX(t, b, "ad", "src", "", nil)
		require.NoError(t, b.DeleteExchange("src"))
		exExists(t, b, "ad")
	})
	t.Run("not auto-delete", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "plain", warren.ExchangeFanout)
		declare(t, b, "q")
		exBind(t, b, "q", "plain", "", nil)
		require.NoError(t, b.Unbind("q", "plain", "", nil))
		exExists(t, b, "plain")
	})
	t.Run("rebinding after auto-delete needs a redeclare", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "ad", warren.ExchangeFanout, warren.AutoDelete())
		declare(t, b, "q")
		exBind(t, b, "q", "ad", "", nil)
		require.NoError(t, b.Unbind("q", "ad", "", nil))
		require.ErrorIs(t, b.Bind("q", "ad", "", nil), warren.ErrNotFound)
	})
}

// R6.10, R6.13: deleting an exchange removes its bindings as source and as destination.
func TestRoutingDeleteExchangeRemovesBindings(t *testing.T) {
	b := newBroker(t)
	exDeclare(t, b, "A", warren.ExchangeFanout)
	exDeclare(t, b, "B", warren.ExchangeFanout)
	q := declare(t, b, "q")
	exBindX(t, b, "B", "A", "", nil)
	exBind(t, b, "q", "B", "", nil)
	require.ErrorIs(t, b.DeleteExchange("A", warren.IfUnused()), warren.ErrPreconditionFailed)
	exMust(t, b, "A", "", "before", warren.Mandatory())
	require.Equal(t, []string{"before"}, exBodies(t, q))

	// Delete B (the destination): A's binding to it goes, and a new B is not reached.
	require.NoError(t, b.DeleteExchange("B"))
	require.ErrorIs(t, exPub(t, b, "A", "", "no B", warren.Mandatory()), warren.ErrUnroutable)
	exDeclare(t, b, "B", warren.ExchangeFanout)
	exBind(t, b, "q", "B", "", nil)
	require.ErrorIs(t, exPub(t, b, "A", "", "new B not bound", warren.Mandatory()), warren.ErrUnroutable)
	exMust(t, b, "B", "", "new B", warren.Mandatory())
	require.Equal(t, []string{"new B"}, exBodies(t, q))
	require.NoError(t, b.DeleteExchange("A", warren.IfUnused())) // A has no binding left

	// Delete a source: its bindings go; a redeclared exchange of that name has none.
	require.NoError(t, b.DeleteExchange("B"))
	exDeclare(t, b, "B", warren.ExchangeFanout)
	require.ErrorIs(t, exPub(t, b, "B", "", "fresh B", warren.Mandatory()), warren.ErrUnroutable)
	require.Zero(t, q.Len())

	// Deleting a missing exchange succeeds.
	require.NoError(t, b.DeleteExchange("never"))
}

// R6.13: deleting a queue removes its bindings; re-declaring the name does not bring them back.
func TestRoutingDeleteQueueRemovesBindings(t *testing.T) {
	b := newBroker(t)
	declare(t, b, "q")
	exBind(t, b, "q", "amq.direct", "k", nil)
	exBind(t, b, "q", "amq.fanout", "", nil)
	exBind(t, b, "q", "amq.topic", "#", nil)
	exBind(t, b, "q", "amq.headers", "", nil)
	deleteQueue(t, b, "q")
	q := declare(t, b, "q")
	for _, x := range []string{"amq.direct", "amq.fanout", "amq.topic", "amq.headers"} {
		require.ErrorIs(t, exPub(t, b, x, "k", x, warren.Mandatory()), warren.ErrUnroutable, "exchange %q", x)
	}
	require.Zero(t, q.Len())
	// The default exchange reaches the new queue by name; an explicit rebind works.
	exMust(t, b, "", "q", "default", warren.Mandatory())
	exBind(t, b, "q", "amq.direct", "k", nil)
	exMust(t, b, "amq.direct", "k", "rebound", warren.Mandatory())
	require.Equal(t, []string{"default", "rebound"}, exBodies(t, q))
	// Binding a missing queue fails.
	require.ErrorIs(t, b.Bind("missing", "amq.direct", "k", nil), warren.ErrNotFound)
	require.ErrorIs(t, b.Bind("q", "missing", "k", nil), warren.ErrNotFound)
}

// R6.15: CC and BCC headers add routing keys; BCC is removed from the delivered message.
func TestRoutingCCBCC(t *testing.T) {
	newTopo := func(t *testing.T) (*warren.Broker, []*warren.Queue) {
		b := newBroker(t)
		exDeclare(t, b, "dx", warren.ExchangeDirect)
		var qs []*warren.Queue
		for _, k := range []string{"a", "b", "c", "d"} {
			qs = append(qs, declare(t, b, "q"+k))
			exBind(t, b, "q"+k, "dx", k, nil)
		}
		return b, qs
	}
	pub := func(t *testing.T, b *warren.Broker, exchange, key string, h warren.Table, opts ...warren.PublishOption) error {
		return b.Publish(t.Context(), exchange, key, warren.Message{Body: []byte("m"), Headers: h}, opts...)
	}

	t.Run("CC and BCC", func(t *testing.T) {
		b, qs := newTopo(t)
		h := warren.Table{"CC": []any{"b"}, "BCC": []string{"c"}, "app": "x"}
		require.NoError(t, pub(t, b, "dx", "a", h))
		require.Equal(t, []int{1, 1, 1, 0}, exLens(qs...))
		// The publisher's table is not modified.
		require.Equal(t, warren.Table{"CC": []any{"b"}, "BCC": []string{"c"}, "app": "x"}, h)
		for _, q := range qs[:3] {
			d := exOne(t, q)
			assert.Equal(t, "a", d.RoutingKey, "queue %q", q.Name())
			assert.Equal(t, "dx", d.Exchange)
			assert.NotContains(t, d.Message.Headers, "BCC", "queue %q", q.Name())
			assert.Equal(t, []any{"b"}, d.Message.Headers["CC"], "queue %q", q.Name())
			assert.Equal(t, "x", d.Message.Headers["app"], "queue %q", q.Name())
		}
	})
	t.Run("CC as []string", func(t *testing.T) {
		b, qs := newTopo(t)
		require.NoError(t, pub(t, b, "dx", "a", warren.Table{"CC": []string{"b", "c"}}))
		require.Equal(t, []int{1, 1, 1, 0}, exLens(qs...))
		d := exOne(t, qs[1])
		assert.Equal(t, []string{"b", "c"}, d.Message.Headers["CC"])
	})
	t.Run("BCC as []any only", func(t *testing.T) {
		b, qs := newTopo(t)
		h := warren.Table{"BCC": []any{"d", "c"}}
		require.NoError(t, pub(t, b, "dx", "zzz", h, warren.Mandatory()))
		require.Equal(t, []int{0, 0, 1, 1}, exLens(qs...))
		for _, q := range qs[2:] {
			d := exOne(t, q)
			assert.NotContains(t, d.Message.Headers, "BCC")
			assert.Equal(t, "zzz", d.RoutingKey)
		}
		require.Contains(t, h, "BCC")
	})
	t.Run("non-string entries ignored", func(t *testing.T) {
		b, qs := newTopo(t)
		require.NoError(t, pub(t, b, "dx", "a", warren.Table{"CC": []any{"b", 42, []byte("c")}}))
		require.Equal(t, []int{1, 1, 0, 0}, exLens(qs...))
	})
	t.Run("duplicates give one copy", func(t *testing.T) {
		b, qs := newTopo(t)
		require.NoError(t, pub(t, b, "dx", "a", warren.Table{"CC": []any{"a", "b", "b"}, "BCC": []any{"a", "b"}}))
		require.Equal(t, []int{1, 1, 0, 0}, exLens(qs...))
	})
	t.Run("CC routes an otherwise unroutable key", func(t *testing.T) {
		b, qs := newTopo(t)
		require.NoError(t, pub(t, b, "dx", "nope", warren.Table{"CC": []any{"d"}}, warren.Mandatory()))
		require.Equal(t, []int{0, 0, 0, 1}, exLens(qs...))
		require.ErrorIs(t, pub(t, b, "dx", "nope", warren.Table{"CC": []any{"nope2"}}, warren.Mandatory()), warren.ErrUnroutable)
	})
	t.Run("default exchange", func(t *testing.T) {
		b, qs := newTopo(t)
		require.NoError(t, pub(t, b, "", "qa", warren.Table{"CC": []any{"qb"}, "BCC": []any{"qc"}}, warren.Mandatory()))
		require.Equal(t, []int{1, 1, 1, 0}, exLens(qs...))
	})
	t.Run("topic", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "tx", warren.ExchangeTopic)
		q1 := declare(t, b, "q1")
		q2 := declare(t, b, "q2")
		exBind(t, b, "q1", "tx", "orders.*", nil)
		exBind(t, b, "q2", "tx", "audit.#", nil)
		require.NoError(t, pub(t, b, "tx", "orders.new", warren.Table{"BCC": []string{"audit.orders.new"}}, warren.Mandatory()))
		require.Equal(t, []int{1, 1}, exLens(q1, q2))
	})
}

// Exchange.Publish works like Broker.Publish; the delivery carries the publish's exchange and key.
func TestRoutingExchangePublish(t *testing.T) {
	b := newBroker(t)
	x := exDeclare(t, b, "px", warren.ExchangeDirect)
	q := declare(t, b, "q")
	exBind(t, b, "q", "px", "k", nil)

	require.NoError(t, x.Publish(t.Context(), "k", warren.Message{Body: []byte("handle")}, warren.Mandatory()))
	require.NoError(t, b.Publish(t.Context(), "px", "k", warren.Message{Body: []byte("broker")}, warren.Mandatory()))
	ds := exTake(t, q)
	require.Len(t, ds, 2)
	for i, body := range []string{"handle", "broker"} {
		assert.Equal(t, body, string(ds[i].Message.Body))
		assert.Equal(t, "px", ds[i].Exchange)
		assert.Equal(t, "k", ds[i].RoutingKey)
	}
	require.ErrorIs(t, x.Publish(t.Context(), "none", warren.Message{}, warren.Mandatory()), warren.ErrUnroutable)
	require.NoError(t, x.Publish(t.Context(), "none", warren.Message{}))
	require.Zero(t, q.Len())

	// The default exchange's handle.
	def, err := b.Exchange("")
	require.NoError(t, err)
	require.NoError(t, def.Publish(t.Context(), "q", warren.Message{Body: []byte("default")}, warren.Mandatory()))
	d := exOne(t, q)
	assert.Equal(t, "", d.Exchange)
	assert.Equal(t, "q", d.RoutingKey)

	// A done context fails the publish and enqueues nothing.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, x.Publish(ctx, "k", warren.Message{}), context.Canceled)
	require.ErrorIs(t, b.Publish(ctx, "px", "k", warren.Message{}), context.Canceled)
	require.Zero(t, q.Len())

	// A routing key over 255 bytes is refused.
	require.ErrorIs(t, x.Publish(t.Context(), strings.Repeat("k", 256), warren.Message{}), warren.ErrInvalidArgument)

	// After deletion the handle fails, even once the name is declared again.
	require.NoError(t, b.DeleteExchange("px"))
	require.ErrorIs(t, x.Publish(t.Context(), "k", warren.Message{}), warren.ErrNotFound)
	x2 := exDeclare(t, b, "px", warren.ExchangeDirect)
	require.NotSame(t, x, x2)
	exBind(t, b, "q", "px", "k", nil)
	require.ErrorIs(t, x.Publish(t.Context(), "k", warren.Message{}), warren.ErrNotFound)
	require.NoError(t, x2.Publish(t.Context(), "k", warren.Message{Body: []byte("new")}, warren.Mandatory()))
	require.Equal(t, []string{"new"}, exBodies(t, q))

	// Publishing to a missing exchange.
	require.ErrorIs(t, exPub(t, b, "missing", "k", "x"), warren.ErrNotFound)
}

// Bind is idempotent; Unbind needs the same key and arguments and succeeds when nothing matches.
func TestRoutingBindUnbind(t *testing.T) {
	t.Run("bind twice is one binding", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "dx", warren.ExchangeDirect)
		q := declare(t, b, "q")
		exBind(t, b, "q", "dx", "k", nil)
		exBind(t, b, "q", "dx", "k", warren.Table{}) // nil and empty arguments are the same
		exMust(t, b, "dx", "k", "one copy", warren.Mandatory())
		require.Equal(t, []string{"one copy"}, exBodies(t, q))
		// One Unbind removes it: there was only one binding.
		require.NoError(t, b.Unbind("q", "dx", "k", nil))
		require.ErrorIs(t, exPub(t, b, "dx", "k", "gone", warren.Mandatory()), warren.ErrUnroutable)
	})
	t.Run("bind twice with arguments", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "tx", warren.ExchangeTopic)
		q := declare(t, b, "q")
		exBind(t, b, "q", "tx", "a.#", warren.Table{"tag": "v"})
		exBind(t, b, "q", "tx", "a.#", warren.Table{"tag": "v"})
		exMust(t, b, "tx", "a.b", "one copy", warren.Mandatory())
		require.Equal(t, []string{"one copy"}, exBodies(t, q))
		require.NoError(t, b.Unbind("q", "tx", "a.#", warren.Table{"tag": "v"}))
		require.ErrorIs(t, exPub(t, b, "tx", "a.b", "gone", warren.Mandatory()), warren.ErrUnroutable)
	})
	t.Run("bind exchange twice", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "A", warren.ExchangeFanout)
		exDeclare(t, b, "B", warren.ExchangeFanout)
		q := declare(t, b, "q")
		exBindX(t, b, "B", "A", "", nil)
		exBindX(t, b, "B", "A", "", nil)
		exBind(t, b, "q", "B", "", nil)
		exMust(t, b, "A", "", "one copy", warren.Mandatory())
		require.Equal(t, []string{"one copy"}, exBodies(t, q))
		require.NoError(t, b.UnbindExchange("B", "A", "", nil))
		require.ErrorIs(t, exPub(t, b, "A", "", "gone", warren.Mandatory()), warren.ErrUnroutable)
		require.NoError(t, b.UnbindExchange("B", "A", "", nil)) // missing: succeeds
	})
	t.Run("unbind missing binding succeeds", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "dx", warren.ExchangeDirect)
		q := declare(t, b, "q")
		require.NoError(t, b.Unbind("q", "dx", "never", nil))
		exBind(t, b, "q", "dx", "k", nil)
		require.NoError(t, b.Unbind("q", "dx", "other", nil))
		require.NoError(t, b.Unbind("q", "amq.direct", "k", nil))
		exMust(t, b, "dx", "k", "kept", warren.Mandatory())
		require.Equal(t, []string{"kept"}, exBodies(t, q))
	})
	t.Run("unbind from a missing queue or exchange succeeds", func(t *testing.T) {
		// As RabbitMQ's queue.unbind and exchange.unbind do; binding to one stays ErrNotFound.
		b := newBroker(t)
		exDeclare(t, b, "dx", warren.ExchangeDirect)
		q := declare(t, b, "q")
		exBind(t, b, "q", "dx", "k", nil)
		require.NoError(t, b.Unbind("missing", "dx", "k", nil), "Unbind from a missing queue")
		require.NoError(t, b.Unbind("q", "missing", "k", nil), "Unbind from a missing exchange")
		require.NoError(t, b.UnbindExchange("dx", "missing", "k", nil), "UnbindExchange from a missing source")
		require.NoError(t, b.UnbindExchange("missing", "dx", "k", nil), "UnbindExchange of a missing destination")
		require.ErrorIs(t, b.Bind("missing", "dx", "k", nil), warren.ErrNotFound)
		require.ErrorIs(t, b.Bind("q", "missing", "k", nil), warren.ErrNotFound)
		require.ErrorIs(t, b.Unbind("q", "", "q", nil), warren.ErrAccessRefused, "the default exchange's bindings are not the caller's")
		exMust(t, b, "dx", "k", "kept", warren.Mandatory())
		require.Equal(t, []string{"kept"}, exBodies(t, q))
	})
	t.Run("unbind with different arguments does not remove", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "dx", warren.ExchangeDirect)
		q := declare(t, b, "q")
		exBind(t, b, "q", "dx", "k", warren.Table{"v": "1"})
		for _, args := range []warren.Table{nil, {"v": "2"}, {"v": "1", "w": "1"}, {"w": "1"}} {
			require.NoError(t, b.Unbind("q", "dx", "k", args), "args %v", args)
			exMust(t, b, "dx", "k", "kept", warren.Mandatory())
		}
		require.NoError(t, b.Unbind("q", "dx", "k", warren.Table{"v": "1"}))
		require.ErrorIs(t, exPub(t, b, "dx", "k", "gone", warren.Mandatory()), warren.ErrUnroutable)
		require.Equal(t, 4, q.Len())
	})
	t.Run("headers arguments", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "hx", warren.ExchangeHeaders)
		q := declare(t, b, "q")
		args := warren.Table{"x-match": "any", "a": "1", "b": "2"}
		exBind(t, b, "q", "hx", "", args)
		exBind(t, b, "q", "hx", "", warren.Table{"x-match": "any", "b": "2", "a": "1"})
		msg := warren.Message{Body: []byte("m"), Headers: warren.Table{"a": "1", "b": "2"}}
		require.NoError(t, b.Publish(t.Context(), "hx", "", msg, warren.Mandatory()))
		require.Equal(t, 1, q.Len())
		require.NoError(t, b.Unbind("q", "hx", "", warren.Table{"x-match": "all", "a": "1", "b": "2"}))
		require.NoError(t, b.Publish(t.Context(), "hx", "", msg, warren.Mandatory()))
		require.Equal(t, 2, q.Len())
		require.NoError(t, b.Unbind("q", "hx", "", args))
		require.ErrorIs(t, b.Publish(t.Context(), "hx", "", msg, warren.Mandatory()), warren.ErrUnroutable)
	})
	t.Run("separate bindings per key", func(t *testing.T) {
		b := newBroker(t)
		exDeclare(t, b, "dx", warren.ExchangeDirect)
		q := declare(t, b, "q")
		exBind(t, b, "q", "dx", "a", nil)
		exBind(t, b, "q", "dx", "b", nil)
		require.NoError(t, b.Unbind("q", "dx", "a", nil))
		require.ErrorIs(t, exPub(t, b, "dx", "a", "a", warren.Mandatory()), warren.ErrUnroutable)
		exMust(t, b, "dx", "b", "b", warren.Mandatory())
		require.Equal(t, []string{"b"}, exBodies(t, q))
	})
	t.Run("key too long", func(t *testing.T) {
		b := newBroker(t)
		declare(t, b, "q")
		require.ErrorIs(t, b.Bind("q", "amq.direct", strings.Repeat("k", 256), nil), warren.ErrInvalidArgument)
		exBind(t, b, "q", "amq.direct", strings.Repeat("k", 255), nil)
		exMust(t, b, "amq.direct", strings.Repeat("k", 255), "max", warren.Mandatory())
	})
}

// R6.12: equivalent redeclarations return the same entity.
func TestRoutingDeclareEquivalent(t *testing.T) {
	b := newBroker(t)
	x1 := exDeclare(t, b, "eq", warren.ExchangeTopic, warren.Durable(), warren.AlternateExchange("ae"))
	x2 := exDeclare(t, b, "eq", warren.ExchangeTopic, warren.Durable(),
		warren.Arguments(warren.Table{"alternate-exchange": "ae", "unknown": 1}))
	require.Same(t, x1, x2)
	x3, err := b.Exchange("eq")
	require.NoError(t, err)
	require.Same(t, x1, x3)

	// Inequivalent: refused, existing exchange unchanged.
	_, err = b.DeclareExchange("eq", warren.ExchangeDirect, warren.Durable(), warren.AlternateExchange("ae"))
	require.ErrorIs(t, err, warren.ErrPreconditionFailed)
	_, err = b.DeclareExchange("eq", warren.ExchangeTopic, warren.Durable())
	require.ErrorIs(t, err, warren.ErrPreconditionFailed)
	require.Equal(t, warren.ExchangeTopic, x1.Kind())

	// A predeclared exchange redeclared equivalently.
	amq, err := b.Exchange("amq.topic")
	require.NoError(t, err)
	amq2 := exDeclare(t, b, "amq.topic", warren.ExchangeTopic, warren.Durable())
	require.Same(t, amq, amq2)

	q1 := declare(t, b, "eqq", warren.Durable(), warren.Arguments(warren.Table{"x-max-length": int32(10)}))
	q2 := declare(t, b, "eqq", warren.Durable(), warren.Arguments(warren.Table{"x-max-length": int32(10)}))
	require.Same(t, q1, q2)
	q3, err := b.Queue("eqq")
	require.NoError(t, err)
	require.Same(t, q1, q3)

	// Bindings survive an equivalent redeclaration.
	exBind(t, b, "eqq", "eq", "a.*", nil)
	exDeclare(t, b, "eq", warren.ExchangeTopic, warren.Durable(), warren.AlternateExchange("ae"))
	declare(t, b, "eqq", warren.Durable(), warren.Arguments(warren.Table{"x-max-length": int32(10)}))
	exMust(t, b, "eq", "a.b", "kept", warren.Mandatory())
	require.Equal(t, []string{"kept"}, exBodies(t, q1))
}

// R6.14: server-named queues.
func TestRoutingServerNamedQueue(t *testing.T) {
	b := newBroker(t)
	seen := map[string]bool{}
	var qs []*warren.Queue
	for range 20 {
		q := declare(t, b, "")
		require.True(t, strings.HasPrefix(q.Name(), "amq.gen-"), q.Name())
		require.Greater(t, len(q.Name()), len("amq.gen-"))
		require.False(t, seen[q.Name()], "duplicate name %q", q.Name())
		seen[q.Name()] = true
		qs = append(qs, q)
	}
	for i, q := range qs {
		got, err := b.Queue(q.Name())
		require.NoError(t, err)
		require.Same(t, q, got)
		exMust(t, b, "", q.Name(), q.Name(), warren.Mandatory())
		for j, o := range qs {
			want := 0
			if j == i {
				want = 1
			}
			require.Equal(t, want, o.Len(), "published to %q", q.Name())
		}
		d := exOne(t, q)
		assert.Equal(t, q.Name(), d.RoutingKey)
	}
	// Bindable by its name.
	exBind(t, b, qs[0].Name(), "amq.fanout", "", nil)
	exMust(t, b, "amq.fanout", "", "fanout", warren.Mandatory())
	require.Equal(t, []string{"fanout"}, exBodies(t, qs[0]))
	// The user cannot declare an "amq." name.
	_, err := b.DeclareQueue("amq.gen-mine")
	require.ErrorIs(t, err, warren.ErrAccessRefused)
}

// Queues and Exchanges iterate sorted by name.
func TestRoutingIterationSorted(t *testing.T) {
	b := newBroker(t)
	names := []string{"m", "b", "z", "a", "B", "a.b", "a-b"}
	for _, n := range names {
		declare(t, b, n)
		exDeclare(t, b, "x"+n, warren.ExchangeFanout)
	}
	gen := declare(t, b, "").Name()

	var qnames []string
	for q := range b.Queues() {
		qnames = append(qnames, q.Name())
	}
	wantQ := append(slices.Clone(names), gen)
	slices.Sort(wantQ)
	require.Equal(t, wantQ, qnames)

	var xnames []string
	for x := range b.Exchanges() {
		xnames = append(xnames, x.Name())
	}
	wantX := []string{"", "amq.direct", "amq.fanout", "amq.headers", "amq.match", "amq.topic"}
	for _, n := range names {
		wantX = append(wantX, "x"+n)
	}
	slices.Sort(wantX)
	require.Equal(t, wantX, xnames)

	// Deleted entities are no longer listed.
	deleteQueue(t, b, "m")
	require.NoError(t, b.DeleteExchange("xm"))
	qnames = qnames[:0]
	for q := range b.Queues() {
		qnames = append(qnames, q.Name())
	}
	require.NotContains(t, qnames, "m")
	require.True(t, slices.IsSorted(qnames))
	for x := range b.Exchanges() {
		require.NotEqual(t, "xm", x.Name())
	}
}

package warren_test

import (
	"reflect"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of dead-lettering (deadletter.go) through the public API: where a dead letter goes (the
// dead-letter exchange and routing key, CC and BCC), cycles, a missing exchange or a full target,
// and the x-death history Message.Deaths reads. deadletter_test.go, in package warren, tests the
// x-death bookkeeping from inside.

// TestRetryTopology: a consumer of main rejects; main dead-letters to a retry queue with a TTL,
// whose dead-letter exchange sends the message back to main. Each round adds to the same two
// x-death entries: count 1, 2, 3 (R4.4); a reject in the loop means no cycle (R4.7).
func TestRetryTopology(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		_, err := b.DeclareExchange("retry-x", warren.ExchangeFanout)
		require.NoError(t, err)
		main := declare(t, b, "main", warren.DeadLetter("retry-x", ""))
		declare(t, b, "retry", warren.MessageTTL(10*time.Second), warren.DeadLetter("", "main"))
		require.NoError(t, b.Bind("retry", "retry-x", "", nil))
		require.NoError(t, b.Publish(t.Context(), "", "main", warren.Message{Body: []byte("job")}))

		c, err := main.Consume(t.Context(), warren.Prefetch(1))
		require.NoError(t, err)
		start := time.Now()
		for round := 1; round <= 3; round++ {
			d := <-c.Deliveries()
			require.Equal(t, 10*time.Second*time.Duration(round-1), time.Since(start), "round %d arrives after the retry delay", round)
			if round > 1 {
				deaths := xDeath(t, d)
				require.Len(t, deaths, 2)
				require.Equal(t, "retry", deaths[0]["queue"])
				require.Equal(t, "expired", deaths[0]["reason"])
				require.Equal(t, int64(round-1), deaths[0]["count"])
				require.Equal(t, "main", deaths[1]["queue"])
				require.Equal(t, "rejected", deaths[1]["reason"])
				require.Equal(t, int64(round-1), deaths[1]["count"])
				require.Equal(t, "", d.Exchange, "back through the default exchange")
				require.Equal(t, "main", d.RoutingKey, "under the dead-letter routing key")
				require.Equal(t, "rejected", d.Message.Headers["x-first-death-reason"])
				require.Equal(t, "expired", d.Message.Headers["x-last-death-reason"])
			}
			require.NoError(t, d.Reject())
		}
		d := <-c.Deliveries()
		require.Equal(t, int64(3), xDeath(t, d)[0]["count"])
		require.NoError(t, d.Ack())
	})
}

// TestDeadLetterCycleToItself: a queue with a TTL whose dead-letter exchange is the default
// exchange, with no dead-letter routing key, dead-letters to itself: the cycle is cut and the
// message dropped (R4.7).
func TestDeadLetterCycleToItself(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.MessageTTL(time.Second), warren.DeadLetter("", ""))
		publishN(t, b, q, 1)
		time.Sleep(time.Second)
		synctest.Wait()
		require.Equal(t, 0, q.Len(), "expired into itself: cut")
		time.Sleep(time.Hour)
		synctest.Wait()
		require.Equal(t, 0, q.Len())
	})
}

// TestDeadLetterRejectToItself: the same loop driven by a consumer's reject is not a cycle: the
// message comes back as a new message, its x-death count growing (R4.7).
func TestDeadLetterRejectToItself(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q", warren.DeadLetter("", ""))
	publishN(t, b, q, 1)
	for round := 1; round <= 3; round++ {
		d, err := q.Get(t.Context())
		require.NoError(t, err)
		require.False(t, d.Redelivered, "a dead-lettered copy is a new message")
		require.NoError(t, d.Reject())
		require.Equal(t, 1, q.Len())
	}
	d, err := q.Get(t.Context(), warren.AutoAck())
	require.NoError(t, err)
	deaths := xDeath(t, d)
	require.Len(t, deaths, 1)
	require.Equal(t, int64(3), deaths[0]["count"])
}

// TestRejectWithoutRequeueDeadLetters: Reject and RejectUpTo dead-letter with reason rejected,
// in the order rejected (R4.2, R4.9); without a dead-letter exchange they drop.
func TestRejectWithoutRequeueDeadLetters(t *testing.T) {
	b := newBroker(t)
	main, dead := deadTopology(t, b)
	c, err := main.Consume(t.Context(), warren.Prefetch(5))
	require.NoError(t, err)
	publishN(t, b, main, 5)
	ds := receive(t, c, 5)
	require.NoError(t, ds[3].Reject())
	require.NoError(t, c.RejectUpTo(ds[2].DeliveryTag))
	require.NoError(t, ds[4].Reject())
	got := getAll(t, dead)
	require.Equal(t, "3 0 1 2 4", bodies(got))
	for _, d := range got {
		require.Equal(t, "rejected", xDeath(t, d)[0]["reason"])
	}
}

// TestDeadLetterRoutingKeys: with a dead-letter routing key the copy goes under that key and loses
// its CC header; without one it goes under its own routing key and CC keys (R4.3).
func TestDeadLetterRoutingKeys(t *testing.T) {
	b := newBroker(t)
	_, err := b.DeclareExchange("dlx", warren.ExchangeDirect)
	require.NoError(t, err)
	for _, name := range []string{"by-key", "by-cc", "fixed"} {
		declare(t, b, name)
		require.NoError(t, b.Bind(name, "dlx", name, nil))
	}
	own := declare(t, b, "own", warren.DeadLetter("dlx", ""))
	fixed := declare(t, b, "fixed-src", warren.DeadLetter("dlx", "fixed"))
	require.NoError(t, b.Bind("own", "amq.direct", "by-key", nil))
	require.NoError(t, b.Bind("fixed-src", "amq.direct", "by-key", nil))

	msg := warren.Message{Body: []byte("m"), Headers: warren.Table{"CC": []any{"by-cc"}}}
	require.NoError(t, b.Publish(t.Context(), "amq.direct", "by-key", msg))
	for _, q := range []*warren.Queue{own, fixed} {
		d, err := q.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, d.Reject())
	}
	get := func(name string) warren.Delivery {
		q, err := b.Queue(name)
		require.NoError(t, err)
		d, err := q.Get(t.Context(), warren.AutoAck())
		require.NoError(t, err, "queue %s", name)
		return d
	}
	byKey, byCC, fx := get("by-key"), get("by-cc"), get("fixed")
	require.Equal(t, "by-key", byKey.RoutingKey)
	require.Equal(t, byKey.Message, byCC.Message, "one message, routed by key and CC")
	require.Equal(t, reflect.ValueOf(byKey.Message.Headers).Pointer(), reflect.ValueOf(byCC.Message.Headers).Pointer(),
		"one copy of its headers, x-death included")
	require.Equal(t, []any{"by-key", "by-cc"}, xDeath(t, byKey)[0]["routing-keys"])
	require.Equal(t, "amq.direct", xDeath(t, byKey)[0]["exchange"])
	require.Equal(t, "fixed", fx.RoutingKey)
	require.NotContains(t, fx.Message.Headers, "CC", "a dead-letter routing key drops CC")
	require.Equal(t, "dlx", fx.Exchange)
	for _, name := range []string{"by-key", "by-cc", "fixed"} {
		q, _ := b.Queue(name)
		require.Equal(t, 0, q.Len(), "queue %s got one copy", name)
	}
}

// TestDeadLetterExchangeMissing: a missing dead-letter exchange drops the message; declaring the
// exchange later makes later dead letters work (R4.8).
func TestDeadLetterExchangeMissing(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q", warren.DeadLetter("later", ""))
	publishN(t, b, q, 2)
	d, err := q.Get(t.Context())
	require.NoError(t, err)
	require.NoError(t, d.Reject())
	require.Equal(t, 1, q.Len())

	_, err = b.DeclareExchange("later", warren.ExchangeFanout)
	require.NoError(t, err)
	dead := declare(t, b, "dead")
	require.NoError(t, b.Bind("dead", "later", "", nil))
	d, err = q.Get(t.Context())
	require.NoError(t, err)
	require.NoError(t, d.Reject())
	require.Equal(t, "1", bodies(getAll(t, dead)))
}

// TestDeadLetterRoutedByBCC: BCC keys are stripped from the delivered message but route its
// dead-lettered copy, as the routing key and CC keys do; the copy's x-death routing keys leave
// them out (R4.3, R4.4, R6.15).
func TestDeadLetterRoutedByBCC(t *testing.T) {
	b := newBroker(t)
	_, err := b.DeclareExchange("dlx", warren.ExchangeDirect)
	require.NoError(t, err)
	secret := declare(t, b, "hidden") // not "secret": the default exchange would route the BCC key to it
	require.NoError(t, b.Bind("hidden", "dlx", "secret", nil))
	src := declare(t, b, "src", warren.DeadLetter("dlx", ""))
	require.NoError(t, b.Publish(t.Context(), "", "src", warren.Message{Body: []byte("m"), Headers: warren.Table{"BCC": []any{"secret"}}}))
	d, err := src.Get(t.Context())
	require.NoError(t, err)
	require.NotContains(t, d.Message.Headers, "BCC")
	require.NoError(t, d.Reject())
	got := getAll(t, secret)
	require.Equal(t, "m", bodies(got))
	require.Equal(t, []any{"src"}, xDeath(t, got[0])[0]["routing-keys"])
	require.NotContains(t, got[0].Message.Headers, "BCC")
}

// Deaths reads the x-death history newest first, with the counts, reasons, queues, exchanges
// and routing keys RabbitMQ records: a message rejected from q, then from dlq (back to q), then
// from q again has {q, rejected, 2} moved to the front and {dlq, rejected, 1} after it.
func TestMessageDeaths(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.DeadLetter("", "dlq"))
		dlq := declare(t, b, "dlq", warren.DeadLetter("", "q"))
		start := time.Now()
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("m"), Expiration: "60000"}))
		reject := func(from *warren.Queue) *warren.Message {
			t.Helper()
			d, err := from.Get(t.Context())
			require.NoError(t, err)
			require.NoError(t, d.Reject())
			return &d.Message
		}
		require.Nil(t, reject(q).Deaths(), "a message never dead-lettered has no history")
		time.Sleep(time.Minute / 2)
		reject(dlq)
		time.Sleep(time.Minute / 2)
		reject(q)
		d, err := dlq.Get(t.Context())
		require.NoError(t, err)
		deaths := d.Message.Deaths()
		require.Len(t, deaths, 2)
		require.Equal(t, warren.Death{
			Queue: "q", Reason: "rejected", Count: 2, Time: start.Truncate(time.Second),
			Exchange: "", RoutingKeys: []string{"q"}, OriginalExpiration: "60000",
		}, deaths[0])
		require.Equal(t, "dlq", deaths[1].Queue)
		require.Equal(t, int64(1), deaths[1].Count)
		require.Equal(t, []string{"dlq"}, deaths[1].RoutingKeys)
		require.Equal(t, start.Add(time.Minute/2).Truncate(time.Second), deaths[1].Time)
	})
}

// Deaths reads a header written by someone else as far as it has RabbitMQ's shape, and never
// panics on one that does not.
func TestMessageDeathsForeignHeader(t *testing.T) {
	when := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m := warren.Message{Headers: warren.Table{"x-death": []any{
		"not a table",
		warren.Table{"queue": "a", "reason": "expired", "count": int32(3), "time": when, "routing-keys": []string{"k"}},
		warren.Table{"queue": 7, "count": "many", "routing-keys": []any{"x", 1}},
	}}}
	require.Equal(t, []warren.Death{
		{Queue: "a", Reason: "expired", Count: 3, Time: when, RoutingKeys: []string{"k"}},
		{RoutingKeys: []string{"x"}},
	}, m.Deaths())
	for _, h := range []warren.Table{nil, {"x-death": "junk"}, {"x-death": []any{}}} {
		require.Nil(t, (&warren.Message{Headers: h}).Deaths())
	}
}

// TestDeadLetterIntoFullBlockQueue: a dead letter never waits for room: into a full Block queue
// it is dropped, and the Reject that caused it returns.
func TestDeadLetterIntoFullBlockQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		_, err := b.DeclareExchange("e-dead", warren.ExchangeFanout)
		require.NoError(t, err)
		dead := declare(t, b, "dead", warren.MaxLength(1), warren.Overflow(warren.Block))
		require.NoError(t, b.Bind("dead", "e-dead", "", nil))
		main := declare(t, b, "main", warren.DeadLetter("e-dead", ""))
		publishN(t, b, dead, 1)
		publishN(t, b, main, 2)
		for range 2 {
			d, err := main.Get(t.Context())
			require.NoError(t, err)
			require.NoError(t, d.Reject())
		}
		require.Equal(t, 1, dead.Len())
		require.Equal(t, 0, main.Len())
	})
}

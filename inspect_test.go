package warren_test

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

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
			return d.Message
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

// Browse yields the ready messages in delivery order without consuming them — returned ones in
// their places, priorities honoured, outstanding and expired ones left out — and stops when told.
func TestQueueBrowse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.MaxPriority(2))
		for i, p := range []uint8{0, 0, 2, 0} {
			m := warren.Message{Body: []byte{'0' + byte(i)}, Priority: p}
			if i == 3 {
				m.Expiration = "1000"
			}
			require.NoError(t, b.Publish(t.Context(), "", "q", m))
		}
		d, err := q.Get(t.Context()) // "2", the highest priority
		require.NoError(t, err)
		held, err := q.Get(t.Context()) // "0"
		require.NoError(t, err)
		require.NoError(t, d.Nack())
		browse := func() string {
			var s []byte
			for m := range q.Browse() {
				s = append(s, m.Body...)
			}
			return string(s)
		}
		require.Equal(t, "213", browse(), "\"0\" is outstanding; \"2\" is back in its place")
		require.Equal(t, 3, q.Len(), "browsing consumes nothing")
		var first []string
		for m := range q.Browse() {
			first = append(first, string(m.Body))
			break
		}
		require.Equal(t, []string{"2"}, first)
		time.Sleep(time.Second)
		require.Equal(t, "21", browse(), "the expired message is not shown")
		require.NoError(t, held.Nack())
		require.Equal(t, "201", browse())
		deleteQueue(t, b, "q")
		require.Empty(t, slices.Collect(q.Browse()), "a deleted queue yields nothing")
	})
}

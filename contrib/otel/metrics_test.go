package warrenotel_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/warrenmq/warren"
	warrenotel "github.com/warrenmq/warren/contrib/otel"
)

// point is one collected series: its value, and what kind of instrument it came from.
type point struct {
	value float64
	kind  string // "counter", "updown" or "gauge"
	unit  string
}

// collection is what one collection read: by instrument name, by queue ("" for the broker's).
type collection map[string]map[string]point

// newMetrics registers b's metrics with a manual reader, and returns a function that collects.
func newMetrics(t *testing.T, b *warren.Broker) (*warrenotel.Metrics, func() collection) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { require.NoError(t, mp.Shutdown(context.Background())) })
	m, err := warrenotel.NewMetrics(b, warrenotel.WithMeterProvider(mp))
	require.NoError(t, err)
	return m, func() collection {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(context.Background(), &rm))
		c := collection{}
		for _, sm := range rm.ScopeMetrics {
			require.Equal(t, warrenotel.ScopeName, sm.Scope.Name)
			for _, m := range sm.Metrics {
				series := map[string]point{}
				add := func(queue string, v float64, kind string) {
					_, dup := series[queue]
					require.False(t, dup, "%s: two series for queue %q", m.Name, queue)
					series[queue] = point{v, kind, m.Unit}
				}
				switch data := m.Data.(type) {
				case metricdata.Sum[int64]:
					require.Equal(t, metricdata.CumulativeTemporality, data.Temporality, m.Name)
					kind := "updown"
					if data.IsMonotonic {
						kind = "counter"
					}
					for _, dp := range data.DataPoints {
						q, _ := dp.Attributes.Value(warrenotel.QueueKey)
						add(q.AsString(), float64(dp.Value), kind)
					}
				case metricdata.Gauge[float64]:
					for _, dp := range data.DataPoints {
						q, _ := dp.Attributes.Value(warrenotel.QueueKey)
						add(q.AsString(), dp.Value, "gauge")
					}
				default:
					t.Fatalf("%s: data of type %T", m.Name, m.Data)
				}
				if len(series) > 0 {
					c[m.Name] = series
				}
			}
		}
		return c
	}
}

// must fails the test on an error.
func must(t *testing.T, err error) {
	t.Helper()
	require.NoError(t, err)
}

// TestMetrics: every instrument, on a broker where each reads something, in virtual time so
// that the oldest message's age is exact:
//
//	orders: 6 published; 3 acked, 1 nacked and redelivered (held), 1 rejected and dead-lettered
//	        into dead, 1 ready since the start, 3 s ago
//	dead:   the rejected order
//	events: TTL 0 and no consumer: both messages expire at once
//	capped: max length 1: the second message drops the first; a third is delayed an hour (it
//	        entered the queue, hidden)
//	idle:   one consumer, nothing else
//	parked: two messages; the first moved into redriven (Queue.Move, a redrive)
//
// plus one publish to a queue that does not exist (unroutable) and a declared exchange.
func TestMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		b := newBroker(t)
		_, err := b.DeclareExchange("dlx", warren.ExchangeFanout)
		must(t, err)
		declare(t, b, "dead")
		must(t, b.Bind("dead", "dlx", "", nil))
		orders := declare(t, b, "orders", warren.DeadLetter("dlx", ""))
		publish := func(queue, body string, opts ...warren.PublishOption) {
			must(t, b.Publish(ctx, "", queue, warren.Message{Body: []byte(body)}, opts...))
		}
		for range 6 {
			publish("orders", "order")
		}
		var ds []warren.Delivery
		for range 5 {
			d, err := orders.Get(ctx)
			must(t, err)
			ds = append(ds, d)
		}
		must(t, ds[0].Ack())
		must(t, ds[1].Ack())
		must(t, ds[2].Ack())
		must(t, ds[3].Nack())
		must(t, ds[4].Reject())
		again, err := orders.Get(ctx)
		must(t, err)
		require.True(t, again.Redelivered)

		declare(t, b, "events", warren.MessageTTL(0))
		publish("events", "e1")
		publish("events", "e2")
		declare(t, b, "capped", warren.MaxLength(1))
		publish("capped", "first")
		publish("capped", "second")
		publish("capped", "later", warren.DeliverAfter(time.Hour))
		idle := declare(t, b, "idle")
		_, err = idle.Consume(ctx)
		must(t, err)
		parked := declare(t, b, "parked")
		declare(t, b, "redriven")
		publish("parked", "p1")
		publish("parked", "p2")
		moved, err := parked.Move(ctx, "", "redriven", warren.MoveLimit(1))
		must(t, err)
		require.Equal(t, 1, moved)
		publish("nowhere", "lost")
		time.Sleep(3 * time.Second)
		synctest.Wait()

		_, collect := newMetrics(t, b)
		exchanges := 0
		for range b.Exchanges() {
			exchanges++
		}
		// By instrument: its kind, unit, and value for orders, dead, events, capped, idle,
		// parked, redriven.
		type want struct {
			kind, unit                                           string
			orders, dead, events, capped, idle, parked, redriven float64
		}
		queues := map[string]want{
			"warren.queue.messages.ready":         {"updown", "{message}", 1, 1, 0, 1, 0, 1, 1},
			"warren.queue.messages.unacked":       {"updown", "{message}", 1, 0, 0, 0, 0, 0, 0},
			"warren.queue.messages.delayed":       {"updown", "{message}", 0, 0, 0, 1, 0, 0, 0},
			"warren.queue.consumers":              {"updown", "{consumer}", 0, 0, 0, 0, 1, 0, 0},
			"warren.queue.ready.size":             {"updown", "By", 5, 5, 0, 6, 0, 2, 2},
			"warren.queue.messages.oldest.age":    {"gauge", "s", 3, 3, 0, 3, 0, 3, 3},
			"warren.queue.messages.enqueued":      {"counter", "{message}", 6, 1, 2, 3, 0, 2, 1},
			"warren.queue.messages.delivered":     {"counter", "{delivery}", 6, 0, 0, 0, 0, 0, 0},
			"warren.queue.messages.redelivered":   {"counter", "{delivery}", 1, 0, 0, 0, 0, 0, 0},
			"warren.queue.messages.acked":         {"counter", "{delivery}", 3, 0, 0, 0, 0, 0, 0},
			"warren.queue.messages.nacked":        {"counter", "{delivery}", 1, 0, 0, 0, 0, 0, 0},
			"warren.queue.messages.rejected":      {"counter", "{delivery}", 1, 0, 0, 0, 0, 0, 0},
			"warren.queue.messages.expired":       {"counter", "{message}", 0, 0, 2, 0, 0, 0, 0},
			"warren.queue.messages.dead_lettered": {"counter", "{message}", 1, 0, 0, 0, 0, 0, 0},
			"warren.queue.messages.dropped":       {"counter", "{message}", 0, 0, 0, 1, 0, 0, 0},
			"warren.queue.messages.moved":         {"counter", "{message}", 0, 0, 0, 0, 0, 1, 0},
		}
		got := collect()
		require.Len(t, got, len(queues)+2, "every instrument reports")
		for name, w := range queues {
			series := got[name]
			require.Len(t, series, 7, "%s: one series per queue", name)
			for queue, v := range map[string]float64{"orders": w.orders, "dead": w.dead, "events": w.events,
				"capped": w.capped, "idle": w.idle, "parked": w.parked, "redriven": w.redriven} {
				assert.Equal(t, point{v, w.kind, w.unit}, series[queue], "%s{queue=%q}", name, queue)
			}
		}
		require.Equal(t, map[string]point{"": {float64(exchanges), "updown", "{exchange}"}}, got["warren.exchanges"])
		require.Equal(t, map[string]point{"": {1, "counter", "{message}"}}, got["warren.messages.unroutable"])
	})
}

// TestMetricsFollowTheBroker: each collection takes a new snapshot: a queue declared appears, a
// queue deleted disappears, counters move.
func TestMetricsFollowTheBroker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		_, collect := newMetrics(t, b)
		require.NotContains(t, collect(), "warren.queue.messages.ready", "no queue, no series")

		q := declare(t, b, "q")
		must(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("m")}))
		require.Equal(t, float64(1), collect()["warren.queue.messages.enqueued"]["q"].value)
		must(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("m")}))
		require.Equal(t, float64(2), collect()["warren.queue.messages.enqueued"]["q"].value)
		require.Equal(t, float64(2), collect()["warren.queue.messages.ready"]["q"].value)

		_, err := b.DeleteQueue(q.Name())
		must(t, err)
		got := collect()
		require.NotContains(t, got, "warren.queue.messages.ready", "a deleted queue's series go")
		require.Contains(t, got, "warren.exchanges")
	})
}

// TestMetricsClose: after Close, collections report nothing of the broker; Close is idempotent.
func TestMetricsClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		declare(t, b, "q")
		m, collect := newMetrics(t, b)
		require.NotEmpty(t, collect())
		require.NoError(t, m.Close())
		require.Empty(t, collect())
		require.NoError(t, m.Close())
	})
}

// TestMetricsClosedBroker: a closed broker has no queues and no exchanges, and collecting it is
// fine.
func TestMetricsClosedBroker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		declare(t, b, "q")
		_, collect := newMetrics(t, b)
		require.NoError(t, b.Close())
		got := collect()
		require.NotContains(t, got, "warren.queue.messages.ready")
		require.Equal(t, float64(0), got["warren.exchanges"][""].value)
	})
}

// TestNewMetricsNilBroker: a nil broker is a programmer's error, caught at once.
func TestNewMetricsNilBroker(t *testing.T) {
	require.PanicsWithValue(t, "warrenotel: NewMetrics with a nil broker", func() { _, _ = warrenotel.NewMetrics(nil) })
}

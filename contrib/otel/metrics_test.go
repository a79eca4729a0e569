package warrenotel_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"runtime"
	"sort"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

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
// plus one publish to a queue that does not exist (unroutable), a declared exchange, and a
// memory limit of 1 MiB (TestMetricsMemory sets its alarm).
func TestMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		b := newBroker(t, warren.WithMemoryLimit(1<<20))
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
		require.Len(t, got, len(queues)+2+5, "every instrument reports")
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
		require.Equal(t, memoryPoints(b.Memory()), memoryOf(got))
		require.Positive(t, b.Memory().Used)
	})
}

// memoryOf returns the memory instruments' series of c.
func memoryOf(c collection) collection {
	m := collection{}
	for name, series := range c {
		if strings.HasPrefix(name, "warren.memory.") {
			m[name] = series
		}
	}
	return m
}

// memoryPoints returns the series the memory instruments report for a broker whose budget is
// m: warren.memory.limit only with a limit.
func memoryPoints(m warren.MemoryStats) collection {
	alarm := 0.0
	if m.Alarm {
		alarm = 1
	}
	c := collection{
		"warren.memory.used":               {"": {float64(m.Used), "updown", "By"}},
		"warren.memory.alarm":              {"": {alarm, "updown", "1"}},
		"warren.memory.publishers.waiting": {"": {float64(m.Waiting), "updown", "{publisher}"}},
		"warren.memory.alarms":             {"": {float64(m.Alarms), "counter", "{alarm}"}},
	}
	if m.Limit > 0 {
		c["warren.memory.limit"] = map[string]point{"": {float64(m.Limit), "updown", "By"}}
	}
	return c
}

// TestMetricsMemory: the memory instruments follow the broker's alarm: set with publishes
// waiting, then cleared when the queue is drained, counted once; with no limit, no
// warren.memory.limit.
func TestMetricsMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, warren.WithMemoryLimit(1)) // any message passes it
		q := declare(t, b, "q")
		_, collect := newMetrics(t, b)
		require.Equal(t, memoryPoints(warren.MemoryStats{Limit: 1}), memoryOf(collect()))

		must(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("over")}))
		used := b.Memory().Used
		require.Greater(t, used, int64(len("over")))
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		waiting := make(chan error, 2)
		for range 2 {
			go func() { waiting <- b.Publish(ctx, "", "q", warren.Message{Body: []byte("late")}) }()
		}
		synctest.Wait()
		require.Equal(t, memoryPoints(warren.MemoryStats{Used: used, Limit: 1, Alarm: true, Waiting: 2, Alarms: 1}),
			memoryOf(collect()))

		cancel()
		for range 2 {
			require.ErrorIs(t, <-waiting, context.Canceled)
		}
		_, err := q.Purge()
		must(t, err)
		require.Equal(t, memoryPoints(warren.MemoryStats{Limit: 1, Alarms: 1}), memoryOf(collect()))

		unlimited := newBroker(t, warren.WithMemoryLimit(warren.NoMemoryLimit))
		declare(t, unlimited, "q")
		must(t, unlimited.Publish(t.Context(), "", "q", warren.Message{Body: []byte("m")}))
		_, collect = newMetrics(t, unlimited)
		got := memoryOf(collect())
		require.NotContains(t, got, "warren.memory.limit")
		require.Equal(t, memoryPoints(unlimited.Memory()), got)
		require.Positive(t, got["warren.memory.used"][""].value, "counted all the same")
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

// Tests of Metrics.Middleware: each attempt at a message measured in messaging.process.duration
// and messaging.client.consumed.messages, in virtual time, so that durations are exact.

// processBounds are the bucket boundaries semconv v1.43.0 recommends for
// messaging.process.duration.
var processBounds = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// newProcessMetrics registers b's metrics with a manual reader (and opts), and returns a
// function that collects the middleware's two instruments: zero Metrics for one that reports
// nothing.
func newProcessMetrics(t *testing.T, b *warren.Broker, opts ...sdkmetric.Option) (m *warrenotel.Metrics, collect func() (duration, consumed metricdata.Metrics)) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(append(opts, sdkmetric.WithReader(reader))...)
	t.Cleanup(func() { require.NoError(t, mp.Shutdown(context.Background())) })
	m, err := warrenotel.NewMetrics(b, warrenotel.WithMeterProvider(mp))
	require.NoError(t, err)
	return m, func() (duration, consumed metricdata.Metrics) {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(context.Background(), &rm))
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch m.Name {
				case "messaging.process.duration":
					duration = m
				case "messaging.client.consumed.messages":
					consumed = m
				}
			}
		}
		return duration, consumed
	}
}

// processAttrs are the attributes of the middleware's measurements for a queue named dest
// ("" for none), plus extra.
func processAttrs(dest string, extra ...attribute.KeyValue) attribute.Set {
	kvs := []attribute.KeyValue{attribute.String("messaging.system", "rabbitmq"), attribute.String("messaging.operation.name", "process")}
	if dest != "" {
		kvs = append(kvs, attribute.String("messaging.destination.name", dest))
	}
	return attribute.NewSet(append(kvs, extra...)...)
}

// failedWith is the error.type attribute.
func failedWith(errorType string) attribute.KeyValue {
	return attribute.String("error.type", errorType)
}

// durations is the histogram data point of attempts with attrs that took ds, in that order.
func durations(attrs attribute.Set, ds ...time.Duration) metricdata.HistogramDataPoint[float64] {
	p := metricdata.HistogramDataPoint[float64]{Attributes: attrs, Count: uint64(len(ds)), Bounds: processBounds,
		BucketCounts: make([]uint64, len(processBounds)+1)}
	low, high := math.Inf(1), math.Inf(-1)
	for _, d := range ds {
		s := d.Seconds()
		p.BucketCounts[sort.SearchFloat64s(processBounds, s)]++ // bucket i is (bounds[i-1], bounds[i]]
		p.Sum += s
		low, high = min(low, s), max(high, s)
	}
	p.Min, p.Max = metricdata.NewExtrema(low), metricdata.NewExtrema(high)
	return p
}

// wantDuration is messaging.process.duration with points.
func wantDuration(points ...metricdata.HistogramDataPoint[float64]) metricdata.Metrics {
	return metricdata.Metrics{
		Name:        "messaging.process.duration",
		Description: "Duration of processing operation.",
		Unit:        "s",
		Data:        metricdata.Histogram[float64]{Temporality: metricdata.CumulativeTemporality, DataPoints: points},
	}
}

// wantConsumed is messaging.client.consumed.messages with n deliveries counted under attrs.
func wantConsumed(attrs attribute.Set, n int64) metricdata.Metrics {
	return metricdata.Metrics{
		Name:        "messaging.client.consumed.messages",
		Description: "Number of messages that were delivered to the application.",
		Unit:        "{message}",
		Data: metricdata.Sum[int64]{Temporality: metricdata.CumulativeTemporality, IsMonotonic: true,
			DataPoints: []metricdata.DataPoint[int64]{{Attributes: attrs, Value: n}}},
	}
}

// assertMetrics checks collected metrics against want: name, description, unit, kind, and each
// data point's attributes and values, exactly; not timestamps or exemplars.
func assertMetrics(t *testing.T, want, got metricdata.Metrics) {
	t.Helper()
	metricdatatest.AssertEqual(t, want, got, metricdatatest.IgnoreTimestamp(), metricdatatest.IgnoreExemplars())
}

// handleUntilEmpty serves q with h (and opts) until q holds no message, every attempt settled,
// then stops Serve, which must return nil. In a synctest bubble, handlers may sleep.
func handleUntilEmpty(t *testing.T, q *warren.Queue, h warren.Handler, opts ...warren.ServeOption) {
	t.Helper()
	stop := serve(t.Context(), q, h, opts...)
	require.NoError(t, q.WaitEmpty(t.Context()))
	require.NoError(t, stop())
}

// TestMetricsMiddlewareAck: an attempt is counted as the handler is called; once it acks, its
// duration is measured, 30 ms in the bucket (0.025, 0.05], without error.type.
func TestMetricsMiddlewareAck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "jobs")
		m, collect := newProcessMetrics(t, b)
		must(t, b.Publish(t.Context(), "", "jobs", warren.Message{Body: []byte("job")}))

		stop := serve(t.Context(), q, m.Middleware("jobs")(func(context.Context, warren.Delivery) error {
			time.Sleep(30 * time.Millisecond)
			return nil
		}))
		synctest.Wait() // the handler sleeps
		duration, consumed := collect()
		attrs := processAttrs("jobs")
		assertMetrics(t, wantConsumed(attrs, 1), consumed)
		require.Empty(t, duration.Name, "no attempt has ended")

		require.NoError(t, q.WaitEmpty(t.Context()))
		require.NoError(t, stop())
		require.Equal(t, uint64(1), q.Stats().Acked)
		duration, consumed = collect()
		want := durations(attrs, 30*time.Millisecond)
		require.Equal(t, []uint64{0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, want.BucketCounts, "the test's own arithmetic")
		require.Equal(t, 0.03, want.Sum)
		assertMetrics(t, wantDuration(want), duration)
		assertMetrics(t, wantConsumed(attrs, 1), consumed)
	})
}

// TestMetricsMiddlewareRetry: a failed attempt is measured with error.type, the error's type
// once fmt's wrapping is taken off; the message is retried, and the second attempt, which acks,
// is measured without. Both deliveries are counted, without error.type.
func TestMetricsMiddlewareRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "jobs")
		m, collect := newProcessMetrics(t, b)
		must(t, b.Publish(t.Context(), "", "jobs", warren.Message{Body: []byte("job")}))

		var attempts []int
		handleUntilEmpty(t, q, m.Middleware("jobs")(func(ctx context.Context, d warren.Delivery) error {
			attempts = append(attempts, d.DeliveryCount)
			if d.DeliveryCount == 0 {
				time.Sleep(2 * time.Second)
				return fmt.Errorf("charge card: %w", context.DeadlineExceeded)
			}
			time.Sleep(20 * time.Millisecond)
			return nil
		}))
		require.Equal(t, []int{0, 1}, attempts)
		s := q.Stats()
		require.Equal(t, [2]uint64{1, 1}, [2]uint64{s.Nacked, s.Acked}, "nacked, then acked")

		duration, consumed := collect()
		assertMetrics(t, wantDuration(
			durations(processAttrs("jobs", failedWith("context.deadlineExceededError")), 2*time.Second),
			durations(processAttrs("jobs"), 20*time.Millisecond),
		), duration)
		assertMetrics(t, wantConsumed(processAttrs("jobs"), 2), consumed)
	})
}

// TestMetricsMiddlewarePanic: an attempt that panics, or ends its goroutine, is measured with
// error.type, as the process span records it; the panic still reaches Serve, which nacks the
// message, and the next attempt is measured too.
func TestMetricsMiddlewarePanic(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fail      func() error
		errorType string
		panics    int // EventHandlerPanicked events
	}{
		{"panic", func() error { panic("boom") }, "*errors.errorString", 1},
		{"panic with a typed error", func() error { panic(&net.AddrError{Err: "bad", Addr: "x"}) }, "*net.AddrError", 1},
		{"goexit", func() error { runtime.Goexit(); return nil }, "*errors.errorString", 0},
		{"typed nil error", func() error { return (*opError)(nil) }, "*warrenotel_test.opError", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				var panics int
				defer b.Listen(func(e warren.Event) {
					if e.Kind == warren.EventHandlerPanicked {
						panics++
					}
				})()
				q := declare(t, b, "jobs")
				m, collect := newProcessMetrics(t, b)
				must(t, b.Publish(t.Context(), "", "jobs", warren.Message{Body: []byte("job")}))

				handleUntilEmpty(t, q, m.Middleware("jobs")(func(ctx context.Context, d warren.Delivery) error {
					if d.DeliveryCount == 0 {
						time.Sleep(10 * time.Millisecond)
						return tc.fail()
					}
					time.Sleep(500 * time.Millisecond)
					return nil
				}))
				require.Equal(t, tc.panics, panics, "Serve saw the panic")
				s := q.Stats()
				require.Equal(t, [2]uint64{1, 1}, [2]uint64{s.Nacked, s.Acked}, "nacked, then acked")

				duration, consumed := collect()
				assertMetrics(t, wantDuration(
					durations(processAttrs("jobs", failedWith(tc.errorType)), 10*time.Millisecond),
					durations(processAttrs("jobs"), 500*time.Millisecond),
				), duration)
				assertMetrics(t, wantConsumed(processAttrs("jobs"), 2), consumed)
			})
		})
	}
}

// TestMetricsMiddlewareDestination: the destination is the queue, whatever exchange and routing
// key brought the message: messages routed by a topic exchange with a key each, and a dead
// letter, whose process spans are named by exchange, key and queue, are one series per queue.
// A server-named queue, or none, leaves the destination out.
func TestMetricsMiddlewareDestination(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		b := newBroker(t)
		_, err := b.DeclareExchange("orders", warren.ExchangeTopic)
		must(t, err)
		_, err = b.DeclareExchange("orders.dlx", warren.ExchangeFanout)
		must(t, err)
		dead := declare(t, b, "orders.dead")
		must(t, b.Bind("orders.dead", "orders.dlx", "", nil))
		q := declare(t, b, "eu", warren.DeadLetter("orders.dlx", ""))
		must(t, b.Bind("eu", "orders", "orders.eu.*", nil))
		anon := declare(t, b, "")
		m, collect := newProcessMetrics(t, b)
		for _, key := range []string{"orders.eu.1", "orders.eu.2", "orders.eu.3"} {
			must(t, tr.tracer.Publish(t.Context(), b, "orders", key, warren.Message{Body: []byte(key)}))
		}
		must(t, tr.tracer.Publish(t.Context(), b, "", anon.Name(), warren.Message{Body: []byte("reply")}))

		poison := warren.Permanent(errors.New("poison"))
		measured := func(queue string) func(warren.Handler) warren.Handler {
			return func(h warren.Handler) warren.Handler { return tr.tracer.Middleware(queue)(m.Middleware(queue)(h)) }
		}
		handleUntilEmpty(t, q, measured("eu")(func(ctx context.Context, d warren.Delivery) error {
			if d.RoutingKey == "orders.eu.3" {
				return poison
			}
			return nil
		}))
		ok := func(context.Context, warren.Delivery) error { return nil }
		handleUntilEmpty(t, dead, measured("orders.dead")(ok))
		handleUntilEmpty(t, anon, measured(anon.Name())(ok))
		must(t, b.Publish(t.Context(), "", anon.Name(), warren.Message{Body: []byte("again")}))
		handleUntilEmpty(t, anon, m.Middleware("")(ok))

		processes := named(tr.spans(), "process orders:orders.eu.1:eu")
		require.Len(t, processes, 1, "the span's destination has the routing key: %v", names(tr.spans()))
		one(t, tr.spans(), "process orders.dlx:orders.eu.3:orders.dead")

		duration, consumed := collect()
		counts := map[attribute.Distinct]uint64{}
		for _, p := range duration.Data.(metricdata.Histogram[float64]).DataPoints {
			counts[p.Attributes.Equivalent()] = p.Count
		}
		want := map[attribute.Distinct]uint64{}
		for _, w := range []struct {
			attrs attribute.Set
			n     uint64
		}{
			{processAttrs("eu"), 2},
			{processAttrs("eu", semconv.ErrorType(poison)), 1},
			{processAttrs("orders.dead"), 1},
			{processAttrs(""), 2},
		} {
			want[w.attrs.Equivalent()] = w.n
		}
		require.Equal(t, want, counts, "attempts by attribute set")
		require.Len(t, consumed.Data.(metricdata.Sum[int64]).DataPoints, 3, "eu, orders.dead, none")
	})
}

// TestMetricsMiddlewareInsideTracer: with the tracer's middleware outside the metrics', as
// warren.Middleware(tracer.Middleware(q), metrics.Middleware(q)) puts them, the measurements
// are made in the process span: their exemplars point at it.
func TestMetricsMiddlewareInsideTracer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		b := newBroker(t)
		q := declare(t, b, "jobs")
		m, collect := newProcessMetrics(t, b)
		must(t, tr.tracer.Publish(t.Context(), b, "", "jobs", warren.Message{Body: []byte("job")}))

		handleUntilEmpty(t, q, func(context.Context, warren.Delivery) error {
			time.Sleep(time.Second)
			return nil
		}, warren.Middleware(tr.tracer.Middleware("jobs"), m.Middleware("jobs")))

		process := one(t, tr.spans(), "process jobs").SpanContext
		duration, consumed := collect()
		assertMetrics(t, wantDuration(durations(processAttrs("jobs"), time.Second)), duration)
		assertMetrics(t, wantConsumed(processAttrs("jobs"), 1), consumed)
		exemplars := duration.Data.(metricdata.Histogram[float64]).DataPoints[0].Exemplars
		require.Len(t, exemplars, 1)
		require.Equal(t, process.TraceID(), trace.TraceID(exemplars[0].TraceID), "the duration's exemplar")
		require.Equal(t, process.SpanID(), trace.SpanID(exemplars[0].SpanID))
		counted := consumed.Data.(metricdata.Sum[int64]).DataPoints[0].Exemplars
		require.Len(t, counted, 1)
		require.Equal(t, process.SpanID(), trace.SpanID(counted[0].SpanID), "the count's exemplar")
	})
}

// TestMetricsMiddlewareNilHandler: the middleware of a nil handler is nil, which Serve refuses.
func TestMetricsMiddlewareNilHandler(t *testing.T) {
	b := newBroker(t)
	m, _ := newProcessMetrics(t, b)
	require.Nil(t, m.Middleware("q")(nil))
	q := declare(t, b, "q")
	require.ErrorIs(t, q.Serve(t.Context(), m.Middleware("q")(nil)), warren.ErrInvalidArgument)
}

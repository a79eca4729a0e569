package warrenprom_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/warrenmq/warren"
	warrenprom "github.com/warrenmq/warren/contrib/prometheus"
)

// Every metric the collector exposes, with its type.
var (
	gauges = []string{
		"warren_queue_messages_ready",
		"warren_queue_messages_unacked",
		"warren_queue_messages_delayed",
		"warren_queue_consumers",
		"warren_queue_ready_bytes",
		"warren_queue_oldest_message_age_seconds",
		"warren_exchanges",
		"warren_memory_used_bytes",
		"warren_memory_limit_bytes",
		"warren_memory_alarm",
		"warren_memory_waiting_publishers",
	}
	counters = []string{
		"warren_queue_messages_enqueued_total",
		"warren_queue_messages_delivered_total",
		"warren_queue_messages_redelivered_total",
		"warren_queue_messages_acked_total",
		"warren_queue_messages_nacked_total",
		"warren_queue_messages_rejected_total",
		"warren_queue_messages_expired_total",
		"warren_queue_messages_dead_lettered_total",
		"warren_queue_messages_dropped_total",
		"warren_queue_messages_moved_total",
		"warren_unroutable_total",
		"warren_memory_alarms_total",
	}
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func publish(t *testing.T, b *warren.Broker, queue, body string, opts ...warren.PublishOption) {
	t.Helper()
	must(t, b.Publish(context.Background(), "", queue, warren.Message{Body: []byte(body)}, opts...))
}

func countExchanges(b *warren.Broker) int {
	n := 0
	for range b.Exchanges() {
		n++
	}
	return n
}

// busyBroker builds a broker on which every counter and gauge is non-zero on some queue, with
// no reliance on time passing:
//
//	orders: 6 published; 3 acked, 1 nacked and redelivered (held), 1 rejected and dead-lettered
//	        into dead, 1 ready
//	dead:   the rejected order
//	events: TTL 0 and no consumer: both messages expire at once
//	capped: max length 1: the second message drops the first; a third is delayed an hour
//	idle:   one consumer, nothing else
//
// plus one publish to a queue that does not exist (unroutable), a declared exchange "dlx", and
// a memory limit of 1 MiB, passed once (a queue, burst, that took 2 MiB and was deleted).
func busyBroker(t *testing.T) *warren.Broker {
	t.Helper()
	ctx := t.Context()
	b := warren.New(warren.WithMemoryLimit(1 << 20))
	t.Cleanup(func() { _ = b.Close() })

	_, err := b.DeclareExchange("dlx", warren.ExchangeFanout)
	must(t, err)
	_, err = b.DeclareQueue("dead")
	must(t, err)
	must(t, b.Bind("dead", "dlx", "", nil))

	orders, err := b.DeclareQueue("orders", warren.DeadLetter("dlx", ""))
	must(t, err)
	for range 6 {
		publish(t, b, "orders", "order")
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
	again, err := orders.Get(ctx) // the nacked one, back at its place: redelivered, held
	must(t, err)
	if !again.Redelivered {
		t.Fatal("the nacked order was not redelivered")
	}

	_, err = b.DeclareQueue("events", warren.MessageTTL(0))
	must(t, err)
	publish(t, b, "events", "e1")
	publish(t, b, "events", "e2")

	_, err = b.DeclareQueue("capped", warren.MaxLength(1))
	must(t, err)
	publish(t, b, "capped", "first")
	publish(t, b, "capped", "second")
	publish(t, b, "capped", "later", warren.DeliverAfter(time.Hour))

	idle, err := b.DeclareQueue("idle")
	must(t, err)
	_, err = idle.Consume(ctx)
	must(t, err)

	from, err := b.DeclareQueue("from")
	must(t, err)
	_, err = b.DeclareQueue("to")
	must(t, err)
	publish(t, b, "from", "redriven")
	if n, err := from.Move(ctx, "", "to"); err != nil || n != 1 {
		t.Fatalf("Move = %d, %v; want 1, nil", n, err)
	}

	_, err = b.DeclareQueue("burst")
	must(t, err)
	publish(t, b, "burst", strings.Repeat("x", 2<<20))
	if !b.Memory().Alarm {
		t.Fatal("2 MiB in burst did not set the memory alarm")
	}
	_, err = b.DeleteQueue("burst")
	must(t, err)

	publish(t, b, "nowhere", "lost")
	return b
}

// scrape serves reg over a real HTTP server and returns the body of GET /metrics.
func scrape(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	resp, err := srv.Client().Get(srv.URL + "/metrics")
	must(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	must(t, err)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("GET /metrics: Content-Type %q, want the text format", ct)
	}
	return string(body)
}

func TestScrapeOverHTTP(t *testing.T) {
	b := busyBroker(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(warrenprom.NewCollector(b))
	text := scrape(t, reg)
	lines := map[string]bool{}
	for line := range strings.SplitSeq(text, "\n") {
		lines[line] = true
	}

	for _, name := range gauges {
		if !lines["# TYPE "+name+" gauge"] {
			t.Errorf("no line %q", "# TYPE "+name+" gauge")
		}
	}
	for _, name := range counters {
		if !lines["# TYPE "+name+" counter"] {
			t.Errorf("no line %q", "# TYPE "+name+" counter")
		}
	}
	for _, name := range append(append([]string{}, gauges...), counters...) {
		if !regexp.MustCompile(`(?m)^# HELP ` + name + ` [A-Z].*\.$`).MatchString(text) {
			t.Errorf("no HELP line for %s", name)
		}
	}
	if n := strings.Count(text, "# TYPE "); n != len(gauges)+len(counters) {
		t.Errorf("%d metric families, want %d:\n%s", n, len(gauges)+len(counters), text)
	}

	want := []string{
		`warren_exchanges ` + strconv.Itoa(countExchanges(b)),
		`warren_unroutable_total 1`,
		`warren_memory_used_bytes ` + strconv.FormatInt(b.Memory().Used, 10),
		`warren_memory_limit_bytes 1.048576e+06`,
		`warren_memory_alarm 0`,
		`warren_memory_waiting_publishers 0`,
		`warren_memory_alarms_total 1`,

		`warren_queue_messages_ready{queue="orders"} 1`,
		`warren_queue_messages_unacked{queue="orders"} 1`,
		`warren_queue_ready_bytes{queue="orders"} 5`,
		`warren_queue_messages_enqueued_total{queue="orders"} 6`,
		`warren_queue_messages_delivered_total{queue="orders"} 6`,
		`warren_queue_messages_redelivered_total{queue="orders"} 1`,
		`warren_queue_messages_acked_total{queue="orders"} 3`,
		`warren_queue_messages_nacked_total{queue="orders"} 1`,
		`warren_queue_messages_rejected_total{queue="orders"} 1`,
		`warren_queue_messages_dead_lettered_total{queue="orders"} 1`,
		`warren_queue_messages_expired_total{queue="orders"} 0`,
		`warren_queue_messages_dropped_total{queue="orders"} 0`,
		`warren_queue_messages_moved_total{queue="orders"} 0`,

		`warren_queue_messages_enqueued_total{queue="dead"} 1`,
		`warren_queue_messages_ready{queue="dead"} 1`,

		`warren_queue_messages_enqueued_total{queue="events"} 2`,
		`warren_queue_messages_expired_total{queue="events"} 2`,
		`warren_queue_messages_ready{queue="events"} 0`,
		`warren_queue_oldest_message_age_seconds{queue="events"} 0`,

		`warren_queue_messages_dropped_total{queue="capped"} 1`,

		`warren_queue_messages_moved_total{queue="from"} 1`,
		`warren_queue_messages_ready{queue="to"} 1`,
		`warren_queue_messages_delayed{queue="capped"} 1`,
		`warren_queue_messages_ready{queue="capped"} 1`,
		`warren_queue_ready_bytes{queue="capped"} 6`,

		`warren_queue_consumers{queue="idle"} 1`,
		`warren_queue_consumers{queue="orders"} 0`,
	}
	for _, line := range want {
		if !lines[line] {
			t.Errorf("no line %q", line)
		}
	}

	// The age of a ready message depends on the clock: some non-negative number of seconds.
	for _, queue := range []string{"orders", "dead", "capped"} {
		m := regexp.MustCompile(`(?m)^warren_queue_oldest_message_age_seconds\{queue="` + queue + `"\} (\S+)$`).FindStringSubmatch(text)
		if m == nil {
			t.Errorf("no oldest_message_age_seconds for %s", queue)
			continue
		}
		if v, err := strconv.ParseFloat(m[1], 64); err != nil || v < 0 {
			t.Errorf("oldest_message_age_seconds for %s = %q", queue, m[1])
		}
	}

	// Every counter is non-zero on some queue (or for the broker).
	for _, name := range counters {
		if !regexp.MustCompile(`(?m)^` + name + `(\{[^}]*\})? [1-9]`).MatchString(text) {
			t.Errorf("%s is zero everywhere", name)
		}
	}

	// Every queue has every per-queue metric.
	for _, name := range append(append([]string{}, gauges...), counters...) {
		if !strings.HasPrefix(name, "warren_queue_") {
			continue
		}
		if n := regexp.MustCompile(`(?m)^`+name+`\{queue="[^"]*"\} `).FindAllStringIndex(text, -1); len(n) != 7 {
			t.Errorf("%s: %d series, want one for each of the 7 queues", name, len(n))
		}
	}
}

// A small case, exactly, in virtual time: ages and TTL expiry without waiting.
func TestCollectAndCompare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		b := warren.New(warren.WithMemoryLimit(1 << 20))
		defer b.Close()

		jobs, err := b.DeclareQueue("jobs")
		must(t, err)
		publish(t, b, "jobs", "abc")
		publish(t, b, "jobs", "defg")
		publish(t, b, "jobs", "hi", warren.DeliverAfter(time.Hour))
		_, err = b.DeclareQueue("short", warren.MessageTTL(time.Minute))
		must(t, err)
		publish(t, b, "short", "gone")

		time.Sleep(90 * time.Second) // virtual: the TTL passes, the jobs wait
		synctest.Wait()

		d, err := jobs.Get(ctx)
		must(t, err)
		must(t, d.Ack())
		d, err = jobs.Get(ctx)
		must(t, err)
		must(t, d.Nack())

		want := fmt.Sprintf(`
# HELP warren_exchanges Exchanges declared on the broker, the predeclared ones included.
# TYPE warren_exchanges gauge
warren_exchanges %d
# HELP warren_queue_consumers Active consumers of the queue, waiting single-active ones included.
# TYPE warren_queue_consumers gauge
warren_queue_consumers{queue="jobs"} 0
warren_queue_consumers{queue="short"} 0
# HELP warren_queue_messages_acked_total Deliveries from the queue acknowledged, auto-acked ones included.
# TYPE warren_queue_messages_acked_total counter
warren_queue_messages_acked_total{queue="jobs"} 1
warren_queue_messages_acked_total{queue="short"} 0
# HELP warren_queue_messages_delayed Messages of the queue hidden until a delay passes (DeliverAfter, NackWithDelay).
# TYPE warren_queue_messages_delayed gauge
warren_queue_messages_delayed{queue="jobs"} 1
warren_queue_messages_delayed{queue="short"} 0
# HELP warren_queue_messages_delivered_total Deliveries from the queue to consumers and Gets, auto-acked ones included.
# TYPE warren_queue_messages_delivered_total counter
warren_queue_messages_delivered_total{queue="jobs"} 2
warren_queue_messages_delivered_total{queue="short"} 0
# HELP warren_queue_messages_enqueued_total Messages that entered the queue: published or dead-lettered into it, and auto-acked ones returned unread.
# TYPE warren_queue_messages_enqueued_total counter
warren_queue_messages_enqueued_total{queue="jobs"} 3
warren_queue_messages_enqueued_total{queue="short"} 1
# HELP warren_queue_messages_expired_total Messages of the queue whose TTL passed, dead-lettered or not.
# TYPE warren_queue_messages_expired_total counter
warren_queue_messages_expired_total{queue="jobs"} 0
warren_queue_messages_expired_total{queue="short"} 1
# HELP warren_queue_messages_nacked_total Deliveries from the queue nacked back into it.
# TYPE warren_queue_messages_nacked_total counter
warren_queue_messages_nacked_total{queue="jobs"} 1
warren_queue_messages_nacked_total{queue="short"} 0
# HELP warren_queue_messages_ready Messages in the queue waiting for a consumer.
# TYPE warren_queue_messages_ready gauge
warren_queue_messages_ready{queue="jobs"} 1
warren_queue_messages_ready{queue="short"} 0
# HELP warren_queue_oldest_message_age_seconds How long the oldest message waiting for a consumer has been in the queue, from arrival-time samples that can read up to the arrival span of 63 messages too high; 0 when none is waiting.
# TYPE warren_queue_oldest_message_age_seconds gauge
warren_queue_oldest_message_age_seconds{queue="jobs"} 90
warren_queue_oldest_message_age_seconds{queue="short"} 0
# HELP warren_queue_ready_bytes Body bytes of the messages in the queue waiting for a consumer.
# TYPE warren_queue_ready_bytes gauge
warren_queue_ready_bytes{queue="jobs"} 4
warren_queue_ready_bytes{queue="short"} 0
# HELP warren_unroutable_total Publishes to the broker that reached no queue.
# TYPE warren_unroutable_total counter
warren_unroutable_total 0
`, countExchanges(b)) + memoryText(b.Memory())
		// The families compared; the others (all zero here) are checked by TestScrapeOverHTTP.
		names := []string{
			"warren_exchanges", "warren_memory_alarm", "warren_memory_alarms_total", "warren_memory_limit_bytes",
			"warren_memory_used_bytes", "warren_memory_waiting_publishers", "warren_queue_consumers", "warren_queue_messages_acked_total",
			"warren_queue_messages_delayed", "warren_queue_messages_delivered_total",
			"warren_queue_messages_enqueued_total", "warren_queue_messages_expired_total",
			"warren_queue_messages_nacked_total", "warren_queue_messages_ready",
			"warren_queue_oldest_message_age_seconds", "warren_queue_ready_bytes",
			"warren_unroutable_total",
		}
		if err := testutil.CollectAndCompare(warrenprom.NewCollector(b), strings.NewReader(want), names...); err != nil {
			t.Error(err)
		}
		if n := testutil.CollectAndCount(warrenprom.NewCollector(b)); n != 2*16+2+5 {
			t.Errorf("%d metrics, want 16 per queue for 2 queues, 2 for the broker and 5 for its memory", n)
		}
	})
}

func TestLint(t *testing.T) {
	problems, err := testutil.CollectAndLint(warrenprom.NewCollector(busyBroker(t)))
	must(t, err)
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// The pedantic registry checks that every collected metric matches a description sent by
// Describe, and that the descriptions are consistent.
func TestDescribeMatchesCollect(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	must(t, reg.Register(warrenprom.NewCollector(busyBroker(t))))
	mfs, err := reg.Gather()
	must(t, err)
	if len(mfs) != len(gauges)+len(counters) {
		t.Errorf("%d families, want %d", len(mfs), len(gauges)+len(counters))
	}
}

// TestEmptyBroker: a broker with no queues and no memory limit has the broker's metrics, and
// no warren_memory_limit_bytes.
func TestEmptyBroker(t *testing.T) {
	b := warren.New(warren.WithMemoryLimit(warren.NoMemoryLimit))
	defer b.Close()
	want := fmt.Sprintf(`
# HELP warren_exchanges Exchanges declared on the broker, the predeclared ones included.
# TYPE warren_exchanges gauge
warren_exchanges %d
# HELP warren_unroutable_total Publishes to the broker that reached no queue.
# TYPE warren_unroutable_total counter
warren_unroutable_total 0
`, countExchanges(b)) + memoryText(warren.MemoryStats{})
	must(t, testutil.CollectAndCompare(warrenprom.NewCollector(b), strings.NewReader(want)))
}

func TestOptions(t *testing.T) {
	b1, b2 := warren.New(), warren.New()
	defer b1.Close()
	defer b2.Close()
	_, err := b1.DeclareQueue("q")
	must(t, err)
	publish(t, b1, "q", "x")
	publish(t, b2, "nowhere", "x")

	labels := prometheus.Labels{"broker": "one"}
	c1 := warrenprom.NewCollector(b1, warrenprom.WithNamespace("app"), warrenprom.WithConstLabels(labels))
	labels["broker"] = "changed" // copied: no effect
	c2 := warrenprom.NewCollector(b2, warrenprom.WithNamespace("app"), warrenprom.WithConstLabels(prometheus.Labels{"broker": "two"}))
	reg := prometheus.NewPedanticRegistry()
	must(t, reg.Register(c1))
	must(t, reg.Register(c2)) // same names, told apart by the constant label
	want := `
# HELP app_queue_messages_ready Messages in the queue waiting for a consumer.
# TYPE app_queue_messages_ready gauge
app_queue_messages_ready{broker="one",queue="q"} 1
# HELP app_unroutable_total Publishes to the broker that reached no queue.
# TYPE app_unroutable_total counter
app_unroutable_total{broker="one"} 0
app_unroutable_total{broker="two"} 1
`
	must(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "app_queue_messages_ready", "app_unroutable_total"))
}

func TestInvalidOptionsFailRegistration(t *testing.T) {
	b := warren.New()
	defer b.Close()
	for name, c := range map[string]prometheus.Collector{
		"queue label":     warrenprom.NewCollector(b, warrenprom.WithConstLabels(prometheus.Labels{"queue": "x"})),
		"reserved label":  warrenprom.NewCollector(b, warrenprom.WithConstLabels(prometheus.Labels{"__a": "x"})),
		"bad label value": warrenprom.NewCollector(b, warrenprom.WithConstLabels(prometheus.Labels{"a": "\xff"})),
	} {
		if err := prometheus.NewRegistry().Register(c); err == nil {
			t.Errorf("%s: registered", name)
		}
	}
}

// A queue deleted between scrapes disappears from the next one.
func TestDeletedQueueDisappears(t *testing.T) {
	b := warren.New()
	defer b.Close()
	for _, name := range []string{"a", "b"} {
		_, err := b.DeclareQueue(name)
		must(t, err)
	}
	c := warrenprom.NewCollector(b)
	if n := testutil.CollectAndCount(c, "warren_queue_messages_ready"); n != 2 {
		t.Fatalf("%d series, want 2", n)
	}
	_, err := b.DeleteQueue("a")
	must(t, err)
	want := `
# HELP warren_queue_messages_ready Messages in the queue waiting for a consumer.
# TYPE warren_queue_messages_ready gauge
warren_queue_messages_ready{queue="b"} 0
`
	must(t, testutil.CollectAndCompare(c, strings.NewReader(want), "warren_queue_messages_ready"))
}

// TestMemoryAlarm: the memory metrics follow the broker's alarm: set with a publish waiting,
// then cleared when the queue is drained, counted once.
func TestMemoryAlarm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := warren.New(warren.WithMemoryLimit(1)) // any message passes it
		defer b.Close()
		c := warrenprom.NewCollector(b)
		q, err := b.DeclareQueue("q")
		must(t, err)
		names := []string{"warren_memory_used_bytes", "warren_memory_limit_bytes", "warren_memory_alarm",
			"warren_memory_waiting_publishers", "warren_memory_alarms_total"}
		compare := func(m warren.MemoryStats) {
			t.Helper()
			if err := testutil.CollectAndCompare(c, strings.NewReader(memoryText(m)), names...); err != nil {
				t.Error(err)
			}
		}
		compare(warren.MemoryStats{Limit: 1})

		publish(t, b, "q", "over")
		used := b.Memory().Used
		if used <= int64(len("over")) {
			t.Fatalf("one message takes %d bytes of the budget", used)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		waiting := make(chan error, 2)
		for range 2 {
			go func() {
				waiting <- b.Publish(ctx, "", "q", warren.Message{Body: []byte("late")})
			}()
		}
		synctest.Wait()
		compare(warren.MemoryStats{Used: used, Limit: 1, Alarm: true, Waiting: 2, Alarms: 1})

		cancel()
		for range 2 {
			if err := <-waiting; !errors.Is(err, context.Canceled) {
				t.Fatalf("a waiting publish whose ctx ended returned %v", err)
			}
		}
		_, err = q.Purge()
		must(t, err)
		compare(warren.MemoryStats{Limit: 1, Alarms: 1})
	})
}

// memoryText is the text exposition of the memory metrics of a broker whose budget is m.
func memoryText(m warren.MemoryStats) string {
	alarm := 0
	if m.Alarm {
		alarm = 1
	}
	limit := ""
	if m.Limit > 0 {
		limit = fmt.Sprintf(`# HELP warren_memory_limit_bytes The broker's memory limit: above it the memory alarm is set and publishes wait. Absent when the broker has no limit.
# TYPE warren_memory_limit_bytes gauge
warren_memory_limit_bytes %d
`, m.Limit)
	}
	return fmt.Sprintf(`# HELP warren_memory_alarm Whether the broker's memory alarm is set: 1 while its messages take more than its memory limit and publishes wait, else 0.
# TYPE warren_memory_alarm gauge
warren_memory_alarm %d
# HELP warren_memory_alarms_total Times the broker's memory alarm was set.
# TYPE warren_memory_alarms_total counter
warren_memory_alarms_total %d
%s# HELP warren_memory_used_bytes Memory the messages the broker holds take, by its estimate: body, headers, properties and bookkeeping of each message in each queue.
# TYPE warren_memory_used_bytes gauge
warren_memory_used_bytes %d
# HELP warren_memory_waiting_publishers Publishes waiting for the broker's memory alarm to clear.
# TYPE warren_memory_waiting_publishers gauge
warren_memory_waiting_publishers %d
`, alarm, m.Alarms, limit, m.Used, m.Waiting)
}

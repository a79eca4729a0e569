package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/admin"
)

// The JSON API (api.go), against a live broker behind an httptest server, mounted under a prefix
// as the package doc shows.

func TestReads(t *testing.T) {
	e := newEnv(t)
	deadLetter(t, e.b, 2)
	_, err := e.b.DeclareExchange("events", warren.ExchangeTopic, warren.Durable())
	require.NoError(t, err)
	require.NoError(t, e.b.Bind("work", "events", "job.*", nil))

	var ov struct {
		Exchanges, Queues int
		Totals            warren.QueueStats
		Actions           bool
	}
	e.get(t, "api/overview", &ov)
	assert.Equal(t, 2, ov.Queues)
	assert.Greater(t, ov.Exchanges, 1) // the predeclared ones and "events"
	assert.Equal(t, 2, ov.Totals.Ready)
	assert.Equal(t, uint64(4), ov.Totals.Enqueued) // 2 into work, 2 into work.dlq
	assert.Equal(t, uint64(2), ov.Totals.DeadLettered)
	assert.False(t, ov.Actions)

	var qs []struct {
		Name      string
		Arguments map[string]any
		Stats     warren.QueueStats
	}
	e.get(t, "api/queues", &qs)
	require.Len(t, qs, 2)
	assert.Equal(t, "work", qs[0].Name)
	assert.Equal(t, map[string]any{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "work.dlq",
		"x-max-length": float64(1000)}, qs[0].Arguments)
	assert.Equal(t, "work.dlq", qs[1].Name)
	assert.Equal(t, 2, qs[1].Stats.Ready)

	type consumer struct {
		Tag, Status string
		Prefetch    int
		AutoAck     bool   `json:"auto_ack"`
		AckTimeout  string `json:"ack_timeout"`
		Unacked     int
	}
	var q struct {
		Name      string
		Stats     warren.QueueStats
		Consumers []consumer
	}
	e.get(t, "api/queues/work.dlq", &q)
	assert.Equal(t, "work.dlq", q.Name)
	assert.Equal(t, 2, q.Stats.Ready)
	assert.NotNil(t, q.Consumers)
	assert.Empty(t, q.Consumers)
	work, err := e.b.Queue("work")
	require.NoError(t, err)
	_, err = work.Consume(t.Context(), warren.ConsumerTag("worker"), warren.Prefetch(1), warren.AckTimeout(time.Minute))
	require.NoError(t, err)
	_, err = work.Consume(t.Context(), warren.ConsumerTag("auto"), warren.AutoAck(), warren.Prefetch(0))
	require.NoError(t, err)
	e.get(t, "api/queues/work", &q)
	assert.Equal(t, []consumer{{Tag: "worker", Status: "active", Prefetch: 1, AckTimeout: "1m0s"},
		{Tag: "auto", Status: "active", AutoAck: true, Prefetch: warren.DefaultPrefetch}}, q.Consumers,
		"an AutoAck consumer's prefetch 0 is DefaultPrefetch")

	var page struct {
		Queue    string
		Messages []struct {
			ID           uint64
			Body         string
			BodyEncoding string `json:"body_encoding"`
			Properties   struct {
				MessageID string `json:"message_id"`
			}
			Headers map[string]any
			Deaths  []struct {
				Queue, Reason, Exchange string
				Count                   int64
				Time                    time.Time
				RoutingKeys             []string `json:"routing_keys"`
			}
		}
		Next uint64
	}
	e.get(t, "api/queues/work.dlq/messages", &page)
	require.Len(t, page.Messages, 2)
	m := page.Messages[0]
	assert.Equal(t, "job 0", m.Body)
	assert.Equal(t, "text", m.BodyEncoding)
	assert.Equal(t, "0", m.Properties.MessageID)
	assert.Equal(t, map[string]any{"x-first-death-exchange": "", "x-first-death-queue": "work", "x-first-death-reason": "rejected",
		"x-last-death-exchange": "", "x-last-death-queue": "work", "x-last-death-reason": "rejected"}, m.Headers,
		"x-death is shown as deaths, not as a header")
	require.Len(t, m.Deaths, 1)
	assert.Equal(t, "work", m.Deaths[0].Queue)
	assert.Equal(t, "rejected", m.Deaths[0].Reason)
	assert.Equal(t, int64(1), m.Deaths[0].Count)
	assert.Equal(t, []string{"work"}, m.Deaths[0].RoutingKeys)
	assert.False(t, m.Deaths[0].Time.IsZero())
	assert.Less(t, page.Messages[0].ID, page.Messages[1].ID)
	assert.Zero(t, page.Next)
	assert.Equal(t, 2, queueStats(t, e.b, "work.dlq").Ready, "browsing consumes nothing")

	var xs []struct {
		Name, Kind  string
		Durable     bool
		Predeclared bool
	}
	e.get(t, "api/exchanges", &xs)
	assert.Equal(t, "", xs[0].Name)
	assert.True(t, xs[0].Predeclared)
	var events *struct {
		Name, Kind  string
		Durable     bool
		Predeclared bool
	}
	for i := range xs {
		if xs[i].Name == "events" {
			events = &xs[i]
		}
	}
	require.NotNil(t, events)
	assert.Equal(t, "topic", events.Kind)
	assert.True(t, events.Durable)
	assert.False(t, events.Predeclared)

	var bs []struct {
		Source, Destination string
		DestinationType     string `json:"destination_type"`
		RoutingKey          string `json:"routing_key"`
	}
	e.get(t, "api/bindings", &bs)
	assert.Contains(t, bs, struct {
		Source, Destination string
		DestinationType     string `json:"destination_type"`
		RoutingKey          string `json:"routing_key"`
	}{"events", "work", "queue", "job.*"})
}

func TestPaging(t *testing.T) {
	e := newEnv(t)
	_, err := e.b.DeclareQueue("long")
	require.NoError(t, err)
	for i := range 120 {
		publish(t, e.b, "long", warren.Message{Body: fmt.Append(nil, i)})
	}
	type page struct {
		Messages []struct {
			ID   uint64
			Body string
		}
		Next uint64
	}
	var bodies []string
	after := uint64(0)
	for i, want := range []int{50, 50, 20} {
		var p page
		e.get(t, fmt.Sprintf("api/queues/long/messages?after=%d&limit=50", after), &p)
		require.Len(t, p.Messages, want, "page %d", i)
		for _, m := range p.Messages {
			assert.Greater(t, m.ID, after)
			after = m.ID
			bodies = append(bodies, m.Body)
		}
		if i < 2 {
			assert.Equal(t, after, p.Next, "page %d", i)
		} else {
			assert.Zero(t, p.Next)
		}
	}
	for i, b := range bodies {
		require.Equal(t, fmt.Sprint(i), b)
	}

	var p page
	e.get(t, "api/queues/long/messages", &p)
	assert.Len(t, p.Messages, 50, "the default limit")
	next := p.Next
	p = page{}
	e.get(t, fmt.Sprintf("api/queues/long/messages?after=%d&limit=20", next), &p) // 20 of 70
	next, p = p.Next, page{}
	e.get(t, fmt.Sprintf("api/queues/long/messages?after=%d&limit=50", next), &p)
	assert.Len(t, p.Messages, 50)
	assert.Zero(t, p.Next, "a full page with nothing after it is the last")
	for _, q := range []string{"limit=0", "limit=501", "limit=x", "after=-1"} {
		res, err := http.Get(e.url("api/queues/long/messages?" + q))
		require.NoError(t, err)
		res.Body.Close()
		assert.Equal(t, http.StatusBadRequest, res.StatusCode, q)
	}
}

func TestNotFound(t *testing.T) {
	e := newEnv(t, admin.AllowActions())
	for _, path := range []string{"api/queues/nope", "api/queues/nope/messages"} {
		res, err := http.Get(e.url(path))
		require.NoError(t, err)
		res.Body.Close()
		assert.Equal(t, http.StatusNotFound, res.StatusCode, path)
	}
	for _, c := range []struct {
		path string
		body any
	}{
		{"api/queues/nope/purge", nil},
		{"api/queues/nope/delete", nil},
		{"api/queues/nope/move", map[string]any{"queue": "x"}},
	} {
		code, out := e.post(t, c.path, c.body, nil)
		assert.Equal(t, http.StatusNotFound, code, "%s: %v", c.path, out)
	}
}

// TestQueueNames: every queue is reached from the pages and through the API, whatever its name:
// "." and "..", which browsers and most clients take out of a path as dot segments, and "/",
// which http.ServeMux does not route as a segment, in the query; a slash among other
// characters, a percent sign, a question mark or a space escaped in a path segment. The pages'
// links are followed as a browser resolves them.
func TestQueueNames(t *testing.T) {
	e := newEnv(t, admin.AllowActions())
	names := []string{".", "..", "/", "a/b", "%2F", "?x", " ", "a/b c%d"}
	for _, name := range names {
		_, err := e.b.DeclareQueue(name)
		require.NoError(t, err)
		publish(t, e.b, name, warren.Message{Body: []byte("in " + name)})
	}
	_, _, overview := e.page(t, "")
	root, err := url.Parse(e.url(""))
	require.NoError(t, err)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			link := regexp.MustCompile(`<a href="([^"]*)">` + regexp.QuoteMeta(html.EscapeString(name)) + `</a>`).FindStringSubmatch(overview)
			require.NotNil(t, link, "the overview links to %q", name)
			page, err := root.Parse(html.UnescapeString(link[1]))
			require.NoError(t, err)
			res, err := http.Get(page.String())
			require.NoError(t, err)
			body := readAll(t, res)
			require.Equal(t, http.StatusOK, res.StatusCode, "GET %s: %s", page, body)
			assert.Contains(t, body, "<h1>Queue "+html.EscapeString(name), "GET %s", page)
			assert.Contains(t, body, "<pre>"+html.EscapeString("in "+name)+"</pre>", "GET %s", page)

			apis := []string{"api/queue?name=" + url.QueryEscape(name)}
			if name != "." && name != ".." && name != "/" {
				apis = append(apis, "api/queues/"+url.PathEscape(name))
			}
			for _, api := range apis {
				var q struct{ Name string }
				e.get(t, api, &q)
				assert.Equal(t, name, q.Name, "GET %s", api)
				var m struct{ Queue string }
				messages := strings.Replace(api, "?", "/messages?", 1)
				if !strings.Contains(api, "?") {
					messages = api + "/messages"
				}
				e.get(t, messages, &m)
				assert.Equal(t, name, m.Queue, "GET %s", messages)
			}

			purge := regexp.MustCompile(`data-purge="([^"]*)"`).FindStringSubmatch(body)
			require.NotNil(t, purge, "the page's purge action")
			code, out := e.post(t, html.UnescapeString(purge[1]), nil, nil)
			require.Equal(t, http.StatusOK, code, "POST %s: %v", purge[1], out)
			assert.Equal(t, float64(1), out["purged"], "POST %s", purge[1])
		})
	}
}

func TestMove(t *testing.T) {
	e := newEnv(t, admin.AllowActions())
	deadLetter(t, e.b, 5)
	var page struct{ Messages []struct{ ID uint64 } }
	e.get(t, "api/queues/work.dlq/messages", &page)
	require.Len(t, page.Messages, 5)

	code, out := e.post(t, "api/queues/work.dlq/move",
		map[string]any{"queue": "work", "ids": []uint64{page.Messages[1].ID, page.Messages[3].ID}}, nil)
	require.Equal(t, http.StatusOK, code, out)
	assert.Equal(t, map[string]any{"moved": float64(2)}, out)
	assert.Equal(t, 3, queueStats(t, e.b, "work.dlq").Ready)
	assert.Equal(t, 2, queueStats(t, e.b, "work").Ready)
	var moved struct {
		Messages []struct {
			Body   string
			Deaths []struct{ Reason string }
		}
	}
	e.get(t, "api/queues/work/messages", &moved)
	require.Len(t, moved.Messages, 2)
	assert.Equal(t, "job 1", moved.Messages[0].Body)
	assert.Equal(t, "job 3", moved.Messages[1].Body)
	assert.Len(t, moved.Messages[0].Deaths, 1, "x-death moves with the message")

	code, out = e.post(t, "api/queues/work.dlq/move", map[string]any{"exchange": "", "routing_key": "work", "limit": 1}, nil)
	require.Equal(t, http.StatusOK, code, out)
	assert.Equal(t, float64(1), out["moved"])
	assert.Equal(t, 2, queueStats(t, e.b, "work.dlq").Ready)

	code, out = e.post(t, "api/queues/work.dlq/move", map[string]any{"queue": "nowhere"}, nil)
	assert.Equal(t, http.StatusConflict, code, "unroutable: %v", out)
	assert.Equal(t, float64(0), out["moved"])
	assert.Contains(t, out["error"], "unroutable")
	assert.Equal(t, 2, queueStats(t, e.b, "work.dlq").Ready, "a refused move leaves the message")

	code, out = e.post(t, "api/queues/work.dlq/move", map[string]any{"queue": "work"}, nil)
	require.Equal(t, http.StatusOK, code, out)
	assert.Equal(t, float64(2), out["moved"])
	assert.Equal(t, 0, queueStats(t, e.b, "work.dlq").Ready)
	assert.Equal(t, 5, queueStats(t, e.b, "work").Ready)

	for _, body := range []map[string]any{
		{},
		{"queue": "work", "exchange": "x"},
		{"queue": "work", "limit": -1},
		{"queue": "work", "limit": 1, "ids": []uint64{1}},
		{"queue": "work", "ids": []uint64{}},
		{"queue": "work", "unknown": true},
	} {
		code, out := e.post(t, "api/queues/work/move", body, nil)
		assert.Equal(t, http.StatusBadRequest, code, "%v: %v", body, out)
	}
	assert.Equal(t, 5, queueStats(t, e.b, "work").Ready)
}

func TestPurgeDeletePublish(t *testing.T) {
	e := newEnv(t, admin.AllowActions())
	_, err := e.b.DeclareQueue("q")
	require.NoError(t, err)

	code, out := e.post(t, "api/publish", map[string]any{"routing_key": "q", "body": "hello", "content_type": "text/plain",
		"headers": map[string]string{"k": "v"}, "mandatory": true}, nil)
	require.Equal(t, http.StatusOK, code, out)
	var page struct {
		Messages []struct {
			Body       string
			Headers    map[string]any
			Properties struct {
				ContentType string `json:"content_type"`
			}
		}
	}
	e.get(t, "api/queues/q/messages", &page)
	require.Len(t, page.Messages, 1)
	assert.Equal(t, "hello", page.Messages[0].Body)
	assert.Equal(t, map[string]any{"k": "v"}, page.Messages[0].Headers)
	assert.Equal(t, "text/plain", page.Messages[0].Properties.ContentType)

	code, out = e.post(t, "api/publish", map[string]any{"routing_key": "nowhere", "mandatory": true}, nil)
	assert.Equal(t, http.StatusConflict, code, out)
	code, out = e.post(t, "api/publish", map[string]any{"exchange": "nope", "routing_key": "q"}, nil)
	assert.Equal(t, http.StatusNotFound, code, out)

	code, out = e.post(t, "api/queues/q/delete", map[string]any{"if_empty": true}, nil)
	assert.Equal(t, http.StatusConflict, code, out)
	code, out = e.post(t, "api/queues/q/purge", nil, nil)
	require.Equal(t, http.StatusOK, code, out)
	assert.Equal(t, float64(1), out["purged"])
	code, out = e.post(t, "api/queues/q/delete", map[string]any{"if_empty": true}, nil)
	require.Equal(t, http.StatusOK, code, out)
	assert.Equal(t, float64(0), out["deleted"])
	var qs []any
	e.get(t, "api/queues", &qs)
	assert.Empty(t, qs)
}

// TestExclusive: an exclusive queue is shown with its stats, but its messages are not, and
// actions on it are refused, as the broker refuses another connection's (423): RabbitMQ's
// management refuses a get from it too.
func TestExclusive(t *testing.T) {
	e := newEnv(t, admin.AllowActions())
	_, err := e.b.DeclareQueue("mine", warren.ExclusiveTo(t.Context()))
	require.NoError(t, err)
	publish(t, e.b, "mine", warren.Message{Body: []byte("the owner's secret")})

	res, err := http.Get(e.url("api/queues/mine/messages"))
	require.NoError(t, err)
	body := readAll(t, res)
	assert.Equal(t, http.StatusLocked, res.StatusCode, body)
	assert.Equal(t, "application/json", res.Header.Get("Content-Type"))
	assert.JSONEq(t, `{"error": "admin: queue \"mine\" is exclusive: its messages are its owner's: warren: resource locked"}`, body)
	var detail struct{ Stats warren.QueueStats }
	e.get(t, "api/queues/mine", &detail)
	assert.Equal(t, 1, detail.Stats.Ready, "its stats are shown")
	code, _, page := e.page(t, "queues/mine")
	require.Equal(t, http.StatusOK, code, page)
	assert.Contains(t, page, `id="ready">1<`)
	assert.Contains(t, page, `id="exclusive"`, "the page says why it shows no messages")
	assert.NotContains(t, page, "secret", "nor its messages")
	assert.NotContains(t, page, `id="actions"`, "nor actions, which would be refused")

	var qs []struct {
		Name      string
		Exclusive bool
		Stats     warren.QueueStats
	}
	e.get(t, "api/queues", &qs)
	require.Len(t, qs, 1)
	assert.True(t, qs[0].Exclusive)
	assert.Equal(t, 1, qs[0].Stats.Ready)
	code, out := e.post(t, "api/queues/mine/purge", nil, nil)
	assert.Equal(t, http.StatusLocked, code, out)
	code, out = e.post(t, "api/queues/mine/move", map[string]any{"queue": "x"}, nil)
	assert.Equal(t, http.StatusLocked, code, out)
}

// TestLookingIsNotUsing: reading a queue through the handler does not reset its x-expires, as
// a passive declaration would.
func TestLookingIsNotUsing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := warren.New()
		defer b.Close()
		a := admin.Handler(b, admin.AllowActions())
		defer a.Close()
		_, err := b.DeclareQueue("idle", warren.Expires(10*time.Second))
		require.NoError(t, err)
		// Publishing is not a use either: the queue still expires 10 s after its declaration.
		require.NoError(t, b.Publish(t.Context(), "", "idle", warren.Message{}))
		for range 3 {
			time.Sleep(4 * time.Second)
			if len(slices.Collect(b.Queues())) == 0 {
				break
			}
			for _, path := range []string{"/api/queues/idle", "/api/queues/idle/messages", "/api/queues", "/api/overview",
				"/queues/idle", "/", "/topology"} {
				rec := httptest.NewRecorder()
				a.ServeHTTP(rec, httptest.NewRequestWithContext(context.Background(), http.MethodGet, path, nil))
				require.Equal(t, http.StatusOK, rec.Code, "%s: %s", path, rec.Body)
			}
		}
		synctest.Wait()
		assert.Empty(t, slices.Collect(b.Queues()), "the queue expired after 10 s though it was looked at every 4 s")
	})
}

// TestOverviewMemory: the overview carries the broker's memory budget, under the names of
// warren.MemoryStats' JSON: past its limit the alarm is set and a publish waits, counted; a
// consumer draining the queue lets it in and then clears the alarm.
func TestOverviewMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := warren.Message{Body: make([]byte, 1000)}
		one := footprint(t, m)
		limit := one + one/2 // one message fits, two do not
		b := warren.New(warren.WithMemoryLimit(limit))
		defer b.Close()
		a := admin.Handler(b)
		defer a.Close()
		q, err := b.DeclareQueue("q")
		require.NoError(t, err)
		memory := func(want warren.MemoryStats) {
			t.Helper()
			var ov struct{ Memory json.RawMessage }
			require.NoError(t, json.Unmarshal(serveGet(t, a, "/api/overview").Body.Bytes(), &ov))
			assert.JSONEq(t, fmt.Sprintf(`{"used": %d, "limit": %d, "alarm": %t, "waiting": %d, "alarms": %d}`,
				want.Used, want.Limit, want.Alarm, want.Waiting, want.Alarms), string(ov.Memory))
		}
		memory(warren.MemoryStats{Limit: limit})
		publish(t, b, "q", m)
		memory(warren.MemoryStats{Used: one, Limit: limit})
		publish(t, b, "q", m)
		memory(warren.MemoryStats{Used: 2 * one, Limit: limit, Alarm: true, Alarms: 1})

		published := make(chan error, 1)
		go func() { published <- b.Publish(t.Context(), "", "q", m) }()
		synctest.Wait()
		memory(warren.MemoryStats{Used: 2 * one, Limit: limit, Alarm: true, Waiting: 1, Alarms: 1})

		// Draining: the first ack brings the broker under its limit, which lets the waiting
		// publish in, over it again; the other two clear the alarm.
		ack := func() {
			t.Helper()
			d, err := q.Get(t.Context())
			require.NoError(t, err)
			require.NoError(t, d.Ack())
		}
		ack()
		require.NoError(t, <-published)
		memory(warren.MemoryStats{Used: 2 * one, Limit: limit, Alarm: true, Alarms: 2})
		ack()
		ack()
		memory(warren.MemoryStats{Limit: limit, Alarms: 2})
	})
}

// TestOverviewNoMemoryLimit: with no limit the budget still counts what the messages take, its
// limit is 0 and the alarm is never set.
func TestOverviewNoMemoryLimit(t *testing.T) {
	b := warren.New(warren.WithMemoryLimit(warren.NoMemoryLimit))
	defer b.Close()
	a := admin.Handler(b)
	defer a.Close()
	_, err := b.DeclareQueue("q")
	require.NoError(t, err)
	for range 100 {
		publish(t, b, "q", warren.Message{Body: make([]byte, 1<<10)})
	}
	var ov struct{ Memory warren.MemoryStats }
	require.NoError(t, json.Unmarshal(serveGet(t, a, "/api/overview").Body.Bytes(), &ov))
	assert.Greater(t, ov.Memory.Used, int64(100<<10))
	assert.Equal(t, warren.MemoryStats{Used: ov.Memory.Used}, ov.Memory)
}

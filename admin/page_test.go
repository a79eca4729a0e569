package admin_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/admin"
)

// The HTML pages, as text: what they show and how they are served. The browser test
// (browsertest/) runs them in Chromium.

func TestOverviewPage(t *testing.T) {
	e := newEnv(t)
	deadLetter(t, e.b, 3)
	code, hdr, body := e.page(t, "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "text/html; charset=utf-8", hdr.Get("Content-Type"))
	assert.Contains(t, hdr.Get("Content-Security-Policy"), "default-src 'self'")
	assert.Contains(t, hdr.Get("Content-Security-Policy"), "frame-ancestors 'none'")
	assert.Contains(t, body, `<base href="./">`)
	assert.Contains(t, body, `<a href="queues/work.dlq">work.dlq</a>`)
	assert.Regexp(t, `data-queue="work.dlq" data-ready="3">`, body)
	assert.Regexp(t, `data-total="ready">3<`, body)
	assert.Contains(t, body, "read-only")
	assert.NotContains(t, body, `id="publish"`, "a read-only page offers no actions")
	assert.Contains(t, body, `data-stream="api/stream"`)
	_, _, body = e.page(t, "queues/work.dlq")
	assert.NotContains(t, body, `id="actions"`, "nor does a read-only queue page")
	assert.NotContains(t, body, "http://", "the page loads nothing from elsewhere")
	assert.NotContains(t, body, "https://")
}

func TestQueuePage(t *testing.T) {
	e := newEnv(t, admin.AllowActions())
	deadLetter(t, e.b, 2)
	code, _, body := e.page(t, "queues/work.dlq")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `<base href="../">`)
	assert.Contains(t, body, `data-stream="api/stream?queue=work.dlq"`)
	assert.Contains(t, body, `<meta name="csrf-token" content="`+e.token+`">`)
	assert.Contains(t, body, `id="ready">2<`)
	assert.Contains(t, body, "job 0")
	assert.Contains(t, body, "job 1")
	assert.Contains(t, body, `rejected ×1 from <a href="queues/work">work</a>`)
	assert.Contains(t, body, `<option value="work" selected>work</option>`, "a move offers the queue it died in first")
	assert.Contains(t, body, `data-action="move-selected"`)
	assert.Contains(t, body, "no consumers")
	dlq, err := e.b.Queue("work.dlq")
	require.NoError(t, err)
	c, err := dlq.Consume(t.Context(), warren.ConsumerTag("drainer"), warren.Prefetch(5))
	require.NoError(t, err)
	<-c.Deliveries()
	_, _, body = e.page(t, "queues/work.dlq")
	assert.Regexp(t, `<tr data-consumer="drainer">\s*<td>drainer</td>\s*<td><span class="tag">active</span></td>\s*<td class="n">5</td>`, body)
	assert.Regexp(t, `<td>manual</td>\s*<td class="n">2</td>`, body, "both messages are with the consumer")
	require.NoError(t, c.Close())

	code, _, body = e.page(t, "queues/nope")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, body, "No queue nope")

	// Paging, with the links relative to the base.
	_, err = e.b.DeclareQueue("long")
	require.NoError(t, err)
	for range 60 {
		publish(t, e.b, "long", warren.Message{Body: []byte("m")})
	}
	_, _, body = e.page(t, "queues/long")
	assert.Equal(t, 50, strings.Count(body, `class="select"`))
	assert.Regexp(t, `href="queues/long\?after=\d+">next page`, body)
	_, _, body = e.page(t, "queues/long?after=50")
	assert.Equal(t, 10, strings.Count(body, `class="select"`))
	assert.Contains(t, body, `href="queues/long">first page`)
}

// TestPageNames: names are escaped in the page as text and in links as path segments.
func TestPageNames(t *testing.T) {
	e := newEnv(t)
	const name = `<b>"a/b"</b>`
	_, err := e.b.DeclareQueue(name)
	require.NoError(t, err)
	_, _, body := e.page(t, "")
	assert.NotContains(t, body, name)
	assert.Contains(t, body, `href="queues/`+strings.ReplaceAll(url.PathEscape(name), "&", "&amp;")+`"`)
	code, _, body := e.page(t, "queues/"+url.PathEscape(name))
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Queue &lt;b&gt;&#34;a/b&#34;&lt;/b&gt;")
	assert.Contains(t, body, `<base href="../">`)
}

func TestTopologyPage(t *testing.T) {
	e := newEnv(t)
	deadLetter(t, e.b, 0)
	_, err := e.b.DeclareExchange("events", warren.ExchangeTopic)
	require.NoError(t, err)
	require.NoError(t, e.b.Bind("work", "events", "job.*", nil))
	code, _, body := e.page(t, "topology")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `<span class="exchange">events</span> <span class="tag">topic</span>`)
	assert.Regexp(t, `<span class="key">job\.\*</span> →\s*<a class="queue" href="queues/work">work</a>`, body)
	assert.Contains(t, body, "(default)")
	assert.Contains(t, body, `<a class="queue" href="queues/work.dlq">work.dlq</a>`, "reached only by its name")
	assert.NotContains(t, body, "amq.fanout", "predeclared exchanges nobody binds are left out")
	assert.NotContains(t, body, "data-stream", "nothing live here: no stream")

	// An exclusive queue's bindings are not listed: nor is it as reached only by its name.
	_, err = e.b.DeclareQueue("mine", warren.ExclusiveTo(t.Context()))
	require.NoError(t, err)
	require.NoError(t, e.b.Bind("mine", "events", "#", nil, warren.As(t.Context())))
	_, _, body = e.page(t, "topology")
	assert.NotContains(t, body, "mine")
}

func TestStatic(t *testing.T) {
	e := newEnv(t)
	for path, typ := range map[string]string{"static/admin.js": "text/javascript", "static/admin.css": "text/css"} {
		code, hdr, body := e.page(t, path)
		assert.Equal(t, http.StatusOK, code, path)
		assert.Contains(t, hdr.Get("Content-Type"), typ, path)
		// The SVG namespace is a name, not a resource.
		body = strings.ReplaceAll(body, "http://www.w3.org/2000/svg", "")
		assert.False(t, strings.Contains(body, "http://") || strings.Contains(body, "https://"),
			"%s loads nothing from elsewhere", path)
	}
}

// TestOverviewPageMemory: the overview shows the broker's memory, used of the limit, with a
// bar; the alarm banner, hidden while the alarm is not set, shows while it is, with the number
// of publishes waiting; with no limit it says so, and shows no bar.
func TestOverviewPageMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := warren.New(warren.WithMemoryLimit(3 << 20))
		defer b.Close()
		a := admin.Handler(b)
		defer a.Close()
		_, err := b.DeclareQueue("q")
		require.NoError(t, err)
		page := func() string {
			t.Helper()
			return serveGet(t, a, "/").Body.String()
		}
		banner := regexp.MustCompile(`<div id="memory-alarm" class="alarm" role="alert"( hidden)?>`)
		body := page()
		assert.Equal(t, []string{`<div id="memory-alarm" class="alarm" role="alert" hidden>`, " hidden"}, banner.FindStringSubmatch(body),
			"no alarm: the banner is there for the live view to show, hidden")
		assert.Contains(t, body, "memory alarm: publishers blocked")
		assert.Contains(t, body, `<span data-memory="used">0 B</span> <small>/ <span data-memory="limit">3.0 MiB</span>`)
		assert.Contains(t, body, `<meter id="memory-bar" min="0" max="1" low="0.7" high="0.9" optimum="0" value="0" `)

		for range 2 {
			publish(t, b, "q", warren.Message{Body: make([]byte, 1<<20)})
		}
		used := b.Memory().Used
		body = page()
		assert.Equal(t, " hidden", banner.FindStringSubmatch(body)[1], "within the limit")
		assert.Contains(t, body, fmt.Sprintf(`value="%v"`, float64(used)/(3<<20)))
		assert.Contains(t, body, `<span data-memory="used">2.0 MiB</span>`)

		publish(t, b, "q", warren.Message{Body: make([]byte, 1<<20)}) // over the limit now
		ctx, cancel := context.WithCancel(t.Context())
		waiting := make(chan error, 2)
		for range 2 {
			go func() { waiting <- b.Publish(ctx, "", "q", warren.Message{Body: []byte("late")}) }()
		}
		synctest.Wait()
		body = page()
		assert.Equal(t, "", banner.FindStringSubmatch(body)[1], "the alarm: the banner shows")
		assert.Contains(t, body, `<span data-memory="waiting">2</span> waiting`)
		assert.Contains(t, body, `the broker's messages take <span data-memory="used">3.0 MiB</span> of its <span data-memory="limit">3.0 MiB</span> limit`)
		assert.Contains(t, body, `value="1"`, "the bar is full")
		assert.Contains(t, body, `alarms <span data-memory="alarms">1</span>`)

		cancel()
		for range 2 {
			require.ErrorIs(t, <-waiting, context.Canceled)
		}
		q, err := b.Queue("q")
		require.NoError(t, err)
		_, err = q.Purge()
		require.NoError(t, err)
		body = page()
		assert.Equal(t, " hidden", banner.FindStringSubmatch(body)[1], "cleared: the banner hides")
		assert.Contains(t, body, `<span data-memory="waiting">0</span> waiting`)
		assert.Contains(t, body, `alarms <span data-memory="alarms">1</span>`)
	})

	b := warren.New(warren.WithMemoryLimit(warren.NoMemoryLimit))
	defer b.Close()
	a := admin.Handler(b)
	defer a.Close()
	body := serveGet(t, a, "/").Body.String()
	assert.Contains(t, body, `<span data-memory="limit">no limit</span>`)
	assert.Regexp(t, `<meter id="memory-bar" [^>]* hidden>`, body, "no limit: no bar")
}

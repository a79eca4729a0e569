package admin_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

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

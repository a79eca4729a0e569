package admin_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/admin"
)

// Shared by the package's tests: a broker with its admin handler on a test server, and requests
// to it.

// env is a broker with its admin handler mounted under /warren/ on a test server.
type env struct {
	b     *warren.Broker
	a     *admin.Server
	srv   *httptest.Server
	token string // the CSRF token, read from api/token
}

func newEnv(t *testing.T, opts ...admin.Option) *env {
	t.Helper()
	b := warren.New()
	t.Cleanup(func() { b.Close() })
	a := admin.Handler(b, opts...)
	t.Cleanup(func() { a.Close() })
	mux := http.NewServeMux()
	mux.Handle("/warren/", http.StripPrefix("/warren", a))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	e := &env{b: b, a: a, srv: srv}
	var tok struct{ Token, Header string }
	e.get(t, "api/token", &tok)
	require.Equal(t, "X-CSRF-Token", tok.Header)
	require.Len(t, tok.Token, 64)
	e.token = tok.Token
	return e
}

// url returns the server's URL of path, relative to the mount point.
func (e *env) url(path string) string { return e.srv.URL + "/warren/" + path }

// get GETs path and decodes its JSON into v, failing the test unless the status is 200.
func (e *env) get(t *testing.T, path string, v any) {
	t.Helper()
	res, err := http.Get(e.url(path))
	require.NoError(t, err)
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	require.Equal(t, http.StatusOK, res.StatusCode, "GET %s: %s", path, body)
	require.Equal(t, "application/json", res.Header.Get("Content-Type"))
	require.NoError(t, json.Unmarshal(body, v), "GET %s: %s", path, body)
}

// post POSTs body as JSON to path with the token (and the headers of hdr, which may override
// it) and returns the status and the decoded response.
func (e *env) post(t *testing.T, path string, body any, hdr http.Header) (int, map[string]any) {
	t.Helper()
	var buf bytes.Buffer
	if body != nil {
		require.NoError(t, json.NewEncoder(&buf).Encode(body))
	}
	req, err := http.NewRequest(http.MethodPost, e.url(path), &buf)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-CSRF-Token", e.token)
	maps.Copy(req.Header, hdr)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(res.Body).Decode(&out))
	return res.StatusCode, out
}

func publish(t *testing.T, b *warren.Broker, key string, msg warren.Message) {
	t.Helper()
	require.NoError(t, b.Publish(t.Context(), "", key, msg, warren.Mandatory()))
}

// deadLetter declares "work", dead-lettering into "work.dlq", publishes n messages to it and
// rejects them all, so that they are in work.dlq with an x-death entry.
func deadLetter(t *testing.T, b *warren.Broker, n int) {
	t.Helper()
	_, err := b.DeclareQueue("work.dlq")
	require.NoError(t, err)
	work, err := b.DeclareQueue("work", warren.DeadLetter("", "work.dlq"), warren.MaxLength(1000))
	require.NoError(t, err)
	for i := range n {
		publish(t, b, "work", warren.Message{Body: fmt.Appendf(nil, "job %d", i), MessageID: fmt.Sprint(i)})
		d, err := work.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, d.Reject())
	}
}

func queueStats(t *testing.T, b *warren.Broker, name string) warren.QueueStats {
	t.Helper()
	for q := range b.Queues() {
		if q.Name() == name {
			return q.Stats()
		}
	}
	t.Fatalf("no queue %q", name)
	return warren.QueueStats{}
}

// page GETs path and returns the status, the headers and the body.
func (e *env) page(t *testing.T, path string) (int, http.Header, string) {
	t.Helper()
	res, err := http.Get(e.url(path))
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, res.Header, string(body)
}

// readAll reads res's body and closes it.
func readAll(t *testing.T, res *http.Response) string {
	t.Helper()
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return string(body)
}

// serveGet serves GET path on h, in the test's goroutine (so inside a synctest bubble too), and
// returns the response, failing the test unless its status is 200.
func serveGet(t *testing.T, h http.Handler, path string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, path, nil))
	require.Equal(t, http.StatusOK, rec.Code, "GET %s: %s", path, rec.Body)
	return rec
}

// footprint returns what one message m costs a broker's memory budget: it publishes m on a
// broker with no limit and reads Broker.Memory.
func footprint(t *testing.T, m warren.Message) int64 {
	t.Helper()
	b := warren.New(warren.WithMemoryLimit(warren.NoMemoryLimit))
	defer b.Close()
	_, err := b.DeclareQueue("q")
	require.NoError(t, err)
	publish(t, b, "q", m)
	n := b.Memory().Used
	require.Greater(t, n, int64(len(m.Body)), "the body and the bookkeeping")
	return n
}

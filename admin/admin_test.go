package admin_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/admin"
)

// The handler's safety: read-only by default, and the actions' cross-origin and token checks.

// TestReadOnly: without AllowActions every action is refused and nothing changes, token or not.
func TestReadOnly(t *testing.T) {
	e := newEnv(t)
	deadLetter(t, e.b, 1)
	for _, c := range []struct {
		path string
		body any
	}{
		{"api/queues/work.dlq/purge", nil},
		{"api/queues/work.dlq/delete", nil},
		{"api/queues/work.dlq/move", map[string]any{"queue": "work"}},
		{"api/publish", map[string]any{"routing_key": "work", "body": "x"}},
	} {
		code, out := e.post(t, c.path, c.body, nil)
		assert.Equal(t, http.StatusForbidden, code, c.path)
		assert.Contains(t, out["error"], "read-only", c.path)
	}
	assert.Equal(t, 1, queueStats(t, e.b, "work.dlq").Ready)
	assert.Equal(t, 0, queueStats(t, e.b, "work").Ready)
}

// TestCSRF: an action needs the token in its header and must not come from another origin; a
// GET can change nothing.
func TestCSRF(t *testing.T) {
	e := newEnv(t, admin.AllowActions())
	_, err := e.b.DeclareQueue("q")
	require.NoError(t, err)
	publish(t, e.b, "q", warren.Message{Body: []byte("x")})
	for _, c := range []struct {
		name string
		hdr  http.Header
	}{
		{"no token", http.Header{"X-Csrf-Token": {""}}},
		{"wrong token", http.Header{"X-Csrf-Token": {strings.Repeat("0", 64)}}},
		{"cross-site", http.Header{"Sec-Fetch-Site": {"cross-site"}}},
		{"same-site, another origin", http.Header{"Sec-Fetch-Site": {"same-site"}}},
		{"another origin", http.Header{"Origin": {"https://evil.example"}}},
	} {
		code, out := e.post(t, "api/queues/q/purge", nil, c.hdr)
		assert.Equal(t, http.StatusForbidden, code, "%s: %v", c.name, out)
	}
	assert.Equal(t, 1, queueStats(t, e.b, "q").Ready)

	// A form post, as a page of another site could make, has no custom header.
	res, err := http.PostForm(e.url("api/queues/q/purge"), url.Values{"X-CSRF-Token": {e.token}})
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusForbidden, res.StatusCode)
	res, err = http.Get(e.url("api/queues/q/purge"))
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, res.StatusCode)
	assert.Equal(t, 1, queueStats(t, e.b, "q").Ready)

	code, out := e.post(t, "api/queues/q/purge", nil, http.Header{"Sec-Fetch-Site": {"same-origin"}})
	assert.Equal(t, http.StatusOK, code, out)
	assert.Equal(t, 0, queueStats(t, e.b, "q").Ready)

	// Another handler has another token.
	other := admin.Handler(e.b, admin.AllowActions())
	defer other.Close()
	req := httptest.NewRequest(http.MethodPost, "/api/queues/q/purge", nil)
	req.Header.Set("X-CSRF-Token", e.token)
	rec := httptest.NewRecorder()
	other.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusForbidden, rec.Code)
}

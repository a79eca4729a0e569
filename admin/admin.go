package admin

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/warrenmq/warren"
)

// Server is the admin handler of one broker: its JSON API and its page (see the package doc).
// Make one with [Handler]; the zero Server is not usable. It is safe for concurrent use.
type Server struct {
	b     *warren.Broker
	cfg   config
	mux   *http.ServeMux
	token string // the CSRF token actions carry in the X-CSRF-Token header
	cop   http.CrossOriginProtection
	pages pages
	hub   *hub // the live stream
}

// tokenHeader is the header that carries the CSRF token.
const tokenHeader = "X-CSRF-Token"

// Handler returns the admin handler of b, read-only unless [AllowActions] is given. It serves
// paths from its own root ("/", "/api/queues", …): mount it with [http.StripPrefix] under a
// prefix of the application's choosing. It starts nothing until a page or a client opens the
// live stream; call [Server.Close] when it is no longer served.
func Handler(b *warren.Broker, opts ...Option) *Server {
	s := &Server{b: b, cfg: defaultConfig(), mux: http.NewServeMux(), token: newToken(), pages: parsePages(),
		hub: newHub(b)}
	for _, o := range opts {
		if o != nil {
			o.apply(&s.cfg)
		}
	}
	s.routes()
	return s
}

// newToken returns 32 random bytes in hex.
func newToken() string {
	var b [32]byte
	rand.Read(b[:]) // never fails (crypto/rand.Read's doc)
	return hex.EncodeToString(b[:])
}

// routes registers every path with s.mux.
func (s *Server) routes() {
	s.mux.HandleFunc("GET /{$}", s.pageOverview)
	s.mux.HandleFunc("GET /topology", s.pageTopology)
	s.mux.Handle("GET /static/", staticHandler())
	s.mux.HandleFunc("GET /api/stream", s.getStream)
	s.mux.HandleFunc("GET /api/overview", s.getOverview)
	s.mux.HandleFunc("GET /api/queues", s.getQueues)
	s.mux.HandleFunc("GET /api/exchanges", s.getExchanges)
	s.mux.HandleFunc("GET /api/bindings", s.getBindings)
	s.mux.HandleFunc("GET /api/token", s.getToken)
	s.mux.Handle("POST /api/publish", s.action(s.postPublish))
	// A queue's routes, each twice (see queueURL): with the name as a path segment, and with it
	// in the query, for the names no path can carry.
	for _, r := range []struct {
		method, prefix, suffix string
		h                      http.Handler
	}{
		{"GET", "/queue", "", http.HandlerFunc(s.pageQueue)},
		{"GET", "/api/queue", "", http.HandlerFunc(s.getQueue)},
		{"GET", "/api/queue", "/messages", http.HandlerFunc(s.getMessages)},
		{"POST", "/api/queue", "/purge", s.action(s.postPurge)},
		{"POST", "/api/queue", "/delete", s.action(s.postDelete)},
		{"POST", "/api/queue", "/move", s.action(s.postMove)},
	} {
		s.mux.Handle(r.method+" "+r.prefix+"s/{name}"+r.suffix, r.h)
		s.mux.Handle(r.method+" "+r.prefix+r.suffix, r.h)
	}
}

// queueURL returns the URL, relative to the handler's root, of a route of the named queue: the
// name as a path segment, escaped, between prefix+"s/" and suffix ("queues/a%2Fb",
// "api/queues/a%2Fb/messages"); or, for the names no path segment carries, in the query of the
// same route without the segment ("queue?name=..", "api/queue/messages?name=.."). Those are
// "." and "..", which browsers and most HTTP clients remove from a path as dot segments (escaped
// too: "%2E%2E" is ".." to a browser), and "/", whose escaped segment "%2F" http.ServeMux takes
// for a trailing slash, which no wildcard matches (Go 1.26's routing_tree.go). Either form
// reaches every other queue.
func queueURL(prefix, name, suffix string) string {
	if name == "." || name == ".." || name == "/" {
		return prefix + suffix + "?name=" + url.QueryEscape(name)
	}
	return prefix + "s/" + url.PathEscape(name) + suffix
}

// withQuery returns u with the query parameters q added to any it has.
func withQuery(u, q string) string {
	if strings.Contains(u, "?") {
		return u + "&" + q
	}
	return u + "?" + q
}

// queueName returns the name of the queue r is about: its path segment, or its name= in the
// query (see queueURL).
func queueName(r *http.Request) string {
	if name := r.PathValue("name"); name != "" {
		return name
	}
	return r.URL.Query().Get("name")
}

// ServeHTTP serves the API and the page.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close ends the live streams open (their responses end), removes the handler's listener from
// the broker and waits for its goroutine to exit. Later requests for the stream get 503; the
// rest of the API and the pages keep answering. It is idempotent and returns nil.
func (s *Server) Close() error {
	s.hub.close()
	return nil
}

// action wraps an action's handler in the checks every action passes: actions are enabled, the
// request is not cross-origin, and it carries the token.
func (s *Server) action(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case !s.cfg.actions:
			writeError(w, http.StatusForbidden, errors.New("admin: read-only: actions are not enabled"))
		case s.cop.Check(r) != nil:
			writeError(w, http.StatusForbidden, errors.New("admin: cross-origin request refused"))
		case subtle.ConstantTimeCompare([]byte(r.Header.Get(tokenHeader)), []byte(s.token)) != 1:
			writeError(w, http.StatusForbidden, errors.New("admin: missing or wrong "+tokenHeader+" header (GET api/token)"))
		default:
			r.Body = http.MaxBytesReader(w, r.Body, maxBody)
			h(w, r)
		}
	})
}

// maxBody is the largest request body an action reads.
const maxBody = 1 << 20

// writeJSON writes v as the response, with status 200.
func writeJSON(w http.ResponseWriter, v any) { writeJSONStatus(w, http.StatusOK, v) }

// writeJSONStatus writes v as JSON with status code.
func writeJSONStatus(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v) // an error is the client's going away: nothing to do
}

// writeError writes {"error": err} with status code.
func writeError(w http.ResponseWriter, code int, err error) {
	writeJSONStatus(w, code, map[string]string{"error": err.Error()})
}

// statusOf is the HTTP status for a broker's error.
func statusOf(err error) int {
	switch {
	case errors.Is(err, warren.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, warren.ErrResourceLocked):
		return http.StatusLocked
	case errors.Is(err, warren.ErrAccessRefused):
		return http.StatusForbidden
	case errors.Is(err, warren.ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, warren.ErrClosed):
		return http.StatusServiceUnavailable
	case errors.Is(err, warren.ErrPreconditionFailed), errors.Is(err, warren.ErrUnroutable),
		errors.Is(err, warren.ErrQueueFull):
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

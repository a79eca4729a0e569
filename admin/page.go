package admin

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"math"
	"net/http"
	"net/url"
	"strings"

	"github.com/warrenmq/warren"
)

// The HTML page: templates rendered from the same data as the JSON API, with a small script
// (static/admin.js) that follows the live stream and runs the actions. Everything it loads is
// embedded here: the page works with no network beyond the service.

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// pages holds the parsed templates: each page with the layout.
type pages struct {
	overview, queue, topology, notFound *template.Template
}

func parsePages() pages {
	funcs := template.FuncMap{
		"queueURL":  queueURL,
		"withQuery": withQuery,
		"exchange": func(name string) string {
			if name == "" {
				return "(default)"
			}
			return name
		},
		"bytes": byteSize,
		"limit": memoryLimit,
		"ratio": memoryRatio,
	}
	parse := func(page string) *template.Template {
		return template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+page))
	}
	return pages{overview: parse("overview.html"), queue: parse("queue.html"), topology: parse("topology.html"),
		notFound: parse("notfound.html")}
}

// pageData is what every page's layout needs, and the page's own data.
type pageData struct {
	Title   string
	Root    string // the mount point, relative to the page: its <base href>
	Token   string
	Actions bool
	Stream  string // the page's live stream, "api/stream" or "api/stream?queue=…"; "" for none
	Data    any
}

// render writes page with data under the layout; status 200 unless code says otherwise.
func (s *Server) render(w http.ResponseWriter, r *http.Request, t *template.Template, code int, d pageData) {
	d.Root, d.Token, d.Actions = root(r), s.token, s.cfg.actions
	var buf bytes.Buffer
	if err := t.Execute(&buf, d); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	// Nothing but the handler's own files, and no framing: a page of another site can neither
	// load into it nor overlay its buttons.
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	w.WriteHeader(code)
	w.Write(buf.Bytes())
}

// root returns the way from the page r asks for back to the handler's root: "./" for "/" and
// "/topology", "../" for "/queues/name". The page's links are relative to it, so that the
// handler works under whatever prefix it is mounted.
func root(r *http.Request) string {
	depth := strings.Count(r.URL.EscapedPath(), "/") - 1
	if depth <= 0 {
		return "./"
	}
	return strings.Repeat("../", depth)
}

// overviewPage is the data of the overview page.
type overviewPage struct {
	Overview overview
	Queues   []queueInfo
}

func (s *Server) pageOverview(w http.ResponseWriter, r *http.Request) {
	st := s.b.Stats()
	s.render(w, r, s.pages.overview, http.StatusOK, pageData{Title: "Overview", Stream: "api/stream",
		Data: overviewPage{Overview: s.overviewOf(st), Queues: s.queues(st.Queues)}})
}

// queuePage is the data of a queue's page.
type queuePage struct {
	Queue  queueDetail
	Page   messagePage
	After  uint64   // the page's after=
	Others []string // the destinations a move offers
	// Back is the destination a move offers first: the queue the first message was
	// dead-lettered from, when it was.
	Back string
}

func (s *Server) pageQueue(w http.ResponseWriter, r *http.Request) {
	name := queueName(r)
	after, limit, err := pageQuery(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// One listing finds the queue and the destinations a move offers.
	var (
		q      *warren.Queue
		others []string
	)
	for o := range s.b.Queues() {
		if o.Name() == name {
			q = o
		} else {
			others = append(others, o.Name())
		}
	}
	if q == nil {
		s.render(w, r, s.pages.notFound, http.StatusNotFound, pageData{Title: "Not found", Data: name})
		return
	}
	p := queuePage{Queue: queueDetailOf(q), After: after, Others: others}
	if !p.Queue.Exclusive { // as the messages endpoint refuses it
		p.Page = browse(q, after, limit)
	}
	if len(p.Page.Messages) > 0 && len(p.Page.Messages[0].Deaths) > 0 {
		p.Back = p.Page.Messages[0].Deaths[0].Queue
	}
	s.render(w, r, s.pages.queue, http.StatusOK, pageData{Title: name, Stream: "api/stream?queue=" + url.QueryEscape(name), Data: p})
}

// topologyPage is the data of the topology page: each exchange with the bindings from it.
type topologyPage struct {
	Exchanges []exchangeBindings
	Unbound   []string // queues no binding leads to (the default exchange's aside)
}

type exchangeBindings struct {
	Exchange exchangeInfo
	Bindings []bindingInfo
}

func (s *Server) pageTopology(w http.ResponseWriter, r *http.Request) {
	from := make(map[string][]bindingInfo)
	bound := make(map[string]bool)
	for _, b := range s.bindings() {
		from[b.Source] = append(from[b.Source], b)
		if b.DestinationType == "queue" {
			bound[b.Destination] = true
		}
	}
	var t topologyPage
	for _, x := range s.exchanges() {
		if x.Predeclared && x.Name != "" && len(from[x.Name]) == 0 {
			continue // an amq. exchange nobody uses
		}
		t.Exchanges = append(t.Exchanges, exchangeBindings{Exchange: x, Bindings: from[x.Name]})
	}
	for q := range s.b.Queues() {
		if !bound[q.Name()] && !q.Exclusive() { // an exclusive queue's bindings are not listed
			t.Unbound = append(t.Unbound, q.Name())
		}
	}
	s.render(w, r, s.pages.topology, http.StatusOK, pageData{Title: "Topology", Data: t})
}

// staticHandler serves the embedded static files.
func staticHandler() http.Handler {
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic("admin: " + err.Error()) // the embed above guarantees the directory
	}
	return http.StripPrefix("/static", http.FileServerFS(sub))
}

// byteSize formats n bytes for a person: "512 B", "1.5 KiB", "12.3 MiB". admin.js's bytes
// formats them the same (one decimal, rounded half up), so that the live view agrees with the
// page it updates.
func byteSize(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	const units = "KMGTPE"
	v, i := float64(n)/1024, 0
	for math.Round(v*10) >= 10240 && i < len(units)-1 { // 1023.96 KiB is 1.0 MiB, not 1024.0 KiB
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %ciB", math.Round(v*10)/10, units[i])
}

// memoryLimit formats a memory budget: its size, or "no limit" for 0 (warren.NoMemoryLimit).
func memoryLimit(n int64) string {
	if n <= 0 {
		return "no limit"
	}
	return byteSize(n)
}

// memoryRatio is the share of the budget limit that used takes, from 0 to 1 (1 when over it);
// 0 with no limit.
func memoryRatio(used, limit int64) float64 {
	if limit <= 0 {
		return 0
	}
	return min(float64(used)/float64(limit), 1)
}

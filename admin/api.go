package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/warrenmq/warren"
)

// The JSON API's reads and actions. Each read makes the broker calls it needs and holds no lock
// of its own; a queue's lock is taken only by those calls (Stats, BrowseFrom of one message,
// Consumers), one short critical section each.

// overview is GET /api/overview.
type overview struct {
	Exchanges  int               `json:"exchanges"` // the predeclared ones included
	Queues     int               `json:"queues"`
	Unroutable uint64            `json:"unroutable"` // publishes that reached no queue
	Totals     warren.QueueStats `json:"totals"`     // every queue's stats summed; oldest_age the largest
	// Memory is the broker's memory budget: used and limit in bytes (limit 0: no limit), alarm
	// while publishes wait for memory, waiting how many do, alarms how many times it was set.
	Memory  warren.MemoryStats `json:"memory"`
	Actions bool               `json:"actions"` // whether AllowActions was given
}

func (s *Server) overview() overview { return s.overviewOf(s.b.Stats()) }

func (s *Server) overviewOf(st warren.BrokerStats) overview {
	return overview{Exchanges: st.Exchanges, Queues: len(st.Queues), Unroutable: st.Unroutable,
		Totals: sum(st.Queues), Memory: st.Memory, Actions: s.cfg.actions}
}

// sum adds up queues' stats.
func sum(qs []warren.QueueStats) warren.QueueStats {
	var t warren.QueueStats
	for _, q := range qs {
		t.Ready += q.Ready
		t.Unacked += q.Unacked
		t.Delayed += q.Delayed
		t.Consumers += q.Consumers
		t.Bytes += q.Bytes
		t.OldestAge = max(t.OldestAge, q.OldestAge)
		t.Enqueued += q.Enqueued
		t.Delivered += q.Delivered
		t.Redelivered += q.Redelivered
		t.Acked += q.Acked
		t.Nacked += q.Nacked
		t.Rejected += q.Rejected
		t.Expired += q.Expired
		t.DeadLettered += q.DeadLettered
		t.Dropped += q.Dropped
		t.Moved += q.Moved
	}
	return t
}

func (s *Server) getOverview(w http.ResponseWriter, r *http.Request) { writeJSON(w, s.overview()) }

// queueInfo is a queue as GET /api/queues lists it.
type queueInfo struct {
	Name       string            `json:"name"`
	Durable    bool              `json:"durable"`
	AutoDelete bool              `json:"auto_delete"`
	Exclusive  bool              `json:"exclusive"`
	Arguments  map[string]any    `json:"arguments,omitempty"` // readable (see readable); none shown for an exclusive queue
	Stats      warren.QueueStats `json:"stats"`
}

// queues returns every queue's info, sorted by name, with its stats from known (a snapshot
// the caller took already), or read now for a queue known lacks.
func (s *Server) queues(known []warren.QueueStats) []queueInfo {
	byName := make(map[string]warren.QueueStats, len(known))
	for _, st := range known {
		byName[st.Queue] = st
	}
	out := []queueInfo{}
	for q := range s.b.Queues() {
		st, ok := byName[q.Name()]
		if !ok {
			st = q.Stats()
		}
		out = append(out, queueInfoOf(q, st))
	}
	return out
}

func queueInfoOf(q *warren.Queue, st warren.QueueStats) queueInfo {
	d := q.Declaration()
	info := queueInfo{Name: q.Name(), Durable: d.Durable, AutoDelete: d.AutoDelete, Exclusive: q.Exclusive(), Stats: st}
	if !info.Exclusive { // an exclusive queue's arguments are its owner's business
		info.Arguments = readableTable(d.Arguments)
	}
	return info
}

func (s *Server) getQueues(w http.ResponseWriter, r *http.Request) { writeJSON(w, s.queues(nil)) }

// queueDetail is a queue as GET /api/queues/{name} shows it: as listed, with its consumers.
type queueDetail struct {
	queueInfo
	Consumers []consumerInfo `json:"consumers"` // in the order they started
}

// consumerInfo is one of a queue's consumers ([warren.ConsumerInfo]).
type consumerInfo struct {
	Tag        string `json:"tag"`
	Status     string `json:"status"`   // active, waiting (single active consumer) or stopped (still holding)
	Prefetch   int    `json:"prefetch"` // 0 for unlimited
	Priority   int    `json:"priority"`
	AutoAck    bool   `json:"auto_ack"`
	Exclusive  bool   `json:"exclusive"`
	Selector   bool   `json:"selector"`
	Served     bool   `json:"served"`                // started by Serve
	AckTimeout string `json:"ack_timeout,omitempty"` // a duration, "30m0s"; none when absent
	Unacked    int    `json:"unacked"`
}

// queueDetailOf returns q's info and consumers.
func queueDetailOf(q *warren.Queue) queueDetail {
	out := queueDetail{queueInfo: queueInfoOf(q, q.Stats()), Consumers: []consumerInfo{}}
	for _, c := range q.Consumers() {
		ci := consumerInfo{Tag: c.Tag, Status: c.Status, Prefetch: c.Prefetch, Priority: c.Priority,
			AutoAck: c.AutoAck, Exclusive: c.Exclusive, Selector: c.Selector, Served: c.Served, Unacked: c.Unacked}
		if c.AckTimeout > 0 {
			ci.AckTimeout = c.AckTimeout.String()
		}
		out.Consumers = append(out.Consumers, ci)
	}
	return out
}

func (s *Server) getQueue(w http.ResponseWriter, r *http.Request) {
	q, err := s.queue(queueName(r))
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	writeJSON(w, queueDetailOf(q))
}

// queue finds a queue by listing the broker's: [warren.Broker.Queue] counts as a use of the
// queue (it resets an [warren.Expires] timer), and looking is not using. An exclusive queue is
// found too.
func (s *Server) queue(name string) (*warren.Queue, error) {
	for q := range s.b.Queues() {
		if q.Name() == name {
			return q, nil
		}
	}
	return nil, fmt.Errorf("admin: queue %q: %w", name, warren.ErrNotFound)
}

// Paging through a queue's messages.
const (
	defaultLimit = 50  // messages a page, when the request does not say
	maxLimit     = 500 // messages a page, at most
	// browseChunk is how many messages one BrowseFrom call reads: a page is read one message
	// per call, each its own critical section, the shortest BrowseFrom holds a queue's lock (a
	// seek and one entry's copy, about half of Stats' hold; a call for 50 would hold it about
	// 13 times as long as Stats: warren's BenchmarkLockHold).
	browseChunk = 1
)

// messagePage is GET /api/queues/{name}/messages.
type messagePage struct {
	Queue    string        `json:"queue"`
	Messages []messageInfo `json:"messages"`
	// Next is the after= of the next page; 0 when this page is the last.
	Next uint64 `json:"next,omitempty"`
}

// browse returns the page of up to limit ready messages of q after the one with ID after.
func browse(q *warren.Queue, after uint64, limit int) messagePage {
	p := messagePage{Queue: q.Name(), Messages: []messageInfo{}}
	for len(p.Messages) < limit {
		n := min(browseChunk, limit-len(p.Messages))
		chunk := q.BrowseFrom(after, n)
		for _, m := range chunk {
			p.Messages = append(p.Messages, messageInfoOf(m))
			after = m.ID
		}
		if len(chunk) < n {
			return p
		}
	}
	if len(q.BrowseFrom(after, 1)) > 0 { // a full page is the last one when nothing follows
		p.Next = after
	}
	return p
}

func (s *Server) getMessages(w http.ResponseWriter, r *http.Request) {
	after, limit, err := pageQuery(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	q, err := s.queue(queueName(r))
	if err == nil && q.Exclusive() {
		// RabbitMQ's management refuses it too: its get fails with the channel's 405
		// RESOURCE_LOCKED (answered as a 400 that says so).
		err = fmt.Errorf("admin: queue %q is exclusive: its messages are its owner's: %w", q.Name(), warren.ErrResourceLocked)
	}
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	writeJSON(w, browse(q, after, limit))
}

// pageQuery reads ?after=ID&limit=N: after defaults to 0 (the head), limit to defaultLimit
// and is at most maxLimit.
func pageQuery(r *http.Request) (after uint64, limit int, err error) {
	limit = defaultLimit
	if v := r.URL.Query().Get("after"); v != "" {
		if after, err = strconv.ParseUint(v, 10, 64); err != nil {
			return 0, 0, fmt.Errorf("admin: after=%q: not a message ID", v)
		}
	}
	if v := r.URL.Query().Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > maxLimit {
			return 0, 0, fmt.Errorf("admin: limit=%q: not a number from 1 to %d", v, maxLimit)
		}
	}
	return after, limit, nil
}

// exchangeInfo is an exchange as GET /api/exchanges lists it.
type exchangeInfo struct {
	Name        string         `json:"name"` // "" for the default exchange
	Kind        string         `json:"kind"`
	Durable     bool           `json:"durable"`
	AutoDelete  bool           `json:"auto_delete"`
	Internal    bool           `json:"internal"`
	Predeclared bool           `json:"predeclared"` // the default exchange and the "amq." ones, which every broker has
	Arguments   map[string]any `json:"arguments,omitempty"`
}

// exchanges returns every exchange, sorted by name.
func (s *Server) exchanges() []exchangeInfo {
	out := []exchangeInfo{}
	for x := range s.b.Exchanges() {
		d := x.Declaration()
		out = append(out, exchangeInfo{Name: d.Name, Kind: d.Kind, Durable: d.Durable, AutoDelete: d.AutoDelete,
			Internal: d.Internal, Predeclared: predeclared(d.Name), Arguments: readableTable(d.Arguments)})
	}
	return out
}

// predeclared reports whether every broker has the exchange: the default one and the "amq." ones.
func predeclared(name string) bool { return name == "" || strings.HasPrefix(name, "amq.") }

func (s *Server) getExchanges(w http.ResponseWriter, r *http.Request) { writeJSON(w, s.exchanges()) }

// bindingInfo is a binding as GET /api/bindings lists it.
type bindingInfo struct {
	Source          string         `json:"source"`
	Destination     string         `json:"destination"`
	DestinationType string         `json:"destination_type"` // "queue" or "exchange"
	RoutingKey      string         `json:"routing_key"`
	Arguments       map[string]any `json:"arguments,omitempty"`
}

// bindings returns every binding, sorted by source, destination and key.
func (s *Server) bindings() []bindingInfo {
	out := []bindingInfo{}
	for _, d := range s.b.Topology().Bindings {
		kind := "queue"
		if d.ToExchange {
			kind = "exchange"
		}
		out = append(out, bindingInfo{Source: d.Source, Destination: d.Destination, DestinationType: kind,
			RoutingKey: d.RoutingKey, Arguments: readableTable(d.Arguments)})
	}
	return out
}

func (s *Server) getBindings(w http.ResponseWriter, r *http.Request) { writeJSON(w, s.bindings()) }

func (s *Server) getToken(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, map[string]string{"token": s.token, "header": tokenHeader})
}

// Actions: each runs behind Server.action's checks.

func (s *Server) postPurge(w http.ResponseWriter, r *http.Request) {
	q, err := s.queue(queueName(r))
	if err == nil {
		var n int
		if n, err = q.Purge(); err == nil {
			writeJSON(w, map[string]int{"purged": n})
			return
		}
	}
	writeError(w, statusOf(err), err)
}

// deleteRequest is POST /api/queues/{name}/delete's body, which may be empty.
type deleteRequest struct {
	IfUnused bool `json:"if_unused"`
	IfEmpty  bool `json:"if_empty"`
}

func (s *Server) postDelete(w http.ResponseWriter, r *http.Request) {
	var req deleteRequest
	if err := decode(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	var opts []warren.CallOption
	if req.IfUnused {
		opts = append(opts, warren.IfUnused())
	}
	if req.IfEmpty {
		opts = append(opts, warren.IfEmpty())
	}
	// Looked up first: deleting a queue that does not exist succeeds, as in AMQP, but a page
	// that asks has a stale view, which a 404 tells it.
	q, err := s.queue(queueName(r))
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	n, err := s.b.DeleteQueue(q.Name(), opts...)
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	writeJSON(w, map[string]int{"deleted": n})
}

// moveRequest is POST /api/queues/{name}/move's body: a destination, Queue or Exchange and
// RoutingKey; and which messages, all of them (neither Limit nor IDs), the first Limit, or
// those with IDs.
type moveRequest struct {
	Queue      string   `json:"queue"` // the default exchange and this key
	Exchange   string   `json:"exchange"`
	RoutingKey string   `json:"routing_key"`
	Limit      int      `json:"limit"`
	IDs        []uint64 `json:"ids"`
}

// moveResult is what a move answers; with an error when it stopped early.
type moveResult struct {
	Moved int    `json:"moved"`
	Error string `json:"error,omitempty"`
}

func (s *Server) postMove(w http.ResponseWriter, r *http.Request) {
	var req moveRequest
	err := decode(r, &req)
	switch {
	case err != nil:
	case req.Queue != "" && (req.Exchange != "" || req.RoutingKey != ""):
		err = errors.New("admin: move: either a queue or an exchange and routing key, not both")
	case req.Queue == "" && req.Exchange == "" && req.RoutingKey == "":
		err = errors.New("admin: move: no destination: a queue, or an exchange and routing key")
	case req.Limit < 0 || req.Limit > 0 && req.IDs != nil:
		err = errors.New("admin: move: limit must be positive, and not given with ids")
	case req.IDs != nil && len(req.IDs) == 0:
		err = errors.New("admin: move: ids is empty")
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	q, err := s.queue(queueName(r))
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	exchange, key := req.Exchange, req.RoutingKey
	if req.Queue != "" {
		key = req.Queue
	}
	var opt warren.MoveOption
	switch {
	case req.Limit > 0:
		opt = warren.MoveLimit(req.Limit)
	case req.IDs != nil:
		opt = warren.MoveIDs(req.IDs...)
	}
	n, err := q.Move(r.Context(), exchange, key, opt)
	if err != nil {
		writeJSONStatus(w, statusOf(err), moveResult{Moved: n, Error: err.Error()})
		return
	}
	writeJSON(w, moveResult{Moved: n})
}

// publishRequest is POST /api/publish's body: a test message.
type publishRequest struct {
	Exchange    string            `json:"exchange"`
	RoutingKey  string            `json:"routing_key"`
	Body        string            `json:"body"`
	ContentType string            `json:"content_type"`
	Headers     map[string]string `json:"headers"`
	Persistent  bool              `json:"persistent"`
	Mandatory   bool              `json:"mandatory"` // fail with 409 if no queue takes it
}

func (s *Server) postPublish(w http.ResponseWriter, r *http.Request) {
	var req publishRequest
	if err := decode(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	msg := warren.Message{Body: []byte(req.Body), ContentType: req.ContentType, Persistent: req.Persistent}
	if len(req.Headers) > 0 {
		msg.Headers = make(warren.Table, len(req.Headers))
		for k, v := range req.Headers {
			msg.Headers[k] = v
		}
	}
	var opts []warren.PublishOption
	if req.Mandatory {
		opts = append(opts, warren.Mandatory())
	}
	if err := s.b.Publish(r.Context(), req.Exchange, req.RoutingKey, msg, opts...); err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	writeJSON(w, map[string]bool{"published": true})
}

// decode reads a request's JSON body into v; an empty body leaves v as it is.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && err != io.EOF {
		return fmt.Errorf("admin: request body: %w", err)
	}
	return nil
}

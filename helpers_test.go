package warren_test

// The helpers the test files share (a helper one file uses stays in that file). Each file's
// top comment says which code file or concept its tests specify.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// ---------------------------------------------------------------------------------------------
// Brokers and queues.

// newBroker returns a broker made with opts, closed when the test or benchmark ends (a
// benchmark may close it itself, to count the goroutines it leaves).
func newBroker(tb testing.TB, opts ...warren.BrokerOption) *warren.Broker {
	tb.Helper()
	b := warren.New(opts...)
	tb.Cleanup(func() { b.Close() })
	return b
}

// declare declares a queue and fails the test on error.
func declare(tb testing.TB, b *warren.Broker, name string, opts ...warren.QueueOption) *warren.Queue {
	tb.Helper()
	q, err := b.DeclareQueue(name, opts...)
	require.NoError(tb, err)
	return q
}

// deleteQueue deletes a queue, fails the test on error, and returns how many ready messages went
// with it.
func deleteQueue(t testing.TB, b *warren.Broker, name string, opts ...warren.CallOption) int {
	t.Helper()
	n, err := b.DeleteQueue(name, opts...)
	require.NoError(t, err)
	return n
}

// queueExists reports whether the broker has a queue named name.
func queueExists(t *testing.T, b *warren.Broker, name string) bool {
	t.Helper()
	_, err := b.Queue(name)
	if err != nil {
		require.ErrorIs(t, err, warren.ErrNotFound)
		return false
	}
	return true
}

// deadTopology declares queue main with opts plus a dead-letter exchange e-dead (fanout) bound
// to queue dead.
func deadTopology(t *testing.T, b *warren.Broker, opts ...warren.QueueOption) (main, dead *warren.Queue) {
	t.Helper()
	_, err := b.DeclareExchange("e-dead", warren.ExchangeFanout)
	require.NoError(t, err)
	dead = declare(t, b, "dead")
	require.NoError(t, b.Bind("dead", "e-dead", "", nil))
	main = declare(t, b, "main", append([]warren.QueueOption{warren.DeadLetter("e-dead", "")}, opts...)...)
	return main, dead
}

// ---------------------------------------------------------------------------------------------
// Messages and publishing.

// msg is a message with body.
func msg(body string) warren.Message { return warren.Message{Body: []byte(body)} }

// kindIs selects the messages whose "kind" header is kind.
func kindIs(kind string) warren.ConsumerOption {
	return warren.Selector(func(m *warren.Message) bool { return m.Headers["kind"] == kind })
}

// publish publishes a message with body to queue through the default exchange, failing the
// test on error.
func publish(t *testing.T, b *warren.Broker, queue, body string, opts ...warren.PublishOption) {
	t.Helper()
	publishMsg(t, b, queue, msg(body), opts...)
}

// publishMsg publishes m to queue through the default exchange, failing the test on error.
func publishMsg(t *testing.T, b *warren.Broker, queue string, m warren.Message, opts ...warren.PublishOption) {
	t.Helper()
	require.NoError(t, b.Publish(t.Context(), "", queue, m, opts...))
}

// publishN publishes bodies "0".."n-1" to q through the default exchange.
func publishN(t *testing.T, b *warren.Broker, q *warren.Queue, n int) {
	t.Helper()
	publishRange(t, b, q, 0, n)
}

// publishRange publishes bodies "from".."to-1" to q through the default exchange.
func publishRange(t *testing.T, b *warren.Broker, q *warren.Queue, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		publish(t, b, q.Name(), strconv.Itoa(i))
	}
}

// ---------------------------------------------------------------------------------------------
// Receiving, getting and settling.

// receive takes n deliveries from c, failing if fewer are buffered.
func receive(t *testing.T, c *warren.Consumer, n int) []warren.Delivery {
	t.Helper()
	out := make([]warren.Delivery, 0, n)
	for range n {
		select {
		case d, ok := <-c.Deliveries():
			require.True(t, ok, "Deliveries closed after %d of %d", len(out), n)
			out = append(out, d)
		default:
			t.Fatalf("only %d of %d deliveries buffered", len(out), n)
		}
	}
	return out
}

// buffered receives every delivery buffered for c right now.
func buffered(t *testing.T, c *warren.Consumer) []warren.Delivery {
	t.Helper()
	return receive(t, c, len(c.Deliveries()))
}

// take gets the head of q and acks it, returning its body.
func take(t *testing.T, q *warren.Queue) string {
	t.Helper()
	d, err := q.Get(t.Context())
	require.NoError(t, err)
	require.NoError(t, d.Ack())
	return string(d.Message.Body)
}

// getAll takes every ready message of q with AutoAck, in order.
func getAll(t *testing.T, q *warren.Queue) []warren.Delivery {
	t.Helper()
	var out []warren.Delivery
	for {
		d, err := q.Get(t.Context(), warren.AutoAck())
		if err != nil {
			require.ErrorIs(t, err, warren.ErrEmpty)
			return out
		}
		out = append(out, d)
	}
}

// drain consumes everything ready in q with a fresh consumer and acks it, returning the picture.
func drain(t *testing.T, q *warren.Queue) string {
	t.Helper()
	n := q.Len()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	c, err := q.Consume(ctx, warren.Prefetch(n+1))
	require.NoError(t, err)
	ds := receive(t, c, n)
	ackAll(t, ds)
	return picture(ds)
}

// browse returns the bodies of q's ready messages in delivery order.
func browse(q *warren.Queue) []string {
	var out []string
	for m := range q.Browse() {
		out = append(out, string(m.Body))
	}
	return out
}

// ackAll acks ds.
func ackAll(t *testing.T, ds []warren.Delivery) {
	t.Helper()
	for _, d := range ds {
		require.NoError(t, d.Ack())
	}
}

// bodies renders deliveries' bodies space-separated.
func bodies(ds []warren.Delivery) string {
	var s []string
	for _, d := range ds {
		s = append(s, string(d.Message.Body))
	}
	return strings.Join(s, " ")
}

// picture renders deliveries as "0* 1* 2* 3 4": the body, starred when redelivered.
func picture(ds []warren.Delivery) string {
	var s []string
	for _, d := range ds {
		p := string(d.Message.Body)
		if d.Redelivered {
			p += "*"
		}
		s = append(s, p)
	}
	return strings.Join(s, " ")
}

// deliveryCounts renders the delivery counts of ds.
func deliveryCounts(ds []warren.Delivery) []int {
	out := make([]int, 0, len(ds))
	for _, d := range ds {
		out = append(out, d.DeliveryCount)
	}
	return out
}

// xDeath returns the x-death entries of a delivery.
func xDeath(t *testing.T, d warren.Delivery) []warren.Table {
	t.Helper()
	list, ok := d.Message.Headers["x-death"].([]any)
	require.True(t, ok, "x-death of %s: %#v", d.Message.Body, d.Message.Headers["x-death"])
	var out []warren.Table
	for _, e := range list {
		out = append(out, e.(warren.Table))
	}
	return out
}

// ---------------------------------------------------------------------------------------------
// Consumers, channels and errors.

// isClosed reports whether ch is closed, without waiting.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// assertStopped asserts that c has stopped with want and that its Deliveries channel is
// closed and empty now, without waiting: the call that stopped it (Close, DeleteQueue) must have
// finished with it by the time it returned.
func assertStopped(t *testing.T, c *warren.Consumer, want error) {
	t.Helper()
	assert.True(t, errors.Is(c.Err(), want), "consumer %s: Err() = %v, want %v", c.Tag(), c.Err(), want)
	select {
	case d, ok := <-c.Deliveries():
		if ok {
			t.Errorf("consumer %s: Deliveries() yielded %q, want closed", c.Tag(), d.Message.Body)
		}
	default:
		t.Errorf("consumer %s: Deliveries() not closed", c.Tag())
	}
	select {
	case <-c.Done():
	default:
		t.Errorf("consumer %s: Done() not closed", c.Tag())
	}
}

// requireOnePrefix fails the test unless err's text says "warren: " once, at the start.
func requireOnePrefix(t *testing.T, err error) {
	t.Helper()
	if text := err.Error(); !strings.HasPrefix(text, "warren: ") || strings.Count(text, "warren:") != 1 {
		t.Fatalf("error %q: want %q once, at the start", text, "warren: ")
	}
}

// ---------------------------------------------------------------------------------------------
// Events and logs.

// eventLog records every event of a broker.
type eventLog struct {
	mu  sync.Mutex
	evs []warren.Event
}

// recordEvents starts recording every event of b, until the test ends.
func recordEvents(t *testing.T, b *warren.Broker) *eventLog {
	t.Helper()
	r := &eventLog{}
	t.Cleanup(b.Listen(func(e warren.Event) {
		r.mu.Lock()
		r.evs = append(r.evs, e)
		r.mu.Unlock()
	}))
	return r
}

// all returns the events recorded so far, in order.
func (r *eventLog) all() []warren.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.evs)
}

// where returns the events recorded so far that keep keeps.
func (r *eventLog) where(keep func(warren.Event) bool) []warren.Event {
	var evs []warren.Event
	for _, e := range r.all() {
		if keep(e) {
			evs = append(evs, e)
		}
	}
	return evs
}

// ofKind returns the events of kind.
func (r *eventLog) ofKind(kind warren.EventKind) []warren.Event { return r.of(kind, "") }

// about returns the message events of queue about the message with body (or its copies).
func (r *eventLog) about(queue, body string) []warren.Event {
	return r.where(func(e warren.Event) bool {
		return e.Queue == queue && e.Message != nil && string(e.Message.Body) == body &&
			(e.Kind == warren.EventEnqueued || e.Kind == warren.EventDelivered || e.Kind == warren.EventRequeued || e.Kind.Terminal())
	})
}

// trace renders the message events of queue about body, in order: "enqueued delivered acked".
func (r *eventLog) trace(queue, body string) string {
	var s []string
	for _, e := range r.about(queue, body) {
		s = append(s, eventName(e))
	}
	return strings.Join(s, " ")
}

// one returns the only event of kind in queue about body.
func (r *eventLog) one(t *testing.T, queue, body string, kind warren.EventKind) warren.Event {
	t.Helper()
	var evs []warren.Event
	for _, e := range r.about(queue, body) {
		if e.Kind == kind {
			evs = append(evs, e)
		}
	}
	require.Len(t, evs, 1, "%s events of %q in %q", kind, body, queue)
	return evs[0]
}

// topology renders the entity events, in order.
func (r *eventLog) topology() []string {
	var s []string
	for _, e := range r.all() {
		switch e.Kind {
		case warren.EventExchangeCreated, warren.EventExchangeDeleted:
			s = append(s, fmt.Sprintf("%s %s", eventName(e), e.Exchange))
		case warren.EventQueueCreated, warren.EventQueueDeleted:
			s = append(s, fmt.Sprintf("%s %s", eventName(e), e.Queue))
		case warren.EventBindingCreated, warren.EventBindingDeleted:
			dst := e.Queue
			if e.DestinationExchange != "" {
				dst = "exchange " + e.DestinationExchange
			}
			s = append(s, fmt.Sprintf("%s %s->%s key %q", eventName(e), e.Exchange, dst, e.RoutingKey))
		case warren.EventConsumerCreated, warren.EventConsumerDeleted:
			s = append(s, fmt.Sprintf("%s %s/%s", eventName(e), e.Queue, e.Consumer))
		}
	}
	return s
}

// of returns the events of kind about queue (any queue when queue is "").
func (r *eventLog) of(kind warren.EventKind, queue string) []warren.Event {
	return r.where(func(e warren.Event) bool { return e.Kind == kind && (queue == "" || e.Queue == queue) })
}

// alerts returns the EventAlerts of reason.
func (r *eventLog) alerts(reason warren.Reason) []warren.Event {
	var out []warren.Event
	for _, e := range r.of(warren.EventAlert, "") {
		if e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// eventName names an event by its kind, and its reason if it has one: "dropped(maxlen)".
func eventName(e warren.Event) string {
	if e.Reason != "" {
		return e.Kind.String() + "(" + string(e.Reason) + ")"
	}
	return e.Kind.String()
}

// logBuffer is a log destination safe for concurrent writes, for a broker's slog handler.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String returns what was written.
func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// records returns the records, written by a JSON handler, with message msg.
func (l *logBuffer) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(l.buf.Bytes()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), "%s", sc.Bytes())
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	require.NoError(t, sc.Err())
	return out
}

// ---------------------------------------------------------------------------------------------
// The span checker: the invariant of events.go, checked event by event.

// spanKey names one message in one queue: the queue and the *Message its events there carry.
type spanKey struct {
	queue string
	msg   *warren.Message
}

// idKey names a message by the id it was published with, in one queue: dead-letter outcomes
// carry a copy of the message, found again by its id.
type idKey struct{ queue, id string }

// span is an open span: a message that entered a queue and has not left it.
type span struct {
	id    string
	depth int64 // deaths in its history: tells copies of one message in one queue apart
	out   bool  // delivered, not yet settled or back
	trail []string
}

// eventCounts counts the events of one incarnation of a queue, to compare with its Stats.
type eventCounts struct {
	kinds         map[warren.EventKind]int
	requeued      map[warren.Reason]int // by reason
	lone          int                   // terminal events with no Enqueued before: refusals on arrival
	expiredCopies int                   // dead-letter outcomes of expired messages
}

func newEventCounts() *eventCounts {
	return &eventCounts{kinds: map[warren.EventKind]int{}, requeued: map[warren.Reason]int{}}
}

// spanChecker is a listener that checks, event by event, that the events of every message in
// every queue form spans (events.go):
//
//	Enqueued → (Delivered → Requeued)* → [Delivered] → exactly one terminal
//
// Delivered only when the message is in the queue; Requeued, Acked and a rejection only when it
// is out; expiry, a length limit, a purge or the delivery limit only when it is in the queue (a
// delivery comes back first, with Requeued); a lone terminal only for a refusal on arrival; an
// Enqueued with Reason "returned" only after an Acked of the same message in the same queue; no
// message left in a queue when its deletion is evented. Dead-letter outcomes (DeadLettered, and
// Dropped for a dead-letter exchange missing, routing nowhere or cycling) carry the
// dead-lettered copy: they are matched to the original's span by the id it was published with
// and its death count. It also counts events per queue incarnation, for comparison with Stats.
type spanChecker struct {
	mu sync.Mutex
	// refuseDLX are the queues with RejectPublishDLX, which dead-letter what they refuse: a
	// dead-letter outcome with reason maxlen and no span is a refusal there.
	refuseDLX map[string]bool

	open    map[spanKey]*span
	byID    map[idKey][]spanKey
	lastEnd map[spanKey]warren.EventKind // how the last span of a key ended
	cur     map[string]*eventCounts      // per queue name: the incarnation that exists
	ended   map[string][]*eventCounts    // per queue name: incarnations ended, in order
	gone    map[string]bool              // queues whose deletion was the last event of theirs

	published, unroutable, events int
	errs                          []string
	seen                          map[string]int // message events by kind(reason), lone ones marked
}

func newSpanChecker(refuseDLX ...string) *spanChecker {
	c := &spanChecker{
		refuseDLX: map[string]bool{},
		open:      map[spanKey]*span{},
		byID:      map[idKey][]spanKey{},
		lastEnd:   map[spanKey]warren.EventKind{},
		cur:       map[string]*eventCounts{},
		ended:     map[string][]*eventCounts{},
		gone:      map[string]bool{},
		seen:      map[string]int{},
	}
	for _, q := range refuseDLX {
		c.refuseDLX[q] = true
	}
	return c
}

// checkSpans registers a checker with b and, when the test ends, asserts that it saw no broken
// span (spans still open are not checked: the broker may not be closed yet).
func checkSpans(t *testing.T, b *warren.Broker, refuseDLX ...string) *spanChecker {
	t.Helper()
	c := newSpanChecker(refuseDLX...)
	stop := b.Listen(c.handle)
	t.Cleanup(func() {
		stop()
		assert.Empty(t, c.errors(), "events that break the span invariant")
	})
	return c
}

// publishedID is the id a message was published with: its "id" header, else its body.
func publishedID(m *warren.Message) string {
	if id, ok := m.Headers["id"].(int64); ok {
		return "m" + strconv.FormatInt(id, 10)
	}
	return string(m.Body)
}

// deathCount is how many times the message was dead-lettered.
func deathCount(m *warren.Message) (n int64) {
	for _, d := range m.Deaths() {
		n += d.Count
	}
	return n
}

func lastDeath(m *warren.Message) (queue string, reason warren.Reason) {
	queue, _ = m.Headers["x-last-death-queue"].(string)
	r, _ := m.Headers["x-last-death-reason"].(string)
	reason = warren.Reason(r)
	return queue, reason
}

func describeEvent(e warren.Event) string {
	s := fmt.Sprintf("queue %q: %s", e.Queue, eventName(e))
	if e.Message != nil {
		s += fmt.Sprintf(" of %s (depth %d)", publishedID(e.Message), deathCount(e.Message))
	}
	if e.Consumer != "" {
		s += fmt.Sprintf(" consumer %q", e.Consumer)
	}
	return s
}

func (c *spanChecker) errorf(format string, args ...any) {
	if len(c.errs) < 50 {
		c.errs = append(c.errs, fmt.Sprintf(format, args...))
	}
}

func (c *spanChecker) errors() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.errs)
}

func (c *spanChecker) counts(queue string) *eventCounts {
	n := c.cur[queue]
	if n == nil {
		n = newEventCounts()
		c.cur[queue] = n
	}
	return n
}

// openSpans describes the spans still open.
func (c *spanChecker) openSpans() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var s []string
	for k, sp := range c.open {
		s = append(s, fmt.Sprintf("queue %q: %s: %s", k.queue, sp.id, strings.Join(sp.trail, " ")))
	}
	slices.Sort(s)
	return s
}

func (c *spanChecker) handle(e warren.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events++
	switch e.Kind {
	case warren.EventPublished:
		c.published++
		return
	case warren.EventUnroutable:
		c.unroutable++
		return
	case warren.EventQueueCreated:
		if n := c.cur[e.Queue]; n != nil && len(n.kinds) > 0 {
			c.errorf("queue %q created while it had events and no deletion", e.Queue)
		}
		c.cur[e.Queue] = newEventCounts()
		delete(c.gone, e.Queue)
		return
	case warren.EventQueueDeleted:
		// Its messages were all evented as gone before: the deletion comes last among the
		// queue's effects.
		for k, sp := range c.open {
			if k.queue == e.Queue {
				c.errorf("queue %q deleted (%s) with %s still in it: %s", e.Queue, e.Reason, sp.id, strings.Join(sp.trail, " "))
				c.closeSpan(k, e.Kind)
			}
		}
		c.ended[e.Queue] = append(c.ended[e.Queue], c.counts(e.Queue))
		delete(c.cur, e.Queue)
		c.gone[e.Queue] = true
		return
	case warren.EventEnqueued, warren.EventDelivered, warren.EventRequeued,
		warren.EventAcked, warren.EventExpired, warren.EventDeadLettered, warren.EventDropped:
	default:
		return
	}
	if e.Queue == "" || e.Message == nil {
		c.errorf("%s without a queue or message", describeEvent(e))
		return
	}
	var n *eventCounts
	if ended := c.ended[e.Queue]; c.gone[e.Queue] && e.Kind == warren.EventDropped {
		// A publisher routed the message here before the queue was deleted, and it arrived
		// after: the deleted incarnation refuses it, after its deletion event.
		n = ended[len(ended)-1]
	} else {
		n = c.counts(e.Queue)
	}
	n.kinds[e.Kind]++
	lone := n.lone
	defer func() {
		if n.lone > lone {
			c.seen["lone "+eventName(e)]++
		} else {
			c.seen[eventName(e)]++
		}
	}()
	k := spanKey{e.Queue, e.Message}
	sp := c.open[k]
	if sp != nil {
		sp.trail = append(sp.trail, eventName(e))
	}
	switch e.Kind {
	case warren.EventEnqueued:
		if sp != nil {
			c.errorf("%s: entered again with its span open: %s", describeEvent(e), strings.Join(sp.trail, " "))
			return
		}
		_, lastReason := lastDeath(e.Message)
		switch e.Reason {
		case warren.ReasonReturned:
			if c.lastEnd[k] != warren.EventAcked {
				c.errorf("%s: returned without having been acked there (last end %v)", describeEvent(e), c.lastEnd[k])
			}
		case "":
			if lastReason != "" {
				c.errorf("%s: a dead letter entered without its reason (x-death says %q)", describeEvent(e), lastReason)
			}
		default:
			if lastReason != e.Reason {
				c.errorf("%s: reason is not the x-death reason %q", describeEvent(e), lastReason)
			}
		}
		sp = &span{id: publishedID(e.Message), depth: deathCount(e.Message), trail: []string{eventName(e)}}
		c.open[k] = sp
		qid := idKey{e.Queue, sp.id}
		c.byID[qid] = append(c.byID[qid], k)
	case warren.EventDelivered:
		switch {
		case sp == nil:
			c.errorf("%s: delivered outside a span", describeEvent(e))
		case sp.out:
			c.errorf("%s: delivered while out: %s", describeEvent(e), strings.Join(sp.trail, " "))
		default:
			sp.out = true
		}
	case warren.EventRequeued:
		n.requeued[e.Reason]++
		switch e.Reason {
		case warren.ReasonNack, warren.ReasonRecover, warren.ReasonCancel, warren.ReasonOwnerEnded, warren.ReasonAckTimeout:
		default:
			c.errorf("%s: unknown requeue reason", describeEvent(e))
		}
		switch {
		case sp == nil:
			c.errorf("%s: requeued outside a span", describeEvent(e))
		case !sp.out:
			c.errorf("%s: requeued while not out: %s", describeEvent(e), strings.Join(sp.trail, " "))
		default:
			sp.out = false
		}
	case warren.EventAcked:
		switch {
		case sp == nil:
			c.errorf("%s: acked outside a span", describeEvent(e))
		case !sp.out:
			c.errorf("%s: acked while not out: %s", describeEvent(e), strings.Join(sp.trail, " "))
			c.closeSpan(k, e.Kind)
		default:
			c.closeSpan(k, e.Kind)
		}
	case warren.EventExpired:
		if sp == nil {
			c.errorf("%s: expired outside a span", describeEvent(e))
			return
		}
		c.checkOut(e, sp, warren.ReasonExpired)
		c.closeSpan(k, e.Kind)
	case warren.EventDeadLettered:
		c.deadLetterOutcome(e, n)
	case warren.EventDropped:
		switch e.Reason {
		case warren.ReasonQueueFull, warren.ReasonNoConsumers:
			if sp != nil {
				c.errorf("%s: refused on arrival, yet it had entered: %s", describeEvent(e), strings.Join(sp.trail, " "))
				c.closeSpan(k, e.Kind)
				return
			}
			n.lone++
		case warren.ReasonDLXNotFound, warren.ReasonDLXNoRoute, warren.ReasonDeadLetterCycle:
			c.deadLetterOutcome(e, n)
		case warren.ReasonClosed, warren.ReasonQueueDeleted:
			switch src, _ := lastDeath(e.Message); {
			case sp != nil:
				c.closeSpan(k, e.Kind)
			case src == e.Queue:
				// The dead-lettered copy of a message of this queue, dropped because the
				// broker closed before it could be published. (A copy dead-lettered back into
				// its own queue and refused there because that queue went meanwhile would
				// look the same; the tests never delete such a queue, nor close the broker
				// while a dead letter is on its way.)
				c.deadLetterOutcome(e, n)
			default:
				n.lone++ // routed here, and the queue went before the message arrived
			}
		case warren.ReasonRejected, warren.ReasonMaxLen, warren.ReasonDeliveryLimit, warren.ReasonPurged:
			if sp == nil {
				c.errorf("%s: dropped outside a span", describeEvent(e))
				return
			}
			c.checkOut(e, sp, e.Reason)
			c.closeSpan(k, e.Kind)
		default:
			c.errorf("%s: unknown drop reason", describeEvent(e))
		}
	}
}

// deadLetterOutcome matches an event carrying a dead-lettered copy to the span of the original
// in e.Queue, and closes it.
func (c *spanChecker) deadLetterOutcome(e warren.Event, n *eventCounts) {
	src, reason := lastDeath(e.Message)
	if src != e.Queue {
		c.errorf("%s: the copy's last death is from %q", describeEvent(e), src)
	}
	if e.Kind == warren.EventDeadLettered && reason != e.Reason {
		c.errorf("%s: the copy's last death reason is %q", describeEvent(e), reason)
	}
	if reason == warren.ReasonExpired {
		n.expiredCopies++
	}
	if c.open[spanKey{e.Queue, e.Message}] != nil {
		c.errorf("%s: carries the original message, not a copy", describeEvent(e))
	}
	id, depth := publishedID(e.Message), deathCount(e.Message)-1
	var match []spanKey
	for _, k := range c.byID[idKey{e.Queue, id}] {
		if c.open[k].depth == depth {
			match = append(match, k)
		}
	}
	switch len(match) {
	case 1:
		sp := c.open[match[0]]
		sp.trail = append(sp.trail, eventName(e))
		c.checkOut(e, sp, reason)
		c.closeSpan(match[0], e.Kind)
	case 0:
		if c.refuseDLX[e.Queue] && reason == warren.ReasonMaxLen {
			n.lone++ // refused on arrival and dead-lettered (RejectPublishDLX)
			return
		}
		c.errorf("%s: no open span of the original", describeEvent(e))
	default:
		c.errorf("%s: %d open spans could be the original", describeEvent(e), len(match))
	}
}

// checkOut checks where a message was when it left for cause: a rejection takes a delivery
// (out); expiry, a length limit, a purge and the delivery limit take a message in the queue —
// one that was out comes back first (Requeued), then leaves.
func (c *spanChecker) checkOut(e warren.Event, sp *span, cause warren.Reason) {
	switch cause {
	case warren.ReasonRejected:
		if !sp.out {
			c.errorf("%s: rejected while not delivered: %s", describeEvent(e), strings.Join(sp.trail, " "))
		}
	case warren.ReasonExpired, warren.ReasonMaxLen, warren.ReasonPurged, warren.ReasonDeliveryLimit:
		if sp.out {
			c.errorf("%s: left for %s while delivered: %s", describeEvent(e), cause, strings.Join(sp.trail, " "))
		}
	}
}

func (c *spanChecker) closeSpan(k spanKey, how warren.EventKind) {
	sp := c.open[k]
	delete(c.open, k)
	c.lastEnd[k] = how
	qid := idKey{k.queue, sp.id}
	ks := slices.DeleteFunc(c.byID[qid], func(x spanKey) bool { return x == k })
	if len(ks) == 0 {
		delete(c.byID, qid)
	} else {
		c.byID[qid] = ks
	}
}

// ---------------------------------------------------------------------------------------------
// Seeds and runs.

// testSeed returns the seed of a randomized test: $env when it is set, else a random one. It
// logs the seed and how to rerun with it.
func testSeed(tb testing.TB, env string) uint64 {
	tb.Helper()
	seed := envSeed(tb, env, rand.Uint64())
	tb.Logf("seed %d (rerun with %s=%d)", seed, env, seed)
	return seed
}

// envSeed returns $env as a seed, or def when it is not set.
func envSeed(tb testing.TB, env string, def uint64) uint64 {
	tb.Helper()
	s := os.Getenv(env)
	if s == "" {
		return def
	}
	seed, err := strconv.ParseUint(s, 10, 64)
	require.NoError(tb, err, env)
	return seed
}

// modelSeeds returns the first seed and the number of sequences of a model test: random, and
// seqs (20 under -short), unless the environment variables PREFIX_SEED and PREFIX_SEQS say
// otherwise. It logs how to reproduce the run.
func modelSeeds(t *testing.T, prefix string, seqs, nops int) (uint64, int) {
	t.Helper()
	seed := envSeed(t, prefix+"_SEED", rand.Uint64()>>1)
	if testing.Short() {
		seqs = 20
	}
	if s := os.Getenv(prefix + "_SEQS"); s != "" {
		var err error
		seqs, err = strconv.Atoi(s)
		require.NoError(t, err, prefix+"_SEQS")
	}
	t.Logf("seeds %d..%d (%d sequences of %d ops; %s_SEED=%d reproduces)", seed, seed+uint64(seqs)-1, seqs, nops, prefix, seed)
	return seed, seqs
}

var stressSeedFlag = flag.Uint64("warren.stressseed", 0, "seed of TestStress; 0 picks one (also $WARREN_STRESS_SEED)")

// stressSeed returns the seed of the stress tests: the flag's, else testSeed's
// ($WARREN_STRESS_SEED or random).
func stressSeed(t *testing.T) uint64 {
	t.Helper()
	if seed := *stressSeedFlag; seed != 0 {
		t.Logf("seed %d (-warren.stressseed)", seed)
		return seed
	}
	return testSeed(t, "WARREN_STRESS_SEED")
}

// mix hashes a and b (splitmix64 finaliser).
func mix(a, b uint64) uint64 {
	x := a*0x9e3779b97f4a7c15 ^ (b + 0x632be59bd9b4e019)
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// dumpStacks writes every goroutine's stack to a file for a hang's post-mortem and returns
// its name.
func dumpStacks(t *testing.T) string {
	buf := make([]byte, 64<<20)
	buf = buf[:runtime.Stack(buf, true)]
	f, err := os.CreateTemp("", "warren-stress-features-*.txt")
	if err != nil {
		t.Logf("goroutine dump: %v", err)
		return "(none)"
	}
	defer f.Close()
	if _, err := f.Write(buf); err != nil {
		t.Logf("goroutine dump: %v", err)
	}
	return f.Name()
}

// ---------------------------------------------------------------------------------------------
// Benchmarks: what the *_bench_test.go files share (their conventions are at the top of
// queue_bench_test.go).

// benchBody is the body of every benchmark message, allocated once.
var benchBody = make([]byte, 128)

// checkNoGoroutines fails b unless the goroutine count drops back to before. A goroutine
// that has called wg.Done may still be exiting, so it waits a little, without sleeping.
func checkNoGoroutines(b *testing.B, before int) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			b.Fatalf("%d goroutines left behind (started with %d):\n%s", runtime.NumGoroutine()-before, before, buf)
		}
		runtime.Gosched()
	}
}

// publishEvery is how many messages BenchmarkPublish and BenchmarkTopicRouting10kBindings
// publish between two purges.
const publishEvery = 1 << 16

// pcaWindow bounds the messages in flight (published and not yet acknowledged) in
// BenchmarkPublishConsumeAck: the producer blocks while it is this far ahead of the acks, until
// they catch up by half the window. The channel baseline has the same bound: its capacity.
// Without a bound the producer, which never blocks in Publish, would run ahead of the consumers,
// ns/op would time publishing alone and the backlog would grow to millions of messages (see
// DESIGN: backpressure keeps GC quiet).
const pcaWindow = 4096

// ackWindow is that bound. The producer blocks on a channel rather than spinning, so that
// waiting costs neither a core nor scheduler churn (a runtime.Gosched loop here was 20% of the
// CPU profile); a consumer pays one atomic add and one atomic load per ack.
type ackWindow struct {
	size    int64
	acked   atomic.Int64
	waitFor atomic.Int64  // the ack count the producer waits for; 0 when it does not wait
	wake    chan struct{} // capacity 1
}

// ack records one acknowledgement and wakes the producer when it is the one it waits for.
// Exactly one ack reaches any given count, so there is one wake-up per wait.
func (w *ackWindow) ack() {
	if n := w.acked.Add(1); n == w.waitFor.Load() {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// admit blocks while the producer, having published published messages, is size ahead.
func (w *ackWindow) admit(published int64) {
	if published-w.acked.Load() >= w.size {
		w.wait(published - w.size/2)
	}
}

// wait blocks until at least target messages are acked. The producer stores target before it
// loads acked and a consumer adds before it loads target (all sequentially consistent), so
// either the producer sees the ack or the consumer sees the target and wakes it. A stale wake-up
// from an earlier wait only makes the loop check again.
func (w *ackWindow) wait(target int64) {
	w.waitFor.Store(target)
	for w.acked.Load() < target {
		<-w.wake
	}
	w.waitFor.Store(0)
}

func newAckWindow(size int64) *ackWindow {
	return &ackWindow{size: size, wake: make(chan struct{}, 1)}
}

func benchPublishConsumeAck(b *testing.B, consumers, prefetch int) {
	benchPublishConsumeAckWith(b, consumers, prefetch, nil, warren.Message{Body: benchBody}, 0)
}

// benchPublishConsumeAckWith is benchPublishConsumeAck on a queue declared with opts,
// publishing copies of msg, with listeners event listeners that count what they are told.
func benchPublishConsumeAckWith(b *testing.B, consumers, prefetch int, opts []warren.QueueOption, msg warren.Message, listeners int) {
	before := runtime.NumGoroutine()
	br := newBroker(b)
	var heard atomic.Int64
	for range listeners {
		defer br.Listen(func(warren.Event) { heard.Add(1) })()
	}
	q, err := br.DeclareQueue("bench", opts...)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var (
		win      = newAckWindow(pcaWindow)
		firstErr atomic.Pointer[error]
		wg       sync.WaitGroup
		cs       []*warren.Consumer
	)
	// Not inlined into the loop: taking the address of err there would make every
	// iteration's err escape to the heap.
	ackFailed := func(err error) { firstErr.CompareAndSwap(nil, &err) }
	for range consumers {
		c, err := q.Consume(ctx, warren.Prefetch(prefetch))
		if err != nil {
			b.Fatal(err)
		}
		cs = append(cs, c)
		wg.Go(func() {
			for d := range c.Deliveries() {
				if err := d.Ack(); err != nil {
					ackFailed(err)
				}
				win.ack()
			}
		})
	}

	b.ReportAllocs()
	var published int64
	for b.Loop() {
		win.admit(published)
		if err := br.Publish(ctx, "", "bench", msg); err != nil {
			b.Fatal(err)
		}
		published++
	}
	drainStart := time.Now()
	win.wait(published)
	total := b.Elapsed() + time.Since(drainStart)
	b.ReportMetric(float64(published)/total.Seconds(), "msgs/s")

	// Cancel stops each consumer and closes its Deliveries; every delivery was acked, so
	// nothing is outstanding and the consumer goroutines end.
	for _, c := range cs {
		if err := c.Cancel(); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
	cancel()
	br.Close()
	if p := firstErr.Load(); p != nil {
		b.Fatalf("Ack: %v", *p)
	}
	if got := win.acked.Load(); got != published {
		b.Fatalf("acked %d of %d messages", got, published)
	}
	checkNoGoroutines(b, before)
}

func benchPublishConsumeChan(b *testing.B, receivers int) {
	before := runtime.NumGoroutine()
	ch := make(chan *warren.Message, pcaWindow)
	var (
		received atomic.Int64
		wg       sync.WaitGroup
	)
	for range receivers {
		wg.Go(func() {
			n := 0
			for m := range ch {
				n += len(m.Body) // touch the message, as a consumer would
			}
			received.Add(int64(n / len(benchBody)))
		})
	}
	b.ReportAllocs()
	var sent int64
	for b.Loop() {
		ch <- &warren.Message{Body: benchBody}
		sent++
	}
	drainStart := time.Now()
	close(ch)
	wg.Wait()
	total := b.Elapsed() + time.Since(drainStart)
	b.ReportMetric(float64(sent)/total.Seconds(), "msgs/s")
	if got := received.Load(); got != sent {
		b.Fatalf("received %d of %d messages", got, sent)
	}
	checkNoGoroutines(b, before)
}

// getDepth is how many messages BenchmarkGetAck puts in the queue each time it runs empty.
const getDepth = 1 << 16

// loopGetSettle is the timed loop of the Get benchmarks: Get one message and settle it; when the
// queue runs empty it is refilled, and the refill is timed apart (see reportRefill).
func loopGetSettle(b *testing.B, ctx context.Context, q *warren.Queue, refill func(), settle func(warren.Delivery) error) {
	var refillTime time.Duration
	b.ReportAllocs()
	for b.Loop() {
		d, err := q.Get(ctx)
		if err == warren.ErrEmpty {
			start := time.Now()
			refill()
			refillTime += time.Since(start)
			d, err = q.Get(ctx)
		}
		if err != nil {
			b.Fatal(err)
		}
		if err := settle(d); err != nil {
			b.Fatal(err)
		}
	}
	reportRefill(b, refillTime)
}

func reportRefill(b *testing.B, refill time.Duration) {
	total := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	r := float64(refill.Nanoseconds()) / float64(b.N)
	b.ReportMetric(r, "refill-ns/op")
	b.ReportMetric(total-r, "getack-ns/op")
}

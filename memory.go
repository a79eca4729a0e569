package warren

import (
	"context"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// The broker's memory budget: RabbitMQ's memory alarm, for the messages a broker holds.
//
// Each queue knows its footprint (queueCore.held): for every message it holds — ready, delayed,
// or out for delivery and not yet settled — the message's body, its headers and properties, and
// msgOverhead bytes of bookkeeping. A message routed to n queues counts n times, though its body
// is in memory once: the budget errs on the safe side. commit adds each queue's change to the
// broker's total (memoryBudget.used), once per critical section that changed it, so the total
// is exact whenever no critical section is in progress.
//
// When the total passes the limit, the alarm is set:
//   - a publish that would add to the broker's memory waits, before it reaches any queue, until
//     the total is back under the limit, its ctx ends (it then fails wrapping ctx's error, and
//     no queue has the message) or the broker closes;
//   - a queue with a reject-publish overflow policy (RejectPublish, RejectPublishDLX) refuses
//     it instead, with ErrQueueFull, as it refuses a message when full: a publish routed only to
//     such queues does not wait;
//   - dead letters and moves pass: they carry a message the broker holds already, and the
//     source lets go of it. Immediate publishes pass too: a consumer takes them at once or they
//     are refused.
// Consumers, acks and everything else go on, and as they settle messages the total falls; when
// it is back at or under the limit the alarm clears and every waiting publisher goes on.
//
// Setting and clearing are events (EventMemoryAlarm, EventMemoryAlarmCleared), alternating,
// emitted with no lock held by the first commit, publish or Close to find the state changed
// since the last event; each is logged too. Broker.Memory reports the state.

// msgOverhead is what a message costs a queue beside its body and its envelopeMore: its
// envelope (48 bytes), its entry in the queue (40) and the rings' slack.
const msgOverhead = 96

// overhead is what the envelope's message costs a queue beside its body: msgOverhead and, for
// an envelope with more, that and what it keeps (its Message, headers, properties).
func (e *envelope) overhead() int64 {
	if e.more != nil {
		return msgOverhead + int64(e.more.cost)
	}
	return msgOverhead
}

// footprint is what the envelope's message costs each queue that holds it, in bytes.
func (e *envelope) footprint() int64 { return int64(int(e.size)) + e.overhead() }

// moreCost estimates the bytes an envelope's more keeps beside the envelope itself: the more,
// and its Message if it has one, with the properties' strings but not the headers: whoever
// makes an envelope of a message with headers adds their cost (countHeaders) before any queue
// holds it, since a message's footprint must not change while a queue holds it.
func moreCost(more *envelopeMore) uint32 {
	n := int(unsafe.Sizeof(envelopeMore{}))
	if m := more.msg; m != nil {
		n += int(unsafe.Sizeof(Message{})) + len(m.ContentType) + len(m.ContentEncoding) + len(m.MessageID) +
			len(m.CorrelationID) + len(m.ReplyTo) + len(m.Expiration) + len(m.Type) + len(m.UserID) + len(m.AppID)
	}
	return uint32(min(n, 1<<30))
}

// countHeaders adds n bytes of headers to the envelope's cost (see moreCost); the envelope has
// a more, as every envelope of a message with headers does.
func (e *envelope) countHeaders(n int) {
	e.more.cost = uint32(min(int(e.more.cost)+n, 1<<31))
}

// tableCost estimates the bytes a header table takes in memory: per entry, its key, its value
// and a map slot's share (mapEntryCost). Tables nest at most maxFieldDepth deep (checkHeaders
// refuses deeper ones and cycles before an envelope is made); deeper ones count as empty.
func tableCost(t Table, depth int) int {
	if len(t) == 0 || depth > maxFieldDepth {
		return 0
	}
	n := tableHeader
	for k, v := range t {
		n += mapEntryCost + len(k) + valueCost(v, depth+1)
	}
	return n
}

// What tables and arrays take beside their keys and values: a map's header, a map slot's share
// (the key's and the value's headers, and the map's slack), an array's slot (an interface).
const (
	tableHeader  = 48
	mapEntryCost = 48
	arraySlot    = 16
)

// valueCost estimates what a header value takes in memory beside the interface that holds it.
func valueCost(v any, depth int) int {
	switch v := v.(type) {
	case string:
		return len(v)
	case []byte:
		return len(v)
	case Table:
		return tableCost(v, depth)
	case map[string]any:
		return tableCost(v, depth)
	case []any:
		if depth > maxFieldDepth {
			return 0
		}
		n := arraySlot * len(v)
		for _, e := range v {
			n += valueCost(e, depth+1)
		}
		return n
	case time.Time, Decimal:
		return 24
	}
	return 8
}

// memoryBudget is a broker's budget for the messages it holds (see above).
type memoryBudget struct {
	limit int64        // bytes; 0: no limit
	used  atomic.Int64 // the queues' footprints, added at each commit that changed one
	over  atomic.Bool  // the alarm is set; changed under mu only
	// changed says that the alarm was set or cleared since the last event about it (announce).
	changed atomic.Bool

	mu      sync.Mutex
	lifted  chan struct{} // closed when the alarm clears or the broker closes; a new one each time it is set
	waiting int           // publishers waiting
	alarms  uint64        // times it was set
	closed  bool          // the broker closed: nobody waits any more

	// told is the state the last event told of, so that events alternate; guarded by telling.
	telling sync.Mutex
	told    bool
}

// add adds d bytes to the total and sets or clears the alarm if the total crossed the limit.
// It may be called under a queue's lock: mu is a leaf.
func (m *memoryBudget) add(d int64) {
	n := m.used.Add(d)
	if m.limit > 0 && (n > m.limit) != m.over.Load() {
		m.settle()
	}
}

// settle makes the alarm agree with the total. The loop reads the total again after each
// change: a concurrent add that saw the alarm's old state, and so did not call settle, added
// before that state changed, so the read after the change sees it.
func (m *memoryBudget) settle() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for {
		over := m.used.Load() > m.limit
		if over == m.over.Load() {
			return
		}
		m.over.Store(over)
		switch {
		case over:
			m.alarms++
			if !m.closed {
				m.lifted = make(chan struct{})
			}
		case !m.closed: // once closed, lifted stays closed
			close(m.lifted)
		}
		m.changed.Store(true)
	}
}

// close lets every waiting publisher go: the broker is closing.
func (m *memoryBudget) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed && m.over.Load() {
		close(m.lifted)
	}
	m.closed = true
}

// announce emits the event of the alarm's change, if it changed since the last one. With no
// lock held.
func (b *Broker) announceMemory() {
	m := &b.mem
	if !m.changed.Load() {
		return
	}
	m.telling.Lock()
	defer m.telling.Unlock()
	if !m.changed.Swap(false) {
		return
	}
	over := m.over.Load()
	if over == m.told {
		return // set and cleared (or cleared and set) since the last event: nothing to tell
	}
	m.told = over
	used, limit := m.used.Load(), m.limit
	if over {
		b.cfg.logger.Warn("warren: memory alarm set: publishes wait until the broker's messages take less memory",
			"used", used, "limit", limit)
		b.emit(Event{Kind: EventMemoryAlarm, Value: used, Limit: limit})
	} else {
		b.cfg.logger.Info("warren: memory alarm cleared", "used", used, "limit", limit)
		b.emit(Event{Kind: EventMemoryAlarmCleared, Value: used, Limit: limit})
	}
}

// waitMemory waits while the memory alarm is set, for a publish: until it clears, ctx ends (an
// error wrapping ctx's) or the broker closes (ErrClosed). told, if not nil, is told that the
// publisher waits, and that it no longer does (WhileBlocked).
func (b *Broker) waitMemory(ctx context.Context, told func(bool)) error {
	m := &b.mem
	for {
		m.mu.Lock()
		if !m.over.Load() || m.closed {
			m.mu.Unlock()
			if b.closed.Load() {
				return ErrClosed
			}
			return nil
		}
		lifted := m.lifted
		m.waiting++
		m.mu.Unlock()
		b.announceMemory() // the publisher that finds the alarm set may be the first to look
		if told != nil {
			told(true)
		}
		select {
		case <-lifted:
		case <-ctx.Done():
		}
		if told != nil {
			told(false)
		}
		m.mu.Lock()
		m.waiting--
		m.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return errorf("publish: the broker is over its memory limit (%d bytes): %w", m.limit, err)
		}
	}
}

// memoryAlarm reports whether a publish of cfg, routed to qs, must wait for the memory alarm to
// clear: the alarm is set, the publish is the application's (not a dead letter, a move or an
// Immediate one), and some queue it goes to would take it rather than refuse it.
func (b *Broker) memoryAlarm(cfg publishConfig, qs []*Queue) bool {
	if !b.mem.over.Load() || cfg.deadReason != "" || cfg.moving || cfg.immediate {
		return false
	}
	for _, q := range qs {
		if !q.cfg.refusesOnAlarm() {
			return true
		}
	}
	return false
}

// refusesOnAlarm reports whether the queue refuses publishes while the memory alarm is set,
// rather than have them wait: its overflow policy rejects publishes.
func (c *queueConfig) refusesOnAlarm() bool {
	return c.overflow == RejectPublish || c.overflow == RejectPublishDLX
}

// MemoryStats is the state of a broker's memory budget ([WithMemoryLimit]).
type MemoryStats struct {
	// Used is the memory the broker's messages take, by its estimate: for each message in each
	// queue, its body, headers and properties, and about 100 bytes of bookkeeping.
	Used  int64 `json:"used"`
	Limit int64 `json:"limit"` // the budget; 0 for none
	// Alarm is set while Used is over Limit: publishes wait (see [WithMemoryLimit]).
	Alarm   bool   `json:"alarm"`
	Waiting int    `json:"waiting"` // publishes waiting for the alarm to clear
	Alarms  uint64 `json:"alarms"`  // times the alarm was set since the broker started
}

// Memory returns the state of the broker's memory budget. It takes no queue's lock.
func (b *Broker) Memory() MemoryStats {
	m := &b.mem
	m.mu.Lock()
	defer m.mu.Unlock()
	return MemoryStats{Used: m.used.Load(), Limit: m.limit, Alarm: m.over.Load(), Waiting: m.waiting, Alarms: m.alarms}
}

// NoMemoryLimit, given to [WithMemoryLimit], turns the budget off.
const NoMemoryLimit = -1

// WithMemoryLimit sets the broker's memory budget, in bytes, for the messages it holds: above
// it the memory alarm is set, as RabbitMQ's vm_memory_high_watermark sets its own. While it is
// set, a publish of a message that would stay in the broker's memory waits before it reaches
// any queue, until the broker's messages take no more than the budget (consumers settling
// them), its ctx ends, or the broker closes; [WhileBlocked] is told, and the AMQP listener sends
// connection.blocked. A queue with the [RejectPublish] or [RejectPublishDLX] overflow policy
// refuses such a publish instead, with [ErrQueueFull]. Dead letters, [Queue.Move] and
// [Immediate] publishes do not wait. The alarm's setting and clearing are events
// ([EventMemoryAlarm], [EventMemoryAlarmCleared]) and [Broker.Memory] reports it.
//
// The broker counts, for each message in each queue (ready, delayed, or delivered and not yet
// settled), its body, its headers and properties, and about 100 bytes of bookkeeping; a
// message in n queues counts n times. It does not count the host's own memory.
//
// The default, for [New] and [Open] alike, is 40 % of the memory the process may use: the least
// of GOMEMLIMIT ([debug.SetMemoryLimit]) when set, the cgroup's memory limit (Linux), and the
// machine's memory (Linux); with none of them known, no budget. [NoMemoryLimit] (or any
// negative n) turns it off.
func WithMemoryLimit(n int64) BrokerOption { return memoryLimitOption{n} }

type memoryLimitOption struct{ n int64 }

func (o memoryLimitOption) applyBroker(c *brokerConfig) { c.memoryLimit, c.memoryLimitSet = o.n, true }

// memoryLimitFor returns the budget of a broker configured with c.
func memoryLimitFor(c brokerConfig) int64 {
	switch {
	case !c.memoryLimitSet:
		return defaultMemoryLimit()
	case c.memoryLimit < 0:
		return 0
	}
	return c.memoryLimit
}

// defaultMemoryFraction is the share of the memory the process may use that the default budget
// is: less than RabbitMQ's 0.6, since the host's own work shares the heap.
const defaultMemoryFraction = 0.4

// defaultMemoryLimit returns the default budget (see WithMemoryLimit), 0 when nothing says how
// much memory the process may use.
func defaultMemoryLimit() int64 {
	avail := systemMemory()
	if l := debug.SetMemoryLimit(-1); l > 0 && l < 1<<62 && (avail == 0 || l < avail) {
		avail = l
	}
	return int64(float64(avail) * defaultMemoryFraction)
}

// systemMemory returns the memory the machine or the process's cgroup offers, the lesser, read
// once; 0 when unknown.
var systemMemory = sync.OnceValue(func() int64 {
	total := readMemTotal("/proc/meminfo")
	if c := readCgroupLimit("/sys/fs/cgroup/memory.max"); c > 0 && (total == 0 || c < total) {
		total = c
	}
	return total
})

// readMemTotal reads MemTotal from a /proc/meminfo, in bytes; 0 when it cannot.
func readMemTotal(path string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil || kb <= 0 {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// readCgroupLimit reads a cgroup v2 memory.max, in bytes; 0 when it cannot or it says "max".
func readCgroupLimit(path string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

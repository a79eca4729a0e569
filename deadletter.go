package warren

import (
	"maps"
	"time"
)

// death is one dead-lettering event, as recordDeath writes it into a message's headers.
type death struct {
	queue       string   // the queue the message is dead-lettered from
	reason      Reason   // one of the x-death reasons
	exchange    string   // the exchange the message was published to
	routingKeys []string // its routing key and CC keys (never BCC)
	expiration  string   // the message's per-message TTL, "" if it had none
	time        time.Time
}

// recordDeath returns a copy of headers with d recorded as RabbitMQ records it:
//   - "x-death" is a list of tables, newest first, one per {queue, reason}. A repeated
//     {queue, reason} has its "count" incremented and moves to the front, keeping the "time",
//     "exchange" and "routing-keys" of its first event; a new one is prepended with count 1.
//     "original-expiration" is set when the message had a per-message TTL. A history that is
//     not a list is replaced.
//   - "x-first-death-reason", "-queue" and "-exchange" are set once, on the first death;
//     "x-last-death-reason", "-queue" and "-exchange" on every death.
//
// headers itself is not modified: it is shared with every other copy of the message. Counts
// are int64 and times are [time.Time] to the second, the types AMQP clients use.
func recordDeath(headers Table, d death) Table {
	h := make(Table, len(headers)+7)
	maps.Copy(h, headers)
	old, _ := headers["x-death"].([]any)
	deaths := make([]any, 1, len(old)+1)
	var entry Table
	for _, e := range old {
		t, ok := e.(Table)
		if ok && entry == nil && t["queue"] == d.queue && t["reason"] == string(d.reason) {
			entry = make(Table, len(t))
			maps.Copy(entry, t)
			count, _ := entry["count"].(int64)
			entry["count"] = count + 1
			continue
		}
		deaths = append(deaths, e)
	}
	if entry == nil {
		keys := make([]any, len(d.routingKeys))
		for i, k := range d.routingKeys {
			keys[i] = k
		}
		entry = Table{
			"queue":        d.queue,
			"reason":       string(d.reason), // the AMQP field type, not Reason
			"count":        int64(1),
			"time":         d.time.Truncate(time.Second),
			"exchange":     d.exchange,
			"routing-keys": keys,
		}
		if d.expiration != "" {
			entry["original-expiration"] = d.expiration
		}
	}
	deaths[0] = entry
	h["x-death"] = deaths
	if _, ok := h["x-first-death-reason"]; !ok {
		h["x-first-death-reason"] = string(d.reason)
		h["x-first-death-queue"] = d.queue
		h["x-first-death-exchange"] = d.exchange
	}
	h["x-last-death-reason"] = string(d.reason)
	h["x-last-death-queue"] = d.queue
	h["x-last-death-exchange"] = d.exchange
	return h
}

// isDeathCycle reports whether dead-lettering a message with reason into the queue named target
// would close an automatic cycle, judged on headers that already record this death: the
// newest deaths are walked back to the most recent one from target; if it is there and no death
// on the way, itself included, was a rejection, the message has gone round without anyone
// deciding to send it round, and it must not go to target. A rejection is never a cycle.
func isDeathCycle(headers Table, target string, reason Reason) bool {
	if reason == ReasonRejected {
		return false
	}
	deaths, _ := headers["x-death"].([]any)
	for _, e := range deaths {
		t, _ := e.(Table)
		if t["reason"] == string(ReasonRejected) {
			return false
		}
		if t["queue"] == target {
			return true
		}
	}
	return false
}

// endReasonLocked is the drop reason for what a queue held when it ended.
func (q *Queue) endReasonLocked() Reason {
	if q.b.closed.Load() {
		return ReasonClosed
	}
	return ReasonQueueDeleted
}

// publishDeadLetter publishes one message dead-lettered from src with reason through src's
// dead-letter exchange as RabbitMQ does: a copy whose headers record the death,
// without the expiration, under the dead-letter routing key if src has one (dropping CC) or else
// under its own routing keys; routed like any publish, except that it may reach an internal
// exchange, and that a queue the death history says it would cycle back into is skipped. It
// reports what became of the copy, and events it for src: dead-lettered, or dropped because the
// exchange is missing, nothing took it, it would cycle, or the broker is closing.
func (b *Broker) publishDeadLetter(src *Queue, env *envelope, reason Reason, now time.Time) deadOutcome {
	keys := []string{env.routingKey}
	msg := env.message()
	headerKeys(msg.Headers["CC"], func(k string) { keys = append(keys, k) }) // x-death: no BCC
	msg.Headers = recordDeath(msg.Headers, death{
		queue: src.name, reason: reason, exchange: env.exchange.name, routingKeys: keys,
		expiration: msg.Expiration, time: now,
	})
	msg.Expiration = ""
	key := env.routingKey
	var bcc []string // the original BCC keys route the copy too, unless a key replaces them all
	if src.cfg.hasDLRK {
		key = src.cfg.dlrk
		delete(msg.Headers, "CC")
	} else if env.more != nil {
		bcc = env.more.bcc
	}
	dl := b.newEnvelope(&msg, nil, "") // the copy: routed, enqueued and evented as one message
	dl.countHeaders(tableCost(msg.Headers, 0))
	outcome := func(kind EventKind, why Reason) {
		if b.listening() {
			b.emit(Event{Kind: kind, Queue: src.name, Exchange: src.cfg.dlx, RoutingKey: key, Message: dl.messagePtr(), Reason: why})
		}
	}

	r := b.routers.Get().(*router)
	defer func() {
		r.reset()
		b.routers.Put(r)
	}()
	b.mu.RLock()
	x := b.exchanges[src.cfg.dlx]
	if b.closed.Load() {
		b.mu.RUnlock()
		outcome(EventDropped, ReasonClosed)
		return deadRefused
	}
	// Drops are logged at debug level: one per message would flood a warning log (a TTL queue
	// dead-lettering into itself drops every message). Events report each of them.
	if x == nil {
		b.mu.RUnlock()
		b.cfg.logger.Debug("warren: dead letter dropped: dead-letter exchange not found",
			"queue", src.name, "reason", reason, "exchange", src.cfg.dlx)
		outcome(EventDropped, ReasonDLXNotFound)
		return deadDropped
	}
	r.routeLocked(b, x, key, msg.Headers, bcc)
	b.mu.RUnlock()
	dl.exchange, dl.routingKey = x, key
	if dl.more != nil && len(r.queues) == 1 {
		dl.more.solo = true // a durable queue may page it out (pager.go)
	}
	took, cycled := false, false
	for _, q := range r.queues {
		if isDeathCycle(msg.Headers, q.name, reason) {
			b.cfg.logger.Debug("warren: dead letter dropped: dead-letter cycle",
				"queue", src.name, "reason", reason, "target", q.name)
			cycled = true
			continue
		}
		// A queue deleted or full meanwhile takes nothing (and events the refusal).
		if _, err := q.enqueue(b.noWait, dl, -1, publishConfig{deadReason: reason}); err == nil {
			took = true
		}
	}
	switch {
	case took:
		outcome(EventDeadLettered, reason)
		return deadTaken
	case b.closed.Load():
		// Its targets refused it because the broker closes (ErrClosed), not by a rule.
		outcome(EventDropped, ReasonClosed)
		return deadRefused
	case cycled:
		outcome(EventDropped, ReasonDeadLetterCycle)
	default:
		if len(r.queues) == 0 {
			b.cfg.logger.Debug("warren: dead letter dropped: no route",
				"queue", src.name, "reason", reason, "exchange", src.cfg.dlx, "routing-key", key)
		}
		outcome(EventDropped, ReasonDLXNoRoute)
	}
	return deadDropped
}

// deadOutcome is what became of a dead letter (publishDeadLetter).
type deadOutcome uint8

const (
	// deadTaken: a queue took it.
	deadTaken deadOutcome = iota
	// deadDropped: it is dropped by a rule, as RabbitMQ drops it: the dead-letter exchange is
	// missing, it routes to no queue, it would cycle, or its targets refused it (full, deleted).
	deadDropped
	// deadRefused: the broker is closing. A durable queue keeps it in its log (it was refused,
	// not dropped), so that it expires or dead-letters again at the next Open.
	deadRefused
)

// Death is one entry of a message's dead-lettering history, its "x-death" header: the
// message was dead-lettered Count times from Queue for Reason ("rejected", "expired", "maxlen"
// or "delivery_limit"); Time, Exchange and RoutingKeys are those of the first of these deaths,
// and OriginalExpiration the message's own TTL then, if it had one.
type Death struct {
	Queue              string
	Reason             Reason
	Count              int64
	Time               time.Time
	Exchange           string
	RoutingKeys        []string
	OriginalExpiration string
}

// Deaths returns the message's dead-lettering history, newest first, as recorded in its
// "x-death" header; nil when it has none. A header written by someone else is read as far as it
// has RabbitMQ's shape: entries that are not tables are skipped, and fields of other types are
// left zero.
func (m *Message) Deaths() []Death {
	entries, _ := m.Headers["x-death"].([]any)
	var ds []Death
	for _, e := range entries {
		t, ok := e.(Table)
		if !ok {
			continue
		}
		d := Death{}
		d.Queue, _ = t["queue"].(string)
		r, _ := t["reason"].(string)
		d.Reason = Reason(r)
		d.Count, _ = intArg(t["count"])
		d.Time, _ = t["time"].(time.Time)
		d.Exchange, _ = t["exchange"].(string)
		d.OriginalExpiration, _ = t["original-expiration"].(string)
		switch keys := t["routing-keys"].(type) {
		case []any:
			for _, k := range keys {
				if s, ok := k.(string); ok {
					d.RoutingKeys = append(d.RoutingKeys, s)
				}
			}
		case []string:
			d.RoutingKeys = append(d.RoutingKeys, keys...)
		}
		ds = append(ds, d)
	}
	return ds
}

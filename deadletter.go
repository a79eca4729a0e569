package warren

import (
	"maps"
	"time"
)

// Reasons a message is dead-lettered: the "reason" of an x-death entry (R4.2).
const (
	reasonRejected      = "rejected"       // rejected or nacked without requeue
	reasonExpired       = "expired"        // its TTL passed
	reasonMaxLen        = "maxlen"         // dropped or refused by a length limit
	reasonDeliveryLimit = "delivery_limit" // returned more times than the delivery limit
)

// death is one dead-lettering event, as recordDeath writes it into a message's headers.
type death struct {
	queue       string   // the queue the message is dead-lettered from
	reason      string   // one of the reason constants
	exchange    string   // the exchange the message was published to
	routingKeys []string // its routing key and CC keys (never BCC)
	expiration  string   // the message's per-message TTL, "" if it had none
	time        time.Time
}

// recordDeath returns a copy of headers with d recorded as RabbitMQ records it (R4.4, R4.5):
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
		if ok && entry == nil && t["queue"] == d.queue && t["reason"] == d.reason {
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
			"reason":       d.reason,
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
		h["x-first-death-reason"] = d.reason
		h["x-first-death-queue"] = d.queue
		h["x-first-death-exchange"] = d.exchange
	}
	h["x-last-death-reason"] = d.reason
	h["x-last-death-queue"] = d.queue
	h["x-last-death-exchange"] = d.exchange
	return h
}

// isDeathCycle reports whether dead-lettering a message with reason into the queue named target
// would close an automatic cycle, judged on headers that already record this death (R4.7): the
// newest deaths are walked back to the most recent one from target; if it is there and no death
// on the way, itself included, was a rejection, the message has gone round without anyone
// deciding to send it round, and it must not go to target. A rejection is never a cycle.
func isDeathCycle(headers Table, target, reason string) bool {
	if reason == reasonRejected {
		return false
	}
	deaths, _ := headers["x-death"].([]any)
	for _, e := range deaths {
		t, _ := e.(Table)
		if t["reason"] == reasonRejected {
			return false
		}
		if t["queue"] == target {
			return true
		}
	}
	return false
}

// deadLetter is a message leaving a queue for its dead-letter exchange.
type deadLetter struct {
	env    *envelope
	reason string
}

// deadLetterLocked dead-letters e from q with reason. It is only collected here; [Queue.unlock]
// publishes it once mu is released. Without a dead-letter exchange the message is dropped.
func (q *Queue) deadLetterLocked(e entry, reason string) {
	if q.cfg.hasDLX && q.endErr == nil {
		q.dead = append(q.dead, deadLetter{e.env, reason})
	}
}

// deadLetter publishes the messages dead-lettered from src, in the order they were collected,
// so that one queue's dead letters arrive in order (R4.9).
func (b *Broker) deadLetter(src *Queue, dead []deadLetter) {
	now := time.Now()
	for _, d := range dead {
		b.publishDeadLetter(src, d, now)
	}
}

// publishDeadLetter publishes one message dead-lettered from src through src's dead-letter
// exchange as RabbitMQ does (R4.3-R4.8): a copy whose headers record the death, without the
// expiration, under the dead-letter routing key if src has one (dropping CC) or else under its
// own routing keys; routed like any publish, except that it may reach an internal exchange, and
// that a queue the death history says it would cycle back into is skipped. A missing exchange
// or no route drops it; that is logged.
func (b *Broker) publishDeadLetter(src *Queue, d deadLetter, now time.Time) {
	env := d.env
	keys := []string{env.routingKey}
	headerKeys(env.msg.Headers["CC"], func(k string) { keys = append(keys, k) }) // x-death: no BCC
	msg := env.msg
	msg.Headers = recordDeath(env.msg.Headers, death{
		queue: src.name, reason: d.reason, exchange: env.exchange.name, routingKeys: keys,
		expiration: env.msg.Expiration, time: now,
	})
	msg.Expiration = ""
	key := env.routingKey
	var bcc []string // the original BCC keys route the copy too, unless a key replaces them all
	if src.cfg.hasDLRK {
		key = src.cfg.dlrk
		delete(msg.Headers, "CC")
	} else if env.bcc != nil {
		bcc = *env.bcc
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
		return
	}
	// Drops are logged at debug level: one per message would flood a warning log (a TTL queue
	// dead-lettering into itself drops every message). Events report them (a later issue).
	if x == nil {
		b.mu.RUnlock()
		b.cfg.logger.Debug("warren: dead letter dropped: dead-letter exchange not found",
			"queue", src.name, "reason", d.reason, "exchange", src.cfg.dlx)
		return
	}
	r.routeLocked(b, x, key, msg.Headers, bcc)
	b.mu.RUnlock()
	dl := &envelope{msg: msg, exchange: x, routingKey: key}
	if len(r.queues) == 0 {
		b.cfg.logger.Debug("warren: dead letter dropped: no route",
			"queue", src.name, "reason", d.reason, "exchange", src.cfg.dlx, "routing-key", key)
	}
	for _, q := range r.queues {
		if isDeathCycle(msg.Headers, q.name, d.reason) {
			b.cfg.logger.Debug("warren: dead letter dropped: dead-letter cycle",
				"queue", src.name, "reason", d.reason, "target", q.name)
			continue
		}
		_ = q.enqueue(b.noWait, dl, -1, publishConfig{}) // a queue deleted or full meanwhile takes nothing
	}
}

// Death is one entry of a message's dead-lettering history, its "x-death" header (R4.4): the
// message was dead-lettered Count times from Queue for Reason ("rejected", "expired", "maxlen"
// or "delivery_limit"); Time, Exchange and RoutingKeys are those of the first of these deaths,
// and OriginalExpiration the message's own TTL then, if it had one.
type Death struct {
	Queue              string
	Reason             string
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
		d.Reason, _ = t["reason"].(string)
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

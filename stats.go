package warren

import (
	"cmp"
	"encoding/json"
	"time"
)

// QueueStats is a snapshot of one queue, taken in one critical section ([Queue.Stats]). It
// marshals to JSON with snake_case names, OldestAge as a duration string ("1.5s", as
// [time.Duration.String] writes it and [time.ParseDuration] reads it).
type QueueStats struct {
	Queue     string `json:"queue"`
	Ready     int    `json:"ready"`     // messages waiting for a consumer ([Queue.Len])
	Unacked   int    `json:"unacked"`   // deliveries outstanding ([Queue.Unacked])
	Delayed   int    `json:"delayed"`   // messages hidden until a delay passes ([DeliverAfter], [Delivery.NackWithDelay])
	Consumers int    `json:"consumers"` // active consumers, waiting single-active ones included ([Queue.ConsumerCount])
	Bytes     int64  `json:"bytes"`     // body bytes of the ready messages
	// OldestAge is how long the oldest ready message has been in the queue; 0 when none is
	// ready. It is measured from samples of the clock taken when messages arrive, not one per
	// message: exact for a message that arrived into an empty queue, and otherwise at most the
	// arrival span of 63 messages too high; exact for a queue with an [Alerts] age threshold
	// (up to 4096 messages held; beyond, samples are thinned). A message that was delivered as
	// it arrived, sampled by none, counts from when it came back.
	OldestAge time.Duration `json:"-"` // "oldest_age" in JSON: see the type's doc

	// Counters since the queue was declared. Each message that entered (Enqueued) ends in one
	// of Acked, Expired (without a dead-letter exchange), DeadLettered or Dropped, or is still
	// in the queue; see the event kinds of the same names.
	Enqueued     uint64 `json:"enqueued"`      // messages that entered: published or dead-lettered into it (and auto-acked ones returned unread)
	Delivered    uint64 `json:"delivered"`     // deliveries to consumers and Gets, auto-acked ones included
	Redelivered  uint64 `json:"redelivered"`   // of those, deliveries of messages that had come back
	Acked        uint64 `json:"acked"`         // deliveries acknowledged, auto-acked ones included
	Nacked       uint64 `json:"nacked"`        // deliveries nacked back into the queue
	Rejected     uint64 `json:"rejected"`      // deliveries rejected
	Expired      uint64 `json:"expired"`       // messages whose TTL passed, dead-lettered or not
	DeadLettered uint64 `json:"dead_lettered"` // messages dead-lettered that reached another queue
	Dropped      uint64 `json:"dropped"`       // messages that left the queue, or were refused, and went nowhere
}

// queueStatsJSON is QueueStats as JSON has it: OldestAge as a duration string.
type queueStatsJSON struct {
	queueStatsFields
	OldestAge string `json:"oldest_age"`
}

// queueStatsFields is QueueStats without its methods, so that marshalling it does not recurse.
type queueStatsFields QueueStats

// MarshalJSON writes the stats with snake_case names and OldestAge as a duration string.
func (s QueueStats) MarshalJSON() ([]byte, error) {
	return json.Marshal(queueStatsJSON{queueStatsFields(s), s.OldestAge.String()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *QueueStats) UnmarshalJSON(data []byte) error {
	var j queueStatsJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	age, err := time.ParseDuration(cmp.Or(j.OldestAge, "0s"))
	if err != nil {
		return errorf("queue stats: oldest_age %q: %w", j.OldestAge, err)
	}
	*s = QueueStats(j.queueStatsFields)
	s.OldestAge = age
	return nil
}

// Stats returns a snapshot of the queue's state and counters. It takes the queue's lock once and
// costs O(log n) (O(levels · log n) with priorities): cheap enough for a metrics scrape. After
// the queue is deleted it returns what the queue had at the end, with nothing ready.
func (q *Queue) Stats() (s QueueStats) {
	q.view(func() { s = q.statsLocked() })
	return s
}

// statsLocked returns the queue's stats.
func (q *Queue) statsLocked() QueueStats {
	s := QueueStats{
		Queue: q.name, Ready: q.core.ready.len(), Unacked: q.core.unacked, Consumers: q.consumerCountLocked(),
		Bytes:    q.core.ready.bytes,
		Enqueued: q.core.n.enqueued, Delivered: q.core.n.delivered, Redelivered: q.core.n.redelivered,
		Acked: q.core.n.acked, Nacked: q.core.n.nacked, Rejected: q.core.n.rejected, Expired: q.core.n.expired,
		DeadLettered: q.core.n.deadLettered, Dropped: q.core.n.dropped,
	}
	if q.core.delayed != nil {
		s.Delayed = q.core.delayed.Len()
	}
	if at, ok := q.core.oldestAt(); ok {
		s.OldestAge = time.Duration(max(q.core.clock()-at, 0))
	}
	return s
}

// BrokerStats is a snapshot of a broker: every queue's [QueueStats], one queue at a time.
type BrokerStats struct {
	Exchanges  int          `json:"exchanges"`
	Queues     []QueueStats `json:"queues"`     // sorted by name
	Unroutable uint64       `json:"unroutable"` // publishes that reached no queue
}

// Stats returns a snapshot of every queue and the broker's own counters. Queues are read one
// after another, each in its own critical section: the snapshot is not atomic across queues.
func (b *Broker) Stats() BrokerStats {
	s := BrokerStats{Unroutable: b.unroutable.Load()}
	b.mu.RLock()
	s.Exchanges = len(b.exchanges) // counted, not listed and sorted as Exchanges does
	b.mu.RUnlock()
	for q := range b.Queues() {
		s.Queues = append(s.Queues, q.Stats())
	}
	return s
}

// Arrival stamps: the oldest message's age without a clock read per message.
//
// A clock read costs about a sixth of a publish, so a message carries no arrival time. Instead
// the queue keeps stamps, (seq, time) pairs, in seq order: one when a message stays ready in a
// queue that was empty (the one moment its age is not bounded by an older message), one every
// 64 sequence ids, one per message on a queue with an age threshold, and one per delayed
// publish (it joins the ready set later, maybe into an empty queue). The oldest ready
// message arrived no earlier than the newest stamp at or before its seq. Stamps no message
// held needs are dropped from time to time (see pushStampLocked).

// Alerts.

// AlertPolicy is what a queue does, besides the alert, when its ready messages cross the
// Messages, Bytes or Age threshold of its [Alerts] (Qpid's queue alerts and slow-consumer
// policies).
type AlertPolicy uint8

const (
	// Alert only reports the crossing: an [EventAlert] and a warning on the broker's logger.
	Alert AlertPolicy = iota
	// Cycle makes the queue a ring: while it holds more than Messages ready messages or Bytes
	// ready bytes, the head is dropped, dead-lettered with reason "maxlen" or evented as
	// dropped (as [DropHead] does, but without refusing or counting as a length limit). The Age
	// threshold only alerts; bound age with [MessageTTL].
	Cycle
	// Delete deletes the queue when it crosses: its consumers end with an error wrapping both
	// [ErrQueueDeleted] and [ErrSlowConsumer] that says which threshold, and every message is
	// evented as dropped (Reason [ReasonQueueDeleted]); the queue's deletion event has Reason
	// [ReasonPolicy].
	Delete
)

// ErrSlowConsumer is wrapped, with [ErrQueueDeleted], by the error the consumers of a queue
// deleted by the [Delete] policy of its [Alerts] end with.
var ErrSlowConsumer = newError("slow consumer")

// Alert reasons: which threshold an [EventAlert] reports.
const (
	AlertMessages    Reason = "messages"     // ready messages ≥ Messages
	AlertBytes       Reason = "bytes"        // ready body bytes ≥ Bytes
	AlertAge         Reason = "age"          // the oldest ready message is older than Age
	AlertMessageSize Reason = "message-size" // an arriving message's body ≥ MessageSize bytes
)

// Alerts are a queue's thresholds (see [WithAlerts]). A zero threshold checks nothing.
// Thresholds are checked in the critical section that changes what they measure, with no
// goroutine of their own: counts and bytes whenever messages arrive or leave, the size of each
// arriving message, and age on the queue's one timer, armed for when the oldest message will
// pass it.
//
// An alert fires when a measure crosses its threshold (from below to at-or-above; for age, to
// above): once per crossing, and not again for the same threshold within RepeatGap of the last,
// however often the measure crosses back and forth meanwhile.
//
// Age is capped at about 146 years (1<<62 ns), as [AckTimeout] is: a huge Age, up to the largest
// Duration, is practically never and does not disturb the queue's TTLs and delays, which share
// its timer. RepeatGap is not capped: it is compared with the time since the last alert, never
// added to the clock, so a huge one means one alert per threshold.
type Alerts struct {
	Messages    int           // ready messages
	Bytes       int64         // ready body bytes
	Age         time.Duration // age of the oldest ready message; capped at about 146 years
	MessageSize int           // body bytes of one arriving message
	RepeatGap   time.Duration // least time between two alerts of one threshold; default 1 minute
	Policy      AlertPolicy   // what crossing Messages, Bytes or Age does besides alerting
}

// WithAlerts sets the queue's alert thresholds and slow-consumer policy. They are warren's own
// (Qpid has them; RabbitMQ does not) and not part of the queue's arguments, so a redeclaration
// need not repeat them; the first declaration's stand. Negative values are an error wrapping
// [ErrInvalidArgument].
func WithAlerts(a Alerts) QueueOption { return alertsOption(a) }

type alertsOption Alerts

func (o alertsOption) applyQueue(c *queueConfig) {
	a := Alerts(o)
	if a.Messages < 0 || a.Bytes < 0 || a.Age < 0 || a.MessageSize < 0 || a.RepeatGap < 0 || a.Policy > Delete {
		c.err = errorf("alerts %+v: negative threshold or unknown policy: %w", a, ErrInvalidArgument)
		return
	}
	if a.RepeatGap == 0 {
		a.RepeatGap = time.Minute
	}
	// Capped here, not only where ageDueLocked adds it to the clock, so that the timer's due
	// time and checkAlertsLocked's comparison agree: with a due time at the cap and a
	// comparison with the uncapped Age, a message at the cap would be due and never over, and
	// the timer would fire again and again.
	a.Age = min(a.Age, maxWait)
	c.alerts = a
	c.alerting = a.Messages > 0 || a.Bytes > 0 || a.Age > 0 || a.MessageSize > 0
}

// alertState is one threshold's state: whether the measure was over it when last checked, and
// when it last alerted (0 for never).
type alertState struct {
	over bool
	last int64
}

// alertIndex orders a queue's alert states.
const (
	alertMessages = iota
	alertBytes
	alertAge
	alertSize
	alertKinds
)

var alertNames = [alertKinds]Reason{AlertMessages, AlertBytes, AlertAge, AlertMessageSize}

// checkAlertsLocked checks the count, bytes and age thresholds after a change, and enforces the
// Cycle policy. now is the queue's clock, or 0 if not read yet.
func (q *Queue) checkAlertsLocked(now int64) {
	a := &q.cfg.alerts
	if a.Messages > 0 {
		now = q.crossLocked(alertMessages, int64(q.core.ready.len()) >= int64(a.Messages), int64(q.core.ready.len()), int64(a.Messages), nil, now)
	}
	if a.Bytes > 0 {
		now = q.crossLocked(alertBytes, q.core.ready.bytes >= a.Bytes, q.core.ready.bytes, a.Bytes, nil, now)
	}
	if a.Age > 0 {
		var age int64
		if at, ok := q.core.oldestAt(); ok {
			if now == 0 {
				now = q.core.clock()
			}
			age = now - at
		}
		q.crossLocked(alertAge, age > int64(a.Age), age, int64(a.Age), nil, now)
	}
	if a.Policy == Cycle { // after the checks: a crossing is what the ring is about to drop
		q.cycleLocked()
	}
}

// crossLocked updates one threshold's state with whether its measure is over it, and alerts on
// a crossing outside the repeat gap. It returns the clock, read if it had to be.
func (q *Queue) crossLocked(i int, over bool, value, limit int64, m *envelope, now int64) int64 {
	s := &q.alertStates[i]
	was := s.over
	s.over = over
	if !over || was {
		return now
	}
	if now == 0 {
		now = q.core.clock()
	}
	if s.last != 0 && now-s.last < int64(q.cfg.alerts.RepeatGap) {
		return now
	}
	s.last = now
	e := Event{Kind: EventAlert, Reason: alertNames[i], Value: value, Limit: limit}
	if m != nil {
		e.Message = &m.msg
	}
	q.eventLocked(e) // always: the flush logs it (see Broker.flush)
	if i != alertSize && q.cfg.alerts.Policy == Delete && q.doomed == nil {
		q.doomed = errorf("queue %q deleted by its slow-consumer policy: %s %d over %d: %w: %w",
			q.name, alertNames[i], value, limit, ErrQueueDeleted, ErrSlowConsumer)
	}
	return now
}

// cycleLocked drops from the head while the queue is over its Messages or Bytes threshold (the
// Cycle policy), dead-lettering with reason maxlen.
func (q *Queue) cycleLocked() {
	limit := func(n int64) int64 {
		if n == 0 {
			return -1
		}
		return n
	}
	q.core.dropOver(limit(int64(q.cfg.alerts.Messages)), limit(q.cfg.alerts.Bytes))
}

// ageDueLocked returns when the oldest ready message will pass the age threshold, for the
// queue's timer; 0 for never or already past.
func (q *Queue) ageDueLocked() int64 {
	if q.cfg.alerts.Age == 0 || q.alertStates[alertAge].over {
		return 0
	}
	at, ok := q.core.oldestAt()
	if !ok {
		return 0
	}
	return later(at+1, q.cfg.alerts.Age)
}

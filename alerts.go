package warren

import "time"

// Alerts: thresholds on a queue's ready messages (Qpid's queue alerts and slow-consumer
// policies), checked in the critical sections that change what they measure (commit) and on
// the queue's one timer for age.

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
		e.Message = m.messagePtr()
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

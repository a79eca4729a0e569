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
	// of Acked, Expired (without a dead-letter exchange), DeadLettered, Dropped or Moved, or is
	// still in the queue; see the event kinds of the same names.
	Enqueued     uint64 `json:"enqueued"`      // messages that entered: published or dead-lettered into it (and auto-acked ones returned unread)
	Delivered    uint64 `json:"delivered"`     // deliveries to consumers and Gets, auto-acked ones included
	Redelivered  uint64 `json:"redelivered"`   // of those, deliveries of messages that had come back
	Acked        uint64 `json:"acked"`         // deliveries acknowledged, auto-acked ones included
	Nacked       uint64 `json:"nacked"`        // deliveries nacked back into the queue
	Rejected     uint64 `json:"rejected"`      // deliveries rejected
	Expired      uint64 `json:"expired"`       // messages whose TTL passed, dead-lettered or not
	DeadLettered uint64 `json:"dead_lettered"` // messages dead-lettered that reached another queue
	Dropped      uint64 `json:"dropped"`       // messages that left the queue, or were refused, and went nowhere
	Moved        uint64 `json:"moved"`         // messages that left with [Queue.Move]
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
		Queue: q.name, Ready: q.core.ready.len(), Unacked: q.core.unacked, Consumers: q.consumers.count(),
		Bytes:    q.core.ready.bytes,
		Enqueued: q.core.n.enqueued, Delivered: q.core.n.delivered, Redelivered: q.core.n.redelivered,
		Acked: q.core.n.acked, Nacked: q.core.n.nacked, Rejected: q.core.n.rejected, Expired: q.core.n.expired,
		DeadLettered: q.core.n.deadLettered, Dropped: q.core.n.dropped, Moved: q.core.n.moved,
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
	Memory     MemoryStats  `json:"memory"`     // the memory budget ([Broker.Memory])
}

// Stats returns a snapshot of every queue and the broker's own counters. Queues are read one
// after another, each in its own critical section: the snapshot is not atomic across queues.
func (b *Broker) Stats() BrokerStats {
	s := BrokerStats{Unroutable: b.unroutable.Load(), Memory: b.Memory()}
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

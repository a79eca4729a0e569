package warrenprom

import (
	"maps"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warrenmq/warren"
)

// DefaultNamespace is the prefix of every metric name unless [WithNamespace] says otherwise.
const DefaultNamespace = "warren"

// QueueLabel is the name of the label that carries a queue's name on every per-queue metric.
const QueueLabel = "queue"

// Option configures a collector; see [NewCollector].
type Option func(*config)

type config struct {
	namespace   string
	constLabels prometheus.Labels
}

// WithNamespace sets the prefix of every metric name, "warren" by default: with "app",
// warren_queue_messages_ready becomes app_queue_messages_ready. An empty namespace leaves the
// names unprefixed (queue_messages_ready, exchanges, unroutable_total). A namespace that makes a
// metric name invalid fails the collector's registration.
func WithNamespace(ns string) Option {
	return func(c *config) { c.namespace = ns }
}

// WithConstLabels adds labels with fixed values to every metric, to tell brokers apart when a
// process has more than one. The labels are copied. A label named "queue", or any name
// Prometheus does not accept, fails the collector's registration.
func WithConstLabels(labels prometheus.Labels) Option {
	return func(c *config) {
		if c.constLabels == nil {
			c.constLabels = prometheus.Labels{}
		}
		maps.Copy(c.constLabels, labels)
	}
}

// queueMetric is one per-queue metric: its description and how to read it from a snapshot.
type queueMetric struct {
	desc      *prometheus.Desc
	valueType prometheus.ValueType
	value     func(*warren.QueueStats) float64
}

// collector is a checked [prometheus.Collector]: Describe sends every description Collect uses.
type collector struct {
	broker     *warren.Broker
	queue      []queueMetric
	exchanges  *prometheus.Desc
	unroutable *prometheus.Desc
	memory     memoryDescs
}

// memoryDescs describe the broker's memory budget ([warren.MemoryStats]).
type memoryDescs struct {
	used, limit, alarm, waiting, alarms *prometheus.Desc
}

// NewCollector returns a [prometheus.Collector] that exposes b's [warren.BrokerStats]. Each
// Collect (each scrape) takes one snapshot with [warren.Broker.Stats] and turns it into constant
// metrics: per queue, with the label "queue",
//
//	warren_queue_messages_ready                 gauge    QueueStats.Ready
//	warren_queue_messages_unacked               gauge    QueueStats.Unacked
//	warren_queue_messages_delayed               gauge    QueueStats.Delayed
//	warren_queue_consumers                      gauge    QueueStats.Consumers
//	warren_queue_ready_bytes                    gauge    QueueStats.Bytes
//	warren_queue_oldest_message_age_seconds     gauge    QueueStats.OldestAge
//	warren_queue_messages_enqueued_total        counter  QueueStats.Enqueued
//	warren_queue_messages_delivered_total       counter  QueueStats.Delivered
//	warren_queue_messages_redelivered_total     counter  QueueStats.Redelivered
//	warren_queue_messages_acked_total           counter  QueueStats.Acked
//	warren_queue_messages_nacked_total          counter  QueueStats.Nacked
//	warren_queue_messages_rejected_total        counter  QueueStats.Rejected
//	warren_queue_messages_expired_total         counter  QueueStats.Expired
//	warren_queue_messages_dead_lettered_total   counter  QueueStats.DeadLettered
//	warren_queue_messages_dropped_total         counter  QueueStats.Dropped
//	warren_queue_messages_moved_total           counter  QueueStats.Moved
//
// and for the broker
//
//	warren_exchanges                            gauge    BrokerStats.Exchanges
//	warren_unroutable_total                     counter  BrokerStats.Unroutable
//
// and its memory budget ([warren.WithMemoryLimit], [warren.Broker.Memory]):
//
//	warren_memory_used_bytes                    gauge    MemoryStats.Used
//	warren_memory_limit_bytes                   gauge    MemoryStats.Limit; absent with no limit
//	warren_memory_alarm                         gauge    MemoryStats.Alarm: 1 while set, else 0
//	warren_memory_waiting_publishers            gauge    MemoryStats.Waiting
//	warren_memory_alarms_total                  counter  MemoryStats.Alarms
//
// A broker with no memory limit ([warren.NoMemoryLimit], or no default one: nothing said how
// much memory the process may use) has no warren_memory_limit_bytes series, rather than a 0 that
// a query such as warren_memory_used_bytes / warren_memory_limit_bytes > 0.9 would turn into
// +Inf and an alert; the query then has no result. Its used bytes are counted all the same.
//
// Counters start when a queue is declared: a deleted queue's series disappear, and a queue
// declared again under the same name starts from zero, which Prometheus reads as a counter
// reset.
//
// Register the collector once per broker in a registry; with two brokers in one registry, tell
// them apart with [WithConstLabels] (or [WithNamespace]).
func NewCollector(b *warren.Broker, opts ...Option) prometheus.Collector {
	cfg := config{namespace: DefaultNamespace}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	name := func(n string) string { return prometheus.BuildFQName(cfg.namespace, "", n) }
	q := func(n, help string, t prometheus.ValueType, value func(*warren.QueueStats) float64) queueMetric {
		return queueMetric{
			desc:      prometheus.NewDesc(prometheus.BuildFQName(cfg.namespace, "queue", n), help, []string{QueueLabel}, cfg.constLabels),
			valueType: t,
			value:     value,
		}
	}
	const (
		gauge   = prometheus.GaugeValue
		counter = prometheus.CounterValue
	)
	return &collector{
		broker: b,
		queue: []queueMetric{
			q("messages_ready", "Messages in the queue waiting for a consumer.",
				gauge, func(s *warren.QueueStats) float64 { return float64(s.Ready) }),
			q("messages_unacked", "Deliveries from the queue outstanding: delivered, not yet acked, nacked or rejected.",
				gauge, func(s *warren.QueueStats) float64 { return float64(s.Unacked) }),
			q("messages_delayed", "Messages of the queue hidden until a delay passes (DeliverAfter, NackWithDelay).",
				gauge, func(s *warren.QueueStats) float64 { return float64(s.Delayed) }),
			q("consumers", "Active consumers of the queue, waiting single-active ones included.",
				gauge, func(s *warren.QueueStats) float64 { return float64(s.Consumers) }),
			q("ready_bytes", "Body bytes of the messages in the queue waiting for a consumer.",
				gauge, func(s *warren.QueueStats) float64 { return float64(s.Bytes) }),
			q("oldest_message_age_seconds", "How long the oldest message waiting for a consumer has been in the queue, from arrival-time samples that can read up to the arrival span of 63 messages too high; 0 when none is waiting.",
				gauge, func(s *warren.QueueStats) float64 { return s.OldestAge.Seconds() }),
			q("messages_enqueued_total", "Messages that entered the queue: published or dead-lettered into it, and auto-acked ones returned unread.",
				counter, func(s *warren.QueueStats) float64 { return float64(s.Enqueued) }),
			q("messages_delivered_total", "Deliveries from the queue to consumers and Gets, auto-acked ones included.",
				counter, func(s *warren.QueueStats) float64 { return float64(s.Delivered) }),
			q("messages_redelivered_total", "Deliveries from the queue of messages that had come back to it: the part of messages_delivered_total that are redeliveries.",
				counter, func(s *warren.QueueStats) float64 { return float64(s.Redelivered) }),
			q("messages_acked_total", "Deliveries from the queue acknowledged, auto-acked ones included.",
				counter, func(s *warren.QueueStats) float64 { return float64(s.Acked) }),
			q("messages_nacked_total", "Deliveries from the queue nacked back into it.",
				counter, func(s *warren.QueueStats) float64 { return float64(s.Nacked) }),
			q("messages_rejected_total", "Deliveries from the queue rejected.",
				counter, func(s *warren.QueueStats) float64 { return float64(s.Rejected) }),
			q("messages_expired_total", "Messages of the queue whose TTL passed, dead-lettered or not.",
				counter, func(s *warren.QueueStats) float64 { return float64(s.Expired) }),
			q("messages_dead_lettered_total", "Messages dead-lettered from the queue that reached another queue.",
				counter, func(s *warren.QueueStats) float64 { return float64(s.DeadLettered) }),
			q("messages_dropped_total", "Messages that left the queue, or that it refused, and went nowhere.",
				counter, func(s *warren.QueueStats) float64 { return float64(s.Dropped) }),
			q("messages_moved_total", "Messages that left the queue with Queue.Move.",
				counter, func(s *warren.QueueStats) float64 { return float64(s.Moved) }),
		},
		exchanges: prometheus.NewDesc(name("exchanges"),
			"Exchanges declared on the broker, the predeclared ones included.", nil, cfg.constLabels),
		unroutable: prometheus.NewDesc(name("unroutable_total"),
			"Publishes to the broker that reached no queue.", nil, cfg.constLabels),
		memory: memoryDescs{
			used: prometheus.NewDesc(name("memory_used_bytes"),
				"Memory the messages the broker holds take, by its estimate: body, headers, properties and bookkeeping of each message in each queue.", nil, cfg.constLabels),
			limit: prometheus.NewDesc(name("memory_limit_bytes"),
				"The broker's memory limit: above it the memory alarm is set and publishes wait. Absent when the broker has no limit.", nil, cfg.constLabels),
			alarm: prometheus.NewDesc(name("memory_alarm"),
				"Whether the broker's memory alarm is set: 1 while its messages take more than its memory limit and publishes wait, else 0.", nil, cfg.constLabels),
			waiting: prometheus.NewDesc(name("memory_waiting_publishers"),
				"Publishes waiting for the broker's memory alarm to clear.", nil, cfg.constLabels),
			alarms: prometheus.NewDesc(name("memory_alarms_total"),
				"Times the broker's memory alarm was set.", nil, cfg.constLabels),
		},
	}
}

// Describe sends the description of every metric the collector exposes.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.queue {
		ch <- m.desc
	}
	ch <- c.exchanges
	ch <- c.unroutable
	m := &c.memory
	for _, d := range []*prometheus.Desc{m.used, m.limit, m.alarm, m.waiting, m.alarms} {
		ch <- d
	}
}

// Collect takes one snapshot of the broker and sends its metrics.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.broker.Stats()
	send(ch, c.exchanges, prometheus.GaugeValue, float64(s.Exchanges))
	send(ch, c.unroutable, prometheus.CounterValue, float64(s.Unroutable))
	c.collectMemory(ch, s.Memory)
	for i := range s.Queues {
		qs := &s.Queues[i]
		for _, m := range c.queue {
			send(ch, m.desc, m.valueType, m.value(qs), qs.Queue)
		}
	}
}

// collectMemory sends the metrics of the broker's memory budget m.
func (c *collector) collectMemory(ch chan<- prometheus.Metric, m warren.MemoryStats) {
	d := &c.memory
	send(ch, d.used, prometheus.GaugeValue, float64(m.Used))
	if m.Limit > 0 {
		send(ch, d.limit, prometheus.GaugeValue, float64(m.Limit))
	}
	alarm := 0.0
	if m.Alarm {
		alarm = 1
	}
	send(ch, d.alarm, prometheus.GaugeValue, alarm)
	send(ch, d.waiting, prometheus.GaugeValue, float64(m.Waiting))
	send(ch, d.alarms, prometheus.CounterValue, float64(m.Alarms))
}

// send sends a constant metric, or an invalid one carrying the error, which the registry
// reports, instead of panicking as MustNewConstMetric would.
func send(ch chan<- prometheus.Metric, desc *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
	m, err := prometheus.NewConstMetric(desc, t, v, labels...)
	if err != nil {
		m = prometheus.NewInvalidMetric(desc, err)
	}
	ch <- m
}

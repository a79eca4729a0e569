package warrenotel

import (
	"context"
	"errors"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/warrenmq/warren"
)

// Metrics observes a broker's statistics ([warren.Broker.Stats]) as OpenTelemetry instruments.
// Create one with [NewMetrics]; the zero Metrics is not usable. It runs nothing of its own: the
// meter provider's reader calls its callback at each collection, which takes one snapshot of
// the broker. [Metrics.Close] unregisters it. A Metrics is safe for concurrent use.
type Metrics struct {
	reg       metric.Registration
	closeOnce sync.Once
	closeErr  error
}

// queueInstrument is one per-queue instrument and how it reads its value from a snapshot.
type queueInstrument struct {
	inst  metric.Int64Observable
	value func(*warren.QueueStats) int64
}

// NewMetrics registers instruments, under the meter [ScopeName] of the [WithMeterProvider]
// provider (OpenTelemetry's global one by default), whose values are read from b.Stats() at
// each collection. Per queue, with the attribute [QueueKey] ("warren.queue.name"), each from
// the field of [warren.QueueStats] named last:
//
//	warren.queue.messages.ready          UpDownCounter  {message}   Ready
//	warren.queue.messages.unacked        UpDownCounter  {message}   Unacked
//	warren.queue.messages.delayed        UpDownCounter  {message}   Delayed
//	warren.queue.consumers               UpDownCounter  {consumer}  Consumers
//	warren.queue.ready.size              UpDownCounter  By          Bytes
//	warren.queue.messages.oldest.age     Gauge          s           OldestAge
//	warren.queue.messages.enqueued       Counter        {message}   Enqueued
//	warren.queue.messages.delivered      Counter        {delivery}  Delivered
//	warren.queue.messages.redelivered    Counter        {delivery}  Redelivered
//	warren.queue.messages.acked          Counter        {delivery}  Acked
//	warren.queue.messages.nacked         Counter        {delivery}  Nacked
//	warren.queue.messages.rejected       Counter        {delivery}  Rejected
//	warren.queue.messages.expired        Counter        {message}   Expired
//	warren.queue.messages.dead_lettered  Counter        {message}   DeadLettered
//	warren.queue.messages.dropped        Counter        {message}   Dropped
//	warren.queue.messages.moved          Counter        {message}   Moved
//
// and for the broker ([warren.BrokerStats]):
//
//	warren.exchanges                     UpDownCounter  {exchange}  Exchanges
//	warren.messages.unroutable           Counter        {message}   Unroutable
//
// The counters are cumulative from the queue's declaration: a deleted queue's series stop being
// reported, and a queue declared again under the same name starts from zero (a counter reset).
// The snapshot is taken one queue at a time, so it is not atomic across queues. The broker
// must not be nil. NewMetrics fails only if the provider refuses an instrument or the callback.
func NewMetrics(b *warren.Broker, opts ...MetricsOption) (*Metrics, error) {
	if b == nil {
		panic("warrenotel: NewMetrics with a nil broker")
	}
	cfg := defaultMetricsConfig()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	meter := cfg.provider.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	var errs []error
	upDown := func(name, unit, desc string) metric.Int64Observable {
		i, err := meter.Int64ObservableUpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return i
	}
	counter := func(name, unit, desc string) metric.Int64Observable {
		i, err := meter.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return i
	}
	queue := []queueInstrument{
		{upDown("warren.queue.messages.ready", "{message}", "Messages in the queue waiting for a consumer."),
			func(s *warren.QueueStats) int64 { return int64(s.Ready) }},
		{upDown("warren.queue.messages.unacked", "{message}", "Deliveries from the queue outstanding: delivered, not yet acked, nacked or rejected."),
			func(s *warren.QueueStats) int64 { return int64(s.Unacked) }},
		{upDown("warren.queue.messages.delayed", "{message}", "Messages of the queue hidden until a delay passes (DeliverAfter, NackWithDelay)."),
			func(s *warren.QueueStats) int64 { return int64(s.Delayed) }},
		{upDown("warren.queue.consumers", "{consumer}", "Active consumers of the queue, waiting single-active ones included."),
			func(s *warren.QueueStats) int64 { return int64(s.Consumers) }},
		{upDown("warren.queue.ready.size", "By", "Body bytes of the messages in the queue waiting for a consumer."),
			func(s *warren.QueueStats) int64 { return s.Bytes }},
		{counter("warren.queue.messages.enqueued", "{message}", "Messages that entered the queue: published or dead-lettered into it, and auto-acked ones returned unread."),
			func(s *warren.QueueStats) int64 { return int64(s.Enqueued) }},
		{counter("warren.queue.messages.delivered", "{delivery}", "Deliveries from the queue to consumers and Gets, auto-acked ones included."),
			func(s *warren.QueueStats) int64 { return int64(s.Delivered) }},
		{counter("warren.queue.messages.redelivered", "{delivery}", "Deliveries from the queue of messages that had come back to it."),
			func(s *warren.QueueStats) int64 { return int64(s.Redelivered) }},
		{counter("warren.queue.messages.acked", "{delivery}", "Deliveries from the queue acknowledged, auto-acked ones included."),
			func(s *warren.QueueStats) int64 { return int64(s.Acked) }},
		{counter("warren.queue.messages.nacked", "{delivery}", "Deliveries from the queue nacked back into it."),
			func(s *warren.QueueStats) int64 { return int64(s.Nacked) }},
		{counter("warren.queue.messages.rejected", "{delivery}", "Deliveries from the queue rejected."),
			func(s *warren.QueueStats) int64 { return int64(s.Rejected) }},
		{counter("warren.queue.messages.expired", "{message}", "Messages of the queue whose TTL passed, dead-lettered or not."),
			func(s *warren.QueueStats) int64 { return int64(s.Expired) }},
		{counter("warren.queue.messages.dead_lettered", "{message}", "Messages dead-lettered from the queue that reached another queue."),
			func(s *warren.QueueStats) int64 { return int64(s.DeadLettered) }},
		{counter("warren.queue.messages.dropped", "{message}", "Messages that left the queue, or that it refused, and went nowhere."),
			func(s *warren.QueueStats) int64 { return int64(s.Dropped) }},
		{counter("warren.queue.messages.moved", "{message}", "Messages that left the queue with Queue.Move (a redrive)."),
			func(s *warren.QueueStats) int64 { return int64(s.Moved) }},
	}
	oldest, err := meter.Float64ObservableGauge("warren.queue.messages.oldest.age", metric.WithUnit("s"),
		metric.WithDescription("How long the oldest message waiting for a consumer has been in the queue (sampled: see warren.QueueStats.OldestAge); 0 when none is waiting."))
	errs = append(errs, err)
	exchanges := upDown("warren.exchanges", "{exchange}", "Exchanges declared on the broker, the predeclared ones included.")
	unroutable := counter("warren.messages.unroutable", "{message}", "Publishes to the broker that reached no queue.")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	observed := make([]metric.Observable, 0, len(queue)+3)
	for _, q := range queue {
		observed = append(observed, q.inst)
	}
	observed = append(observed, oldest, exchanges, unroutable)
	reg, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := b.Stats()
		o.ObserveInt64(exchanges, int64(s.Exchanges))
		o.ObserveInt64(unroutable, int64(s.Unroutable))
		for i := range s.Queues {
			qs := &s.Queues[i]
			name := metric.WithAttributeSet(attribute.NewSet(QueueKey.String(qs.Queue)))
			for _, q := range queue {
				o.ObserveInt64(q.inst, q.value(qs), name)
			}
			o.ObserveFloat64(oldest, qs.OldestAge.Seconds(), name)
		}
		return nil
	}, observed...)
	if err != nil {
		return nil, err
	}
	return &Metrics{reg: reg}, nil
}

// Close unregisters the instruments' callback: collections no longer read the broker, and no
// longer report its series. It is idempotent, and returns the provider's error from the first
// call.
func (m *Metrics) Close() error {
	m.closeOnce.Do(func() { m.closeErr = m.reg.Unregister() })
	return m.closeErr
}

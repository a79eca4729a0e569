package warrenotel

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"

	"github.com/warrenmq/warren"
)

// Metrics observes a broker's statistics ([warren.Broker.Stats]) as OpenTelemetry instruments,
// and, through [Metrics.Middleware], the handlers of Serve. Create one with [NewMetrics]; the
// zero Metrics is not usable. It runs nothing of its own: the meter provider's reader calls its
// callback at each collection, which takes one snapshot of the broker, and the middleware
// measures on the handlers' goroutines. [Metrics.Close] unregisters the callback. A Metrics is
// safe for concurrent use.
type Metrics struct {
	// Set once by NewMetrics.
	reg      metric.Registration
	duration metric.Float64Histogram // messaging.process.duration, for Middleware
	consumed metric.Int64Counter     // messaging.client.consumed.messages, for Middleware

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
// and for its memory budget ([warren.WithMemoryLimit], [warren.MemoryStats]), named as the
// conventions name the Go runtime's (go.memory.used, go.memory.limit) and a state that is on or
// off (hw.status):
//
//	warren.memory.used                   UpDownCounter  By           Used
//	warren.memory.limit                  UpDownCounter  By           Limit; not reported with no limit
//	warren.memory.alarm                  UpDownCounter  1            Alarm: 1 while set, else 0
//	warren.memory.publishers.waiting     UpDownCounter  {publisher}  Waiting
//	warren.memory.alarms                 Counter        {alarm}      Alarms
//
// A broker with no memory limit reports no warren.memory.limit, as go.memory.limit is reported
// only "if a limit exists": a 0 would read as a limit every message passes.
//
// It also makes the two synchronous instruments of OpenTelemetry's messaging conventions that
// [Metrics.Middleware] records for each attempt at a message:
//
//	messaging.process.duration           Histogram      s
//	messaging.client.consumed.messages   Counter        {message}
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
	memory := memoryInstruments{
		used: upDown("warren.memory.used", "By",
			"Memory the messages the broker holds take, by its estimate: body, headers, properties and bookkeeping of each message in each queue."),
		limit: upDown("warren.memory.limit", "By",
			"The broker's memory limit, if it has one: above it the memory alarm is set and publishes wait."),
		alarm: upDown("warren.memory.alarm", "1",
			"Whether the broker's memory alarm is set: 1 while its messages take more than its memory limit and publishes wait, else 0."),
		waiting: upDown("warren.memory.publishers.waiting", "{publisher}",
			"Publishes waiting for the broker's memory alarm to clear."),
		alarms: counter("warren.memory.alarms", "{alarm}", "Times the broker's memory alarm was set."),
	}
	// Names, units and descriptions from the conventions' generated package. The boundaries are
	// the ones messaging-metrics.md of semconv v1.43.0 asks for messaging.process.duration; the
	// generated package leaves them out (it gives them to HTTP's and RPC's durations only), and
	// the SDK's default buckets, made for milliseconds, would put every handler in the first two.
	duration, err := messagingconv.NewProcessDuration(meter,
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10))
	errs = append(errs, err)
	consumed, err := messagingconv.NewClientConsumedMessages(meter)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	observed := make([]metric.Observable, 0, len(queue)+8)
	for _, q := range queue {
		observed = append(observed, q.inst)
	}
	observed = append(observed, oldest, exchanges, unroutable,
		memory.used, memory.limit, memory.alarm, memory.waiting, memory.alarms)
	reg, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := b.Stats()
		o.ObserveInt64(exchanges, int64(s.Exchanges))
		o.ObserveInt64(unroutable, int64(s.Unroutable))
		memory.observe(o, s.Memory)
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
	return &Metrics{reg: reg, duration: duration.Inst(), consumed: consumed.Inst()}, nil
}

// memoryInstruments are the instruments of the broker's memory budget.
type memoryInstruments struct {
	used, limit, alarm, waiting, alarms metric.Int64Observable
}

// observe observes the memory budget m.
func (i *memoryInstruments) observe(o metric.Observer, m warren.MemoryStats) {
	o.ObserveInt64(i.used, m.Used)
	if m.Limit > 0 {
		o.ObserveInt64(i.limit, m.Limit)
	}
	var alarm int64
	if m.Alarm {
		alarm = 1
	}
	o.ObserveInt64(i.alarm, alarm)
	o.ObserveInt64(i.waiting, int64(m.Waiting))
	o.ObserveInt64(i.alarms, int64(m.Alarms))
}

// Close unregisters the instruments' callback: collections no longer read the broker, and no
// longer report its series. It is idempotent, and returns the provider's error from the first
// call. It does not stop [Metrics.Middleware]: the middleware's instruments are synchronous,
// with nothing to unregister, and record until the meter provider shuts down.
func (m *Metrics) Close() error {
	m.closeOnce.Do(func() { m.closeErr = m.reg.Unregister() })
	return m.closeErr
}

// Middleware returns a middleware that measures the handlers of the named queue as
// OpenTelemetry's messaging conventions ask of a push consumer: wrap the handler given to
// [warren.Queue.Serve] (or [warren.Broker.Serve], or any backend's Serve) with it, alone or with
// the tracer's, as in
//
//	err := q.Serve(ctx, handle, warren.Middleware(tracer.Middleware("jobs"), metrics.Middleware("jobs")))
//
// Each call of the handler, that is each attempt at a message (a retry is another), is measured
// in two instruments of [NewMetrics]'s meter:
//
//   - messaging.process.duration, a histogram of how long the handler took in seconds, from its
//     call to its return, panic or runtime.Goexit, with the bucket boundaries the conventions
//     recommend (0.005 to 10). When the handler fails, the measurement carries error.type too,
//     the same as the process span's: the error's type, or its ErrorType method's result
//     (semconv.ErrorType); for a panic, the panic value's type when it is an error, else
//     "*errors.errorString", as for runtime.Goexit.
//   - messaging.client.consumed.messages, a counter of the deliveries handed to the handler,
//     added to as the handler is called, so an attempt still running is counted and the
//     histogram's count catches up when it ends. It never carries error.type: the delivery to
//     the handler cannot fail, and the handler's failure is the histogram's.
//
// Both carry messaging.system "rabbitmq", messaging.operation.name "process", and
// messaging.destination.name the queue's name. That is RabbitMQ's destination for a message
// published through the default exchange, where the routing key is the queue. For a message
// routed by another exchange the process span's destination is "{exchange}:{routing key}:{queue}"
// ([Tracer.Middleware]), but the metrics keep the queue alone: a routing key may differ per
// message (a topic exchange's "orders.eu.1234"), each value would be a series of its own, and
// the conventions ask for the destination name only when it is known to be of low cardinality.
// For the same reason, queue "" or a server-named queue ("amq.gen-…", a new name at every
// declaration) leaves the destination name out.
//
// A panic goes on to Serve, which recovers it, after it is measured. Put the tracer's middleware
// outside this one (first in [warren.Middleware]): the handler's ctx then carries the process
// span when the measurements are made, so exemplars, if the SDK takes them, point at it, and the
// duration is the span's less the tracer's own work.
//
// The returned middleware returns nil for a nil handler, which Serve refuses. The middleware is
// safe for concurrent use, and so for Serve's workers.
func (m *Metrics) Middleware(queue string) func(warren.Handler) warren.Handler {
	attrs := []attribute.KeyValue{semconv.MessagingSystemRabbitMQ, semconv.MessagingOperationName(opProcess)}
	if queue != "" && !strings.HasPrefix(queue, serverNamed) {
		attrs = append(attrs, semconv.MessagingDestinationName(queue))
	}
	p := &processMeasure{m: m, attrs: attrs, set: metric.WithAttributeSet(attribute.NewSet(attrs...))}
	return func(h warren.Handler) warren.Handler {
		if h == nil {
			return nil
		}
		return func(ctx context.Context, d warren.Delivery) error { return p.process(ctx, h, d) }
	}
}

// processMeasure measures the attempts of one [Metrics.Middleware]. Immutable once made, so
// shared by its handlers' workers.
type processMeasure struct {
	m     *Metrics
	attrs []attribute.KeyValue     // of every measurement; error.type is added to a failure's
	set   metric.MeasurementOption // attrs as a set, made once: the measurement of a success
}

// process runs h on d, and measures the attempt.
func (p *processMeasure) process(ctx context.Context, h warren.Handler, d warren.Delivery) error {
	p.m.consumed.Add(ctx, 1, p.set)
	start := time.Now()
	return callHandler(ctx, h, d, func(err error) { p.record(ctx, start, err) })
}

// record records the duration of an attempt that started at start and ended with err.
func (p *processMeasure) record(ctx context.Context, start time.Time, err error) {
	d := time.Since(start).Seconds()
	if err == nil {
		p.m.duration.Record(ctx, d, p.set)
		return
	}
	failed := append(p.attrs[:len(p.attrs):len(p.attrs)], semconv.ErrorType(err))
	p.m.duration.Record(ctx, d, metric.WithAttributeSet(attribute.NewSet(failed...)))
}

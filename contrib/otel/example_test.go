package warrenotel_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/warrenmq/warren"
	warrenotel "github.com/warrenmq/warren/contrib/otel"
)

// Trace a message from its publish to its handler. Here the spans go to memory and are printed;
// in a service, the tracer provider is the application's, with its exporter.
func ExampleTracer() {
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	defer tp.Shutdown(context.Background())
	tracer := warrenotel.NewTracer(warrenotel.WithTracerProvider(tp))

	ctx := context.Background()
	b := warren.New()
	defer b.Close()
	q, _ := b.DeclareQueue("jobs")

	// The publish span's context travels in the message's headers.
	_ = tracer.Publish(ctx, b, "", "jobs", warren.Message{Body: []byte("job")})

	// Each delivery is handled in a process span, a child of the publish.
	handle := func(ctx context.Context, d warren.Delivery) error {
		// ctx carries the process span: spans started from it are its children.
		return nil
	}
	serveCtx, stop := context.WithCancel(ctx)
	served := make(chan error)
	go func() { served <- q.Serve(serveCtx, tracer.Middleware("jobs")(handle)) }()
	_ = q.WaitEmpty(ctx) // the message is handled and acked
	stop()
	<-served

	spans := exporter.GetSpans()
	for _, s := range spans {
		fmt.Println(s.Name, s.SpanKind)
	}
	fmt.Println("one trace:", spans[0].SpanContext.TraceID() == spans[2].SpanContext.TraceID())
	// Output:
	// publish jobs producer
	// ack jobs client
	// process jobs consumer
	// one trace: true
}

// Observe a broker's statistics with a meter provider; here a manual reader collects once.
func ExampleNewMetrics() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	b := warren.New()
	defer b.Close()
	m, err := warrenotel.NewMetrics(b, warrenotel.WithMeterProvider(mp))
	if err != nil {
		panic(err)
	}
	defer m.Close()

	_, _ = b.DeclareQueue("jobs")
	for range 3 {
		_ = b.Publish(context.Background(), "", "jobs", warren.Message{Body: []byte("job")})
	}

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(context.Background(), &rm)
	for _, metric := range rm.ScopeMetrics[0].Metrics {
		if metric.Name == "warren.queue.messages.ready" {
			for _, dp := range metric.Data.(metricdata.Sum[int64]).DataPoints {
				queue, _ := dp.Attributes.Value(warrenotel.QueueKey)
				fmt.Println(metric.Name, queue.AsString(), dp.Value)
			}
		}
	}
	// Output:
	// warren.queue.messages.ready jobs 3
}

// Measure each attempt at a message as the messaging conventions ask, beside tracing it: the
// tracer's middleware outside, so the measurements are made in the process span. Here the first
// attempt fails and the retry acks; a manual reader collects once.
func ExampleMetrics_Middleware() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	tracer := warrenotel.NewTracer() // OpenTelemetry's global tracer provider

	ctx := context.Background()
	b := warren.New()
	defer b.Close()
	metrics, err := warrenotel.NewMetrics(b, warrenotel.WithMeterProvider(mp))
	if err != nil {
		panic(err)
	}
	defer metrics.Close()
	q, _ := b.DeclareQueue("jobs")
	_ = tracer.Publish(ctx, b, "", "jobs", warren.Message{Body: []byte("job")})

	handle := func(ctx context.Context, d warren.Delivery) error {
		if d.DeliveryCount == 0 {
			return errors.New("transient")
		}
		return nil
	}
	serveCtx, stop := context.WithCancel(ctx)
	served := make(chan error)
	go func() {
		served <- q.Serve(serveCtx, handle, warren.Middleware(tracer.Middleware("jobs"), metrics.Middleware("jobs")))
	}()
	_ = q.WaitEmpty(ctx) // failed, retried, acked
	stop()
	<-served

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(ctx, &rm)
	var lines []string
	for _, m := range rm.ScopeMetrics[0].Metrics {
		switch data := m.Data.(type) {
		case metricdata.Histogram[float64]:
			for _, dp := range data.DataPoints {
				queue, _ := dp.Attributes.Value(semconv.MessagingDestinationNameKey)
				errorType, failed := dp.Attributes.Value(semconv.ErrorTypeKey)
				if !failed {
					errorType = attribute.StringValue("none")
				}
				lines = append(lines, fmt.Sprintf("%s %s: %d attempt, error.type %s", m.Name, queue.AsString(), dp.Count, errorType.AsString()))
			}
		case metricdata.Sum[int64]:
			if m.Name == "messaging.client.consumed.messages" {
				for _, dp := range data.DataPoints {
					lines = append(lines, fmt.Sprintf("%s: %d", m.Name, dp.Value))
				}
			}
		}
	}
	slices.Sort(lines) // a histogram's data points come in no particular order
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	// messaging.client.consumed.messages: 2
	// messaging.process.duration jobs: 1 attempt, error.type *errors.errorString
	// messaging.process.duration jobs: 1 attempt, error.type none
}

package warrenotel_test

import (
	"context"
	"fmt"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

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

package warrenprom_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/warrenmq/warren"
	warrenprom "github.com/warrenmq/warren/contrib/prometheus"
)

// Register a broker's collector and serve it; here the handler is called directly and a few
// lines of its answer printed.
func ExampleNewCollector() {
	ctx := context.Background()
	b := warren.New()
	defer b.Close()
	q, _ := b.DeclareQueue("orders")
	for range 3 {
		_ = b.Publish(ctx, "", "orders", warren.Message{Body: []byte("order")})
	}
	d, _ := q.Get(ctx)
	_ = d.Ack()

	reg := prometheus.NewRegistry()
	reg.MustRegister(warrenprom.NewCollector(b))
	handler := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	// In a service: http.Handle("/metrics", handler); http.ListenAndServe(addr, nil).

	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		line := sc.Text()
		for _, name := range []string{"warren_queue_messages_ready", "warren_queue_messages_acked_total", "warren_queue_ready_bytes"} {
			if strings.HasPrefix(line, name+"{") {
				fmt.Println(line)
			}
		}
	}
	// Output:
	// warren_queue_messages_acked_total{queue="orders"} 1
	// warren_queue_messages_ready{queue="orders"} 2
	// warren_queue_ready_bytes{queue="orders"} 10
}

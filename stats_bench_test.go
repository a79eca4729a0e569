package warren_test

import (
	"fmt"
	"testing"

	"github.com/warrenmq/warren"
)

// Benchmarks of observability (events.go, stats.go): what listeners and Stats snapshots cost.

// BenchmarkListeners is publish+consume+ack with no listener, and with two: what the event
// stream costs. With none, each event site is one atomic load; with two, every message makes
// four events (published, enqueued, delivered, acked), each recorded as an effect of the queue,
// built in its flush and told to both listeners.
func BenchmarkListeners(b *testing.B) {
	for _, n := range []int{0, 2} {
		b.Run(fmt.Sprintf("listeners=%d", n), func(b *testing.B) {
			benchPublishConsumeAckWith(b, 1, 256, nil, warren.Message{Body: benchBody}, n)
		})
	}
}

// BenchmarkStats is the cost of a snapshot, the call a metrics scrape makes per queue: of a
// queue with a backlog, and of a broker of 100 such queues.
func BenchmarkStats(b *testing.B) {
	br := newBroker(b)
	q := declare(b, br, "q0")
	for i := range 100 {
		qi := q
		if i > 0 {
			qi = declare(b, br, fmt.Sprintf("q%d", i))
		}
		for range 1000 {
			if err := br.Publish(b.Context(), "", qi.Name(), warren.Message{Body: benchBody}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("queue", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if q.Stats().Ready != 1000 {
				b.Fatal("wrong ready count")
			}
		}
	})
	b.Run("broker-100-queues", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if len(br.Stats().Queues) != 100 {
				b.Fatal("wrong queue count")
			}
		}
	})
}

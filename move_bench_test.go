package warren_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/warrenmq/warren"
)

// BenchmarkMove: the cost of moving a message from a dead-letter queue back to its work queue
// (Queue.Move: lend, publish, settle; two critical sections of the source and one of the
// destination), per message, with a dead letter's x-death header; and a publish of the same
// message for comparison. Each round moves (or publishes) a batch of 1,000 and empties the
// destination outside the timer.
//
//	go test -run '^$' -bench 'BenchmarkMove$' -benchmem .
func BenchmarkMove(b *testing.B) {
	const batch = 1000
	ctx := context.Background()
	br := warren.New()
	defer br.Close()
	for _, name := range []string{"work", "work.dlq"} {
		if _, err := br.DeclareQueue(name); err != nil {
			b.Fatal(err)
		}
	}
	src, _ := br.Queue("work.dlq")
	dst, _ := br.Queue("work")
	m := warren.Message{Body: make([]byte, 64), Headers: warren.Table{"x-death": []any{warren.Table{
		"queue": "work", "reason": "rejected", "count": int64(1), "exchange": "", "routing-keys": []any{"work"}}}}}
	fill := func(q string) {
		for range batch {
			if err := br.Publish(ctx, "", q, m); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("move", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			fill("work.dlq")
			if _, err := dst.Purge(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if n, err := src.Move(ctx, "", "work"); err != nil || n != batch {
				b.Fatalf("moved %d: %v", n, err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/message")
	})
	b.Run("publish", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			if _, err := dst.Purge(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			fill("work")
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/message")
	})
}

// BenchmarkMoveIntoItself: a priority queue's messages moved back into it (a destination that
// routes back to the source), half of a high priority and half of a low one, so that the moved
// high-priority messages wait ahead of the low-priority ones still to move. Per message; it
// would grow with the queue if each move passed over the messages moved before it.
//
//	go test -run '^$' -bench 'BenchmarkMoveIntoItself' .
func BenchmarkMoveIntoItself(b *testing.B) {
	for _, n := range []int{2000, 20000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			ctx := context.Background()
			br := warren.New()
			defer br.Close()
			q, err := br.DeclareQueue("q", warren.MaxPriority(5))
			if err != nil {
				b.Fatal(err)
			}
			for i := range n {
				if err := br.Publish(ctx, "", "q", warren.Message{Priority: uint8(5 * (i % 2))}); err != nil {
					b.Fatal(err)
				}
			}
			for b.Loop() {
				if moved, err := q.Move(ctx, "", "q"); err != nil || moved != n {
					b.Fatalf("moved %d: %v", moved, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/message")
		})
	}
}

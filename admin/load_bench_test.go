package admin_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/admin"
)

// The admin handler under load: 1,000 queues holding 1,000,000 messages, the page and the JSON
// API requested concurrently. The acceptance question is whether the handler holds a queue's
// lock longer than Stats does. Nothing outside the library can time a lock, so this measures
// it two ways:
//
//   - hold/…: each queue-locking call the handler makes, alone, on a queue of 1,000 messages:
//     Stats, and BrowseFrom of 1 message (what browse reads per call) and, for comparison, of
//     2 to 50 in one call. An uncontended call's time bounds its
//     critical section from above.
//   - http/…: requests in parallel while a probe takes the queues' locks with Len (a critical
//     section of a few nanoseconds) one queue after another; the probe's wait is what a
//     publisher or consumer would wait behind the handler. probe-max-ns and probe-p999-ns are
//     reported; stats-scrape is the baseline, Broker.Stats in parallel, as a metrics scrape.
//
// Run: go test -run '^$' -bench AdminLoad -benchtime 2s ./admin/

func BenchmarkAdminLoad(b *testing.B) {
	const queues, perQueue = 1000, 1000
	br := warren.New()
	defer br.Close()
	body := make([]byte, 64)
	ctx := context.Background()
	start := time.Now()
	var qs []*warren.Queue
	for i := range queues {
		q, err := br.DeclareQueue(fmt.Sprintf("q%04d", i))
		if err != nil {
			b.Fatal(err)
		}
		qs = append(qs, q)
		for range perQueue {
			if err := br.Publish(ctx, "", q.Name(), warren.Message{Body: body}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Logf("%d queues, %d messages: built in %v", queues, queues*perQueue, time.Since(start).Round(time.Millisecond))
	q := qs[queues/2]
	mid := q.BrowseFrom(0, perQueue/2)[perQueue/2-1].ID

	b.Run("hold/stats", func(b *testing.B) {
		for b.Loop() {
			q.Stats()
		}
	})
	for _, n := range []int{1, 2, 4, 8, 50} {
		b.Run(fmt.Sprintf("hold/browse-%d", n), func(b *testing.B) {
			for b.Loop() {
				if len(q.BrowseFrom(mid, n)) != n {
					b.Fatal("short page")
				}
			}
		})
	}

	a := admin.Handler(br)
	defer a.Close()
	srv := httptest.NewServer(a)
	defer srv.Close()
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = 64
	get := func(b *testing.B, path string) {
		res, err := client.Get(srv.URL + path)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			b.Fatalf("GET %s: %s", path, res.Status)
		}
	}
	// A live page: the stream's sampler reads every queue's Stats once a second meanwhile.
	streamCtx, endStream := context.WithCancel(ctx)
	defer endStream()
	req, _ := http.NewRequestWithContext(streamCtx, http.MethodGet, srv.URL+"/api/stream", nil)
	if res, err := client.Do(req); err == nil {
		defer res.Body.Close()
		go io.Copy(io.Discard, res.Body)
	}

	for _, c := range []struct {
		name string
		op   func(b *testing.B, i int)
	}{
		{"stats-scrape", func(b *testing.B, i int) { br.Stats() }},
		{"overview", func(b *testing.B, i int) { get(b, "/api/overview") }},
		{"queues", func(b *testing.B, i int) { get(b, "/api/queues") }},
		{"messages-500", func(b *testing.B, i int) { get(b, fmt.Sprintf("/api/queues/q%04d/messages?limit=500", i%queues)) }},
		{"page-overview", func(b *testing.B, i int) { get(b, "/") }},
		{"page-queue", func(b *testing.B, i int) { get(b, fmt.Sprintf("/queues/q%04d", i%queues)) }},
	} {
		b.Run("http/"+c.name, func(b *testing.B) {
			stop := probe(b, qs)
			b.SetParallelism(4)
			var mu sync.Mutex
			n := 0
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					mu.Lock()
					n++
					i := n
					mu.Unlock()
					c.op(b, i*7919)
				}
			})
			stop()
		})
	}
}

// probe takes each queue's lock in turn with Len until stopped, and reports the longest wait
// and the 99.9th percentile.
func probe(b *testing.B, qs []*warren.Queue) (stop func()) {
	done := make(chan struct{})
	var waits []time.Duration
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			t := time.Now()
			qs[i%len(qs)].Len()
			waits = append(waits, time.Since(t))
		}
	})
	return func() {
		close(done)
		wg.Wait()
		if len(waits) == 0 {
			return
		}
		slices.Sort(waits)
		b.ReportMetric(float64(waits[len(waits)-1].Nanoseconds()), "probe-max-ns")
		b.ReportMetric(float64(waits[len(waits)*999/1000].Nanoseconds()), "probe-p999-ns")
	}
}

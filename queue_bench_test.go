package warren_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenmq/warren"
)

// Core benchmarks. Every benchmark runs a naive baseline in the same run (STYLE habit 36): a
// buffered Go channel of *warren.Message, which is what a user would write without a broker.
//
// Conventions:
//   - Bodies are benchBody, 128 bytes, allocated once: body allocation is not measured. The
//     message itself is built per publish the way a user writes it, warren.Message{Body: …}
//     (Publish takes it by value); the channel baseline allocates a *warren.Message per send.
//   - Nothing is excluded with b.StopTimer inside b.Loop. Periodic housekeeping (purge, refill)
//     runs inside the timed loop and its amortised cost is included; where it is large enough
//     to matter it is also timed separately and reported as its own metric.
//   - Every benchmark joins the goroutines it started and closes its broker, and checks that
//     the goroutine count is back to where it started.

// BenchmarkPublish publishes to one queue through the default exchange, with no consumer.
//
// warren: one op is one Broker.Publish (routing by queue name, one envelope allocation,
// append to the queue's ready ring). The queue is purged every 65536 publishes inside the timed
// loop, so the queue depth saw-tooths between 0 and 65536 and the purge (clearing a ring of
// 65536 entries) is included, amortised: about 1–2 ns/op.
//
// warren-headers and warren-x-death: the same, with four flat headers, and with those and an
// x-death entry (an array of a table holding an array). Every publish walks its headers for
// cycles and depth: measured alone on the 2-core machine, about 70 ns for the four flat headers
// and 175 ns with the x-death entry, with no allocation.
//
// chan: one op is one send of a freshly allocated *Message into a buffered channel (capacity
// 1024) that one goroutine drains; the sender blocks when the receiver falls behind.
func BenchmarkPublish(b *testing.B) {
	flat := warren.Table{"trace-id": "abc", "attempt": int32(1), "tenant": "t1", "n": int64(3)}
	dead := warren.Table{"trace-id": "abc", "attempt": int32(1), "tenant": "t1", "x-death": []any{warren.Table{
		"count": int64(1), "reason": "rejected", "queue": "q", "routing-keys": []any{"q"}, "time": time.Unix(1, 0)}}}
	for _, tc := range []struct {
		name    string
		headers warren.Table
	}{{"warren", nil}, {"warren-headers", flat}, {"warren-x-death", dead}} {
		b.Run(tc.name, func(b *testing.B) {
			before := runtime.NumGoroutine()
			br := newBroker(b)
			q := declare(b, br, "bench")
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if err := br.Publish(ctx, "", "bench", warren.Message{Body: benchBody, Headers: tc.headers}); err != nil {
					b.Fatal(err)
				}
				if i++; i%publishEvery == 0 {
					if _, err := q.Purge(); err != nil {
						b.Fatal(err)
					}
				}
			}
			br.Close()
			checkNoGoroutines(b, before)
		})
	}
	b.Run("chan", func(b *testing.B) {
		before := runtime.NumGoroutine()
		ch := make(chan *warren.Message, 1024)
		var wg sync.WaitGroup
		wg.Go(func() {
			for range ch {
			}
		})
		b.ReportAllocs()
		for b.Loop() {
			ch <- &warren.Message{Body: benchBody}
		}
		close(ch)
		wg.Wait()
		checkNoGoroutines(b, before)
	})
}

// BenchmarkPublishConsumeAck: one producer (the benchmark goroutine) publishes to one queue
// through the default exchange; N consumer goroutines receive from Deliveries and Ack each
// delivery one by one. One op is one message: ns/op is per message.
//
// The timed loop ends when the last message is published; up to pcaWindow messages (< 0.2% of
// a run) are then still being consumed. The msgs/s metric divides the message count by the timed
// duration plus that drain, so it covers every message from first publish to last ack.
//
// chan: a buffered channel of capacity pcaWindow with N receiving goroutines.
func BenchmarkPublishConsumeAck(b *testing.B) {
	for _, tc := range []struct{ consumers, prefetch int }{
		{1, 256}, {1, 1}, {4, 256},
	} {
		b.Run(fmt.Sprintf("consumers=%d/prefetch=%d", tc.consumers, tc.prefetch), func(b *testing.B) {
			benchPublishConsumeAck(b, tc.consumers, tc.prefetch)
		})
	}
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("consumers=%d/chan", n), func(b *testing.B) {
			benchPublishConsumeChan(b, n)
		})
	}
}

// Sizes of BenchmarkRequeue10kInto1M.
const (
	requeueDepth = 1_000_000
	requeueBatch = 10_000
)

// BenchmarkRequeue10kInto1M: a queue holds 1M messages; a consumer with prefetch 10k holds the
// first 10k, received and unacked, so 990k stay ready. One op returns those 10k to their original
// positions in front of the 990k and takes them again: the 10k are redispatched to a consumer
// and received from its Deliveries (the take is part of the op). msg-ns is ns/op / 10k.
//
//   - nack: Consumer.NackUpTo(0); the same consumer has credit again, so NackUpTo itself
//     redispatches the 10k into its channel, and the op receives them.
//   - recover: Consumer.Recover(), which is synchronous, then receive the 10k.
//   - ctxend: the consumer's context is cancelled (AMQP channel close); the return runs on the
//     context's AfterFunc goroutine. The op waits for Done, which is closed once everything the
//     consumer held is back in the queue (Queue.Unacked must then be 0, checked); then a new
//     consumer with prefetch 10k is started, Consume dispatches the 10k to it, and the op
//     receives them. Includes the new consumer (a 10k-slot channel, 80 KB) and one goroutine.
//
// The order is verified once before the timed loop (the retaken batch is messages 0..9999 in
// order, redelivered) and once after it (every return counted in DeliveryCount; the queue head
// is 0..9999 redelivered then 10000 not redelivered).
func BenchmarkRequeue10kInto1M(b *testing.B) {
	for _, mode := range []string{"nack", "recover", "ctxend"} {
		b.Run(mode, func(b *testing.B) { benchRequeue(b, mode) })
	}
}

func benchRequeue(b *testing.B, mode string) {
	before := runtime.NumGoroutine()
	br := newBroker(b)
	q := declare(b, br, "deep")
	bg := context.Background()
	for i := range requeueDepth {
		// MessageID identifies the message for the order checks; only in the setup.
		if err := br.Publish(bg, "", "deep", warren.Message{Body: benchBody, MessageID: strconv.Itoa(i)}); err != nil {
			b.Fatal(err)
		}
	}

	batch := make([]warren.Delivery, requeueBatch)
	// take receives the 10k deliveries that the requeue (or Consume) has just dispatched. They
	// must already be buffered: dispatch is synchronous.
	take := func(c *warren.Consumer) {
		for i := range batch {
			select {
			case d := <-c.Deliveries():
				batch[i] = d
			default:
				b.Fatalf("only %d of %d deliveries buffered after requeue", i, requeueBatch)
			}
		}
	}
	consume := func() (*warren.Consumer, context.CancelFunc) {
		ctx, cancel := context.WithCancel(bg)
		c, err := q.Consume(ctx, warren.Prefetch(requeueBatch))
		if err != nil {
			b.Fatal(err)
		}
		return c, cancel
	}
	c, cancel := consume()
	defer func() { cancel() }()
	take(c)
	checkBatch(b, batch, 0)

	requeue := func() {
		switch mode {
		case "nack":
			if err := c.NackUpTo(0); err != nil {
				b.Fatal(err)
			}
		case "recover":
			if err := c.Recover(); err != nil {
				b.Fatal(err)
			}
		case "ctxend":
			cancel()
			<-c.Done()
			if n := q.Unacked(); n != 0 {
				b.Fatalf("Unacked() = %d after the consumer's context ended", n)
			}
			c, cancel = consume()
		}
	}

	// Verify once: after a requeue, the 10k come back as the queue's head in their original
	// order, redelivered, and the rest of the queue is untouched.
	requeue()
	take(c)
	checkBatch(b, batch, 1)
	if n := q.Len(); n != requeueDepth-requeueBatch {
		b.Fatalf("Len() = %d, want %d", n, requeueDepth-requeueBatch)
	}

	b.ReportAllocs()
	for b.Loop() {
		requeue()
		take(c)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/requeueBatch, "msg-ns")

	// Verify again: every op returned the same 10k to the same place.
	checkBatch(b, batch, b.N+1)
	if err := c.Cancel(); err != nil { // received deliveries stay outstanding
		b.Fatal(err)
	}
	if err := c.NackUpTo(0); err != nil {
		b.Fatal(err)
	}
	for i := range requeueBatch + 1 {
		d, err := q.Get(bg, warren.AutoAck())
		if err != nil {
			b.Fatal(err)
		}
		if want, redelivered := strconv.Itoa(i), i < requeueBatch; d.Message.MessageID != want || d.Redelivered != redelivered {
			b.Fatalf("queue position %d: message %s redelivered=%t, want %s redelivered=%t",
				i, d.Message.MessageID, d.Redelivered, want, redelivered)
		}
	}
	cancel()
	br.Close()
	checkNoGoroutines(b, before)
}

// checkBatch checks that batch holds messages 0..len-1 in order, each returned returns times.
func checkBatch(b *testing.B, batch []warren.Delivery, returns int) {
	b.Helper()
	for i, d := range batch {
		if want := strconv.Itoa(i); d.Message.MessageID != want || d.DeliveryCount != returns || d.Redelivered != (returns > 0) {
			b.Fatalf("delivery %d: message %s, DeliveryCount %d, Redelivered %t; want message %s returned %d times",
				i, d.Message.MessageID, d.DeliveryCount, d.Redelivered, want, returns)
		}
	}
}

// Topology of BenchmarkTopicRouting10kBindings.
const (
	topicBindings = 10_000
	topicQueues   = 100
	topicKeys     = 1024
	topicExchange = "bench.topic"
)

// topicBinding returns binding i: for n = i/3, the patterns "stock.<n>.*", "#.<n>" and
// "a.<n>.#" in turn, to queue "t.<i mod 100>". The three patterns of one n go to three different
// queues, so a message matching two of them is enqueued twice.
func topicBinding(i int) (pattern string, queue int) {
	n := i / 3
	switch i % 3 {
	case 0:
		pattern = fmt.Sprintf("stock.%d.*", n)
	case 1:
		pattern = fmt.Sprintf("#.%d", n)
	default:
		pattern = fmt.Sprintf("a.%d.#", n)
	}
	return pattern, i % topicQueues
}

// topicKey returns publish key j (of topicKeys) for the given number of matches: "stock.<n>.<n>"
// matches "stock.<n>.*" and "#.<n>"; "a.<n>.x.<n>" matches "a.<n>.#" and "#.<n>";
// "nomatch.<n>.x" matches nothing (but still has to be tried against every "#.<n>").
func topicKey(j, matches int) (key string, queues []int) {
	n := (j * 331) % (topicBindings / 3) // spread over all n
	switch {
	case matches == 0:
		return fmt.Sprintf("nomatch.%d.x", n), nil
	case j%2 == 0:
		return fmt.Sprintf("stock.%d.%d", n, n), []int{(3 * n) % topicQueues, (3*n + 1) % topicQueues}
	default:
		return fmt.Sprintf("a.%d.x.%d", n, n), []int{(3*n + 2) % topicQueues, (3*n + 1) % topicQueues}
	}
}

// BenchmarkTopicRouting10kBindings: one topic exchange with 10,000 bindings (see topicBinding:
// 3,334 "stock.<n>.*", 3,333 "#.<n>", 3,333 "a.<n>.#") to 100 queues, no consumers. One op is
// one Broker.Publish with a key cycling over 1024 precomputed keys.
//
//   - match=2: every key matches exactly 2 bindings (2 queues), so each op also enqueues twice.
//   - match=0: no binding matches; the message is dropped (pure routing cost).
//   - linear/match=2: the naive baseline: the same 10k patterns pre-split into words, matched
//     one by one against the pre-split key, and a *Message sent into a buffered channel per
//     matched queue. It shows what the topic index saves.
//
// All 100 queues (channels) are purged every 65536 publishes inside the timed loop (included,
// amortised). Routing is checked once before the timed loop: each key reaches exactly the
// queues it should.
func BenchmarkTopicRouting10kBindings(b *testing.B) {
	for _, matches := range []int{2, 0} {
		b.Run(fmt.Sprintf("match=%d", matches), func(b *testing.B) { benchTopic(b, matches) })
	}
	b.Run("linear/match=2", benchTopicLinear)
}

func benchTopic(b *testing.B, matches int) {
	before := runtime.NumGoroutine()
	br := newBroker(b)
	if _, err := br.DeclareExchange(topicExchange, warren.ExchangeTopic); err != nil {
		b.Fatal(err)
	}
	qs := make([]*warren.Queue, topicQueues)
	for i := range qs {
		qs[i] = declare(b, br, "t."+strconv.Itoa(i))
	}
	for i := range topicBindings {
		p, qi := topicBinding(i)
		if err := br.Bind(qs[qi].Name(), topicExchange, p, nil); err != nil {
			b.Fatal(err)
		}
	}
	keys := make([]string, topicKeys)
	ctx := context.Background()
	for j := range keys {
		var want []int
		keys[j], want = topicKey(j, matches)
		// Check the routing once: the message reaches exactly the expected queues.
		err := br.Publish(ctx, topicExchange, keys[j], warren.Message{Body: benchBody}, warren.Mandatory())
		if matches == 0 {
			if !errors.Is(err, warren.ErrUnroutable) {
				b.Fatalf("key %q: Publish with Mandatory = %v, want ErrUnroutable", keys[j], err)
			}
		} else if err != nil {
			b.Fatalf("key %q: %v", keys[j], err)
		}
		var got []int
		for qi, q := range qs {
			if n, _ := q.Purge(); n > 0 {
				got = append(got, qi)
			}
		}
		if !sameSet(got, want) {
			b.Fatalf("key %q routed to queues %v, want %v", keys[j], got, want)
		}
	}

	if matches == 0 {
		// Unroutable keys prove little on their own: check that matching keys do route.
		checkTopicRoutes(b, br, qs, 16)
	}

	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := br.Publish(ctx, topicExchange, keys[i%topicKeys], warren.Message{Body: benchBody}); err != nil {
			b.Fatal(err)
		}
		if i++; i%publishEvery == 0 {
			for _, q := range qs {
				if _, err := q.Purge(); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	br.Close()
	checkNoGoroutines(b, before)
}

// checkTopicRoutes checks that the first n matching keys reach exactly their expected queues.
func checkTopicRoutes(b *testing.B, br *warren.Broker, qs []*warren.Queue, n int) {
	b.Helper()
	for j := range n {
		key, want := topicKey(j, 2)
		if err := br.Publish(context.Background(), topicExchange, key, warren.Message{Body: benchBody}); err != nil {
			b.Fatalf("key %q: %v", key, err)
		}
		var got []int
		for qi, q := range qs {
			if n, _ := q.Purge(); n > 0 {
				got = append(got, qi)
			}
		}
		if !sameSet(got, want) {
			b.Fatalf("key %q routed to queues %v, want %v", key, got, want)
		}
	}
}

func sameSet(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	seen := make(map[int]int)
	for _, x := range a {
		seen[x]++
	}
	for _, x := range b {
		seen[x]--
	}
	for _, n := range seen {
		if n != 0 {
			return false
		}
	}
	return true
}

// topicMatch is the naive AMQP topic match of a pattern against a key, both split into words:
// "*" matches one word, "#" zero or more.
func topicMatch(p, k []string) bool {
	for len(p) > 0 {
		if p[0] == "#" {
			if len(p) == 1 {
				return true
			}
			for i := 0; i <= len(k); i++ {
				if topicMatch(p[1:], k[i:]) {
					return true
				}
			}
			return false
		}
		if len(k) == 0 || (p[0] != "*" && p[0] != k[0]) {
			return false
		}
		p, k = p[1:], k[1:]
	}
	return len(k) == 0
}

func benchTopicLinear(b *testing.B) {
	type bindingWords struct {
		words []string
		queue int
	}
	bindings := make([]bindingWords, topicBindings)
	for i := range bindings {
		p, qi := topicBinding(i)
		bindings[i] = bindingWords{strings.Split(p, "."), qi}
	}
	keys := make([][]string, topicKeys)
	for j := range keys {
		k, want := topicKey(j, 2)
		keys[j] = strings.Split(k, ".")
		var got []int
		for _, bd := range bindings {
			if topicMatch(bd.words, keys[j]) {
				got = append(got, bd.queue)
			}
		}
		if !sameSet(got, want) {
			b.Fatalf("linear: key %q routed to %v, want %v", k, got, want)
		}
	}
	chans := make([]chan *warren.Message, topicQueues)
	for i := range chans {
		chans[i] = make(chan *warren.Message, publishEvery) // never full between purges
	}
	var hit [topicQueues]bool
	dests := make([]int, 0, 8)

	b.ReportAllocs()
	i := 0
	for b.Loop() {
		key := keys[i%topicKeys]
		dests = dests[:0]
		for _, bd := range bindings {
			if topicMatch(bd.words, key) && !hit[bd.queue] {
				hit[bd.queue] = true
				dests = append(dests, bd.queue)
			}
		}
		m := &warren.Message{Body: benchBody}
		for _, qi := range dests {
			hit[qi] = false
			chans[qi] <- m
		}
		if i++; i%publishEvery == 0 {
			for _, ch := range chans {
				for len(ch) > 0 {
					<-ch
				}
			}
		}
	}
}

// BenchmarkGetAck: Queue.Get then Delivery.Ack, one message per op, on a queue pre-filled with
// 65536 messages. When the queue runs empty it is refilled by publishing 65536 messages inside
// the timed loop, so ns/op and allocs/op include the refill, amortised (about one Publish per
// op). The refills are also timed on their own: refill-ns/op is their share of ns/op and
// getack-ns/op = ns/op − refill-ns/op is the cost of Get+Ack alone.
//
//   - ctx=cancel: Get's owner is a cancellable context, as an AMQP channel's would be, so each
//     Get registers (context.AfterFunc) and each Ack unregisters a callback on it.
//   - ctx=background: Get's owner is context.Background(), which never ends.
//   - chan: a non-blocking receive from a buffered channel refilled the same way.
func BenchmarkGetAck(b *testing.B) {
	b.Run("ctx=cancel", func(b *testing.B) {
		ctx := b.Context()
		benchGetAck(b, ctx)
	})
	b.Run("ctx=background", func(b *testing.B) { benchGetAck(b, context.Background()) })
	b.Run("chan", benchGetChan)
}

func benchGetAck(b *testing.B, ctx context.Context) {
	before := runtime.NumGoroutine()
	br := newBroker(b)
	q := declare(b, br, "get")
	refill := func() {
		for range getDepth {
			if err := br.Publish(ctx, "", "get", warren.Message{Body: benchBody}); err != nil {
				b.Fatal(err)
			}
		}
	}
	refill()
	loopGetSettle(b, ctx, q, refill, (warren.Delivery).Ack)
	if n := q.Unacked(); n != 0 {
		b.Fatalf("Unacked() = %d after the loop", n)
	}
	br.Close()
	checkNoGoroutines(b, before)
}

func benchGetChan(b *testing.B) {
	ch := make(chan *warren.Message, getDepth)
	refill := func() {
		for range getDepth {
			ch <- &warren.Message{Body: benchBody}
		}
	}
	refill()
	var refillTime time.Duration
	b.ReportAllocs()
	for b.Loop() {
		select {
		case m := <-ch:
			_ = m
		default:
			start := time.Now()
			refill()
			refillTime += time.Since(start)
			<-ch
		}
	}
	reportRefill(b, refillTime)
}

// BenchmarkRoundTrip is the whole path of one message on one goroutine: publish through the
// default exchange to a queue with one consumer (prefetch 256), receive the delivery, ack it.
// With no second goroutine there is no scheduling, lock hand-off or wake-up in it: ns/op is the
// CPU cost of a message, the figure to compare commits with when tuning the hot path (the
// concurrent BenchmarkPublishConsumeAck varies by ±30% from run to run on a shared machine).
// chan: a send and a receive on a buffered channel of *Message, each message allocated.
func BenchmarkRoundTrip(b *testing.B) {
	b.Run("warren", func(b *testing.B) {
		br := newBroker(b)
		q := declare(b, br, "bench")
		ctx := context.Background()
		c, err := q.Consume(ctx, warren.Prefetch(256))
		if err != nil {
			b.Fatal(err)
		}
		ch := c.Deliveries()
		msg := warren.Message{Body: benchBody}
		b.ReportAllocs()
		for b.Loop() {
			if err := br.Publish(ctx, "", "bench", msg); err != nil {
				b.Fatal(err)
			}
			if err := (<-ch).Ack(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("chan", func(b *testing.B) {
		ch := make(chan *warren.Message, 256)
		b.ReportAllocs()
		for b.Loop() {
			ch <- &warren.Message{Body: benchBody}
			if m := <-ch; len(m.Body) != len(benchBody) {
				b.Fatal("short body")
			}
		}
	})
}

// BenchmarkBacklogMemory measures the live heap a queued message costs beyond its body: 1<<20
// messages published into a queue nobody consumes, the heap collected before and after
// (runtime.MemStats.HeapAlloc). B/msg is the cost per message; ns/op is not meaningful. Run it
// with -benchtime=1x.
//
// chan: the same messages, each a *Message allocated and sent into a channel of that capacity.
func BenchmarkBacklogMemory(b *testing.B) {
	const n = 1 << 20
	bodies := make([][]byte, n) // allocated before the first reading: not counted
	for i := range bodies {
		bodies[i] = make([]byte, 128)
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	// fill builds the backlog and returns what releases it, which keeps it alive until then.
	measure := func(b *testing.B, fill func() (release func())) {
		for b.Loop() {
			before := heap()
			release := fill()
			b.ReportMetric(float64(heap()-before)/n, "B/msg")
			release()
		}
	}
	b.Run("warren", func(b *testing.B) {
		measure(b, func() func() {
			br := warren.New()
			q, err := br.DeclareQueue("backlog")
			if err != nil {
				b.Fatal(err)
			}
			for _, body := range bodies {
				if err := br.Publish(context.Background(), "", "backlog", warren.Message{Body: body}); err != nil {
					b.Fatal(err)
				}
			}
			return func() {
				if q.Len() != n {
					b.Fatalf("backlog of %d, want %d", q.Len(), n)
				}
				br.Close()
			}
		})
	})
	b.Run("chan", func(b *testing.B) {
		measure(b, func() func() {
			ch := make(chan *warren.Message, n)
			for _, body := range bodies {
				ch <- &warren.Message{Body: body}
			}
			return func() {
				if len(ch) != n {
					b.Fatalf("backlog of %d, want %d", len(ch), n)
				}
			}
		})
	})
}

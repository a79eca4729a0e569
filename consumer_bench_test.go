package warren_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenmq/warren"
)

// Benchmarks of Serve, selectors, priority queues and consumer priorities (serve.go,
// dispatch.go). The conventions of queue_bench_test.go hold (128-byte bodies allocated once, a
// channel baseline in the same run, goroutines joined and counted), with one difference: each
// op is one message and ns/op is measured end to end, from the first publish to the last
// acknowledgement (the timer stops only after every message is settled), so ns/op and msgs/s
// describe the same interval. As in BenchmarkPublishConsumeAck, the producer is held at most
// pcaWindow messages ahead of the acknowledgements (ackWindow), and the channel baselines are
// bounded by their capacity, pcaWindow.

// chanHandler is the channel baselines' handler, called through a variable like a user's
// callback would be.
var chanHandler = func(context.Context, *warren.Message) error { return nil }

// benchChanFlow is the channel baseline of this file: b.N fresh *Message copies of
// msgs[i%len(msgs)], each sent into channel route(m) (0 when route is nil) of len(receivers)
// buffered channels of capacity pcaWindow; receivers[k] goroutines drain channel k and call
// chanHandler on each message. Timed until every message is handled; returns how many each
// channel delivered.
func benchChanFlow(b *testing.B, receivers []int, msgs []warren.Message, route func(*warren.Message) int) []int64 {
	before := runtime.NumGoroutine()
	chans := make([]chan *warren.Message, len(receivers))
	counts := make([]atomic.Int64, len(receivers))
	var wg sync.WaitGroup
	ctx := context.Background()
	for k, n := range receivers {
		chans[k] = make(chan *warren.Message, pcaWindow)
		for range n {
			wg.Go(func() {
				var got int64
				for m := range chans[k] {
					if err := chanHandler(ctx, m); err != nil {
						b.Error(err)
					}
					got++
				}
				counts[k].Add(got)
			})
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		m := new(warren.Message)
		*m = msgs[i%len(msgs)]
		k := 0
		if route != nil {
			k = route(m)
		}
		chans[k] <- m
	}
	for _, ch := range chans {
		close(ch)
	}
	wg.Wait()
	b.StopTimer()
	reportRate(b)
	got := make([]int64, len(counts))
	var total int64
	for k := range counts {
		got[k] = counts[k].Load()
		total += got[k]
	}
	if total != int64(b.N) {
		b.Fatalf("handled %d of %d messages", total, b.N)
	}
	checkNoGoroutines(b, before)
	return got
}

// reportRate reports msgs/s over the timed interval: b.N messages, all settled.
func reportRate(b *testing.B) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)/s, "msgs/s")
	}
}

// waitConsumers waits, untimed, until q has n consumers, or fails if errc reports first.
func waitConsumers(b *testing.B, q *warren.Queue, n int, errc <-chan error) {
	b.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for q.ConsumerCount() < n {
		select {
		case err := <-errc:
			b.Fatalf("Serve returned early: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("ConsumerCount() = %d, want %d", q.ConsumerCount(), n)
		}
		runtime.Gosched()
	}
}

// BenchmarkServe: one producer publishes b.N messages to one queue served by Queue.Serve with
// a pool of n workers and a trivial handler (it returns nil, so Serve acks each delivery). One
// op is one message, timed from the first publish until the last delivery is acked: after the
// last handler call the benchmark cancels Serve's context and waits for Serve to return (its
// graceful stop applies the last results), inside the timer. Queue.Len and Queue.Unacked are
// then checked to be 0. Serve's prefetch defaults to the worker count; the prefetch=256 variant
// sets it with Prefetch, for comparison with BenchmarkPublishConsumeAck's
// consumers=1/prefetch=256 (a bare Consume loop).
//
// durable: the queue is a durable one of a broker from Open (SyncNever, in b.TempDir()) and the
// messages are persistent, so that each handler run waits for its delivery's record (Serve's
// receipt); the producer publishes with PublishDeferred and waits for the last confirmation
// only, so that Serve, not a write(2) per publish, sets the pace.
//
// chan: a worker pool without a broker: a buffered channel of *Message (capacity pcaWindow) and
// n goroutines calling a handler on each message.
func BenchmarkServe(b *testing.B) {
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) { benchServe(b, n, false) })
	}
	b.Run("workers=1/prefetch=256", func(b *testing.B) { benchServe(b, 1, false, warren.Prefetch(256)) })
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("workers=%d/durable", n), func(b *testing.B) { benchServe(b, n, true) })
	}
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("workers=%d/chan", n), func(b *testing.B) {
			benchChanFlow(b, []int{n}, []warren.Message{{Body: benchBody}}, nil)
		})
	}
}

func benchServe(b *testing.B, workers int, durable bool, opts ...warren.ServeOption) {
	before := runtime.NumGoroutine()
	br, msg := newBroker(b), warren.Message{Body: benchBody}
	var qopts []warren.QueueOption
	if durable {
		var err error
		if br, err = warren.Open(b.TempDir(), warren.WithSync(warren.SyncNever)); err != nil {
			b.Fatal(err)
		}
		qopts, msg.Persistent = []warren.QueueOption{warren.Durable()}, true
	}
	q := declare(b, br, "serve", qopts...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	win := newAckWindow(pcaWindow)
	h := func(context.Context, warren.Delivery) error {
		win.ack() // counts handled messages; Serve acks right after
		return nil
	}
	errc := make(chan error, 1)
	go func() {
		errc <- q.Serve(ctx, h, append([]warren.ServeOption{warren.Workers(workers)}, opts...)...)
	}()
	waitConsumers(b, q, 1, errc)

	b.ReportAllocs()
	b.ResetTimer()
	var last warren.Confirmation
	for i := range b.N {
		win.admit(int64(i))
		var err error
		if durable {
			last, err = br.PublishDeferred(ctx, "", "serve", msg)
		} else {
			err = br.Publish(ctx, "", "serve", msg)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	if durable {
		if err := last.Wait(); err != nil {
			b.Fatal(err)
		}
	}
	win.wait(int64(b.N))
	cancel()
	err := <-errc
	b.StopTimer()
	reportRate(b)

	if err != nil {
		b.Fatalf("Serve: %v", err)
	}
	if l, u := q.Len(), q.Unacked(); l != 0 || u != 0 {
		b.Fatalf("after Serve: Len() = %d, Unacked() = %d, want 0, 0", l, u)
	}
	if got := win.acked.Load(); got != int64(b.N) {
		b.Fatalf("handled %d of %d messages", got, b.N)
	}
	br.Close()
	checkNoGoroutines(b, before)
}

// flowConsumer is one consumer of benchFlow: its Consume options, and check, which every
// delivery it receives must pass (nil: any).
type flowConsumer struct {
	opts  []warren.ConsumeOption
	check func(warren.Delivery) bool
}

// benchFlow is publish + consume + ack with consumers of any options: one producer publishes
// b.N copies of msgs[i%len(msgs)] through the default exchange to a queue declared with qopts;
// each consumer has a goroutine that receives from Deliveries and acks each delivery. One op is
// one message, timed until every message is acked. It reports msgs/s and ready-depth, the mean
// Queue.Len sampled every 1024 publishes, and returns how many messages each consumer received.
// setup, if not nil, runs on the queue before the consumers start (untimed).
func benchFlow(b *testing.B, qopts []warren.QueueOption, consumers []flowConsumer, msgs []warren.Message, setup func(*warren.Broker, *warren.Queue)) []int64 {
	before := runtime.NumGoroutine()
	br := newBroker(b)
	q, err := br.DeclareQueue("flow", qopts...)
	if err != nil {
		b.Fatal(err)
	}
	if setup != nil {
		setup(br, q)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var (
		win      = newAckWindow(pcaWindow)
		firstErr atomic.Pointer[error]
		wg       sync.WaitGroup
		cs       = make([]*warren.Consumer, len(consumers))
		counts   = make([]int64, len(consumers))
	)
	fail := func(err error) { firstErr.CompareAndSwap(nil, &err) }
	for i, fc := range consumers {
		c, err := q.Consume(ctx, fc.opts...)
		if err != nil {
			b.Fatal(err)
		}
		cs[i] = c
		wg.Go(func() {
			var n int64
			for d := range c.Deliveries() {
				if fc.check != nil && !fc.check(d) {
					fail(fmt.Errorf("consumer %d received a message it should not have: %q", i, d.Message.Body[:1]))
				}
				if err := d.Ack(); err != nil {
					fail(err)
				}
				win.ack()
				n++
			}
			counts[i] = n
		})
	}

	var depth, samples int64
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		win.admit(int64(i))
		if err := br.Publish(ctx, "", "flow", msgs[i%len(msgs)]); err != nil {
			b.Fatal(err)
		}
		if i%1024 == 1023 {
			depth += int64(q.Len())
			samples++
		}
	}
	win.wait(int64(b.N))
	b.StopTimer()
	reportRate(b)
	if samples > 0 {
		b.ReportMetric(float64(depth)/float64(samples), "ready-depth")
	}

	for _, c := range cs {
		if err := c.Cancel(); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
	cancel()
	if p := firstErr.Load(); p != nil {
		b.Fatal(*p)
	}
	var total int64
	for _, n := range counts {
		total += n
	}
	if l, u := q.Len(), q.Unacked(); total != int64(b.N) || l != 0 || u != 0 {
		b.Fatalf("received %d of %d messages; Len() = %d, Unacked() = %d", total, b.N, l, u)
	}
	br.Close()
	checkNoGoroutines(b, before)
	return counts
}

// selectedBody marks a message that BenchmarkSelector's selector accepts: its first byte is 1
// (benchBody's are 0).
var selectedBody = func() []byte {
	body := make([]byte, len(benchBody))
	body[0] = 1
	return body
}()

func isSelected(m *warren.Message) bool { return len(m.Body) > 0 && m.Body[0] == 1 }

// selectorMsgs returns the repeating publish pattern of BenchmarkSelector: 100 messages of which
// pct (evenly spaced) are selected.
func selectorMsgs(pct int) []warren.Message {
	msgs := make([]warren.Message, 100)
	for i := range msgs {
		msgs[i] = warren.Message{Body: benchBody}
		if i*pct%100 < pct { // pct messages of the 100, evenly spaced
			msgs[i].Body = selectedBody
		}
	}
	return msgs
}

// BenchmarkSelector: publish + consume + ack on one queue with two consumers (prefetch 256
// each, one goroutine each acking every delivery):
//
//   - match=P%: "sel" has Selector(first body byte == 1) and ConsumerPriority(1); "rest" has no
//     selector and priority 0. P% of the published messages (evenly spaced) are selected. With
//     the higher priority sel receives every selected message while it has credit (sel-share is
//     the fraction of the selected messages it did receive; every message it receives is checked
//     to be a selected one), and rest receives everything sel does not take, so the queue stays
//     short. ns/op is per published message; ns/sel-msg = the same time divided by the messages
//     delivered to sel: the cost of each selected delivery, all the skipping included.
//   - selectors=0: the same stream (no message selected) to two plain consumers of one priority,
//     the simple dispatch path. BenchmarkConsumerPriority isolates the cost of the priorities.
//   - selectors=0/consumers=1: one plain consumer. At match=1% "rest" acks 99% of the messages
//     on its own goroutine, so this, not two consumers, is its throughput bound.
//   - chan/match=P%: no broker: the producer evaluates the predicate itself and sends each message
//     into one of two buffered channels, one receiver each.
func BenchmarkSelector(b *testing.B) {
	for _, pct := range []int{1, 50} {
		b.Run(fmt.Sprintf("match=%d%%", pct), func(b *testing.B) { benchSelector(b, pct) })
	}
	plain := flowConsumer{opts: []warren.ConsumeOption{warren.Prefetch(256)}}
	b.Run("selectors=0", func(b *testing.B) {
		benchFlow(b, nil, []flowConsumer{plain, plain}, selectorMsgs(0), nil)
	})
	b.Run("selectors=0/consumers=1", func(b *testing.B) {
		benchFlow(b, nil, []flowConsumer{plain}, selectorMsgs(0), nil)
	})
	for _, pct := range []int{1, 50} {
		b.Run(fmt.Sprintf("chan/match=%d%%", pct), func(b *testing.B) {
			counts := benchChanFlow(b, []int{1, 1}, selectorMsgs(pct), func(m *warren.Message) int {
				if isSelected(m) {
					return 0
				}
				return 1
			})
			if counts[0] > 0 {
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(counts[0]), "ns/sel-msg")
			}
		})
	}
}

func benchSelector(b *testing.B, pct int) {
	sel := flowConsumer{
		opts:  []warren.ConsumeOption{warren.Prefetch(256), warren.ConsumerPriority(1), warren.Selector(isSelected)},
		check: func(d warren.Delivery) bool { return isSelected(&d.Message) },
	}
	rest := flowConsumer{opts: []warren.ConsumeOption{warren.Prefetch(256)}}
	msgs := selectorMsgs(pct)
	counts := benchFlow(b, nil, []flowConsumer{sel, rest}, msgs, nil)
	if counts[0] > 0 {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(counts[0]), "ns/sel-msg")
	}
	var selected int64
	for i := range b.N {
		if isSelected(&msgs[i%len(msgs)]) {
			selected++
		}
	}
	if selected > 0 {
		b.ReportMetric(float64(counts[0])/float64(selected), "sel-share")
	}
}

// priorityMsgs returns 1024 messages with priorities drawn uniformly from 0..10. The seed is
// fixed, so that runs compare; $WARREN_BENCH_SEED overrides it.
func priorityMsgs(b *testing.B) []warren.Message {
	rng := rand.New(rand.NewPCG(envSeed(b, "WARREN_BENCH_SEED", 1), 0))
	msgs := make([]warren.Message, 1024)
	for i := range msgs {
		msgs[i] = warren.Message{Body: benchBody, Priority: uint8(rng.IntN(11))}
	}
	return msgs
}

// checkPriorityOrder publishes msgs to q (which has no consumer) and takes them back with Get:
// they must come out by priority, highest first, and in publish order within a priority
// (MessageID, set here only, numbers them).
func checkPriorityOrder(b *testing.B, br *warren.Broker, q *warren.Queue, msgs []warren.Message) {
	b.Helper()
	ctx := context.Background()
	for i, m := range msgs {
		m.MessageID = strconv.Itoa(i)
		if err := br.Publish(ctx, "", q.Name(), m); err != nil {
			b.Fatal(err)
		}
	}
	prevPrio, prevID := 256, -1
	for range msgs {
		d, err := q.Get(ctx, warren.AutoAck())
		if err != nil {
			b.Fatal(err)
		}
		p := int(d.Message.Priority)
		id, _ := strconv.Atoi(d.Message.MessageID)
		if p > prevPrio || (p == prevPrio && id < prevID) {
			b.Fatalf("message %d (priority %d) came after message %d (priority %d)", id, p, prevID, prevPrio)
		}
		prevPrio, prevID = p, id
	}
	if _, err := q.Get(ctx); !errors.Is(err, warren.ErrEmpty) {
		b.Fatalf("Get after the check: %v, want ErrEmpty", err)
	}
}

// BenchmarkPriorityQueue: publish + consume + ack, one consumer (prefetch 256) acking each
// delivery, messages with priorities drawn from 0..10 (1024 precomputed by priorityMsgs, in a
// cycle). ready-depth is the mean number of ready messages, sampled: the ordering has something
// to do only when messages wait.
//
//   - max=10: the queue is declared with MaxPriority(10). Before the timed run, the 1024
//     messages are put through the queue with Get once to check that they come out by priority.
//   - max=10/prio=0: the same queue, every message of priority 0: the priority queue's overhead
//     when the priorities do not differ.
//   - none: a queue without priorities; the same messages, whose Priority it ignores.
//   - chan: a buffered channel (capacity pcaWindow) with one receiver, no priorities.
func BenchmarkPriorityQueue(b *testing.B) {
	consumer := []flowConsumer{{opts: []warren.ConsumeOption{warren.Prefetch(256)}}}
	b.Run("max=10", func(b *testing.B) {
		msgs := priorityMsgs(b)
		benchFlow(b, []warren.QueueOption{warren.MaxPriority(10)}, consumer, msgs,
			func(br *warren.Broker, q *warren.Queue) { checkPriorityOrder(b, br, q, msgs) })
	})
	b.Run("max=10/prio=0", func(b *testing.B) {
		benchFlow(b, []warren.QueueOption{warren.MaxPriority(10)}, consumer, []warren.Message{{Body: benchBody}}, nil)
	})
	b.Run("none", func(b *testing.B) {
		benchFlow(b, nil, consumer, priorityMsgs(b), nil)
	})
	b.Run("chan", func(b *testing.B) {
		benchChanFlow(b, []int{1}, priorityMsgs(b), nil)
	})
}

// BenchmarkConsumerPriority: publish + consume + ack to two consumers, each with its own
// goroutine acking every delivery, both with the given prefetch.
//
//   - prio=10,0: ConsumerPriority(10) and ConsumerPriority(0): the second receives only while the
//     first is out of credit (the general dispatch path). high-share is the fraction of the
//     messages the first received.
//   - prio=0,0: both of priority 0 (round-robin, the simple path).
//   - chan: one buffered channel (capacity pcaWindow), two receivers.
func BenchmarkConsumerPriority(b *testing.B) {
	for _, prefetch := range []int{256, 1} {
		for _, prio := range [][2]int{{10, 0}, {0, 0}} {
			b.Run(fmt.Sprintf("prio=%d,%d/prefetch=%d", prio[0], prio[1], prefetch), func(b *testing.B) {
				cs := make([]flowConsumer, 2)
				for i := range cs {
					cs[i].opts = []warren.ConsumeOption{warren.Prefetch(prefetch), warren.ConsumerPriority(prio[i])}
				}
				counts := benchFlow(b, nil, cs, []warren.Message{{Body: benchBody}}, nil)
				if b.N > 0 {
					b.ReportMetric(float64(counts[0])/float64(b.N), "high-share")
				}
			})
		}
	}
	b.Run("chan", func(b *testing.B) {
		benchChanFlow(b, []int{2}, []warren.Message{{Body: benchBody}}, nil)
	})
}

package warren_test

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/warrenmq/warren"
)

// Benchmarks of message TTL (ttl.go) and dead-lettering (deadletter.go). They follow the
// conventions of queue_bench_test.go and reuse the benchmark helpers of helpers_test.go
// (ackWindow, benchPublishConsumeAck, reportRefill, checkNoGoroutines), with one documented
// exception: BenchmarkExpire1M excludes the fill of its queue with b.StopTimer, because the fill
// is 1M publishes and the op is their expiry.

// declareWithDLX declares the queue name with opts and, when withDLX, a dead-letter topology for
// it: the queue's dead-letter exchange "dlx.<name>", a fanout exchange bound to one queue,
// "dlq.<name>". It returns the queue and the dead-letter queue (nil without).
func declareWithDLX(b *testing.B, br *warren.Broker, name string, withDLX bool, opts ...warren.QueueOption) (q, dlq *warren.Queue) {
	b.Helper()
	if withDLX {
		x := "dlx." + name
		if _, err := br.DeclareExchange(x, warren.ExchangeFanout); err != nil {
			b.Fatal(err)
		}
		dlq = declare(b, br, "dlq."+name)
		if err := br.Bind(dlq.Name(), x, "", nil); err != nil {
			b.Fatal(err)
		}
		opts = append(opts, warren.DeadLetter(x, ""))
	}
	q, err := br.DeclareQueue(name, opts...)
	if err != nil {
		b.Fatal(err)
	}
	return q, dlq
}

// deleteWithDLX deletes what declareWithDLX declared.
func deleteWithDLX(b *testing.B, br *warren.Broker, name string, withDLX bool) {
	b.Helper()
	if _, err := br.DeleteQueue(name); err != nil {
		b.Fatal(err)
	}
	if withDLX {
		if _, err := br.DeleteQueue("dlq." + name); err != nil {
			b.Fatal(err)
		}
		if err := br.DeleteExchange("dlx." + name); err != nil {
			b.Fatal(err)
		}
	}
}

// checkDeadLetter takes one message from dlq and checks that it was dead-lettered from queue
// with reason.
func checkDeadLetter(b *testing.B, dlq *warren.Queue, queue, reason string) {
	b.Helper()
	d, err := dlq.Get(context.Background(), warren.AutoAck())
	if err != nil {
		b.Fatalf("dead-letter queue: %v", err)
	}
	h := d.Message.Headers
	if h["x-first-death-queue"] != queue || h["x-first-death-reason"] != reason || d.Message.Expiration != "" {
		b.Fatalf("dead letter: x-first-death-queue %v, x-first-death-reason %v, Expiration %q; want %s, %s, \"\"",
			h["x-first-death-queue"], h["x-first-death-reason"], d.Message.Expiration, queue, reason)
	}
}

// BenchmarkPublishConsumeAckTTL is BenchmarkPublishConsumeAck/consumers=1/prefetch=256 (one
// producer, one consumer acking each delivery, at most pcaWindow in flight; one op is one
// message) with a TTL that never fires, so that every message is indexed by its deadline on
// publish and unindexed when it is delivered:
//
//   - ttl=none: no TTL; the same helper as BenchmarkPublishConsumeAck, for comparison in this run.
//   - ttl=queue: the queue is declared with MessageTTL(time.Hour).
//   - ttl=message: no queue TTL; each message has Expiration "3600000" (parsed on every publish).
//   - chan: the channel baseline of BenchmarkPublishConsumeAck.
func BenchmarkPublishConsumeAckTTL(b *testing.B) {
	b.Run("ttl=none", func(b *testing.B) { benchPublishConsumeAck(b, 1, 256) })
	b.Run("ttl=queue", func(b *testing.B) {
		benchPublishConsumeAckTTL(b, []warren.QueueOption{warren.MessageTTL(time.Hour)}, "")
	})
	b.Run("ttl=message", func(b *testing.B) { benchPublishConsumeAckTTL(b, nil, "3600000") })
	b.Run("chan", func(b *testing.B) { benchPublishConsumeChan(b, 1) })
}

// benchPublishConsumeAckTTL is benchPublishConsumeAck with one consumer of prefetch 256, on a
// queue declared with opts, publishing messages with the given Expiration.
func benchPublishConsumeAckTTL(b *testing.B, opts []warren.QueueOption, expiration string) {
	benchPublishConsumeAckWith(b, 1, 256, opts, warren.Message{Body: benchBody, Expiration: expiration}, 0)
}

// expireN is how many messages one op of BenchmarkExpire1M expires.
const expireN = 1_000_000

// BenchmarkExpire1M: the cost of expiring 1M ready messages, reported as ns/expired (ns/op ÷ 1M).
// One op is the expiry of a full queue; filling it (1M publishes) is excluded with b.StopTimer,
// and so are declaring a fresh queue (and dead-letter queue) for it, deleting the previous op's,
// a runtime.GC before the fill, so that one op does not pay for the previous op's garbage, and
// the checks after the op (the queue is empty; every message was dead-lettered).
//
// A queue with MessageTTL(1ms) cannot be used for this: deadlines are fixed at enqueue, so they
// are spread over the fill (about 0.8 s for 1M) and the queue's timer expires the messages while
// they are being published; the queue never holds more than about 5k, and timing from the end of
// the fill to the empty queue measured ~2 ms for the last ~3k messages only. So the queue is
// declared with MessageTTL(time.Hour) and every message gets a per-message Expiration that
// makes its deadline a common instant T, a few times the fill duration ahead (deadlines are
// whole milliseconds, recomputed every 256 publishes, so they fall within about 1 ms of T, and
// a fill that ends too close to T is thrown away with its queue and retried). Because the Expiration steps down by 1 ms every
// millisecond of the fill, deadline order is not queue order: the ~1 ms segments of the fill
// interleave in the expiry index, so messages are removed from all over the queue (the general
// path of precise expiry, as with mixed per-message TTLs), not from its head in order as a queue
// TTL alone would give. The timer is started 1 ms before T; the op ends when Queue.Len() is 0 —
// and, for deadlettered, when the dead-letter queue holds all 1M, since dead letters are
// published after the source queue's lock is released — observed by polling every 1 ms
// (time.Sleep), so ns/op carries up to ~3 ms of slack out of the whole op.
//
//   - dropped: no dead-letter exchange; expired messages are dropped.
//   - deadlettered: dead-letter exchange (fanout) into one queue; every message is republished
//     with an x-death header.
//   - paced: the literal setup, MessageTTL(1ms), publishing and expiry concurrent: one op times
//     1M publishes and waits until the queue is empty, so ns/msg is the cost per message of
//     publish + expiry by the timer in a steady state (BenchmarkDeadLetterExpiredPerMessageTTL/
//     kept is the publish alone). No dead-letter exchange.
func BenchmarkExpire1M(b *testing.B) {
	b.Run("dropped", func(b *testing.B) { benchExpireBatch(b, false) })
	b.Run("deadlettered", func(b *testing.B) { benchExpireBatch(b, true) })
	b.Run("paced", benchExpirePaced)
}

func benchExpireBatch(b *testing.B, withDLX bool) {
	before := runtime.NumGoroutine()
	br := newBroker(b)
	ctx := context.Background()

	// fill publishes expireN messages to the queue name whose deadlines are all within about
	// 1 ms of the returned instant, margin from now. It reports false if it ran out of time.
	fill := func(name string, margin time.Duration) (time.Time, bool) {
		t := time.Now().Add(margin)
		var exp string
		for i := range expireN {
			if i%256 == 0 {
				left := time.Until(t)
				if left < 5*time.Millisecond {
					return t, false
				}
				exp = strconv.FormatInt(int64(left/time.Millisecond), 10)
			}
			if err := br.Publish(ctx, "", name, warren.Message{Body: benchBody, Expiration: exp}); err != nil {
				b.Fatal(err)
			}
		}
		return t, true
	}
	// checkDone checks a finished op: the queue is empty and, with a dead-letter exchange,
	// every message was dead-lettered.
	checkDone := func(q, dlq *warren.Queue) {
		if n := q.Len(); n != 0 {
			b.Fatalf("Len() = %d after the op", n)
		}
		if dlq != nil {
			if n := dlq.Len(); n != expireN {
				b.Fatalf("dead-letter queue holds %d messages, want %d", n, expireN)
			}
			checkDeadLetter(b, dlq, q.Name(), "expired")
		}
	}

	// Every fill gets a queue (and dead-letter topology) of its own, declared and deleted
	// outside the timed part: a fill that runs out of time (the machine is slower than the
	// margin assumed) is thrown away with its queue, and dead letters still in flight from it
	// cannot reach the next one.
	var (
		q, dlq  *warren.Queue
		fills   int
		retries int
		margin  = 3 * time.Second // the first fill's; then three times the last fill's duration
	)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for {
			if q != nil {
				deleteWithDLX(b, br, q.Name(), withDLX)
			}
			fills++
			q, dlq = declareWithDLX(b, br, "expire."+strconv.Itoa(fills), withDLX, warren.MessageTTL(time.Hour))
			runtime.GC() // not the previous op's garbage in this op
			start := time.Now()
			t, ok := fill(q.Name(), margin)
			took := time.Since(start)
			margin = max(3*took, 100*time.Millisecond)
			if ok {
				if n := q.Len(); n != expireN {
					b.Fatalf("Len() = %d after the fill, want %d: messages expired during it", n, expireN)
				}
				time.Sleep(time.Until(t) - time.Millisecond)
				break
			}
			if retries++; retries > 3 {
				b.Fatalf("%d fills ran out of time (margin now %v)", retries, margin)
			}
			b.Logf("fill %d ran out of time after %v; retrying with a margin of %v", fills, took, margin)
		}
		b.StartTimer()
		for q.Len() > 0 || (dlq != nil && dlq.Len() < expireN) {
			time.Sleep(time.Millisecond)
		}
		b.StopTimer()
		checkDone(q, dlq)
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/expireN, "ns/expired")
	br.Close()
	checkNoGoroutines(b, before)
}

func benchExpirePaced(b *testing.B) {
	before := runtime.NumGoroutine()
	br := newBroker(b)
	q, _ := declareWithDLX(b, br, "expire", false, warren.MessageTTL(time.Millisecond))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		for range expireN {
			if err := br.Publish(ctx, "", "expire", warren.Message{Body: benchBody}); err != nil {
				b.Fatal(err)
			}
		}
		for q.Len() > 0 {
			time.Sleep(time.Millisecond)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/expireN, "ns/msg")
	br.Close()
	checkNoGoroutines(b, before)
}

// BenchmarkDeadLetterReject: Queue.Get then a settlement, one message per op (background
// context, as BenchmarkGetAck/ctx=background), on a queue with a dead-letter exchange (fanout)
// into a second queue, pre-filled with getDepth messages.
//
//   - reject: Get + Reject: the message is dead-lettered with reason "rejected", that is
//     republished with an x-death header into the dead-letter queue, within Reject's call.
//   - ack: Get + Ack on the same topology; nothing is dead-lettered.
//   - chan: a non-blocking receive from a buffered channel and a send of the same pointer into
//     a second channel, a naive "dead-letter queue" (no header, no copy).
//
// As in BenchmarkGetAck, the queue is refilled with getDepth messages inside the timed loop
// whenever it runs empty. The dead-letter queue is purged there too, every getDepth ops, so it
// never holds more than getDepth. Both are timed apart: refill-ns/op is their share of ns/op,
// and getack-ns/op (the unit reportRefill gives it) is Get + the settlement alone — here Get +
// Reject for reject.
func BenchmarkDeadLetterReject(b *testing.B) {
	b.Run("reject", func(b *testing.B) { benchGetSettleDLX(b, true) })
	b.Run("ack", func(b *testing.B) { benchGetSettleDLX(b, false) })
	b.Run("chan", benchRejectChan)
}

func benchGetSettleDLX(b *testing.B, reject bool) {
	before := runtime.NumGoroutine()
	br := newBroker(b)
	q, dlq := declareWithDLX(b, br, "get", true)
	ctx := context.Background()
	sincePurge := 0 // ops since the dead-letter queue was last purged
	refill := func() {
		if _, err := dlq.Purge(); err != nil {
			b.Fatal(err)
		}
		sincePurge = 0
		for range getDepth {
			if err := br.Publish(ctx, "", "get", warren.Message{Body: benchBody}); err != nil {
				b.Fatal(err)
			}
		}
	}
	settle := (warren.Delivery).Ack
	if reject {
		settle = (warren.Delivery).Reject
	}

	// Check the topology once: a rejected message reaches the dead-letter queue.
	refill()
	d, err := q.Get(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Reject(); err != nil {
		b.Fatal(err)
	}
	checkDeadLetter(b, dlq, "get", "rejected")

	loopGetSettle(b, ctx, q, refill, func(d warren.Delivery) error {
		sincePurge++
		return settle(d)
	})
	// With reject, every message taken since the last purge was dead-lettered.
	want := 0
	if reject {
		want = sincePurge
	}
	if n := dlq.Len(); n != want {
		b.Fatalf("dead-letter queue holds %d messages, want %d", n, want)
	}
	if n := q.Unacked(); n != 0 {
		b.Fatalf("Unacked() = %d after the loop", n)
	}
	br.Close()
	checkNoGoroutines(b, before)
}

func benchRejectChan(b *testing.B) {
	ch := make(chan *warren.Message, getDepth)
	dlq := make(chan *warren.Message, getDepth)
	refill := func() {
		for len(dlq) > 0 {
			<-dlq
		}
		for range getDepth {
			ch <- &warren.Message{Body: benchBody}
		}
	}
	refill()
	var refillTime time.Duration
	b.ReportAllocs()
	for b.Loop() {
		var m *warren.Message
		select {
		case m = <-ch:
		default:
			start := time.Now()
			refill()
			refillTime += time.Since(start)
			m = <-ch
		}
		dlq <- m
	}
	reportRefill(b, refillTime)
}

// BenchmarkDeadLetterExpiredPerMessageTTL: one op is one Broker.Publish through the default
// exchange of a message into a queue with no consumer, with no queue TTL:
//
//   - deadlettered: Expiration "0" into a queue with a dead-letter exchange (fanout) into a
//     second queue: the message expires within the publish (R3.5: no consumer took it) and is
//     republished with an x-death header into the dead-letter queue, all within the call.
//   - dropped: Expiration "0", no dead-letter exchange: the message expires and is dropped.
//   - kept: no Expiration: the message stays in the queue (BenchmarkPublish/warren).
//
// The queue that fills up (the dead-letter queue, or the queue itself for kept and dropped) is
// purged every publishEvery publishes inside the timed loop, included, amortised. For
// deadlettered the source queue is not purged: its Len() stays 0, so a user would not purge it
// either; it must not keep anything of its expired messages.
func BenchmarkDeadLetterExpiredPerMessageTTL(b *testing.B) {
	b.Run("deadlettered", func(b *testing.B) { benchPublishExpired(b, true, "0") })
	b.Run("dropped", func(b *testing.B) { benchPublishExpired(b, false, "0") })
	b.Run("kept", func(b *testing.B) { benchPublishExpired(b, false, "") })
}

func benchPublishExpired(b *testing.B, withDLX bool, expiration string) {
	before := runtime.NumGoroutine()
	br := newBroker(b)
	q, dlq := declareWithDLX(b, br, "src", withDLX)
	ctx := context.Background()
	full := q // the queue that fills up
	if dlq != nil {
		full = dlq
	}
	publish := func() {
		if err := br.Publish(ctx, "", "src", warren.Message{Body: benchBody, Expiration: expiration}); err != nil {
			b.Fatal(err)
		}
	}

	// Check once: the message went where it should.
	publish()
	switch {
	case dlq != nil:
		checkDeadLetter(b, dlq, "src", "expired")
	case expiration == "0" && q.Len() != 0:
		b.Fatalf("Len() = %d after publishing an expired message", q.Len())
	case expiration == "" && q.Len() != 1:
		b.Fatalf("Len() = %d after publishing one message", q.Len())
	}
	if _, err := full.Purge(); err != nil {
		b.Fatal(err)
	}

	b.ReportAllocs()
	i := 0
	for b.Loop() {
		publish()
		if i++; i%publishEvery == 0 {
			if _, err := full.Purge(); err != nil {
				b.Fatal(err)
			}
		}
	}
	want := i % publishEvery
	if expiration == "0" && dlq == nil {
		want = 0
	}
	if n := full.Len(); n != want {
		b.Fatalf("%s holds %d messages, want %d", full.Name(), n, want)
	}
	if full != q && q.Len() != 0 {
		b.Fatalf("Len() = %d: expired messages left in the queue", q.Len())
	}
	br.Close()
	checkNoGoroutines(b, before)
}

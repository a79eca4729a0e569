package warren_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Regression tests for the review of issue 5's events, alerts and WaitIdle: one per finding.

// TestEventHandOffCancelledThenDeleted: an AutoAck consumer handed a message is cancelled, and
// its queue deleted before its goroutine puts the hand-off back. The queue's end no longer sees
// the consumer, so the goroutine drops the message itself, evented.
func TestEventHandOffCancelledThenDeleted(t *testing.T) {
	handOffRounds(t, func(b *warren.Broker, c *warren.Consumer) {
		deleted := make(chan error)
		go func() { _, err := b.DeleteQueue("q"); deleted <- err }() // runs while Cancel waits for the feeder
		require.NoError(t, c.Cancel())
		require.NoError(t, <-deleted)
	}, func(st warren.QueueStats) bool { return st.Enqueued == st.Acked+st.Dropped })
}

// TestEventUnroutableWhenQueueWentMidPublish: a publish whose only queue is deleted between
// routing and enqueueing is unroutable in every way: the error with Mandatory, the event and
// the counter.
func TestEventUnroutableWhenQueueWentMidPublish(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	_, err := b.DeclareExchange("x", warren.ExchangeDirect)
	require.NoError(t, err)
	declare(t, b, "q")
	require.NoError(t, b.Bind("q", "x", "k", nil))
	stop := b.Listen(func(e warren.Event) {
		if e.Kind == warren.EventPublished {
			go func() { _, _ = b.DeleteQueue("q") }() // not from the listener itself: DeleteQueue waits
			for {
				if _, err := b.Queue("q"); err != nil {
					return
				}
				time.Sleep(time.Millisecond)
			}
		}
	})
	err = b.Publish(t.Context(), "x", "k", msg("m"), warren.Mandatory())
	stop()
	require.ErrorIs(t, err, warren.ErrUnroutable)
	assert.Len(t, r.ofKind(warren.EventUnroutable), 1)
	assert.Equal(t, "dropped(queue-deleted)", r.trace("q", "m"))
	assert.Equal(t, uint64(1), b.Stats().Unroutable)
}

// TestEventDeadLetteredIsTheCopyDelivered: the Message of EventDeadLettered is the copy that
// entered the target queue and is delivered from it, not a third one.
func TestEventDeadLetteredIsTheCopyDelivered(t *testing.T) {
	b := newBroker(t)
	r := recordEvents(t, b)
	q := declare(t, b, "q", warren.DeadLetter("", "dlq"))
	dlq := declare(t, b, "dlq")
	publish(t, b, "q", "m")
	require.NoError(t, getOne(t, q).Reject())
	dead := r.one(t, "q", "m", warren.EventDeadLettered)
	entered := r.one(t, "dlq", "m", warren.EventEnqueued)
	require.Same(t, entered.Message, dead.Message)
	d, err := dlq.Get(t.Context(), warren.AutoAck())
	require.NoError(t, err)
	require.Same(t, d.Message, dead.Message)
}

// TestCycleBytesAlerts: under Cycle the crossing is seen before the ring drops back within the
// limit, so the Bytes threshold alerts (it used to be checked after the drop, and never fired).
func TestCycleBytesAlerts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		r := recordEvents(t, b)
		q := declare(t, b, "q", warren.WithAlerts(warren.Alerts{Bytes: 10, Policy: warren.Cycle}))
		for range 10 {
			require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("abcd")}))
		}
		st := q.Stats()
		require.LessOrEqual(t, st.Bytes, int64(10))
		require.Equal(t, uint64(8), st.Dropped)
		alerts := r.alerts(warren.AlertBytes)
		require.Len(t, alerts, 1, "one crossing within the repeat gap")
		require.Equal(t, int64(12), alerts[0].Value, "the bytes the ring is about to drop back from")
	})
}

// TestWaitIdleWaitsForDeleteByAge: a queue whose Delete policy's age threshold will delete it
// keeps WaitIdle waiting until it has (its messages are dropped then).
func TestWaitIdleWaitsForDeleteByAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		declare(t, b, "q", warren.WithAlerts(warren.Alerts{Age: time.Second, Policy: warren.Delete}))
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("m")}))
		start := time.Now()
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Greater(t, time.Since(start), time.Second)
		_, err := b.Queue("q")
		require.ErrorIs(t, err, warren.ErrNotFound)
	})
}

// TestWaitIdleWaitsForQueueExpiry: an unused queue with ready messages and an expiry will be
// deleted; WaitIdle waits for it. An empty one does not hold it up.
func TestWaitIdleWaitsForQueueExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		declare(t, b, "empty", warren.Expires(time.Hour))
		declare(t, b, "q", warren.Expires(time.Minute))
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("m")}))
		start := time.Now()
		require.NoError(t, b.WaitIdle(t.Context()))
		require.Equal(t, time.Minute, time.Since(start))
		_, err := b.Queue("empty")
		require.NoError(t, err, "not waited for")
	})
}

// TestStatsOldestAgeOfReturnedMessage: with an age threshold every arrival is stamped and a
// delivery's stamp is kept while it is out (it used to be pruned against the ready messages
// alone), so a message nacked back after 15s has that age.
func TestStatsOldestAgeOfReturnedMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.WithAlerts(warren.Alerts{Age: time.Hour}))
		c, err := q.Consume(t.Context(), warren.Prefetch(1))
		require.NoError(t, err)
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("a")}))
		d := <-c.Deliveries()
		for i := range 200 { // enough arrivals to prune the stamps several times
			time.Sleep(50 * time.Millisecond)
			require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte{byte(i)}}))
		}
		time.Sleep(5 * time.Second)
		require.NoError(t, c.Cancel())
		require.NoError(t, d.Nack())
		require.Equal(t, 15*time.Second, q.Stats().OldestAge)
	})
}

// TestStatsOldestAgeOfMessageDeliveredOnArrival: a message delivered as it arrived is stamped
// by nothing; when it comes back its age counts from its return, not 0 forever.
func TestStatsOldestAgeOfMessageDeliveredOnArrival(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		c, err := q.Consume(t.Context(), warren.Prefetch(1))
		require.NoError(t, err)
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("a")}))
		d := <-c.Deliveries()
		time.Sleep(time.Hour)
		require.NoError(t, c.Cancel())
		require.NoError(t, d.Nack())
		time.Sleep(time.Minute)
		require.Equal(t, time.Minute, q.Stats().OldestAge)
	})
}

// TestWaitIdleNotHeldUpByReaders: a goroutine polling Len (a metrics scraper, a polling
// assertion) changes nothing, so it must not keep WaitIdle from seeing the broker idle.
func TestWaitIdleNotHeldUpByReaders(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")
	for _, n := range []string{"a", "b", "c", "d"} {
		declare(t, b, n)
	}
	require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("m")}))
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			q.Len()
			q.Stats()
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := b.WaitIdle(ctx)
	stop.Store(true)
	<-done
	require.NoError(t, err)
}

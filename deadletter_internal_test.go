package warren

import (
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 500_000_000, time.UTC)

func TestRecordDeathFirst(t *testing.T) {
	orig := Table{"app": "x"}
	h := recordDeath(orig, death{
		queue: "main", reason: ReasonExpired, exchange: "ex", routingKeys: []string{"rk", "cc1"},
		expiration: "1000", time: t0,
	})
	require.Equal(t, Table{"app": "x"}, orig, "the shared headers are not modified")
	require.Equal(t, []any{Table{
		"queue": "main", "reason": "expired", "count": int64(1), "time": t0.Truncate(time.Second),
		"exchange": "ex", "routing-keys": []any{"rk", "cc1"}, "original-expiration": "1000",
	}}, h["x-death"])
	require.Equal(t, "x", h["app"])
	for k, want := range map[string]string{
		"x-first-death-reason": "expired", "x-first-death-queue": "main", "x-first-death-exchange": "ex",
		"x-last-death-reason": "expired", "x-last-death-queue": "main", "x-last-death-exchange": "ex",
	} {
		require.Equal(t, want, h[k], k)
	}
}

func TestRecordDeathNoOriginalExpiration(t *testing.T) {
	h := recordDeath(nil, death{queue: "q", reason: ReasonMaxLen, exchange: "", routingKeys: []string{"q"}, time: t0})
	entry := h["x-death"].([]any)[0].(Table)
	require.NotContains(t, entry, "original-expiration", "absent when the TTL came only from the queue")
}

// TestRecordDeathRepeats: a repeated {queue, reason} increments its count and moves to the front,
// keeping its first time, exchange and routing keys; a new pair is prepended; first-death
// headers stay, last-death headers follow.
func TestRecordDeathRepeats(t *testing.T) {
	h := recordDeath(nil, death{queue: "main", reason: ReasonExpired, exchange: "e1", routingKeys: []string{"k1"}, time: t0})
	h = recordDeath(h, death{queue: "retry", reason: ReasonExpired, exchange: "dlx", routingKeys: []string{"k2"}, time: t0.Add(time.Minute)})
	h = recordDeath(h, death{queue: "main", reason: ReasonExpired, exchange: "e3", routingKeys: []string{"k3"}, time: t0.Add(time.Hour)})
	deaths := h["x-death"].([]any)
	require.Len(t, deaths, 2)
	first := deaths[0].(Table)
	require.Equal(t, "main", first["queue"])
	require.Equal(t, int64(2), first["count"])
	require.Equal(t, t0.Truncate(time.Second), first["time"], "first time kept")
	require.Equal(t, "e1", first["exchange"], "first exchange kept")
	require.Equal(t, []any{"k1"}, first["routing-keys"], "first routing keys kept")
	require.Equal(t, "retry", deaths[1].(Table)["queue"])
	require.Equal(t, int64(1), deaths[1].(Table)["count"])
	require.Equal(t, "e1", h["x-first-death-exchange"])
	require.Equal(t, "main", h["x-first-death-queue"])
	require.Equal(t, "e3", h["x-last-death-exchange"])

	h = recordDeath(h, death{queue: "main", reason: ReasonRejected, exchange: "e4", time: t0})
	deaths = h["x-death"].([]any)
	require.Len(t, deaths, 3, "same queue, other reason: a new entry")
	require.Equal(t, "rejected", deaths[0].(Table)["reason"])
	require.Equal(t, "rejected", h["x-last-death-reason"])
	require.Equal(t, "expired", h["x-first-death-reason"])
}

func TestRecordDeathReplacesMalformedHistory(t *testing.T) {
	h := recordDeath(Table{"x-death": "nonsense"}, death{queue: "q", reason: ReasonRejected, time: t0})
	require.Len(t, h["x-death"], 1)
}

// TestDeathCycle follows R4.7's cases.
func TestDeathCycle(t *testing.T) {
	expireFrom := func(h Table, q string) Table {
		return recordDeath(h, death{queue: q, reason: ReasonExpired, time: t0})
	}
	rejectFrom := func(h Table, q string) Table {
		return recordDeath(h, death{queue: q, reason: ReasonRejected, time: t0})
	}
	self := expireFrom(nil, "q")
	require.True(t, isDeathCycle(self, "q", ReasonExpired), "a queue expiring into itself")
	require.False(t, isDeathCycle(self, "other", ReasonExpired), "first visit elsewhere")

	pingPong := expireFrom(expireFrom(nil, "q1"), "q2")
	require.True(t, isDeathCycle(pingPong, "q1", ReasonExpired), "q1 → q2 → q1, all expiries")

	withReject := expireFrom(rejectFrom(expireFrom(nil, "main"), "retry"), "main")
	require.False(t, isDeathCycle(rejectFrom(nil, "q"), "q", ReasonRejected), "a rejection is never a cycle")
	// main expired → retry; a consumer of retry rejected → main; main expired again → retry?
	require.True(t, isDeathCycle(withReject, "main", ReasonExpired), "the newest death from main is this one: automatic")
	retryLoop := expireFrom(rejectFrom(nil, "main"), "retry")
	require.False(t, isDeathCycle(retryLoop, "main", ReasonExpired), "a reject on the way back to main breaks the cycle")
}

// TestDeadLettersKeepOrderAcrossGoroutines: one queue's dead letters reach the dead-letter queue
// in the order they were collected, even when two goroutines collect them and the first is still
// publishing (R4.9). The test stalls the first flush by holding the dead-letter queue's lock.
func TestDeadLettersKeepOrderAcrossGoroutines(t *testing.T) {
	b := New()
	defer b.Close()
	if _, err := b.DeclareExchange("dlx", ExchangeFanout); err != nil {
		t.Fatal(err)
	}
	dead, _ := b.DeclareQueue("dead")
	if err := b.Bind("dead", "dlx", "", nil); err != nil {
		t.Fatal(err)
	}
	q, _ := b.DeclareQueue("q", DeadLetter("dlx", ""))
	collect := func(bodies ...string) {
		q.mu.Lock()
		for _, s := range bodies {
			q.core.deadLetter(entry{env: testEnvelope(Message{Body: []byte(s)}, b.defaultX)}, ReasonRejected)
		}
		q.commit()
	}

	dead.mu.Lock() // the first flush will stall publishing A1
	first := make(chan struct{})
	go func() {
		defer close(first)
		collect("A1", "A2")
	}()
	for { // wait until that flush is in progress
		q.mu.Lock()
		flushing := q.flushing
		q.mu.Unlock()
		if flushing {
			break
		}
		runtime.Gosched()
	}
	collect("B1") // must not wait for, nor overtake, the flush in progress
	dead.mu.Unlock()
	<-first

	var got []string
	for {
		d, err := dead.Get(t.Context(), AutoAck())
		if err != nil {
			break
		}
		got = append(got, string(d.Message.Body))
	}
	if want := []string{"A1", "A2", "B1"}; !slices.Equal(got, want) {
		t.Fatalf("dead-letter queue = %v, want %v", got, want)
	}
}

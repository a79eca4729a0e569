package amqp

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Differential tests: one scripted client session, against the server and against a real
// RabbitMQ ($WARREN_RABBITMQ_URL; CI starts one), records what the client observes; the two
// transcripts must be the same. The sessions follow the rules of SEMANTICS.md where a client
// can see them.

// session is a scripted client session. It names its queues and exchanges with name (unique to
// the run, since a RabbitMQ outlives its tests) and says what it observes with see.
type session func(t *testing.T, conn *amqp091.Connection, name func(string) string, see func(format string, args ...any))

var sessions = []struct {
	name string
	run  session
}{
	{"RequeuePosition", requeuePosition},
	{"DeadLetterHistory", deadLetterHistory},
	{"TTLWhileUnacked", ttlWhileUnacked},
	{"Priorities", priorities},
	{"ConsumerPriorities", consumerPriorities},
	{"SingleActiveConsumer", singleActiveConsumer},
	{"ChannelPrefetch", channelPrefetch},
}

func TestDifferential(t *testing.T) {
	rabbit := os.Getenv(rabbitEnv)
	for _, s := range sessions {
		t.Run(s.name, func(t *testing.T) {
			b := warren.New()
			defer b.Close()
			onWarren := transcript(t, NewTestServer(t, b), s.run)
			if rabbit == "" {
				t.Skipf("%s is not set: no RabbitMQ to compare with (transcript on warren: %q)", rabbitEnv, onWarren)
			}
			onRabbit := transcript(t, rabbit, s.run)
			require.Equal(t, onRabbit, onWarren, "what the client sees on RabbitMQ, and on warren")
			require.NotEmpty(t, onWarren)
			t.Logf("both saw:\n%s", strings.Join(onWarren, "\n"))
		})
	}
}

// transcript runs a session against the broker at url and returns what it observed.
func transcript(t *testing.T, url string, run session) []string {
	t.Helper()
	conn, err := amqp091.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	prefix := fmt.Sprintf("diff.%d.", time.Now().UnixNano())
	var names []string
	name := func(s string) string {
		names = append(names, prefix+s)
		return prefix + s
	}
	var seen []string
	run(t, conn, name, func(format string, args ...any) { seen = append(seen, fmt.Sprintf(format, args...)) })
	ch, err := conn.Channel()
	require.NoError(t, err)
	for _, n := range names {
		ch.QueueDelete(n, false, false, false)
		ch.ExchangeDelete(n, false, false)
	}
	return seen
}

// channel opens a channel on conn.
func openChannel(t *testing.T, conn *amqp091.Connection) *amqp091.Channel {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	return ch
}

// publishAll publishes bodies to queue q through the default exchange, confirmed.
func publishAll(t *testing.T, ch *amqp091.Channel, q string, msgs ...amqp091.Publishing) {
	t.Helper()
	require.NoError(t, ch.Confirm(false))
	for _, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false, m)
		require.NoError(t, err)
		ok, err := dc.WaitContext(context.Background())
		require.NoError(t, err)
		require.True(t, ok)
	}
}

func bodies(s ...string) []amqp091.Publishing {
	out := make([]amqp091.Publishing, len(s))
	for i, b := range s {
		out[i] = amqp091.Publishing{Body: []byte(b)}
	}
	return out
}

// get gets one message and says what it was: body, redelivered, message count.
func get(t *testing.T, ch *amqp091.Channel, q string, see func(string, ...any)) *amqp091.Delivery {
	t.Helper()
	d, ok, err := ch.Get(q, false)
	require.NoError(t, err)
	if !ok {
		see("get: empty")
		return nil
	}
	see("get: %s redelivered=%t count=%d", d.Body, d.Redelivered, d.MessageCount)
	return &d
}

// A nacked message goes back to its original position; a closed channel's unacked messages
// too; the get counts say what is ready.
func requeuePosition(t *testing.T, conn *amqp091.Connection, name func(string) string, see func(string, ...any)) {
	ch := openChannel(t, conn)
	q := name("q")
	_, err := ch.QueueDeclare(q, false, false, false, false, nil)
	require.NoError(t, err)
	publishAll(t, ch, q, bodies("1", "2", "3", "4", "5")...)
	held := openChannel(t, conn)
	get(t, held, q, see)
	two := get(t, held, q, see)
	get(t, held, q, see)
	require.NoError(t, two.Nack(false, true))
	time.Sleep(50 * time.Millisecond) // basic.nack has no reply
	get(t, held, q, see)              // 2 again, at its place
	require.NoError(t, held.Close())
	for range 6 {
		get(t, ch, q, see)
	}
}

// A message rejected twice through a dead-letter loop carries one x-death entry per queue and
// reason, counted.
func deadLetterHistory(t *testing.T, conn *amqp091.Connection, name func(string) string, see func(string, ...any)) {
	ch := openChannel(t, conn)
	work, retry := name("work"), name("retry")
	_, err := ch.QueueDeclare(work, false, false, false, false, amqp091.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": retry})
	require.NoError(t, err)
	_, err = ch.QueueDeclare(retry, false, false, false, false, amqp091.Table{"x-message-ttl": int32(20),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": work})
	require.NoError(t, err)
	publishAll(t, ch, work, bodies("m")...)
	for round := range 2 {
		var d *amqp091.Delivery
		require.Eventually(t, func() bool {
			g, ok, err := ch.Get(work, false)
			require.NoError(t, err)
			if ok {
				d = &g
			}
			return ok
		}, 5*time.Second, 5*time.Millisecond)
		see("round %d: %s", round, deaths(d.Headers))
		require.NoError(t, d.Reject(false))
	}
}

// deaths describes an x-death header: per entry its queue, reason, count, exchange and routing
// keys.
func deaths(h amqp091.Table) string {
	list, _ := h["x-death"].([]any)
	var out []string
	for _, e := range list {
		t, _ := e.(amqp091.Table)
		out = append(out, fmt.Sprintf("{queue=%v reason=%v count=%v exchange=%q keys=%v}",
			strings.TrimPrefix(fmt.Sprint(t["queue"]), prefixOf(t["queue"])), t["reason"], t["count"], t["exchange"],
			trimKeys(t["routing-keys"])))
	}
	return fmt.Sprintf("x-death=%v first-death=%v/%v", out, h["x-first-death-reason"] != nil, h["x-first-death-reason"])
}

// prefixOf returns the run's prefix of a name made by transcript's name.
func prefixOf(v any) string {
	s := fmt.Sprint(v)
	if i := strings.LastIndex(s, "."); i >= 0 {
		return s[:i+1]
	}
	return ""
}

func trimKeys(v any) []string {
	keys, _ := v.([]any)
	var out []string
	for _, k := range keys {
		out = append(out, strings.TrimPrefix(fmt.Sprint(k), prefixOf(k)))
	}
	return out
}

// A message whose TTL passes while it is unacked is not expired then; nacked back, it is
// expired (dead-lettered) instead of delivered again.
func ttlWhileUnacked(t *testing.T, conn *amqp091.Connection, name func(string) string, see func(string, ...any)) {
	ch := openChannel(t, conn)
	q, dead := name("q"), name("dead")
	_, err := ch.QueueDeclare(dead, false, false, false, false, nil)
	require.NoError(t, err)
	_, err = ch.QueueDeclare(q, false, false, false, false, amqp091.Table{"x-message-ttl": int32(100),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
	require.NoError(t, err)
	publishAll(t, ch, q, bodies("m")...)
	d := get(t, ch, q, see)
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, d.Nack(false, true))
	time.Sleep(100 * time.Millisecond)
	get(t, ch, q, see)
	if dl := get(t, ch, dead, see); dl != nil {
		see("dead: %s", deaths(dl.Headers))
	}
}

// A priority queue delivers higher priorities first, in publish order within a priority.
func priorities(t *testing.T, conn *amqp091.Connection, name func(string) string, see func(string, ...any)) {
	ch := openChannel(t, conn)
	q := name("q")
	_, err := ch.QueueDeclare(q, false, false, false, false, amqp091.Table{"x-max-priority": int32(10)})
	require.NoError(t, err)
	var msgs []amqp091.Publishing
	for i, p := range []uint8{1, 5, 3, 5, 0, 10, 200} {
		msgs = append(msgs, amqp091.Publishing{Body: fmt.Appendf(nil, "%d:p%d", i, p), Priority: p})
	}
	publishAll(t, ch, q, msgs...)
	for range len(msgs) + 1 {
		get(t, ch, q, see)
	}
}

// The consumer of the highest priority gets the messages while it has credit; then the next.
func consumerPriorities(t *testing.T, conn *amqp091.Connection, name func(string) string, see func(string, ...any)) {
	ch := openChannel(t, conn)
	q := name("q")
	_, err := ch.QueueDeclare(q, false, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.Qos(1, 0, false))
	low, err := ch.Consume(q, "low", false, false, false, false, amqp091.Table{"x-priority": int32(1)})
	require.NoError(t, err)
	high, err := ch.Consume(q, "high", false, false, false, false, amqp091.Table{"x-priority": int32(10)})
	require.NoError(t, err)
	publishAll(t, openChannel(t, conn), q, bodies("1", "2", "3")...)
	var got []string
	for range 2 {
		select {
		case d := <-high:
			got = append(got, "high:"+string(d.Body))
		case d := <-low:
			got = append(got, "low:"+string(d.Body))
		case <-time.After(5 * time.Second):
			t.Fatal("no delivery")
		}
	}
	slices.Sort(got)
	see("first two: %v", got)
	select {
	case d := <-high:
		see("third early: high:%s", d.Body)
	case d := <-low:
		see("third early: low:%s", d.Body)
	case <-time.After(200 * time.Millisecond):
		see("third waits for credit")
	}
}

// A single-active-consumer queue delivers to its first consumer only; when it is cancelled,
// the next takes over, with what the first left unacked.
func singleActiveConsumer(t *testing.T, conn *amqp091.Connection, name func(string) string, see func(string, ...any)) {
	ch := openChannel(t, conn)
	q := name("q")
	_, err := ch.QueueDeclare(q, false, false, false, false, amqp091.Table{"x-single-active-consumer": true})
	require.NoError(t, err)
	first := openChannel(t, conn)
	a, err := first.Consume(q, "a", false, false, false, false, nil)
	require.NoError(t, err)
	second := openChannel(t, conn)
	b, err := second.Consume(q, "b", false, false, false, false, nil)
	require.NoError(t, err)
	publishAll(t, ch, q, bodies("1", "2", "3")...)
	for range 3 {
		select {
		case d := <-a:
			see("a: %s", d.Body)
			if string(d.Body) != "3" {
				require.NoError(t, d.Ack(false))
			}
		case d := <-b:
			see("b: %s", d.Body)
		case <-time.After(5 * time.Second):
			t.Fatal("no delivery")
		}
	}
	require.NoError(t, first.Close()) // 3 unacked goes back; b is the active consumer now
	select {
	case d := <-b:
		see("b after a left: %s redelivered=%t", d.Body, d.Redelivered)
	case <-time.After(5 * time.Second):
		see("b got nothing")
	}
}

// basic.qos with global=true limits a channel's consumers together: a prefetch shared by
// consumers of two queues.
func channelPrefetch(t *testing.T, conn *amqp091.Connection, name func(string) string, see func(string, ...any)) {
	ch := openChannel(t, conn)
	q1, q2 := name("q1"), name("q2")
	for _, q := range []string{q1, q2} {
		_, err := ch.QueueDeclare(q, false, false, false, false, nil)
		require.NoError(t, err)
	}
	pub := openChannel(t, conn)
	publishAll(t, pub, q1, bodies("a1", "a2", "a3", "a4", "a5")...)
	publishAll(t, pub, q2, bodies("b1", "b2", "b3", "b4", "b5")...)
	all := make(chan amqp091.Delivery, 100)
	require.NoError(t, ch.Qos(3, 0, true))
	for _, q := range []string{q1, q2} {
		ds, err := ch.Consume(q, "", false, false, false, false, nil)
		require.NoError(t, err)
		go func() {
			for d := range ds {
				all <- d
			}
		}()
	}
	// quiet returns how many deliveries came until none came for a while, and the last.
	quiet := func() (n int, last amqp091.Delivery) {
		for {
			select {
			case last = <-all:
				n++
			case <-time.After(300 * time.Millisecond):
				return n, last
			}
		}
	}
	n, last := quiet()
	see("two consumers under the channel's 3: %d deliveries", n)
	require.NoError(t, last.Ack(false))
	n, last = quiet()
	see("one acked: %d more", n)
	require.NoError(t, last.Nack(false, true))
	n, _ = quiet()
	see("one nacked back: %d more", n)
	require.NoError(t, ch.Qos(5, 0, true))
	n, _ = quiet()
	see("the channel's limit raised to 5: %d more", n)
	require.NoError(t, ch.Ack(0, true))
	n, _ = quiet()
	see("all acked: %d more", n)
}

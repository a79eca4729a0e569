package amqp

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/contrib/amqp/internal/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dial connects amqp091-go to a test server of b.
func dial(t *testing.T, b *warren.Broker, opts ...Option) *amqp091.Connection {
	t.Helper()
	conn, err := amqp091.Dial(NewTestServer(t, b, opts...))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// An unchanged amqp091-go client declares, publishes with confirms, consumes and acks.
func TestPublishConsume(t *testing.T) {
	b := warren.New()
	defer b.Close()
	conn := dial(t, b)
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclare("jobs", true, false, false, false, amqp091.Table{"x-max-length": int64(100)})
	require.NoError(t, err)
	require.Equal(t, "jobs", q.Name)
	require.NoError(t, ch.Confirm(false))
	ctx := context.Background()
	for _, body := range []string{"a", "b", "c"} {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", "jobs", false, false, amqp091.Publishing{Body: []byte(body),
			ContentType: "text/plain", Headers: amqp091.Table{"n": int32(1)}, DeliveryMode: amqp091.Persistent})
		require.NoError(t, err)
		ok, err := dc.WaitContext(ctx)
		require.NoError(t, err)
		require.True(t, ok)
	}
	wq, err := b.Queue("jobs")
	require.NoError(t, err)
	require.Equal(t, 3, wq.Len(), "in the broker")

	require.NoError(t, ch.Qos(2, 0, false))
	deliveries, err := ch.Consume("jobs", "c1", false, false, false, false, nil)
	require.NoError(t, err)
	var got []string
	for range 3 {
		select {
		case d := <-deliveries:
			got = append(got, string(d.Body))
			require.Equal(t, "text/plain", d.ContentType)
			require.Equal(t, amqp091.Table{"n": int32(1)}, d.Headers)
			require.Equal(t, uint8(amqp091.Persistent), d.DeliveryMode)
			require.Equal(t, "c1", d.ConsumerTag)
			require.NoError(t, d.Ack(false))
		case <-time.After(5 * time.Second):
			t.Fatal("no delivery")
		}
	}
	require.Equal(t, []string{"a", "b", "c"}, got)
	require.Eventually(t, func() bool { return wq.Len() == 0 && wq.Unacked() == 0 }, 5*time.Second, time.Millisecond)
	require.NoError(t, ch.Close())
}

// expectClose waits for the close notification on c (a channel's or the connection's) and
// returns its error.
func expectClose(t *testing.T, c chan *amqp091.Error) *amqp091.Error {
	t.Helper()
	select {
	case e := <-c:
		require.NotNil(t, e)
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("not closed")
		return nil
	}
}

// Errors close the channel or the connection with RabbitMQ's codes and the method's ids.
func TestErrors(t *testing.T) {
	b := warren.New()
	defer b.Close()
	conn := dial(t, b)
	ctx := context.Background()

	channelError := func(code int, do func(ch *amqp091.Channel) error) {
		t.Helper()
		ch, err := conn.Channel()
		require.NoError(t, err)
		closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
		err = do(ch)
		var e *amqp091.Error
		if err != nil {
			require.ErrorAs(t, err, &e)
		} else {
			e = expectClose(t, closed)
		}
		require.Equal(t, code, e.Code, e.Reason)
		require.False(t, conn.IsClosed(), "a channel error leaves the connection open")
	}
	channelError(amqp091.NotFound, func(ch *amqp091.Channel) error {
		_, err := ch.QueueDeclarePassive("missing", false, false, false, false, nil)
		return err
	})
	channelError(amqp091.NotFound, func(ch *amqp091.Channel) error {
		return ch.PublishWithContext(ctx, "missing", "k", false, false, amqp091.Publishing{Body: []byte("x")})
	})
	channelError(amqp091.PreconditionFailed, func(ch *amqp091.Channel) error {
		if _, err := ch.QueueDeclare("q", false, false, false, false, amqp091.Table{"x-max-length": int64(1)}); err != nil {
			return err
		}
		_, err := ch.QueueDeclare("q", false, false, false, false, amqp091.Table{"x-max-length": int64(2)})
		return err
	})
	channelError(amqp091.PreconditionFailed, func(ch *amqp091.Channel) error {
		return ch.Ack(42, false) // never delivered
	})
	channelError(amqp091.AccessRefused, func(ch *amqp091.Channel) error {
		_, err := ch.QueueDeclare("amq.mine", false, false, false, false, nil)
		return err
	})

	// An exclusive queue is its connection's: another's use is RESOURCE_LOCKED.
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare("private", false, false, true, false, nil)
	require.NoError(t, err)
	other := dial(t, b)
	och, err := other.Channel()
	require.NoError(t, err)
	_, err = och.Consume("private", "", false, false, false, false, nil)
	var e *amqp091.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, amqp091.ResourceLocked, e.Code)

	// Transactions are not implemented: NOT_IMPLEMENTED closes the connection.
	connClosed := conn.NotifyClose(make(chan *amqp091.Error, 1))
	err = ch.Tx()
	require.Error(t, err)
	require.Equal(t, amqp091.NotImplemented, expectClose(t, connClosed).Code)
}

// Credentials and virtual hosts are checked at the handshake.
func TestHandshakeRefusals(t *testing.T) {
	b := warren.New()
	defer b.Close()
	url := NewTestServer(t, b)
	_, err := amqp091.Dial(strings.Replace(url, "guest:guest", "guest:wrong", 1))
	var e *amqp091.Error
	require.ErrorAs(t, err, &e, "authentication_failure_close: connection.close, not a dropped socket")
	require.Equal(t, amqp091.AccessRefused, e.Code)
	_, err = amqp091.Dial(url + "elsewhere")
	require.ErrorAs(t, err, &e)
	require.Equal(t, amqp091.NotAllowed, e.Code)

	users := NewTestServer(t, b, Users(map[string]string{"bob": "b", "alice": "a"}))
	require.Contains(t, users, "//alice:a@", "the test server's URL has a user it knows")
	conn, err := amqp091.Dial(users)
	require.NoError(t, err)
	conn.Close()
	_, err = amqp091.Dial(strings.Replace(users, "alice:a", "guest:guest", 1))
	require.ErrorAs(t, err, &e, "guest is not one of them")
	require.Equal(t, amqp091.AccessRefused, e.Code)

	conn, err = amqp091.DialConfig(url, amqp091.Config{SASL: []amqp091.Authentication{&amqp091.AMQPlainAuth{Username: "guest", Password: "guest"}}})
	require.NoError(t, err, "AMQPLAIN")
	require.Equal(t, "warren", conn.Properties["product"])
	conn.Close()
}

// Closing a channel returns what it held, redelivered, before close-ok; a mandatory publish
// that reaches no queue comes back with basic.return before its confirm; get counts.
func TestChannelSemantics(t *testing.T) {
	b := warren.New()
	defer b.Close()
	conn := dial(t, b)
	ctx := context.Background()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare("q", false, false, false, false, nil)
	require.NoError(t, err)
	for _, body := range []string{"1", "2", "3"} {
		require.NoError(t, ch.PublishWithContext(ctx, "", "q", false, false, amqp091.Publishing{Body: []byte(body)}))
	}
	held, err := conn.Channel()
	require.NoError(t, err)
	d, ok, err := held.Get("q", false)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "1", string(d.Body))
	require.Equal(t, uint32(2), d.MessageCount, "what is left")
	require.NoError(t, held.Close())
	d, ok, err = ch.Get("q", true)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "1", string(d.Body), "back at its place, once close-ok came")
	require.True(t, d.Redelivered)

	require.NoError(t, ch.Confirm(false))
	returns := ch.NotifyReturn(make(chan amqp091.Return, 1))
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, 1))
	require.NoError(t, ch.PublishWithContext(ctx, "", "nowhere", true, false, amqp091.Publishing{Body: []byte("lost")}))
	select {
	case r := <-returns:
		require.Equal(t, uint16(amqp091.NoRoute), r.ReplyCode)
		require.Equal(t, "lost", string(r.Body))
	case <-time.After(5 * time.Second):
		t.Fatal("no basic.return")
	}
	select {
	case c := <-confirms:
		require.True(t, c.Ack)
	case <-time.After(5 * time.Second):
		t.Fatal("no confirm")
	}

	// A deleted queue cancels its consumers (consumer_cancel_notify).
	cancels := ch.NotifyCancel(make(chan string, 1))
	_, err = ch.Consume("q", "watcher", false, false, false, false, nil)
	require.NoError(t, err)
	_, err = b.DeleteQueue("q")
	require.NoError(t, err)
	select {
	case tag := <-cancels:
		require.Equal(t, "watcher", tag)
	case <-time.After(5 * time.Second):
		t.Fatal("no basic.cancel")
	}
}

// A closing server closes its connections with CONNECTION_FORCED.
func TestServerClose(t *testing.T) {
	b := warren.New()
	defer b.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := NewServer(b)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	conn, err := amqp091.Dial("amqp://guest:guest@" + ln.Addr().String() + "/")
	require.NoError(t, err)
	closed := conn.NotifyClose(make(chan *amqp091.Error, 1))
	require.NoError(t, s.Close())
	require.Equal(t, amqp091.ConnectionForced, expectClose(t, closed).Code)
	require.ErrorIs(t, <-served, ErrServerClosed)
}

// A wrong protocol header gets the server's, and the connection closes.
func TestProtocolHeader(t *testing.T) {
	b := warren.New()
	defer b.Close()
	url := NewTestServer(t, b)
	nc, err := net.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "amqp://guest:guest@"), "/"))
	require.NoError(t, err)
	defer nc.Close()
	_, err = nc.Write([]byte("AMQP\x00\x00\x08\x00"))
	require.NoError(t, err)
	got, err := io.ReadAll(nc)
	require.NoError(t, err)
	require.Equal(t, "AMQP\x00\x00\x09\x01", string(got))
}

// nextBlocking returns the next connection.blocked or connection.unblocked the client heard.
func nextBlocking(t *testing.T, blockings <-chan amqp091.Blocking) amqp091.Blocking {
	t.Helper()
	select {
	case bl := <-blockings:
		return bl
	case <-time.After(5 * time.Second):
		t.Fatal("no connection.blocked/unblocked")
		return amqp091.Blocking{}
	}
}

// A publish that waits for room in a full Block queue blocks its connection:
// connection.blocked, then connection.unblocked once it got room.
func TestConnectionBlocked(t *testing.T) {
	b := warren.New()
	defer b.Close()
	q, err := b.DeclareQueue("bounded", warren.MaxLength(1), warren.Overflow(warren.Block))
	require.NoError(t, err)
	conn := dial(t, b)
	require.Equal(t, true, conn.Properties["capabilities"].(amqp091.Table)["connection.blocked"])
	blockings := conn.NotifyBlocked(make(chan amqp091.Blocking, 2))
	ch, err := conn.Channel()
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, ch.PublishWithContext(ctx, "", "bounded", false, false, amqp091.Publishing{Body: []byte("1")}))
	require.NoError(t, ch.PublishWithContext(ctx, "", "bounded", false, false, amqp091.Publishing{Body: []byte("2")}))
	next := func() amqp091.Blocking { return nextBlocking(t, blockings) }
	bl := next()
	require.True(t, bl.Active)
	require.Contains(t, bl.Reason, "block")
	d, err := q.Get(ctx, warren.AutoAck())
	require.NoError(t, err)
	require.Equal(t, "1", string(d.Message.Body))
	require.False(t, next().Active)
	require.Eventually(t, func() bool { return q.Len() == 1 }, 5*time.Second, time.Millisecond, "the second is in")

	// A server closing while a publish waits for room does not wait for room.
	require.NoError(t, ch.PublishWithContext(ctx, "", "bounded", false, false, amqp091.Publishing{Body: []byte("3")}))
	require.True(t, next().Active)
}

// A publish that waits for the broker's memory alarm to clear blocks its connection with
// RabbitMQ's reason, "low on memory"; it goes on, and the connection is unblocked, once
// consumers bring the broker back within its budget.
func TestConnectionBlockedOnMemory(t *testing.T) {
	b := warren.New(warren.WithMemoryLimit(1)) // one message sets the alarm
	defer b.Close()
	q, err := b.DeclareQueue("q")
	require.NoError(t, err)
	conn := dial(t, b)
	blockings := conn.NotifyBlocked(make(chan amqp091.Blocking, 2))
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, 2))
	ctx := context.Background()
	for _, body := range []string{"1", "2"} {
		require.NoError(t, ch.PublishWithContext(ctx, "", "q", false, false, amqp091.Publishing{Body: []byte(body)}))
	}
	next := func() amqp091.Blocking { return nextBlocking(t, blockings) }
	bl := next()
	require.True(t, bl.Active)
	require.Equal(t, "low on memory", bl.Reason)
	require.True(t, b.Memory().Alarm)
	require.True(t, (<-confirms).Ack, "the first went in")
	require.Equal(t, 1, q.Len(), "the second waits")
	d, err := q.Get(ctx, warren.AutoAck())
	require.NoError(t, err)
	require.Equal(t, "1", string(d.Message.Body))
	require.False(t, next().Active)
	require.True(t, (<-confirms).Ack, "the second went in once the first was consumed")
	require.Equal(t, 1, q.Len())
}

// The server speaks TLS when given a configuration (amqps).
func TestTLS(t *testing.T) {
	b := warren.New()
	defer b.Close()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	url := NewTestServer(t, b, TLS(&tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}))
	conn, err := amqp091.DialTLS(strings.Replace(url, "amqp://", "amqps://", 1), &tls.Config{RootCAs: roots})
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare("over-tls", false, false, false, false, nil)
	require.NoError(t, err)
	_, err = b.Queue("over-tls")
	require.NoError(t, err)
}

// The limits: channels beyond channel-max close the connection (CHANNEL_ERROR); a message
// larger than the largest allowed closes its channel (PRECONDITION_FAILED).
func TestLimits(t *testing.T) {
	b := warren.New()
	defer b.Close()
	conn := dial(t, b, ChannelMax(2), MaxMessageSize(10))
	require.Equal(t, uint16(2), uint16(conn.Config.ChannelMax))
	ch, err := conn.Channel()
	require.NoError(t, err)
	closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
	require.NoError(t, ch.PublishWithContext(context.Background(), "", "q", false, false, amqp091.Publishing{Body: make([]byte, 11)}))
	require.Equal(t, amqp091.PreconditionFailed, expectClose(t, closed).Code)

	r := dialRaw(t, NewTestServer(t, b, ChannelMax(2)), 0)
	r.send(3, &wire.ChannelOpen{})
	r.expectConnectionClose(wire.ChannelError)
}

// basic.qos with global=true: the channel's consumers together have at most that many unacked
// deliveries; with a per-consumer prefetch too, both apply (as RabbitMQ's documentation says;
// RabbitMQ 3.10 was measured applying only the per-consumer one). A consumer cancelled while
// its next delivery waits for room returns it to its place; a channel closed meanwhile returns
// everything.
func TestChannelPrefetch(t *testing.T) {
	b := warren.New()
	defer b.Close()
	conn := dial(t, b)
	pub, err := conn.Channel()
	require.NoError(t, err)
	var qs []*warren.Queue
	for _, name := range []string{"q1", "q2"} {
		q, err := b.DeclareQueue(name)
		require.NoError(t, err)
		qs = append(qs, q)
		for i := range 5 {
			require.NoError(t, pub.Publish("", name, false, false, amqp091.Publishing{Body: fmt.Appendf(nil, "%s-%d", name, i)}))
		}
	}
	require.Eventually(t, func() bool { return qs[0].Len() == 5 && qs[1].Len() == 5 }, 5*time.Second, time.Millisecond)
	held := func() int { return qs[0].Unacked() + qs[1].Unacked() }
	receive := func(ds ...<-chan amqp091.Delivery) amqp091.Delivery {
		t.Helper()
		for {
			for _, c := range ds {
				select {
				case d := <-c:
					return d
				default:
				}
			}
			select {
			case <-time.After(5 * time.Second):
				t.Fatal("no delivery")
			case <-time.After(time.Millisecond):
			}
		}
	}
	nothing := func(ds ...<-chan amqp091.Delivery) {
		t.Helper()
		time.Sleep(100 * time.Millisecond) // a negative: what would come comes within this on loopback
		for _, c := range ds {
			require.Empty(t, c, "a delivery beyond the channel's prefetch")
		}
	}

	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Qos(3, 0, true))
	require.NoError(t, ch.Qos(2, 0, false))
	c1, err := ch.Consume("q1", "c1", false, false, false, false, nil)
	require.NoError(t, err)
	c2, err := ch.Consume("q2", "c2", false, false, false, false, nil)
	require.NoError(t, err)
	var got []amqp091.Delivery
	for range 3 {
		got = append(got, receive(c1, c2))
	}
	require.Eventually(t, func() bool { return held() == 4 }, 5*time.Second, time.Millisecond, "each consumer takes its own 2")
	nothing(c1, c2)
	require.NoError(t, got[0].Ack(false))
	got = append(got[1:], receive(c1, c2))
	nothing(c1, c2)

	// The consumer whose delivery waits is cancelled: that delivery goes back to its queue.
	byTag := map[string]int{}
	for _, d := range got {
		byTag[d.ConsumerTag]++
	}
	waiting := "c1"
	if byTag["c1"] == 2 {
		waiting = "c2" // c1 has its own 2; c2 has 1 and one more taken, waiting for room
	}
	q := qs[0]
	if waiting == "c2" {
		q = qs[1]
	}
	require.NoError(t, ch.Cancel(waiting, false))
	require.Eventually(t, func() bool { return held() == 3 }, 5*time.Second, time.Millisecond, "the waiting delivery is back")
	d, ok, err := pub.Get(q.Name(), false)
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, d.Redelivered, "it was taken from the queue for the consumer, as a delivery")
	require.NoError(t, d.Nack(false, true))

	// Closing the channel returns what it holds and what waits.
	require.NoError(t, ch.Close())
	require.Eventually(t, func() bool { return held() == 0 && qs[0].Len()+qs[1].Len() == 9 }, 5*time.Second, time.Millisecond)
}

// basic.qos with global=true caps a consumer whose own prefetch is unlimited (0) or above the
// channel's: it holds no more unacked deliveries than the channel lets it send, so the messages
// it cannot be sent stay in the queue, within other consumers' reach (TestChannelPrefetch has
// a consumer's prefetch below the channel's).
func TestChannelPrefetchCapsConsumer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		prefetch int // the consumer's; the channel's is 3
	}{
		{"unlimited", 0},
		{"above the channel's", 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := warren.New()
			defer b.Close()
			conn := dial(t, b)
			ch, err := conn.Channel()
			require.NoError(t, err)
			q, err := b.DeclareQueue("q")
			require.NoError(t, err)
			for i := range 5 {
				require.NoError(t, ch.Publish("", "q", false, false, amqp091.Publishing{Body: fmt.Appendf(nil, "%d", i)}))
			}
			require.Eventually(t, func() bool { return q.Len() == 5 }, 5*time.Second, time.Millisecond)

			require.NoError(t, ch.Qos(3, 0, true))
			require.NoError(t, ch.Qos(tc.prefetch, 0, false))
			c, err := ch.Consume("q", "c", false, false, false, false, nil)
			require.NoError(t, err)
			receive := func() amqp091.Delivery {
				t.Helper()
				select {
				case d := <-c:
					return d
				case <-time.After(5 * time.Second):
					t.Fatal("no delivery")
					return amqp091.Delivery{}
				}
			}
			holdsThree := func() {
				t.Helper()
				time.Sleep(100 * time.Millisecond) // a negative: what would come comes within this on loopback
				require.Empty(t, c, "a delivery beyond the channel's prefetch")
				require.Equal(t, 3, q.Unacked(), "the consumer holds the channel's 3, no more")
			}
			var got []amqp091.Delivery
			for range 3 {
				got = append(got, receive())
			}
			holdsThree()
			require.Equal(t, 2, q.Len(), "the rest stays in the queue")
			require.NoError(t, got[0].Ack(false))
			receive()
			holdsThree()
			require.Equal(t, 1, q.Len())
		})
	}
}

// A consumer with no prefetch (basic.qos 0, or none) is sent every message, however many it
// has not acked: here more than warren's default buffer holds many times over.
func TestUnlimitedPrefetchOnTheWire(t *testing.T) {
	b := warren.New()
	defer b.Close()
	conn := dial(t, b)
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := b.DeclareQueue("q")
	require.NoError(t, err)
	const n = 3000
	for i := range n {
		require.NoError(t, ch.Publish("", "q", false, false, amqp091.Publishing{Body: fmt.Appendf(nil, "%d", i)}))
	}
	require.Eventually(t, func() bool { return q.Len() == n }, 5*time.Second, time.Millisecond)
	ds, err := ch.Consume("q", "", false, false, false, false, nil)
	require.NoError(t, err)
	var last amqp091.Delivery
	for i := range n {
		select {
		case last = <-ds:
			require.Equal(t, fmt.Sprint(i), string(last.Body))
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d delivered, none acked", i, n)
		}
	}
	require.Equal(t, n, q.Unacked())
	require.NoError(t, last.Ack(true))
	require.Eventually(t, func() bool { return q.Unacked() == 0 && q.Len() == 0 }, 5*time.Second, time.Millisecond)
}

package rabbitmq

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Shared test helpers.

// rabbitEnv names the variable that points the tests at a RabbitMQ; CI sets it after starting
// one, so there a RabbitMQ that cannot be reached fails the tests instead of skipping them.
const rabbitEnv = "WARREN_RABBITMQ_URL"

// dial connects to the RabbitMQ at $WARREN_RABBITMQ_URL, or skips the test when it is not set.
func dial(t *testing.T) *amqp.Connection {
	t.Helper()
	url := os.Getenv(rabbitEnv)
	if url == "" {
		t.Skipf("%s is not set: no RabbitMQ to test against (bench/rabbitmq.sh install && bench/rabbitmq.sh start, then %s=amqp://guest:guest@127.0.0.1:5672/)", rabbitEnv, rabbitEnv)
	}
	conn, err := amqp.Dial(url)
	require.NoError(t, err, "%s is set: RabbitMQ must be reachable there", rabbitEnv)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// channel opens a channel on conn.
func channel(t *testing.T, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	return ch
}

// unique returns t with every name made unique to this test run (the "amq." exchanges kept),
// names in arguments too (alternate and dead-letter exchanges, and dead-letter routing keys,
// which the tests use as queue names), so that tests do not meet on a shared RabbitMQ; and it deletes the
// topology's queues and exchanges from RabbitMQ when the test ends.
func unique(t *testing.T, conn *amqp.Connection, top warren.Topology) warren.Topology {
	t.Helper()
	prefix := fmt.Sprintf("warren-test.%s.%d.", strings.ReplaceAll(t.Name(), "/", "."), time.Now().UnixNano())
	name := func(s string) string {
		if s == "" || strings.HasPrefix(s, "amq.") {
			return s
		}
		return prefix + s
	}
	renamed := func(args warren.Table, keys ...string) warren.Table {
		if args == nil {
			return nil
		}
		out := warren.Table{}
		for k, v := range args {
			if s, ok := v.(string); ok && slices.Contains(keys, k) {
				v = name(s)
			}
			out[k] = v
		}
		return out
	}
	var u warren.Topology
	for _, x := range top.Exchanges {
		x.Name, x.Arguments = name(x.Name), renamed(x.Arguments, "alternate-exchange")
		u.Exchanges = append(u.Exchanges, x)
	}
	for _, q := range top.Queues {
		q.Name, q.Arguments = name(q.Name), renamed(q.Arguments, "x-dead-letter-exchange", "x-dead-letter-routing-key")
		u.Queues = append(u.Queues, q)
	}
	for _, b := range top.Bindings {
		b.Source, b.Destination = name(b.Source), name(b.Destination)
		u.Bindings = append(u.Bindings, b)
	}
	t.Cleanup(func() {
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		defer ch.Close()
		for _, q := range u.Queues {
			ch.QueueDelete(q.Name, false, false, false)
		}
		for _, x := range u.Exchanges {
			if !strings.HasPrefix(x.Name, "amq.") {
				ch.ExchangeDelete(x.Name, false, false)
			}
		}
	})
	return u
}

// readFixture reads the definitions file a RabbitMQ 3.10.8 exported (the root package's
// testdata).
func readFixture(t *testing.T) warren.Topology {
	t.Helper()
	f, err := os.Open("../../testdata/rabbitmq-3.10-definitions.json")
	require.NoError(t, err)
	defer f.Close()
	top, err := warren.ReadDefinitions(f, "/")
	require.NoError(t, err)
	return top
}

// rabbitURL returns $WARREN_RABBITMQ_URL, or skips the test as dial does.
func rabbitURL(t *testing.T) string {
	t.Helper()
	dial(t)
	return os.Getenv(rabbitEnv)
}

// proxy is a TCP proxy to a RabbitMQ, as the network between the client and the node: it can
// cut every connection it carries (a network failure, a restarted node), refuse new ones
// (down), hold back either direction (pause: TCP backpressure, as RabbitMQ's flow control or a
// resource alarm makes), and drop the basic.ack frames RabbitMQ sends (it parses the server's
// frames).
type proxy struct {
	ln       net.Listener
	target   string
	mu       sync.Mutex
	cond     *sync.Cond
	paused   [2]bool
	dropAcks bool
	down     bool
	brief    int // the next connections to close after the server's first briefAt frames
	briefAt  int
	conns    []net.Conn
	wg       sync.WaitGroup
}

type direction int

const (
	fromClient direction = iota
	fromServer
)

// newProxy starts a proxy to the RabbitMQ at rabbitURL and returns it with the URL to dial
// through it; it stops when the test ends.
func newProxy(t *testing.T, rabbitURL string) (*proxy, string) {
	t.Helper()
	u, err := url.Parse(rabbitURL)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: u.Host}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		p.pause(fromClient, false)
		p.pause(fromServer, false)
		ln.Close()
		p.cut()
		p.wg.Wait()
	})
	u.Host = ln.Addr().String()
	return p, u.String()
}

// quiet is a logger for clients whose reconnections the test causes.
var quiet = slog.New(slog.DiscardHandler)

// testLogger is a logger that writes to t's log, shown when t fails: for a test whose failure
// the client's reconnections would explain. Its client must be closed before t ends.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// proxied returns a proxy to the test's RabbitMQ and a client dialled through it, reconnecting
// within 50 ms, quiet, closed when the test ends; opts come after those and can change them.
func proxied(t *testing.T, opts ...Option) (*proxy, *Client) {
	t.Helper()
	p, through := newProxy(t, rabbitURL(t))
	c, err := Dial(through, append([]Option{ReconnectBackoff(10*time.Millisecond, 50*time.Millisecond), WithLogger(quiet)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return p, c
}

func (p *proxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			in.Close()
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		brief := 0
		if p.brief > 0 {
			p.brief--
			brief = p.briefAt
		}
		p.mu.Unlock()
		p.wg.Go(func() { p.forwardBytes(out, in); out.Close() })
		p.wg.Go(func() {
			p.forwardFrames(in, out, brief)
			in.Close()
			if brief > 0 {
				out.Close()
			}
		})
	}
}

func (p *proxy) wait(d direction) {
	p.mu.Lock()
	for p.paused[d] {
		p.cond.Wait()
	}
	p.mu.Unlock()
}

func (p *proxy) pause(d direction, paused bool) {
	p.mu.Lock()
	p.paused[d] = paused
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *proxy) setDropAcks(drop bool) {
	p.mu.Lock()
	p.dropAcks = drop
	p.mu.Unlock()
}

// cutEarly makes the proxy close each of the next n connections once it has carried the
// server's first frames: as a node that goes down while a client connects (1: after
// connection.start; 3: after connection.open-ok, the client connected).
func (p *proxy) cutEarly(n, frames int) {
	p.mu.Lock()
	p.brief, p.briefAt = n, frames
	p.mu.Unlock()
}

// setDown makes the proxy refuse new connections (down) or carry them again.
func (p *proxy) setDown(down bool) {
	p.mu.Lock()
	p.down = down
	p.mu.Unlock()
}

// cut closes every connection the proxy carries now; later ones go through.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// forwardBytes copies client → server, holding back while paused.
func (p *proxy) forwardBytes(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.wait(fromClient)
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// forwardFrames copies server → client frame by frame, holding back while paused and dropping
// basic.ack (class 60, method 80) while dropAcks; it stops after brief frames if brief > 0.
func (p *proxy) forwardFrames(dst, src net.Conn, brief int) {
	r := bufio.NewReader(src)
	for {
		h := make([]byte, 7)
		if _, err := io.ReadFull(r, h); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(h[3:7])
		rest := make([]byte, int(size)+1)
		if _, err := io.ReadFull(r, rest); err != nil {
			return
		}
		p.mu.Lock()
		drop := p.dropAcks && h[0] == 1 && size >= 4 && binary.BigEndian.Uint16(rest[0:2]) == 60 && binary.BigEndian.Uint16(rest[2:4]) == 80
		p.mu.Unlock()
		if drop {
			continue
		}
		p.wait(fromServer)
		if _, err := dst.Write(append(h, rest...)); err != nil {
			return
		}
		if brief--; brief == 0 {
			return
		}
	}
}

// messageCount returns how many messages queue q holds.
func messageCount(t *testing.T, conn *amqp.Connection, q string) int {
	t.Helper()
	ch := channel(t, conn)
	defer ch.Close()
	st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
	require.NoError(t, err)
	return st.Messages
}

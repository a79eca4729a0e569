package amqp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/contrib/amqp/internal/wire"
)

// protocolHeader opens an AMQP 0-9-1 connection; the server answers a wrong one with its own.
var protocolHeader = []byte("AMQP\x00\x00\x09\x01")

// handshakeTimeout bounds the protocol header and the connection's opening methods, as
// RabbitMQ's handshake_timeout (10 s).
const handshakeTimeout = 10 * time.Second

// closeTimeout bounds how long a connection waits for connection.close-ok after sending
// connection.close.
const closeTimeout = 3 * time.Second

// conn is one AMQP connection. Its reader goroutine (serve) reads every frame and runs every
// method, in order; writes come from it, from the consumers' goroutines and from the
// heartbeat, under wmu, one frame group (a method with its content) at a time. fr is the
// reader's, except while the reader waits in a publish for room in a Block queue: then it is
// the watcher's (watchPeer), which blocked starts and joins on the reader's goroutine.
type conn struct {
	s  *Server
	nc net.Conn
	fr *wire.FrameReader

	ctx    context.Context // the owner: exclusive queues, and the channels derived from it
	cancel context.CancelFunc
	b      *warren.Broker
	vhost  string
	user   string

	frameMax   uint32
	channelMax uint16
	heartbeat  time.Duration

	wmu     sync.Mutex
	bw      *bufio.Writer
	w       wire.Writer // the frames being written, its buffer kept
	werr    error
	written atomic.Bool // something was written since the heartbeat last looked

	blockable bool // the client takes connection.blocked (its capabilities say so)
	// publishOpts are a publish's options: WhileBlocked, then Mandatory for a mandatory one.
	publishOpts []warren.PublishOption

	channels map[uint16]*channel // the reader's alone
	methods  *wire.MethodReader  // the reader's
	armed    time.Time           // the reader's: when serve armed the heartbeat deadline; zero: not armed
	// closing is set once connection.close was sent (the server waits for close-ok), or once the
	// client is gone (no connection.close is to be sent).
	closing  atomic.Bool
	done     chan struct{}  // closed when the connection ends
	wg       sync.WaitGroup // the heartbeat and the consumers' goroutines
	watching sync.WaitGroup // the watcher of a blocked publish (see blocked); the reader's
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{s: s, nc: nc, fr: wire.NewFrameReader(nc), bw: bufio.NewWriterSize(nc, 64<<10),
		channels: map[uint16]*channel{}, methods: wire.NewMethodReader(), done: make(chan struct{})}
	c.ctx, c.cancel = warren.NewOwner(s.ctx)
	c.publishOpts = []warren.PublishOption{warren.WhileBlocked(c.blocked), warren.Mandatory()}
	return c
}

// send writes the frames fill appends, and flushes. After a write error nothing more is
// written, and the error is returned each time.
func (c *conn) send(fill func(w *wire.Writer)) error { return c.write(fill, true) }

// write writes the frames fill appends, and flushes them (with whatever else is buffered) if
// flush is set. What is not flushed goes with the next flush: the reader flushes before it
// waits for input, a consumer's goroutine when it has nothing more to deliver.
func (c *conn) write(fill func(w *wire.Writer), flush bool) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return c.werr
	}
	c.w.B = c.w.B[:0]
	fill(&c.w)
	if _, err := c.bw.Write(c.w.B); err != nil {
		c.werr = err
		return err
	}
	if cap(c.w.B) > 1<<20 {
		c.w.B = nil // a large message's buffer is not kept
	}
	c.written.Store(true)
	if !flush {
		return nil
	}
	return c.flushLocked()
}

// flush writes out what is buffered.
func (c *conn) flush() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return c.werr
	}
	return c.flushLocked()
}

func (c *conn) flushLocked() error {
	if err := c.bw.Flush(); err != nil {
		c.werr = err
		return err
	}
	return nil
}

// reply writes a method the reader sends in answer to a client's: flushed at once unless more
// input is waiting, which the reader reads first (a stream of publishes gets its confirms in
// fewer writes). Only the reader calls it.
func (c *conn) reply(ch uint16, m wire.Method) error {
	return c.write(func(w *wire.Writer) { w.MethodFrame(ch, m) }, c.fr.Buffered().Buffered() == 0)
}

// sendMethod writes one method frame.
func (c *conn) sendMethod(ch uint16, m wire.Method) error {
	return c.send(func(w *wire.Writer) { w.MethodFrame(ch, m) })
}

// serve runs the connection: the handshake, then frames until the connection ends; then it
// returns everything the connection's channels held to the queues and waits for its
// goroutines.
func (c *conn) serve() {
	defer func() {
		if v := recover(); v != nil {
			c.s.cfg.logger.Error("amqp: connection failed", "remote", c.nc.RemoteAddr(), "panic", v, "stack", string(debug.Stack()))
		}
		c.teardown()
	}()
	if err := c.handshake(); err != nil {
		var ae *amqpError
		if errors.As(err, &ae) {
			c.closeWith(ae)
		}
		c.s.cfg.logger.Debug("amqp: handshake failed", "remote", c.nc.RemoteAddr(), "err", err)
		return
	}
	if c.heartbeat > 0 {
		c.wg.Go(c.beat)
	}
	for {
		if c.fr.Buffered().Buffered() == 0 && c.flush() != nil {
			return // the client is gone
		}
		if c.heartbeat > 0 {
			// Two missed intervals end the connection: the deadline moves at most every half
			// interval, so a silence of 2 to 2.5 intervals does.
			if now := time.Now(); now.Sub(c.armed) >= c.heartbeat/2 {
				c.nc.SetReadDeadline(now.Add(2 * c.heartbeat))
				c.armed = now
			}
		}
		f, err := c.fr.Read()
		if err != nil {
			c.readFailed(err)
			return
		}
		if err := c.frame(f); err != nil {
			if errors.Is(err, errClosed) {
				return
			}
			var ae *amqpError
			if !errors.As(err, &ae) {
				ae = exception(wire.InternalError, nil, "%v", err)
			}
			c.closeWith(ae)
			return
		}
	}
}

// errClosed ends the reader once the connection closed as AMQP says.
var errClosed = errors.New("amqp: connection closed")

// readFailed ends the connection after a failed read: a frame error gets connection.close, a
// missed heartbeat or a peer gone only the end of the socket.
func (c *conn) readFailed(err error) {
	var ne net.Error
	switch {
	case errors.Is(err, wire.ErrFrameTooLarge):
		c.closeWith(exception(wire.FrameError, nil, "%v", err))
	case errors.Is(err, wire.ErrMalformed):
		c.closeWith(exception(wire.FrameError, nil, "%v", err))
	case errors.As(err, &ne) && ne.Timeout() && !c.closing.Load():
		c.s.cfg.logger.Info("amqp: missed heartbeats from client, timeout", "remote", c.nc.RemoteAddr(), "heartbeat", c.heartbeat)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
	default:
		c.s.cfg.logger.Debug("amqp: read failed", "remote", c.nc.RemoteAddr(), "err", err)
	}
}

// closeWith sends connection.close for e and waits, reading and dropping frames, for the
// client's close-ok (or closeTimeout).
func (c *conn) closeWith(e *amqpError) {
	if !c.closing.CompareAndSwap(false, true) {
		return
	}
	c.s.cfg.logger.Debug("amqp: closing connection", "remote", c.nc.RemoteAddr(), "code", e.code, "text", e.text)
	if c.sendMethod(0, &wire.ConnectionClose{ReplyCode: e.code, ReplyText: e.text, ClassID: e.class, MethodID: e.method}) != nil {
		return
	}
	c.nc.SetReadDeadline(time.Now().Add(closeTimeout))
	for {
		f, err := c.fr.Read()
		if err != nil {
			return
		}
		if f.Type != wire.FrameMethod || f.Channel != 0 {
			continue
		}
		if m, err := wire.ReadMethod(f.Payload); err == nil {
			switch m.(type) {
			case *wire.ConnectionCloseOk:
				return
			case *wire.ConnectionClose:
				c.sendMethod(0, &wire.ConnectionCloseOk{})
				return
			}
		}
	}
}

// shutdown closes the connection from outside (the server closes): connection.close with
// CONNECTION_FORCED, then the socket once the client answers or closeTimeout passes.
func (c *conn) shutdown(err error) {
	if c.closing.CompareAndSwap(false, true) {
		e := failure(nil, err)
		c.sendMethod(0, &wire.ConnectionClose{ReplyCode: e.code, ReplyText: e.text})
	}
	c.nc.SetReadDeadline(time.Now().Add(closeTimeout))
	c.cancel() // a publish waiting for room in a Block queue gives up
}

// teardown ends the connection: its owner, and with it its channels' consumers (what they
// held goes back to the queues) and its exclusive queues; then its goroutines and its socket.
func (c *conn) teardown() {
	c.cancel()
	for _, ch := range c.channels {
		ch.end()
	}
	close(c.done)
	c.nc.Close()
	c.wg.Wait()
	c.watching.Wait() // none but after a panic in a blocked publish: the closed socket ends it
}

// beat sends a heartbeat every half interval in which nothing else was written.
func (c *conn) beat() {
	t := time.NewTicker(c.heartbeat / 2)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if !c.written.Swap(false) {
				c.send((*wire.Writer).Heartbeat)
			}
		case <-c.done:
			return
		}
	}
}

// handshake reads the protocol header and runs connection.start, tune and open.
func (c *conn) handshake() error {
	c.nc.SetDeadline(time.Now().Add(handshakeTimeout))
	defer c.nc.SetDeadline(time.Time{})
	header := make([]byte, 8)
	if _, err := io.ReadFull(c.fr.Buffered(), header); err != nil {
		return err
	}
	if !bytes.Equal(header, protocolHeader) {
		c.nc.Write(protocolHeader)
		return fmt.Errorf("amqp: protocol header %q", header)
	}
	props := serverProperties()
	if err := c.sendMethod(0, &wire.ConnectionStart{VersionMajor: 0, VersionMinor: 9, ServerProperties: props,
		Mechanisms: "PLAIN AMQPLAIN", Locales: "en_US"}); err != nil {
		return err
	}
	startOk, err := expect[*wire.ConnectionStartOk](c)
	if err != nil {
		return err
	}
	if err := c.authenticate(startOk); err != nil {
		return err
	}
	if caps, ok := startOk.ClientProperties["capabilities"].(warren.Table); ok {
		c.blockable, _ = caps["connection.blocked"].(bool)
	}
	cfg := c.s.cfg
	if err := c.sendMethod(0, &wire.ConnectionTune{ChannelMax: cfg.channelMax, FrameMax: cfg.frameMax,
		Heartbeat: uint16(cfg.heartbeat / time.Second)}); err != nil {
		return err
	}
	tuneOk, err := expect[*wire.ConnectionTuneOk](c)
	if err != nil {
		return err
	}
	c.channelMax = negotiate(cfg.channelMax, tuneOk.ChannelMax)
	c.frameMax = negotiate(cfg.frameMax, tuneOk.FrameMax)
	if c.frameMax < wire.FrameMinSize {
		return exception(wire.NotAllowed, tuneOk, "frame_max=%d < %d min size", c.frameMax, wire.FrameMinSize)
	}
	c.heartbeat = time.Duration(tuneOk.Heartbeat) * time.Second
	c.fr.Max = c.frameMax
	open, err := expect[*wire.ConnectionOpen](c)
	if err != nil {
		return err
	}
	b, ok := cfg.vhosts[open.VirtualHost]
	if !ok {
		return exception(wire.NotAllowed, open, "vhost %s not found", open.VirtualHost)
	}
	c.b, c.vhost = b, open.VirtualHost
	return c.sendMethod(0, &wire.ConnectionOpenOk{})
}

// negotiate returns the lower of the server's and the client's limits, 0 meaning none.
func negotiate[T uint16 | uint32](server, client T) T {
	switch {
	case client == 0:
		return server
	case server == 0:
		return client
	}
	return min(server, client)
}

// expect reads the next frame of the handshake, which must be method M on channel 0.
func expect[M wire.Method](c *conn) (M, error) {
	var zero M
	f, err := c.fr.Read()
	if err != nil {
		return zero, err
	}
	if f.Type == wire.FrameHeartbeat {
		return expect[M](c)
	}
	if f.Type != wire.FrameMethod || f.Channel != 0 {
		return zero, exception(wire.CommandInvalid, nil, "expected %s, got a frame of type %d on channel %d", methodName[M](), f.Type, f.Channel)
	}
	m, err := wire.ReadMethod(f.Payload)
	if err != nil {
		return zero, exception(wire.SyntaxError, nil, "%v", err)
	}
	got, ok := m.(M)
	if !ok {
		return zero, exception(wire.CommandInvalid, m, "expected %s, got %s", methodName[M](), m.Name())
	}
	return got, nil
}

// methodName returns M's name ("connection.tune-ok"): a method's Name does not read its
// receiver.
func methodName[M wire.Method]() string {
	var m M
	return m.Name()
}

// authenticate checks start-ok's credentials: PLAIN ("\x00user\x00password") or AMQPLAIN (a
// table with LOGIN and PASSWORD). A failure closes the connection with ACCESS_REFUSED, as
// RabbitMQ's authentication_failure_close capability says.
func (c *conn) authenticate(m *wire.ConnectionStartOk) error {
	var user, password string
	switch m.Mechanism {
	case "PLAIN":
		parts := bytes.SplitN([]byte(m.Response), []byte{0}, 3)
		if len(parts) != 3 {
			return exception(wire.AccessRefused, m, "PLAIN login refused: malformed response")
		}
		user, password = string(parts[1]), string(parts[2])
	case "AMQPLAIN":
		// The response is a field table's content, without the table's length.
		n := len(m.Response)
		r := wire.NewReader(append([]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, m.Response...))
		t := r.Table()
		user, _ = t["LOGIN"].(string)
		password, _ = t["PASSWORD"].(string)
	default:
		return exception(wire.AccessRefused, m, "unsupported authentication mechanism %q", m.Mechanism)
	}
	want, ok := c.s.cfg.users[user]
	if !ok || want != password {
		return exception(wire.AccessRefused, m, "%s login refused: user '%s' - invalid credentials", m.Mechanism, user)
	}
	c.user = user
	return nil
}

// serverProperties tells the client what the server is and what it implements: only what is
// implemented is advertised.
func serverProperties() warren.Table {
	return warren.Table{
		"product":     "warren",
		"version":     "0.1",
		"platform":    "Go",
		"information": "warren, an in-process message broker for Go, speaking AMQP 0-9-1",
		"capabilities": warren.Table{
			"publisher_confirms":           true,
			"exchange_exchange_bindings":   true,
			"basic.nack":                   true,
			"consumer_cancel_notify":       true,
			"authentication_failure_close": true,
			"per_consumer_qos":             true,
			"connection.blocked":           true,
		},
	}
}

// frame runs one frame after the handshake.
func (c *conn) frame(f wire.Frame) error {
	switch f.Type {
	case wire.FrameHeartbeat:
		if f.Channel != 0 {
			return exception(wire.FrameError, nil, "heartbeat on channel %d", f.Channel)
		}
		return nil
	case wire.FrameMethod:
		m, err := c.methods.Method(f.Payload)
		if errors.Is(err, wire.ErrUnknownMethod) {
			return exception(wire.CommandInvalid, nil, "%v", err)
		}
		if err != nil {
			return exception(wire.SyntaxError, nil, "%v", err)
		}
		if f.Channel == 0 {
			return c.connectionMethod(m)
		}
		return c.channelMethod(f.Channel, m)
	case wire.FrameHeader, wire.FrameBody:
		ch := c.channels[f.Channel]
		if ch == nil {
			return exception(wire.UnexpectedFrame, nil, "content frame on channel %d, which is not open", f.Channel)
		}
		return ch.content(f)
	}
	return exception(wire.FrameError, nil, "frame type %d", f.Type)
}

// connectionMethod runs a method on channel 0.
func (c *conn) connectionMethod(m wire.Method) error {
	switch m.(type) {
	case *wire.ConnectionClose:
		c.closing.Store(true)
		c.sendMethod(0, &wire.ConnectionCloseOk{})
		return errClosed
	case *wire.ConnectionCloseOk:
		return errClosed
	case *wire.ConnectionBlocked, *wire.ConnectionUnblocked, *wire.ConnectionUpdateSecret:
		return exception(wire.NotImplemented, m, "%s", m.Name())
	}
	return exception(wire.CommandInvalid, m, "%s on channel 0", m.Name())
}

// channelMethod runs a method on channel id.
func (c *conn) channelMethod(id uint16, m wire.Method) error {
	if id > c.channelMax {
		return exception(wire.ChannelError, m, "channel %d: channel_max is %d", id, c.channelMax)
	}
	ch := c.channels[id]
	if open, ok := m.(*wire.ChannelOpen); ok {
		if ch != nil {
			return exception(wire.ChannelError, open, "second 'channel.open' seen")
		}
		c.channels[id] = newChannel(c, id)
		return c.sendMethod(id, &wire.ChannelOpenOk{})
	}
	if ch == nil {
		return exception(wire.ChannelError, m, "expected 'channel.open' on channel %d", id)
	}
	return ch.method(m)
}

// blocked is told that a publish of the connection starts waiting for room in a full Block
// queue (waiting), or no longer waits (it got room, or its channel's or the connection's
// context ended). The reader runs every publish, so the connection has at most one such wait
// at a time, and the reader is in it from blocked(true) to blocked(false): it reads nothing
// meanwhile. The client, if it takes connection.blocked, is told. And so that a client gone
// meanwhile (it closed the socket, or died) is noticed now rather than when room comes, which
// may be never, a watcher (watchPeer) looks at the socket in the reader's stead while it waits.
// The watcher is started here and joined here, on the reader's goroutine: the reader's bufio
// reader is the watcher's in between, and the reader's alone again when blocked(false) returns.
// blocked does not block: the watcher's join does not wait for input (see below).
func (c *conn) blocked(waiting bool) {
	if waiting {
		c.flush() // the replies so far, before the publish waits
		if c.blockable {
			reason := "a queue with the block overflow is full"
			if c.b != nil && c.b.Memory().Alarm {
				reason = "low on memory" // RabbitMQ's words for its memory alarm
			}
			c.sendMethod(0, &wire.ConnectionBlocked{Reason: reason})
		}
		// Heartbeat checks pause while the connection is blocked, as RabbitMQ's do: the watcher
		// ends the connection when the peer is gone, not when it is silent. Set here rather
		// than by the watcher, so that it cannot undo the deadline that stops it.
		c.nc.SetReadDeadline(time.Time{})
		c.watching.Go(c.watchPeer)
		return
	}
	// A read deadline in the past stops the watcher at once, whether it waits in a Peek or is
	// about to (as net/http's aLongTimeAgo does); then the deadline is the reader's again.
	c.nc.SetReadDeadline(time.Unix(1, 0))
	c.watching.Wait()
	c.nc.SetReadDeadline(time.Time{})
	c.armed = time.Time{} // so that serve arms the heartbeat deadline before it reads again
	// shutdown, on another goroutine, may have set its close deadline before the line above
	// cleared it: set it again. If shutdown comes later, its own deadline comes later too.
	if c.closing.Load() {
		c.nc.SetReadDeadline(time.Now().Add(closeTimeout))
	}
	c.flush()
	if c.blockable {
		c.sendMethod(0, &wire.ConnectionUnblocked{})
	}
}

// watchPeer runs while the reader waits in a blocked publish (see blocked), and ends the
// connection if the client is gone: its socket's end of file, a reset. It only peeks at the
// reader's bufio reader, so that what the client sends meanwhile (heartbeats, other channels'
// methods) stays buffered for the reader, in order, for after the wait. It returns at a read
// timeout (blocked's deadline in the past, or shutdown's), or once the buffer is full: a client
// that sent that much is not gone, and the reader reads it once the wait ends.
func (c *conn) watchPeer() {
	br := c.fr.Buffered()
	for {
		// One byte more than is buffered: waits for input, and consumes none.
		_, err := br.Peek(br.Buffered() + 1)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.Is(err, bufio.ErrBufferFull) || errors.As(err, &ne) && ne.Timeout() {
			return
		}
		// The publish gives up once the connection's context ends, and the reader then ends the
		// connection, with nothing to send. Peek returns the read error and forgets it, but
		// should the reader read again (the wait ended with room just now), the socket fails
		// that read too.
		c.s.cfg.logger.Debug("amqp: client gone while blocked", "remote", c.nc.RemoteAddr(), "err", err)
		c.closing.Store(true)
		c.cancel()
		return
	}
}

package amqp

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/contrib/amqp/internal/wire"
)

// Shared test helpers.

// raw is a hand-driven AMQP client for what a well-behaved client library would not send.
type raw struct {
	t  *testing.T
	nc net.Conn
	fr *wire.FrameReader
}

// dialRaw connects to the server at url and opens the connection with the given heartbeat
// (seconds; 0 for none) and channel 1.
func dialRaw(t *testing.T, url string, heartbeat uint16) *raw {
	t.Helper()
	return dialRawAs(t, url, heartbeat, nil)
}

// dialRawAs is dialRaw for a client whose start-ok carries props as its client properties
// (its capabilities, for one).
func dialRawAs(t *testing.T, url string, heartbeat uint16, props warren.Table) *raw {
	t.Helper()
	addr := strings.TrimSuffix(url[strings.Index(url, "@")+1:], "/")
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	r := &raw{t: t, nc: nc, fr: wire.NewFrameReader(nc)}
	r.fr.Max = 1 << 20
	_, err = nc.Write(protocolHeader)
	require.NoError(t, err)
	r.expect(0, &wire.ConnectionStart{})
	r.send(0, &wire.ConnectionStartOk{ClientProperties: props, Mechanism: "PLAIN", Response: "\x00guest\x00guest", Locale: "en_US"})
	tune := r.expect(0, &wire.ConnectionTune{}).(*wire.ConnectionTune)
	r.send(0, &wire.ConnectionTuneOk{ChannelMax: tune.ChannelMax, FrameMax: tune.FrameMax, Heartbeat: heartbeat})
	r.send(0, &wire.ConnectionOpen{VirtualHost: "/"})
	r.expect(0, &wire.ConnectionOpenOk{})
	r.send(1, &wire.ChannelOpen{})
	r.expect(1, &wire.ChannelOpenOk{})
	return r
}

// send writes a method frame.
func (r *raw) send(ch uint16, m wire.Method) {
	r.t.Helper()
	r.write(wire.AppendMethod(nil, ch, m))
}

// write writes bytes as they are.
func (r *raw) write(b []byte) {
	r.t.Helper()
	_, err := r.nc.Write(b)
	require.NoError(r.t, err)
}

// next reads the next frame that is not a heartbeat, within 5 s.
func (r *raw) next() wire.Frame {
	r.t.Helper()
	r.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		f, err := r.fr.Read()
		require.NoError(r.t, err)
		if f.Type != wire.FrameHeartbeat {
			return f
		}
	}
}

// expect reads the next frame, which must be a method of want's type on channel ch, and
// returns it.
func (r *raw) expect(ch uint16, want wire.Method) wire.Method {
	r.t.Helper()
	f := r.next()
	require.Equal(r.t, uint8(wire.FrameMethod), f.Type, "a method frame")
	require.Equal(r.t, ch, f.Channel)
	m, err := wire.ReadMethod(f.Payload)
	require.NoError(r.t, err)
	require.IsType(r.t, want, m)
	return m
}

// expectConnectionClose reads the server's connection.close, checks its code, answers
// close-ok and checks that the server then closes the socket.
func (r *raw) expectConnectionClose(code uint16) *wire.ConnectionClose {
	r.t.Helper()
	c := r.expect(0, &wire.ConnectionClose{}).(*wire.ConnectionClose)
	require.Equal(r.t, code, c.ReplyCode, c.ReplyText)
	r.send(0, &wire.ConnectionCloseOk{})
	r.expectEOF()
	return c
}

// expectEOF checks that the server closes the socket within 5 s.
func (r *raw) expectEOF() {
	r.t.Helper()
	r.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		f, err := r.fr.Read()
		if err != nil {
			var ne net.Error
			require.False(r.t, errors.As(err, &ne) && ne.Timeout(), "the server did not close the socket")
			return
		}
		require.Equal(r.t, uint8(wire.FrameHeartbeat), f.Type, "nothing but heartbeats before the end")
	}
}

// appendPublish appends basic.publish of body to the default exchange with routing key key,
// and its content, on channel ch, to buf.
func appendPublish(buf []byte, ch uint16, key string, body []byte) []byte {
	buf = wire.AppendMethod(buf, ch, &wire.BasicPublish{RoutingKey: key})
	return wire.AppendContent(buf, ch, &wire.BasicProperties{}, body, 0)
}

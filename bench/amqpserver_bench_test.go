package bench

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/contrib/amqp"
)

// BenchmarkAMQPServerPublish measures contrib/amqp's publish path alone: a raw client writes
// pre-encoded basic.publish frame groups (method, content header without properties, one
// 128-byte body frame: what warren-amqp's amqp091-go producers send) over loopback TCP, so
// that the client allocates nothing and every allocation the benchmark reports is the
// server's (and the broker's). With -memprofile (and -memprofilerate=1) it attributes them:
//
//	go test -run '^$' -bench AMQPServerPublish -benchmem -benchtime 200000x -memprofile mem.out -memprofilerate 1
//	go tool pprof -sample_index=alloc_objects -top mem.out
//
// Sub-benchmarks: "queue" publishes to a queue through the default exchange; "unroutable"
// to amq.direct with a key bound to nothing (parsing and routing, no enqueue); each with the
// channel in confirm mode (a basic.ack back per publish, read by the client) or not.
func BenchmarkAMQPServerPublish(b *testing.B) {
	for _, route := range []string{"queue", "unroutable"} {
		for _, confirm := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/confirm=%t", route, confirm), func(b *testing.B) {
				benchServerPublish(b, route == "queue", confirm)
			})
		}
	}
}

// benchQueue is named as the bench's W3 queue is, "wb<pid>.backlog": a routing key long
// enough that the server's copy of it is a real allocation (the runtime has no allocation for
// one-byte strings).
const benchQueue = "wb12345.backlog"

func benchServerPublish(b *testing.B, toQueue, confirm bool) {
	br := warren.New()
	b.Cleanup(func() { br.Close() })
	url := amqp.NewTestServer(b, br)
	if _, err := br.DeclareQueue(benchQueue); err != nil {
		b.Fatal(err)
	}
	c, err := dialRawAMQP(strings.TrimSuffix(strings.TrimPrefix(url, "amqp://guest:guest@"), "/"), confirm)
	if err != nil {
		b.Fatal(err)
	}
	defer c.nc.Close()
	exchange, key := "", benchQueue
	if !toQueue {
		exchange, key = "amq.direct", "wb12345.nobody"
	}
	pub := appendPublish(nil, 1, exchange, key, NewBody(0))

	var confirmed atomic.Uint64
	readErr := make(chan error, 1)
	if confirm {
		go func() { readErr <- c.readConfirms(&confirmed) }()
	}
	// Not b.Loop: the time and the allocations must include the server's work after the last
	// write (the publishes still in its socket buffer and its queue), which is measured by
	// waiting for it inside the timed region, and b.Loop stops the timer as it returns false.
	b.SetBytes(int64(len(pub)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := c.bw.Write(pub); err != nil {
			b.Fatal(err)
		}
	}
	if err := c.bw.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := c.wait(confirm, &confirmed, uint64(b.N), readErr); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if toQueue {
		if _, err := br.Purge(benchQueue); err != nil {
			b.Fatal(err)
		}
	}
}

// rawAMQP is a hand-written AMQP 0-9-1 client of one channel (1) that allocates nothing per
// publish, for BenchmarkAMQPServerPublish.
type rawAMQP struct {
	nc  net.Conn
	br  *bufio.Reader
	bw  *bufio.Writer
	hdr [7]byte // a frame header being read (on the stack it would escape through io.ReadFull)
}

// wait returns once the server has handled n publishes: in confirm mode, once readConfirms has
// seen the nth confirm; otherwise once basic.qos, sent after them, is answered (the server
// runs a channel's methods in order).
func (c *rawAMQP) wait(confirm bool, confirmed *atomic.Uint64, n uint64, readErr <-chan error) error {
	if confirm {
		deadline := time.Now().Add(time.Minute)
		for confirmed.Load() < n {
			if time.Now().After(deadline) {
				return fmt.Errorf("after a minute: %d of %d publishes confirmed", confirmed.Load(), n)
			}
			select {
			case err := <-readErr:
				return fmt.Errorf("reading confirms: %w", err)
			default:
			}
			time.Sleep(50 * time.Microsecond)
		}
		return nil
	}
	qos := appendMethod(nil, 1, 60, 10, func(p []byte) []byte {
		return append(binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint32(p, 0), 0), 0)
	})
	if _, err := c.nc.Write(qos); err != nil {
		return err
	}
	typ, _, payload, err := c.readFrame(nil)
	if err != nil {
		return err
	}
	if typ != 1 || len(payload) < 4 || binary.BigEndian.Uint16(payload) != 60 || binary.BigEndian.Uint16(payload[2:]) != 11 {
		return fmt.Errorf("want basic.qos-ok, got a frame of type %d: % x", typ, payload)
	}
	return nil
}

// dialRawAMQP connects as guest/guest to vhost "/", with no heartbeat, and opens channel 1,
// in confirm mode if asked.
func dialRawAMQP(addr string, confirm bool) (*rawAMQP, error) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &rawAMQP{nc: nc, br: bufio.NewReaderSize(nc, 64<<10), bw: bufio.NewWriterSize(nc, 64<<10)}
	ok := false
	defer func() {
		if !ok {
			nc.Close()
		}
	}()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	steps := []struct {
		send   []byte
		expect [2]uint16 // the method the server answers with; {0, 0}: none
	}{
		{[]byte("AMQP\x00\x00\x09\x01"), [2]uint16{10, 10}}, // connection.start
		{appendMethod(nil, 0, 10, 11, func(p []byte) []byte { // start-ok
			p = binary.BigEndian.AppendUint32(p, 0) // client-properties: an empty table
			p = appendShortStr(p, "PLAIN")
			p = binary.BigEndian.AppendUint32(p, uint32(len("\x00guest\x00guest")))
			p = append(p, "\x00guest\x00guest"...)
			return appendShortStr(p, "en_US")
		}), [2]uint16{10, 30}}, // tune
		{appendMethod(nil, 0, 10, 31, func(p []byte) []byte { // tune-ok
			p = binary.BigEndian.AppendUint16(p, 2047)
			p = binary.BigEndian.AppendUint32(p, 131072)
			return binary.BigEndian.AppendUint16(p, 0) // no heartbeat
		}), [2]uint16{}},
		{appendMethod(nil, 0, 10, 40, func(p []byte) []byte { // connection.open
			return append(appendShortStr(appendShortStr(p, "/"), ""), 0)
		}), [2]uint16{10, 41}},
		{appendMethod(nil, 1, 20, 10, func(p []byte) []byte { return appendShortStr(p, "") }), [2]uint16{20, 11}}, // channel.open
	}
	if confirm {
		steps = append(steps, struct {
			send   []byte
			expect [2]uint16
		}{appendMethod(nil, 1, 85, 10, func(p []byte) []byte { return append(p, 0) }), [2]uint16{85, 11}}) // confirm.select
	}
	for _, st := range steps {
		if _, err := nc.Write(st.send); err != nil {
			return nil, err
		}
		if st.expect == [2]uint16{} {
			continue
		}
		typ, _, payload, err := c.readFrame(nil)
		if err != nil {
			return nil, err
		}
		if typ != 1 || len(payload) < 4 || binary.BigEndian.Uint16(payload) != st.expect[0] || binary.BigEndian.Uint16(payload[2:]) != st.expect[1] {
			return nil, fmt.Errorf("handshake: want method %d.%d, got a frame of type %d: % x", st.expect[0], st.expect[1], typ, payload)
		}
	}
	nc.SetDeadline(time.Time{})
	ok = true
	return c, nil
}

// readFrame reads one frame into buf (grown if need be).
func (c *rawAMQP) readFrame(buf []byte) (typ uint8, ch uint16, payload []byte, err error) {
	h := c.hdr[:]
	if _, err := io.ReadFull(c.br, h); err != nil {
		return 0, 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(h[3:])) + 1
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(c.br, buf); err != nil {
		return 0, 0, nil, err
	}
	if buf[n-1] != 0xCE {
		return 0, 0, nil, errors.New("frame end missing")
	}
	return h[0], binary.BigEndian.Uint16(h[1:3]), buf[:n-1], nil
}

// readConfirms reads the server's frames until the connection ends, storing the delivery tag
// of the latest basic.ack in confirmed (a basic.nack, or anything but an ack, is an error).
func (c *rawAMQP) readConfirms(confirmed *atomic.Uint64) error {
	buf := make([]byte, 4096)
	for {
		typ, _, payload, err := c.readFrame(buf)
		if err != nil {
			return err
		}
		if typ != 1 || len(payload) < 12 || binary.BigEndian.Uint16(payload) != 60 || binary.BigEndian.Uint16(payload[2:]) != 80 {
			return fmt.Errorf("want basic.ack, got a frame of type %d: % x", typ, payload)
		}
		confirmed.Store(binary.BigEndian.Uint64(payload[4:]))
	}
}

// appendMethod appends a method frame on channel ch whose arguments args appends.
func appendMethod(buf []byte, ch, class, method uint16, args func([]byte) []byte) []byte {
	return appendFrame(buf, 1, ch, args(binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, class), method)))
}

func appendFrame(buf []byte, typ uint8, ch uint16, payload []byte) []byte {
	buf = append(buf, typ)
	buf = binary.BigEndian.AppendUint16(buf, ch)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(payload)))
	return append(append(buf, payload...), 0xCE)
}

func appendShortStr(buf []byte, s string) []byte { return append(append(buf, byte(len(s))), s...) }

// appendPublish appends basic.publish to exchange with key, a content header with no
// properties, and one body frame.
func appendPublish(buf []byte, ch uint16, exchange, key string, body []byte) []byte {
	buf = appendMethod(buf, ch, 60, 40, func(p []byte) []byte {
		p = binary.BigEndian.AppendUint16(p, 0) // reserved
		return append(appendShortStr(appendShortStr(p, exchange), key), 0)
	})
	header := binary.BigEndian.AppendUint16(nil, 60)  // basic
	header = binary.BigEndian.AppendUint16(header, 0) // weight
	header = binary.BigEndian.AppendUint64(header, uint64(len(body)))
	header = binary.BigEndian.AppendUint16(header, 0) // property flags: none
	buf = appendFrame(buf, 2, ch, header)
	return appendFrame(buf, 3, ch, body)
}

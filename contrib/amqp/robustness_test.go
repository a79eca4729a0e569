package amqp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/contrib/amqp/internal/wire"
)

// What a client does wrong closes its connection with the right error, and only its
// connection: a bystander's connection, with its unacked delivery, goes on.
func TestBrokenClients(t *testing.T) {
	b := warren.New()
	defer b.Close()
	url := NewTestServer(t, b)
	bystander, err := amqp091.Dial(url)
	require.NoError(t, err)
	defer bystander.Close()
	bch, err := bystander.Channel()
	require.NoError(t, err)
	_, err = bch.QueueDeclare("q", false, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, bch.PublishWithContext(context.Background(), "", "q", false, false, amqp091.Publishing{Body: []byte("held")}))
	held, ok, err := bch.Get("q", false)
	require.NoError(t, err)
	require.True(t, ok)

	publish := wire.AppendMethod(nil, 1, &wire.BasicPublish{RoutingKey: "q"})
	header := func(size uint64) []byte {
		buf := wire.AppendContent(nil, 1, &wire.BasicProperties{}, make([]byte, size), 0)
		return buf[:7+binary.BigEndian.Uint32(buf[3:7])+1] // the header frame only
	}
	body := wire.AppendContent(nil, 1, &wire.BasicProperties{}, []byte("x"), 0)
	body = body[len(body)-9:] // the body frame only

	for _, tc := range []struct {
		name string
		code uint16
		send func(r *raw)
	}{
		{"a frame without its frame end", wire.FrameError, func(r *raw) {
			f := wire.AppendHeartbeat(nil)
			f[len(f)-1] = 0
			r.write(f)
		}},
		{"a frame larger than frame-max", wire.FrameError, func(r *raw) {
			f := []byte{wire.FrameMethod, 0, 1}
			f = binary.BigEndian.AppendUint32(f, 1<<20)
			r.write(f)
		}},
		{"a frame of no known type", wire.FrameError, func(r *raw) { r.write([]byte{9, 0, 0, 0, 0, 0, 0, wire.FrameEnd}) }},
		{"a heartbeat on a channel", wire.FrameError, func(r *raw) { r.write([]byte{wire.FrameHeartbeat, 0, 1, 0, 0, 0, 0, wire.FrameEnd}) }},
		{"a body before its header", wire.UnexpectedFrame, func(r *raw) { r.write(append(publish, body...)) }},
		{"a method before the header", wire.UnexpectedFrame, func(r *raw) {
			r.write(append(publish, wire.AppendMethod(nil, 1, &wire.BasicQos{PrefetchCount: 1})...))
		}},
		{"content with no publish", wire.UnexpectedFrame, func(r *raw) { r.write(header(1)) }},
		{"more body than its header says", wire.FrameError, func(r *raw) {
			two := wire.AppendContent(nil, 1, &wire.BasicProperties{}, []byte("xy"), 0)
			r.write(append(append(publish, header(1)...), two[len(two)-10:]...))
		}},
		{"a method on a channel not open", wire.ChannelError, func(r *raw) { r.send(2, &wire.BasicQos{}) }},
		{"arguments that do not parse", wire.SyntaxError, func(r *raw) {
			r.write([]byte{wire.FrameMethod, 0, 1, 0, 0, 0, 5, 0, 50, 0, 10, 7, wire.FrameEnd}) // queue.declare, cut short
		}},
		{"a method that does not exist", wire.CommandInvalid, func(r *raw) {
			r.write([]byte{wire.FrameMethod, 0, 1, 0, 0, 0, 4, 0, 99, 0, 1, wire.FrameEnd})
		}},
		{"the immediate flag", wire.NotImplemented, func(r *raw) { r.send(1, &wire.BasicPublish{RoutingKey: "q", Immediate: true}) }},
		{"headers nested deeper than a broker takes them", wire.FrameError, func(r *raw) {
			// The decoder refuses them (32 levels) before they reach the broker, which would
			// refuse them too (warren.ErrPreconditionFailed): a cycle cannot come from the wire.
			deep := warren.Table{"end": "x"}
			for range 40 {
				deep = warren.Table{"t": deep}
			}
			r.write(append(publish, wire.AppendContent(nil, 1, &wire.BasicProperties{Headers: deep}, []byte("x"), 0)...))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := dialRaw(t, url, 0)
			tc.send(r)
			r.expectConnectionClose(tc.code)
		})
	}
	require.False(t, bystander.IsClosed())
	require.NoError(t, held.Ack(false), "the bystander's delivery is still its own")
	wq, err := b.Queue("q")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return wq.Len()+wq.Unacked() == 0 }, 5*time.Second, time.Millisecond,
		"the ack went through, and the broken clients published nothing")
}

// A client that stops sending (not even heartbeats) is disconnected after two heartbeat
// intervals, and what it held goes back to the queue, redelivered.
func TestMissedHeartbeats(t *testing.T) {
	b := warren.New()
	defer b.Close()
	url := NewTestServer(t, b)
	q, err := b.DeclareQueue("q")
	require.NoError(t, err)
	require.NoError(t, b.Publish(context.Background(), "", "q", warren.Message{Body: []byte("m")}))
	r := dialRaw(t, url, 1)
	r.send(1, &wire.BasicGet{Queue: "q"})
	r.expect(1, &wire.BasicGetOk{})
	r.next() // its content header
	r.next() // and body
	require.Equal(t, 1, q.Unacked())
	start := time.Now()
	r.expectEOF()
	took := time.Since(start)
	require.GreaterOrEqual(t, took, 1500*time.Millisecond, "not before two intervals")
	require.Eventually(t, func() bool { return q.Len() == 1 }, 5*time.Second, time.Millisecond, "back in the queue")
	d, err := q.Get(context.Background())
	require.NoError(t, err)
	require.True(t, d.Redelivered)
}

// A client whose connection drops with deliveries unacked gets nothing lost: they are back,
// redelivered; what it confirmed is in the queue.
func TestAbruptDisconnect(t *testing.T) {
	b := warren.New()
	defer b.Close()
	url := NewTestServer(t, b)
	r := dialRaw(t, url, 0)
	r.send(1, &wire.QueueDeclare{Queue: "q"})
	r.expect(1, &wire.QueueDeclareOk{})
	r.send(1, &wire.ConfirmSelect{})
	r.expect(1, &wire.ConfirmSelectOk{})
	for i := range 10 {
		r.write(wire.AppendMethod(nil, 1, &wire.BasicPublish{RoutingKey: "q"}))
		r.write(wire.AppendContent(nil, 1, &wire.BasicProperties{}, fmt.Appendf(nil, "%d", i), 0))
		r.expect(1, &wire.BasicAck{})
	}
	r.send(1, &wire.BasicConsume{Queue: "q", ConsumerTag: "c"})
	r.expect(1, &wire.BasicConsumeOk{})
	r.expect(1, &wire.BasicDeliver{})
	r.nc.Close() // mid-stream: ten delivered or buffered, none acked
	q, err := b.Queue("q")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return q.Len() == 10 && q.Unacked() == 0 }, 5*time.Second, time.Millisecond)
}

// Under load, 100 connections of 10 channels each publish with confirms and consume with
// acks for a while; every confirmed message is consumed exactly once, and nothing else.
func TestLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("a second of load")
	}
	b := warren.New()
	defer b.Close()
	url := NewTestServer(t, b)
	const conns, channels = 100, 10
	_, err := b.DeclareQueue("load")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var (
		mu        sync.Mutex
		confirmed = map[string]bool{}
		consumed  = map[string]int{}
		wg        sync.WaitGroup
		done      atomic.Bool
	)
	for i := range conns {
		conn, err := amqp091.Dial(url)
		require.NoError(t, err)
		defer conn.Close()
		for j := range channels {
			ch, err := conn.Channel()
			require.NoError(t, err)
			if j%2 == 0 { // a publisher
				require.NoError(t, ch.Confirm(false))
				wg.Go(func() {
					for n := 0; ctx.Err() == nil; n++ {
						body := fmt.Sprintf("%d.%d.%d", i, j, n)
						dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", "load", false, false,
							amqp091.Publishing{Body: []byte(body)})
						if err != nil {
							t.Errorf("publish: %v", err)
							return
						}
						if ok, err := dc.WaitContext(context.Background()); err != nil || !ok {
							t.Errorf("confirm of %s: %v %v", body, ok, err)
							return
						}
						mu.Lock()
						confirmed[body] = true
						mu.Unlock()
					}
				})
				continue
			}
			require.NoError(t, ch.Qos(16, 0, false))
			deliveries, err := ch.Consume("load", "", false, false, false, false, nil)
			require.NoError(t, err)
			wg.Go(func() {
				for d := range deliveries {
					mu.Lock()
					consumed[string(d.Body)]++
					mu.Unlock()
					if err := d.Ack(false); err != nil {
						if !done.Load() {
							t.Errorf("ack: %v", err)
						}
						return
					}
				}
			})
		}
	}
	<-ctx.Done()
	q, err := b.Queue("load")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return q.Len() == 0 && q.Unacked() == 0 }, 30*time.Second, 10*time.Millisecond, "drained")
	mu.Lock()
	defer mu.Unlock()
	done.Store(true)
	for body := range confirmed {
		require.Equal(t, 1, consumed[body], "%s confirmed: consumed once", body)
	}
	require.Len(t, consumed, len(confirmed), "nothing but what was confirmed")
	t.Logf("%d connections × %d channels: %d messages confirmed and consumed once in 1 s", conns, channels, len(confirmed))
}

// A consumer tag is free again as soon as basic.cancel-ok comes, and no delivery of the
// cancelled consumer follows its cancel-ok: a raw client reuses the tag at once, many times.
func TestCancelOkComesLast(t *testing.T) {
	b := warren.New()
	defer b.Close()
	r := dialRaw(t, NewTestServer(t, b), 0)
	r.send(1, &wire.QueueDeclare{Queue: "q"})
	r.expect(1, &wire.QueueDeclareOk{})
	for i := range 2000 {
		require.NoError(t, b.Publish(context.Background(), "", "q", warren.Message{Body: fmt.Appendf(nil, "%d", i)}))
	}
	for i := range 50 {
		r.send(1, &wire.BasicConsume{Queue: "q", ConsumerTag: "same", NoAck: true})
		r.expect(1, &wire.BasicConsumeOk{})
		r.send(1, &wire.BasicCancel{ConsumerTag: "same"})
		for { // deliveries (method, header, body) until cancel-ok
			f := r.next()
			if f.Type != wire.FrameMethod {
				continue
			}
			m, err := wire.ReadMethod(f.Payload)
			require.NoError(t, err)
			if _, ok := m.(*wire.BasicCancelOk); ok {
				break
			}
			require.IsType(t, &wire.BasicDeliver{}, m, "round %d", i)
		}
		r.send(1, &wire.BasicQos{PrefetchCount: 0}) // a round trip: a stray delivery would come before qos-ok
		f := r.next()
		m, err := wire.ReadMethod(f.Payload)
		require.NoError(t, err)
		require.IsType(t, &wire.BasicQosOk{}, m, "round %d: nothing of the cancelled consumer after its cancel-ok", i)
	}
}

// A stream of publishes in confirm mode, sent at once, gets every publish confirmed once: those
// that a queue took acked (a basic.ack with multiple covering several would do), those its
// reject-publish refused nacked, and no multiple ack covers a nack.
func TestConfirmsOfAStream(t *testing.T) {
	b := warren.New()
	defer b.Close()
	r := dialRaw(t, NewTestServer(t, b), 0)
	r.send(1, &wire.QueueDeclare{Queue: "q", Arguments: warren.Table{"x-max-length": int64(5), "x-overflow": "reject-publish"}})
	r.expect(1, &wire.QueueDeclareOk{})
	r.send(1, &wire.ConfirmSelect{})
	r.expect(1, &wire.ConfirmSelectOk{})
	const n = 12
	var stream []byte
	for i := range n {
		stream = wire.AppendMethod(stream, 1, &wire.BasicPublish{RoutingKey: "q"})
		stream = wire.AppendContent(stream, 1, &wire.BasicProperties{}, fmt.Appendf(nil, "%d", i), 0)
	}
	r.write(stream) // at once: the server reads them together
	outcome := map[uint64]string{}
	frames := 0
	for len(outcome) < n {
		f := r.next()
		m, err := wire.ReadMethod(f.Payload)
		require.NoError(t, err)
		frames++
		switch m := m.(type) {
		case *wire.BasicAck:
			from := m.DeliveryTag
			if m.Multiple {
				from = uint64(len(outcome)) + 1
			}
			for tag := from; tag <= m.DeliveryTag; tag++ {
				require.NotContains(t, outcome, tag, "confirmed once")
				outcome[tag] = "ack"
			}
		case *wire.BasicNack:
			require.False(t, m.Multiple)
			require.NotContains(t, outcome, m.DeliveryTag)
			outcome[m.DeliveryTag] = "nack"
		default:
			t.Fatalf("unexpected %s", m.Name())
		}
	}
	for tag := uint64(1); tag <= n; tag++ {
		want := "ack"
		if tag > 5 {
			want = "nack"
		}
		require.Equal(t, want, outcome[tag], "publish %d", tag)
	}
	t.Logf("%d publishes confirmed in %d frames", n, frames)
}

// A client that goes away while a publish of its waits for room in a full Block queue is
// noticed then, not once room comes (which may be never): its connection ends, and with it
// its consumer on another channel; what it published before stays in the queue. It closes its
// socket or resets it, at once or after more than two heartbeat intervals blocked, silent: the
// server does not check heartbeats while it blocks the connection, as RabbitMQ does not, but
// it still sends its own.
func TestGoneWhileBlocked(t *testing.T) {
	blockable := warren.Table{"capabilities": warren.Table{"connection.blocked": true}}
	for _, tc := range []struct {
		name      string
		heartbeat uint16        // seconds; 0 for none
		silence   time.Duration // how long the client waits, blocked, before it goes
		reset     bool          // it goes with an RST rather than a FIN
	}{
		{"closed", 0, 0, false},
		{"reset", 0, 0, true},
		{"closed after two heartbeat intervals", 1, 2500 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := warren.New()
			defer b.Close()
			q, err := b.DeclareQueue("bounded", warren.MaxLength(2), warren.Overflow(warren.Block))
			require.NoError(t, err)
			side, err := b.DeclareQueue("side")
			require.NoError(t, err)
			r := dialRawAs(t, NewTestServer(t, b), tc.heartbeat, blockable)
			r.send(1, &wire.ConfirmSelect{})
			r.expect(1, &wire.ConfirmSelectOk{})
			for _, body := range []string{"1", "2"} {
				r.write(appendPublish(nil, 1, "bounded", []byte(body)))
				r.expect(1, &wire.BasicAck{})
			}
			r.send(2, &wire.ChannelOpen{})
			r.expect(2, &wire.ChannelOpenOk{})
			r.send(2, &wire.BasicConsume{Queue: "side", ConsumerTag: "c"})
			r.expect(2, &wire.BasicConsumeOk{})
			require.Equal(t, 1, side.ConsumerCount())
			r.write(appendPublish(nil, 1, "bounded", []byte("3")))
			r.expect(0, &wire.ConnectionBlocked{})

			if tc.silence > 0 {
				r.nc.SetReadDeadline(time.Now().Add(tc.silence))
				heartbeats := 0
				for {
					f, err := r.fr.Read()
					if err != nil {
						var ne net.Error
						require.True(t, errors.As(err, &ne) && ne.Timeout(), "the server did not close: %v", err)
						break
					}
					require.Equal(t, uint8(wire.FrameHeartbeat), f.Type, "nothing but heartbeats while blocked")
					heartbeats++
				}
				require.Positive(t, heartbeats, "the server's heartbeats go on while it blocks")
				require.Equal(t, 1, side.ConsumerCount(), "not disconnected for missed heartbeats while blocked")
			}
			if tc.reset {
				require.NoError(t, r.nc.(*net.TCPConn).SetLinger(0))
			}
			r.nc.Close()
			require.Eventually(t, func() bool { return side.ConsumerCount() == 0 }, 5*time.Second, time.Millisecond,
				"the connection ends while its publish still waits")
			require.Equal(t, 2, q.Len(), "what was published before stays, what waited does not")
			for _, want := range []string{"1", "2"} {
				d, err := q.Get(context.Background(), warren.AutoAck())
				require.NoError(t, err)
				require.Equal(t, want, string(d.Message.Body))
			}
		})
	}
}

// A client that goes on sending while a publish of its waits for room is not taken for gone:
// what it sends meanwhile (heartbeats, methods on another channel, more than the server's read
// buffer holds) is not run while the publish waits, and runs once it got room, in order.
func TestTalkingWhileBlocked(t *testing.T) {
	for _, heartbeat := range []uint16{0, 1} { // without heartbeats nothing re-arms the read deadline
		t.Run(fmt.Sprintf("heartbeat %d", heartbeat), func(t *testing.T) {
			blockable := warren.Table{"capabilities": warren.Table{"connection.blocked": true}}
			b := warren.New()
			defer b.Close()
			q, err := b.DeclareQueue("bounded", warren.MaxLength(1), warren.Overflow(warren.Block))
			require.NoError(t, err)
			r := dialRawAs(t, NewTestServer(t, b), heartbeat, blockable)
			r.send(1, &wire.ConfirmSelect{})
			r.expect(1, &wire.ConfirmSelectOk{})
			r.send(2, &wire.ChannelOpen{})
			r.expect(2, &wire.ChannelOpenOk{})
			r.write(appendPublish(nil, 1, "bounded", []byte("1")))
			r.expect(1, &wire.BasicAck{})
			r.write(appendPublish(nil, 1, "bounded", []byte("2")))
			r.expect(0, &wire.ConnectionBlocked{})

			large := bytes.Repeat([]byte("x"), 100<<10) // more than the server's 64 KiB read buffer
			stream := wire.AppendHeartbeat(nil)
			stream = wire.AppendMethod(stream, 2, &wire.QueueDeclare{Queue: "side"})
			stream = appendPublish(stream, 2, "side", large)
			stream = wire.AppendHeartbeat(stream)
			stream = appendPublish(stream, 1, "side", []byte("3")) // confirmed on channel 1
			stream = wire.AppendMethod(stream, 2, &wire.BasicGet{Queue: "side", NoAck: true})
			r.write(stream)
			require.Never(t, func() bool {
				_, err := b.Queue("side")
				return err == nil
			}, 200*time.Millisecond, 10*time.Millisecond, "nothing the client sent runs while its publish waits")

			d, err := q.Get(context.Background(), warren.AutoAck())
			require.NoError(t, err)
			require.Equal(t, "1", string(d.Message.Body))
			r.expect(0, &wire.ConnectionUnblocked{})
			require.Equal(t, uint64(2), r.expect(1, &wire.BasicAck{}).(*wire.BasicAck).DeliveryTag, "the publish that waited")
			r.expect(2, &wire.QueueDeclareOk{})
			require.Equal(t, uint64(3), r.expect(1, &wire.BasicAck{}).(*wire.BasicAck).DeliveryTag, "the publish sent while it waited")
			got := r.expect(2, &wire.BasicGetOk{}).(*wire.BasicGetOk)
			require.Equal(t, uint32(1), got.MessageCount, "the get ran after both publishes to side")
			r.next() // the content header
			require.Equal(t, large, r.next().Payload, "the large message, first in side")

			require.Equal(t, 1, q.Len(), "the publish that waited is in")
			side, err := b.Queue("side")
			require.NoError(t, err)
			require.Equal(t, 1, side.Len())
		})
	}
}

// A client blocked for less than half a heartbeat interval, and silent once unblocked, is
// dropped after two intervals as any silent client is: the heartbeat deadline, lifted while it
// was blocked, is set again.
func TestSilentAfterBlocked(t *testing.T) {
	b := warren.New()
	defer b.Close()
	q, err := b.DeclareQueue("bounded", warren.MaxLength(1), warren.Overflow(warren.Block))
	require.NoError(t, err)
	r := dialRawAs(t, NewTestServer(t, b), 1, warren.Table{"capabilities": warren.Table{"connection.blocked": true}})
	r.send(1, &wire.ConfirmSelect{})
	r.expect(1, &wire.ConfirmSelectOk{})
	r.write(appendPublish(nil, 1, "bounded", []byte("1")))
	r.expect(1, &wire.BasicAck{})
	r.write(appendPublish(nil, 1, "bounded", []byte("2")))
	r.expect(0, &wire.ConnectionBlocked{})
	_, err = q.Get(context.Background(), warren.AutoAck())
	require.NoError(t, err)
	r.expect(0, &wire.ConnectionUnblocked{})
	r.expect(1, &wire.BasicAck{})

	r.nc.SetReadDeadline(time.Now().Add(4 * time.Second)) // the server's two intervals, and some
	for {
		f, err := r.fr.Read()
		if err != nil {
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "the silent client was not dropped: %v", err)
			return // dropped
		}
		require.Contains(t, []uint8{wire.FrameHeartbeat, wire.FrameMethod}, f.Type, "heartbeats, then connection.close")
	}
}

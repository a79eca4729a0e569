package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// AsyncWindow is the most unconfirmed publishes a producer that streams with asynchronous
// confirms keeps in flight: JetStream's PublishAsync (nats.go's default is 4000) and warren's
// PublishDeferred on a durable broker.
var AsyncWindow = 4000

func init() {
	register(Spec{
		Info: Info{
			Name: "nats-core", Ordered: true,
			NA: map[string]string{
				"W3": "core NATS keeps nothing for absent subscribers: no backlog",
				"W4": "core NATS has no acknowledgements to withhold and return",
				"S1": "core NATS keeps no backlog",
				"D1": "core NATS is at most once: a publisher has no confirm to wait for",
			},
			Setup: "nats-server embedded (`DontListen`), clients over `nats.InProcessServer` (one connection per producer and per consumer); consumers are `QueueSubscribeSync` members of one queue group with pending limits lifted (`SetPendingLimits(-1, -1)`, `SyncQueueLen` 2M, and the server's `MaxPending` raised to 1 GiB) so that a slow subscriber is not cut off; at-most-once: no acknowledgement (W1's \"ack each\" is not done); `Flush` after the last publish",
		},
		Open: func() (System, error) { return newNATS(natsCore) },
	})
	register(Spec{
		Info: Info{
			Name: "nats-jetstream-mem", Ordered: true, Acks: true, Backlog: true,
			NA: map[string]string{
				"S2": "JetStream routes by stream subjects and consumer filters, not per-queue bindings: no like-for-like topology of 10k–100k bindings",
			},
			Setup: "the same embedded server with JetStream; one stream per queue (`MemoryStorage`, `WorkQueuePolicy`) and one durable pull consumer (`AckExplicitPolicy`, `MaxAckPending` = prefetch × consumers, `AckWait` 2 min); publishers use `PublishAsync` (at most 4000 unconfirmed, nats.go's default; `WithStallWait(1 min)` so that a full window waits for room instead of failing after 200 ms) and wait for every confirm at the end; consumers iterate `Consumer.Messages(PullMaxMessages(prefetch))`, `Msg.Ack()` each, `Msg.Nak()` to requeue",
		},
		Open: func() (System, error) { return newNATS(natsMem) },
	})
	fileSetup := "the same embedded server and clients as `nats-jetstream-mem`, with the stream in `FileStorage` in the server's `StoreDir`, a fresh directory made for the run with `os.MkdirTemp` (in `$TMPDIR`, else /tmp; removed after the run); "
	register(Spec{
		Info: Info{
			Name: "nats-jetstream-file", Ordered: true, Acks: true, Backlog: true, Durable: true,
			Setup: fileSetup + "the server's default sync policy: every message is written to the OS before it is acknowledged (the file store flushes in place) and the files are fsynced every `sync_interval`, 2 minutes by default. W1 publishes asynchronously as `nats-jetstream-mem` does (at most 4000 unconfirmed, all confirmed at the end), as warren's durable W1 does with `PublishDeferred`; D1's and D3's publishers use the synchronous `JetStream.Publish`, which waits for each acknowledgement",
		},
		Open: func() (System, error) { return newNATS(natsFile) },
	})
	register(Spec{
		Info: Info{
			Name: "nats-jetstream-file-sync", Ordered: true, Acks: true, Backlog: true, Durable: true,
			Setup: fileSetup + "the server's `SyncAlways` option (`jetstream { sync_interval: always }` in a configuration file): the message block is fsynced after every write, before the publish is acknowledged. Publishing as `nats-jetstream-file`",
		},
		Open: func() (System, error) { return newNATS(natsFileSync) },
	})
}

// natsMode is which of the NATS systems a natsSys is.
type natsMode int

const (
	natsCore     natsMode = iota // core NATS, no JetStream
	natsMem                      // JetStream, memory storage
	natsFile                     // JetStream, file storage, the default sync policy
	natsFileSync                 // JetStream, file storage, SyncAlways
)

type natsSys struct {
	js      bool
	mode    natsMode
	ns      *server.Server
	dir     string
	nc      *nats.Conn // control connection
	jsc     jetstream.JetStream
	mu      sync.Mutex
	conns   []*nats.Conn
	unacked map[string]int

	// S2
	topicPub  *nats.Conn
	topicSubs []*nats.Subscription
}

func newNATS(mode natsMode) (*natsSys, error) {
	js := mode != natsCore
	tmp := ""
	if mode == natsFile || mode == natsFileSync {
		tmp = DurableDir
	}
	dir, err := os.MkdirTemp(tmp, "warren-bench-nats-")
	if err != nil {
		return nil, err
	}
	opts := &server.Options{
		// SyncAlways: fsync every write to a stream's message block (what the configuration's
		// `sync_interval: always` sets). Without it the server syncs every SyncInterval, 2
		// minutes by default.
		SyncAlways: mode == natsFileSync,
		DontListen: true, NoLog: true, NoSigs: true,
		JetStream: js, StoreDir: dir,
		// The server's own bound on what it buffers for one client (64 MB by default): a
		// consumer behind by more is a slow consumer and loses messages. Raised, as the
		// subscriptions' pending limits are, so that core NATS is measured delivering.
		MaxPending: 1 << 30,
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, err
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("nats: server not ready")
	}
	s := &natsSys{js: js, mode: mode, ns: ns, dir: dir, unacked: map[string]int{}}
	if s.nc, err = s.connect(); err != nil {
		s.Close()
		return nil, err
	}
	if js {
		if s.jsc, err = jetstream.New(s.nc); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

func (s *natsSys) connect(opts ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect("nats://in-process", append([]nats.Option{nats.InProcessServer(s.ns), nats.MaxReconnects(0)}, opts...)...)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.conns = append(s.conns, nc)
	s.mu.Unlock()
	return nc, nil
}

func subject(name string) string { return "q." + name }
func stream(name string) string  { return "Q_" + name }

func (s *natsSys) DeclareQueue(name string, cfg Config) error {
	if !s.js {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	storage := jetstream.MemoryStorage
	if s.mode == natsFile || s.mode == natsFileSync {
		storage = jetstream.FileStorage
	}
	_, err := s.jsc.CreateStream(ctx, jetstream.StreamConfig{
		Name: stream(name), Subjects: []string{subject(name)},
		Storage: storage, Retention: jetstream.WorkQueuePolicy,
	})
	if err != nil {
		return err
	}
	maxAck := cfg.MaxUnacked
	if maxAck <= 0 {
		maxAck = 1000 // the server's default
	}
	_, err = s.jsc.CreateOrUpdateConsumer(ctx, stream(name), jetstream.ConsumerConfig{
		Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: maxAck,
		AckWait: 2 * time.Minute,
	})
	return err
}

func (s *natsSys) Producer() (Producer, error) {
	nc, err := s.connect()
	if err != nil {
		return nil, err
	}
	if !s.js {
		return &natsProducer{nc: nc}, nil
	}
	p := &jsProducer{nc: nc, stall: jetstream.WithStallWait(time.Minute)}
	p.js, err = jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(AsyncWindow),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
			p.errs.Add(1)
			p.lastErr.Store(&err)
		}))
	return p, err
}

// SyncProducer is a JetStream producer whose Publish is the synchronous JetStream.Publish: it
// returns once the server acknowledged (stored) the message. Core NATS has none.
func (s *natsSys) SyncProducer() (Producer, error) {
	if !s.js {
		return nil, ErrUnsupported
	}
	nc, err := s.connect()
	if err != nil {
		return nil, err
	}
	// Publish without a deadline of its own waits for this long at most.
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(time.Minute))
	if err != nil {
		return nil, err
	}
	return &jsSyncProducer{js: js}, nil
}

// DiskUsage is the bytes and files under the server's store directory.
func (s *natsSys) DiskUsage() (int64, int, error) {
	if s.mode != natsFile && s.mode != natsFileSync {
		return 0, 0, nil
	}
	return DirUsage(s.dir)
}

func (s *natsSys) Consumer(name string, prefetch int) (Consumer, error) {
	// A core NATS consumer's synchronous subscription buffers in a channel of SyncQueueLen
	// messages (65536 by default) whatever its pending limits, and drops beyond as a slow
	// consumer; a channel of 2M (16 MB) per consumer holds a W1/W2 producer's lead.
	var opts []nats.Option
	if !s.js {
		opts = append(opts, nats.SyncQueueLen(1<<21))
	}
	nc, err := s.connect(opts...)
	if err != nil {
		return nil, err
	}
	if !s.js {
		sub, err := nc.QueueSubscribeSync(subject(name), "g."+name)
		if err != nil {
			return nil, err
		}
		if err := sub.SetPendingLimits(-1, -1); err != nil {
			return nil, err
		}
		// The subscription is known to the server once the round trip returns.
		if err := nc.Flush(); err != nil {
			return nil, err
		}
		return &natsConsumer{sub: sub}, nil
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, stream(name), "c")
	if err != nil {
		return nil, err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(prefetch))
	if err != nil {
		return nil, err
	}
	return &jsConsumer{it: it}, nil
}

func (s *natsSys) Close() error {
	s.mu.Lock()
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	for _, nc := range conns {
		nc.Close()
	}
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	return os.RemoveAll(s.dir)
}

// ---- core ----

type natsProducer struct{ nc *nats.Conn }

func (p *natsProducer) Publish(name string, body []byte) error {
	return p.nc.Publish(subject(name), body)
}

func (p *natsProducer) Flush() error { return p.nc.FlushTimeout(time.Minute) }
func (p *natsProducer) Close() error { return nil }

type natsConsumer struct{ sub *nats.Subscription }

func (c *natsConsumer) Next(ctx context.Context) (Delivery, error) {
	m, err := c.sub.NextMsgWithContext(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return Delivery{}, context.Cause(ctx)
		}
		return Delivery{}, err
	}
	return Delivery{Body: m.Data}, nil
}

func (c *natsConsumer) Ack(Delivery) error       { return nil }
func (c *natsConsumer) Requeue([]Delivery) error { return ErrUnsupported }
func (c *natsConsumer) Close() error             { return c.sub.Unsubscribe() }

// ---- JetStream ----

type jsProducer struct {
	nc      *nats.Conn
	stall   jetstream.PublishOpt // wait for room in the window rather than fail after 200 ms
	js      jetstream.JetStream
	errs    atomic.Int64
	lastErr atomic.Pointer[error]
}

func (p *jsProducer) Publish(name string, body []byte) error {
	_, err := p.js.PublishAsync(subject(name), body, p.stall)
	return err
}

func (p *jsProducer) Flush() error {
	select {
	case <-p.js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		return errors.New("jetstream: publish confirms did not complete")
	}
	if n := p.errs.Load(); n > 0 {
		return fmt.Errorf("jetstream: %d publishes failed, last: %v", n, *p.lastErr.Load())
	}
	return nil
}

func (p *jsProducer) Close() error { return nil }

type jsSyncProducer struct{ js jetstream.JetStream }

func (p *jsSyncProducer) Publish(name string, body []byte) error {
	_, err := p.js.Publish(context.Background(), subject(name), body)
	return err
}

func (p *jsSyncProducer) Flush() error { return nil } // each Publish waited for its acknowledgement
func (p *jsSyncProducer) Close() error { return nil }

type jsConsumer struct{ it jetstream.MessagesContext }

func (c *jsConsumer) Next(ctx context.Context) (Delivery, error) {
	m, err := c.it.Next(jetstream.NextContext(ctx))
	for errors.Is(err, jetstream.ErrNoHeartbeat) {
		// Reported, not fatal: the iterator has re-issued its pull and goes on (nats.go's
		// documented handling). It happens when the process was starved for a while.
		m, err = c.it.Next(jetstream.NextContext(ctx))
	}
	if err != nil {
		if ctx.Err() != nil {
			return Delivery{}, context.Cause(ctx)
		}
		return Delivery{}, err
	}
	return Delivery{Body: m.Data(), h: m}, nil
}

func (c *jsConsumer) Ack(d Delivery) error { return d.h.(jetstream.Msg).Ack() }

func (c *jsConsumer) Requeue(ds []Delivery) error {
	for _, d := range ds {
		if err := d.h.(jetstream.Msg).Nak(); err != nil {
			return err
		}
	}
	return nil
}

func (c *jsConsumer) Close() error {
	c.it.Stop()
	return nil
}

// ---- S2 (core NATS): one subscription per binding ----

// natsPattern turns an AMQP topic pattern into a NATS subject: "#" (used only last) is ">".
func natsPattern(p string) string {
	if strings.HasSuffix(p, ".#") {
		return strings.TrimSuffix(p, "#") + ">"
	}
	return p
}

func (s *natsSys) SetupTopic(patterns []string, _ int) error {
	if s.js {
		return ErrUnsupported
	}
	sub, err := s.connect()
	if err != nil {
		return err
	}
	s.topicSubs = make([]*nats.Subscription, len(patterns))
	for i, p := range patterns {
		if s.topicSubs[i], err = sub.SubscribeSync(natsPattern(p)); err != nil {
			return err
		}
		if err := s.topicSubs[i].SetPendingLimits(-1, -1); err != nil {
			return err
		}
	}
	if err := sub.FlushTimeout(time.Minute); err != nil {
		return err
	}
	s.topicPub, err = s.connect()
	return err
}

func (s *natsSys) PublishTopic(key string, body []byte) error {
	return s.topicPub.Publish(key, body)
}

// FlushTopic returns when the server has processed every publish so far: it has matched each
// against the subscriptions and queued it for the subscriber.
func (s *natsSys) FlushTopic() error { return s.topicPub.FlushTimeout(time.Minute) }

func (s *natsSys) DrainTopic(perBinding []int, _ int) ([][]uint64, error) {
	out := make([][]uint64, len(s.topicSubs))
	for i, sub := range s.topicSubs {
		for range perBinding[i] {
			m, err := sub.NextMsg(30 * time.Second)
			if err != nil {
				return out, fmt.Errorf("subscription %d: %w", i, err)
			}
			out[i] = append(out[i], SeqOf(m.Data))
		}
	}
	return out, nil
}

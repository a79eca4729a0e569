package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// RabbitURL is where the rabbitmq system connects (bench/rabbitmq.sh starts a node there).
var RabbitURL = "amqp://guest:guest@127.0.0.1:5672/"

// RabbitConfirmWindow is the most unconfirmed publishes a RabbitMQ producer keeps in flight
// (cmd/bench's -rabbit-window; the systems' Setup texts say 4000).
var RabbitConfirmWindow = 4000

func init() {
	register(Spec{
		Info: Info{
			Name: "rabbitmq", Ordered: true, Acks: true, Backlog: true, ClientOnly: true,
			Setup: "RabbitMQ from Debian's `rabbitmq-server` package on 127.0.0.1 (`bench/rabbitmq.sh`), `amqp091-go`; one connection and channel per producer and per consumer; classic queues, not durable, transient messages (nothing written to disk on purpose); publisher confirms with at most 4000 unconfirmed per producer (`-rabbit-window`), waited for at the end; `basic.qos(prefetch)`, `basic.consume` with manual ack, `basic.ack` per message, `basic.nack(multiple, requeue)` to requeue. Allocations and peak RSS are the client process's only; the node's RSS after W3's publish phase is reported apart",
		},
		Open: func() (System, error) { return openRabbit(false) },
	})
	register(Spec{
		Info: Info{
			Name: "rabbitmq-durable", Ordered: true, Acks: true, Backlog: true, ClientOnly: true, Durable: true,
			Setup: "the same RabbitMQ node and client as `rabbitmq` (its data directory under `$TMPDIR`, else /tmp), with durable classic queues and persistent messages (`DeliveryMode` 2); publisher confirms with at most 4000 unconfirmed per producer in W1 (RabbitMQ confirms a persistent message once it is fsynced), and in D1 and D3 every `Publish` waits for its own confirm before it returns, as warren's `Publish` does. Consumers as `rabbitmq`. Allocations and peak RSS are the client process's only",
		},
		Open: func() (System, error) { return openRabbit(true) },
	})
}

// rabbitSys is amqp091-go against an AMQP 0-9-1 server at url: the RabbitMQ node (rabbitmq,
// rabbitmq-durable) or a warren broker's contrib/amqp server in this process (warren-amqp).
type rabbitSys struct {
	url     string
	durable bool // durable queues, persistent messages
	prefix  string
	conn    *amqp.Connection
	ch      *amqp.Channel
	mu      sync.Mutex
	conns   []*amqp.Connection
	queues  []string

	// S2
	topicQueues []string
	topicPub    *rabbitProducer
}

// ProbeRabbit reports whether RabbitMQ answers at RabbitURL.
func ProbeRabbit() error {
	conn, err := amqp.DialConfig(RabbitURL, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	if err != nil {
		return err
	}
	return conn.Close()
}

// openRabbit opens the rabbitmq (or, durable, the rabbitmq-durable) system on the node at
// RabbitURL; a node that does not answer skips it.
func openRabbit(durable bool) (*rabbitSys, error) {
	s, err := newRabbit(RabbitURL, durable)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot connect to %s: %v", ErrSkip, RabbitURL, err)
	}
	return s, nil
}

// newRabbit connects to the server at url.
func newRabbit(url string, durable bool) (*rabbitSys, error) {
	s := &rabbitSys{url: url, durable: durable, prefix: fmt.Sprintf("wb%d.", os.Getpid())}
	conn, err := s.dial()
	if err != nil {
		return nil, err
	}
	s.conn = conn
	if s.ch, err = conn.Channel(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *rabbitSys) dial() (*amqp.Connection, error) {
	conn, err := amqp.DialConfig(s.url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.conns = append(s.conns, conn)
	s.mu.Unlock()
	return conn, nil
}

// RabbitQueueExpires is how long after its last use a queue the bench declares deletes
// itself (x-expires), so that a crashed run leaves nothing behind for long (a durable one
// too). Publishing is no use: a fill must take less.
var RabbitQueueExpires = 10 * time.Minute

// queueArgs are the arguments of every queue the bench declares: a classic queue that
// expires after RabbitQueueExpires.
func queueArgs() amqp.Table {
	return amqp.Table{"x-queue-type": "classic", "x-expires": int32(RabbitQueueExpires.Milliseconds())}
}

func (s *rabbitSys) declare(ch *amqp.Channel, name string) error {
	if _, err := ch.QueueDeclare(s.prefix+name, s.durable, false, false, false, queueArgs()); err != nil {
		return err
	}
	s.mu.Lock()
	s.queues = append(s.queues, s.prefix+name)
	s.mu.Unlock()
	return nil
}

func (s *rabbitSys) DeclareQueue(name string, _ Config) error { return s.declare(s.ch, name) }

func (s *rabbitSys) Producer() (Producer, error) { return s.producer(false) }

// SyncProducer is a producer whose Publish waits for its confirm.
func (s *rabbitSys) SyncProducer() (Producer, error) { return s.producer(true) }

func (s *rabbitSys) producer(each bool) (Producer, error) {
	conn, err := s.dial()
	if err != nil {
		return nil, err
	}
	p, err := newRabbitProducer(conn, s.prefix)
	if err != nil {
		return nil, err
	}
	p.each, p.persistent = each, s.durable
	return p, nil
}

func (s *rabbitSys) Consumer(name string, prefetch int) (Consumer, error) {
	conn, err := s.dial()
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return nil, err
	}
	dch, err := ch.Consume(s.prefix+name, "", false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	return &rabbitConsumer{ch: ch, d: dch}, nil
}

func (s *rabbitSys) Close() error {
	if s.ch != nil {
		for _, q := range s.queues {
			_, _ = s.ch.QueueDelete(q, false, false, false)
		}
		if s.topicQueues != nil {
			_ = s.ch.ExchangeDelete(s.prefix+topicExchange, false, false)
		}
	}
	s.mu.Lock()
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	return nil
}

// ServerRSS returns the RabbitMQ node's resident set size now.
func (s *rabbitSys) ServerRSS() (int64, bool) { return rabbitServerRSS() }

// rabbitServerRSS returns the RabbitMQ node's resident set size now.
func rabbitServerRSS() (int64, bool) {
	pid, err := RabbitPID()
	if err != nil {
		return 0, false
	}
	return procStatusBytes(fmt.Sprintf("/proc/%d/status", pid), "VmRSS:")
}

// rabbitBase is the directory of rabbitmq.sh's node: its pid file, data and logs.
func rabbitBase() string {
	if dir := os.Getenv("WARREN_BENCH_RABBITMQ_DIR"); dir != "" {
		return dir
	}
	return filepath.Join(os.TempDir(), "warren-bench-rabbitmq")
}

// RabbitDataDir is the data directory of rabbitmq.sh's node (RABBITMQ_MNESIA_BASE): its
// queues' indexes and message stores, and its metadata.
func RabbitDataDir() string { return filepath.Join(rabbitBase(), "mnesia") }

// RabbitPID is the process id of rabbitmq.sh's node: the Erlang VM (beam.smp) that holds its
// queues. It is the pid the node's pid file names, if that process is a beam.smp; else the one
// beam.smp process whose environment names the node's data directory (reading another
// user's environment needs root).
func RabbitPID() (int, error) {
	if b, err := os.ReadFile(filepath.Join(rabbitBase(), "rabbitmq.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && isBeam(pid) {
			return pid, nil
		}
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	want := []byte("RABBITMQ_MNESIA_BASE=" + RabbitDataDir() + "\x00")
	var found []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !isBeam(pid) {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err == nil && bytes.Contains(env, want) {
			found = append(found, pid)
		}
	}
	if len(found) != 1 {
		return 0, fmt.Errorf("rabbitmq: %d beam.smp processes with RABBITMQ_MNESIA_BASE=%s, want one (is rabbitmq.sh's node running?)", len(found), RabbitDataDir())
	}
	return found[0], nil
}

// isBeam says whether process pid is an Erlang VM.
func isBeam(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.TrimSpace(string(b)) == "beam.smp"
}

// ---- producer: publisher confirms with a window ----

type rabbitProducer struct {
	ch         *amqp.Channel
	prefix     string
	each       bool // Publish waits for its own confirm
	persistent bool // DeliveryMode 2

	mu        sync.Mutex
	cond      *sync.Cond
	published uint64
	confirmed uint64
	nacked    uint64
	closed    bool
	done      chan struct{}
}

func newRabbitProducer(conn *amqp.Connection, prefix string) (*rabbitProducer, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	p := &rabbitProducer{ch: ch, prefix: prefix, done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, RabbitConfirmWindow+1))
	go func() {
		defer close(p.done)
		for c := range confirms {
			p.mu.Lock()
			p.confirmed++
			if !c.Ack {
				p.nacked++
			}
			p.cond.Broadcast()
			p.mu.Unlock()
		}
		p.mu.Lock()
		p.closed = true
		p.cond.Broadcast()
		p.mu.Unlock()
	}()
	return p, nil
}

func (p *rabbitProducer) publish(exchange, key string, body []byte) error {
	p.mu.Lock()
	for p.published-p.confirmed >= uint64(RabbitConfirmWindow) && !p.closed {
		p.cond.Wait()
	}
	closed := p.closed
	p.published++
	p.mu.Unlock()
	if closed {
		return errors.New("rabbitmq: channel closed")
	}
	msg := amqp.Publishing{Body: body}
	if p.persistent {
		msg.DeliveryMode = amqp.Persistent
	}
	if err := p.ch.PublishWithContext(context.Background(), exchange, key, false, false, msg); err != nil {
		return err
	}
	if p.each {
		return p.Flush()
	}
	return nil
}

func (p *rabbitProducer) Publish(name string, body []byte) error {
	return p.publish("", p.prefix+name, body)
}

func (p *rabbitProducer) Flush() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.confirmed < p.published && !p.closed {
		p.cond.Wait()
	}
	if p.confirmed < p.published {
		return errors.New("rabbitmq: channel closed before every publish was confirmed")
	}
	if p.nacked > 0 {
		return fmt.Errorf("rabbitmq: %d publishes nacked", p.nacked)
	}
	return nil
}

func (p *rabbitProducer) Close() error { return p.ch.Close() }

// ---- consumer ----

type rabbitConsumer struct {
	ch *amqp.Channel
	d  <-chan amqp.Delivery
}

func (c *rabbitConsumer) Next(ctx context.Context) (Delivery, error) {
	select {
	case d, ok := <-c.d:
		if !ok {
			return Delivery{}, errClosed
		}
		return Delivery{Body: d.Body, Tag: d.DeliveryTag, Redelivered: d.Redelivered}, nil
	case <-ctx.Done():
		return Delivery{}, context.Cause(ctx)
	}
}

func (c *rabbitConsumer) Ack(d Delivery) error { return c.ch.Ack(d.Tag, false) }

func (c *rabbitConsumer) Requeue(ds []Delivery) error {
	if len(ds) == 0 {
		return nil
	}
	return c.ch.Nack(ds[len(ds)-1].Tag, true, true)
}

func (c *rabbitConsumer) Close() error { return c.ch.Close() }

// ---- S2: a topic exchange ----

func (s *rabbitSys) SetupTopic(patterns []string, queues int) error {
	x := s.prefix + topicExchange
	if err := s.ch.ExchangeDeclare(x, "topic", s.durable, false, false, false, nil); err != nil {
		return err
	}
	s.topicQueues = make([]string, queues)
	for i := range queues {
		s.topicQueues[i] = fmt.Sprintf("t%d", i)
	}
	// Declarations and bindings are one round trip each: spread them over a few channels.
	const workers = 8
	parallel := func(n int, f func(ch *amqp.Channel, i int) error) error {
		var wg sync.WaitGroup
		errs := make([]error, workers)
		for w := range workers {
			wg.Go(func() {
				ch, err := s.conn.Channel()
				if err != nil {
					errs[w] = err
					return
				}
				defer ch.Close()
				for i := w; i < n; i += workers {
					if err := f(ch, i); err != nil {
						errs[w] = err
						return
					}
				}
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	if err := parallel(queues, func(ch *amqp.Channel, i int) error { return s.declare(ch, s.topicQueues[i]) }); err != nil {
		return err
	}
	if err := parallel(len(patterns), func(ch *amqp.Channel, i int) error {
		return ch.QueueBind(s.prefix+s.topicQueues[i%queues], patterns[i], x, false, nil)
	}); err != nil {
		return err
	}
	conn, err := s.dial()
	if err != nil {
		return err
	}
	s.topicPub, err = newRabbitProducer(conn, s.prefix)
	if err == nil {
		s.topicPub.persistent = s.durable
	}
	return err
}

func (s *rabbitSys) PublishTopic(key string, body []byte) error {
	return s.topicPub.publish(s.prefix+topicExchange, key, body)
}

// FlushTopic waits for every publisher confirm: a confirmed message has been routed and
// enqueued.
func (s *rabbitSys) FlushTopic() error { return s.topicPub.Flush() }

func (s *rabbitSys) DrainTopic(perBinding []int, queues int) ([][]uint64, error) {
	want := perQueue(perBinding, queues)
	out := make([][]uint64, queues)
	ch, err := s.conn.Channel()
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	for q := range queues {
		if want[q] == 0 {
			continue
		}
		tag := fmt.Sprintf("drain%d", q) // a tag per queue, for a reader of the broker's logs
		dch, err := ch.Consume(s.prefix+s.topicQueues[q], tag, true, false, false, false, nil)
		if err != nil {
			return out, err
		}
		for len(out[q]) < want[q] {
			select {
			case d := <-dch:
				out[q] = append(out[q], SeqOf(d.Body))
			case <-time.After(30 * time.Second):
				return out, fmt.Errorf("queue %d: %d of %d messages", q, len(out[q]), want[q])
			}
		}
		if err := ch.Cancel(tag, false); err != nil {
			return out, err
		}
		for d := range dch { // deliveries in flight before the cancel took effect
			out[q] = append(out[q], SeqOf(d.Body))
		}
	}
	return out, nil
}

// perQueue is how many messages each of queues queues holds when perBinding[i] were routed
// through binding i, which leads to queue i % queues.
func perQueue(perBinding []int, queues int) []int {
	want := make([]int, queues)
	for i, n := range perBinding {
		want[i%queues] += n
	}
	return want
}

// RabbitVersion is the version the RabbitMQ node at RabbitURL reports, or "".
func RabbitVersion() string {
	conn, err := amqp.DialConfig(RabbitURL, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	if err != nil {
		return ""
	}
	defer conn.Close()
	v, _ := conn.Properties["version"].(string)
	return v
}

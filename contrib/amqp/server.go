// Package amqp makes a warren broker speak AMQP 0-9-1: existing RabbitMQ clients (amqp091-go,
// pika, amqplib, …) connect to a [Server] as they would to RabbitMQ, and their exchanges,
// queues, publishes and consumers are the broker's.
//
// A connection is a warren owner ([warren.NewOwner]): its exclusive queues are its own and
// are deleted when it closes. A channel is an owner derived from it: closing the channel (or
// the connection) returns what its consumers and gets hold, and channel.close-ok is sent once
// it is back in its queues. Delivery tags are per channel, as AMQP says.
//
// What the server does not implement is refused with RabbitMQ's NOT_IMPLEMENTED (540) rather
// than ignored, and it advertises only the capabilities it implements.
package amqp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/warrenmq/warren"
)

// Server serves AMQP 0-9-1 connections for warren brokers, one per virtual host.
type Server struct {
	cfg config

	mu     sync.Mutex
	lns    []net.Listener
	conns  map[*conn]struct{}
	closed bool
	ctx    context.Context // the owner every connection is derived from; ends with Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type config struct {
	vhosts         map[string]*warren.Broker
	users          map[string]string
	frameMax       uint32
	channelMax     uint16
	heartbeat      time.Duration
	maxMessageSize uint64
	tls            *tls.Config
	logger         *slog.Logger
}

// Option configures a [Server].
type Option func(*config)

// VirtualHost serves b as virtual host name (besides "/", which [NewServer]'s broker is).
func VirtualHost(name string, b *warren.Broker) Option {
	return func(c *config) { c.vhosts[name] = b }
}

// Users sets who may connect, by user name and password (PLAIN and AMQPLAIN). Default:
// guest/guest, as RabbitMQ's default user.
func Users(passwords map[string]string) Option {
	return func(c *config) { c.users = passwords }
}

// FrameMax sets the largest frame the server accepts and proposes (default 131072, RabbitMQ's;
// at least 4096).
func FrameMax(n uint32) Option { return func(c *config) { c.frameMax = max(n, 4096) } }

// ChannelMax sets the most channels a connection may open (default 2047, RabbitMQ's).
func ChannelMax(n uint16) Option { return func(c *config) { c.channelMax = n } }

// Heartbeat sets the heartbeat interval the server proposes (default 60 s, RabbitMQ's; 0 for
// none). The client's choice, if lower and not 0, wins.
func Heartbeat(d time.Duration) Option { return func(c *config) { c.heartbeat = d } }

// MaxMessageSize sets the largest message body a publish may carry (default 128 MiB,
// RabbitMQ's); a larger one closes its channel with PRECONDITION_FAILED (406).
func MaxMessageSize(n uint64) Option { return func(c *config) { c.maxMessageSize = n } }

// TLS makes the server speak TLS with cfg (amqps).
func TLS(cfg *tls.Config) Option { return func(c *config) { c.tls = cfg } }

// WithLogger sets where connection errors are logged (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// NewServer returns a server whose virtual host "/" is b.
func NewServer(b *warren.Broker, opts ...Option) *Server {
	cfg := config{vhosts: map[string]*warren.Broker{"/": b}, users: map[string]string{"guest": "guest"},
		frameMax: 131072, channelMax: 2047, heartbeat: 60 * time.Second, maxMessageSize: 128 << 20}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	s := &Server{cfg: cfg, conns: map[*conn]struct{}{}}
	s.ctx, s.cancel = warren.NewOwner(context.Background())
	return s
}

// ErrServerClosed is returned by Serve and ListenAndServe after Close.
var ErrServerClosed = errors.New("amqp: server closed")

// ListenAndServe listens on addr ("127.0.0.1:5672" when empty: loopback unless told otherwise)
// and serves until Close.
func (s *Server) ListenAndServe(addr string) error {
	if addr == "" {
		addr = "127.0.0.1:5672"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return s.Serve(ln)
}

// Serve accepts connections on ln until Close, and then returns ErrServerClosed.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.lns = append(s.lns, ln)
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		if s.cfg.tls != nil {
			nc = tls.Server(nc, s.cfg.tls)
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return ErrServerClosed
		}
		c := newConn(s, nc)
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			c.serve()
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// Close stops listening, closes every connection (CONNECTION_FORCED, 320, as a stopping
// RabbitMQ does) and returns once every goroutine of the server has ended. What the
// connections' channels held goes back to the queues.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	lns := s.lns
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	for _, c := range conns {
		c.shutdown(fmt.Errorf("%w: the server is closing", errConnectionForced))
	}
	s.wg.Wait()
	s.cancel()
	return nil
}

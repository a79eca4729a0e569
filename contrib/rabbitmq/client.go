package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
)

// Client is a warren application's connection to RabbitMQ, kept up: when the connection or its
// channel drops it reconnects with a backoff, declares again every topology it was given, and
// publishes again what was not confirmed. Safe for concurrent use.
//
// Publishing: a publish returns once RabbitMQ confirms it (publisher confirms), with at most
// [MaxInFlight] unconfirmed at once across the client's publishers. A publish that was sent
// but not confirmed when the connection dropped is sent again on the next one, and its call
// returns that confirm: delivered at least once, so a consumer may see it twice.
//
// Every goroutine of the client ends by the time [Client.Close] returns.
type Client struct {
	url string
	cfg clientConfig

	// pubMu (a semaphore, so that waiting for it can end with a ctx) serialises publishing on
	// the channel, so that delivery tags follow the order of the publishes; it is taken before
	// mu. mu is never held while calling amqp091-go: its reader hands confirms to the listener,
	// which needs mu, while holding locks a publish needs (confirms.publishedMut).
	pubMu chan struct{}

	mu         sync.Mutex
	conn       *amqp.Connection
	pub        *amqp.Channel            // confirm mode; nil while disconnected
	gen        uint64                   // connections made: the listener of an earlier one resolves nothing
	exchanges  map[string]bool          // exchanges known to exist (the default one too)
	asking     map[string]chan struct{} // exchanges being asked about, closed with the answer
	up         chan struct{}            // closed while connected; a new one once the connection is lost
	topologies []warren.Topology
	pending    map[uint64]*outgoing // on pub, by delivery tag
	unsent     []*outgoing          // whose send failed (the connection is going): sent on the next
	byID       map[string]*outgoing // mandatory publishes, by their correlation header
	nextID     uint64
	closed     bool
	done       chan struct{} // closed by Close
	inFlight   chan struct{} // a slot per unconfirmed publish

	retryMu     sync.Mutex      // serialises the declaration of retry queues; taken before mu
	retryQueues map[string]bool // retry queues declared (retry.go)

	wg sync.WaitGroup // the keeper and the confirm listener
}

// outgoing is one publish until its confirm.
type outgoing struct {
	exchange, key string
	msg           amqp.Publishing
	id            string        // the correlation header's value for a mandatory publish, "" otherwise
	returned      bool          // RabbitMQ returned it: unroutable
	abandoned     bool          // its caller gave up: not sent again after a reconnect
	done          chan struct{} // closed once err is its result
	err           error
}

type clientConfig struct {
	queueType   QueueType
	maxInFlight int
	minBackoff  time.Duration
	maxBackoff  time.Duration
	logger      *slog.Logger
}

// Option configures a [Client].
type Option func(*clientConfig)

// WithQueueType sets the type of queue [Client.DeclareTopology] declares: [Classic] (the
// default) or [Quorum].
func WithQueueType(qt QueueType) Option { return func(c *clientConfig) { c.queueType = qt } }

// MaxInFlight bounds the publishes sent and not yet confirmed, across the client's publishers
// (default 256): a publish beyond it waits for a confirm.
func MaxInFlight(n int) Option { return func(c *clientConfig) { c.maxInFlight = n } }

// ReconnectBackoff sets the wait between attempts to reconnect: min after the first failure,
// doubling to max (defaults 100 ms and 5 s).
func ReconnectBackoff(min, max time.Duration) Option {
	return func(c *clientConfig) { c.minBackoff, c.maxBackoff = min, max }
}

// WithLogger sets where the client says that it lost and regained its connection (default
// slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *clientConfig) { c.logger = l } }

// publishIDHeader carries a mandatory publish's correlation id, so that a basic.return finds
// its publish. A consumer of this package ([Client.Serve]) does not see it; other consumers of
// the queue do.
const publishIDHeader = "x-warren-publish-id"

// Dial connects to RabbitMQ at url (amqp://user:password@host:port/vhost) and keeps the
// connection up until [Client.Close]. It fails if the first connection fails.
func Dial(url string, opts ...Option) (*Client, error) {
	cfg := clientConfig{queueType: Classic, maxInFlight: 256, minBackoff: 100 * time.Millisecond, maxBackoff: 5 * time.Second}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	switch {
	case cfg.queueType != Classic && cfg.queueType != Quorum:
		return nil, fmt.Errorf("rabbitmq: queue type %q is neither classic nor quorum: %w", cfg.queueType, warren.ErrInvalidArgument)
	case cfg.maxInFlight < 1:
		return nil, fmt.Errorf("rabbitmq: MaxInFlight %d: want at least 1: %w", cfg.maxInFlight, warren.ErrInvalidArgument)
	case cfg.minBackoff <= 0 || cfg.maxBackoff < cfg.minBackoff:
		return nil, fmt.Errorf("rabbitmq: ReconnectBackoff %v to %v: want 0 < min ≤ max: %w", cfg.minBackoff, cfg.maxBackoff, warren.ErrInvalidArgument)
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	c := &Client{url: url, cfg: cfg, up: make(chan struct{}), pubMu: make(chan struct{}, 1), pending: map[uint64]*outgoing{}, byID: map[string]*outgoing{},
		exchanges: map[string]bool{"": true}, asking: map[string]chan struct{}{}, retryQueues: map[string]bool{}, done: make(chan struct{}), inFlight: make(chan struct{}, cfg.maxInFlight)}
	conn, err := c.connect()
	if err != nil {
		return nil, err
	}
	lost := conn.NotifyClose(make(chan *amqp.Error, 1))
	c.wg.Go(func() { c.keep(lost) })
	return c, nil
}

// connect opens a connection and its publishing channel, declares the topologies, sends again
// what was not confirmed, and returns a channel that says when the connection is lost.
func (c *Client) connect() (*amqp.Connection, error) {
	conn, err := amqp.Dial(c.url)
	if err != nil {
		return nil, wrap(err, "connect")
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return nil, wrap(err, "open the publishing channel")
	}
	// The publishing channel closes alone when RabbitMQ refuses a publish (404: its exchange
	// was deleted): the keeper then starts over on a new connection.
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	c.wg.Go(func() {
		if e, ok := <-chClosed; ok && e != nil {
			conn.CloseDeadline(time.Now().Add(time.Second))
		}
	})
	c.mu.Lock()
	topologies, gen := c.topologies, c.gen+1
	var exchanges []string
	for _, o := range slices.Concat(slices.Collect(maps.Values(c.pending)), c.unsent) {
		if !slices.Contains(exchanges, o.exchange) {
			exchanges = append(exchanges, o.exchange)
		}
	}
	c.mu.Unlock()
	for _, t := range topologies {
		if err := c.declareOn(conn, t); err != nil {
			conn.Close()
			return nil, err
		}
	}
	// What waits to be sent again to an exchange that is gone fails, as its first send would
	// have (and as the last may have made the channel close).
	missing := map[string]bool{}
	for _, x := range exchanges {
		if err := checkExchange(conn, x); errors.Is(err, warren.ErrNotFound) {
			missing[x] = true
		} else if err != nil {
			conn.Close()
			return nil, err
		}
	}
	// Unbuffered: returns and confirms reach the listener in the order RabbitMQ sent them, a
	// return before the confirm of its publish (amqp091-go hands each over before it reads the
	// next frame).
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation))
	returns := ch.NotifyReturn(make(chan amqp.Return))
	c.wg.Go(func() { c.listen(gen, confirms, returns) })

	c.pubMu <- struct{}{}
	defer func() { <-c.pubMu }()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		conn.Close()
		return nil, warren.ErrClosed
	}
	c.conn, c.pub, c.gen = conn, ch, gen
	// What was sent on the lost connection and not confirmed goes again, in its order, then
	// what could not be sent.
	resend := make([]*outgoing, 0, len(c.pending)+len(c.unsent))
	for _, tag := range slices.Sorted(maps.Keys(c.pending)) {
		resend = append(resend, c.pending[tag])
	}
	resend = append(resend, c.unsent...)
	c.pending, c.unsent = make(map[uint64]*outgoing, len(resend)), nil
	var again []*outgoing
	for _, o := range resend {
		switch {
		case o.abandoned:
			delete(c.byID, o.id)
			<-c.inFlight
		case missing[o.exchange]:
			delete(c.byID, o.id)
			delete(c.exchanges, o.exchange)
			<-c.inFlight
			o.resolve(fmt.Errorf("rabbitmq: publish to exchange %q: %w", o.exchange, warren.ErrNotFound))
		default:
			again = append(again, o)
		}
	}
	c.mu.Unlock()
	for _, o := range again {
		c.sendOn(ch, o)
	}
	c.mu.Lock()
	close(c.up)
	c.mu.Unlock()
	return conn, nil
}

// checkExchange reports whether exchange x exists on conn: nil, or an error wrapping
// [warren.ErrNotFound], or why it could not tell.
func checkExchange(conn *amqp.Connection, x string) error {
	if x == "" {
		return nil
	}
	ch, err := conn.Channel()
	if err != nil {
		return wrap(err, "open a channel")
	}
	// A passive declaration of a missing exchange closes the channel (404); of an existing one,
	// whatever its kind, succeeds on RabbitMQ only with the right kind, so ask as fanout and
	// tell 404 from 406.
	err = ch.ExchangeDeclarePassive(x, "fanout", false, false, false, false, nil)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
		err = nil
	}
	if err == nil {
		ch.Close()
		return nil
	}
	return wrap(err, "exchange %q", x)
}

// keep reconnects, with a backoff, whenever the connection is lost, until Close.
func (c *Client) keep(lost <-chan *amqp.Error) {
	for {
		select {
		case <-c.done:
			return
		case why := <-lost:
			c.mu.Lock()
			c.pub, c.up = nil, make(chan struct{})
			closed := c.closed
			c.mu.Unlock()
			if closed {
				return
			}
			c.cfg.logger.Warn("rabbitmq: connection lost; reconnecting", "err", why)
		}
		wait := c.cfg.minBackoff
		for {
			conn, err := c.connect()
			if err == nil {
				lost = conn.NotifyClose(make(chan *amqp.Error, 1))
				c.cfg.logger.Info("rabbitmq: reconnected")
				break
			}
			// Only the client's own Close ends this loop: an attempt's connection lost on the
			// way is an error wrapping warren.ErrClosed too, and one more failed attempt.
			if c.isClosed() {
				return
			}
			c.cfg.logger.Warn("rabbitmq: reconnect failed", "err", err, "retry_in", wait)
			select {
			case <-c.done:
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, c.cfg.maxBackoff)
		}
	}
}

// listen resolves publishes from one channel's returns and confirms, until the channel closes.
func (c *Client) listen(gen uint64, confirms <-chan amqp.Confirmation, returns <-chan amqp.Return) {
	for confirms != nil || returns != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			id, _ := r.Headers[publishIDHeader].(string)
			c.mu.Lock()
			if o := c.byID[id]; o != nil && c.gen == gen {
				o.returned = true
			}
			c.mu.Unlock()
		case cf, ok := <-confirms:
			if !ok {
				confirms = nil
				continue
			}
			c.mu.Lock()
			var o *outgoing
			if c.gen == gen { // else: a lost connection's, whose publishes were sent again
				o = c.pending[cf.DeliveryTag]
				delete(c.pending, cf.DeliveryTag)
				if o != nil {
					delete(c.byID, o.id)
				}
			}
			c.mu.Unlock()
			if o == nil {
				continue
			}
			<-c.inFlight
			switch {
			case !cf.Ack:
				o.resolve(fmt.Errorf("rabbitmq: publish to exchange %q with key %q: nacked by RabbitMQ: %w", o.exchange, o.key, warren.ErrQueueFull))
			case o.returned:
				o.resolve(fmt.Errorf("rabbitmq: publish to exchange %q with key %q: %w", o.exchange, o.key, warren.ErrUnroutable))
			default:
				o.resolve(nil)
			}
		}
	}
}

// Publish sends msg to exchange with routing key key and returns once RabbitMQ confirms it, as
// [warren.Broker.Publish] returns once warren has it: [warren.ErrUnroutable] for a
// [warren.Mandatory] publish that reached no queue (basic.return), [warren.ErrQueueFull] when
// RabbitMQ refused it (a nack: a queue's reject-publish overflow). [warren.ExpireAfter] sets the
// message's expiration; [warren.Immediate] and [warren.DeliverAfter] have no RabbitMQ
// counterpart and fail with [warren.ErrUnsupported]. While the client reconnects, Publish
// waits. If ctx ends first it returns ctx's error, and the message may or may not have been
// published.
func (c *Client) Publish(ctx context.Context, exchange, key string, msg warren.Message, opts ...warren.PublishOption) error {
	o, err := c.publish(ctx, exchange, key, msg, opts)
	if err != nil {
		return err
	}
	select {
	case <-o.done:
		return o.err
	case <-ctx.Done():
		c.mu.Lock()
		o.abandoned = true
		c.mu.Unlock()
		return context.Cause(ctx)
	case <-c.done:
		return warren.ErrClosed
	}
}

// PublishDeferred is [Client.Publish] without the wait for RabbitMQ's confirm: it returns once
// the message is sent, with a [Confirmation] whose Wait returns the confirm, as
// [warren.Broker.PublishDeferred] does in warren. It is for a publisher that streams: keep a
// window of confirmations (at most [MaxInFlight] are unconfirmed anyway; PublishDeferred waits
// for room) and wait for them as they come, without a goroutine per unconfirmed message. A
// message whose connection is lost before its confirm is sent again on the next, as with
// Publish, and its Confirmation follows it. Errors that Publish returns before sending
// (invalid options, a missing exchange, ctx's end while waiting for room or a connection) are
// returned at once.
func (c *Client) PublishDeferred(ctx context.Context, exchange, key string, msg warren.Message, opts ...warren.PublishOption) (Confirmation, error) {
	o, err := c.publish(ctx, exchange, key, msg, opts)
	if err != nil {
		return Confirmation{}, err
	}
	return Confirmation{o: o, closed: c.done}, nil
}

// Confirmation is the pending confirm of a [Client.PublishDeferred]. It is a small value: copy
// it freely. The zero value is a complete confirm.
type Confirmation struct {
	o      *outgoing
	closed <-chan struct{}
}

// Wait returns RabbitMQ's confirm as [Client.Publish] returns it: nil, or an error wrapping
// [warren.ErrUnroutable] or [warren.ErrQueueFull]; [warren.ErrClosed] when the client closes
// first. It may be called any number of times, from any goroutine.
func (f Confirmation) Wait() error {
	if f.o == nil {
		return nil
	}
	select {
	case <-f.o.done:
		return f.o.err
	case <-f.closed:
		select {
		case <-f.o.done: // confirmed as the client closed
			return f.o.err
		default:
			return warren.ErrClosed
		}
	}
}

// publish sends msg, returning its outgoing, whose done closes with its confirm.
func (c *Client) publish(ctx context.Context, exchange, key string, msg warren.Message, opts []warren.PublishOption) (*outgoing, error) {
	s, err := warren.ReadPublishOptions(opts...)
	switch {
	case err != nil:
		return nil, err
	case s.Immediate:
		return nil, fmt.Errorf("rabbitmq: publish: Immediate: RabbitMQ dropped AMQP's immediate flag: %w", warren.ErrUnsupported)
	case s.Delay > 0:
		return nil, fmt.Errorf("rabbitmq: publish: DeliverAfter: RabbitMQ has no delayed delivery: %w", warren.ErrUnsupported)
	}
	if s.Expiration != "" {
		msg.Expiration = s.Expiration
	}
	if err := c.knowExchange(ctx, exchange); err != nil {
		return nil, err
	}
	select {
	case c.inFlight <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	case <-c.done:
		return nil, warren.ErrClosed
	}
	o := &outgoing{exchange: exchange, key: key, done: make(chan struct{})}
	if s.Mandatory {
		c.mu.Lock()
		c.nextID++
		o.id = strconv.FormatUint(c.nextID, 36)
		c.byID[o.id] = o
		c.mu.Unlock()
		o.msg = publishing(msg, publishIDHeader, o.id)
	} else {
		o.msg = publishing(msg, "", "")
	}
	if err := c.send(ctx, o); err != nil {
		return nil, err
	}
	return o, nil
}

// resolve gives o its result.
func (o *outgoing) resolve(err error) {
	o.err = err
	close(o.done)
}

// knowExchange returns nil once exchange x is known to exist, and an error wrapping
// [warren.ErrNotFound] if it does not: a publish to a missing exchange fails, as in warren,
// rather than closing the publishing channel (RabbitMQ's 404). Known exchanges are asked about
// once; concurrent first publishes to one exchange share the question (one channel each would
// exhaust the connection's channels).
func (c *Client) knowExchange(ctx context.Context, x string) error {
	for {
		c.mu.Lock()
		known, asking := c.exchanges[x], c.asking[x]
		if !known && asking == nil {
			asking = make(chan struct{})
			c.asking[x] = asking
			c.mu.Unlock()
			break
		}
		c.mu.Unlock()
		if known {
			return nil
		}
		select { // another publish asks: wait for its answer, then look again
		case <-asking:
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-c.done:
			return warren.ErrClosed
		}
	}
	err := c.askExchange(ctx, x)
	c.mu.Lock()
	if err == nil {
		c.exchanges[x] = true
	}
	close(c.asking[x])
	delete(c.asking, x)
	c.mu.Unlock()
	return err
}

// askExchange asks RabbitMQ whether exchange x exists, on the current connection or, if it is
// lost meanwhile, the next.
func (c *Client) askExchange(ctx context.Context, x string) error {
	for {
		conn, err := c.connection(ctx)
		if err != nil {
			return err
		}
		err = checkExchange(conn, x)
		switch {
		case errors.Is(err, warren.ErrNotFound):
			return fmt.Errorf("rabbitmq: publish to exchange %q: %w", x, warren.ErrNotFound)
		case err != nil && conn.IsClosed():
			continue
		}
		return err
	}
}

// send publishes o on the current channel, waiting for one while the client reconnects.
func (c *Client) send(ctx context.Context, o *outgoing) error {
	for {
		c.mu.Lock()
		up, closed := c.up, c.closed
		c.mu.Unlock()
		if closed {
			<-c.inFlight
			return warren.ErrClosed
		}
		select {
		case <-up:
		case <-ctx.Done():
			<-c.inFlight
			c.forget(o)
			return context.Cause(ctx)
		case <-c.done:
			<-c.inFlight
			return warren.ErrClosed
		}
		select {
		case c.pubMu <- struct{}{}:
		case <-ctx.Done():
			<-c.inFlight
			c.forget(o)
			return context.Cause(ctx)
		}
		c.mu.Lock()
		ch := c.pub
		c.mu.Unlock()
		if ch == nil {
			<-c.pubMu
			continue // lost again meanwhile
		}
		c.sendOn(ch, o)
		<-c.pubMu
		return nil
	}
}

// sendOn registers o under ch's next delivery tag and publishes it. The caller holds pubMu,
// not mu. If the write fails (the connection is going), o waits for the next connection; its
// tag is the next publish's (amqp091-go takes it back).
func (c *Client) sendOn(ch *amqp.Channel, o *outgoing) {
	tag := ch.GetNextPublishSeqNo()
	c.mu.Lock()
	c.pending[tag] = o
	o.returned = false // a return on an earlier connection does not count
	if o.id != "" {
		c.byID[o.id] = o
	}
	c.mu.Unlock()
	if err := ch.PublishWithContext(context.Background(), o.exchange, o.key, o.id != "", false, o.msg); err != nil {
		c.mu.Lock()
		delete(c.pending, tag)
		c.unsent = append(c.unsent, o)
		c.mu.Unlock()
		c.cfg.logger.Debug("rabbitmq: publish failed; sent again once reconnected", "err", err)
	}
}

// forget drops a publish that was never sent.
func (c *Client) forget(o *outgoing) {
	c.mu.Lock()
	delete(c.byID, o.id)
	c.mu.Unlock()
}

// DeclareTopology declares t on RabbitMQ (see the package's DeclareTopology, with the client's
// [WithQueueType]) and again after every reconnect. While the client reconnects it waits.
func (c *Client) DeclareTopology(t warren.Topology) error {
	kept := false
	for {
		conn, err := c.connection(context.Background())
		if err != nil {
			return err
		}
		err = c.declareOn(conn, t)
		if err != nil && (errors.Is(err, warren.ErrClosed) || conn.IsClosed()) {
			continue // the connection was lost meanwhile: declare on the next
		}
		if err != nil {
			return err
		}
		c.mu.Lock()
		if !kept {
			c.topologies = append(c.topologies, t)
			for _, x := range t.Exchanges {
				c.exchanges[x.Name] = true
			}
			kept = true
		}
		// A reconnection that began before t was kept may have declared the topologies
		// without it: declare it on the connection that is current now, too.
		stale := c.conn != conn || c.pub == nil
		c.mu.Unlock()
		if !stale {
			return nil
		}
	}
}

// connection returns the current connection, waiting while the client reconnects.
func (c *Client) connection(ctx context.Context) (*amqp.Connection, error) {
	for {
		c.mu.Lock()
		conn, up, connected, closed := c.conn, c.up, c.pub != nil, c.closed
		c.mu.Unlock()
		switch {
		case closed:
			return nil, warren.ErrClosed
		case connected:
			return conn, nil
		}
		select {
		case <-up:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-c.done:
			return nil, warren.ErrClosed
		}
	}
}

// declareOn declares t on a channel of its own on conn.
func (c *Client) declareOn(conn *amqp.Connection, t warren.Topology) error {
	ch, err := conn.Channel()
	if err != nil {
		return wrap(err, "open a channel")
	}
	defer ch.Close()
	return DeclareTopology(ch, t, c.cfg.queueType)
}

// Close closes the connection; publishes still waiting return [warren.ErrClosed]. It returns
// once every goroutine of the client has ended.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	conn := c.conn
	c.mu.Unlock()
	var err error
	if conn != nil {
		// A deadline: a write that stalls (RabbitMQ's flow control, a resource alarm) holds
		// amqp091-go's send lock, which Close needs.
		err = conn.CloseDeadline(time.Now().Add(time.Second))
		if errors.Is(err, amqp.ErrClosed) {
			err = nil
		}
	}
	c.wg.Wait()
	return err
}

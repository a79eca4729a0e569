package warren

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/warrenmq/warren/internal/wal"
)

// Exchange kinds (AMQP exchange types).
const (
	ExchangeDirect  = "direct"  // routes to bindings whose key equals the routing key
	ExchangeFanout  = "fanout"  // routes to every binding; the key is ignored
	ExchangeTopic   = "topic"   // routes by dotted-word patterns with * and #
	ExchangeHeaders = "headers" // routes by message headers against binding arguments
)

// Exchange routes published messages to queues and other exchanges through its bindings
// (RabbitMQ's exchange). Obtain one from [Broker.DeclareExchange] or [Broker.Exchange]; the zero
// Exchange is not usable. An Exchange is safe for concurrent use.
type Exchange struct {
	b    *Broker
	name string
	kind string
	cfg  exchangeConfig // fixed at declare

	// Guarded by b.mu.
	bindings   []*binding                 // bindings with this exchange as the source, in bind order
	byDest     map[bindingDest][]*binding // the same, by destination and key: finds duplicates in O(1)
	direct     map[string][]*binding      // direct: bindings by key
	topic      *topicTrie[*binding]       // topic: bindings by pattern
	hadBinding bool                       // for auto-delete: a binding ever existed
	deleted    bool
}

// bindingDest is a binding's identity but for its arguments.
type bindingDest struct {
	queue    *Queue
	exchange *Exchange
	key      string
}

// binding routes from src to a queue or to an exchange.
type binding struct {
	src      *Exchange
	queue    *Queue    // the destination queue, or nil
	exchange *Exchange // the destination exchange, or nil
	key      string
	args     Table
	headers  headersBinding // parsed args, for a headers exchange
}

func newExchange(b *Broker, name, kind string, cfg exchangeConfig) *Exchange {
	x := &Exchange{b: b, name: name, kind: kind, cfg: cfg, byDest: make(map[bindingDest][]*binding)}
	switch kind {
	case ExchangeDirect:
		x.direct = make(map[string][]*binding)
	case ExchangeTopic:
		x.topic = newTopicTrie[*binding]()
	}
	return x
}

// Name returns the exchange's name; "" is the default exchange.
func (x *Exchange) Name() string { return x.name }

// Kind returns the exchange's kind: [ExchangeDirect], [ExchangeFanout], [ExchangeTopic] or
// [ExchangeHeaders].
func (x *Exchange) Kind() string { return x.kind }

// Publish publishes through this exchange; see [Broker.Publish]. After the exchange is deleted
// it fails with an error wrapping [ErrNotFound], even if an exchange of the same name was
// declared since.
func (x *Exchange) Publish(ctx context.Context, key string, msg Message, opts ...PublishOption) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return x.b.publish(ctx, x, x.name, key, &msg, opts)
}

// DeclareExchange declares an exchange of the given kind and returns it (AMQP's
// exchange.declare). Declaring an existing exchange returns it when the declaration is
// equivalent (same kind, [Durable], [AutoDelete], [Internal] and alternate exchange; other
// arguments are not compared) and fails with [ErrPreconditionFailed] when it is not.
//
// Other errors: the empty name, which is the default exchange, and new names starting with
// "amq." ([ErrAccessRefused]); names over 255 bytes or not UTF-8, unknown kinds
// ([ErrInvalidArgument]); a non-string "alternate-exchange" argument ([ErrPreconditionFailed]);
// a closed broker ([ErrClosed]).
func (b *Broker) DeclareExchange(name, kind string, opts ...ExchangeOption) (*Exchange, error) {
	if b.closed.Load() {
		return nil, ErrClosed
	}
	var cfg exchangeConfig
	for _, o := range opts {
		if o != nil {
			o.applyExchange(&cfg)
		}
	}
	if err := cfg.parseArgs(); err != nil {
		return nil, errorf("declare exchange %q: %w", name, err)
	}
	if name == "" {
		return nil, errorf("declare the default exchange: %w", ErrAccessRefused)
	}
	if err := checkName("exchange", name); err != nil {
		return nil, err
	}
	if err := checkTable(cfg.args); err != nil {
		return nil, errorf("declare exchange %q: %w", name, err)
	}
	switch kind {
	case ExchangeDirect, ExchangeFanout, ExchangeTopic, ExchangeHeaders:
	default:
		return nil, errorf("declare exchange %q: unknown kind %q: %w", name, kind, ErrInvalidArgument)
	}
	b.mu.Lock()
	defer b.unlockTopology()
	if b.closed.Load() {
		return nil, ErrClosed
	}
	if x := b.exchanges[name]; x != nil {
		// An existing exchange is compared, even a predeclared "amq." one; only a new name is
		// checked for the reserved prefix (as RabbitMQ's exchange.declare does).
		if err := x.equivalent(kind, cfg); err != nil {
			return nil, errorf("declare exchange %q: %w", name, err)
		}
		return x, nil
	}
	if err := checkReserved("exchange", name); err != nil {
		return nil, err
	}
	x := newExchange(b, name, kind, cfg)
	b.exchanges[name] = x
	if x.durable() {
		d := decl{name: name, kind: kind, flags: flagDurable, alt: cfg.alternate, args: cfg.args}
		if cfg.autoDelete {
			d.flags |= flagAutoDelete
		}
		if cfg.internal {
			d.flags |= flagInternal
		}
		b.store.logTopologyLocked(recExchange, d)
	}
	b.topologyEventLocked(Event{Kind: EventExchangeCreated, Exchange: name})
	return x, nil
}

// DeleteExchange deletes an exchange with its bindings, as source and as destination (AMQP's
// exchange.delete). Removing those bindings may delete auto-delete exchanges in turn. With
// [IfUnused] it fails with [ErrPreconditionFailed] if the exchange is the source of a binding.
// The default exchange and the predeclared "amq." exchanges cannot be deleted
// ([ErrAccessRefused]). Deleting an exchange that does not exist succeeds, as in RabbitMQ.
func (b *Broker) DeleteExchange(name string, opts ...CallOption) error {
	cfg := callOptions(opts)
	if b.closed.Load() {
		return ErrClosed
	}
	if name == "" || strings.HasPrefix(name, "amq.") {
		return errorf("delete exchange %q: %w", name, ErrAccessRefused)
	}
	b.mu.Lock()
	defer b.unlockTopology()
	if b.closed.Load() {
		return ErrClosed
	}
	x := b.exchanges[name]
	if x == nil {
		return nil
	}
	if cfg.ifUnused && len(x.bindings) > 0 {
		return errorf("delete exchange %q: in use: %w", name, ErrPreconditionFailed)
	}
	b.deleteExchangeLocked(x, ReasonDeleted)
	return nil
}

// deleteExchangeLocked removes x and every binding from or to it, cascading auto-deletes.
func (b *Broker) deleteExchangeLocked(x *Exchange, reason Reason) {
	if x.deleted {
		return
	}
	x.deleted = true
	delete(b.exchanges, x.name)
	if x.durable() {
		b.store.logTopologyLocked(recUnexchange, decl{name: x.name})
	}
	if b.listening() {
		for _, bd := range x.bindings {
			b.topology = append(b.topology, bd.event(EventBindingDeleted))
		}
	}
	b.topologyEventLocked(Event{Kind: EventExchangeDeleted, Exchange: x.name, Reason: reason})
	x.bindings, x.byDest, x.direct, x.topic = nil, nil, nil, nil
	for _, src := range b.exchanges {
		src.unbindLocked(func(bd *binding) bool { return bd.exchange == x })
	}
}

// Bind binds a queue to an exchange with a binding key and arguments (AMQP's queue.bind). The
// key is a word pattern for a topic exchange and ignored by fanout and headers exchanges; the
// arguments are the match table of a headers exchange ("x-match": "all", "any", "all-with-x" or
// "any-with-x"). Binding again with the same key and arguments is a no-op.
//
// Errors: a missing queue or exchange ([ErrNotFound]), the default exchange
// ([ErrAccessRefused]), an exclusive queue bound on behalf of another than its owner ([As];
// [ErrResourceLocked]), a key over 255 bytes ([ErrInvalidArgument]), an invalid x-match
// ([ErrPreconditionFailed]), a closed broker ([ErrClosed]).
func (b *Broker) Bind(queue, exchange, key string, args Table, opts ...CallOption) error {
	return b.bind(destination{name: queue}, exchange, key, args, callOptions(opts))
}

// Unbind removes a binding made by [Broker.Bind]; the key and arguments must be equal. Removing
// a binding that does not exist succeeds, also when the queue or the exchange does not exist, as
// in RabbitMQ. Removing an auto-delete exchange's last binding deletes the exchange. Errors: the
// default exchange ([ErrAccessRefused]), an exclusive queue unbound on behalf of another than its
// owner ([As]; [ErrResourceLocked]), a closed broker ([ErrClosed]).
func (b *Broker) Unbind(queue, exchange, key string, args Table, opts ...CallOption) error {
	return b.unbind(destination{name: queue}, exchange, key, args, callOptions(opts))
}

// BindExchange binds a destination exchange to a source exchange (RabbitMQ's exchange-to-exchange
// binding): what the source routes through this binding is routed again by the destination.
// A message reaches each queue once however many paths lead there, and cycles are harmless.
// Errors are as for [Broker.Bind].
func (b *Broker) BindExchange(dst, source, key string, args Table) error {
	return b.bind(destination{name: dst, exchange: true}, source, key, args, callConfig{})
}

// UnbindExchange removes a binding made by [Broker.BindExchange], as [Broker.Unbind] does.
func (b *Broker) UnbindExchange(dst, source, key string, args Table) error {
	return b.unbind(destination{name: dst, exchange: true}, source, key, args, callConfig{})
}

// destination names what a binding routes to: a queue, or an exchange.
type destination struct {
	name     string
	exchange bool
}

// bind binds dst to the exchange src.
func (b *Broker) bind(dst destination, src, key string, args Table, cfg callConfig) error {
	if b.closed.Load() {
		return ErrClosed
	}
	if cfg.err != nil {
		return cfg.err
	}
	if len(key) > maxNameLen {
		return errorf("bind: key longer than %d bytes: %w", maxNameLen, ErrInvalidArgument)
	}
	args = cloneTable(args) // the binding's own: the caller may reuse the table
	b.mu.Lock()
	defer b.unlockTopology()
	bd, err := b.bindingLocked("bind", dst, src, key, args, cfg)
	if err != nil {
		return err
	}
	x := bd.src
	if x.kind == ExchangeHeaders {
		if bd.headers, err = parseHeadersBinding(args); err != nil {
			return err
		}
	}
	for _, old := range x.byDest[bd.dest()] {
		if old.sameAs(bd) {
			return nil
		}
	}
	x.bindings = append(x.bindings, bd)
	x.byDest[bd.dest()] = append(x.byDest[bd.dest()], bd)
	x.hadBinding = true
	switch x.kind {
	case ExchangeDirect:
		x.direct[key] = append(x.direct[key], bd)
	case ExchangeTopic:
		x.topic.add(key, bd)
	}
	if bd.durable() {
		b.store.logTopologyLocked(recBind, bd.decl())
	}
	b.topologyEventLocked(bd.event(EventBindingCreated))
	return nil
}

// unbind removes the binding of dst to the exchange src, if there is one.
func (b *Broker) unbind(dst destination, src, key string, args Table, cfg callConfig) error {
	if cfg.err != nil {
		return cfg.err
	}
	b.mu.Lock()
	defer b.unlockTopology()
	bd, err := b.bindingLocked("unbind", dst, src, key, args, cfg)
	if errors.Is(err, ErrNotFound) {
		return nil // nothing to unbind from, or nothing bound: no binding either way
	}
	if err != nil {
		return err
	}
	for _, old := range bd.src.byDest[bd.dest()] {
		if old.sameAs(bd) {
			bd.src.unbindLocked(func(x *binding) bool { return x == old })
			break
		}
	}
	return nil
}

// bindingLocked resolves the names of a bind or unbind (op) into a binding value, on behalf of
// cfg's owner.
func (b *Broker) bindingLocked(op string, dst destination, src, key string, args Table, cfg callConfig) (*binding, error) {
	if b.closed.Load() {
		return nil, ErrClosed
	}
	if src == "" || dst.exchange && dst.name == "" {
		return nil, errorf("%s the default exchange: %w", op, ErrAccessRefused)
	}
	if err := checkTable(args); err != nil {
		return nil, errorf("%s: %w", op, err)
	}
	bd := &binding{key: key, args: args}
	if dst.exchange {
		if bd.exchange = b.exchanges[dst.name]; bd.exchange == nil {
			return nil, errorf("%s: exchange %q: %w", op, dst.name, ErrNotFound)
		}
	} else {
		if bd.queue = b.queues[dst.name]; bd.queue == nil {
			return nil, errorf("%s: queue %q: %w", op, dst.name, ErrNotFound)
		}
		if err := bd.queue.checkUse(op, cfg.owner, byAs); err != nil {
			return nil, err
		}
	}
	if bd.src = b.exchanges[src]; bd.src == nil {
		return nil, errorf("%s: exchange %q: %w", op, src, ErrNotFound)
	}
	return bd, nil
}

func (bd *binding) dest() bindingDest {
	return bindingDest{queue: bd.queue, exchange: bd.exchange, key: bd.key}
}

// sameAs reports whether two bindings have the same source, destination, key and arguments.
func (bd *binding) sameAs(o *binding) bool {
	return bd.src == o.src && bd.queue == o.queue && bd.exchange == o.exchange && bd.key == o.key &&
		sameField(bd.args, o.args)
}

// unbindLocked removes the bindings from x for which drop returns true, and deletes x if that
// removed the last binding of an auto-delete exchange, cascading.
func (x *Exchange) unbindLocked(drop func(*binding) bool) {
	if x.deleted {
		return
	}
	n := 0
	for _, bd := range x.bindings {
		if !drop(bd) {
			x.bindings[n] = bd
			n++
			continue
		}
		if bd.durable() {
			x.b.store.logTopologyLocked(recUnbind, bd.decl())
		}
		removeBinding(x.byDest, bd.dest(), bd)
		x.b.topologyEventLocked(bd.event(EventBindingDeleted))
		switch x.kind {
		case ExchangeDirect:
			removeBinding(x.direct, bd.key, bd)
		case ExchangeTopic:
			x.topic.remove(bd.key, bd)
		}
	}
	if n == len(x.bindings) {
		return
	}
	clear(x.bindings[n:])
	x.bindings = x.bindings[:n]
	if n == 0 && x.cfg.autoDelete && x.hadBinding {
		x.b.deleteExchangeLocked(x, ReasonAutoDelete)
	}
}

// removeBinding removes bd from the list m[k], deleting the entry when it empties.
func removeBinding[K comparable](m map[K][]*binding, k K, bd *binding) {
	list := m[k]
	if i := slices.Index(list, bd); i >= 0 {
		list = slices.Delete(list, i, i+1)
	}
	if len(list) == 0 {
		delete(m, k)
	} else {
		m[k] = list
	}
}

// router is the scratch space of one publish: the queues reached so far and the exchanges
// visited, so that each queue gets one copy and cycles end.
type router struct {
	queues []*Queue
	qset   map[*Queue]struct{} // used once queues grows past routerLinear
	seen   []*Exchange         // exchanges visited, in visiting order: the work list
}

const routerLinear = 16

func (r *router) addQueue(q *Queue) {
	if r.qset == nil && len(r.queues) < routerLinear {
		if slices.Contains(r.queues, q) {
			return
		}
		r.queues = append(r.queues, q)
		return
	}
	if r.qset == nil {
		r.qset = make(map[*Queue]struct{}, 2*routerLinear)
		for _, o := range r.queues {
			r.qset[o] = struct{}{}
		}
	}
	if _, ok := r.qset[q]; !ok {
		r.qset[q] = struct{}{}
		r.queues = append(r.queues, q)
	}
}

func (r *router) addExchange(x *Exchange) {
	if slices.Contains(r.seen, x) {
		return
	}
	r.seen = append(r.seen, x)
}

func (r *router) reset() {
	clear(r.queues)
	r.queues = r.queues[:0]
	clear(r.seen)
	r.seen = r.seen[:0]
	r.qset = nil
}

// routeLocked routes from x over the whole exchange graph: each exchange visited once, in
// breadth-first order; an exchange that routes a message nowhere passes it to its alternate
// exchange, if that exists and was not visited. keys are the routing key and the
// CC and BCC header keys. The caller holds b.mu for reading.
func (r *router) routeLocked(b *Broker, x *Exchange, key string, headers Table, extra []string) {
	r.seen = append(r.seen, x)
	for i := 0; i < len(r.seen); i++ {
		x := r.seen[i]
		matched := x.matchLocked(key, headers, r)
		if headers != nil {
			forEachCC(headers, func(k string) { matched = x.matchLocked(k, headers, r) || matched })
		}
		for _, k := range extra {
			matched = x.matchLocked(k, headers, r) || matched
		}
		if !matched && x.cfg.alternate != "" {
			if ae := b.exchanges[x.cfg.alternate]; ae != nil {
				r.addExchange(ae)
			}
		}
	}
}

// matchLocked adds x's destinations for one routing key to r and reports whether there were any.
func (x *Exchange) matchLocked(key string, headers Table, r *router) bool {
	matched := false
	add := func(bd *binding) {
		matched = true
		if bd.queue != nil {
			r.addQueue(bd.queue)
		} else {
			r.addExchange(bd.exchange)
		}
	}
	switch {
	case x.name == "":
		if q := x.b.queues[key]; q != nil {
			r.addQueue(q)
			matched = true
		}
	case x.kind == ExchangeDirect:
		for _, bd := range x.direct[key] {
			add(bd)
		}
	case x.kind == ExchangeFanout:
		for _, bd := range x.bindings {
			add(bd)
		}
	case x.kind == ExchangeTopic:
		x.topic.match(key, add)
	case x.kind == ExchangeHeaders:
		for _, bd := range x.bindings {
			if bd.headers.match(headers) {
				add(bd)
			}
		}
	}
	return matched
}

// forEachCC calls fn with each routing key of the CC and BCC headers: arrays of strings
// (sender-selected distribution).
func forEachCC(headers Table, fn func(string)) {
	headerKeys(headers["CC"], fn)
	headerKeys(headers["BCC"], fn)
}

// headerKeys calls fn with each string of a CC or BCC header's array.
func headerKeys(v any, fn func(string)) {
	switch v := v.(type) {
	case []any:
		for _, k := range v {
			if s, ok := k.(string); ok {
				fn(s)
			}
		}
	case []string:
		for _, s := range v {
			fn(s)
		}
	}
}

// publish routes msg from x (or, when x is nil, the exchange named name), enqueues it and, on a
// durable broker, waits until the log holds it: the publisher confirm.
func (b *Broker) publish(ctx context.Context, x *Exchange, name, key string, msg *Message, opts []PublishOption) error {
	lsn, _, err := b.send(ctx, x, name, key, msg, opts)
	if cerr := b.confirm(ctx, lsn); cerr != nil {
		return cerr
	}
	return err
}

// send is publish without the wait for the log: it returns the log position that the publish
// is confirmed at (0 when it wrote nothing) and how many queues took the message, with the
// publish's error. A publish may fail and still have reached some queues (ErrQueueFull, a
// context that ended while a Block queue was full, a broker closing): the position is theirs.
func (b *Broker) send(ctx context.Context, x *Exchange, name, key string, msg *Message, opts []PublishOption) (wal.LSN, int, error) {
	var cfg publishConfig
	if len(opts) > 0 {
		cfg = publishOptions(opts) // by value: options cost no allocation (PublishOption)
	}
	if b.closed.Load() {
		return 0, 0, ErrClosed
	}
	if cfg.err != nil {
		return 0, 0, cfg.err
	}
	if cfg.immediate && cfg.delay > 0 {
		return 0, 0, errorf("publish: immediate with a delay: %w", ErrInvalidArgument)
	}
	if cfg.expiration != nil {
		msg.Expiration = *cfg.expiration // msg is Publish's copy
	}
	if len(key) > maxNameLen {
		return 0, 0, errorf("publish: routing key longer than %d bytes: %w", maxNameLen, ErrInvalidArgument)
	}
	if err := checkBodySize(len(msg.Body)); err != nil {
		return 0, 0, err
	}
	ttl, err := parseExpiration(msg.Expiration)
	if err != nil {
		return 0, 0, err
	}
	var headerCost int
	if msg.Headers != nil {
		// The log encodes AMQP field values only (codec.go): a durable broker checks their types
		// before a persistent message can reach a durable queue.
		if headerCost, err = checkHeaders(msg.Headers, b.store != nil && msg.Persistent); err != nil {
			return 0, 0, errorf("publish: %w", err)
		}
	}
	if name == "" && x == nil && msg.Headers == nil {
		return b.publishDefault(ctx, key, msg, ttl, cfg)
	}
	r := b.routers.Get().(*router)
	defer func() {
		r.reset()
		b.routers.Put(r)
	}()
	b.mu.RLock()
	if b.closed.Load() {
		b.mu.RUnlock()
		return 0, 0, ErrClosed
	}
	if x == nil {
		x = b.exchanges[name]
	}
	switch {
	case x == nil || x.deleted:
		b.mu.RUnlock()
		return 0, 0, errorf("publish to exchange %q: %w", name, ErrNotFound)
	case x.cfg.internal:
		b.mu.RUnlock()
		return 0, 0, errorf("publish to internal exchange %q: %w", name, ErrAccessRefused)
	}
	r.routeLocked(b, x, key, msg.Headers, nil)
	b.mu.RUnlock()
	if b.memoryAlarm(cfg, r.queues) {
		if err := b.waitMemory(ctx, cfg.blocked); err != nil {
			return 0, 0, err
		}
	}
	if b.store != nil && msg.Persistent {
		// Refused before any queue, or listener, sees it: a publisher told it failed may
		// publish it again, and the first copy must not be there.
		if err := b.store.refusePublish(r.queues); err != nil {
			return 0, 0, err
		}
	}

	env := b.newEnvelope(msg, x, key)
	if msg.Headers != nil {
		env.countHeaders(headerCost)
	}
	if env.more != nil && len(r.queues) == 1 {
		env.more.solo = true // a durable queue may page it out (pager.go)
	}
	if bcc, ok := msg.Headers["BCC"]; ok {
		// Stripped from the delivered message, kept for dead-letter routing.
		h := make(Table, len(msg.Headers)-1)
		for k, v := range msg.Headers {
			if k != "BCC" {
				h[k] = v
			}
		}
		env.more.msg.Headers = h // it has headers: it keeps its Message
		var keys []string
		headerKeys(bcc, func(k string) { keys = append(keys, k) })
		env.more.bcc = keys
	}
	if b.listening() {
		b.emit(Event{Kind: EventPublished, Exchange: x.name, RoutingKey: key, Message: env.messagePtr()})
	}
	routed, took := 0, 0
	var (
		full, failed error
		lsn          wal.LSN  // where the log must be written to before the publish is confirmed
		undecided    []*Queue // the refusals enqueue left to a move (Queue.refuseMoving)
	)
	for _, q := range r.queues {
		// A queue deleted since routing chose it takes nothing; as in RabbitMQ, that is not
		// an error for the publisher. A broker closed meanwhile is, and so is a context that
		// ended while a Block queue was full. A queue that refused the message leaves the
		// others to take it, and the publisher is told.
		at, err := q.enqueue(ctx, env, ttl, cfg)
		switch {
		case err == nil:
			routed++
			took++
			lsn = max(lsn, at)
		case errors.Is(err, ErrNoConsumers):
			routed++
		case errors.Is(err, ErrQueueFull):
			routed++
			full = err
			if cfg.moving && q.cfg.refusesToDLX() {
				undecided = append(undecided, q)
			}
		case !errors.Is(err, ErrNotFound):
			failed = err
		}
		if failed != nil {
			break
		}
	}
	for _, q := range undecided {
		q.refuseMoving(env, took > 0)
	}
	if failed != nil {
		return lsn, took, failed
	}
	if routed == 0 { // no route, or every queue routed to went meanwhile
		b.noRoute(x.name, key, env)
	}
	if full != nil {
		return lsn, took, full
	}
	if routed == 0 && cfg.mandatory {
		return lsn, took, errorf("publish to exchange %q with key %q: %w", name, key, ErrUnroutable)
	}
	if took == 0 && cfg.immediate {
		return lsn, took, errorf("immediate publish to exchange %q with key %q: %w", name, key, ErrNoConsumers)
	}
	return lsn, took, nil
}

// publishDefault is publish's fast path for the commonest case: the default exchange, which
// routes to the one queue named by the key, with no headers, so no CC or BCC keys.
func (b *Broker) publishDefault(ctx context.Context, key string, msg *Message, ttl time.Duration, cfg publishConfig) (wal.LSN, int, error) {
	if b.closed.Load() {
		return 0, 0, ErrClosed
	}
	var q *Queue
	if v, ok := b.byName.Load(key); ok {
		q = v.(*Queue) // it may be ending: enqueue says so, under its lock
		if b.mem.over.Load() && b.memoryAlarm(cfg, []*Queue{q}) {
			if err := b.waitMemory(ctx, cfg.blocked); err != nil {
				return 0, 0, err
			}
		}
		if q.log != nil && msg.Persistent {
			if err := b.store.refusePublish([]*Queue{q}); err != nil {
				return 0, 0, err // as send refuses it
			}
		}
	}
	env := b.newEnvelope(msg, b.defaultX, key)
	if env.more != nil {
		env.more.solo = true // one queue at most: a durable queue may page it out (pager.go)
	}
	if b.listening() {
		b.emit(Event{Kind: EventPublished, RoutingKey: key, Message: env.messagePtr()})
	}
	if q != nil {
		lsn, err := q.enqueue(ctx, env, ttl, cfg)
		switch {
		case err == nil:
			return lsn, 1, nil
		case cfg.moving && q.cfg.refusesToDLX() && errors.Is(err, ErrQueueFull):
			q.refuseMoving(env, false) // the one queue: nothing took the message
			return lsn, 0, err
		case !errors.Is(err, ErrNotFound): // why it was not taken
			return lsn, 0, err
		}
	}
	b.noRoute("", key, env) // no such queue, or it went meanwhile
	switch {
	case cfg.mandatory:
		return 0, 0, errorf("publish to exchange \"\" with key %q: %w", key, ErrUnroutable)
	case cfg.immediate:
		return 0, 0, errorf("immediate publish with key %q: %w", key, ErrNoConsumers)
	}
	return 0, 0, nil
}

// noRoute counts and events a publish that reached no queue. The caller holds no lock.
func (b *Broker) noRoute(exchange, key string, env *envelope) {
	b.unroutable.Add(1)
	if b.listening() {
		b.emit(Event{Kind: EventUnroutable, Exchange: exchange, RoutingKey: key, Message: env.messagePtr()})
	}
}

func publishOptions(opts []PublishOption) publishConfig {
	var cfg publishConfig
	for _, o := range opts {
		if o != nil {
			cfg = o.applyPublish(cfg)
		}
	}
	return cfg
}

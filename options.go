package warren

import (
	"context"
	"log/slog"
	"maps"
	"strconv"
	"time"

	"github.com/warrenmq/warren/internal/wal"
)

// Limits shared by names, keys and tags (AMQP's shortstr) and by prefetch (a 16-bit field).
const (
	maxNameLen  = 255
	maxPrefetch = 65535
)

// DefaultPrefetch is the prefetch count of a consumer started without [Prefetch].
const DefaultPrefetch = 64

// Options. Each call has one option type, so that an option given to the wrong call fails to
// compile; an option that fits several calls returns a type that is all of them.

// BrokerOption configures a [Broker]; see [New].
type BrokerOption interface{ applyBroker(*brokerConfig) }

// QueueOption configures a queue declaration; see [Broker.DeclareQueue].
type QueueOption interface{ applyQueue(*queueConfig) }

// ExchangeOption configures an exchange declaration; see [Broker.DeclareExchange].
type ExchangeOption interface{ applyExchange(*exchangeConfig) }

// DeclareOption configures a declaration of either a queue or an exchange: it is both a
// [QueueOption] and an [ExchangeOption].
type DeclareOption interface {
	QueueOption
	ExchangeOption
}

// ConsumeOption configures how a queue is consumed: by a consumer ([Queue.Consume]), by a
// handler runner ([Queue.Serve], which takes every ConsumeOption but [AutoAck]), or by one
// [Queue.Get] (which takes [AutoAck] only). Those two refuse the others with
// [ErrInvalidArgument].
type ConsumeOption interface {
	applyConsume(*consumeConfig)
	ServeOption
}

// ServeOption configures a handler runner; see [Queue.Serve]. Every [ConsumeOption] is one.
type ServeOption interface{ applyServe(*serveConfig) }

// PublishOption configures one publish; see [Broker.Publish].
type PublishOption interface {
	// applyPublish returns c with the option applied: by value, so that a publish's
	// configuration stays on its goroutine's stack (a pointer through an interface escapes).
	applyPublish(c publishConfig) publishConfig
}

// CallOption configures a call that uses a queue or an exchange by name: a lookup
// ([Broker.Queue]), [Broker.Bind], [Broker.Unbind], a purge ([Broker.Purge], [Queue.Purge]), a
// deletion ([Broker.DeleteQueue], [Broker.DeleteExchange]).
type CallOption interface{ applyCall(*callConfig) }

// ConsumerOption is the former name of [ConsumeOption].
//
// Deprecated: use ConsumeOption.
type ConsumerOption = ConsumeOption

// GetOption is the former name of the options of [Queue.Get], which are ConsumeOptions.
//
// Deprecated: use ConsumeOption.
type GetOption = ConsumeOption

// DeleteOption is the former name of [CallOption].
//
// Deprecated: use CallOption.
type DeleteOption = CallOption

type brokerConfig struct {
	logger *slog.Logger
	wal    wal.Options // a durable broker's log (durable.go)
	// listeners are registered before the broker does anything (WithListener).
	listeners []func(Event)
	// memoryLimit is WithMemoryLimit's, when memoryLimitSet (memory.go).
	memoryLimit    int64
	memoryLimitSet bool
	// pageWindow is how many ready messages a durable queue of a durable broker keeps in memory
	// before it pages the newest out to the log (pager.go); 0: it never pages.
	pageWindow int
	// checkpointEvery is how many segments the log starts between two checkpoints
	// (checkpoint.go); tests set it lower (checkpointEvery).
	checkpointEvery int
}

func defaultBrokerConfig() brokerConfig {
	return brokerConfig{logger: slog.New(slog.DiscardHandler), pageWindow: DefaultPageWindow, checkpointEvery: checkpointEvery}
}

type consumeConfig struct {
	prefetch    int
	autoAck     bool
	tag         string
	exclusive   bool
	priority    int
	selector    func(*Message) bool
	ackTimeout  time.Duration // -1 for the queue's default
	prefetchSet bool
	served      bool            // started by Serve
	owner       context.Context // on whose behalf the consumer runs (Serve's ctx); nil: its own context
	err         error           // the first invalid option
}

func defaultConsumeConfig() consumeConfig {
	return consumeConfig{prefetch: DefaultPrefetch, ackTimeout: -1}
}

type publishConfig struct {
	mandatory  bool
	immediate  bool
	delay      time.Duration
	expiration *string    // ExpireAfter's Expiration, when given
	blocked    func(bool) // WhileBlocked's
	err        error      // an invalid option
	// deadReason is the x-death reason of a dead letter being published: the Reason of its
	// EventEnqueued.
	deadReason Reason
	// moving marks the publish of a message that Queue.Move takes out of its queue: a
	// reject-publish-dlx queue's refusal is left to the mover (Queue.refuseMoving).
	moving bool
}

type callConfig struct {
	ifUnused bool
	ifEmpty  bool
	owner    context.Context // on whose behalf the call runs (As); nil: nobody's in particular
	err      error           // an invalid option
}

// WithLogger sets the broker's logger. The default discards everything; warren never logs to
// [slog.Default]. A nil logger keeps the default.
func WithLogger(l *slog.Logger) BrokerOption { return loggerOption{l} }

type loggerOption struct{ l *slog.Logger }

func (o loggerOption) applyBroker(c *brokerConfig) {
	if o.l != nil {
		c.logger = o.l
	}
}

// Durable marks a queue or exchange durable: a durable broker ([Open]) keeps it, its bindings to
// and from other durable ends, and (a queue) its persistent messages. It takes part in declare
// equivalence; in a broker from [New] it has no other effect. Default: transient.
func Durable() DeclareOption {
	return flagOption{durable: true}
}

// AutoDelete makes a queue delete itself when its last consumer goes, once it has had one, or
// an exchange delete itself when its last binding as a source is removed, once it has had one.
// It takes part in declare equivalence. Default: off.
func AutoDelete() DeclareOption {
	return flagOption{autoDelete: true}
}

// Internal makes an exchange internal: it cannot be published to, only reached through
// exchange-to-exchange bindings. It takes part in declare equivalence. Default: off.
func Internal() ExchangeOption { return flagOption{internal: true} }

type flagOption struct{ durable, autoDelete, internal bool }

func (o flagOption) applyQueue(c *queueConfig) {
	c.durable = c.durable || o.durable
	c.autoDelete = c.autoDelete || o.autoDelete
}

func (o flagOption) applyExchange(c *exchangeConfig) {
	c.durable = c.durable || o.durable
	c.autoDelete = c.autoDelete || o.autoDelete
	c.internal = c.internal || o.internal
}

// AlternateExchange names the exchange that receives what this exchange cannot route,
// the same as the "alternate-exchange" argument. The alternate need not exist yet.
func AlternateExchange(name string) ExchangeOption { return alternateOption(name) }

type alternateOption string

func (o alternateOption) applyExchange(c *exchangeConfig) { c.alternate = string(o) }

// Arguments sets a declaration's AMQP arguments, as RabbitMQ takes them, so that a topology
// written for RabbitMQ can be declared unchanged. Values must be AMQP field types (see [Table]),
// else the declaration fails with [ErrPreconditionFailed]. For an exchange, "alternate-exchange"
// (a string) is understood. For a queue, the arguments RabbitMQ compares on redeclaration
// ("x-message-ttl", "x-expires", "x-dead-letter-exchange", "x-dead-letter-routing-key",
// "x-max-length", "x-max-length-bytes", "x-overflow", "x-delivery-limit", "x-max-priority",
// "x-single-active-consumer", "x-queue-type") are kept and compared; others are kept and not
// compared. "x-queue-type" may only be "classic": warren has no quorum or stream queues. Later
// Arguments options are merged over earlier ones.
func Arguments(t Table) DeclareOption {
	return argumentsOption(t)
}

type argumentsOption Table

func (o argumentsOption) applyQueue(c *queueConfig) { c.args = mergeTables(c.args, Table(o)) }

func (o argumentsOption) applyExchange(c *exchangeConfig) {
	c.args = mergeTables(c.args, Table(o))
}

func mergeTables(dst, src Table) Table {
	if len(src) == 0 {
		return dst
	}
	if dst == nil {
		dst = make(Table, len(src))
	}
	maps.Copy(dst, src)
	return dst
}

// MessageTTL sets the queue's message TTL, the "x-message-ttl" argument: a message still ready
// d after it entered the queue expires, wherever it is in the queue, and is dead-lettered with
// reason "expired" (or dropped without a dead-letter exchange). A message's own
// [Message.Expiration] applies when it is lower. 0 means a message is delivered at once or
// expires. Range 0 to 2^32-1 milliseconds, in whole milliseconds (RabbitMQ's unit); else the
// declaration fails with [ErrInvalidArgument]. Default: no TTL.
func MessageTTL(d time.Duration) QueueOption { return msTTLOption{"x-message-ttl", d} }

type msTTLOption struct {
	arg string
	d   time.Duration
}

func (o msTTLOption) applyQueue(c *queueConfig) {
	var v any = int64(o.d / time.Millisecond)
	if o.d < 0 || o.d > maxTTL || o.d%time.Millisecond != 0 {
		v = invalidOption{errorf("%s %v: not a whole number of milliseconds from 0 to 2^32-1: %w", o.arg, o.d, ErrInvalidArgument)}
	}
	c.args = mergeTables(c.args, Table{o.arg: v})
}

// MaxLength limits the queue to n ready messages, the "x-max-length" argument; unacknowledged
// messages do not count. What happens at the limit is the [Overflow] policy. Range n ≥ 0;
// default: no limit.
func MaxLength(n int) QueueOption { return intOption{"x-max-length", int64(n), 0, 0} }

// MaxLengthBytes limits the total body size of the queue's ready messages to n bytes, the
// "x-max-length-bytes" argument (headers and properties do not count). What happens at the
// limit is the [Overflow] policy. Range n ≥ 0; default: no limit.
func MaxLengthBytes(n int) QueueOption { return intOption{"x-max-length-bytes", int64(n), 0, 0} }

// DeliveryLimit dead-letters a message with reason "delivery_limit" (or drops it, without a
// dead-letter exchange) when it comes back to the queue more than n times, the
// "x-delivery-limit" argument: n = 2 allows three deliveries. Every return counts — a
// Nack, a consumer or Get context that ended, Recover; [Delivery.DeliveryCount] says how many
// there were before a delivery. It is the guard against a poison message redelivered forever.
// Range n ≥ 0; default: no limit.
//
// On a durable queue of a broker from [Open] a crash counts too: a persistent message out with
// the application when the process stopped comes back with its count one higher, if the
// application received it — a [Queue.Serve] worker took it to run the handler (logged before
// the handler runs, so a handler that takes the process down still counts), or [Queue.Get]
// returned it. A message only buffered for a Serve's workers comes back unchanged, as
// [Consumer.Cancel] returns it. A delivery sent into a [Consumer.Deliveries] channel counts from
// then on, received or not, since warren cannot see the receive: as RabbitMQ's quorum queues
// count a message in a client's prefetch buffer when its connection dies.
func DeliveryLimit(n int) QueueOption { return intOption{"x-delivery-limit", int64(n), 0, 0} }

type intOption struct {
	arg            string
	n, least, most int64 // most 0: no upper bound
}

func (o intOption) applyQueue(c *queueConfig) {
	var v any = o.n
	switch {
	case o.n < o.least:
		v = invalidOption{errorf("%s %d: below %d: %w", o.arg, o.n, o.least, ErrInvalidArgument)}
	case o.most != 0 && o.n > o.most:
		v = invalidOption{errorf("%s %d: above %d: %w", o.arg, o.n, o.most, ErrInvalidArgument)}
	}
	c.args = mergeTables(c.args, Table{o.arg: v})
}

// Expires deletes the queue, with its messages (nothing is dead-lettered), once it has been
// unused for d, the "x-expires" argument. Unused means no consumers, no [Queue.Get] and no
// declaration of it ([Broker.DeclareQueue] or [Broker.Queue]) for d; publishing to it does not
// count. Range 1 ms to 2^32-1 ms, whole milliseconds; default: never.
func Expires(d time.Duration) QueueOption { return msTTLOption{"x-expires", d} }

// OverflowPolicy is what a queue does when a message would take it past its [MaxLength] or
// [MaxLengthBytes].
type OverflowPolicy string

// Overflow policies: RabbitMQ's three, and Block.
const (
	// DropHead enqueues the new message, then drops messages from the head (the oldest) until
	// the queue is within its limits, dead-lettering them with reason "maxlen". The check also
	// runs after messages come back to the queue, so returned messages, being at the head, are
	// the first dropped. The default.
	DropHead OverflowPolicy = "drop-head"
	// RejectPublish refuses the new message: [Broker.Publish] returns [ErrQueueFull] (other
	// queues the message routed to still take it).
	RejectPublish OverflowPolicy = "reject-publish"
	// RejectPublishDLX refuses it as RejectPublish does, and dead-letters it with reason
	// "maxlen".
	RejectPublishDLX OverflowPolicy = "reject-publish-dlx"
	// Block makes [Broker.Publish] wait until the queue has room, or until its context ends:
	// backpressure, warren's own (RabbitMQ has no such policy; its argument value is "block").
	// Dead letters are never waited for: one that finds a Block queue full is dropped. A body
	// larger than the queue's [MaxLengthBytes] can never fit and is refused at once with
	// [ErrQueueFull]; waiting publishers are let through in turn, each when its body fits.
	Block OverflowPolicy = "block"
)

// Overflow sets the queue's overflow policy, the "x-overflow" argument. Default: [DropHead].
func Overflow(p OverflowPolicy) QueueOption { return overflowOption(p) }

type overflowOption OverflowPolicy

func (o overflowOption) applyQueue(c *queueConfig) {
	c.args = mergeTables(c.args, Table{"x-overflow": string(o)})
}

// invalidOption stands in an argument for a typed option whose value was invalid, so that the
// declaration reports the option's own error.
type invalidOption struct{ err error }

// DeadLetter sets the queue's dead-letter exchange, the "x-dead-letter-exchange" argument, and,
// when routingKey is not empty, the "x-dead-letter-routing-key" argument. Messages that expire,
// are rejected or dropped by a length limit are republished through exchange (which may be ""
// and need not exist yet) with their death recorded in the x-death header; with routingKey,
// under that key, else under their own routing keys. Default: none; such messages
// are dropped.
func DeadLetter(exchange, routingKey string) QueueOption {
	return deadLetterOption{exchange, routingKey}
}

type deadLetterOption struct{ exchange, routingKey string }

func (o deadLetterOption) applyQueue(c *queueConfig) {
	t := Table{"x-dead-letter-exchange": o.exchange}
	if o.routingKey != "" {
		t["x-dead-letter-routing-key"] = o.routingKey
	}
	c.args = mergeTables(c.args, t)
}

// Prefetch sets how many deliveries a consumer may hold unsettled at once, received or buffered
// in its channel: AMQP's per-consumer basic.qos prefetch count. Range 0 to 65535; default
// [DefaultPrefetch]. An in-process consumer's deliveries wait in a channel of this capacity,
// allocated when the consumer starts, about 350 bytes a slot (a [Delivery] value, 344 bytes on
// 64-bit platforms): 22 MB at the largest prefetch. An AutoAck consumer holds at most this many
// messages too: prefetch-1 buffered in its channel and one being handed over.
//
// 0 is AMQP's "unlimited": the consumer may hold any number of deliveries unsettled, and takes
// messages as fast as the application receives them; its channel has [DefaultPrefetch] slots,
// and what it has no room for stays in the queue (where TTLs and length limits apply), as a
// RabbitMQ client with prefetch 0 is sent messages until its connection pushes back. Room made
// by receiving is noticed within a few milliseconds (a timer), at once when the application
// settles. [Queue.Serve] refuses 0: its workers take what the consumer buffers. For an AutoAck
// consumer, 0 is [DefaultPrefetch].
func Prefetch(n int) ConsumeOption {
	return consumerOption(func(c *consumeConfig) { c.prefetch, c.prefetchSet = n, true })
}

// consumerOption is a ConsumeOption: Serve passes it on to the consumer it starts.
type consumerOption func(*consumeConfig)

func (o consumerOption) applyConsume(c *consumeConfig) { o(c) }
func (o consumerOption) applyServe(c *serveConfig)     { o(&c.consume) }

// ConsumerTag names a consumer. Tags are unique among a queue's consumers. Default: a
// generated "amq.ctag-…".
func ConsumerTag(tag string) ConsumeOption {
	return consumerOption(func(c *consumeConfig) { c.tag = tag })
}

// Exclusive makes a consumer the queue's only one (AMQP's exclusive consume): it fails
// with [ErrAccessRefused] if the queue has consumers, and while it is active every other
// [Queue.Consume] on the queue fails with [ErrAccessRefused]. Exclusivity ends when the consumer
// stops; nothing takes over (contrast [SingleActiveConsumer]). Not allowed on a single
// active consumer queue ([ErrAccessRefused]).
func Exclusive() ConsumeOption { return consumerOption(func(c *consumeConfig) { c.exclusive = true }) }

// ConsumerPriority sets a consumer's priority, AMQP's "x-priority" consumer argument:
// while any consumer of a higher priority has credit (and, with a [Selector], accepts the
// message), consumers of lower priorities receive nothing; consumers of one priority share
// round-robin. Any int; larger is higher; default 0.
func ConsumerPriority(p int) ConsumeOption {
	return consumerOption(func(c *consumeConfig) { c.priority = p })
}

// Selector gives a consumer a filter (Qpid's selectors): it receives only the messages
// for which accept returns true, the first such in queue order each time, so what it receives
// keeps the queue's order. Messages it skips keep their places for other consumers and for
// [Queue.Get]; a message no consumer accepts stays until its TTL, a length limit or a purge
// removes it.
//
// accept runs under the queue's lock, as messages are dispatched: it must be fast, must not
// block and must not call into the broker, and it should depend on the message alone (it may be
// called from any goroutine). The *Message it is given is valid only during the call: accept must
// not keep it. A panic in it counts as false.
//
// Cost: each consumer keeps a cursor in the queue (one per priority level), so accept sees each
// ready message at most once while the message stays ready — and again only after a message
// returns ahead of the cursor (a Nack, a context end), when the cursor moves back to it. A
// dispatch to a selective consumer therefore costs O(log n) per priority level plus the messages
// it skips, and skipping is paid once per message, not once per delivery: about 250–370 ns per
// published message on the development machine, whatever the match rate (BENCHMARKS.md).
// [Queue.Get] ignores selectors.
func Selector(accept func(*Message) bool) ConsumeOption {
	return consumerOption(func(c *consumeConfig) {
		if accept == nil && c.err == nil {
			c.err = errorf("consume: nil selector: %w", ErrInvalidArgument)
		}
		c.selector = accept
	})
}

// AckTimeout bounds how long a consumer may hold a delivery unsettled (RabbitMQ's consumer
// timeout): when a delivery made to it d ago, buffered or received, is still outstanding,
// the consumer is ended as if its context had: it stops with [Consumer.Err] wrapping
// [ErrAckTimeout], Deliveries is closed, and everything it holds returns to its original
// position — buffered unread deliveries unchanged, received ones redelivered with their delivery
// count one higher (so [DeliveryLimit] bounds a message that hangs every handler). Settling a
// returned delivery later fails with [ErrAlreadySettled]. It applies to consumers with manual
// acknowledgement only. Default: the queue's "x-consumer-timeout" argument, else none; d ≤ 0
// means none; d is capped at about 146 years (1<<62 ns). The queue's "x-consumer-timeout" also
// bounds each [Queue.Get] delivery: one held past it goes back to its original position,
// redelivered.
func AckTimeout(d time.Duration) ConsumeOption {
	return consumerOption(func(c *consumeConfig) { c.ackTimeout = min(max(d, 0), maxWait) })
}

// MaxPriority makes the queue a priority queue, the "x-max-priority" argument: messages
// with a higher [Message.Priority] are delivered first, those of one priority in queue order,
// and a priority above n counts as n. A returned message goes back to its original position
// within its priority. Range 1 to 255 (RabbitMQ advises at most 10); default: no priorities.
func MaxPriority(n int) QueueOption { return intOption{"x-max-priority", int64(n), 1, maxPriority} }

// maxPriority is the largest "x-max-priority".
const maxPriority = 255

// SingleActiveConsumer makes the queue deliver to one consumer at a time, the
// "x-single-active-consumer" argument. The first consumer is active; the others wait,
// registered but receiving nothing, highest [ConsumerPriority] first, then in the order they
// arrived. When the active consumer stops (Cancel, its context ends, an ack timeout), the next
// waiting one becomes active at once; when it stopped because its context ended, everything it
// held is back in its place before the next one receives, so the queue's order holds across
// the change.
func SingleActiveConsumer() QueueOption {
	return argumentsOption(Table{"x-single-active-consumer": true})
}

// ExclusiveTo makes the queue exclusive to ctx (AMQP's exclusive queue, with ctx as the
// connection): it is deleted, with its messages, when ctx ends, and only ctx's owner may use it.
// Every other use — declaring it again with another owner or none, looking it up, binding,
// unbinding, purging or deleting it on behalf of another ([As]), consuming from it or getting
// from it with another context — fails with [ErrResourceLocked]; anyone may publish to it. The
// owner is ctx, and the contexts derived from ctx with [context.WithValue]; if ctx was made by
// [NewOwner] (or derived from such a context), every context derived from that owner.
func ExclusiveTo(ctx context.Context) QueueOption { return exclusiveOption{ctx} }

type exclusiveOption struct{ ctx context.Context }

func (o exclusiveOption) applyQueue(c *queueConfig) {
	if o.ctx == nil {
		c.args = mergeTables(c.args, Table{"exclusive": invalidOption{errorf("ExclusiveTo(nil): %w", ErrInvalidArgument)}})
		return
	}
	c.owner = o.ctx
}

// AutoAck settles each delivery as it is handed over (AMQP's no-ack mode): nothing is
// outstanding, nothing comes back, and the settlement methods return [ErrUnknownDelivery]. A
// consumer's messages leave the queue when its goroutine takes them to hand over, at most
// [Prefetch] at a time (one being handed over, the rest buffered in its channel); those not yet
// received when the consumer stops go back to their places unchanged. Default: off (manual
// acknowledgement).
func AutoAck() ConsumeOption { return consumerOption(func(c *consumeConfig) { c.autoAck = true }) }

// Mandatory makes a publish that reaches no queue fail with [ErrUnroutable] instead of being
// dropped (AMQP's mandatory flag, basic.return). Default: off.
func Mandatory() PublishOption { return publishFlag{mandatory: true} }

// Immediate makes a publish deliver at once or not at all (AMQP 0-9-1's immediate flag, which
// Qpid keeps and RabbitMQ dropped): each queue the message routes to takes it only if one
// of its consumers with credit takes it now — with nothing ready ahead of it — and otherwise
// leaves it out. If no queue took it, [Broker.Publish] returns [ErrNoConsumers]. Default: off.
func Immediate() PublishOption { return publishFlag{immediate: true} }

type publishFlag struct{ mandatory, immediate bool }

func (o publishFlag) applyPublish(c publishConfig) publishConfig {
	c.mandatory = c.mandatory || o.mandatory
	c.immediate = c.immediate || o.immediate
	return c
}

// DeliverAfter delays a message: in each queue it reaches it takes its place at once (ahead of
// what is published after it, once visible) but stays hidden from consumers until d has passed.
// Its TTL runs from publication; if it passes while the message is hidden, the message expires
// when d has passed (a TTL of 0 with a delay expires then, not at publication). Delayed messages
// are not counted by [Queue.Len] nor by length limits until they rejoin the queue. A d ≤ 0 is no
// delay; d is capped at about 146 years (1<<62 ns), so that a huge delay, up to the largest
// Duration, hides the message practically forever without disturbing the queue's other
// deadlines. RabbitMQ has no such property (its delayed-message exchange plugin comes closest).
func DeliverAfter(d time.Duration) PublishOption { return delayOption(d) }

type delayOption time.Duration

func (o delayOption) applyPublish(c publishConfig) publishConfig {
	c.delay = time.Duration(o)
	return c
}

// ExpireAfter gives the message a TTL of d in every queue it reaches, as a duration: it sets
// [Message.Expiration], the AMQP property, to d in milliseconds (replacing what the message had).
// The queue's own [MessageTTL] applies when it is lower. Range 0 to 2^32-1 milliseconds, in whole
// milliseconds (RabbitMQ's unit); else the publish fails with [ErrInvalidArgument].
func ExpireAfter(d time.Duration) PublishOption {
	return publishOption(func(c *publishConfig) {
		if d < 0 || d > maxTTL || d%time.Millisecond != 0 {
			c.err = errorf("publish: ExpireAfter(%v): not a whole number of milliseconds from 0 to 2^32-1: %w", d, ErrInvalidArgument)
			return
		}
		exp := strconv.FormatInt(int64(d/time.Millisecond), 10)
		c.expiration = &exp
	})
}

// WhileBlocked makes a publish that waits for room in a full [Block] queue, or for the broker's
// memory alarm to clear ([WithMemoryLimit]; [Broker.Memory] tells which), call fn(true) as it
// starts waiting and fn(false) once it stops (it got room, or its ctx ended), once per wait, on
// the publishing goroutine and with no lock of the broker held. An AMQP server tells its
// client with connection.blocked and connection.unblocked. fn must not block. Default: none.
func WhileBlocked(fn func(blocked bool)) PublishOption {
	return blockedOption(fn)
}

type blockedOption func(blocked bool)

func (o blockedOption) applyPublish(c publishConfig) publishConfig {
	c.blocked = o
	return c
}

// publishOption is an option that sets the configuration through a pointer: for the rarer
// ones, whose cost (the configuration escaping) is not on every publish.
type publishOption func(*publishConfig)

func (o publishOption) applyPublish(c publishConfig) publishConfig {
	o(&c)
	return c
}

// IfUnused makes a deletion fail with [ErrPreconditionFailed] if a queue has consumers or an
// exchange has bindings as a source.
func IfUnused() CallOption { return callOption(func(c *callConfig) { c.ifUnused = true }) }

// IfEmpty makes a queue deletion fail with [ErrPreconditionFailed] if the queue has ready
// messages (unacknowledged ones do not count).
func IfEmpty() CallOption { return callOption(func(c *callConfig) { c.ifEmpty = true }) }

type callOption func(*callConfig)

func (o callOption) applyCall(c *callConfig) { o(c) }

func callOptions(opts []CallOption) callConfig {
	var cfg callConfig
	for _, o := range opts {
		if o != nil {
			o.applyCall(&cfg)
		}
	}
	return cfg
}

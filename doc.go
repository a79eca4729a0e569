// Package warren is an in-process message broker with RabbitMQ's semantics: exchanges, bindings,
// queues, consumers and acknowledgements, as a library, with no socket and no second process;
// in memory ([New]), or durable on a directory of its own ([Open]).
//
// # Concepts
//
// A [Broker] is a namespace (RabbitMQ's virtual host). Publishers send a [Message] to an
// [Exchange] with a routing key; the exchange routes it through its bindings to queues (and to
// other exchanges); each [Queue] keeps its messages in order and hands them to its consumers;
// a [Consumer] receives [Delivery] values and settles each one.
//
//	Publish(exchange, key, msg) → Exchange ─binding→ [Exchange …] → Queue → Consumer → Delivery.Ack
//
// Exchanges route as RabbitMQ's do: the default exchange "" (every queue is bound to it by its
// name), direct (key equality), fanout (every binding), topic (dotted words with "*" for one
// word and "#" for zero or more; empty words are words), headers (x-match all, any, all-with-x,
// any-with-x; numbers compare by value across widths) and exchange-to-exchange bindings. A
// message reaches each queue once however many paths lead there; cycles are harmless. An
// exchange that routes a message nowhere hands it to its alternate exchange, if it has one.
// A [Mandatory] publish that reaches no queue fails with [ErrUnroutable].
//
// # Delivery guarantees
//
// Delivery is at least once. A message leaves a queue only when it is acknowledged ([Delivery.Ack],
// [Consumer.AckUpTo]), rejected, or delivered with [AutoAck]; a message whose consumer fails to
// settle it comes back and is delivered again, with [Delivery.Redelivered] set. Consumers must
// therefore be idempotent. A broker from [New] is in memory: nothing survives the process. A
// broker from [Open] keeps the [Durable] queues and exchanges and the [Message.Persistent]
// messages in durable queues across restarts and crashes, as RabbitMQ does (see [Open] for what
// comes back, and [SyncPolicy] for what a power loss may take). Its durable queues keep a window
// of ready messages in memory ([WithPageWindow], 16,384 by default) and the rest of their
// backlog on disk; the broker's memory budget ([WithMemoryLimit]) bounds what stays in memory.
//
// [Broker.Publish] returns the publisher confirm synchronously: nil means the message is in every
// queue it routed to (and, on a durable broker, in the log). [Broker.PublishBatch] confirms many
// messages at once, and [Broker.PublishDeferred] confirms later, through a [Confirmation]: AMQP's
// asynchronous confirms, for a publisher that streams to a durable broker. Publishing blocks
// only on a full queue with the [Block] overflow policy.
//
// # Ordering, requeue and redelivery
//
// Each message that enters a queue gets the queue's next sequence id, and the queue hands out its
// ready messages in that order. A message that comes back — [Delivery.Nack], [Consumer.NackUpTo],
// [Consumer.Recover], or a consumer or Get context that ended — is put back under its original
// sequence id: it lands exactly where it was, ahead of every message published after it, marked
// redelivered, with [Delivery.DeliveryCount] one higher (RabbitMQ's classic-queue behaviour).
// With several consumers the queue stays ordered while deliveries interleave among consumers.
//
// # Consumers and acknowledgement
//
// [Queue.Consume] starts a consumer that receives on a channel while it has prefetch credit
// ([Prefetch], default [DefaultPrefetch]): deliveries are pushed under the queue's lock, round
// robin among consumers with credit, into a channel whose capacity is the prefetch, so the
// broker never blocks on a slow consumer and no buffer is unbounded. [Queue.Get] pulls one
// message without waiting and returns [ErrEmpty] when there is none.
//
// Lifetimes mirror AMQP's channel through [context.Context]:
//   - [Consumer.Cancel] stops new deliveries and closes the channel; deliveries buffered in it
//     and never received go back unchanged; deliveries already received stay settle-able.
//   - When the context given to Consume ends, every delivery the consumer received and has not
//     settled goes back to its original position, redelivered; deliveries still buffered in its
//     channel, never received, go back unchanged. The same holds for a Get delivery and the
//     context given to Get. Everything one context owns goes back together, before anything is
//     dispatched again. [Consumer.Close] does the same for one consumer and returns once it is
//     done; [Broker.WaitReleased] waits until everything a context owned is back.
//   - [Consumer.Done] is closed when the consumer has ended: it receives nothing more and holds
//     nothing more.
//   - Settling twice returns [ErrAlreadySettled]; settling a delivery that already went back
//     returns it too; settling one the consumer never issued returns [ErrUnknownDelivery].
//     Settling a delivery whose queue was deleted succeeds and does nothing, as in RabbitMQ.
//
// # Priorities, exclusivity and selectors
//
//   - A queue declared with [MaxPriority] delivers higher [Message.Priority] first, in queue order
//     within a priority; a returned message goes back to its place within its priority.
//   - A consumer with a higher [ConsumerPriority] receives every message while it has credit;
//     consumers of one priority share round robin.
//   - [Exclusive] makes a consumer the queue's only one; [SingleActiveConsumer] makes the queue
//     deliver to one consumer at a time, the others waiting their turn and taking over in order.
//   - A [Selector] makes a consumer receive only the messages it accepts, still in queue order;
//     the others keep their places.
//   - [ExclusiveTo] ties a queue to an owner context, which alone may use it and whose end
//     deletes it: every other use is refused with [ErrResourceLocked], and calls that take no
//     context say on whose behalf they run with [As]. [NewOwner] makes an owner whose derived
//     contexts (with their own cancellation too) are the same owner, as an AMQP connection's
//     channels are. [AutoDelete] deletes a queue when its last consumer goes.
//   - [AckTimeout] ends a consumer that holds a delivery unsettled for too long, returning
//     everything it holds; [Immediate] publishes only if a consumer takes the message at once.
//
// # Running handlers
//
// [Queue.Serve] runs a handler on a fixed pool of [Workers] and settles each delivery by its
// result: nil acks, an error returns the message to its place (at once or after a [Backoff]),
// [ErrPermanent] rejects it, and a panic is recovered, logged and counted as a failure. The
// queue's [DeliveryLimit] bounds the attempts, after which the message is dead-lettered. When its
// context ends, Serve stops taking messages and starts no handler again, lets the running
// handlers finish — their context cancelled at once, or after a [GracePeriod] — applies their
// results and returns what is left to the queue. [OnStart] tells a caller when Serve's consumer is
// in place, and [Queue.WaitEmpty] lets a service finish what is in a queue before it stops.
//
// [Middleware] wraps the handler in func(Handler) Handler layers, as net/http middleware does,
// the first outermost, around each attempt at a message: [HandlerTimeout] bounds an attempt,
// and a timed-out attempt fails like any error. Serve recovers panics in the whole chain.
//
// Typed payloads: [PublishJSON] (or [Encode] with any [Codec]) puts a value in a message body,
// and [JSONHandler] (or [CodecHandler]) makes a Handler of a func(ctx, T, Delivery) error. A
// body that does not decode never reaches it: it is a permanent failure, rejected on its first
// delivery (dead-lettered with reason "rejected"), and Serve logs the decode error.
//
// # Differences from RabbitMQ
//
// Every deliberate difference is listed here; any other is a bug.
//   - There are no connections or channels, only contexts: a context owns consumers and Get
//     deliveries as a channel does, and exclusive queues as a connection does. Calls that take
//     no context say whose they are with [As]. A context derived from an owner with its own
//     cancellation is the owner only if the owner was made by [NewOwner] (Go cannot tell
//     otherwise).
//   - Delivery tags are per consumer (per queue for Get), and multiple-acknowledgement
//     ([Consumer.AckUpTo] and the like) is per consumer and covers received deliveries only.
//   - Deliveries buffered in a consumer's channel but never received are not "delivered": when
//     the consumer stops (Cancel, Close, its context ends, Recover) they go back to their places
//     unchanged, not marked redelivered; Cancel puts them back at once. In AMQP they were
//     already on the wire: they stay unacked until the channel closes and then come back
//     redelivered.
//   - Prefetch is per consumer, 1 to 65535: neither 0 (unlimited) nor a channel-wide (global)
//     prefetch is offered; see [Prefetch].
//   - [Broker.Publish] returns the publisher confirm synchronously, and a [Mandatory] publish
//     that reaches no queue fails with [ErrUnroutable] rather than a basic.return.
//   - A per-message TTL expires a message at its deadline wherever it is in the queue; a classic
//     queue of RabbitMQ's expires messages only at its head.
//   - [AckTimeout] is per consumer (or per queue, "x-consumer-timeout"), measured from the
//     dispatch of each delivery and enforced to the nanosecond by the queue's timer, not checked
//     once a minute. It ends the consumer, not the channel, as RabbitMQ 4.3's quorum queues do;
//     the deliveries it returns count as redeliveries, so a [DeliveryLimit] bounds a message
//     that hangs every handler. "x-consumer-timeout" also bounds [Queue.Get] deliveries, as in
//     RabbitMQ up to 4.2, but returns only the delivery that timed out, not its channel's others.
//   - [DeliveryLimit] works on every queue (RabbitMQ: quorum queues only), and every return
//     counts — a nack, a context end, Recover, an ack timeout.
//   - "x-queue-type" may only be "classic": there are no quorum or stream queues.
//   - The [Block] overflow policy (publishers wait for room) is warren's own; its "x-overflow"
//     value, "block", is not one RabbitMQ accepts.
//   - An auto-delete queue consumed by [Queue.Serve] is deleted once Serve's handlers are done,
//     not when Serve stops taking messages, so that their results settle.
//   - Waiting single active consumers take over highest [ConsumerPriority] first, then in arrival
//     order (RabbitMQ documents no order).
//   - An [Message.Expiration] with a leading "+" is refused.
//   - A durable broker's dead-lettering from a durable queue to a durable queue is at least
//     once (a crash between the two leaves the message in both), where RabbitMQ's classic
//     queues may lose it; a publish waits for the log before it returns, so a crash of the
//     process loses no confirmed message whatever the [SyncPolicy].
//   - Warren's own, with no RabbitMQ counterpart: [Immediate] publishing (RabbitMQ removed AMQP's
//     immediate flag; Qpid keeps it), selectors (Qpid's), [DeliverAfter] and
//     [Delivery.NackWithDelay], [Queue.Serve], [Broker.Listen] events, [WithAlerts], and the
//     waits [Broker.WaitIdle], [Queue.WaitEmpty] and [Broker.WaitReleased].
//
// # TTL and dead-lettering
//
// A queue's [MessageTTL] and a message's [Message.Expiration] give a message a deadline when it
// enters a queue (the lower wins); it never changes, whatever happens to the message. A ready
// message expires at its deadline wherever it is in the queue, and is never delivered after it;
// a message held by a consumer past its deadline may still be acked, and expires if it comes
// back. [Expires] deletes a queue left unused.
//
// A queue with a dead-letter exchange ([DeadLetter]) republishes through it the messages that
// expire, are rejected ([Delivery.Reject]), are dropped by a length limit ([MaxLength],
// [MaxLengthBytes], [Overflow]) or exceed the [DeliveryLimit]: a copy whose "x-death" header
// records the death as RabbitMQ does, routed like any publish, and dropped where it would cycle
// back without a consumer's decision. Without a dead-letter exchange these messages are dropped.
// Dead letters are published after the source queue's lock is released.
//
// # Events, stats and alerts
//
// [Broker.Listen] tells listeners of entity changes (exchanges, queues, bindings, consumers
// created and deleted) and of every step of every message: published, unroutable, enqueued,
// delivered, acked, requeued, expired, dead-lettered and dropped, with reasons. Each message that
// enters a queue gets exactly one terminal event there (acked, expired, dead-lettered, dropped
// or moved), so nothing leaves a queue unaccounted for. A queue's events reach listeners in order,
// after its lock is released; with no listener, the event sites cost one atomic load each.
// [Queue.Stats] and [Broker.Stats] snapshot counts and counters cheaply enough for a metrics
// scrape (see the contrib/prometheus and contrib/otel modules; contrib/otel also carries W3C
// trace context in the headers, through dead-lettering, to the handler). [WithAlerts] sets per-queue thresholds on ready
// messages, bytes, oldest age and message size, with the policies [Alert], [Cycle] and [Delete]
// (Qpid's queue alerts and slow-consumer handling).
//
// # Testing message flows
//
// [Broker.WaitIdle] returns once no message can make progress by itself: publish, wait, assert,
// with no sleeps. Inside a [testing/synctest] bubble the waits of TTLs, delays and backoffs pass
// in virtual time. [Queue.Browse], [Queue.Outstanding] and [Message.Deaths] inspect a queue's
// messages without consuming them. Start consumers before publishing: a Serve on its own
// goroutine says when it is ready with [OnStart].
//
// # Concurrency
//
// Every exported type is safe for concurrent use. Each queue has one mutex; warren never holds
// two queue locks at once and never calls user code while holding one. No goroutine is started
// per message: a push consumer costs none, an [AutoAck] consumer one.
//
// # Time
//
// warren uses the time package directly and polls nothing — alerts and expiries run on each
// queue's one timer — so tests of message flows run inside [testing/synctest] bubbles with
// virtual time.
//
// # Shutdown
//
// A service stops a worker pool by ending the context of its [Queue.Serve] (after
// [Queue.WaitEmpty], to finish what is queued; with a [GracePeriod], to let running handlers
// finish undisturbed). [Broker.Close] stops every consumer, discards every message, makes every
// later call return [ErrClosed], and returns once the broker's goroutines have exited.
package warren

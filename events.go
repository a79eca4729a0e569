package warren

import (
	"slices"
	"sync"
	"sync/atomic"
)

// Events.
//
// A broker tells its listeners ([Broker.Listen]) what happens to its entities and to every
// message in every queue. A message's life in one queue is a span of events:
//
//	Enqueued → (Delivered → Requeued)* → Delivered → Acked
//	                                   … or one of Expired, DeadLettered, Dropped
//
// Invariant: every Enqueued event is followed, in that queue, by exactly one terminal event
// (Acked, Expired, DeadLettered or Dropped) for the same message, and no terminal event comes
// without an Enqueued before it, except when a queue refuses a message on arrival (a length limit,
// [Immediate], a queue deleted under the publisher): then the terminal event is all there is.
// So no message leaves a queue without an event saying why.
//
// Events of one queue are delivered in the order they happened: they are recorded under the
// queue's lock as the effects of its core, in order with its dead letters (core.go), and
// emitted with no lock held (see [Queue.commit]). That includes the queue's
// creation and deletion, its consumers' and a Serve handler's panics; binding and exchange
// events are the broker's own, emitted once the topology lock is released, and not ordered with
// a queue's. A publish racing with the deletion of a queue it routed to may be evented as
// dropped (ReasonQueueDeleted) after the queue's deletion event. So a listener usually runs
// on the goroutine that caused the event, but sometimes on another goroutine of the same queue
// that was already emitting. With no listener registered, collecting costs one atomic load per
// event site.

// EventKind says what an [Event] reports.
type EventKind uint8

// Event kinds. Fields an event does not list are zero, except that every event about a message
// in a queue also carries the Exchange and RoutingKey it was published with (for DeadLettered,
// the dead-letter exchange and the key the copy was routed with).
const (
	// EventHandlerPanicked: a handler run by [Queue.Serve] panicked. Queue, Consumer, Message;
	// Err holds the panic value. The delivery is treated as failed.
	EventHandlerPanicked EventKind = iota + 1

	// EventExchangeCreated, EventExchangeDeleted: Exchange. Deleted has Reason
	// [ReasonDeleted] or [ReasonAutoDelete].
	EventExchangeCreated
	EventExchangeDeleted
	// EventQueueCreated, EventQueueDeleted: Queue. Deleted has Reason ([ReasonDeleted],
	// [ReasonAutoDelete], [ReasonQueueExpired], [ReasonOwnerEnded], [ReasonPolicy] or
	// [ReasonClosed]) and Err, the error its consumers end with.
	EventQueueCreated
	EventQueueDeleted
	// EventBindingCreated, EventBindingDeleted: Exchange (the source), RoutingKey (the binding
	// key), and Queue or DestinationExchange.
	EventBindingCreated
	EventBindingDeleted
	// EventConsumerCreated, EventConsumerDeleted: Queue, Consumer. Deleted has Err, what
	// [Consumer.Err] returns: [ErrCancelled], the context's cause, an error wrapping
	// [ErrAckTimeout], [ErrQueueDeleted] or [ErrClosed].
	EventConsumerCreated
	EventConsumerDeleted

	// EventPublished: a message was published. Exchange, RoutingKey, Message. Once per publish,
	// before it reaches any queue.
	EventPublished
	// EventUnroutable: a published message reached no queue (dropped, or refused with
	// [Mandatory]). Exchange, RoutingKey, Message.
	EventUnroutable
	// EventEnqueued: a message entered a queue. Queue, Exchange, RoutingKey, Message. Reason is
	// empty for a publish, [ReasonExpired]… (the x-death reason) for a dead letter arriving, and
	// [ReasonReturned] for an auto-acknowledged delivery that came back unread (see EventAcked).
	EventEnqueued
	// EventDelivered: a message was delivered to a consumer (Consumer) or a Get (Consumer
	// empty). Queue, Message.
	EventDelivered
	// EventAcked (terminal): the delivery was acknowledged and the message left the queue. Queue,
	// Consumer, Message. An auto-acknowledged delivery ([AutoAck]) is acked as it is delivered;
	// if its consumer stops before the application receives it from Deliveries, the message goes
	// back to its place, which starts a new span with EventEnqueued, Reason [ReasonReturned].
	EventAcked
	// EventRequeued: a delivery came back to the queue, to its original position. Queue,
	// Consumer (empty for a Get), Message, Reason: [ReasonNack], [ReasonRecover],
	// [ReasonCancel], [ReasonOwnerEnded] (the consumer's or Get's context ended) or
	// [ReasonAckTimeout]. Deliveries the application received come back redelivered; those
	// still buffered in the consumer's channel (with Cancel, Recover, a context end or an ack
	// timeout) come back unchanged. A message whose TTL passed
	// while it was out, or that exceeds the delivery limit, does not stay: its terminal event
	// follows at once.
	EventRequeued
	// EventExpired (terminal): the message's TTL passed and the queue has no dead-letter
	// exchange. Queue, Message.
	EventExpired
	// EventDeadLettered (terminal): the message left the queue for its dead-letter exchange and
	// reached at least one queue. Queue (the one it left), Exchange (the dead-letter exchange),
	// Message (the dead-lettered copy, with its x-death history), Reason: the x-death reason,
	// [ReasonRejected], [ReasonExpired], [ReasonMaxLen] or [ReasonDeliveryLimit].
	EventDeadLettered
	// EventDropped (terminal): the message left the queue, or was refused on arrival, and went
	// nowhere. Queue, Message, Reason: see the Reason constants.
	EventDropped

	// EventAlert: a queue crossed one of its [Alerts] thresholds. Queue, Reason (which one:
	// [AlertMessages], [AlertBytes], [AlertAge], [AlertMessageSize]), Value (the measure: a
	// count, bytes, or nanoseconds) and Limit (the threshold); Message for AlertMessageSize.
	EventAlert

	// EventLogRepaired: [Open] found the durable log damaged and went on. Only a listener given
	// with [WithListener] hears it; [Broker.Recovery] returns the same, as a value. One event
	// for each stretch of the log it dropped: a torn end it cut (what a crash leaves), or
	// damage [WithSalvage] skipped: Err names the file and offset (it wraps [ErrCorrupt]),
	// Value is the bytes dropped and Limit the records (-1 when the log cannot tell). Then,
	// after skipped damage, one for each durable queue it cost messages (a [QueueDamage]):
	// Queue (empty if its declaration was skipped), Value the messages known lost, Limit the
	// messages put back that may have been settled before (they come back redelivered).
	EventLogRepaired

	// EventMoved (terminal): the message left the queue with [Queue.Move] and a queue of the
	// destination took it. Queue, Exchange and RoutingKey (it was published with), Message. Where
	// it went, its EventEnqueued there says, with Reason [ReasonMoved]. A message on its way when
	// its queue ends (deleted, or the broker closing) gets this event, or EventDropped with the
	// queue's end reason if no queue took it, once the move settles: after the queue's
	// EventQueueDeleted.
	EventMoved

	// EventMemoryAlarm: the messages the broker holds passed its memory budget
	// ([WithMemoryLimit]); publishes wait until EventMemoryAlarmCleared. Value is the memory
	// they take, by the broker's estimate, and Limit the budget.
	EventMemoryAlarm

	// EventMemoryAlarmCleared: the messages the broker holds are back within its memory budget;
	// waiting publishes go on. Value and Limit as for EventMemoryAlarm. The two alternate,
	// starting with EventMemoryAlarm.
	EventMemoryAlarmCleared

	// eventDeadLetter is not emitted: the effect of a message leaving for the dead-letter
	// exchange (core.go), which the flush publishes.
	eventDeadLetter
)

var eventNames = [...]string{
	EventHandlerPanicked:    "handler-panicked",
	EventExchangeCreated:    "exchange-created",
	EventExchangeDeleted:    "exchange-deleted",
	EventQueueCreated:       "queue-created",
	EventQueueDeleted:       "queue-deleted",
	EventBindingCreated:     "binding-created",
	EventBindingDeleted:     "binding-deleted",
	EventConsumerCreated:    "consumer-created",
	EventConsumerDeleted:    "consumer-deleted",
	EventPublished:          "published",
	EventUnroutable:         "unroutable",
	EventEnqueued:           "enqueued",
	EventDelivered:          "delivered",
	EventAcked:              "acked",
	EventRequeued:           "requeued",
	EventExpired:            "expired",
	EventDeadLettered:       "dead-lettered",
	EventDropped:            "dropped",
	EventMoved:              "moved",
	EventAlert:              "alert",
	EventLogRepaired:        "log-repaired",
	EventMemoryAlarm:        "memory-alarm",
	EventMemoryAlarmCleared: "memory-alarm-cleared",
}

func (k EventKind) String() string {
	if int(k) < len(eventNames) && eventNames[k] != "" {
		return eventNames[k]
	}
	return "unknown"
}

// Terminal reports whether an event of this kind ends a message's span in a queue: Acked,
// Expired, DeadLettered, Dropped or Moved.
func (k EventKind) Terminal() bool {
	switch k {
	case EventAcked, EventExpired, EventDeadLettered, EventDropped, EventMoved:
		return true
	}
	return false
}

// Reason says why something happened: an [Event]'s Reason, and the reason of a dead-lettering
// in a message's "x-death" history ([Death].Reason).
type Reason string

// Reasons carried by events ([Event].Reason). The first four are also the x-death reasons
// ([Death].Reason) RabbitMQ writes.
const (
	ReasonRejected      Reason = "rejected"       // rejected or nacked without requeue
	ReasonExpired       Reason = "expired"        // its TTL passed
	ReasonMaxLen        Reason = "maxlen"         // dropped from the head by a length limit (drop-head, the Cycle policy), or refused by reject-publish-dlx
	ReasonDeliveryLimit Reason = "delivery_limit" // returned more times than the queue's delivery limit

	// Why a message was dropped (EventDropped), besides the four above when the queue has no
	// dead-letter exchange.
	ReasonQueueFull       Reason = "queue-full"        // refused on arrival by a length limit (reject-publish, a full Block queue)
	ReasonNoConsumers     Reason = "no-consumers"      // an [Immediate] publish no consumer could take
	ReasonDLXNotFound     Reason = "dlx-not-found"     // its dead-letter exchange does not exist
	ReasonDLXNoRoute      Reason = "dlx-no-route"      // its dead-letter copy reached no queue that took it
	ReasonDeadLetterCycle Reason = "dead-letter-cycle" // its dead-letter copy would have cycled back
	ReasonPurged          Reason = "purged"            // [Queue.Purge]
	ReasonMoved           Reason = "moved"             // EventEnqueued: it came with [Queue.Move]
	ReasonQueueDeleted    Reason = "queue-deleted"     // its queue was deleted, for whatever reason
	ReasonClosed          Reason = "closed"            // the broker closed
	ReasonMemoryAlarm     Reason = "memory-alarm"      // refused on arrival by a reject-publish queue while the broker's memory alarm was set ([WithMemoryLimit])

	// Why a message came back (EventRequeued, EventEnqueued).
	ReasonNack       Reason = "nack"        // Nack, NackUpTo, NackWithDelay, or a Serve handler's error
	ReasonRecover    Reason = "recover"     // [Consumer.Recover]
	ReasonCancel     Reason = "cancel"      // [Consumer.Cancel]: buffered and never received, back unchanged
	ReasonOwnerEnded Reason = "owner-ended" // the consumer's or Get's context ended, or [Consumer.Close] (for a queue: its exclusive owner)
	ReasonAckTimeout Reason = "ack-timeout" // its consumer's ack timeout ended the consumer, or a Get was held past the queue's
	ReasonReturned   Reason = "returned"    // an auto-acked delivery its stopped consumer never received

	// Why a queue or exchange was deleted (EventQueueDeleted, EventExchangeDeleted).
	ReasonDeleted      Reason = "deleted"       // [Broker.DeleteQueue], [Broker.DeleteExchange]
	ReasonAutoDelete   Reason = "auto-delete"   // its last consumer (queue) or binding (exchange) went
	ReasonQueueExpired Reason = "queue-expired" // unused for its [Expires]
	ReasonPolicy       Reason = "policy"        // the [Delete] policy of its [Alerts]
)

// Event is something that happened in a broker, as told to its listeners ([Broker.Listen]). See
// the kinds for which fields each sets; the others are zero.
type Event struct {
	Kind                EventKind
	Exchange            string   // the exchange concerned
	RoutingKey          string   // the message's routing key, or a binding's key
	Queue               string   // the queue concerned
	DestinationExchange string   // an exchange-to-exchange binding's destination
	Consumer            string   // the consumer tag concerned
	Message             *Message // the message concerned; read-only (the events of a message published while a listener was there share one *Message)
	Reason              Reason   // why, for the kinds that say
	Err                 error    // what went wrong
	Value, Limit        int64    // EventAlert: the measure and its threshold; EventLogRepaired: see it
}

// listeners is a broker's set of event listeners, copy-on-write: emitting reads one atomic
// pointer and, when nobody listens, does nothing else.
type listeners struct {
	mu   sync.Mutex                  // serialises changes
	list atomic.Pointer[[]*listener] // nil when empty
}

type listener struct{ fn func(Event) }

// Listen registers fn to be told of the broker's events from now on, and returns a function
// that unregisters it (idempotent). fn is called with no lock of the broker's held, so it may
// call into the broker: publish, settle, declare, read Stats. It must not block, since it runs
// on a goroutine that is publishing, settling, expiring or emitting a queue's earlier events —
// which may be one of the broker's own (a queue's timer, an AutoAck consumer's goroutine). So
// it must not wait for the broker either: Close, DeleteQueue, an AutoAck consumer's Cancel and
// WaitIdle wait for the broker's goroutines or for the events in flight, and from a listener
// they can wait for themselves; hand such calls to another goroutine. Events of one queue
// reach fn in order, one at a time; events of different queues may reach it concurrently. A
// listener registered several times is called once per registration. A listener that panics is
// logged; the panic goes no further.
func (b *Broker) Listen(fn func(Event)) (stop func()) {
	if fn == nil {
		return func() {}
	}
	l := &listener{fn: fn}
	b.listeners.mu.Lock()
	defer b.listeners.mu.Unlock()
	var list []*listener
	if p := b.listeners.list.Load(); p != nil {
		list = slices.Clone(*p)
	}
	list = append(list, l)
	b.listeners.list.Store(&list)
	return func() {
		b.listeners.mu.Lock()
		defer b.listeners.mu.Unlock()
		p := b.listeners.list.Load()
		if p == nil {
			return
		}
		list := slices.DeleteFunc(slices.Clone(*p), func(x *listener) bool { return x == l })
		if len(list) == 0 {
			b.listeners.list.Store(nil)
		} else {
			b.listeners.list.Store(&list)
		}
	}
}

// listening reports whether anyone listens: what every event site checks before building an
// event.
func (b *Broker) listening() bool { return b.listeners.list.Load() != nil }

// emit tells every listener of e. The caller holds no lock.
func (b *Broker) emit(e Event) {
	p := b.listeners.list.Load()
	if p == nil {
		return
	}
	for _, l := range *p {
		b.call(l, e)
	}
}

// emitAll emits events in order. The caller holds no lock.
func (b *Broker) emitAll(evs []Event) {
	for _, e := range evs {
		b.emit(e)
	}
}

// call calls one listener. A listener that panics is a bug of the application's, but it runs on
// a broker goroutine or inside a broker call: the panic is logged, not propagated.
func (b *Broker) call(l *listener, e Event) {
	defer func() {
		if p := recover(); p != nil {
			b.cfg.logger.Error("warren: event listener panicked", "event", e.Kind.String(), "panic", p)
		}
	}()
	l.fn(e)
}

// eventLocked records an event of the queue's own, in order with the effects of its messages
// (see [queueCore.note]). Only call it when q.b.listening(), or for an alert.
func (q *Queue) eventLocked(e Event) {
	e.Queue = q.name
	q.core.note(e)
}

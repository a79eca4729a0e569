package warren

import (
	"fmt"
)

// Every error warren makes says "warren: " once, at the start of its text: a sentinel's own text
// has the prefix, and an error that wraps one (errorf) includes the wrapped text without it. So
// `warren: settle delivery 1: queue "main": queue deleted: not found` rather than a prefix per
// layer. errors.Is and errors.As see every wrapped error as usual.

// werror is an error of warren's: the text without the prefix, and what it wraps.
type werror struct {
	text string
	errs []error
}

func (e *werror) Error() string   { return "warren: " + e.text }
func (e *werror) Unwrap() []error { return e.errs }

// newError returns a sentinel error with the given text, which must not have the prefix.
func newError(text string) error { return &werror{text: text} }

// errorf is fmt.Errorf for warren's errors: format must not start with the prefix, and the
// warren errors among args are formatted without theirs.
func errorf(format string, args ...any) error {
	for i, a := range args {
		if e, ok := a.(*werror); ok {
			args[i] = bare{e}
		}
	}
	err := fmt.Errorf(format, args...)
	return &werror{text: err.Error(), errs: []error{err}}
}

// bare is a warren error formatted without its prefix; it wraps the error itself, so errors.Is
// and errors.As find it.
type bare struct{ e *werror }

func (b bare) Error() string { return b.e.text }
func (b bare) Unwrap() error { return b.e }

// Errors returned by declarations, bindings and deletions ([Broker.DeclareExchange],
// [Broker.DeclareQueue], [Broker.Bind], [Broker.DeleteQueue], …). The names follow AMQP's reply
// codes so that RabbitMQ users recognise them; every error warren returns wraps one of these and
// works with [errors.Is].
var (
	// ErrClosed is returned by every call on a [Broker] after [Broker.Close], and by settlement
	// of a delivery whose broker has closed. It is AMQP's channel/connection closed.
	ErrClosed = newError("broker closed")

	// ErrNotFound is returned when a named exchange or queue does not exist (AMQP 404), or has
	// been deleted since the handle was obtained.
	ErrNotFound = newError("not found")

	// ErrPreconditionFailed is returned when a redeclaration is not equivalent to the existing
	// entity, when a delete's if-unused / if-empty condition does not hold, when a binding
	// argument is invalid (AMQP 406), and when a published message's headers are not a valid
	// [Table]: cyclic, or nested deeper than 32 levels.
	ErrPreconditionFailed = newError("precondition failed")

	// ErrAccessRefused is returned when declaring a name with the reserved "amq." prefix, when
	// binding to or deleting the default exchange, when publishing to an internal exchange, and
	// when an exclusive consumer holds the queue (AMQP 403).
	ErrAccessRefused = newError("access refused")

	// ErrResourceLocked is returned when an exclusive queue is used from a context that does not
	// own it (AMQP 405). The error's text says how to make the call on the owner's behalf: with
	// [As] for calls that take call options, with the owner's context for those that take one.
	ErrResourceLocked = newError("resource locked")

	// ErrInvalidArgument is returned for malformed input that no AMQP reply code covers: a name
	// longer than 255 bytes, an unknown exchange kind, an out-of-range option.
	ErrInvalidArgument = newError("invalid argument")

	// ErrUnsupported is returned for what RabbitMQ has and warren does not, where going on
	// without it would behave differently (e.g. [ReadDefinitions] of a file with policies).
	ErrUnsupported = newError("unsupported")
)

// Errors returned by publishing ([Broker.Publish], [Exchange.Publish]).
var (
	// ErrUnroutable is returned by a publish with [Mandatory] that reached no queue, after any
	// alternate exchange was tried (AMQP basic.return 312 NO_ROUTE). Nothing was enqueued.
	ErrUnroutable = newError("unroutable")

	// ErrQueueFull is returned when a queue with a reject-publish overflow policy refused the
	// message (the publisher confirm's nack). Other queues the message routed to still took it.
	ErrQueueFull = newError("queue full")

	// ErrNoConsumers is returned by an immediate publish that no consumer could take at once.
	ErrNoConsumers = newError("no consumers")
)

// Errors of a durable broker ([Open]).
var (
	// ErrCorrupt is returned by [Open] when the log lost something a sync had made durable: a
	// damaged byte anywhere but in a torn end (which a crash leaves, and Open cuts), a missing
	// or cut-short segment file. The error names the file and the offset. [WithSalvage] opens
	// it anyway, skipping what is damaged. An [EventLogRepaired] wraps it too.
	ErrCorrupt = newError("durable log corrupt")

	// ErrStorage says the durable log could not take, or could not write, a persistent
	// message's records. It is returned:
	//   - by a publish of a persistent message that would reach a durable queue, and by a
	//     settlement of one ([Delivery.Ack], Nack, Reject, the UpTo variants), while the disk
	//     is full — the log is stalled, retries by itself, and they are accepted again once a
	//     write succeeds, with no restart — and once the log failed (a failed fsync, an I/O
	//     error: what reached the disk is unknown, so it takes nothing more until the directory
	//     is opened again). Such a refusal changes nothing: the message enters no queue, the
	//     delivery stays outstanding and can be settled again;
	//   - by a publish, a [Confirmation.Wait] or a declaration that was waiting for its records
	//     when the log failed, or when [Broker.Close] could not write them: not confirmed (the
	//     message is in its queues in memory, and may be delivered from there);
	//   - by [Broker.Close] when the log failed or could not write what it held.
	// The broker keeps serving what it holds in memory.
	ErrStorage = newError("durable storage failed")
)

// Errors returned by consuming and settling ([Queue.Get], [Queue.Consume], [Delivery.Ack],
// [Consumer.AckUpTo], …).
var (
	// ErrEmpty is returned by [Queue.Get] when the queue has no ready message. It is the
	// "get-empty" answer of AMQP, not a failure.
	ErrEmpty = newError("queue empty")

	// ErrAlreadySettled is returned by a settlement (Ack, Nack, Reject) of a delivery that was
	// settled before, or that has already gone back to its queue because its consumer ended.
	ErrAlreadySettled = newError("delivery already settled")

	// ErrUnknownDelivery is returned by a settlement that names a delivery the consumer does not
	// hold: a delivery tag it never issued, a zero [Delivery], or an auto-acked delivery.
	ErrUnknownDelivery = newError("unknown delivery")

	// ErrCancelled is the reason a [Consumer] reports from [Consumer.Err] after [Consumer.Cancel].
	ErrCancelled = newError("consumer cancelled")

	// ErrQueueDeleted is the reason a [Consumer] reports when its queue was deleted under it.
	// It wraps [ErrNotFound].
	ErrQueueDeleted = errorf("queue deleted: %w", ErrNotFound)

	// ErrAckTimeout is the reason a [Consumer] reports when it held a delivery unsettled for
	// longer than its [AckTimeout] and was ended for it (RabbitMQ's consumer timeout; AMQP 406).
	ErrAckTimeout = errorf("delivery acknowledgement timed out: %w", ErrPreconditionFailed)
)

// Errors for handlers run by [Queue.Serve].
var (
	// ErrPermanent marks a handler's error as one that retrying cannot fix: [Queue.Serve]
	// rejects the message (dead-letters it with reason "rejected", or drops it) instead of
	// returning it for another attempt. Wrap it (fmt.Errorf("…: %w", warren.ErrPermanent)) or
	// use [Permanent].
	ErrPermanent = newError("permanent failure")
)

// Permanent returns err marked with [ErrPermanent]: errors.Is(Permanent(err), ErrPermanent)
// and errors.Is(Permanent(err), err) both hold. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return errorf("%w: %w", ErrPermanent, err)
}

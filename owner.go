package warren

import "context"

// Owners.
//
// An owner is a context. It owns what was started with it: the consumers given it by
// [Queue.Consume] (or [Queue.Serve]) and the deliveries of the [Queue.Get] calls given it, which
// all go back to the queue when it ends (AMQP's channel); and an exclusive queue declared with
// [ExclusiveTo] belongs to one, which alone may use it and whose end deletes it (AMQP's
// connection).
//
// A context is an owner's when it is the owner, or shares its Done channel (it was derived with
// [context.WithValue]), or — for an owner made by [NewOwner] — was derived from it in any way,
// with its own cancellation or deadline included. Go gives no way to tell that one context was
// derived from another; NewOwner marks the owner with a value that every context derived from
// it carries, and that mark is what is compared.

// ownerKey is the context key of an owner's mark.
type ownerKey struct{}

// ownerMark identifies an owner made by NewOwner. An owner made inside another is that one's too:
// parent is the mark of the owner it was made from, nil for none.
type ownerMark struct{ parent *ownerMark }

// NewOwner returns a context derived from parent that is an owner of its own, and its cancel
// function. Every context derived from it — with [context.WithCancel], [context.WithTimeout],
// [context.WithValue], another NewOwner, … — is the same owner: it may use the exclusive queues
// the owner declared, and what it starts counts among what the owner holds for
// [Broker.WaitReleased]. A connection of an AMQP server is such an owner, and its channels
// contexts derived from it.
//
// Cancelling the context ends the owner, as cancelling any context does: its consumers stop,
// what they and its Gets hold goes back to the queues, and its exclusive queues are deleted.
func NewOwner(parent context.Context) (context.Context, context.CancelFunc) {
	mark := &ownerMark{parent: markOf(parent)}
	ctx, cancel := context.WithCancel(parent)
	return context.WithValue(ctx, ownerKey{}, mark), cancel
}

// markOf returns the mark of the owner made by NewOwner that ctx was derived from, or nil.
func markOf(ctx context.Context) *ownerMark {
	m, _ := ctx.Value(ownerKey{}).(*ownerMark)
	return m
}

// ownedBy reports whether the context ctx is owner's: see the top of this file. A nil ctx is
// nobody's.
func ownedBy(ctx, owner context.Context) bool {
	switch {
	case ctx == nil || owner == nil:
		return false
	case ctx == owner:
		return true
	case owner.Done() != nil && ctx.Done() == owner.Done():
		return true
	}
	want := markOf(owner)
	if want == nil {
		return false
	}
	for m := markOf(ctx); m != nil; m = m.parent {
		if m == want {
			return true
		}
	}
	return false
}

// As makes a call run on behalf of owner: a call on an exclusive queue ([Broker.Queue],
// [Broker.Bind], [Broker.Unbind], [Broker.Purge], [Queue.Purge], [Broker.DeleteQueue]) is
// refused with [ErrResourceLocked] unless it runs on behalf of the queue's owner, as RabbitMQ
// refuses those of another connection (405 RESOURCE_LOCKED). Calls that take a context
// ([Queue.Consume], [Queue.Get], [Queue.Serve]) run on its behalf, and publishing is open to
// everyone. A nil owner is an error wrapping [ErrInvalidArgument].
func As(owner context.Context) CallOption {
	return callOption(func(c *callConfig) {
		if owner == nil {
			c.err = errorf("As(nil): %w", ErrInvalidArgument)
		}
		c.owner = owner
	})
}

// Exclusive reports whether the queue is exclusive: declared with [ExclusiveTo], usable only on
// behalf of its owner.
func (q *Queue) Exclusive() bool { return q.cfg.owner != nil }

// usableBy reports whether a call on behalf of ctx (nil: nobody's) may use the queue: any may use
// a queue that is not exclusive, only its owner's an exclusive one.
func (q *Queue) usableBy(ctx context.Context) bool {
	return q.cfg.owner == nil || ownedBy(ctx, q.cfg.owner)
}

// checkUse returns the error for a call on the queue, described by what, on behalf of ctx:
// lockedError's if ctx may not use it. how says how the call is made on the owner's behalf.
func (q *Queue) checkUse(what string, ctx context.Context, how ownerHint) error {
	if q.usableBy(ctx) {
		return nil
	}
	return lockedError(what, q.name, how)
}

// ownerHint says how a call is made on behalf of an exclusive queue's owner, in the error that
// refuses it to another context.
type ownerHint string

const (
	// byAs: a call that takes CallOptions ([Broker.Queue], [Broker.Bind], [Queue.Purge], …).
	byAs ownerHint = "call it on behalf of its owner: warren.As(ownerCtx)"
	// byContext: a call that takes a context and runs on its behalf ([Queue.Consume], …).
	byContext ownerHint = "pass its owner's context, or one derived from it"
	// byDeclare: a redeclaration.
	byDeclare ownerHint = "declare it with warren.ExclusiveTo(ownerCtx)"
)

// lockedError is the error wrapping [ErrResourceLocked] that refuses the use of the exclusive
// queue name, described by what, to a context that does not own it: every such refusal is
// made here, and says how to make the call on the owner's behalf.
func lockedError(what, name string, how ownerHint) error {
	return errorf("%s: exclusive queue %q: owned by another context (%s): %w", what, name, how, ErrResourceLocked)
}

// holdsFor reports whether the queue still holds something of owner's: a consumer started with
// one of its contexts that has not ended (or whose feeder is still putting messages back), or a
// Get delivery owned by one of them that is outstanding.
func (q *Queue) holdsFor(owner context.Context) (holds bool) {
	q.view(func() { holds = q.holdsForLocked(owner) })
	return holds
}

// holdsForLocked reports whether the queue holds something of owner's (see holdsFor).
func (q *Queue) holdsForLocked(owner context.Context) bool {
	for _, h := range q.core.holders {
		if ownedBy(h.c.owner, owner) || ownedBy(h.c.as, owner) {
			return true
		}
	}
	for _, cs := range [...][]*Consumer{q.leaving, q.ending} {
		for _, c := range cs {
			if ownedBy(c.owner, owner) || ownedBy(c.as, owner) {
				return true
			}
		}
	}
	for d := range q.core.gets.outstanding() {
		if d.get != nil && ownedBy(d.get.ctx, owner) {
			return true
		}
	}
	return false
}

// WaitReleased waits until the broker holds nothing of owner's: every consumer started with one
// of owner's contexts has ended (see [Consumer.Done]) and every [Queue.Get] delivery owned by one
// has been settled or has gone back to its queue. Called after owner was cancelled, it returns
// once everything owner held is back in its place, which the end of a context alone does not
// wait for: an AMQP server sends channel.close-ok after it. Called before, it also waits for
// owner to end, unless owner holds nothing. A [Queue.Serve] owned by owner holds its deliveries
// until its handlers return. It returns ctx.Err() if ctx ends first.
//
// Which contexts are owner's: see [NewOwner]. It costs a pass over the broker's queues per change
// in any of them while it waits.
func (b *Broker) WaitReleased(ctx, owner context.Context) error {
	return b.waitFor(ctx, func() (bool, error) {
		for q := range b.Queues() {
			if q.holdsFor(owner) {
				return false, nil
			}
		}
		return true, nil
	})
}

package warren

import (
	"context"
	"slices"
)

// Moving messages out of a queue: the "shovel back from the dead-letter queue" an operator
// needs after a fix.
//
// A message moves one at a time, through three steps:
//  1. Under the queue lock it leaves the ready set and is lent (queueCore.lend): outstanding,
//     held by the queue's movers (queueCore.moving), so that it counts as unacked and no
//     consumer can take it; nothing is delivered (no Delivered effect). The move is counted
//     in the broker's wait group, which Close waits for before it closes the durable log.
//  2. With no lock held, it is published to the destination as it is — every property and
//     header, x-death included — with Mandatory, as a move (its EventEnqueued there has Reason
//     [ReasonMoved]).
//  3. Under the queue lock again: if any queue took it, it leaves this queue for good
//     (EventMoved, terminal; a durable queue logs it as settled); if none did (no queue to
//     route to, every one full, the exchange missing, the context ended first), it goes back
//     to its place, unchanged, as if it had never left. A refusal stops the move either way.
//
// A message counts as moved once any queue took it, not only once every queue did: with a
// destination that routes to several queues, one of them full with reject-publish, the others
// have their copies and can deliver them at once, so putting the message back would make a
// second copy for them at every retry. All or nothing cannot be had instead: room checked in
// every queue can be gone by the time the message is enqueued there, unless every queue's
// lock were held at once. So the move is one publish, as RabbitMQ's publisher with confirms
// sees it (a nack for the full queue, the copies kept by the others), and Move stops with the
// refusal, counting the message as moved. A full reject-publish-dlx queue dead-letters its copy
// of a moved message, as of any publish; but of a message no queue took, it dead-letters
// nothing: the message stays in its source, and a dead-lettered copy would be a second one,
// and one more at each retry. Until the publish has been to every queue it is not known which,
// so enqueue leaves such a refusal to the mover (refuseMoving).
//
// So a message is never in neither queue once Move returns (unless its source was deleted),
// and in both only in the step between publish and settle (a durable broker that crashes
// there has it in both: at least once, as any publish-then-ack). A queue that ends meanwhile (deleted, or its broker closed)
// leaves the message on its way to step 3, which settles it as moved (once: EventMoved, not
// also dropped with the queue) or drops it with the queue's end reason, after the queue's
// EventQueueDeleted; on a closing durable broker the settle is logged before the log closes,
// so that a clean Close never leaves a message in both queues. Consumers of either queue run
// meanwhile: the message is outstanding while it moves, not ready, so no consumer of the
// source takes it; consumers of the destination may take it as soon as it is published. No two
// queue locks are held at once, and no lock while publishing.

// MoveOption selects what [Queue.Move] moves.
type MoveOption interface{ applyMove(*moveConfig) }

type moveConfig struct {
	limit int      // at most this many; 0: no limit
	ids   []uint64 // only these, in the queue's order; nil: from the head
	// before bounds a move from the head to the messages enqueued before it began: sequence ids
	// below it (set by the first lendNext). Else a destination that routes back to the source
	// would keep it moving the same messages for ever.
	before uint64
	err    error
}

type moveOption func(*moveConfig)

func (o moveOption) applyMove(c *moveConfig) { o(c) }

// MoveLimit makes [Queue.Move] move at most n messages: the first n, in delivery order, or of
// those [MoveIDs] names. n < 1 is an error wrapping [ErrInvalidArgument].
func MoveLimit(n int) MoveOption {
	return moveOption(func(c *moveConfig) {
		if n < 1 {
			c.err = errorf("move: limit %d: want at least 1: %w", n, ErrInvalidArgument)
		}
		c.limit = n
	})
}

// MoveIDs makes [Queue.Move] move only the messages with these IDs ([ReadyMessage].ID, from
// [Queue.BrowseFrom]) that are ready when it reaches them, in delivery order; an ID the queue
// no longer has ready (consumed, moved, expired, or out with a consumer) is skipped.
func MoveIDs(ids ...uint64) MoveOption {
	return moveOption(func(c *moveConfig) {
		c.ids = slices.Clone(ids)
		slices.Sort(c.ids)
		c.ids = slices.Compact(c.ids)
	})
}

// Move moves ready messages from the queue to exchange, routed with key (the default exchange ""
// and a queue's name move them to that queue): each is published there as it is, its
// properties and headers (x-death included) unchanged, and leaves this queue once a queue took
// it; see the top of move.go for how no message is lost or left in both. By default the
// messages enqueued before Move began, from the head, in delivery order — those ready when it
// reaches them, including any that come back from a consumer meanwhile; messages enqueued after
// it began (the ones it moves into this queue itself, when the destination routes back here,
// among them) stay. [MoveLimit] and [MoveIDs] select fewer. Each message leaves with
// [EventMoved] and enters with [EventEnqueued], Reason [ReasonMoved].
//
// It returns how many it moved. It stops at the first message the destination refuses:
// [ErrUnroutable] (no queue took it), [ErrQueueFull], [ErrNotFound] (no such exchange); or when
// ctx ends, or the queue is deleted ([ErrQueueDeleted]) or the broker closes ([ErrClosed]). A
// message no queue took stays where it was, unchanged. A message that some queues took and
// another refused (a full reject-publish queue; a Block queue still full when ctx ended) has
// moved, and is counted: it left this queue, the queues that took it keep it, the one that
// refused it does with it as with any publish it refuses (reject-publish-dlx dead-letters it),
// and the error, which wraps the refusal, says so. Calling Move again after an error moves
// from the next message on, so no message is copied twice. An exclusive queue may be moved from
// only with a context of its owner's, as for [Queue.Get] (else [ErrResourceLocked]).
func (q *Queue) Move(ctx context.Context, exchange, key string, opts ...MoveOption) (int, error) {
	var cfg moveConfig
	for _, o := range opts {
		if o != nil {
			o.applyMove(&cfg)
		}
	}
	if cfg.err != nil {
		return 0, cfg.err
	}
	moved := 0
	for cfg.limit == 0 || moved < cfg.limit {
		if err := ctx.Err(); err != nil {
			return moved, err
		}
		r, msg, err := q.lendNext(ctx, &cfg)
		if err != nil || r == nil {
			return moved, err
		}
		lsn, took, err := q.b.send(ctx, nil, exchange, key, &msg, movePublishOptions)
		if cerr := q.b.confirm(ctx, lsn); cerr != nil {
			err = cerr
		}
		ended := !q.settleMove(r, took > 0)
		if took > 0 {
			moved++
		}
		switch {
		case ended:
			return moved, errorf("move from queue %q: %w", q.name, q.endErrOrClosed())
		case err != nil && took > 0:
			return moved, errorf("move from queue %q to exchange %q: moved, but %w", q.name, exchange, err)
		case err != nil:
			return moved, errorf("move from queue %q to exchange %q: %w", q.name, exchange, err)
		}
	}
	return moved, nil
}

// movePublishOptions publish a moving message: refused rather than dropped if no queue takes
// it, entering as moved, and with the refusals of reject-publish-dlx queues left to the mover.
var movePublishOptions = []PublishOption{asMove{}}

// asMove is the publish option of a moving message (movePublishOptions).
type asMove struct{}

func (asMove) applyPublish(c publishConfig) publishConfig {
	c.mandatory, c.moving, c.deadReason = true, true, ReasonMoved
	return c
}

// refuseMoving records the refusal of a moving message by this queue, full with
// reject-publish-dlx, which enqueue left to the mover until the publish had been to every
// queue (see the top of move.go): dead-lettered, as any publish's, if another queue took the
// message (moved is true); else dropped, since the message stays in its source.
func (q *Queue) refuseMoving(env *envelope, moved bool) {
	q.mu.Lock()
	if moved {
		q.core.deadLetter(entry{env: env}, ReasonMaxLen)
	} else {
		q.core.drop(entry{env: env}, ReasonQueueFull)
	}
	q.commit()
}

// lendNext lends the next message cfg selects (step 1 at the top of move.go) and returns its
// lease and a copy of it; a nil lease when none is left.
func (q *Queue) lendNext(ctx context.Context, cfg *moveConfig) (*lease, Message, error) {
	q.mu.Lock()
	defer q.commit()
	if q.endErr != nil {
		return nil, Message{}, errorf("move from queue %q: %w", q.name, q.endErrLocked())
	}
	if err := q.checkUse("move", ctx, byContext); err != nil {
		return nil, Message{}, err
	}
	var (
		e  entry
		ok bool
	)
	if cfg.before == 0 {
		cfg.before = q.core.nextSeq
	}
	if cfg.ids == nil {
		e, ok = q.core.takeBefore(cfg.before)
	} else {
		for !ok && len(cfg.ids) > 0 {
			e, ok = q.core.ready.removeWithPaged(cfg.ids[0])
			cfg.ids = cfg.ids[1:]
			if ok && q.core.expired(e) {
				q.core.deadLetter(e, ReasonExpired)
				ok = false
			}
		}
	}
	if !ok {
		return nil, Message{}, nil
	}
	q.touchLocked()
	q.b.wg.Add(1) // before the queue can end: Close waits for the settle (settleMove)
	return q.core.lend(&q.core.moving, e), e.env.message(), nil
}

// settleMove ends a lent message's move (step 3 at the top of move.go): moved, it leaves the
// queue; else it goes back to its place unchanged. It reports false if the queue ended
// meanwhile, which left the message to this: moved, it leaves all the same, logged settled in a
// durable queue (its copy is in the destination); else it is dropped with the queue's end
// reason. Either way the move is no longer in flight for Close.
func (q *Queue) settleMove(r *lease, moved bool) bool {
	q.mu.Lock()
	defer q.b.wg.Done() // after commit, which logs the settle
	defer q.commit()
	if q.endErr != nil {
		// The core let go of its movers' list when the queue ended (queueCore.reset): there
		// is nothing to release.
		if moved {
			q.core.record(EventMoved, r.e, "", "")
		} else {
			q.core.drop(r.e, q.core.ended)
		}
		return false
	}
	if moved {
		q.core.release(r, deliverySettled)
		q.core.record(EventMoved, r.e, "", "")
	} else {
		q.core.release(r, deliveryReturned)
		q.core.restoreAll([]entry{r.e})
		q.dispatchLocked()
	}
	q.core.trim(&q.core.moving)
	return true
}

// endErrOrClosed is why the queue ended, or ErrClosed.
func (q *Queue) endErrOrClosed() error {
	var err error
	q.view(func() { err = q.endErrLocked() })
	if err == nil {
		err = ErrClosed
	}
	return err
}

package warren

import (
	"cmp"
	"slices"
	"time"
)

// Recovery: the picture of the durable queues that the log's records leave, RabbitMQ's picture
// after a restart. Records are replayed in log order into a replay; what it holds at the end is
// what each durable queue gets back:
//   - every message published and not settled, at its sequence id, so in its original order;
//   - a message delivered and not settled when the log ends was out with a consumer at the
//     crash: it comes back redelivered, its delivery count one higher, as if its consumer's
//     channel had closed; so a poison message still reaches its delivery limit across restarts;
//   - a returned message keeps its count, a delayed one its due time, every message its deadline
//     (wall-clock times: what passed them while the process was down expires when it starts).
//
// A replay also knows, for each segment of the log, how many of the messages it holds are
// live, so that the store can remove a segment none of whose messages is.

// replay is the state recovery builds from the log's records.
type replay struct {
	queues map[uint64]*replayQueue
	bodies map[uint64]*replayBody // by message id
	live   map[uint64]int         // segment → live messages whose body is in it

	maxMsg uint64 // the greatest message id seen

	// The durable topology, as declared and not deleted.
	queueDecls    map[uint64]decl // by queue id
	exchangeDecls map[string]decl
	bindings      []decl // in the order they were made
}

// replayQueue is one durable queue's messages during a replay.
type replayQueue struct {
	msgs map[uint64]*replayMsg // by sequence id
	last uint64                // the greatest sequence id seen, live or not
}

// replayMsg is one message in one queue during a replay.
type replayMsg struct {
	msgID       uint64
	seq         uint64
	deadline    int64 // wall-clock Unix nanoseconds; 0 for none
	returns     uint32
	redelivered bool
	delivered   bool  // out with a consumer or a Get
	due         int64 // delayed until, wall-clock Unix nanoseconds; 0 for not delayed
}

// replayBody is a message's encoding, with the placements that still need it.
type replayBody struct {
	msg  []byte // copied out of the log's buffer
	seg  uint64 // the segment its publish record is in
	refs int    // live placements
}

func newReplay() *replay {
	return &replay{queues: map[uint64]*replayQueue{}, bodies: map[uint64]*replayBody{}, live: map[uint64]int{},
		queueDecls: map[uint64]decl{}, exchangeDecls: map[string]decl{}}
}

// apply replays one record read from segment seg. A record about a message the replay does not
// hold is ignored: its publish was in a segment removed because nothing in it was live, or it
// was never written (its waiter was never told).
func (r *replay) apply(seg uint64, rec record) {
	switch rec.typ {
	case recPublish:
		r.maxMsg = max(r.maxMsg, rec.msgID)
		if b := r.bodies[rec.msgID]; b != nil {
			// Written again by compaction: the message's current state follows.
			r.live[b.seg]--
			r.live[seg]++
			b.seg = seg
		} else {
			r.bodies[rec.msgID] = &replayBody{msg: slices.Clone(rec.msg), seg: seg}
			r.live[seg]++
		}
		r.place(rec.placement)
	case recEnqueue:
		if r.bodies[rec.msgID] != nil {
			r.place(rec.placement)
		}
	case recQueue:
		r.queueDecls[rec.id] = rec.decl
	case recUnqueue:
		d, ok := r.queueDecls[rec.id]
		if !ok {
			return
		}
		delete(r.queueDecls, rec.id)
		if q := r.queues[rec.id]; q != nil {
			for _, m := range q.msgs {
				r.unref(m.msgID)
			}
			delete(r.queues, rec.id)
		}
		r.unbind(func(b decl) bool { return b.flags&flagToQueue != 0 && b.dest == d.name })
	case recExchange:
		r.exchangeDecls[rec.name] = rec.decl
	case recUnexchange:
		delete(r.exchangeDecls, rec.name)
		r.unbind(func(b decl) bool { return b.name == rec.name || b.flags&flagToQueue == 0 && b.dest == rec.name })
	case recBind:
		if !slices.ContainsFunc(r.bindings, rec.decl.sameBinding) {
			r.bindings = append(r.bindings, rec.decl)
		}
	case recUnbind:
		r.unbind(rec.decl.sameBinding)
	default:
		q := r.queues[rec.queueID]
		if q == nil {
			return
		}
		m := q.msgs[rec.seq]
		if m == nil {
			return
		}
		switch rec.typ {
		case recDeliver:
			m.delivered = true
		case recReturn:
			m.delivered, m.redelivered, m.returns = false, true, uint32(rec.n)
		case recDelay:
			m.delivered, m.due = false, rec.n
		case recSettle:
			delete(q.msgs, rec.seq)
			r.unref(m.msgID)
		}
	}
}

// unbind removes the bindings for which drop returns true.
func (r *replay) unbind(drop func(decl) bool) {
	r.bindings = slices.DeleteFunc(r.bindings, drop)
}

// sameBinding reports whether b binds what d binds: the same ends, key and arguments.
func (d decl) sameBinding(b decl) bool {
	return b.name == d.name && b.dest == d.dest && b.flags == d.flags && b.kind == d.kind && sameField(b.args, d.args)
}

// place puts a message into a queue, or replaces its state there (compaction writes it again).
func (r *replay) place(p placement) {
	q := r.queues[p.queueID]
	if q == nil {
		q = &replayQueue{msgs: map[uint64]*replayMsg{}}
		r.queues[p.queueID] = q
	}
	q.last = max(q.last, p.seq)
	r.bodies[p.msgID].refs++ // before the old placement lets go: it may be the same body
	if old := q.msgs[p.seq]; old != nil {
		r.unref(old.msgID)
	}
	q.msgs[p.seq] = &replayMsg{msgID: p.msgID, seq: p.seq, deadline: p.deadline, returns: p.returns, redelivered: p.returns > 0}
}

// unref drops one placement of a message's body, and the body with its last.
func (r *replay) unref(msgID uint64) {
	b := r.bodies[msgID]
	if b == nil {
		return
	}
	if b.refs--; b.refs <= 0 {
		r.live[b.seg]--
		delete(r.bodies, msgID)
	}
}

// messages returns what queueID gets back, in sequence order: each message as it is to be put
// back, a delivery outstanding at the end of the log returned (redelivered, one return more).
func (r *replay) messages(queueID uint64) []replayMsg {
	q := r.queues[queueID]
	if q == nil {
		return nil
	}
	ms := make([]replayMsg, 0, len(q.msgs))
	for _, m := range q.msgs {
		back := *m
		if back.delivered {
			back.delivered, back.redelivered = false, true
			back.returns = min(back.returns+1, 1<<32-1)
		}
		ms = append(ms, back)
	}
	slices.SortFunc(ms, func(a, b replayMsg) int { return cmp.Compare(a.seq, b.seq) })
	return ms
}

// body returns the encoding of a message held by the replay.
func (r *replay) body(msgID uint64) []byte {
	if b := r.bodies[msgID]; b != nil {
		return b.msg
	}
	return nil
}

// restore puts back into q, a durable queue just declared again, what the replay holds for it:
// messages at their sequence ids, deadlines and due times moved from the wall clock to the
// queue's (what passed them while the process was down is due at once), envelopes shared by
// the queues a message went to.
func (q *Queue) restore(r *replay, envs map[uint64]*envelope) error {
	rq := r.queues[q.log.qid]
	if rq == nil {
		return nil
	}
	now, wall := q.core.clock(), time.Now().UnixNano()
	onClock := func(t int64) int64 { return max(1, now+(t-wall)) }
	var (
		ready   []entry
		delayed []delayedEntry
	)
	for _, m := range r.messages(q.log.qid) {
		env := envs[m.msgID]
		if env == nil {
			x, key, msg, err := decodeEnvelope(r.body(m.msgID))
			if err != nil {
				return errorf("queue %q, message %d: %w", q.name, m.seq, err)
			}
			ex := q.b.exchanges[x]
			if ex == nil {
				ex = &Exchange{name: x} // gone since: its name is all a delivery says of it
			}
			env = &envelope{msg: msg, exchange: ex, routingKey: key, more: &envelopeMore{logID: m.msgID, seg: r.bodies[m.msgID].seg}}
			envs[m.msgID] = env
		}
		env.more.refs.Add(1)
		e := entry{env: env, seq: m.seq, returns: m.returns, redelivered: m.redelivered}
		if p := q.cfg.maxPriority; p > 0 {
			e.rank = uint8(p - min(p, int(env.msg.Priority)))
		}
		if m.deadline != 0 {
			e.deadline = onClock(m.deadline)
		}
		if m.due != 0 {
			delayed = append(delayed, delayedEntry{onClock(m.due), e})
		} else {
			ready = append(ready, e)
		}
	}
	slices.SortFunc(ready, func(a, b entry) int { return cmp.Compare(a.key(), b.key()) })
	q.mu.Lock()
	q.core.restore(ready, delayed, rq.last+1)
	q.commit() // arms the timer: what expired while the process was down expires now
	return nil
}

package warren

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenmq/warren/internal/wal"
)

// The store: a durable broker's log (docs/DURABILITY.md). It turns the effects of persistent
// messages in durable queues, and changes of the durable topology, into records (record.go),
// appends them to the log under the lock of the critical section that made them, so that the
// log's order is theirs, and lets the caller wait for them with no lock held.

// store is a durable broker's log and its counters.
type store struct {
	log     *wal.Log
	nextMsg atomic.Uint64 // the last message id given
	// deferred is the highest log position a PublishDeferred's Confirmation waits for: a
	// later one waits for it too, even with nothing of its own to wait for.
	deferred atomic.Uint64
	// nextQueue is the last queue id given; guarded by the broker's topology lock.
	nextQueue uint64
	// restoring is the id of the queue being declared while the log is replayed (open): it
	// is in the log already. 0 otherwise.
	restoring uint64
	// replaying is set while open declares what the log holds: nothing is logged again.
	replaying bool
	// topology is the log position of the topology change in progress, which the broker's
	// unlockTopology waits for; guarded by the broker's topology lock.
	topology wal.LSN
	logger   *slog.Logger
	// exchanges stand for the exchanges named in messages read back from the log (pager.go).
	exchanges sync.Map
	lock      io.Closer // the directory's lock (Open); nil on other file systems
	fs        wal.FS    // the log's directory, where the checkpoints go (checkpoint.go)
	// checkpoints numbers the last checkpoint written (or read at Open); the compactor's
	// goroutine and Close write them, one after the other. Guarded by mu.
	checkpoints uint64
	recovery    Recovery // what Open found; set before Open returns, read-only after

	// The durable topology as it stands, and the oldest segment holding a record of it.
	topo    *replay
	topoSeg uint64

	// Which segments are needed: a segment is removed once it and every segment before it
	// hold no body of a message a durable queue holds (a later segment may hold the state of
	// such a message: its returns, its delay). mu is taken under a queue's lock, and the log's
	// lock under it: a batch's append and the count of the bodies it wrote are one section.
	mu      sync.Mutex
	live    liveSegments // what each segment holds that a durable queue holds
	oldest  uint64       // the oldest segment still needed
	lastSeg uint64       // the segment the log last appended to
	// compacting is set while a compaction pass runs (compact.go); pass counts them.
	// sinceCheckpoint counts the segments started since the last checkpoint; every are due
	// between two (brokerConfig.checkpointEvery).
	sinceCheckpoint, every int
	// maxHeld is the most messages held in memory for which a running checkpoint is taken
	// (checkpointMaxHeld; tests set it lower).
	maxHeld    int
	compacting bool
	grewInPass bool // a segment was started during the pass (wrote)
	pass       uint64
	compactor  compactor
}

// liveSegments says, for each segment of the log, what it holds that is live: bodies of
// messages a durable queue holds, and their records' bytes. A segment with nothing live is
// absent.
type liveSegments map[uint64]segUse

type segUse struct {
	bodies int
	bytes  int64
}

// add adds n bodies of the given bytes (negative: removes them) to seg's.
func (l liveSegments) add(seg uint64, n int, bytes int64) {
	u := l[seg]
	u.bodies += n
	u.bytes += bytes
	if u.bodies <= 0 {
		delete(l, seg)
	} else {
		l[seg] = u
	}
}

// unreached is a log position that a failed log never reaches: waiting for it returns the
// log's error. It is what an append to a failed log returns, so that its caller's wait fails.
const unreached = ^wal.LSN(0)

// queueLog is what a durable queue of a durable broker keeps for its log; guarded by the
// queue's mu.
type queueLog struct {
	qid    uint64                      // its id in the log
	keep   atomic.Pointer[[]*listener] // never nil: the core records every effect (core.heard)
	logged int                         // effects of the core already logged
	buf    []byte                      // records being built
	recs   [][]byte
	bodies []loggedBody // the messages whose bodies are in the records being built
	unrefs []*envelope  // the messages the records being built let go of
}

// loggedBody is a message whose body is in the records being built, and the bytes of its
// record. Its envelope's seg and size are set under the store's mu once they are appended: a
// queue that lets go of the message reads them there.
type loggedBody struct {
	env  *envelope
	size int64
}

// logEffects appends the records of q's effects efs (those of persistent messages) and returns
// the log position after them, 0 if there were none. The caller holds q's lock. A log that
// failed takes nothing; whoever waits is told (wal.Log.Wait).
func (s *store) logEffects(q *Queue, efs []effect) wal.LSN {
	buf := q.log.buf[:0]
	q.log.recs = q.log.recs[:0]
	var now, wall int64 // the queue's clock and the wall clock, read once, when needed
	for _, ef := range efs {
		if ef.ev != nil || !ef.e.env.persistent {
			continue
		}
		env, start := ef.e.env, len(buf)
		if ef.refused() {
			continue // never logged as here: it holds no reference
		}
		switch ef.kind {
		case EventEnqueued:
			p := placement{queueID: q.log.qid, seq: ef.e.seq, returns: ef.e.returns}
			if ef.e.deadline != 0 {
				if now == 0 {
					now, wall = q.core.clock(), time.Now().UnixNano()
				}
				p.deadline = wall + (ef.e.deadline - now)
			}
			// env.more is there: a durable broker gives every persistent envelope its log
			// state before any queue sees it (newEnvelope).
			if env.more.logID == 0 {
				env.more.logID = s.nextMsg.Add(1)
			}
			p.msgID = env.more.logID
			if env.more.refs.Add(1) == 1 {
				// Its body, once: the first durable queue to take it, or again when every
				// queue let it go and it came back (an auto-acked delivery returned unread).
				var size int64
				buf, size = appendPublish(buf, p, env)
				q.log.bodies = append(q.log.bodies, loggedBody{env, size})
			} else {
				buf = appendPlacement(buf, p, nil)
			}
		case EventDelivered:
			if ef.atReceipt {
				continue // written when the application receives it (received), if it does
			}
			buf = appendSeqRecord(buf, recDeliver, q.log.qid, ef.e.seq, 0)
		case EventRequeued:
			buf = appendSeqRecord(buf, recReturn, q.log.qid, ef.e.seq, int64(ef.e.returns))
		case eventDelayed:
			if now == 0 {
				now, wall = q.core.clock(), time.Now().UnixNano()
			}
			buf = appendSeqRecord(buf, recDelay, q.log.qid, ef.e.seq, wall+(ef.n-now))
		case EventAcked, EventExpired, EventMoved:
			buf = appendSeqRecord(buf, recSettle, q.log.qid, ef.e.seq, 0)
			q.log.unrefs = append(q.log.unrefs, env)
		case EventDropped:
			switch ef.reason {
			case ReasonClosed:
				continue // the broker's end, not the message's: it stays in the log
			case ReasonQueueDeleted:
				q.log.unrefs = append(q.log.unrefs, env) // the queue's deletion record says it
				continue
			}
			buf = appendSeqRecord(buf, recSettle, q.log.qid, ef.e.seq, 0)
			q.log.unrefs = append(q.log.unrefs, env)
		default:
			// A dead letter is settled once it is in its target queues (settleDeadLetter).
			continue
		}
		q.log.recs = append(q.log.recs, buf[start:len(buf):len(buf)])
	}
	q.log.buf = buf
	if len(q.log.recs) == 0 && len(q.log.unrefs) == 0 {
		return 0
	}
	// One critical section for the batch: its append, then its bookkeeping, the bodies it wrote
	// and the messages it let go of (after their settle records, and after a body the same batch
	// wrote). The append is inside it so that no other queue can release the segment a body
	// went to between the append and the count that keeps the segment.
	var (
		lsn wal.LSN
		seg uint64
		err error
	)
	s.mu.Lock()
	if len(q.log.recs) > 0 {
		if lsn, seg, err = s.log.Append(q.log.recs...); err != nil {
			lsn = unreached // the log failed: Wait says so
		}
	}
	if lsn != unreached {
		for _, b := range q.log.bodies {
			b.env.more.seg, b.env.more.size = seg, b.size
			s.live.add(seg, 1, b.size)
		}
		if seg != 0 {
			s.wrote(seg)
		}
	}
	for _, env := range q.log.unrefs {
		s.unrefLocked(env)
	}
	s.mu.Unlock()
	clear(q.log.bodies)
	q.log.bodies = q.log.bodies[:0]
	clear(q.log.unrefs)
	q.log.unrefs = q.log.unrefs[:0]
	return lsn
}

// received writes the deliver record of d, a delivery of a persistent message from the durable
// queue q to a holder whose deliveries count at receipt (holder.atReceipt), now that the
// application has it: a Serve worker took it to run the handler. It returns the log position
// after the record, for the caller to wait for, or 0 if nothing was written: d is no longer
// outstanding (settled, or taken back, whose record says where the message stands), or its
// receipt is written already.
//
// The rule it keeps: a delivery counts towards the delivery limit after a crash (a message out
// when the process stopped comes back with its count one higher) only if the application
// received it. Dispatch writes nothing for such a delivery, so a message still buffered in
// Serve's consumer at a crash comes back unchanged, as Cancel returns it; a handler that takes
// the process down still counts, since Serve waits for this record before the handler runs.
// (Get's deliveries are received as they are made, and a Consume channel's receive is not
// seen: both are written at dispatch.) Under q's lock, so that the record is in the log after
// the message's placement and its dispatch, and before whatever settles or returns the
// delivery.
func (s *store) received(q *Queue, d *Delivery) wal.LSN {
	r := d.lease
	if r == nil {
		return 0
	}
	var lsn wal.LSN
	q.mu.Lock()
	if r.gen == d.gen && r.state == deliveryOutstanding && r.uncounted && q.endErr == nil {
		r.uncounted = false
		q.log.buf = appendSeqRecord(q.log.buf[:0], recDeliver, q.log.qid, r.e.seq, 0) // Append copies it
		var err error
		if lsn, _, err = s.log.Append(q.log.buf); err != nil {
			lsn = unreached // the log failed: Wait says so
		}
	}
	q.commit()
	return lsn
}

// unref records that a durable queue let go of a persistent message; the last to let go frees
// its body's segment, and the segments that then need keeping no more are released.
func (s *store) unref(env *envelope) {
	if env.more == nil {
		return
	}
	s.mu.Lock() // with the count: a queue taking it again meanwhile moves its seg under mu
	defer s.mu.Unlock()
	s.unrefLocked(env)
}

// unrefLocked is unref; the caller holds mu.
func (s *store) unrefLocked(env *envelope) {
	if env.more == nil {
		return
	}
	if env.more.refs.Add(-1) != 0 {
		return
	}
	s.live.add(env.more.seg, -1, -env.more.size)
	s.advanceLocked()
}

// advanceLocked moves oldest past the segments nothing needs, and releases them. The durable
// topology's records are among what they may hold: it is written again first, whole, at the
// head of the log.
func (s *store) advanceLocked() {
	start := s.oldest
	if s.compacting {
		return // a pass is moving bodies: their queues' placements are not all moved yet
	}
	for s.oldest < s.lastSeg && s.live[s.oldest].bodies <= 0 {
		s.oldest++
	}
	if s.oldest == start {
		return
	}
	if s.topoSeg != 0 && s.topoSeg < s.oldest {
		_, seg, err := s.log.Append(s.topologyRecords()...)
		if err != nil {
			return
		}
		s.topoSeg = seg
		s.wrote(seg)
	}
	s.log.ReleaseBelow(s.oldest)
}

// declareQueue records the declaration of a new durable queue, under the broker's topology
// lock, and gives it its id (or, while the store restores the log, the id it had).
func (s *store) declareQueue(q *Queue) wal.LSN {
	if s.restoring != 0 {
		q.log.qid = s.restoring
		return 0
	}
	s.nextQueue++
	q.log.qid = s.nextQueue
	d := decl{id: q.log.qid, name: q.name, flags: flagDurable, args: q.cfg.args}
	if q.cfg.autoDelete {
		d.flags |= flagAutoDelete
	}
	s.logTopologyLocked(recQueue, d)
	return s.topology
}

// close closes the log, once every queue has ended. It returns an error wrapping ErrStorage
// when the log failed, or could not write what it held (a disk still full).
// close closes the log and, if it closed cleanly (everything synced) and ck is not nil, writes
// ck, the checkpoint Close took.
func (s *store) close(ck *checkpoint) error {
	err := s.log.Close()
	if err != nil {
		s.logger.Error("warren: closing the durable log", "err", err)
		err = errorf("close: %w: %w", ErrStorage, err)
	} else if ck != nil {
		s.write(ck)
	}
	if s.lock != nil {
		s.lock.Close()
	}
	return err
}

// newEnvelope returns a new envelope of msg, in one allocation with what it needs beside it:
// the whole Message, for msg's headers and properties, or for a listener, so that every event of
// the message carries the same *Message; the state a durable broker's log keeps of a persistent
// message, which must be there before any queue can see the envelope (a durable queue's commit
// fills it in while other queues' goroutines may read its BCC keys). A message with only a body,
// Persistent and Priority, on a broker from New that nobody listens to, gets the 48-byte
// envelope alone.
func (b *Broker) newEnvelope(msg *Message, x *Exchange, key string) *envelope {
	return b.envelopeOf(msg, x, key, b.store != nil && msg.Persistent)
}

// envelopeOf is newEnvelope, with the log state when logged (the store's replay: a record of
// the log gets it, whatever its flags say).
func (b *Broker) envelopeOf(msg *Message, x *Exchange, key string, logged bool) *envelope {
	var env *envelope
	switch {
	case msg.needsMore() || b.listening():
		f := &fullEnvelope{}
		f.more.msg = &f.msg
		f.envelope.more = &f.more
		env = &f.envelope
	case logged:
		l := &loggedEnvelope{}
		l.envelope.more = &l.more
		env = &l.envelope
	default:
		env = &envelope{}
	}
	env.exchange, env.routingKey = x, key
	env.setMessage(msg)
	if env.more != nil {
		env.more.cost = moreCost(env.more)
	}
	return env
}

// fullEnvelope is an envelope, its envelopeMore and the whole Message, allocated together.
type fullEnvelope struct {
	envelope
	more envelopeMore
	msg  Message
}

// loggedEnvelope is an envelope and its envelopeMore, for a durable broker's log state alone.
type loggedEnvelope struct {
	envelope
	more envelopeMore
}

// confirm waits until the log holds everything a publish wrote to it, up to lsn (0: nothing):
// written, and synced under SyncAlways. While the log is stalled (a full disk) it waits for the
// log to write again. If ctx ends first it returns ctx.Err(): the records are still in the log,
// and are written if the log can, so the publish's outcome is unknown (as a publish whose
// confirm times out on RabbitMQ).
func (b *Broker) confirm(ctx context.Context, lsn wal.LSN) error {
	if lsn == 0 {
		return nil
	}
	err := b.store.log.Wait(ctx, lsn)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, wal.ErrClosed):
		return ErrClosed // the broker closed while the publish waited
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return err
	}
	return errorf("publish: %w: %w", ErrStorage, err)
}

// refusing returns why the log takes no new work now: an error wrapping wal.ErrStalled (a write
// found no space; the log retries) or wal.ErrFailed; nil when it takes work, or is closed (the
// broker says ErrClosed itself). Publishes of persistent messages to durable queues, and their
// settlements, check it before they change anything, and are refused with ErrStorage, so that
// what the log cannot take leaves no trace in memory either. One atomic load.
func (s *store) refusing() error {
	if err := s.log.Err(); err != nil && !errors.Is(err, wal.ErrClosed) {
		return err
	}
	return nil
}

// refusePublish returns the error of a persistent message's publish routed to qs, if one of
// them is durable and the log takes no new work (refusing); nil otherwise.
func (s *store) refusePublish(qs []*Queue) error {
	cause := s.refusing()
	if cause == nil {
		return nil
	}
	for _, q := range qs {
		if q.log != nil {
			return errorf("publish to durable queue %q: %w: %w", q.name, ErrStorage, cause)
		}
	}
	return nil
}

// settleDeadLetter records that a message dead-lettered from the durable queue q left it, once
// its copy is in the queues it went to (at least once: a crash in between leaves it in both).
func (s *store) settleDeadLetter(q *Queue, ef effect) {
	if !ef.e.env.persistent || ef.refused() {
		return
	}
	s.log.Append(appendSeqRecord(nil, recSettle, q.log.qid, ef.e.seq, 0))
	s.unref(ef.e.env)
}

// logTopologyLocked logs a change of the durable topology; the caller holds the broker's
// topology lock, and unlockTopology waits for the record.
func (s *store) logTopologyLocked(t recordType, d decl) {
	if s.replaying {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.topo.apply(0, record{typ: t, decl: d})
	lsn, seg, err := s.log.Append(appendDecl(nil, t, d))
	if err != nil {
		s.topology = unreached
		return
	}
	s.topology = lsn
	s.wrote(seg)
	if s.topoSeg == 0 {
		s.topoSeg = seg
	}
}

// topologyRecords returns the records of the durable topology as it stands. The caller holds
// mu.
func (s *store) topologyRecords() [][]byte {
	var recs [][]byte
	for _, name := range slices.Sorted(maps.Keys(s.topo.exchangeDecls)) {
		recs = append(recs, appendDecl(nil, recExchange, s.topo.exchangeDecls[name]))
	}
	for _, id := range slices.Sorted(maps.Keys(s.topo.queueDecls)) {
		recs = append(recs, appendDecl(nil, recQueue, s.topo.queueDecls[id]))
	}
	for _, d := range s.topo.bindings {
		recs = append(recs, appendDecl(nil, recBind, d))
	}
	return recs
}

// durableQueues returns b's durable queues of a durable broker: those with a log. The caller holds b's topology lock.
func (b *Broker) durableQueues() []*Queue {
	var queues []*Queue
	for _, q := range b.queues {
		if q.log != nil {
			queues = append(queues, q)
		}
	}
	return queues
}

// durable reports whether x is a durable exchange of a durable broker, other than a
// predeclared one (those exist in every broker).
func (x *Exchange) durable() bool {
	return x.b.store != nil && x.cfg.durable && x.name != "" && !strings.HasPrefix(x.name, "amq.")
}

// durable reports whether a binding is durable: both its ends are (predeclared exchanges are).
func (bd *binding) durable() bool {
	if bd.src.b.store == nil || !bd.src.cfg.durable {
		return false
	}
	if bd.queue != nil {
		return bd.queue.log != nil
	}
	return bd.exchange.cfg.durable
}

// decl returns a binding's declaration, for its records.
func (bd *binding) decl() decl {
	d := decl{name: bd.src.name, kind: bd.key, args: bd.args}
	if bd.queue != nil {
		d.dest, d.flags = bd.queue.name, flagToQueue
	} else {
		d.dest = bd.exchange.name
	}
	return d
}

package warren

import (
	"errors"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/warrenmq/warren/internal/wal"
)

// Opening a durable broker: Open, its options, and the replay of the log into the broker
// (docs/DURABILITY.md).

// Open returns a durable broker whose log is in the directory dir (created if missing): it
// keeps, as RabbitMQ does, the [Durable] exchanges and queues, the bindings between durable
// ends, and the [Message.Persistent] messages in durable queues, and gets them back when dir is
// opened again, after a [Broker.Close], a crash of the process or a power loss. Transient
// messages, non-durable queues and exclusive queues live in memory only, as in a broker from
// [New], which a durable broker otherwise is.
//
// What comes back: every confirmed persistent message of a durable queue, at its place in the
// queue's order; a message out with a consumer when the broker stopped comes back redelivered,
// its delivery count one higher (so a poison message still reaches its [DeliveryLimit]), unless
// it was only buffered for a [Queue.Serve]'s workers and no handler took it (see
// [DeliveryLimit]); a returned message keeps its count, a delayed one its due time, every message its deadline, so
// that what expired while the process was down expires (and dead-letters) at once; [Expires]
// leases start again.
//
// A publish of a persistent message to a durable queue returns only once its record is written
// to the operating system, so a crash of the process loses no confirmed message; whether a
// power loss can, [WithSync] decides (default [SyncAlways]). An acknowledgement is not waited
// for: it is written within a millisecond plus the write(2) in progress, if any — it waits for
// no fsync, except, once per 512 KiB segment, the log's move to a new one (an fsync of the
// segment and one of the directory) — and a crash in that window delivers its message again.
//
// A full disk does not stop the broker: while the log finds no space to write, a persistent
// publish to a durable queue and a settlement of one are refused with [ErrStorage] before they
// change anything, everything else goes on in memory, and the log retries (10 ms, doubling to
// 1 s) until a write succeeds; then they are accepted again, with no restart (RabbitMQ's
// free-disk alarm blocks its publishers likewise). It is logged, as a warning, when it begins
// and when it ends.
//
// Open fails when another broker has dir open ([ErrResourceLocked]), and when the log lost
// something a sync had made durable ([ErrCorrupt], naming the file and the offset; see
// [WithSalvage]): a damaged byte, a segment file missing, the first or the last one included, a
// segment cut short. A failed Open writes nothing to dir. What Open may cut and still open is a
// torn end, which a crash leaves: bytes at the end of the log that no sync covered (so nothing
// [SyncAlways] confirmed), cut, logged, told to [WithListener]'s listener as an
// [EventLogRepaired], and returned by [Broker.Recovery]. After a crash, the last batches written
// before it may be taken for a torn end (docs/DURABILITY.md, "Recovery").
//
// Open does not read the whole log: every 128 segments (64 MiB of records) and at
// [Broker.Close], the broker writes a checkpoint of its durable queues' state beside the log,
// and Open starts from the newest one still in the log, replays the records written after it,
// and reads back only the bodies of the messages that go back into memory: a backlog of 100M
// messages opens in under a second, after a clean Close or a kill -9. Damage to a segment of the
// backlog on disk before the checkpoint is found when its queue reads it back: [Queue.Get]
// returns an error wrapping [ErrStorage], consumers wait, and the read is retried every
// second; [WithSalvage] reads the whole log, to say what damage cost.
func Open(dir string, opts ...BrokerOption) (*Broker, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, errorf("open %s: %w", dir, err)
	}
	lock, err := wal.LockDir(dir)
	if errors.Is(err, wal.ErrLocked) {
		return nil, errorf("open %s: in use by another broker: %w", dir, ErrResourceLocked)
	}
	if err != nil {
		return nil, errorf("open %s: %w", dir, err)
	}
	b, err := openBroker(wal.OSFS{Dir: dir}, opts...)
	if err != nil {
		lock.Close()
		return nil, err
	}
	b.store.lock = lock
	return b, nil
}

// SyncPolicy says when a durable broker syncs its log to the disk (fsync), and so what a power
// loss may take: [SyncAlways], [SyncInterval], [SyncNever]. Whatever the policy, a publish is
// confirmed only once its record is written to the operating system, so a crash of the process
// loses no confirmed message.
type SyncPolicy struct {
	mode     wal.SyncMode
	interval time.Duration
}

var (
	// SyncAlways syncs before a publish is confirmed: a confirmed message survives a power
	// loss. Concurrent publishers share a sync (group commit), so throughput grows with them; a
	// single publisher waits for the disk once per publish, once per [Broker.PublishBatch], or
	// once per window of [Broker.PublishDeferred] confirms.
	SyncAlways = SyncPolicy{mode: wal.SyncAlways}
	// SyncNever leaves syncing to the operating system (and to Close): a power loss may take
	// whatever it had not yet written back.
	SyncNever = SyncPolicy{mode: wal.SyncNever}
)

// SyncInterval syncs the log at most d after a write: a power loss takes at most the last d of
// confirmed messages. d ≤ 0 means 100 ms.
func SyncInterval(d time.Duration) SyncPolicy {
	return SyncPolicy{mode: wal.SyncInterval, interval: d}
}

// WithSync sets a durable broker's sync policy. Default: [SyncAlways].
func WithSync(p SyncPolicy) BrokerOption { return p }

func (p SyncPolicy) applyBroker(c *brokerConfig) { c.wal.Sync, c.wal.Interval = p.mode, p.interval }

// WithSalvage lets [Open] go on past damage it otherwise refuses with [ErrCorrupt]: it skips
// each damaged stretch of the log, bad segment header and missing segment file, and says what
// it skipped, and what it knows that cost each durable queue, in the [Recovery] that
// [Broker.Recovery] returns, in the log, and to [WithListener]'s listener
// ([EventLogRepaired]). Messages whose records were there are lost; a message whose
// acknowledgement may have been there comes back, redelivered. The damage stays in the log
// until its segments go, so every Open needs WithSalvage until then. For an operator
// recovering a damaged disk.
func WithSalvage() BrokerOption { return salvageOption{} }

type salvageOption struct{}

func (salvageOption) applyBroker(c *brokerConfig) { c.wal.Salvage = true }

// WithListener registers fn as [Broker.Listen] does, before the broker does anything: it hears
// what [Open] does while it recovers the log (messages that expired while the process was down,
// an [EventLogRepaired]). nil is ignored.
func WithListener(fn func(Event)) BrokerOption { return listenerOption(fn) }

type listenerOption func(Event)

func (o listenerOption) applyBroker(c *brokerConfig) {
	if o != nil {
		c.listeners = append(c.listeners, o)
	}
}

// openBroker opens a durable broker whose log is in fs: it replays the log into the durable
// queues and their messages (recovery.go), and from then on logs them.
func openBroker(fs wal.FS, opts ...BrokerOption) (*Broker, error) {
	b := New(opts...)
	cks, errs := readCheckpoints(fs)
	for _, err := range errs {
		b.cfg.logger.Warn("warren: durable log: a checkpoint is not used", "err", err)
	}
	r, log, rec, err := b.openLog(fs, cks)
	if err != nil {
		b.Close()
		return nil, errorf("open durable broker: %w", err)
	}
	if len(rec.Skipped) > 0 {
		// Salvage dropped records a checkpoint may stand for: none is used again.
		if err := removeCheckpoints(fs); err != nil {
			b.cfg.logger.Warn("warren: durable log: removing the checkpoints", "err", err)
		}
	}
	for _, ck := range cks {
		r.checkpoints = max(r.checkpoints, ck.seq)
	}
	r.finish()
	topo := newReplay()
	topo.queueDecls, topo.exchangeDecls, topo.bindings = r.queueDecls, r.exchangeDecls, r.bindings
	b.store = &store{log: log, fs: fs, logger: b.cfg.logger, live: r.live, oldest: 1, lastSeg: rec.Last, topo: topo, topoSeg: 1,
		checkpoints: r.checkpoints, nextQueue: r.nextQueue, every: b.cfg.checkpointEvery, maxHeld: checkpointMaxHeld}
	b.store.nextMsg.Store(r.maxMsg)
	b.store.recovery = Recovery{Checkpoint: rec.Resumed, Cut: logDamage(rec.Cut), Skipped: logDamage(rec.Skipped)}
	for _, d := range rec.Cut {
		b.repaired(d, "cut a torn end")
	}
	for _, d := range rec.Skipped {
		b.repaired(d, "skipped damage")
	}
	b.store.replaying = true
	for _, name := range slices.Sorted(maps.Keys(r.exchangeDecls)) {
		d := r.exchangeDecls[name]
		xopts := []ExchangeOption{Durable(), Arguments(d.args)}
		if d.flags&flagAutoDelete != 0 {
			xopts = append(xopts, AutoDelete())
		}
		if d.flags&flagInternal != 0 {
			xopts = append(xopts, Internal())
		}
		if d.alt != "" {
			xopts = append(xopts, AlternateExchange(d.alt))
		}
		if _, err := b.DeclareExchange(name, d.kind, xopts...); err != nil {
			b.Close()
			return nil, errorf("open durable broker: %w", err)
		}
	}
	var restored []*Queue
	for _, id := range slices.Sorted(maps.Keys(r.queueDecls)) {
		d := r.queueDecls[id]
		qopts := []QueueOption{Durable(), Arguments(d.args)}
		if d.flags&flagAutoDelete != 0 {
			qopts = append(qopts, AutoDelete())
		}
		b.store.restoring = id
		q, err := b.DeclareQueue(d.name, qopts...)
		b.store.restoring = 0
		if err == nil {
			restored = append(restored, q)
			err = q.restore(r)
		}
		if err != nil {
			b.Close()
			return nil, errorf("open durable broker: %w", err)
		}
		b.store.nextQueue = max(b.store.nextQueue, id)
	}
	b.store.mu.Lock()
	b.store.advanceLocked()
	b.store.mu.Unlock()
	for _, d := range r.bindings {
		var err error
		if d.flags&flagToQueue != 0 {
			err = b.Bind(d.dest, d.name, d.kind, d.args)
		} else {
			err = b.BindExchange(d.dest, d.name, d.kind, d.args)
		}
		if len(rec.Skipped) > 0 && errors.Is(err, ErrNotFound) {
			// An end's declaration was skipped: the binding goes with it.
			b.cfg.logger.Warn("warren: durable log: a binding lost an end to skipped damage", "source", d.name,
				"destination", d.dest, "err", err)
			continue
		}
		if err != nil {
			b.Close()
			return nil, errorf("open durable broker: binding %q to %q: %w", d.name, d.dest, err)
		}
	}
	b.store.replaying = false
	for _, q := range restored {
		if rq := r.queues[q.log.qid]; rq != nil {
			b.store.recovery.Messages += rq.msgs.n
			for _, c := range rq.chunks {
				b.store.recovery.Messages += c.n
			}
		}
	}
	if len(rec.Skipped) > 0 {
		b.store.recovery.Queues = r.damage()
		for _, d := range b.store.recovery.Queues {
			b.damaged(d)
		}
	}
	for _, q := range restored {
		q.resume() // dead letters find their targets now
	}
	b.store.startCompactor(b)
	return b, nil
}

// openLog opens the log in fs and returns the replay of what it holds: from the newest of the
// checkpoints cks whose mark is still in the log, the records after it replayed over it, with
// the bodies of the messages that go back into memory read back; or, if none is, or the one
// taken is not right, from every record of the log.
func (b *Broker) openLog(fs wal.FS, cks []*checkpoint) (*replay, *wal.Log, wal.Recovery, error) {
	if b.cfg.wal.Salvage {
		cks = nil // salvage reads every byte, to say what damage cost
	}
	if b.cfg.pageWindow == 0 { // this broker does not page: a checkpoint with chunks is not for it
		cks = slices.DeleteFunc(slices.Clone(cks), func(ck *checkpoint) bool {
			return slices.ContainsFunc(ck.queues, func(q ckQueue) bool { return len(q.chunks) > 0 })
		})
	}
	// The log keeps its options for its life: the replay must not stay reachable through their
	// closures once Open is done with it (it held the whole backlog's bodies: 240 B a message),
	// nor the checkpoints: they reach them through st, emptied then.
	st := &struct {
		r   *replay
		cks []*checkpoint
		bad error // the checkpoint taken does not decode
	}{r: newReplay(), cks: cks}
	wopts := b.cfg.wal
	wopts.OnStall = b.logStall
	wopts.ResumeAt = nil
	for _, ck := range cks {
		wopts.ResumeAt = append(wopts.ResumeAt, ck.mark)
	}
	wopts.OnResume = func(m wal.Mark) { // called by wal.Open only
		i := slices.IndexFunc(st.cks, func(ck *checkpoint) bool { return ck.mark.At(m) })
		var from *replay
		if from, st.bad = st.cks[i].replay(); st.bad == nil {
			st.r = from
		}
	}
	wopts.OnSkip = func(wal.Damage) { st.r.skipped() } // called by wal.Open only
	log, rec, err := wal.Open(fs, wopts, func(seg uint64, raw []byte) error {
		if st.bad != nil {
			return st.bad
		}
		rc, err := decodeRecord(raw)
		if err != nil {
			return err
		}
		st.r.apply(seg, rc)
		return nil
	})
	r, bad := st.r, st.bad
	st.r, st.cks = nil, nil
	if err == nil && rec.Resumed {
		if err = bad; err == nil {
			err = r.loadBodies(log)
		}
		if err != nil {
			b.cfg.logger.Warn("warren: durable log: a checkpoint is not used; the whole log is read", "err", err)
			log.Close() // it wrote nothing but what any Open writes: the repair of a torn end
			return b.openLog(fs, slices.DeleteFunc(slices.Clone(cks), func(ck *checkpoint) bool { return ck.mark.At(rec.ResumedAt) }))
		}
	}
	if errors.Is(err, wal.ErrCorrupt) {
		err = errorf("%w: %w", ErrCorrupt, err)
	}
	if errors.Is(err, errBadCheckpoint) && rec.Resumed {
		b.cfg.logger.Warn("warren: durable log: a checkpoint is not used; the whole log is read", "err", err)
		return b.openLog(fs, slices.DeleteFunc(slices.Clone(cks), func(ck *checkpoint) bool { return ck.mark.At(rec.ResumedAt) }))
	}
	return r, log, rec, err
}

// logStall logs, as a warning, that the log stalled (err: a write found no space) or writes
// again (nil): RabbitMQ's free-disk alarm, which operators watch for. The log calls it with no
// lock held.
func (b *Broker) logStall(err error) {
	if err != nil {
		b.cfg.logger.Warn("warren: durable log: no space left to write; persistent publishes to durable queues and their settlements are refused until a write succeeds", "err", err)
		return
	}
	b.cfg.logger.Warn("warren: durable log: writing again; persistent publishes and settlements are accepted")
}

// repaired logs and events a stretch of the log that Open dropped.
func (b *Broker) repaired(d wal.Damage, what string) {
	b.cfg.logger.Warn("warren: durable log: "+what, "file", d.File, "offset", d.Offset,
		"bytes", d.Bytes, "records", d.Records, "missing", d.Missing, "reason", d.Reason,
		"good batches dropped", d.GoodAfter)
	if b.listening() {
		b.emit(Event{Kind: EventLogRepaired, Value: d.Bytes, Limit: int64(d.Records),
			Err: errorf("%s at %s offset %d (%s), %d bytes, %d records: %w", what, d.File, d.Offset, d.Reason, d.Bytes, d.Records, ErrCorrupt)})
	}
}

// damaged logs and events what skipped damage cost a durable queue.
func (b *Broker) damaged(d QueueDamage) {
	b.cfg.logger.Warn("warren: durable log: a queue lost messages to skipped damage", "queue", d.Queue,
		"queue id", d.QueueID, "lost", d.Lost, "maybe settled", d.MaybeSettled)
	if b.listening() {
		b.emit(Event{Kind: EventLogRepaired, Queue: d.Queue, Value: int64(d.Lost), Limit: int64(d.MaybeSettled),
			Err: errorf("queue %q (id %d): %d messages lost, %d maybe settled and back: %w", d.Queue, d.QueueID, d.Lost, d.MaybeSettled, ErrCorrupt)})
	}
}

// Recovery is what [Open] found in a durable broker's log, and what it could not bring back.
// [Broker.Recovery] returns it.
type Recovery struct {
	// Checkpoint says Open started from a checkpoint of the durable queues' state, which a
	// durable broker writes beside its log every 128 segments (64 MiB) and at [Broker.Close],
	// and replayed only the records written after it, reading back the bodies of the messages
	// that go back into memory; otherwise (none was still in the log, or one was damaged, or
	// [WithSalvage]) it read the whole log.
	Checkpoint bool
	// Messages counts the persistent messages Open put back into durable queues (a message in
	// two queues counts twice), before any expired or was dead-lettered at open.
	Messages int
	// Cut are the torn ends Open cut off the log: bytes that nothing written after them says
	// were synced. A crash tears only bytes no sync covered, so under [SyncAlways] a cut a
	// crash left held no confirmed message; damage since to the last batches the log wrote
	// before the crash looks the same, and is cut too (after a clean [Broker.Close] nothing
	// is: every byte Open reads is checked; from a checkpoint, it reads only the segments of
	// the messages that go back into memory, and a damaged segment of the backlog on disk
	// is found when the queue reads it back).
	Cut []LogDamage
	// Skipped are the damaged stretches and missing segment files [WithSalvage] skipped, in
	// the log's order. Open cannot tell which messages had records there: their Records,
	// with the Lost of Queues, bound how many messages are missing.
	Skipped []LogDamage
	// Queues says, for each durable queue that lost messages known to Open or may have settled
	// messages back, what Skipped cost it.
	Queues []QueueDamage
}

// LogDamage is a stretch of a durable broker's log that [Open] dropped.
type LogDamage struct {
	File   string // the segment file
	Offset int64  // where the stretch starts in it
	Bytes  int64  // how long it is, as far as the file says
	// Records counts the log's records the stretch held (a message, an acknowledgement, a
	// declaration: one record each; a message in several queues, one more per queue), -1 when
	// the log cannot tell (a torn end, a missing last segment).
	Records int
	Missing bool   // the whole segment file is missing
	Reason  string // what was wrong
}

// QueueDamage is what skipped damage ([WithSalvage]) cost a durable queue, as far as [Open]
// knows.
type QueueDamage struct {
	// Queue is the queue's name; empty when its declaration was skipped, and the queue with it
	// (then QueueID says which it was in the log).
	Queue   string
	QueueID uint64
	// Lost counts its messages known lost: their place in the queue was read and their body
	// skipped, or, for a queue whose declaration was skipped, every message read for it.
	Lost int
	// MaybeSettled counts the messages put back that were placed before a skipped stretch, so
	// that their settlement (an acknowledgement, say) may have been in it: they come back
	// marked redelivered.
	MaybeSettled int
}

// logDamage converts the log's damage reports.
func logDamage(ds []wal.Damage) []LogDamage {
	var out []LogDamage
	for _, d := range ds {
		out = append(out, LogDamage{File: d.File, Offset: d.Offset, Bytes: d.Bytes, Records: d.Records, Missing: d.Missing, Reason: d.Reason})
	}
	return out
}

// Recovery returns what [Open] found in the broker's log and what it dropped, as it was when
// Open returned: the zero Recovery for a broker from [New]. It is safe for concurrent use.
func (b *Broker) Recovery() Recovery {
	if b.store == nil {
		return Recovery{}
	}
	r := b.store.recovery
	r.Cut, r.Skipped, r.Queues = slices.Clone(r.Cut), slices.Clone(r.Skipped), slices.Clone(r.Queues)
	return r
}

// logOptions sets all of a durable broker's log options (tests).
type logOptions wal.Options

func (o logOptions) applyBroker(c *brokerConfig) { c.wal = wal.Options(o) }

// DefaultPageWindow is how many ready messages a durable queue of a broker from [Open] keeps
// in memory by default ([WithPageWindow]): about 5 MB of 128-byte messages. RabbitMQ's classic
// queues keep 2,048; warren keeps more, so that a queue whose publishers stream with a few
// thousand confirms in flight, a consumer just behind them, does not write its messages out and
// read them back a moment later (with 2,048, the bench's W1 and W2 paged: three allocations a
// message instead of one, and about 40 % slower).
const DefaultPageWindow = 16384

// WithPageWindow sets how many ready messages each durable queue of a broker from [Open] keeps
// in memory; past them, its backlog is on disk. A persistent message that arrives at a queue
// holding n ready messages in memory (or whose priority has messages on disk already), and
// that no other queue holds, is paged out: its body stays in the log, where it was written
// anyway, and the queue keeps a few bytes for a run of such messages, not one entry each. The
// queue reads them back, n at a time, as deliveries (and expiries, selectors, Browse) reach
// them, so every rule holds as in memory. The default is [DefaultPageWindow]; 0 (or less)
// keeps every message in memory. Transient messages, and persistent ones that another queue
// holds too, stay in memory: the broker's budget ([WithMemoryLimit]) bounds them. [New]
// ignores it.
func WithPageWindow(n int) BrokerOption { return pageWindow(max(n, 0)) }

type pageWindow int

func (o pageWindow) applyBroker(c *brokerConfig) { c.pageWindow = int(o) }

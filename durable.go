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
// its delivery count one higher (so a poison message still reaches its [DeliveryLimit]); a
// returned message keeps its count, a delayed one its due time, every message its deadline, so
// that what expired while the process was down expires (and dead-letters) at once; [Expires]
// leases start again.
//
// A publish of a persistent message to a durable queue returns only once its record is written
// to the operating system, so a crash of the process loses no confirmed message; whether a
// power loss can, [WithSync] decides (default [SyncAlways]). An acknowledgement is written
// within a millisecond, not waited for: a crash in that window delivers its message again.
//
// Open fails when another broker has dir open ([ErrResourceLocked]), and when the log is damaged
// anywhere but at its end ([ErrCorrupt]; see [WithSalvage]). A torn end, which a crash leaves,
// is cut, logged, and told to [WithListener]'s listener as an [EventLogRepaired].
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

// WithSalvage lets [Open] go on past damage in the middle of the log, which it otherwise refuses
// with [ErrCorrupt]: it skips each damaged stretch, logs it and events it
// ([EventLogRepaired]). Messages whose records were there are lost, or, for their
// acknowledgements, delivered again. For an operator recovering a damaged disk.
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
	r := newReplay()
	log, rec, err := wal.Open(fs, b.cfg.wal, func(seg uint64, raw []byte) error {
		rc, err := decodeRecord(raw)
		if err != nil {
			return err
		}
		r.apply(seg, rc)
		return nil
	})
	if errors.Is(err, wal.ErrCorrupt) {
		err = errorf("%w: %w", ErrCorrupt, err)
	}
	if err != nil {
		b.Close()
		return nil, errorf("open durable broker: %w", err)
	}
	r.finish()
	topo := newReplay()
	topo.queueDecls, topo.exchangeDecls, topo.bindings = r.queueDecls, r.exchangeDecls, r.bindings
	b.store = &store{log: log, logger: b.cfg.logger, live: r.live, oldest: 1, lastSeg: rec.Last, topo: topo, topoSeg: 1}
	b.store.nextMsg.Store(r.maxMsg)
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
		if err != nil {
			b.Close()
			return nil, errorf("open durable broker: binding %q to %q: %w", d.name, d.dest, err)
		}
	}
	b.store.replaying = false
	for _, q := range restored {
		q.resume() // dead letters find their targets now
	}
	b.store.startCompactor(b)
	return b, nil
}

// repaired logs and events a damaged stretch of the log that Open dropped.
func (b *Broker) repaired(d wal.Damage, what string) {
	b.cfg.logger.Warn("warren: durable log: "+what, "file", d.File, "offset", d.Offset,
		"bytes", d.Bytes, "good batches dropped", d.GoodAfter)
	if b.listening() {
		b.emit(Event{Kind: EventLogRepaired, Value: d.Bytes,
			Err: errorf("%s at %s offset %d, %d bytes: %w", what, d.File, d.Offset, d.Bytes, ErrCorrupt)})
	}
}

// logOptions sets all of a durable broker's log options (tests).
type logOptions wal.Options

func (o logOptions) applyBroker(c *brokerConfig) { c.wal = wal.Options(o) }

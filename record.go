package warren

import (
	"encoding/binary"
)

// Records: what a durable broker writes to its log (internal/wal), one per transition of a
// persistent message in a durable queue or a change of the durable topology. docs/DURABILITY.md
// has the design. A record is a type byte and its fields, integers as uvarints (signed ones
// zigzagged); the message itself, with the exchange and routing key it was published with, is
// encoded by codec.go (appendEnvelope), once per publish.
//
//	publish   msgID, queueID, seq, deadline, returns, envelope  a message entered a queue (the first of a publish's queues)
//	enqueue   msgID, queueID, seq, deadline, returns            the same message entered another queue
//	deliver   queueID, seq                                      it went out to a consumer or a Get
//	return    queueID, seq, returns                             its delivery came back; returns is its new count
//	delay     queueID, seq, due                                 it is hidden until due
//	settle    queueID, seq                                      it left the queue: acked, expired, dead-lettered, dropped
//
// and, for the durable topology (a binding is durable when both its ends are):
//
//	queue     queueID, name, flags, arguments                   a durable queue was declared
//	unqueue   queueID                                           it was deleted, with its messages
//	exchange  name, kind, flags, alternate, arguments           a durable exchange was declared
//	unexchange name                                             it was deleted, with its bindings
//	bind      source, destination, flags, key, arguments        a binding was made (flags: to a queue or an exchange)
//	unbind    source, destination, flags, key, arguments        it was removed
//
// Deadlines and due times are wall-clock Unix nanoseconds (0 for none), so that what expired while
// the process was down expires when it starts. Queue ids are the broker's, given when a durable
// queue is declared; a message id names a publish's body across its queues.

// recordType is a record's first byte.
type recordType uint8

const (
	recPublish recordType = iota + 1
	recEnqueue
	recDeliver
	recReturn
	recDelay
	recSettle
	recQueue
	recUnqueue
	recExchange
	recUnexchange
	recBind
	recUnbind
)

// Declaration flags.
const (
	flagDurable    = 1 << iota
	flagAutoDelete // queue or exchange
	flagInternal   // exchange
	flagToQueue    // binding: the destination is a queue
)

// decl is a declaration in a topology record: a queue's, an exchange's or a binding's.
type decl struct {
	name  string // queue or exchange; binding: the source exchange
	dest  string // binding: the destination
	kind  string // exchange: its kind; binding: its routing key
	alt   string // exchange: its alternate exchange
	flags uint64
	args  Table
	id    uint64 // queue: its id
}

// appendDecl appends a topology record of type t.
func appendDecl(dst []byte, t recordType, d decl) []byte {
	dst = append(dst, byte(t))
	switch t {
	case recQueue:
		dst = binary.AppendUvarint(dst, d.id)
		dst = appendString(dst, d.name)
		dst = binary.AppendUvarint(dst, d.flags)
		dst = appendTable(dst, d.args)
	case recUnqueue:
		dst = binary.AppendUvarint(dst, d.id)
	case recExchange:
		dst = appendString(dst, d.name)
		dst = appendString(dst, d.kind)
		dst = binary.AppendUvarint(dst, d.flags)
		dst = appendString(dst, d.alt)
		dst = appendTable(dst, d.args)
	case recUnexchange:
		dst = appendString(dst, d.name)
	case recBind, recUnbind:
		dst = appendString(dst, d.name)
		dst = appendString(dst, d.dest)
		dst = binary.AppendUvarint(dst, d.flags)
		dst = appendString(dst, d.kind)
		dst = appendTable(dst, d.args)
	}
	return dst
}

// placement is where a message is in a queue, as a publish or enqueue record says.
type placement struct {
	msgID    uint64
	queueID  uint64
	seq      uint64
	deadline int64 // wall-clock Unix nanoseconds; 0 for none
	returns  uint32
}

// appendPlacement appends a publish record (when msg is not nil: the envelope's encoding) or an
// enqueue record.
func appendPlacement(dst []byte, p placement, msg []byte) []byte {
	t := recEnqueue
	if msg != nil {
		t = recPublish
	}
	return append(appendPlacementHead(dst, t, p), msg...)
}

// appendPublish appends a publish record of a message as its envelope has it, encoded in place,
// and returns it with the bytes of the envelope's encoding.
func appendPublish(dst []byte, p placement, env *envelope) ([]byte, int64) {
	dst = appendPlacementHead(dst, recPublish, p)
	start := len(dst)
	m := env.message()
	dst = appendEnvelope(dst, env.exchange.name, env.routingKey, &m)
	return dst, int64(len(dst) - start)
}

// appendPlacementHead appends a publish or enqueue record up to the envelope.
func appendPlacementHead(dst []byte, t recordType, p placement) []byte {
	dst = append(dst, byte(t))
	dst = binary.AppendUvarint(dst, p.msgID)
	dst = binary.AppendUvarint(dst, p.queueID)
	dst = binary.AppendUvarint(dst, p.seq)
	dst = binary.AppendVarint(dst, p.deadline)
	return binary.AppendUvarint(dst, uint64(p.returns))
}

// appendSeqRecord appends a deliver, settle, return (with n, the new count) or delay (with n,
// the due time) record.
func appendSeqRecord(dst []byte, t recordType, queueID, seq uint64, n int64) []byte {
	dst = append(dst, byte(t))
	dst = binary.AppendUvarint(dst, queueID)
	dst = binary.AppendUvarint(dst, seq)
	switch t {
	case recReturn:
		dst = binary.AppendUvarint(dst, uint64(n))
	case recDelay:
		dst = binary.AppendVarint(dst, n)
	}
	return dst
}

// record is a decoded record.
type record struct {
	typ recordType
	placement
	n    int64  // return: the new count; delay: the due time
	msg  []byte // publish: the message's encoding, shared with the log's buffer
	decl        // topology records
}

// decodeRecord decodes one record. The message bytes of a publish record are not copied: they
// are valid as long as b is. Every integer is in its shortest form (codec.go's decoder), so a
// record that decodes encodes back to the same bytes.
func decodeRecord(b []byte) (record, error) {
	var r record
	if len(b) == 0 {
		return r, errorf("%w: empty record", errBadRecord)
	}
	r.typ = recordType(b[0])
	d := decoder{b: b, off: 1}
	switch r.typ {
	case recPublish, recEnqueue:
		r.msgID = d.uvarint()
		r.queueID = d.uvarint()
		r.seq = d.uvarint()
		r.deadline = d.varint()
		r.returns = uint32(d.unsigned(1<<32 - 1))
		if r.typ == recPublish && d.err == nil {
			r.msg, d.off = d.b[d.off:], len(d.b)
			if len(r.msg) == 0 {
				d.fail("publish without a message")
			}
		}
	case recDeliver, recSettle, recReturn, recDelay:
		r.queueID = d.uvarint()
		r.seq = d.uvarint()
		switch r.typ {
		case recReturn:
			r.n = int64(d.unsigned(1<<32 - 1))
		case recDelay:
			r.n = d.varint()
		}
	case recQueue:
		r.id = d.uvarint()
		r.decl.name = d.string()
		r.flags = d.unsigned(flagDurable | flagAutoDelete)
		r.args = d.table(0)
	case recUnqueue:
		r.id = d.uvarint()
	case recExchange:
		r.decl.name = d.string()
		r.kind = d.string()
		r.flags = d.unsigned(flagDurable | flagAutoDelete | flagInternal)
		r.alt = d.string()
		r.args = d.table(0)
	case recUnexchange:
		r.decl.name = d.string()
	case recBind, recUnbind:
		r.decl.name = d.string()
		r.dest = d.string()
		r.flags = d.unsigned(flagToQueue)
		r.kind = d.string()
		r.args = d.table(0)
	default:
		d.fail("record type %d", r.typ)
	}
	if d.err == nil && d.off < len(d.b) {
		d.fail("trailing bytes")
	}
	return r, d.err
}

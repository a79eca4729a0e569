package warren

// The binary encoding of messages and tables for the durable log (docs/DURABILITY.md): compact,
// versioned, exact, canonical.
//
// Exact: every field of a Message decodes to what was encoded, and every Table value to the same
// Go type and value: an int8 header comes back int8, an int int, a map[string]any a
// map[string]any and a Table a Table; a float keeps its bits (NaN payloads, -0); nil and empty
// byte slices, tables and arrays stay apart, and so does a nil Body from an empty one. A
// time.Time keeps its instant to the nanosecond and comes back in UTC without a monotonic
// reading; the zero Timestamp stays zero.
//
// Canonical: one message has one encoding (table keys are written sorted), and the decoder
// accepts nothing else: re-encoding what decoded gives back the bytes it was decoded from.
//
// Layout. uvarint is encoding/binary's unsigned varint, varint its zigzag signed one; every
// varint is in its shortest form. len is a uvarint byte count; nlen is a uvarint that is 0 for
// nil and n+1 for n (bytes or entries).
//
//	message = version:1 (=1) flags:uvarint [priority:1] text… [timestamp] headers:table body:blob
//	flags   = bit 0 Persistent, 1 Priority ≠ 0, 2 Timestamp not zero, 3…11 the text properties
//	          ContentType, ContentEncoding, MessageID, CorrelationID, ReplyTo, Expiration,
//	          Type, UserID, AppID, each set when the property is not empty
//	text    = len bytes: one per set text bit, in bit order (never empty)
//	timestamp = seconds:varint nanoseconds:uvarint (Unix time; nanoseconds below 1e9)
//	table   = nlen, then per entry key:(len bytes) value, keys in strictly increasing byte order
//	blob    = nlen bytes
//	array   = nlen, then per element value
//	value   = tag:1 payload
//
//	tag  Go type         payload
//	 0   nil             none
//	 1   bool false      none
//	 2   bool true       none
//	 3   int8            1 byte
//	 4   int16           varint
//	 5   int32           varint
//	 6   int64           varint
//	 7   int             varint (a value beyond int32 does not decode on a 32-bit platform)
//	 8   uint8           1 byte
//	 9   uint16          uvarint
//	10   uint32          uvarint
//	11   float32         4 bytes, the IEEE 754 bits, little-endian
//	12   float64         8 bytes, the same
//	13   string          len bytes
//	14   []byte          blob
//	15   time.Time       seconds:varint nanoseconds:uvarint, as timestamp
//	16   Decimal         scale:1 value:varint
//	17   Table           table
//	18   map[string]any  table
//	19   []any           array
//
// Headers' values are at depth 0, and the values of a table or array at depth d are at d+1;
// the decoder refuses a value deeper than maxFieldDepth, as checkTable does.
//
// A new format gets a new version byte; the decoder refuses a version it does not know.
// appendTable's encoding is a bare table, versioned by the record that holds it; so is
// appendEnvelope's (the exchange and routing key of a published message, before the message).

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// errBadRecord is wrapped by every error of decodeMessage and decodeTable: the bytes are not an
// encoding this version of warren writes (truncated, an unknown version or tag, nested too
// deeply, not canonical).
var errBadRecord = newError("bad log record")

// codecVersion is the first byte of an encoded message.
const codecVersion = 1

// The bits of an encoded message's flags.
const (
	flagPersistent = 1 << iota
	flagPriority
	flagTimestamp
	flagText // the first of the text properties' bits, in the order of Message.text
)

// textProps is the number of Message's text properties.
const textProps = 9

// flagsKnown has every bit a version-1 message's flags may have.
const flagsKnown = flagText<<textProps - 1

// The type tags of encoded values.
const (
	tagNil = iota
	tagFalse
	tagTrue
	tagInt8
	tagInt16
	tagInt32
	tagInt64
	tagInt
	tagUint8
	tagUint16
	tagUint32
	tagFloat32
	tagFloat64
	tagString
	tagBytes
	tagTime
	tagDecimal
	tagTable
	tagMap
	tagArray
)

// text returns m's text properties in the order of their flag bits, most often set first.
func (m *Message) text() [textProps]*string {
	return [textProps]*string{&m.ContentType, &m.ContentEncoding, &m.MessageID, &m.CorrelationID,
		&m.ReplyTo, &m.Expiration, &m.Type, &m.UserID, &m.AppID}
}

// appendMessage appends the encoding of m to dst and returns the extended slice. It allocates
// nothing but dst's growth when m's tables have at most 8 keys each. m.Headers must pass
// checkTable: a value of another type, or nested deeper than maxFieldDepth, panics.
func appendMessage(dst []byte, m *Message) []byte {
	var flags uint64
	if m.Persistent {
		flags |= flagPersistent
	}
	if m.Priority != 0 {
		flags |= flagPriority
	}
	if !m.Timestamp.IsZero() {
		flags |= flagTimestamp
	}
	text := m.text()
	for i, s := range text {
		if *s != "" {
			flags |= flagText << i
		}
	}
	dst = binary.AppendUvarint(append(dst, codecVersion), flags)
	if m.Priority != 0 {
		dst = append(dst, m.Priority)
	}
	for _, s := range text {
		if *s != "" {
			dst = appendString(dst, *s)
		}
	}
	if flags&flagTimestamp != 0 {
		dst = appendTime(dst, m.Timestamp)
	}
	dst = appendFields(dst, m.Headers, 0)
	return appendBlob(dst, m.Body)
}

// appendTable appends the encoding of t (a table, as in a message's headers) to dst and returns
// the extended slice; decodeTable reads it back. t must pass checkTable, as for appendMessage.
func appendTable(dst []byte, t Table) []byte { return appendFields(dst, t, 0) }

// appendString appends s's length and bytes.
func appendString(dst []byte, s string) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(s))), s...)
}

// appendBlob appends b as a blob: nil stays apart from empty.
func appendBlob(dst []byte, b []byte) []byte {
	if b == nil {
		return append(dst, 0)
	}
	return append(binary.AppendUvarint(dst, uint64(len(b))+1), b...)
}

// appendTime appends t's Unix seconds and nanoseconds.
func appendTime(dst []byte, t time.Time) []byte {
	return binary.AppendUvarint(binary.AppendVarint(dst, t.Unix()), uint64(t.Nanosecond()))
}

// tableField is a table's entry, for sorting.
type tableField struct {
	key   string
	value any
}

// appendFields appends t as a table whose values are at depth, keys sorted.
func appendFields(dst []byte, t map[string]any, depth int) []byte {
	if t == nil {
		return append(dst, 0)
	}
	dst = binary.AppendUvarint(dst, uint64(len(t))+1)
	var small [8]tableField // a small table sorts without allocating
	fields := small[:0]
	for k, v := range t {
		fields = append(fields, tableField{k, v})
	}
	slices.SortFunc(fields, func(a, b tableField) int { return strings.Compare(a.key, b.key) })
	for _, f := range fields {
		dst = appendValue(appendString(dst, f.key), f.value, depth)
	}
	return dst
}

// appendValue appends v, at depth, with its tag.
func appendValue(dst []byte, v any, depth int) []byte {
	if depth > maxFieldDepth {
		panic(fmt.Sprintf("warren: encoding a table nested deeper than %d (checkTable refuses it)", maxFieldDepth))
	}
	switch v := v.(type) {
	case nil:
		return append(dst, tagNil)
	case bool:
		if v {
			return append(dst, tagTrue)
		}
		return append(dst, tagFalse)
	case int8:
		return append(dst, tagInt8, byte(v))
	case int16:
		return binary.AppendVarint(append(dst, tagInt16), int64(v))
	case int32:
		return binary.AppendVarint(append(dst, tagInt32), int64(v))
	case int64:
		return binary.AppendVarint(append(dst, tagInt64), v)
	case int:
		return binary.AppendVarint(append(dst, tagInt), int64(v))
	case uint8:
		return append(dst, tagUint8, v)
	case uint16:
		return binary.AppendUvarint(append(dst, tagUint16), uint64(v))
	case uint32:
		return binary.AppendUvarint(append(dst, tagUint32), uint64(v))
	case float32:
		return binary.LittleEndian.AppendUint32(append(dst, tagFloat32), math.Float32bits(v))
	case float64:
		return binary.LittleEndian.AppendUint64(append(dst, tagFloat64), math.Float64bits(v))
	case string:
		return appendString(append(dst, tagString), v)
	case []byte:
		return appendBlob(append(dst, tagBytes), v)
	case time.Time:
		return appendTime(append(dst, tagTime), v)
	case Decimal:
		return binary.AppendVarint(append(dst, tagDecimal, v.Scale), int64(v.Value))
	case Table:
		return appendFields(append(dst, tagTable), v, depth+1)
	case map[string]any:
		return appendFields(append(dst, tagMap), v, depth+1)
	case []any:
		if v == nil {
			return append(dst, tagArray, 0)
		}
		dst = binary.AppendUvarint(append(dst, tagArray), uint64(len(v))+1)
		for _, e := range v {
			dst = appendValue(dst, e, depth+1)
		}
		return dst
	}
	panic(fmt.Sprintf("warren: encoding a field of type %T (checkTable refuses it)", v))
}

// appendEnvelope appends what a publish record keeps of a published message: the exchange it
// was published to, its routing key, and the message.
//
//	envelope = exchange:(len bytes) key:(len bytes) message
func appendEnvelope(dst []byte, exchange, key string, m *Message) []byte {
	dst = appendString(dst, exchange)
	dst = appendString(dst, key)
	return appendMessage(dst, m)
}

// decodeEnvelope decodes what appendEnvelope encoded, the whole of b.
func decodeEnvelope(b []byte) (exchange, key string, m Message, err error) {
	d := decoder{b: b}
	exchange = d.string()
	key = d.string()
	m = d.message()
	if d.err == nil && d.off != len(b) {
		d.fail("%d bytes after the message", len(b)-d.off)
	}
	if d.err != nil {
		return "", "", Message{}, d.err
	}
	return exchange, key, m, nil
}

// decodeMessage decodes the message at the front of b and returns it with the number of bytes
// it took. The message shares no memory with b. Any error wraps errBadRecord, and nothing is
// returned with it. On any input it returns: it does not panic, recurses at most maxFieldDepth
// deep, and allocates at most a small multiple of len(b).
func decodeMessage(b []byte) (Message, int, error) {
	d := decoder{b: b}
	m := d.message()
	if d.err != nil {
		return Message{}, 0, d.err
	}
	return m, d.off, nil
}

// decodeTable decodes the table appendTable encoded at the front of b, as decodeMessage does a
// message.
func decodeTable(b []byte) (Table, int, error) {
	d := decoder{b: b}
	t := d.table(0)
	if d.err != nil {
		return nil, 0, d.err
	}
	return t, d.off, nil
}

// decoder reads an encoding. Its first error sticks: every read after it returns a zero value,
// and the callers check err before using what they read or looping on.
type decoder struct {
	b   []byte
	off int // where the next read starts
	err error
	// promised is how many of the unread bytes the tables and arrays being decoded need at the
	// least for the entries they have yet to read: a count is checked against what remains
	// beyond it, so that nested containers cannot all claim the same bytes, and what they
	// allocate stays proportional to len(b).
	promised int
}

// fail records the first error, with the offset where the failed read began or, for a value
// read whole and found wrong, where it ends.
func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = errorf("%w: %s at byte %d", errBadRecord, fmt.Sprintf(format, args...), d.off)
	}
}

// next returns the next n bytes, which the caller must not keep.
func (d *decoder) next(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)-d.off) {
		d.fail("truncated (%d bytes wanted, %d left)", n, len(d.b)-d.off)
		return nil
	}
	b := d.b[d.off : d.off+int(n)]
	d.off += int(n)
	return b
}

func (d *decoder) byte() byte {
	if b := d.next(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	x, n := binary.Uvarint(d.b[d.off:])
	switch {
	case n == 0:
		d.fail("truncated varint")
	case n < 0:
		d.fail("varint overflows 64 bits")
	case n > 1 && d.b[d.off+n-1] == 0:
		d.fail("varint not in its shortest form")
	default:
		d.off += n
		return x
	}
	return 0
}

func (d *decoder) varint() int64 {
	u := d.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

// signed reads a varint that must be in [lo, hi].
func (d *decoder) signed(lo, hi int64) int64 {
	x := d.varint()
	if x < lo || x > hi {
		d.fail("integer %d out of range", x)
		return 0
	}
	return x
}

// unsigned reads a uvarint that must be at most hi.
func (d *decoder) unsigned(hi uint64) uint64 {
	x := d.uvarint()
	if x > hi {
		d.fail("integer %d out of range", x)
		return 0
	}
	return x
}

// string reads a len-prefixed string.
func (d *decoder) string() string { return string(d.next(d.uvarint())) }

// blob reads a blob, copied.
func (d *decoder) blob() []byte {
	n := d.uvarint()
	if n == 0 {
		return nil
	}
	b := d.next(n - 1)
	if b == nil {
		return nil
	}
	return bytes.Clone(b) // not nil when empty
}

// time reads a time, in UTC.
func (d *decoder) time() time.Time {
	sec := d.varint()
	nsec := d.uvarint()
	if nsec >= 1e9 {
		d.fail("nanoseconds %d out of range", nsec)
		return time.Time{}
	}
	return time.Unix(sec, int64(nsec)).UTC()
}

// count reads a table's or array's nlen, whose entries take at least least bytes each, and
// promises their bytes; -1 is nil.
func (d *decoder) count(least int) int {
	u := d.uvarint()
	if u == 0 || d.err != nil {
		return -1
	}
	avail := len(d.b) - d.off - d.promised
	if avail < 0 || u-1 > uint64(avail/least) {
		d.fail("truncated (%d entries cannot fit in the %d bytes left)", u-1, max(avail, 0))
		return -1
	}
	d.promised += int(u-1) * least
	return int(u - 1)
}

func (d *decoder) message() Message {
	var m Message
	if v := d.byte(); v != codecVersion && d.err == nil {
		d.off--
		d.fail("unknown version %d", v)
	}
	flags := d.uvarint()
	if flags&^flagsKnown != 0 {
		d.fail("unknown flags %#x", flags)
	}
	m.Persistent = flags&flagPersistent != 0
	if flags&flagPriority != 0 {
		if m.Priority = d.byte(); m.Priority == 0 {
			d.fail("priority 0 written")
		}
	}
	for i, s := range m.text() {
		if flags&(flagText<<i) != 0 {
			if *s = d.string(); *s == "" {
				d.fail("empty text property written")
			}
		}
	}
	if flags&flagTimestamp != 0 {
		if m.Timestamp = d.time(); m.Timestamp.IsZero() {
			d.fail("zero timestamp written")
		}
	}
	m.Headers = d.table(0)
	m.Body = d.blob()
	return m
}

// table reads a table whose values are at depth.
func (d *decoder) table(depth int) Table {
	const entryMin = 2 // a key's length and a value's tag
	n := d.count(entryMin)
	if n < 0 {
		return nil
	}
	t := make(Table, n)
	var prev []byte
	for i := range n {
		d.promised -= entryMin
		k := d.next(d.uvarint())
		if i > 0 && bytes.Compare(k, prev) <= 0 {
			d.fail("key %q not after key %q", k, prev)
		}
		prev = k
		v := d.value(depth)
		if d.err != nil {
			return nil
		}
		t[string(k)] = v
	}
	return t
}

// value reads a tagged value at depth.
func (d *decoder) value(depth int) any {
	if depth > maxFieldDepth {
		d.fail("tables nested deeper than %d", maxFieldDepth)
		return nil
	}
	tag := d.byte()
	if d.err != nil {
		return nil
	}
	switch tag {
	case tagNil:
		return nil
	case tagFalse:
		return false
	case tagTrue:
		return true
	case tagInt8:
		return int8(d.byte())
	case tagInt16:
		return int16(d.signed(math.MinInt16, math.MaxInt16))
	case tagInt32:
		return int32(d.signed(math.MinInt32, math.MaxInt32))
	case tagInt64:
		return d.varint()
	case tagInt:
		return int(d.signed(math.MinInt, math.MaxInt))
	case tagUint8:
		return d.byte()
	case tagUint16:
		return uint16(d.unsigned(math.MaxUint16))
	case tagUint32:
		return uint32(d.unsigned(math.MaxUint32))
	case tagFloat32:
		if b := d.next(4); b != nil {
			return math.Float32frombits(binary.LittleEndian.Uint32(b))
		}
	case tagFloat64:
		if b := d.next(8); b != nil {
			return math.Float64frombits(binary.LittleEndian.Uint64(b))
		}
	case tagString:
		return d.string()
	case tagBytes:
		return d.blob()
	case tagTime:
		return d.time()
	case tagDecimal:
		scale := d.byte()
		return Decimal{Scale: scale, Value: int32(d.signed(math.MinInt32, math.MaxInt32))}
	case tagTable:
		return d.table(depth + 1)
	case tagMap:
		return map[string]any(d.table(depth + 1))
	case tagArray:
		n := d.count(1)
		if n < 0 {
			return []any(nil)
		}
		a := make([]any, n)
		for i := range a {
			d.promised--
			if a[i] = d.value(depth + 1); d.err != nil {
				return nil
			}
		}
		return a
	default:
		d.off--
		d.fail("unknown tag %d", tag)
	}
	return nil
}

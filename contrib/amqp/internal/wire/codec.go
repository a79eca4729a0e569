package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/warrenmq/warren"
)

// Method is an AMQP method with its arguments.
type Method interface {
	ID() (class, method uint16)
	Name() string
	HasContent() bool
	Synchronous() bool
	Write(w *Writer)
	Read(r *Reader)
}

// ErrMalformed is the error of a frame or of arguments that do not parse.
var ErrMalformed = errors.New("amqp: malformed")

// maxTableDepth bounds the nesting of field tables and arrays a peer can send.
const maxTableDepth = 32

// Reader reads AMQP's field types from a method's or a content header's payload. The first
// failure sticks: later reads return zero values, and Err reports it.
type Reader struct {
	b     []byte
	err   error
	depth int
	strs  *stringCache // a MethodReader's; nil: every string is allocated
}

// NewReader reads b.
func NewReader(b []byte) *Reader { return &Reader{b: b} }

// Reset makes r read b, with no error.
func (r *Reader) Reset(b []byte) { *r = Reader{b: b, strs: r.strs} }

// Err returns the first failure, or nil.
func (r *Reader) Err() error { return r.err }

// Rest returns how many bytes are left.
func (r *Reader) Rest() int { return len(r.b) }

func (r *Reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
	r.b = nil
}

func (r *Reader) take(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.b) < n {
		r.fail("%s: %d bytes wanted, %d left", what, n, len(r.b))
		return nil
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

func (r *Reader) Octet() uint8 {
	if b := r.take(1, "octet"); b != nil {
		return b[0]
	}
	return 0
}

func (r *Reader) Short() uint16 {
	if b := r.take(2, "short"); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *Reader) Long() uint32 {
	if b := r.take(4, "long"); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *Reader) LongLong() uint64 {
	if b := r.take(8, "longlong"); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (r *Reader) ShortStr() string {
	b := r.take(int(r.Octet()), "shortstr")
	if r.strs == nil || len(b) == 0 {
		return string(b)
	}
	return r.strs.get(b)
}

// ShortStrBytes is ShortStr without the copy: the bytes are the payload's.
func (r *Reader) ShortStrBytes() []byte { return r.take(int(r.Octet()), "shortstr") }

func (r *Reader) LongStr() string { return string(r.longStr()) }

func (r *Reader) longStr() []byte {
	n := r.Long()
	if n > math.MaxInt32 {
		r.fail("longstr of %d bytes", n)
		return nil
	}
	return r.take(int(n), "longstr")
}

func (r *Reader) Timestamp() time.Time {
	s := r.LongLong()
	if r.err != nil || s == 0 {
		return time.Time{}
	}
	return time.Unix(int64(s), 0)
}

// Table reads a field table, with RabbitMQ's field types (amqp091-go reads the same).
func (r *Reader) Table() warren.Table {
	b := r.longStr()
	if r.err != nil || len(b) == 0 {
		return nil
	}
	if r.depth >= maxTableDepth {
		r.fail("tables nested deeper than %d", maxTableDepth)
		return nil
	}
	sub := &Reader{b: b, depth: r.depth + 1}
	t := warren.Table{}
	for sub.err == nil && len(sub.b) > 0 {
		k := sub.ShortStr()
		v := sub.value()
		if sub.err == nil {
			t[k] = v
		}
	}
	if sub.err != nil {
		r.fail("table: %v", sub.err)
		return nil
	}
	return t
}

func (r *Reader) array() []any {
	b := r.longStr()
	if r.err != nil {
		return nil
	}
	if r.depth >= maxTableDepth {
		r.fail("arrays nested deeper than %d", maxTableDepth)
		return nil
	}
	sub := &Reader{b: b, depth: r.depth + 1}
	out := []any{}
	for sub.err == nil && len(sub.b) > 0 {
		v := sub.value()
		if sub.err == nil {
			out = append(out, v)
		}
	}
	if sub.err != nil {
		r.fail("array: %v", sub.err)
		return nil
	}
	return out
}

func (r *Reader) value() any {
	switch kind := r.Octet(); kind {
	case 't':
		return r.Octet() != 0
	case 'b':
		return int8(r.Octet())
	case 'B':
		return r.Octet()
	case 's':
		return int16(r.Short())
	case 'u':
		return r.Short()
	case 'I':
		return int32(r.Long())
	case 'i':
		return r.Long()
	case 'l':
		return int64(r.LongLong())
	case 'f':
		return math.Float32frombits(r.Long())
	case 'd':
		return math.Float64frombits(r.LongLong())
	case 'D':
		scale := r.Octet()
		return warren.Decimal{Scale: scale, Value: int32(r.Long())}
	case 'S':
		return r.LongStr()
	case 'x':
		return append([]byte(nil), r.longStr()...)
	case 'A':
		return r.array()
	case 'T':
		return r.Timestamp()
	case 'F':
		if t := r.Table(); t != nil || r.err != nil {
			return t
		}
		return warren.Table{}
	case 'V':
		return nil
	default:
		if r.err == nil {
			r.fail("field type %q", kind)
		}
		return nil
	}
}

// Writer appends AMQP's field types to a buffer.
type Writer struct {
	B []byte
}

func (w *Writer) Octet(v uint8)     { w.B = append(w.B, v) }
func (w *Writer) Short(v uint16)    { w.B = binary.BigEndian.AppendUint16(w.B, v) }
func (w *Writer) Long(v uint32)     { w.B = binary.BigEndian.AppendUint32(w.B, v) }
func (w *Writer) LongLong(v uint64) { w.B = binary.BigEndian.AppendUint64(w.B, v) }

// ShortStr writes s, cut to 255 bytes (the caller checks lengths that matter).
func (w *Writer) ShortStr(s string) {
	if len(s) > math.MaxUint8 {
		s = s[:math.MaxUint8]
	}
	w.Octet(uint8(len(s)))
	w.B = append(w.B, s...)
}

func (w *Writer) LongStr(s string) {
	w.Long(uint32(len(s)))
	w.B = append(w.B, s...)
}

func (w *Writer) Timestamp(t time.Time) {
	if t.IsZero() {
		w.LongLong(0)
		return
	}
	w.LongLong(uint64(t.Unix()))
}

// Table writes a field table; a value of a type AMQP has no field type for is written as void.
func (w *Writer) Table(t warren.Table) {
	at := len(w.B)
	w.Long(0)
	for k, v := range t {
		w.ShortStr(k)
		w.value(v)
	}
	binary.BigEndian.PutUint32(w.B[at:], uint32(len(w.B)-at-4))
}

func (w *Writer) value(v any) {
	switch v := v.(type) {
	case bool:
		w.Octet('t')
		if v {
			w.Octet(1)
		} else {
			w.Octet(0)
		}
	case int8:
		w.Octet('b')
		w.Octet(uint8(v))
	case uint8:
		w.Octet('B')
		w.Octet(v)
	case int16:
		w.Octet('s')
		w.Short(uint16(v))
	case uint16:
		w.Octet('u')
		w.Short(v)
	case int32:
		w.Octet('I')
		w.Long(uint32(v))
	case uint32:
		w.Octet('i')
		w.Long(v)
	case int:
		w.Octet('l')
		w.LongLong(uint64(v))
	case int64:
		w.Octet('l')
		w.LongLong(uint64(v))
	case float32:
		w.Octet('f')
		w.Long(math.Float32bits(v))
	case float64:
		w.Octet('d')
		w.LongLong(math.Float64bits(v))
	case warren.Decimal:
		w.Octet('D')
		w.Octet(v.Scale)
		w.Long(uint32(v.Value))
	case string:
		w.Octet('S')
		w.LongStr(v)
	case []byte:
		w.Octet('x')
		w.Long(uint32(len(v)))
		w.B = append(w.B, v...)
	case []any:
		w.Octet('A')
		at := len(w.B)
		w.Long(0)
		for _, e := range v {
			w.value(e)
		}
		binary.BigEndian.PutUint32(w.B[at:], uint32(len(w.B)-at-4))
	case time.Time:
		w.Octet('T')
		w.Timestamp(v)
	case warren.Table:
		w.Octet('F')
		w.Table(v)
	case map[string]any:
		w.Octet('F')
		w.Table(v)
	default:
		w.Octet('V')
	}
}

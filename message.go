package warren

import (
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"
)

// Table is a set of AMQP field values: message headers, and the arguments of declarations and
// bindings. Values use the Go types AMQP clients use (those of amqp091-go): bool, int8, int16,
// int32, int64, int, uint8, uint16, uint32, float32, float64, string, []byte, time.Time,
// [Decimal], nested Table, []any and nil, so headers pass between warren and a RabbitMQ client
// unchanged. A Table reachable from a published [Message] must not be modified afterwards.
type Table map[string]any

// Int returns t's value for key as an integer, and true, when it is one of AMQP's integer field
// types; else 0 and false (no such key, or another type).
func (t Table) Int(key string) (int64, bool) { return intArg(t[key]) }

// Decimal is AMQP's decimal field value: Value × 10^-Scale.
type Decimal struct {
	Scale uint8
	Value int32
}

// String returns d in decimal notation, exactly: Value with Scale digits after the point
// ({Scale: 2, Value: -5} is "-0.05").
func (d Decimal) String() string {
	s := strconv.FormatInt(int64(d.Value), 10)
	sign := ""
	if s[0] == '-' {
		sign, s = "-", s[1:]
	}
	if sc := int(d.Scale); sc > 0 {
		if len(s) <= sc {
			s = strings.Repeat("0", sc-len(s)+1) + s
		}
		s = s[:len(s)-sc] + "." + s[len(s)-sc:]
	}
	return sign + s
}

// Message is what a publisher sends: a body and AMQP's basic properties. Every property survives
// delivery and dead-lettering unchanged, except Expiration, which dead-lettering removes.
//
// A message is immutable once published: warren copies the Message value but not the Body slice
// nor the Headers table, which are shared by every queue the message reaches and every delivery
// of it. The publisher must not modify them after [Broker.Publish]; a consumer must not modify
// [Delivery.Message].
type Message struct {
	Body    []byte
	Headers Table

	ContentType     string    // MIME content type
	ContentEncoding string    // MIME content encoding
	Persistent      bool      // delivery mode 2: a durable broker (Open) keeps it in its durable queues
	Priority        uint8     // 0 to 255; used by queues with a maximum priority
	CorrelationID   string    // application use: correlation identifier
	ReplyTo         string    // application use: address to reply to
	Expiration      string    // per-message TTL in milliseconds, as a decimal string
	MessageID       string    // application use: message identifier
	Timestamp       time.Time // application use: message timestamp
	Type            string    // application use: message type name
	UserID          string    // application use: creating user id
	AppID           string    // application use: creating application id
}

// checkTable reports, wrapping [ErrPreconditionFailed] as RabbitMQ's 406 would, a value in t
// (or nested in it) that is not one of the AMQP field types listed for [Table].
func checkTable(t Table) error {
	for _, v := range t {
		if o, ok := v.(invalidOption); ok {
			return o.err // a typed option's own error
		}
	}
	return checkNested(t, 0)
}

// maxFieldDepth bounds how deeply tables and arrays nest, which also stops a table that
// contains itself.
const maxFieldDepth = 32

func checkNested(t Table, depth int) error {
	for k, v := range t {
		if err := checkField(v, depth); err != nil {
			return errorf("argument %q: %w", k, err)
		}
	}
	return nil
}

func checkField(v any, depth int) error {
	if depth > maxFieldDepth {
		return errorf("tables nested deeper than %d: %w", maxFieldDepth, ErrPreconditionFailed)
	}
	switch v := v.(type) {
	case nil, bool, int8, int16, int32, int64, int, uint8, uint16, uint32, float32, float64,
		string, []byte, time.Time, Decimal:
		return nil
	case Table:
		return checkNested(v, depth+1)
	case map[string]any:
		return checkNested(v, depth+1)
	case []any:
		for _, e := range v {
			if err := checkField(e, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return errorf("value of type %T is not an AMQP field type: %w", v, ErrPreconditionFailed)
}

// envelope is one published message, shared by reference by every queue it was routed to and by
// every delivery of it. It is immutable once routed (but for a durable broker's log state, in
// more: store.go).
//
// A queue holds one envelope per message, so it is kept to 48 bytes (on 64-bit platforms; a
// Message is 208): the body as its first byte and a 32-bit length, the two properties that
// queues look at, and, out of line in more, what few messages need: the whole Message when the
// message sets more than those (headers, properties) or when a listener was there to see it
// published (so that every event of it carries one *Message), a durable broker's log state. A
// delivery of a message whose envelope keeps no Message carries its own copy of it.
type envelope struct {
	body       *byte  // the body's first byte, nil for a nil body (bodyBytes)
	size       uint32 // the body's length (maxBodySize)
	persistent bool
	priority   uint8
	routingKey string
	exchange   *Exchange     // the exchange it was published to (a pointer: 8 bytes, not a string's 16)
	more       *envelopeMore // headers, properties, and what few messages need; nil for the others
}

// maxBodySize is the largest body an envelope holds: a publish of a larger one fails. (RabbitMQ
// refuses bodies over 512 MiB whatever its configuration.)
const maxBodySize = math.MaxUint32

// checkBodySize refuses a body of n bytes if an envelope cannot hold it.
func checkBodySize(n int) error {
	if uint64(n) > maxBodySize {
		return errorf("publish: a body of %d bytes, over %d: %w", n, uint64(maxBodySize), ErrInvalidArgument)
	}
	return nil
}

// bodyBytes returns the message's body, the publisher's slice (with its capacity cut to its
// length).
func (e *envelope) bodyBytes() []byte { return unsafe.Slice(e.body, e.size) }

// message returns the message the envelope holds.
func (e *envelope) message() Message {
	if m := e.ownMessage(); m != nil {
		return *m
	}
	return Message{Body: e.bodyBytes(), Persistent: e.persistent, Priority: e.priority}
}

// messagePtr returns the message as a pointer: the envelope's own Message when it keeps one,
// shared by every event and delivery of it, else a copy on the heap. For events (made only
// when someone listens) and Browse.
func (e *envelope) messagePtr() *Message {
	if m := e.ownMessage(); m != nil {
		return m
	}
	m := e.message()
	return &m
}

// ownMessage returns the envelope's own Message, nil when it keeps none.
func (e *envelope) ownMessage() *Message {
	if e.more != nil {
		return e.more.msg
	}
	return nil
}

// setMessage fills in e from m (a new envelope, before it is routed); e must keep its own
// Message (more.msg) if m sets more than its body, Persistent and Priority (needsMore).
func (e *envelope) setMessage(m *Message) {
	e.body, e.size = unsafe.SliceData(m.Body), uint32(len(m.Body))
	e.persistent, e.priority = m.Persistent, m.Priority
	if own := e.ownMessage(); own != nil {
		*own = *m
	}
}

// needsMore reports whether an envelope of m needs its more for m's headers or properties.
func (m *Message) needsMore() bool { return m.Headers != nil || m.hasProperties() }

// hasProperties reports whether m sets a property besides Persistent and Priority. (The
// lengths ORed together rather than a loop over text(): it runs on every publish.)
func (m *Message) hasProperties() bool {
	return len(m.ContentType)|len(m.ContentEncoding)|len(m.MessageID)|len(m.CorrelationID)|
		len(m.ReplyTo)|len(m.Expiration)|len(m.Type)|len(m.UserID)|len(m.AppID) != 0 ||
		!m.Timestamp.IsZero()
}

// envelopeMore is what an envelope rarely needs, out of line so that the others stay small.
type envelopeMore struct {
	msg   *Message     // the message, whole, when the envelope keeps it (newEnvelope); else nil
	bcc   []string     // the keys of its BCC header, which publishing strips
	logID uint64       // a durable broker's: its id in the log, once a durable queue took it (store.go)
	seg   uint64       // the log segment its body is in
	size  int64        // the bytes of its body's record
	pass  uint64       // the compaction pass that last wrote its body (compact.go)
	refs  atomic.Int32 // the durable queues that hold it
}

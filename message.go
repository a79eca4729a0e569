package warren

import (
	"math"
	"reflect"
	"slices"
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
//
// Tables and arrays nest at most 32 levels below the top-level table, and none may contain
// itself: every broker refuses to publish such headers, and to declare or bind with such
// arguments, with an error wrapping [ErrPreconditionFailed] that says "cyclic" or "nested
// deeper than 32". Arguments, and a persistent message's headers on a durable broker ([Open]),
// must also hold only the types above; an in-memory broker passes other header values along
// untouched.
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
// (or nested in it) that is not one of the AMQP field types listed for [Table], a table or
// array that contains itself, and nesting deeper than maxFieldDepth: for arguments, and the
// headers of a persistent message on a durable broker, which the log encodes.
func checkTable(t Table) error {
	for _, v := range t {
		if o, ok := v.(invalidOption); ok {
			return o.err // a typed option's own error
		}
	}
	c := fieldCheck{label: "argument", types: true}
	return c.table(t)
}

// checkHeaders reports, wrapping [ErrPreconditionFailed], headers that hold a table or array
// that contains itself, or that nest deeper than maxFieldDepth, which every broker refuses to
// publish: whatever walks a message's tables (the admin's message view, the AMQP listener's
// encoder, headers matching) would recurse without end. Values of other types are not looked
// into; with types, they are refused as checkTable refuses them. It allocates nothing, and is
// linear in the size of the tables and arrays, O(depth) more for each of them. It returns what
// the headers take in memory, as tableCost estimates it (memory.go), from the same walk.
func checkHeaders(h Table, types bool) (int, error) {
	c := fieldCheck{label: "header", types: types}
	err := c.table(h)
	return c.cost, err
}

// maxFieldDepth bounds how deeply tables and arrays nest: a top-level table's values are at
// depth 0, and a value deeper than maxFieldDepth is refused. The durable log's codec
// (codec.go) and contrib/amqp's wire decoder hold to the same bound (the decoder, which counts
// the top-level table as a level, to one less), so what one broker takes another can log and a
// wire client cannot send what the broker refuses. Real headers nest two or three deep (x-death
// is an array of tables of arrays).
const maxFieldDepth = 32

// fieldCheck walks a table's values and those nested in them, for checkTable and checkHeaders.
type fieldCheck struct {
	label string // what a table's keys are called in errors: "argument", "header"
	types bool   // refuse values that are not AMQP field types; else only tables and arrays are looked into
	// path holds the tables and arrays from the top-level table (path[0]) to the one whose values
	// are being checked: a value that is one of them is a cycle.
	path [maxFieldDepth + 2]container
	cost int // what the tables walked take in memory, as tableCost estimates it
}

// container identifies a table (by its map) or an array (by its elements and length).
type container struct {
	p unsafe.Pointer
	n int
}

var errCyclic = errorf("cyclic: a table or array contains itself: %w", ErrPreconditionFailed)

// table checks t, the top-level table.
func (c *fieldCheck) table(t map[string]any) error {
	if len(t) == 0 {
		return nil
	}
	c.path[0] = container{p: mapPointer(t)}
	c.cost += tableHeader
	return c.values(t, 0)
}

// values checks t's values, at depth.
func (c *fieldCheck) values(t map[string]any, depth int) error {
	for k, v := range t {
		c.cost += mapEntryCost + len(k)
		if err := c.value(v, depth); err != nil {
			return errorf("%s %q: %w", c.label, k, err)
		}
	}
	return nil
}

// value checks v, at depth: its type, and, for a table or an array, that it is none of the
// tables and arrays it is nested in, and its values one level deeper.
func (c *fieldCheck) value(v any, depth int) error {
	if depth > maxFieldDepth {
		return errorf("tables nested deeper than %d: %w", maxFieldDepth, ErrPreconditionFailed)
	}
	var (
		id    container
		table map[string]any
		array []any
	)
	switch v := v.(type) {
	case nil, bool, int8, int16, int32, int64, int, uint8, uint16, uint32, float32, float64,
		string, []byte, time.Time, Decimal:
		c.cost += valueCost(v, depth)
		return nil
	case Table:
		table, id = v, container{p: mapPointer(v)}
	case map[string]any:
		table, id = v, container{p: mapPointer(v)}
	case []any:
		array, id = v, container{p: unsafe.Pointer(unsafe.SliceData(v)), n: len(v)}
	default:
		if c.types {
			return errorf("value of type %T is not an AMQP field type: %w", v, ErrPreconditionFailed)
		}
		return nil
	}
	if len(table) == 0 && len(array) == 0 {
		return nil // holds nothing, itself included
	}
	if slices.Contains(c.path[:depth+1], id) {
		return errCyclic
	}
	c.path[depth+1] = id
	if table != nil {
		c.cost += tableHeader
		return c.values(table, depth+1)
	}
	c.cost += arraySlot * len(array)
	for _, e := range array {
		if err := c.value(e, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// mapPointer returns the pointer a map value is.
func mapPointer(m map[string]any) unsafe.Pointer { return reflect.ValueOf(m).UnsafePointer() }

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
	solo  bool         // routed to one queue only: a durable queue may page it out (pager.go)
	cost  uint32       // what it keeps, in bytes, for the memory budget (moreCost)
}

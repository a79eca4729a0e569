package warren

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"time"
)

// headersBinding is a headers-exchange binding's arguments, parsed once at bind time.
// It is immutable after [parseHeadersBinding], so concurrent matches are safe. The zero value
// is a valid "all" binding with no arguments, which matches every message.
type headersBinding struct {
	matchAny bool        // x-match is any or any-with-x; otherwise all or all-with-x
	args     []headerArg // the arguments that matching considers, sorted by key
}

// headerArg is one binding argument that matching considers.
type headerArg struct {
	key   string
	value any // nil: the header must be present, with any value; otherwise compared by fieldEqual
}

// parseHeadersBinding parses the arguments of a binding to a headers exchange.
//
// The argument x-match selects the mode: "all" (the default when absent), "any", "all-with-x"
// or "any-with-x". Any other value, including a non-string such as []byte("all"), is an error
// wrapping [ErrPreconditionFailed], as AMQP's 406 at bind time. x-match itself is never matched;
// other arguments whose key starts with "x-" are matched only in the -with-x modes.
//
// args is not retained, but its values are: nested tables, arrays and byte slices are shared,
// and the caller must not modify them afterwards. It is O(a log a) for a arguments.
func parseHeadersBinding(args Table) (headersBinding, error) {
	var h headersBinding
	withX := false
	if v, ok := args["x-match"]; ok {
		s, ok := v.(string)
		if !ok {
			return headersBinding{}, errorf("headers binding: x-match %v of type %T is not a string: %w", v, v, ErrPreconditionFailed)
		}
		switch s {
		case "all":
		case "any":
			h.matchAny = true
		case "all-with-x":
			withX = true
		case "any-with-x":
			h.matchAny, withX = true, true
		default:
			return headersBinding{}, errorf("headers binding: x-match %q is not all, any, all-with-x or any-with-x: %w", s, ErrPreconditionFailed)
		}
	}
	for k, v := range args {
		if k == "x-match" || !withX && strings.HasPrefix(k, "x-") {
			continue
		}
		h.args = append(h.args, headerArg{key: k, value: v})
	}
	// Sorted only so that a binding is deterministic to inspect; the order does not change
	// the outcome.
	slices.SortFunc(h.args, func(a, b headerArg) int { return strings.Compare(a.key, b.key) })
	return h, nil
}

// match reports whether a message with these headers matches the binding. In the all modes
// every considered argument must match, so a binding with none matches every message; in the
// any modes one must, so a binding with none matches no message. An argument matches when the
// header with its exact (case-sensitive) key is present and, unless the argument's value is
// nil, has a value [fieldEqual] to it. Headers the binding does not mention are ignored; nil
// headers are a message without headers.
//
// It does not allocate, and is O(a) map lookups and comparisons for a considered arguments.
func (h *headersBinding) match(headers Table) bool {
	for i := range h.args {
		a := &h.args[i]
		v, ok := headers[a.key]
		hit := ok && (a.value == nil || fieldEqual(a.value, v))
		if hit == h.matchAny {
			// The first hit decides an any binding, the first miss an all binding.
			return hit
		}
	}
	return !h.matchAny
}

// fieldEqual reports whether two AMQP field values are equal by value, the way RabbitMQ
// compares a headers binding's argument with a message header:
//
//   - Numbers of any Go integer or float type are equal when their values are: 1, int64(1),
//     uint8(1), 1.0 and float32(1) are all equal. The comparison is exact (no rounding through
//     float64 for large integers); float32 values are widened to float64 first, so float32(0.1)
//     is not 0.1; NaN equals nothing.
//   - A string equals only the same string. A []byte equals only a []byte with the same bytes:
//     a string and a []byte are different AMQP types (longstr and byte array) and are never
//     equal, even with the same bytes. nil and empty byte slices are equal.
//   - bool equals only bool; time.Time compares with [time.Time.Equal]; [Decimal] equals only a
//     Decimal with the same Scale and Value (so Decimal{1, 10} is not Decimal{0, 1}), and never a
//     number.
//   - A Table (or map[string]any) equals a table with the same keys whose values are
//     fieldEqual; an []any equals an []any of the same length whose elements are fieldEqual in
//     order. nil equals only nil.
//   - Values of any other type are not AMQP field values and are equal to nothing, not even
//     themselves (this also keeps uncomparable types from panicking).
//
// It does not allocate, and is linear in the size of the values.
func fieldEqual(a, b any) bool { return fieldCompare(a, b, false) }

// sameField is fieldEqual for telling declarations and bindings apart, where a value must at
// least be the same as itself: a NaN is the same as a NaN, so that a declaration holding one can
// be repeated and a binding holding one removed (as RabbitMQ, which compares the encoded
// arguments, does).
func sameField(a, b any) bool { return fieldCompare(a, b, true) }

func fieldCompare(a, b any, sameNaN bool) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	if na, ok := numberOf(a); ok {
		nb, ok := numberOf(b)
		return ok && (na.equal(nb) || sameNaN && na.isNaN() && nb.isNaN())
	}
	switch a := a.(type) {
	case string:
		b, ok := b.(string)
		return ok && a == b
	case []byte:
		b, ok := b.([]byte)
		return ok && bytes.Equal(a, b)
	case bool:
		b, ok := b.(bool)
		return ok && a == b
	case time.Time:
		b, ok := b.(time.Time)
		return ok && a.Equal(b)
	case Decimal:
		b, ok := b.(Decimal)
		return ok && a == b
	case Table:
		return tableEqual(a, b, sameNaN)
	case map[string]any:
		return tableEqual(a, b, sameNaN)
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !fieldCompare(a[i], b[i], sameNaN) {
				return false
			}
		}
		return true
	}
	return false
}

// tableEqual reports whether the table a equals b, which must be a Table or map[string]any.
func tableEqual(a map[string]any, b any, sameNaN bool) bool {
	var tb map[string]any
	switch b := b.(type) {
	case Table:
		tb = b
	case map[string]any:
		tb = b
	default:
		return false
	}
	if len(a) != len(tb) {
		return false
	}
	for k, va := range a {
		vb, ok := tb[k]
		if !ok || !fieldCompare(va, vb, sameNaN) {
			return false
		}
	}
	return true
}

// numberKind says which field of a [number] holds its value.
type numberKind uint8

const (
	negInt   numberKind = iota // a negative integer, in i
	nonNeg                     // a non-negative integer, in u
	floating                   // a float, in f
)

// number is a numeric field value in a form that compares across Go types. Integers are split
// by sign so that every integer fits one field exactly.
type number struct {
	kind numberKind
	i    int64
	u    uint64
	f    float64
}

// numberOf returns v as a number, or false if v is not of a Go integer or float type.
func numberOf(v any) (number, bool) {
	switch v := v.(type) {
	case int:
		return intNumber(int64(v)), true
	case int8:
		return intNumber(int64(v)), true
	case int16:
		return intNumber(int64(v)), true
	case int32:
		return intNumber(int64(v)), true
	case int64:
		return intNumber(v), true
	case uint:
		return number{kind: nonNeg, u: uint64(v)}, true
	case uint8:
		return number{kind: nonNeg, u: uint64(v)}, true
	case uint16:
		return number{kind: nonNeg, u: uint64(v)}, true
	case uint32:
		return number{kind: nonNeg, u: uint64(v)}, true
	case uint64:
		return number{kind: nonNeg, u: v}, true
	case uintptr:
		return number{kind: nonNeg, u: uint64(v)}, true
	case float32:
		return number{kind: floating, f: float64(v)}, true
	case float64:
		return number{kind: floating, f: v}, true
	}
	return number{}, false
}

func intNumber(i int64) number {
	if i < 0 {
		return number{kind: negInt, i: i}
	}
	return number{kind: nonNeg, u: uint64(i)}
}

// isNaN reports whether x is a float NaN.
func (x number) isNaN() bool { return x.kind == floating && math.IsNaN(x.f) }

// equal reports whether x and y have the same value.
func (x number) equal(y number) bool {
	if x.kind > y.kind {
		x, y = y, x
	}
	switch {
	case x.kind == y.kind:
		return x == y
	case y.kind != floating:
		return false // a negative and a non-negative integer
	case x.kind == negInt:
		// Compare in the integer domain: converting x.i to float64 could round it. A float
		// in [-2^63, 0) that has no fraction converts to int64 exactly.
		return y.f == math.Trunc(y.f) && y.f >= -(1<<63) && y.f < 0 && int64(y.f) == x.i
	default:
		return y.f == math.Trunc(y.f) && y.f >= 0 && y.f < 1<<64 && uint64(y.f) == x.u
	}
}

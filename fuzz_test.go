package warren_test

// Fuzz targets of the reliability suite, each checking warren, through its public API, against a
// deliberately naive reference written from the documented contract:
//
//   - FuzzHeadersMatch: headers-exchange bindings (R6.5) with random x-match modes and typed
//     arguments, and messages with random typed headers; whether a message reaches the bound
//     queue must be what refHeadersMatch says, an invalid binding must fail with an error
//     wrapping ErrPreconditionFailed, and binding twice then unbinding once must leave nothing.
//   - FuzzQueueArguments: random "x-" arguments and typed queue options; DeclareQueue must fail
//     exactly when refQueueDecl says, with the sentinel it says; a declared queue must redeclare
//     with the same options, refuse (or allow) a bare redeclaration as its flags and compared
//     arguments say, and work (publish, Get, Nack, Get, Ack) as its limits say.
//   - FuzzExpiration: random Message.Expiration strings; Publish must accept exactly the decimal
//     numbers from 0 to 2^32-1 (refExpiration) and refuse the rest with an error wrapping
//     ErrPreconditionFailed; an accepted one is a TTL, in virtual time: present 1 ns before its
//     deadline (min of it and the queue's TTL), gone at it, dead-lettered with its
//     original-expiration.
//   - FuzzQueueDurations: publishes with DeliverAfter and Expiration, NackWithDelay, consumers
//     with ack timeouts, under a queue TTL, age threshold and consumer timeout, with durations
//     from 0 to the largest Duration and negative ones; in virtual time every short deadline is
//     met to the nanosecond, however huge the others, and a huge one is never met.
//
// The topic matcher has its own target (FuzzTopicMatch, topic_test.go, against refTopicMatch),
// and the model-based operation sequences theirs (FuzzModel, model_test.go; FuzzModelTime,
// model_ttl_test.go, with virtual time). scripts/fuzz runs every target in turn. This file holds
// only the fuzz targets and what they use; the regression tests they found are filed with what
// they specify (TestBindNaNArgumentUnbind in exchange_test.go, TestBlockPublishWaitsForBytes in
// limits_test.go).
//
// The inputs are bytes decoded by fzBytes: every byte string is a valid input, read one byte per
// choice, zeros once exhausted, so the fuzzer's mutations move through choices. Seeds are a few
// hand-written inputs plus random byte strings (fzRandomSeeds), so that a plain `go test` runs a
// spread of cases too.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/big"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// fzBytes reads an input's choices, one byte each; 0 once the input is exhausted.
type fzBytes struct{ b []byte }

func (f *fzBytes) byte() byte {
	if len(f.b) == 0 {
		return 0
	}
	c := f.b[0]
	f.b = f.b[1:]
	return c
}

// intn returns a choice in [0, n).
func (f *fzBytes) intn(n int) int { return int(f.byte()) % n }

// fzRandomSeeds adds n random inputs of up to size bytes, from a fixed seed.
func fzRandomSeeds(f *testing.F, seed uint64, n, size int) {
	r := rand.New(rand.NewPCG(seed, 0))
	for range n {
		b := make([]byte, 1+r.IntN(size))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		f.Add(b)
	}
}

// ---------------------------------------------------------------------------------------------
// Typed field values.

// fzInts are the integers values are drawn from, converted (wrapping) to the width chosen: small
// ones so that values often match, and the edges of every width.
var fzInts = []int64{0, 1, -1, 2, 3, 127, -128, 255, 256, 65535, 1<<31 - 1, -1 << 31, 1<<32 - 1, 1 << 32,
	1 << 53, 1<<53 + 1, 1<<63 - 1, -1 << 63}

// fzFloats are the floats values are drawn from.
var fzFloats = []float64{0, math.Copysign(0, -1), 1, -1, 0.5, 2, 3, 0.1, 255, 1 << 53, 1<<53 + 2, 1 << 63,
	-1 << 63, 1 << 64, 4294967295, 1e300, math.SmallestNonzeroFloat64, math.Inf(1), math.Inf(-1), math.NaN()}

// fzStrings are the strings (and byte arrays) values are drawn from.
var fzStrings = []string{"", "a", "b", "1", "all", "any"}

// Value tags: the first byte of a value.
const (
	fzNil = iota
	fzString
	fzBytesV
	fzBool
	fzInt
	fzInt8
	fzInt16
	fzInt32
	fzInt64
	fzUint8
	fzUint16
	fzUint32
	fzUint   // not an AMQP field type
	fzUint64 // not an AMQP field type
	fzFloat32
	fzFloat64
	fzTime
	fzDecimal
	fzTable
	fzMap // map[string]any, a table too
	fzArray
	fzForeign   // a Go value that is no AMQP field type
	fzTypedNil  // Table(nil), []any(nil) or []byte(nil)
	fzEcho      // headers only: the binding's value for the key, maybe in another width
	fzValueTags // how many tags there are
)

// fzInt returns integer choice i converted to the width of tag.
func fzIntOf(tag int, i int64) any {
	switch tag {
	case fzInt:
		return int(i)
	case fzInt8:
		return int8(i)
	case fzInt16:
		return int16(i)
	case fzInt32:
		return int32(i)
	case fzInt64:
		return i
	case fzUint8:
		return uint8(i)
	case fzUint16:
		return uint16(i)
	case fzUint32:
		return uint32(i)
	case fzUint:
		return uint(i)
	case fzUint64:
		return uint64(i)
	}
	panic(fmt.Sprintf("fzIntOf(%d)", tag))
}

// fzValue decodes a typed field value; tables and arrays nest at most depth levels more.
func fzValue(f *fzBytes, depth int) any {
	tag := f.intn(fzEcho) // fzEcho is the headers' own
	if depth <= 0 && (tag == fzTable || tag == fzMap || tag == fzArray) {
		tag = fzString
	}
	switch tag {
	case fzNil:
		return nil
	case fzString:
		return fzStrings[f.intn(len(fzStrings))]
	case fzBytesV:
		return []byte(fzStrings[f.intn(len(fzStrings))])
	case fzBool:
		return f.byte()&1 == 1
	case fzInt, fzInt8, fzInt16, fzInt32, fzInt64, fzUint8, fzUint16, fzUint32, fzUint, fzUint64:
		return fzIntOf(tag, fzInts[f.intn(len(fzInts))])
	case fzFloat32:
		return float32(fzFloats[f.intn(len(fzFloats))])
	case fzFloat64:
		return fzFloats[f.intn(len(fzFloats))]
	case fzTime:
		c := f.byte()
		loc := time.UTC
		if c&4 != 0 {
			loc = time.FixedZone("X", 3600) // the same instant elsewhere is equal
		}
		return time.Unix(int64(c&3), 0).In(loc)
	case fzDecimal:
		c := f.byte()
		return warren.Decimal{Scale: c & 1, Value: int32(c>>1) % 3}
	case fzTable, fzMap:
		m := map[string]any{}
		for range f.intn(3) {
			m[fzKeys[f.intn(len(fzKeys))]] = fzValue(f, depth-1)
		}
		if tag == fzTable {
			return warren.Table(m)
		}
		return m
	case fzArray:
		a := []any{}
		for range f.intn(3) {
			a = append(a, fzValue(f, depth-1))
		}
		return a
	case fzForeign:
		return []any{[]string{"a"}, map[string]int{"a": 1}, struct{}{}, uintptr(1), &struct{}{}}[f.intn(5)]
	case fzTypedNil:
		return []any{warren.Table(nil), []any(nil), []byte(nil)}[f.intn(3)]
	}
	panic("unreachable")
}

// fzConvert returns v in another numeric width, chosen by c, when that keeps its value; else v.
func fzConvert(v any, c byte) any {
	n, ok := refNumber(v)
	if !ok || n.special != 0 {
		return v
	}
	if c&1 == 1 {
		if f, acc := n.rat.Float64(); acc {
			return f
		}
		return v
	}
	if !n.rat.IsInt() {
		return v
	}
	i := n.rat.Num()
	switch {
	case i.IsInt64() && i.Int64() >= math.MinInt8 && i.Int64() <= math.MaxInt8 && c&2 == 0:
		return int8(i.Int64())
	case i.IsInt64():
		return i.Int64()
	case i.IsUint64():
		return i.Uint64()
	}
	return v
}

// fzDesc renders a value with its types, for failure messages: float64(1) and int(1) differ.
func fzDesc(v any) string {
	table := func(name string, t map[string]any) string {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(t)) {
			parts = append(parts, fmt.Sprintf("%q: %s", k, fzDesc(t[k])))
		}
		return name + "{" + strings.Join(parts, ", ") + "}"
	}
	switch v := v.(type) {
	case nil:
		return "nil"
	case warren.Table:
		if v == nil {
			return "Table(nil)"
		}
		return table("Table", v)
	case map[string]any:
		return table("map", v)
	case []any:
		var parts []string
		for _, e := range v {
			parts = append(parts, fzDesc(e))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case string:
		return fmt.Sprintf("%q", v)
	case []byte:
		return fmt.Sprintf("[]byte(%q)", v)
	}
	return fmt.Sprintf("%T(%v)", v, v)
}

// ---------------------------------------------------------------------------------------------
// The reference: value equality and headers matching, from R6.5 and the field-value rules in the
// doc comments (headers.go's fieldEqual documents them for bindings).

// refNum is a number's exact value: a rational, or special: +1/-1 for ±Inf, 2 for NaN.
type refNum struct {
	rat     *big.Rat
	special int
}

// refNumber returns v as a number if it is of a Go integer or float type.
func refNumber(v any) (refNum, bool) {
	rv := reflect.ValueOf(v)
	if !rv.IsValid() || rv.Type().PkgPath() != "" { // named types (time.Duration…) are not numbers
		return refNum{}, false
	}
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return refNum{rat: new(big.Rat).SetInt64(rv.Int())}, true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return refNum{rat: new(big.Rat).SetUint64(rv.Uint())}, true
	case reflect.Float32, reflect.Float64:
		switch f := rv.Float(); { // a float32 widens exactly
		case math.IsNaN(f):
			return refNum{special: 2}, true
		case math.IsInf(f, 0):
			return refNum{special: int(math.Copysign(1, f))}, true
		default:
			return refNum{rat: new(big.Rat).SetFloat64(f)}, true
		}
	}
	return refNum{}, false
}

// refTableOf returns v as a table, if it is one.
func refTableOf(v any) (map[string]any, bool) {
	switch t := v.(type) {
	case warren.Table:
		return t, true
	case map[string]any:
		return t, true
	}
	return nil, false
}

// refEqual is the naive reference of value equality: numbers by exact value across every width
// and between integers and floats (NaN equals nothing); strings, byte arrays, booleans, times
// (the same instant), decimals (same scale and value) only with their own kind; tables by keys
// and values, arrays by elements in order; untyped nil only nil; anything else nothing.
func refEqual(a, b any) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	na, aNum := refNumber(a)
	nb, bNum := refNumber(b)
	if aNum || bNum {
		switch {
		case !aNum || !bNum, na.special == 2, nb.special == 2, na.special != nb.special:
			return false
		case na.special != 0:
			return true // the same infinity
		}
		return na.rat.Cmp(nb.rat) == 0
	}
	if ta, ok := refTableOf(a); ok {
		tb, ok := refTableOf(b)
		if !ok || len(ta) != len(tb) {
			return false
		}
		for k, va := range ta {
			vb, ok := tb[k]
			if !ok || !refEqual(va, vb) {
				return false
			}
		}
		return true
	}
	switch a := a.(type) {
	case string:
		b, ok := b.(string)
		return ok && a == b
	case []byte:
		b, ok := b.([]byte)
		return ok && string(a) == string(b)
	case bool:
		b, ok := b.(bool)
		return ok && a == b
	case time.Time:
		b, ok := b.(time.Time)
		return ok && a.Equal(b)
	case warren.Decimal:
		b, ok := b.(warren.Decimal)
		return ok && a == b
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !refEqual(a[i], b[i]) {
				return false
			}
		}
		return true
	}
	return false
}

// refFieldOK reports whether v is an AMQP field value, nested ones included (the types listed
// for warren.Table).
func refFieldOK(v any) bool {
	switch v := v.(type) {
	case nil, bool, int8, int16, int32, int64, int, uint8, uint16, uint32, float32, float64, string, []byte,
		time.Time, warren.Decimal:
		return true
	case warren.Table:
		return refTableOK(v)
	case map[string]any:
		return refTableOK(v)
	case []any:
		for _, e := range v {
			if !refFieldOK(e) {
				return false
			}
		}
		return true
	}
	return false
}

func refTableOK(t map[string]any) bool {
	for _, v := range t {
		if !refFieldOK(v) {
			return false
		}
	}
	return true
}

// refHeadersMatch is the naive reference of R6.5: ok is false for a binding that must be
// refused (an x-match other than the strings all, any, all-with-x, any-with-x); else match
// says whether a message with headers goes through it.
func refHeadersMatch(args, headers warren.Table) (match, ok bool) {
	mode := "all"
	if v, present := args["x-match"]; present {
		s, isString := v.(string)
		if !isString {
			return false, false
		}
		mode = s
	}
	var any, withX bool
	switch mode {
	case "all":
	case "any":
		any = true
	case "all-with-x":
		withX = true
	case "any-with-x":
		any, withX = true, true
	default:
		return false, false
	}
	hits, considered := 0, 0
	for k, want := range args {
		if k == "x-match" || !withX && strings.HasPrefix(k, "x-") {
			continue
		}
		considered++
		got, present := headers[k]
		if present && (want == nil || refEqual(want, got)) {
			hits++
		}
	}
	if any {
		return hits > 0, true
	}
	return hits == considered, true
}

// ---------------------------------------------------------------------------------------------
// FuzzHeadersMatch.

// fzKeys are the keys of binding arguments and headers: plain, x- (considered only in the -with-x
// modes), X- (always considered), empty.
var fzKeys = []string{"a", "b", "c", "x-a", "x-b", "X-c", "", "x-", "xa"}

// fzHeaderKeys are the keys of headers: those of bindings, and x-match (never matched).
var fzHeaderKeys = append(slices.Clip(fzKeys), "x-match")

// fzBadModes are invalid x-match values: strings, and other types.
var fzBadModes = []any{"", "ALL", "Any", "none", "all ", "any-with-X", "with-x", []byte("all"), 1, true, nil,
	warren.Table{"all": nil}, []any{"all"}, uint64(0)}

// x-match choices: the first byte of a binding.
const (
	fzModeAbsent = iota
	fzModeAll
	fzModeAny
	fzModeAllX
	fzModeAnyX
	fzModeBad
	fzModes
)

// fzHeadersInput decodes a binding and one to three header tables.
func fzHeadersInput(data []byte) (args warren.Table, msgs []warren.Table) {
	f := &fzBytes{data}
	args = warren.Table{}
	switch m := f.intn(fzModes); m {
	case fzModeAbsent:
	case fzModeBad:
		args["x-match"] = fzBadModes[f.intn(len(fzBadModes))]
	default:
		args["x-match"] = []string{"", "all", "any", "all-with-x", "any-with-x"}[m]
	}
	for range f.intn(6) {
		args[fzKeys[f.intn(len(fzKeys))]] = fzValue(f, 2)
	}
	for range 1 + f.intn(3) {
		if f.intn(8) == 0 {
			msgs = append(msgs, nil)
			continue
		}
		h := warren.Table{}
		for range f.intn(6) {
			k := fzHeaderKeys[f.intn(len(fzHeaderKeys))]
			if f.intn(3) == 0 { // often the binding's own value, maybe in another width
				if v, ok := args[k]; ok {
					h[k] = fzConvert(v, f.byte())
					continue
				}
			}
			h[k] = fzValue(f, 2)
		}
		msgs = append(msgs, h)
	}
	return args, msgs
}

// fzH encodes a value for the hand-written seeds: a tag and its choice bytes.
func fzH(tag int, choices ...byte) []byte { return append([]byte{byte(tag)}, choices...) }

// fzIdx returns the index of v in s as a choice byte.
func fzIdx[T comparable](s []T, v T) byte {
	i := slices.Index(s, v)
	if i < 0 {
		panic(fmt.Sprintf("%v not in %v", v, s))
	}
	return byte(i)
}

func FuzzHeadersMatch(f *testing.F) {
	key := func(k string) byte { return fzIdx(fzKeys, k) }
	ival := func(tag int, n int64) []byte { return fzH(tag, fzIdx(fzInts, n)) }
	fval := func(tag int, x float64) []byte { return fzH(tag, byte(slices.Index(fzFloats, x))) }
	str := func(s string) []byte { return fzH(fzString, fzIdx(fzStrings, s)) }
	seed := func(parts ...[]byte) { f.Add(slices.Concat(parts...)) }
	b := func(bs ...byte) []byte { return bs }

	// all: a=int 1, b="a"; message a=float64 1, b="a" (matches), then a=int8 1 only (does not).
	seed(b(fzModeAll, 2, key("a")), ival(fzInt, 1), b(key("b")), str("a"),
		b(1, 1, 2, key("a"), 1), fval(fzFloat64, 1), b(key("b"), 1), str("a"),
		b(1, 1, key("a"), 1), ival(fzInt8, 1))
	// any: a=uint32 2^32-1 must equal float64 4294967295; b=nil (presence).
	seed(b(fzModeAny, 2, key("a")), ival(fzUint32, 1<<32-1), b(key("b"), fzNil),
		b(0, 1, 1, key("a"), 1), fval(fzFloat64, 4294967295))
	// all-with-x: x-a=true must be in the headers; any-with-x; an x-a ignored by plain all.
	seed(b(fzModeAllX, 1, key("x-a")), fzH(fzBool, 1), b(0, 1, 1, key("x-a"), 1), fzH(fzBool, 1))
	seed(b(fzModeAnyX, 2, key("x-a")), str("1"), b(key("a")), ival(fzInt, 1),
		b(0, 1, 1, key("x-a"), 1), str("1"))
	seed(b(fzModeAny, 2, key("x-a")), str("1"), b(key("a")), ival(fzInt, 1),
		b(0, 1, 1, key("x-a"), 1), str("1"))
	seed(b(fzModeAbsent, 1, key("x-a")), str("b"), b(0, 1, 0))
	// Invalid modes; an invalid argument type (uint64) in a valid one.
	seed(b(fzModeBad, fzIdx(fzBadModes, "ALL"), 1, key("a")), ival(fzInt, 1))
	seed(b(fzModeBad, 7 /* []byte("all") */, 0))
	seed(b(fzModeAll, 1, key("a")), ival(fzUint64, 1))
	// Nested tables and arrays, NaN and infinities, a string that is not a byte array.
	seed(b(fzModeAll, 1, key("c")), fzH(fzTable, 2, key("a"), fzInt8, 1, key("b"), fzArray, 2, fzFloat32, 2, fzNil),
		b(0, 1, 1, key("c"), 1), fzH(fzMap, 2, key("a"), fzFloat64, 2, key("b"), fzArray, 2, fzInt16, 1, fzNil))
	seed(b(fzModeAll, 2, key("a")), fval(fzFloat64, math.Inf(1)), b(key("b")), str("a"),
		b(0, 1, 2, key("a"), 1), fval(fzFloat32, math.Inf(1)), b(key("b"), 1), fzH(fzBytesV, fzIdx(fzStrings, "a")))
	seed(b(fzModeAll, 1, key("a")), fzH(fzFloat64, byte(len(fzFloats)-1)), b(0, 1, 1, key("a"), 1), fzH(fzFloat64, byte(len(fzFloats)-1)))
	// A NaN argument beside one that matches (TestBindNaNArgumentUnbind).
	seed(b(fzModeAny, 2, key("a")), fzH(fzFloat64, byte(len(fzFloats)-1)), b(key("b")), ival(fzInt, 1),
		b(0, 1, 1, key("b"), 1), ival(fzInt16, 1))
	// Large integers: 2^53+1 is not the float 2^53+2 nor 2^53; 2^63-1 is not 2^63.
	seed(b(fzModeAny, 2, key("a")), ival(fzInt64, 1<<53+1), b(key("b")), ival(fzInt64, 1<<63-1),
		b(0, 1, 2, key("a"), 1), fval(fzFloat64, 1<<53+2), b(key("b"), 1), fval(fzFloat64, 1<<63))
	// Echoes: the binding's int8 1 as int64 (choice 2), its uint16 65535 as float64 (choice 1).
	seed(b(fzModeAll, 2, key("a")), ival(fzInt8, 1), b(key("b")), ival(fzUint16, 65535),
		b(0, 1, 2, key("a"), 0, 2, key("b"), 0, 1))
	// Foreign values in the headers (uncomparable ones too) never match and never panic.
	seed(b(fzModeAll, 1, key("a")), fzH(fzTypedNil, 0), b(0, 1, 2, key("a"), 1), fzH(fzForeign, 1), b(key("b"), 1), fzH(fzForeign, 0))
	// Times in two zones; decimals.
	seed(b(fzModeAll, 2, key("a")), fzH(fzTime, 1), b(key("b")), fzH(fzDecimal, 3),
		b(0, 1, 2, key("a"), 1), fzH(fzTime, 5), b(key("b"), 1), fzH(fzDecimal, 3))
	fzRandomSeeds(f, 1, 40, 48)

	f.Fuzz(func(t *testing.T, data []byte) {
		args, msgs := fzHeadersInput(data)
		b := warren.New()
		defer b.Close()
		ctx := context.Background()
		_, err := b.DeclareExchange("hx", warren.ExchangeHeaders)
		require.NoError(t, err)
		q, err := b.DeclareQueue("q")
		require.NoError(t, err)

		_, modeOK := refHeadersMatch(args, nil)
		valid := modeOK && refTableOK(args)
		err = b.Bind("q", "hx", "", args)
		if !valid {
			require.Error(t, err, "Bind(%s) = nil, want an error wrapping ErrPreconditionFailed", fzDesc(args))
			require.ErrorIs(t, err, warren.ErrPreconditionFailed, "Bind(%s)", fzDesc(args))
			// Nothing is bound.
			for _, h := range msgs {
				err := b.Publish(ctx, "hx", "", warren.Message{Headers: h}, warren.Mandatory())
				require.ErrorIs(t, err, warren.ErrUnroutable, "publish %s with the binding %s refused", fzDesc(h), fzDesc(args))
			}
			require.Zero(t, q.Len())
			return
		}
		require.NoError(t, err, "Bind(%s)", fzDesc(args))
		require.NoError(t, b.Bind("q", "hx", "", args), "Bind(%s) again", fzDesc(args))

		var want []int // indexes of the messages that must arrive, in order
		for i, h := range msgs {
			match, _ := refHeadersMatch(args, h)
			err := b.Publish(ctx, "hx", "", warren.Message{Body: fmt.Append(nil, i), Headers: h}, warren.Mandatory())
			if match {
				require.NoError(t, err, "binding %s, headers %s: want a match", fzDesc(args), fzDesc(h))
				want = append(want, i)
			} else {
				require.ErrorIs(t, err, warren.ErrUnroutable, "binding %s, headers %s: want no match", fzDesc(args), fzDesc(h))
			}
		}
		var got []int
		for {
			d, err := q.Get(ctx, warren.AutoAck())
			if errors.Is(err, warren.ErrEmpty) {
				break
			}
			require.NoError(t, err)
			var i int
			_, err = fmt.Sscan(string(d.Message.Body), &i)
			require.NoError(t, err)
			got = append(got, i)
		}
		require.Equal(t, want, got, "messages that reached the queue through binding %s (one copy each, though bound twice)", fzDesc(args))

		// Binding twice was a no-op, so one Unbind removes the binding (with a NaN too:
		// TestBindNaNArgumentUnbind).
		require.NoError(t, b.Unbind("q", "hx", "", args))
		for _, h := range msgs {
			err := b.Publish(ctx, "hx", "", warren.Message{Headers: h}, warren.Mandatory())
			require.ErrorIs(t, err, warren.ErrUnroutable, "publish %s after Unbind(%s)", fzDesc(h), fzDesc(args))
		}
		require.Zero(t, q.Len(), "messages routed after Unbind")
	})
}

// ---------------------------------------------------------------------------------------------
// FuzzQueueArguments.

// fzArgKeys are the argument keys: every one warren parses or compares, then others (kept, not
// compared), including "exclusive", under which ExclusiveTo(nil) records its error.
var fzArgKeys = []string{"x-message-ttl", "x-expires", "x-dead-letter-exchange", "x-dead-letter-routing-key",
	"x-max-length", "x-max-length-bytes", "x-overflow", "x-delivery-limit", "x-max-priority",
	"x-single-active-consumer", "x-consumer-timeout", "x-queue-type",
	"x-queue-mode", "x-foo", "foo", "", "X-MESSAGE-TTL", "exclusive"}

// fzComparedArgs are the arguments that take part in declaration equivalence (Arguments' doc).
var fzComparedArgs = []string{"x-message-ttl", "x-expires", "x-dead-letter-exchange", "x-dead-letter-routing-key",
	"x-max-length", "x-max-length-bytes", "x-overflow", "x-delivery-limit", "x-max-priority",
	"x-single-active-consumer", "x-queue-type"}

// fzArgInts are the integers argument values are drawn from: each range's edges.
var fzArgInts = []int64{-2, -1, 0, 1, 2, 3, 254, 255, 256, 65535, 1<<31 - 1, 1<<32 - 1, 1 << 32, 1<<63 - 1, -1 << 63}

// fzArgStrings are the strings argument values are drawn from: the overflow policies among them.
var fzArgStrings = []string{"", "drop-head", "reject-publish", "reject-publish-dlx", "block", "quorum", "x",
	"amq.direct", "Drop-Head", "classic"}

// fzArgValue decodes an argument value: integers of every width, and every other kind.
func fzArgValue(f *fzBytes) any {
	switch tag := f.intn(15); tag {
	case 0:
		return nil
	case 1, 2, 3, 4, 5, 6, 7, 8, 9, 10:
		w := []int{fzInt, fzInt8, fzInt16, fzInt32, fzInt64, fzUint8, fzUint16, fzUint32, fzUint, fzUint64}[tag-1]
		return fzIntOf(w, fzArgInts[f.intn(len(fzArgInts))])
	case 11:
		s := fzArgStrings[f.intn(len(fzArgStrings))]
		if f.byte()&1 == 1 {
			return []byte(s)
		}
		return s
	case 12:
		return f.byte()&1 == 1
	case 13:
		return []any{1.0, 0.5, float32(2), math.NaN(), -1.0}[f.intn(5)]
	default:
		return fzValue(f, 1) // tables, arrays, times, decimals, foreign values…
	}
}

// fzDurations are the durations typed options are given.
var fzDurations = []time.Duration{-time.Millisecond, 0, 1, time.Millisecond, 1500 * time.Microsecond, 10 * time.Millisecond,
	time.Second, (1<<32 - 1) * time.Millisecond, 1 << 32 * time.Millisecond, time.Hour + 1}

// fzOptInts are the integers typed options are given.
var fzOptInts = []int{-1, 0, 1, 2, 3, 10, 255, 256, 1 << 31}

// refInvalid stands in the reference's table for a typed option with an invalid value.
type refInvalid struct{ what string }

// refDecl is the reference's view of a declaration: its options applied in order.
type refDecl struct {
	args             map[string]any // values, or refInvalid
	durable, autoDel bool
	exclusive        bool // ExclusiveTo with a context
	desc             []string
}

// fzQueueInput decodes a queue declaration into options and the reference's view of them; the
// body length and priority of the message that tries the queue.
func fzQueueInput(data []byte, owner context.Context) (opts []warren.QueueOption, ref refDecl, bodyLen int, prio uint8) {
	f := &fzBytes{data}
	ref.args = map[string]any{}
	typedInt := func(key string, n, least, most int) {
		if n < least || most > 0 && n > most {
			ref.args[key] = refInvalid{fmt.Sprintf("%s(%d)", key, n)}
		} else {
			ref.args[key] = int64(n)
		}
	}
	typedMs := func(key string, d time.Duration) {
		if d < 0 || d > (1<<32-1)*time.Millisecond || d%time.Millisecond != 0 {
			ref.args[key] = refInvalid{fmt.Sprintf("%s(%v)", key, d)}
		} else {
			ref.args[key] = int64(d / time.Millisecond)
		}
	}
	for range f.intn(7) {
		switch op := f.intn(14); op {
		case 0, 1, 2:
			t := warren.Table{}
			for range 1 + f.intn(3) {
				t[fzArgKeys[f.intn(len(fzArgKeys))]] = fzArgValue(f)
			}
			opts = append(opts, warren.Arguments(t))
			maps.Copy(ref.args, t)
			ref.desc = append(ref.desc, fmt.Sprintf("Arguments(%s)", fzDesc(t)))
		case 3:
			d := fzDurations[f.intn(len(fzDurations))]
			opts = append(opts, warren.MessageTTL(d))
			typedMs("x-message-ttl", d)
			ref.desc = append(ref.desc, fmt.Sprintf("MessageTTL(%v)", d))
		case 4:
			d := fzDurations[f.intn(len(fzDurations))]
			opts = append(opts, warren.Expires(d))
			typedMs("x-expires", d)
			ref.desc = append(ref.desc, fmt.Sprintf("Expires(%v)", d))
		case 5, 6, 7, 8:
			n := fzOptInts[f.intn(len(fzOptInts))]
			key := []string{"x-max-length", "x-max-length-bytes", "x-delivery-limit", "x-max-priority"}[op-5]
			opt := []func(int) warren.QueueOption{warren.MaxLength, warren.MaxLengthBytes, warren.DeliveryLimit, warren.MaxPriority}[op-5]
			opts = append(opts, opt(n))
			if op == 8 {
				typedInt(key, n, 1, 255)
			} else {
				typedInt(key, n, 0, 0)
			}
			ref.desc = append(ref.desc, fmt.Sprintf("%s typed(%d)", key, n))
		case 9:
			p := fzArgStrings[f.intn(len(fzArgStrings))]
			opts = append(opts, warren.Overflow(warren.OverflowPolicy(p)))
			ref.args["x-overflow"] = p
			ref.desc = append(ref.desc, fmt.Sprintf("Overflow(%q)", p))
		case 10:
			x, rk := fzArgStrings[f.intn(len(fzArgStrings))], fzArgStrings[f.intn(len(fzArgStrings))]
			opts = append(opts, warren.DeadLetter(x, rk))
			ref.args["x-dead-letter-exchange"] = x
			if rk != "" {
				ref.args["x-dead-letter-routing-key"] = rk
			}
			ref.desc = append(ref.desc, fmt.Sprintf("DeadLetter(%q, %q)", x, rk))
		case 11:
			opts = append(opts, warren.SingleActiveConsumer())
			ref.args["x-single-active-consumer"] = true
			ref.desc = append(ref.desc, "SingleActiveConsumer()")
		case 12:
			if f.byte()&1 == 0 {
				opts = append(opts, warren.Durable())
				ref.durable = true
				ref.desc = append(ref.desc, "Durable()")
			} else {
				opts = append(opts, warren.AutoDelete())
				ref.autoDel = true
				ref.desc = append(ref.desc, "AutoDelete()")
			}
		case 13:
			if f.byte()&1 == 0 {
				var none context.Context // the invalid option, on purpose
				opts = append(opts, warren.ExclusiveTo(none))
				ref.args["exclusive"] = refInvalid{"ExclusiveTo(nil)"}
				ref.desc = append(ref.desc, "ExclusiveTo(nil)")
			} else {
				opts = append(opts, warren.ExclusiveTo(owner))
				ref.exclusive = true
				ref.desc = append(ref.desc, "ExclusiveTo(ctx)")
			}
		}
	}
	return opts, ref, f.intn(4), f.byte()
}

// refArgInt returns an argument's value if it is of an AMQP integer type: a signed integer, or
// an unsigned one of at most 32 bits (a reference written apart from the library's intArg, by
// kind rather than by type switch).
func refArgInt(v any) (int64, bool) {
	if v == nil {
		return 0, false
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Int:
		return rv.Int(), rv.Type().PkgPath() == "" // named types are not AMQP's
	case reflect.Uint8, reflect.Uint16, reflect.Uint32:
		return int64(rv.Uint()), rv.Type().PkgPath() == ""
	}
	return 0, false
}

// refQueueCfg is what a valid declaration configures, as far as the fuzz target tries it.
type refQueueCfg struct {
	ttl           int64 // ms; -1 for none
	maxLen        int64 // -1 for none
	maxBytes      int64 // -1 for none
	deliveryLimit int64 // -1 for none
	overflow      string
}

// refQueueDecl is the naive reference of a declaration: the sentinel its error must wrap (nil
// for success) and, on success, the configuration. A typed option's invalid value is
// ErrInvalidArgument (the typed options' docs); a value of no AMQP field type, or an argument
// warren understands outside its range or of the wrong type, is ErrPreconditionFailed (AMQP's
// 406, R3.1, R6.12, Arguments' doc): x-message-ttl 0 to 2^32-1 ms; x-expires and
// x-consumer-timeout 1 to 2^32-1 ms; x-max-length and x-max-length-bytes ≥ 0; x-delivery-limit ≥
// -1 (-1: none); x-max-priority 0 to 255; all of these AMQP integers (not floats); x-overflow one
// of the four policies; x-single-active-consumer a boolean; x-dead-letter-exchange a string;
// x-dead-letter-routing-key a string, and only with x-dead-letter-exchange; x-queue-type the
// string "classic".
func refQueueDecl(ref refDecl) (refQueueCfg, error) {
	cfg := refQueueCfg{ttl: -1, maxLen: -1, maxBytes: -1, deliveryLimit: -1, overflow: "drop-head"}
	for _, v := range ref.args {
		if _, bad := v.(refInvalid); bad {
			return cfg, warren.ErrInvalidArgument
		}
	}
	if !refTableOK(ref.args) {
		return cfg, warren.ErrPreconditionFailed
	}
	intIn := func(key string, least, most int64, dst *int64) bool {
		v, ok := ref.args[key]
		if !ok {
			return true
		}
		n, ok := refArgInt(v)
		if !ok || n < least || n > most {
			return false
		}
		if dst != nil {
			*dst = n
		}
		return true
	}
	const maxMs = 1<<32 - 1
	if !intIn("x-message-ttl", 0, maxMs, &cfg.ttl) || !intIn("x-expires", 1, maxMs, nil) ||
		!intIn("x-consumer-timeout", 1, maxMs, nil) || !intIn("x-max-length", 0, math.MaxInt64, &cfg.maxLen) ||
		!intIn("x-max-length-bytes", 0, math.MaxInt64, &cfg.maxBytes) ||
		!intIn("x-delivery-limit", -1, math.MaxInt64, &cfg.deliveryLimit) || !intIn("x-max-priority", 0, 255, nil) {
		return cfg, warren.ErrPreconditionFailed
	}
	if v, ok := ref.args["x-overflow"]; ok {
		s, _ := v.(string)
		if !slices.Contains([]string{"drop-head", "reject-publish", "reject-publish-dlx", "block"}, s) {
			return cfg, warren.ErrPreconditionFailed
		}
		cfg.overflow = s
	}
	if v, ok := ref.args["x-single-active-consumer"]; ok {
		if _, ok := v.(bool); !ok {
			return cfg, warren.ErrPreconditionFailed
		}
	}
	if v, ok := ref.args["x-queue-type"]; ok && v != "classic" {
		return cfg, warren.ErrPreconditionFailed // quorum and stream queues are not warren's
	}
	x, hasDLX := ref.args["x-dead-letter-exchange"]
	if _, ok := x.(string); hasDLX && !ok {
		return cfg, warren.ErrPreconditionFailed
	}
	if rk, ok := ref.args["x-dead-letter-routing-key"]; ok {
		if _, ok := rk.(string); !ok || !hasDLX {
			return cfg, warren.ErrPreconditionFailed
		}
	}
	return cfg, nil
}

func FuzzQueueArguments(f *testing.F) {
	k := func(key string) byte { return fzIdx(fzArgKeys, key) }
	i := func(n int64) byte { return fzIdx(fzArgInts, n) }
	s := func(str string) byte { return fzIdx(fzArgStrings, str) }
	seed := func(b ...byte) { f.Add(b) }
	// Value tags of fzArgValue: 1 int, 2 int8, 3 int16, 4 int32, 5 int64, 6 uint8, 7 uint16,
	// 8 uint32, 9 uint (invalid), 10 uint64 (invalid), 11 string/[]byte, 12 bool, 13 float.

	// Nothing: a plain queue; a 3-byte body.
	seed(0, 3)
	// Arguments: TTL int32 1 ms, max length uint8 1, reject-publish: the message fits.
	seed(1, 0, 2, k("x-message-ttl"), 4, i(1), k("x-max-length"), 6, i(1), k("x-overflow"), 11, s("reject-publish"), 0, 1)
	// Compared arguments: a bare redeclaration is refused.
	seed(1, 9, s("reject-publish"), 1)
	// Max length 0 with each policy: drop-head drops, the reject ones refuse, block waits.
	for _, p := range []string{"drop-head", "reject-publish", "reject-publish-dlx", "block"} {
		seed(1, 0, 1, k("x-max-length"), 5, i(0), k("x-overflow"), 11, s(p), 0, 1)
	}
	// A body over a Block queue's byte limit: refused at once (it found TestBlockPublishWaitsForBytes).
	seed(1, 0, 1, k("x-max-length-bytes"), 1, i(2), k("x-overflow"), 11, s("block"), 0, 3)
	// Max length bytes 2 and a 3-byte body; TTL 0; delivery limit 0 with a dead-letter exchange.
	seed(1, 0, 0, k("x-max-length-bytes"), 1, i(2), 3)
	seed(1, 0, 0, k("x-message-ttl"), 8, i(0), 1)
	seed(2, 7, 1 /* 0 */, 10, s(""), s(""), 1)
	// Out of range and mistyped: TTL 2^32, -1; a uint64; a float; a []byte overflow; a string
	// max priority; 256 as priority; x-expires 0; x-consumer-timeout 0.
	seed(1, 0, 0, k("x-message-ttl"), 5, i(1<<32))
	seed(1, 0, 0, k("x-message-ttl"), 1, i(-1))
	seed(1, 0, 0, k("x-max-length"), 10, i(1))
	seed(1, 0, 0, k("x-max-length"), 13, 0)
	seed(1, 0, 0, k("x-overflow"), 11, s("block"), 1)
	seed(1, 0, 0, k("x-max-priority"), 11, s("x"), 0)
	seed(1, 0, 0, k("x-max-priority"), 7, i(256))
	seed(1, 0, 0, k("x-expires"), 1, i(0))
	seed(1, 0, 0, k("x-consumer-timeout"), 1, i(0))
	seed(1, 0, 0, k("x-delivery-limit"), 1, i(-2))
	// A routing key without an exchange, then with one.
	seed(1, 0, 0, k("x-dead-letter-routing-key"), 11, s("x"), 0)
	seed(2, 0, 0, k("x-dead-letter-routing-key"), 11, s("x"), 0, 10, s("amq.direct"), s(""))
	// Typed options: invalid MessageTTL(1 ns) overridden by Arguments; MaxPriority(0);
	// ExclusiveTo(nil) then ExclusiveTo(ctx); Durable; a 255 priority queue.
	seed(2, 3, 2, 0, 0, k("x-message-ttl"), 1, i(3), 2)
	seed(1, 8, 1)
	seed(2, 13, 0, 13, 1)
	seed(2, 12, 0, 13, 1, 2, 200)
	seed(1, 8, 6, 1, 255)
	// Others: kept, not compared; "exclusive" as an argument overriding ExclusiveTo(nil).
	seed(2, 0, 1, k("x-foo"), 1, i(1), k("x-queue-mode"), 9, i(1), 0, 0, k("x-consumer-timeout"), 8, i(1<<32-1))
	seed(2, 0, 1, k("x-foo"), 1, i(1), k("x-queue-type"), 11, s("quorum"), 0, 0, k("x-consumer-timeout"), 8, i(1<<32-1))
	// A NaN where any value is accepted, and compared: the declaration can be repeated.
	seed(1, 0, 0, k("x-queue-type"), 13, 3)
	seed(2, 13, 0, 0, 0, k("exclusive"), 12, 1)
	fzRandomSeeds(f, 2, 40, 40)

	f.Fuzz(func(t *testing.T, data []byte) {
		synctest.Test(t, func(t *testing.T) {
			owner, endOwner := context.WithCancel(context.Background())
			defer endOwner()
			opts, ref, bodyLen, prio := fzQueueInput(data, owner)
			cfg, wantErr := refQueueDecl(ref)
			desc := strings.Join(ref.desc, ", ")
			b := warren.New()
			defer b.Close()

			q, err := b.DeclareQueue("fq", opts...)
			if wantErr != nil {
				require.Error(t, err, "DeclareQueue(%s) = nil, want an error wrapping %v", desc, wantErr)
				require.ErrorIs(t, err, wantErr, "DeclareQueue(%s)", desc)
				requireOnePrefix(t, err)
				_, err := b.DeclareQueue("fq", warren.Durable(), warren.AutoDelete())
				require.NoError(t, err, "a failed declaration left a queue behind")
				return
			}
			require.NoError(t, err, "DeclareQueue(%s)", desc)

			// Equivalence: the same declaration again returns the queue (with a NaN among
			// its arguments too); a bare one is refused if the declaration has flags or
			// compared arguments.
			q2, err := b.DeclareQueue("fq", opts...)
			require.NoError(t, err, "DeclareQueue(%s) again", desc)
			require.Same(t, q, q2, "the queue declared again")
			_, err = b.DeclareQueue("fq")
			switch {
			case ref.exclusive:
				require.ErrorIs(t, err, warren.ErrResourceLocked, "bare DeclareQueue of a queue exclusive to %s", desc)
			case ref.durable || ref.autoDel || slices.ContainsFunc(fzComparedArgs, func(k string) bool { _, ok := ref.args[k]; return ok }):
				require.ErrorIs(t, err, warren.ErrPreconditionFailed, "bare DeclareQueue of a queue declared with %s", desc)
			default:
				require.NoError(t, err, "bare DeclareQueue of a queue declared with %s (nothing compared)", desc)
			}

			// The queue works as its limits say.
			ctx := owner
			msg := warren.Message{Body: []byte("abc")[:bodyLen], Priority: prio}
			fits := cfg.maxBytes < 0 || int64(bodyLen) <= cfg.maxBytes // ever
			room := cfg.maxLen != 0 && fits
			if !room && cfg.overflow == "block" && fits {
				// Block waits for room (Block's doc): none comes, so its context ends.
				pctx, cancel := context.WithTimeout(ctx, 500*time.Microsecond) // within the shortest x-expires
				err := b.Publish(pctx, "", "fq", msg)
				cancel()
				require.ErrorIs(t, err, context.DeadlineExceeded, "publish to a full Block queue (%s)", desc)
				require.Zero(t, q.Len())
				return
			}
			err = b.Publish(ctx, "", "fq", msg)
			switch {
			case !room && cfg.overflow != "drop-head":
				// Refused; by Block too, at once, for a body over the byte limit (Block's doc).
				require.ErrorIs(t, err, warren.ErrQueueFull, "publish a %d-byte body to a queue with %s", bodyLen, desc)
				require.Zero(t, q.Len())
				return
			case !room || cfg.ttl == 0:
				// Dropped from the head at once, or expired at once (no consumer): dead letters
				// can only come back here, where they close a cycle and are dropped.
				require.NoError(t, err, "publish (%s)", desc)
				require.Zero(t, q.Len(), "a message that must have been dropped or expired (%s)", desc)
				return
			}
			require.NoError(t, err, "publish (%s)", desc)
			require.Equal(t, 1, q.Len(), "the published message (%s)", desc)
			d, err := q.Get(ctx)
			require.NoError(t, err, "Get (%s)", desc)
			require.Equal(t, msg.Body, d.Message.Body)
			require.Equal(t, prio, d.Message.Priority)
			require.Equal(t, 0, d.DeliveryCount)
			require.NoError(t, d.Nack())
			if cfg.deliveryLimit == 0 {
				require.Zero(t, q.Len(), "a message returned once with delivery limit 0 (%s)", desc)
				return
			}
			require.Equal(t, 1, q.Len(), "the nacked message (%s)", desc)
			d, err = q.Get(ctx)
			require.NoError(t, err, "Get after Nack (%s)", desc)
			require.True(t, d.Redelivered)
			require.Equal(t, 1, d.DeliveryCount)
			require.NoError(t, d.Ack())
			require.Zero(t, q.Len())
			require.Zero(t, q.Unacked())
		})
	})
}

// ---------------------------------------------------------------------------------------------
// FuzzExpiration.

// refExpiration is the naive reference of Message.Expiration (R3.2, parseExpiration's doc): ""
// is none; otherwise the string must be ASCII decimal digits (no sign, no space) for a number of
// milliseconds from 0 to 2^32-1.
func refExpiration(s string) (ms int64, none, ok bool) {
	if s == "" {
		return 0, true, true
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false, false
		}
		ms = ms*10 + int64(c-'0')
		if ms > 1<<32-1 {
			return 0, false, false
		}
	}
	return ms, false, true
}

func FuzzExpiration(f *testing.F) {
	for _, s := range []string{"", "0", "1", "2", "10", "100", "60000", "007", "4294967295", "4294967296",
		"-1", "+5", " 5", "5 ", "1.5", "1e3", "0x10", "1_000", "abc", "10000foobar", "٣", "00000000000000000000001",
		"18446744073709551616", "99999999999999999999999"} {
		for _, qttl := range []int64{-1, 0, 5, 1 << 31} {
			f.Add(s, qttl)
		}
	}
	f.Fuzz(func(t *testing.T, exp string, qttl int64) {
		ms, none, ok := refExpiration(exp)
		if qttl >= 0 {
			qttl %= 1 << 32 // a valid queue TTL, in ms
		}
		synctest.Test(t, func(t *testing.T) {
			ctx := t.Context()
			b := warren.New()
			defer b.Close()
			var (
				mu  sync.Mutex
				evs []string // what left which queue, and when
			)
			events := func() string {
				mu.Lock()
				defer mu.Unlock()
				return strings.Join(evs, "; ")
			}
			start := time.Now()
			stop := b.Listen(func(e warren.Event) {
				switch e.Kind {
				case warren.EventExpired, warren.EventDeadLettered, warren.EventDropped, warren.EventAcked:
					mu.Lock()
					evs = append(evs, fmt.Sprintf("%s %s(%s) at %v", e.Queue, e.Kind, e.Reason, time.Since(start)))
					mu.Unlock()
				}
			})
			defer stop()
			_, err := b.DeclareExchange("fx", warren.ExchangeFanout)
			require.NoError(t, err)
			// plain: no queue TTL; ttl: the queue TTL qttl (if any); dl: dead-letters to dead.
			queues := map[string]*warren.Queue{}
			deadlines := map[string]time.Duration{} // from publication; absent for none
			for _, name := range []string{"plain", "ttl", "dl"} {
				var opts []warren.QueueOption
				switch name {
				case "ttl":
					if qttl >= 0 {
						opts = append(opts, warren.MessageTTL(time.Duration(qttl)*time.Millisecond))
					}
				case "dl":
					opts = append(opts, warren.DeadLetter("", "dead"))
				}
				q, err := b.DeclareQueue(name, opts...)
				require.NoError(t, err)
				require.NoError(t, b.Bind(name, "fx", "", nil))
				queues[name] = q
				if !none {
					deadlines[name] = time.Duration(ms) * time.Millisecond
				}
				if name == "ttl" && qttl >= 0 && (none || qttl < ms) {
					deadlines[name] = time.Duration(qttl) * time.Millisecond
				}
			}
			dead, err := b.DeclareQueue("dead")
			require.NoError(t, err)

			err = b.Publish(ctx, "fx", "", warren.Message{Body: []byte("m"), Expiration: exp})
			if !ok {
				require.Error(t, err, "Publish with Expiration %q = nil, want an error wrapping ErrPreconditionFailed", exp)
				require.ErrorIs(t, err, warren.ErrPreconditionFailed, "Publish with Expiration %q", exp)
				for name, q := range queues {
					require.Zero(t, q.Len(), "queue %s after a refused publish", name)
				}
				require.Empty(t, events())
				return
			}
			require.NoError(t, err, "Publish with Expiration %q", exp)

			// Check each queue 1 ns before and at every deadline, in time order, and an hour
			// after the last: present before its own deadline, gone from it on.
			var checks []time.Duration
			for _, d := range deadlines {
				checks = append(checks, d-1, d)
			}
			slices.Sort(checks)
			nacks := 0 // of the message in dl
			checks = append(slices.Compact(checks), slices.Max(append(checks, 0))+time.Hour)
			for _, at := range checks {
				if at < 0 {
					continue
				}
				if wait := at - time.Since(start); wait > 0 {
					time.Sleep(wait)
				}
				synctest.Wait()
				for name, q := range queues {
					d, has := deadlines[name]
					want := 0
					if !has || at < d {
						want = 1
					}
					require.Equal(t, want, q.Len(), "queue %s at %v: Expiration %q, queue TTL %d ms; events: %s", name, at, exp, qttl, events())
					if want == 1 && name == "dl" {
						// Get takes it until its deadline, and a Nack returns it with that deadline.
						dv, err := q.Get(ctx)
						require.NoError(t, err)
						require.Equal(t, exp, dv.Message.Expiration, "the delivered message's Expiration")
						require.Equal(t, nacks, dv.DeliveryCount)
						require.Equal(t, nacks > 0, dv.Redelivered)
						require.NoError(t, dv.Nack())
						nacks++
						require.Equal(t, 1, q.Len())
					}
				}
			}
			if _, has := deadlines["dl"]; !has {
				require.Zero(t, dead.Len())
				return
			}
			dv, err := dead.Get(ctx)
			require.NoError(t, err, "the dead letter of dl; events: %s", events())
			require.Equal(t, "", dv.Message.Expiration, "dead-lettering removes Expiration")
			deaths := dv.Message.Deaths()
			require.Len(t, deaths, 1)
			require.Equal(t, warren.ReasonExpired, deaths[0].Reason)
			require.Equal(t, exp, deaths[0].OriginalExpiration)
			require.NoError(t, dv.Ack())
		})
	})
}

// ---------------------------------------------------------------------------------------------
// FuzzQueueDurations: every duration that meets a queue's clock.

// fdDurations are the durations FuzzQueueDurations draws: 0, the smallest, short ones a run
// waits for, the edges of RabbitMQ's 2^32-1 ms, and the huge and negative ones, up to the
// largest Duration, that once overflowed the queue's clock.
var fdDurations = []time.Duration{
	0, 1, 2, time.Millisecond - 1, time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond,
	10 * time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond, time.Second, time.Minute,
	(1<<32 - 2) * time.Millisecond, (1<<32 - 1) * time.Millisecond, (1 << 32) * time.Millisecond,
	1<<62 - 1, 1 << 62, math.MaxInt64 - time.Second, math.MaxInt64 - time.Microsecond, math.MaxInt64 - 1, math.MaxInt64,
	-1, -time.Millisecond, math.MinInt64,
}

// fdExpirations are the Message.Expiration values drawn; the last is refused.
var fdExpirations = []string{"", "0", "1", "2", "10", "20", "1000", "4294967294", "4294967295", "4294967296"}

// fdConsumerTimeouts are the "x-consumer-timeout" values drawn, in ms (nil for none); the last
// is refused.
var fdConsumerTimeouts = []any{nil, int64(1), int64(5), int64(20), int64(1<<32 - 1), int64(1 << 32)}

// fdNever is a duration no run lives to see pass: a run waits at most 64+64 times, each for at
// most 2^32 ms (about 50 days), some 17 years in all. Every drawn duration is either below 2^33
// ms or at least 1<<62-1 ns, so the reference needs no arithmetic near the overflow it checks.
const fdNever = time.Duration(1 << 61)

// fdMaxOps bounds the operations of one input.
const fdMaxOps = 64

// Reference states of a message.
const (
	fdReady    = iota
	fdHidden   // delayed: DeliverAfter or NackWithDelay, until due
	fdGot      // held by a Get, until it is settled or its consumer timeout (due) takes it back
	fdConsumed // held by a consumer, until its ack timeout is due
	fdGone
)

// fdMsg is the reference's message: times are since the run's start (the queue's declaration),
// -1 for none or never.
type fdMsg struct {
	seq      int
	state    int
	deadline time.Duration
	due      time.Duration // fdHidden, fdConsumed
	d        warren.Delivery
}

func (m *fdMsg) String() string {
	if m == nil {
		return "none"
	}
	return "#" + strconv.Itoa(m.seq)
}

// fdAt returns when a wait of d > 0 that starts at now ends, or -1 for never within a run.
func fdAt(now, d time.Duration) time.Duration {
	if d >= fdNever {
		return -1
	}
	return now + d
}

// fdHarness runs one input against a queue and the reference.
type fdHarness struct {
	t        *testing.T
	b        *warren.Broker
	q        *warren.Queue
	start    time.Time
	ttl      time.Duration // the queue's message TTL; -1 for none
	ackDef   time.Duration // the queue's x-consumer-timeout; 0 for none
	ageNever bool          // no age alert may fire in a run (a short threshold is not checked: see run)
	msgs     []*fdMsg
	got      []*fdMsg // held by Gets, oldest first
	expired  uint64
	acked    uint64
	history  []string

	mu        sync.Mutex
	ageAlerts int
}

func (h *fdHarness) now() time.Duration { return time.Since(h.start) }

func (h *fdHarness) logf(format string, args ...any) {
	h.history = append(h.history, fmt.Sprintf("%v: ", h.now())+fmt.Sprintf(format, args...))
}

// failf fails the run with the operations so far.
func (h *fdHarness) failf(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("%s\nhistory:\n  %s", fmt.Sprintf(format, args...), strings.Join(h.history, "\n  "))
}

// advanceRef moves the reference to time at: a ready message expires at its deadline; a hidden
// or consumed one comes back at its due time, expired if its deadline passed by then.
func (h *fdHarness) advanceRef(at time.Duration) {
	for _, m := range h.msgs {
		for {
			if m.state == fdReady && m.deadline >= 0 && m.deadline <= at {
				m.state = fdGone
				h.expired++
				break
			}
			if (m.state == fdHidden || m.state == fdConsumed || m.state == fdGot) && m.due >= 0 && m.due <= at {
				m.state = fdReady
				if m.deadline >= 0 && m.deadline <= m.due {
					m.state = fdGone
					h.expired++
					break
				}
				continue
			}
			break
		}
	}
}

// next returns when the reference next changes by itself.
func (h *fdHarness) next() (time.Duration, bool) {
	at, ok := time.Duration(0), false
	for _, m := range h.msgs {
		t := time.Duration(-1)
		switch m.state {
		case fdReady:
			t = m.deadline
		case fdHidden, fdConsumed, fdGot:
			t = m.due
		}
		if t >= 0 && (!ok || t < at) {
			at, ok = t, true
		}
	}
	return at, ok
}

// head returns the first ready message in queue order, or nil.
func (h *fdHarness) head() *fdMsg {
	for _, m := range h.msgs { // in seq order
		if m.state == fdReady {
			return m
		}
	}
	return nil
}

// sleepTo waits until at, if it is later, and moves the reference there.
func (h *fdHarness) sleepTo(at time.Duration) {
	if wait := at - h.now(); wait > 0 {
		time.Sleep(wait)
	}
	h.advanceRef(at)
}

// check compares the queue with the reference once everything due now has run.
func (h *fdHarness) check(what string) {
	h.t.Helper()
	synctest.Wait()
	var ready []string
	delayed, held := 0, 0
	for _, m := range h.msgs {
		switch m.state {
		case fdReady:
			ready = append(ready, strconv.Itoa(m.seq))
		case fdHidden:
			delayed++
		case fdGot, fdConsumed:
			held++
		}
	}
	if got := browse(h.q); !slices.Equal(got, ready) {
		h.failf("%s at %v: ready %v, want %v", what, h.now(), got, ready)
	}
	s := h.q.Stats()
	if s.Delayed != delayed || s.Unacked != held || s.Expired != h.expired || s.Acked != h.acked {
		h.failf("%s at %v: Stats() Delayed %d, Unacked %d, Expired %d, Acked %d; want %d, %d, %d, %d",
			what, h.now(), s.Delayed, s.Unacked, s.Expired, s.Acked, delayed, held, h.expired, h.acked)
	}
	h.mu.Lock()
	n := h.ageAlerts
	h.mu.Unlock()
	if h.ageNever && n > 0 {
		h.failf("%s at %v: %d age alerts, want none: the age threshold is 0 or beyond the run", what, h.now(), n)
	}
}

// toNext waits until 1 ns before the reference's next change and checks nothing changed, then
// until the change and checks it happened: every deadline and due time is met to the
// nanosecond. It returns false if nothing will change.
func (h *fdHarness) toNext() bool {
	at, ok := h.next()
	if !ok {
		return false
	}
	h.logf("advance to %v", at)
	if at-1 > h.now() {
		h.sleepTo(at - 1)
		h.check("1 ns before the next deadline")
	}
	h.sleepTo(at)
	h.check("at the next deadline")
	return true
}

// declare declares queue q with the configuration bytes' TTL, age threshold and consumer
// timeout; a refused one must be refused with its sentinel, and the queue is then declared
// without it.
func (h *fdHarness) declare(in *fzBytes) {
	var all, valid []warren.QueueOption
	var refused []error
	h.start = time.Now() // the queue's epoch too: nothing runs in the bubble meanwhile
	h.ttl = -1
	if c := in.intn(len(fdDurations) + 1); c > 0 {
		d := fdDurations[c-1]
		all = append(all, warren.MessageTTL(d))
		if d < 0 || d > (1<<32-1)*time.Millisecond || d%time.Millisecond != 0 {
			refused = append(refused, warren.ErrInvalidArgument)
		} else {
			valid = append(valid, warren.MessageTTL(d))
			h.ttl = d
		}
	}
	h.ageNever = true
	if c := in.intn(len(fdDurations) + 1); c > 0 {
		a := warren.Alerts{Age: fdDurations[c-1]}
		all = append(all, warren.WithAlerts(a))
		if a.Age < 0 {
			refused = append(refused, warren.ErrInvalidArgument)
		} else {
			valid = append(valid, warren.WithAlerts(a))
			h.ageNever = a.Age == 0 || a.Age >= fdNever
		}
	}
	if v := fdConsumerTimeouts[in.intn(len(fdConsumerTimeouts))]; v != nil {
		opt := warren.Arguments(warren.Table{"x-consumer-timeout": v})
		all = append(all, opt)
		if ms := v.(int64); ms > 1<<32-1 {
			refused = append(refused, warren.ErrPreconditionFailed)
		} else {
			valid = append(valid, opt)
			h.ackDef = time.Duration(ms) * time.Millisecond
		}
	}
	h.logf("declare: TTL %v, age never %v, consumer timeout %v, refused %v", h.ttl, h.ageNever, h.ackDef, refused)
	if len(refused) > 0 {
		_, err := h.b.DeclareQueue("q", all...)
		if err == nil || !slices.ContainsFunc(refused, func(e error) bool { return errors.Is(err, e) }) {
			h.failf("DeclareQueue with an invalid option = %v, want an error wrapping one of %v", err, refused)
		}
	}
	q, err := h.b.DeclareQueue("q", valid...)
	if err != nil {
		h.failf("DeclareQueue = %v", err)
	}
	h.q = q
}

// run decodes and runs the operations, then waits through every deadline left in the run.
//
// Age alerts are checked only where none may fire: the age a threshold watches comes from
// arrival stamps (stats.go), which a message coming back restamps, and a reference this naive
// does not follow them. A short threshold still takes part: its due time shares the queue's
// timer with everything checked.
func (h *fdHarness) run(in *fzBytes) {
	ctx := h.t.Context()
	for range fdMaxOps {
		if len(in.b) == 0 {
			break
		}
		kind, a, b := in.intn(8), in.byte(), in.byte()
		switch kind {
		case 0, 1: // publish, maybe delayed, maybe with an expiration
			delay, exp := fdDurations[int(a)%len(fdDurations)], fdExpirations[int(b)%len(fdExpirations)]
			h.logf("publish #%d DeliverAfter(%v) Expiration %q", len(h.msgs), delay, exp)
			err := h.b.Publish(ctx, "", "q", warren.Message{Body: []byte(strconv.Itoa(len(h.msgs))), Expiration: exp},
				warren.DeliverAfter(delay))
			ms, none, ok := refExpiration(exp)
			if !ok {
				if !errors.Is(err, warren.ErrPreconditionFailed) {
					h.failf("Publish with Expiration %q = %v, want an error wrapping ErrPreconditionFailed", exp, err)
				}
				break
			}
			if err != nil {
				h.failf("Publish = %v", err)
			}
			now := h.now()
			ttl := h.ttl
			if !none && (ttl < 0 || time.Duration(ms)*time.Millisecond < ttl) {
				ttl = time.Duration(ms) * time.Millisecond
			}
			m := &fdMsg{seq: len(h.msgs), state: fdReady, deadline: -1}
			if ttl >= 0 {
				m.deadline = now + ttl
			}
			switch {
			case delay > 0:
				m.state, m.due = fdHidden, fdAt(now, delay)
			case ttl == 0: // no consumer has credit: it expires at once
				m.state = fdGone
				h.expired++
			}
			h.msgs = append(h.msgs, m)
		case 2: // Get
			m := h.head()
			h.logf("Get: want %v", m)
			d, err := h.q.Get(ctx)
			if m == nil {
				if !errors.Is(err, warren.ErrEmpty) {
					h.failf("Get from an empty queue = %v, want ErrEmpty", err)
				}
				break
			}
			if err != nil || string(d.Message.Body) != strconv.Itoa(m.seq) {
				h.failf("Get = %v, %v; want #%d", d, err, m.seq)
			}
			m.state, m.d, m.due = fdGot, d, -1
			if h.ackDef > 0 { // the queue's consumer timeout applies to Gets too
				m.due = fdAt(h.now(), h.ackDef)
			}
			h.got = append(h.got, m)
		case 3, 4: // settle a Get's delivery: NackWithDelay, or Ack
			if len(h.got) == 0 {
				h.logf("settle: no Get holds a delivery")
				break
			}
			i := int(a) % len(h.got)
			m := h.got[i]
			h.got = slices.Delete(h.got, i, i+1)
			if m.state != fdGot { // the consumer timeout took it back
				h.logf("settle #%d: taken back by the consumer timeout", m.seq)
				if err := m.d.Ack(); !errors.Is(err, warren.ErrAlreadySettled) {
					h.failf("Ack #%d after its consumer timeout = %v, want ErrAlreadySettled", m.seq, err)
				}
				break
			}
			if kind == 4 {
				h.logf("Ack #%d", m.seq)
				if err := m.d.Ack(); err != nil {
					h.failf("Ack #%d = %v", m.seq, err)
				}
				m.state = fdGone
				h.acked++
				break
			}
			delay := fdDurations[int(b)%len(fdDurations)]
			h.logf("NackWithDelay(%v) #%d", delay, m.seq)
			if err := m.d.NackWithDelay(delay); err != nil {
				h.failf("NackWithDelay(%v) #%d = %v", delay, m.seq, err)
			}
			now := h.now()
			switch {
			case m.deadline >= 0 && m.deadline <= now:
				m.state = fdGone
				h.expired++
			case delay > 0:
				m.state, m.due = fdHidden, fdAt(now, delay)
			default:
				m.state = fdReady
			}
		case 5: // a consumer takes the head and holds it until its ack timeout, if any
			m := h.head()
			if m == nil {
				h.logf("Consume: nothing ready to hold")
				break
			}
			opts := []warren.ConsumeOption{warren.Prefetch(1)}
			timeout := h.ackDef
			if c := int(a) % (len(fdDurations) + 1); c < len(fdDurations) {
				d := fdDurations[c]
				opts = append(opts, warren.AckTimeout(d))
				timeout = max(d, 0)
			}
			h.logf("Consume with ack timeout %v: takes #%d", timeout, m.seq)
			if _, err := h.q.Consume(ctx, opts...); err != nil {
				h.failf("Consume = %v", err)
			}
			m.state, m.due = fdConsumed, -1
			if timeout > 0 {
				m.due = fdAt(h.now(), timeout)
			}
		case 6: // wait a little
			h.logf("sleep %d ms", b)
			h.sleepTo(h.now() + time.Duration(b)*time.Millisecond)
		case 7:
			h.toNext()
			continue // checked
		}
		h.check(h.history[len(h.history)-1])
	}
	for range fdMaxOps {
		if !h.toNext() {
			break
		}
	}
}

// FuzzQueueDurations decodes the fuzz input (three bytes of configuration: the queue's message
// TTL, age threshold and consumer timeout; then three per operation: kind, a, b) into publishes
// with DeliverAfter and Expiration, Gets settled by NackWithDelay or Ack, and consumers holding a
// delivery until their ack timeout, with durations from 0 to the largest Duration and negative
// ones, and compares the queue with a reference in which a duration too long to pass in the run
// never does. It waits to 1 ns before and to every deadline and due time: however huge the other
// durations, each short one is met on time, and a huge one is never met.
func FuzzQueueDurations(f *testing.F) {
	dur := func(d time.Duration) byte { return fzIdx(fdDurations, d) }
	exp := func(s string) byte { return fzIdx(fdExpirations, s) }
	cfg := func(ttl, age time.Duration, consumerTimeout any) []byte {
		b := []byte{0, 0, fzIdx(fdConsumerTimeouts, consumerTimeout)}
		if ttl >= 0 {
			b[0] = dur(ttl) + 1
		}
		if age >= 0 {
			b[1] = dur(age) + 1
		}
		return b
	}
	const none = -1
	pub := func(delay time.Duration, e string) []byte { return []byte{0, dur(delay), exp(e)} }
	get := []byte{2, 0, 0}
	nack := func(delay time.Duration) []byte { return []byte{3, 0, dur(delay)} }
	consume := func(timeout time.Duration) []byte { return []byte{5, dur(timeout), 0} }
	next := []byte{7, 0, 0}
	seed := func(parts ...[]byte) { f.Add(slices.Concat(parts...)) }

	// A DeliverAfter(MaxInt64) message, then one with a 20 ms TTL: it expires at 20 ms.
	seed(cfg(none, none, nil), []byte{6, 0, 1}, pub(math.MaxInt64, ""), pub(0, "20"), next, next)
	seed(cfg(20*time.Millisecond, none, nil), []byte{6, 0, 1}, pub(math.MaxInt64-time.Microsecond, "1000"), pub(0, ""), next)
	// NackWithDelay(MaxInt64), then a DeliverAfter(10 ms): promoted at 10 ms.
	seed(cfg(none, none, nil), pub(0, ""), []byte{6, 0, 1}, get, nack(math.MaxInt64), pub(10*time.Millisecond, ""), next)
	seed(cfg(none, none, nil), pub(0, ""), []byte{6, 0, 1}, get, nack(math.MaxInt64-1), pub(10*time.Millisecond, "20"), next)
	// An age threshold of MaxInt64 (and MaxInt64-1) beside a 20 ms TTL and a 10 ms delay.
	seed(cfg(20*time.Millisecond, math.MaxInt64, nil), pub(0, ""), pub(10*time.Millisecond, ""), next, next, next)
	seed(cfg(none, math.MaxInt64-1, nil), pub(0, ""), []byte{6, 0, 1}, pub(10*time.Millisecond, ""), pub(0, "20"), next, next)
	// A consumer with AckTimeout(MaxInt64) holding one, and a 20 ms TTL beside it.
	seed(cfg(none, 5*time.Millisecond, nil), pub(0, ""), consume(math.MaxInt64), pub(0, "20"), next, next)
	// Near 2^32-1 ms: a TTL of 2^32-1 ms beside a huge delay and a consumer timeout of 2^32-1 ms.
	seed(cfg((1<<32-1)*time.Millisecond, none, int64(1<<32-1)), pub(math.MaxInt64-time.Second, ""),
		pub((1<<32)*time.Millisecond, "4294967294"), pub(0, ""), consume(math.MinInt64), []byte{5, byte(len(fdDurations)), 0},
		pub(0, "4294967295"), next, next, next)
	// Negative and zero: DeliverAfter and NackWithDelay of MinInt64 and -1 are no delay;
	// AckTimeout(-1) none; TTL 0 with a delay expires at its due time.
	seed(cfg(none, 1, int64(5)), pub(math.MinInt64, ""), pub(-1, "0"), pub(time.Millisecond, "0"), get, nack(math.MinInt64),
		get, nack(-1), consume(-1), consume(0), []byte{5, byte(len(fdDurations)), 0}, next, next)
	// Refused: a TTL of 2^32 ms, a negative age, an x-consumer-timeout of 2^32 ms, an
	// Expiration of 2^32.
	seed(cfg((1<<32)*time.Millisecond, -time.Millisecond, int64(1<<32)), pub(0, "4294967296"), pub(0, "1"), next)
	seed(cfg(1, math.MinInt64, nil), pub(0, "2"), next)
	fzRandomSeeds(f, 0x5eed_d0e5, 24, 3+3*24)
	f.Fuzz(func(t *testing.T, data []byte) {
		synctest.Test(t, func(t *testing.T) {
			b := warren.New()
			defer b.Close()
			h := &fdHarness{t: t, b: b}
			stop := b.Listen(func(e warren.Event) {
				if e.Kind == warren.EventAlert && e.Reason == warren.AlertAge {
					h.mu.Lock()
					h.ageAlerts++
					h.mu.Unlock()
				}
			})
			defer stop()
			in := &fzBytes{b: data}
			h.declare(in)
			h.run(in)
		})
	})
}

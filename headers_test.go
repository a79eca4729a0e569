package warren

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseHeadersBinding(t *testing.T) {
	tests := []struct {
		name     string
		args     Table
		wantAny  bool
		wantKeys []string // the considered keys, sorted
	}{
		{"nil args", nil, false, nil},
		{"empty args", Table{}, false, nil},
		{"x-match absent is all", Table{"b": 1, "a": 2}, false, []string{"a", "b"}},
		{"all", Table{"x-match": "all", "a": 1}, false, []string{"a"}},
		{"any", Table{"x-match": "any", "a": 1}, true, []string{"a"}},
		{"all drops x- keys", Table{"x-match": "all", "a": 1, "x-b": 2}, false, []string{"a"}},
		{"any drops x- keys", Table{"x-match": "any", "x-b": 2}, true, nil},
		{"absent drops x- keys", Table{"x-b": 2, "xb": 3, "X-c": 4}, false, []string{"X-c", "xb"}},
		{"all-with-x keeps x- keys", Table{"x-match": "all-with-x", "a": 1, "x-b": 2}, false, []string{"a", "x-b"}},
		{"any-with-x keeps x- keys", Table{"x-match": "any-with-x", "x-b": 2}, true, []string{"x-b"}},
		{"with-x still drops x-match", Table{"x-match": "any-with-x"}, true, nil},
		{"nil value kept", Table{"a": nil}, false, []string{"a"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := parseHeadersBinding(tc.args)
			require.NoError(t, err, "parseHeadersBinding(%v)", tc.args)
			assert.Equal(t, tc.wantAny, h.matchAny, "parseHeadersBinding(%v).matchAny", tc.args)
			var keys []string
			for _, a := range h.args {
				keys = append(keys, a.key)
			}
			assert.Equal(t, tc.wantKeys, keys, "parseHeadersBinding(%v): considered keys", tc.args)
		})
	}
}

func TestParseHeadersBindingInvalid(t *testing.T) {
	for _, v := range []any{
		"", "ALL", "Any", "none", "all ", "all-with-X", "with-x",
		[]byte("all"), 1, true, nil, Table{"all": nil}, []any{"all"},
	} {
		t.Run(fmt.Sprintf("%T(%v)", v, v), func(t *testing.T) {
			args := Table{"x-match": v, "a": 1}
			_, err := parseHeadersBinding(args)
			require.Error(t, err, "parseHeadersBinding(%v)", args)
			assert.True(t, errors.Is(err, ErrPreconditionFailed), "parseHeadersBinding(%v) = %v, want an error wrapping ErrPreconditionFailed", args, err)
			assert.Contains(t, err.Error(), "warren: headers binding: x-match")
		})
	}
}

func TestHeadersMatch(t *testing.T) {
	tests := []struct {
		name    string
		args    Table
		headers Table
		want    bool
	}{
		// all (also the default)
		{"all: every argument equal", Table{"x-match": "all", "a": "x", "b": 2}, Table{"a": "x", "b": 2}, true},
		{"default is all", Table{"a": "x", "b": 2}, Table{"a": "x"}, false},
		{"all: one missing", Table{"x-match": "all", "a": "x", "b": 2}, Table{"a": "x"}, false},
		{"all: one different", Table{"x-match": "all", "a": "x", "b": 2}, Table{"a": "x", "b": 3}, false},
		{"all: extra headers ignored", Table{"a": "x"}, Table{"a": "x", "c": "y", "x-d": 1}, true},
		{"all: nil headers", Table{"a": "x"}, nil, false},

		// any
		{"any: one equal", Table{"x-match": "any", "a": "x", "b": 2}, Table{"b": 2}, true},
		{"any: one equal one different", Table{"x-match": "any", "a": "x", "b": 2}, Table{"a": "y", "b": 2}, true},
		{"any: none equal", Table{"x-match": "any", "a": "x", "b": 2}, Table{"a": "y", "b": 3}, false},
		{"any: none present", Table{"x-match": "any", "a": "x"}, Table{"c": "x"}, false},
		{"any: nil headers", Table{"x-match": "any", "a": "x"}, nil, false},

		// Bindings with no considered arguments.
		{"all: no arguments, nil headers", Table{}, nil, true},
		{"all: nil arguments, some headers", nil, Table{"a": 1}, true},
		{"explicit all: no arguments", Table{"x-match": "all"}, nil, true},
		{"all-with-x: no arguments", Table{"x-match": "all-with-x"}, Table{"a": 1}, true},
		{"any: no arguments", Table{"x-match": "any"}, Table{"a": 1}, false},
		{"any: no arguments, nil headers", Table{"x-match": "any"}, nil, false},
		{"any-with-x: no arguments", Table{"x-match": "any-with-x"}, Table{"x-match": "any-with-x"}, false},
		{"all: only x- arguments", Table{"x-a": 1}, nil, true},
		{"any: only x- arguments", Table{"x-match": "any", "x-a": 1}, Table{"x-a": 1}, false},

		// x- arguments
		{"all: x- argument ignored", Table{"a": 1, "x-b": 2}, Table{"a": 1}, true},
		{"all: x- argument ignored even if different", Table{"a": 1, "x-b": 2}, Table{"a": 1, "x-b": 3}, true},
		{"all-with-x: x- argument missing", Table{"x-match": "all-with-x", "a": 1, "x-b": 2}, Table{"a": 1}, false},
		{"all-with-x: x- argument equal", Table{"x-match": "all-with-x", "a": 1, "x-b": 2}, Table{"a": 1, "x-b": 2}, true},
		{"any: only the x- argument equal", Table{"x-match": "any", "a": 1, "x-b": 2}, Table{"x-b": 2}, false},
		{"any-with-x: x- argument equal", Table{"x-match": "any-with-x", "a": 1, "x-b": 2}, Table{"x-b": 2}, true},
		{"any-with-x: dead-letter reason", Table{"x-match": "any-with-x", "x-first-death-reason": "expired"}, Table{"x-first-death-reason": "expired"}, true},
		{"all-with-x: x-match not required in headers", Table{"x-match": "all-with-x", "a": 1}, Table{"a": 1}, true},
		{"any-with-x: x-match header does not match", Table{"x-match": "any-with-x", "a": 1}, Table{"x-match": "any-with-x"}, false},
		{"X- is not x-", Table{"X-b": 2}, Table{}, false},

		// nil argument: presence only
		{"all: nil argument, header present", Table{"a": nil}, Table{"a": "anything"}, true},
		{"all: nil argument, header nil", Table{"a": nil}, Table{"a": nil}, true},
		{"all: nil argument, header absent", Table{"a": nil}, Table{"b": 1}, false},
		{"all: nil argument, nil headers", Table{"a": nil}, nil, false},
		{"any: nil argument, header present", Table{"x-match": "any", "a": nil, "b": 1}, Table{"a": 0}, true},
		{"any: nil argument, header absent", Table{"x-match": "any", "a": nil, "b": 1}, Table{"b": 2}, false},
		{"all: value argument, header nil", Table{"a": 1}, Table{"a": nil}, false},

		// values
		{"int argument, int8 header", Table{"a": 1}, Table{"a": int8(1)}, true},
		{"int argument, int64 header", Table{"a": 1}, Table{"a": int64(1)}, true},
		{"int argument, uint16 header", Table{"a": 1}, Table{"a": uint16(1)}, true},
		{"int argument, float64 header", Table{"a": 1}, Table{"a": 1.0}, true},
		{"int argument, float32 header", Table{"a": 1}, Table{"a": float32(1)}, true},
		{"int argument, other number", Table{"a": 1}, Table{"a": int64(2)}, false},
		{"int argument, string header", Table{"a": 1}, Table{"a": "1"}, false},
		{"string argument, int header", Table{"a": "1"}, Table{"a": 1}, false},
		{"string argument, []byte header", Table{"a": "x"}, Table{"a": []byte("x")}, false},
		{"[]byte argument, []byte header", Table{"a": []byte("x")}, Table{"a": []byte("x")}, true},
		{"bool argument", Table{"a": true}, Table{"a": true}, true},
		{"bool argument, int header", Table{"a": true}, Table{"a": 1}, false},
		{"table argument", Table{"a": Table{"b": 1}}, Table{"a": Table{"b": int32(1)}}, true},
		{"array argument", Table{"a": []any{"x", 1}}, Table{"a": []any{"x", uint8(1)}}, true},
		{"keys are case-sensitive", Table{"Key": 1}, Table{"key": 1}, false},
		{"string values are case-sensitive", Table{"a": "X"}, Table{"a": "x"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := parseHeadersBinding(tc.args)
			require.NoError(t, err, "parseHeadersBinding(%v)", tc.args)
			if got := h.match(tc.headers); got != tc.want {
				t.Errorf("binding %v: match(%v) = %v, want %v", tc.args, tc.headers, got, tc.want)
			}
		})
	}
}

func TestHeadersBindingZeroValue(t *testing.T) {
	var h headersBinding
	assert.True(t, h.match(nil), "zero headersBinding: match(nil)")
	assert.True(t, h.match(Table{"a": 1}), "zero headersBinding: match({a: 1})")
}

func TestFieldEqual(t *testing.T) {
	instant := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	tests := []struct {
		a, b any
		want bool
	}{
		{nil, nil, true},
		{nil, 0, false},
		{nil, "", false},
		{nil, false, false},
		{nil, Table(nil), false},

		// numbers
		{1, 1, true},
		{1, 2, false},
		{int(1), int64(1), true},
		{int8(1), uint64(1), true},
		{int16(-3), int64(-3), true},
		{int32(7), uint(7), true},
		{uint8(7), uint32(7), true},
		{uint16(7), 7.0, true},
		{int8(-1), uint8(255), false},
		{int64(-1), uint64(math.MaxUint64), false},
		{int64(math.MaxInt64), uint64(math.MaxInt64), true},
		{1, 1.0, true},
		{1, float32(1), true},
		{float32(1), 1.0, true},
		{float32(0.5), 0.5, true},
		{float32(0.1), 0.1, false}, // float32 widened exactly: not the float64 nearest 0.1
		{1, 1.5, false},
		{-2, -2.0, true},
		{-2, 2.0, false},
		{0, math.Copysign(0, -1), true},
		{int64(1<<53 + 1), float64(1 << 53), false}, // no rounding through float64
		{int64(1 << 53), float64(1 << 53), true},
		{uint64(1 << 63), float64(1 << 63), true},
		{int64(math.MaxInt64), float64(1 << 63), false},
		{int64(math.MinInt64), float64(-(1 << 63)), true},
		{uint64(math.MaxUint64), float64(1 << 64), false},
		{uint64(math.MaxUint64), math.Inf(1), false},
		{int64(math.MinInt64), math.Inf(-1), false},
		{math.NaN(), math.NaN(), false},
		{math.Inf(1), math.Inf(1), true},
		{float32(2), float64(2), true},

		// strings and bytes
		{"a", "a", true},
		{"a", "A", false},
		{"", "", true},
		{"1", 1, false},
		{"1", 1.0, false},
		{"a", []byte("a"), false}, // longstr and byte array are different AMQP types
		{[]byte("a"), []byte("a"), true},
		{[]byte("a"), []byte("b"), false},
		{[]byte{}, []byte(nil), true},

		// bool, time, Decimal
		{true, true, true},
		{true, false, false},
		{true, 1, false},
		{false, 0, false},
		{instant, instant, true},
		{instant, instant.In(time.FixedZone("UTC+2", 2*60*60)), true},
		{instant, instant.Add(time.Second), false},
		{instant, instant.Unix(), false},
		{Decimal{Scale: 2, Value: 150}, Decimal{Scale: 2, Value: 150}, true},
		{Decimal{Scale: 2, Value: 150}, Decimal{Scale: 2, Value: 151}, false},
		{Decimal{Scale: 1, Value: 10}, Decimal{Scale: 0, Value: 1}, false},
		{Decimal{Scale: 0, Value: 1}, 1, false},

		// tables and arrays
		{Table{}, Table{}, true},
		{Table(nil), Table{}, true},
		{Table{"a": 1, "b": Table{"c": "x"}}, Table{"a": int64(1), "b": Table{"c": "x"}}, true},
		{Table{"a": 1}, map[string]any{"a": 1.0}, true},
		{Table{"a": 1}, Table{"a": 1, "b": 2}, false},
		{Table{"a": 1}, Table{"b": 1}, false},
		{Table{"a": nil}, Table{"a": nil}, true},
		{Table{"a": nil}, Table{"b": nil}, false},
		{Table{"a": "1"}, Table{"a": 1}, false},
		{Table{"a": Table{"b": []any{1}}}, Table{"a": Table{"b": []any{uint8(1)}}}, true},
		{Table{}, []any{}, false},
		{[]any{}, []any{}, true},
		{[]any{}, []any(nil), true},
		{[]any{1, "a", nil}, []any{int32(1), "a", nil}, true},
		{[]any{1, "a"}, []any{"a", 1}, false},
		{[]any{1}, []any{1, 1}, false},
		{[]any{"a"}, "a", false},

		// Not AMQP field values: never equal, and never a panic.
		{struct{}{}, struct{}{}, false},
		{[]int{1}, []int{1}, false},
		{map[string]int{}, map[string]int{}, false},
	}
	for _, tc := range tests {
		if got := fieldEqual(tc.a, tc.b); got != tc.want {
			t.Errorf("fieldEqual(%T(%v), %T(%v)) = %v, want %v", tc.a, tc.a, tc.b, tc.b, got, tc.want)
		}
		if got := fieldEqual(tc.b, tc.a); got != tc.want {
			t.Errorf("fieldEqual(%T(%v), %T(%v)) = %v, want %v (reversed)", tc.b, tc.b, tc.a, tc.a, got, tc.want)
		}
	}
}

func TestHeadersMatchDoesNotAllocate(t *testing.T) {
	h, err := parseHeadersBinding(Table{
		"x-match": "all-with-x",
		"a":       1,
		"b":       "text",
		"c":       nil,
		"d":       Table{"e": []any{1.0, "f"}},
		"x-g":     []byte("bytes"),
		"t":       time.Unix(1, 0),
	})
	require.NoError(t, err)
	headers := Table{"a": int64(1), "b": "text", "c": false, "d": Table{"e": []any{uint8(1), "f"}}, "x-g": []byte("bytes"), "t": time.Unix(1, 0), "z": 9}
	require.True(t, h.match(headers))
	allocs := testing.AllocsPerRun(100, func() {
		h.match(headers)
		h.match(nil)
	})
	if allocs != 0 {
		t.Errorf("match allocated %v times per run, want 0", allocs)
	}
}

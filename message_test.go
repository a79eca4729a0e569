package warren_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Table.Int reads every AMQP integer type, and nothing else.
func TestTableInt(t *testing.T) {
	tab := warren.Table{"i8": int8(-8), "u8": uint8(8), "i16": int16(-16), "u16": uint16(16), "i32": int32(-32),
		"u32": uint32(32), "i64": int64(-64), "int": 7, "s": "5", "f": 1.5, "nil": nil}
	for key, want := range map[string]int64{"i8": -8, "u8": 8, "i16": -16, "u16": 16, "i32": -32, "u32": 32, "i64": -64, "int": 7} {
		n, ok := tab.Int(key)
		require.True(t, ok, key)
		require.Equal(t, want, n, key)
	}
	for _, key := range []string{"s", "f", "nil", "missing"} {
		n, ok := tab.Int(key)
		require.False(t, ok, key)
		require.Zero(t, n, key)
	}
	var none warren.Table
	_, ok := none.Int("x")
	require.False(t, ok, "a nil table has nothing")
}

func TestDecimalString(t *testing.T) {
	for _, c := range []struct {
		d    warren.Decimal
		want string
	}{
		{warren.Decimal{}, "0"},
		{warren.Decimal{Value: 42}, "42"},
		{warren.Decimal{Scale: 2, Value: 12345}, "123.45"},
		{warren.Decimal{Scale: 2, Value: -5}, "-0.05"},
		{warren.Decimal{Scale: 3, Value: 5}, "0.005"},
		{warren.Decimal{Scale: 1, Value: -2147483648}, "-214748364.8"},
	} {
		require.Equal(t, c.want, c.d.String(), "%+v", c.d)
	}
}

// nestedHeaders returns headers whose innermost value, an int, is at depth: nested in depth
// tables (and arrays, every other level) below the headers.
func nestedHeaders(depth int) warren.Table {
	var v any = 1
	for i := range depth {
		if i%2 == 0 {
			v = warren.Table{"t": v}
		} else {
			v = []any{v}
		}
	}
	return warren.Table{"h": v}
}

// TestPublishRefusesCyclicAndDeepHeaders: a publish whose headers hold a table or array that contains itself, or nest deeper than 32,
// is refused by every broker, in-memory ones included (whatever walks the headers later — the
// admin's message view, the AMQP listener — would recurse without end); tables shared without
// a cycle, nesting up to the bound, and values of other types (on an in-memory broker) pass.
func TestPublishRefusesCyclicAndDeepHeaders(t *testing.T) {
	b := newBroker(t)
	q := declare(t, b, "q")

	self := warren.Table{}
	self["self"] = self
	inner := warren.Table{}
	outer := map[string]any{"inner": inner}
	inner["outer"] = outer
	array := make([]any, 2)
	array[1] = array
	top := warren.Table{}
	top["list"] = []any{1, warren.Table{"back": top}}
	for _, tc := range []struct {
		name    string
		headers warren.Table
		want    string
	}{
		{"a table that holds itself", self, `header "self": cyclic`},
		{"two tables that hold each other", warren.Table{"x": inner}, `header "x": header "outer": header "inner": cyclic`},
		{"an array that holds itself", warren.Table{"a": array}, `header "a": cyclic`},
		{"the headers inside themselves", top, `header "list": header "back": cyclic`},
		{"nested deeper than 32", nestedHeaders(33), "nested deeper than 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, publish := range []func(warren.Message) error{
				func(m warren.Message) error { return b.Publish(t.Context(), "", "q", m) },
				func(m warren.Message) error {
					return b.PublishBatch(t.Context(), []warren.Publishing{{Key: "q", Message: m}})
				},
			} {
				err := publish(warren.Message{Body: []byte("x"), Headers: tc.headers})
				require.ErrorIs(t, err, warren.ErrPreconditionFailed)
				require.ErrorContains(t, err, tc.want)
			}
		})
	}
	require.Zero(t, q.Len(), "nothing refused was enqueued")

	shared := warren.Table{"k": 1}
	for _, ok := range []warren.Table{
		nestedHeaders(32),
		{"a": shared, "b": []any{shared, shared}, "c": warren.Table{"d": shared}},
		{"CC": []string{"q"}, "other": struct{ p *int }{}, "empty": warren.Table{}, "none": []any{}},
	} {
		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Headers: ok}), "%v", ok)
	}
	require.Equal(t, 3, q.Len())

	_, err := b.DeclareQueue("q2", warren.Arguments(self))
	require.ErrorIs(t, err, warren.ErrPreconditionFailed)
	require.ErrorContains(t, err, `argument "self": cyclic`, "arguments are checked alike")
}

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

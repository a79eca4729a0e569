package warren

// Tests of codec.go: every property and field type round-trips exactly (Go types, float bits,
// nil against empty, time to the nanosecond in UTC), the encoding is canonical, and hostile
// input fails with errBadRecord without panicking, recursing past maxFieldDepth or allocating
// more than a small multiple of its size.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// diffField returns where got differs from want, "" if nowhere. Equal means exactly: the same
// Go type, the same float bits, nil only for nil (a typed nil slice or map too), and for a
// time.Time the same instant and nanosecond in UTC without a monotonic reading.
func diffField(path string, want, got any) string {
	if fmt.Sprintf("%T", want) != fmt.Sprintf("%T", got) {
		return fmt.Sprintf("%s: got %T %v, want %T %v", path, got, got, want, want)
	}
	same := true
	switch w := want.(type) {
	case float32:
		same = math.Float32bits(w) == math.Float32bits(got.(float32))
	case float64:
		same = math.Float64bits(w) == math.Float64bits(got.(float64))
	case []byte:
		g := got.([]byte)
		same = (w == nil) == (g == nil) && bytes.Equal(w, g)
	case time.Time:
		same = got.(time.Time) == w.Round(0).UTC() // the representation, not just Equal
	case Table:
		return diffTable(path, w, got.(Table))
	case map[string]any:
		return diffTable(path, w, got.(map[string]any))
	case []any:
		g := got.([]any)
		if (w == nil) != (g == nil) || len(w) != len(g) {
			return fmt.Sprintf("%s: got %#v, want %#v", path, g, w)
		}
		for i := range w {
			if d := diffField(fmt.Sprintf("%s[%d]", path, i), w[i], g[i]); d != "" {
				return d
			}
		}
	default:
		same = want == got
	}
	if !same {
		return fmt.Sprintf("%s: got %T %#v, want %#v", path, got, got, want)
	}
	return ""
}

func diffTable(path string, want, got map[string]any) string {
	if (want == nil) != (got == nil) || len(want) != len(got) {
		return fmt.Sprintf("%s: got %#v, want %#v", path, got, want)
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		g, ok := got[k]
		if !ok {
			return fmt.Sprintf("%s: key %q missing", path, k)
		}
		if d := diffField(fmt.Sprintf("%s[%q]", path, k), want[k], g); d != "" {
			return d
		}
	}
	return ""
}

// diffMessage returns where got differs from want, as diffField does for values.
func diffMessage(want, got *Message) string {
	if (want.Body == nil) != (got.Body == nil) || !bytes.Equal(want.Body, got.Body) {
		return fmt.Sprintf("Body: got %d bytes (nil %t), want %d (nil %t)",
			len(got.Body), got.Body == nil, len(want.Body), want.Body == nil)
	}
	if d := diffField("Headers", want.Headers, got.Headers); d != "" {
		return d
	}
	if d := diffField("Timestamp", want.Timestamp, got.Timestamp); d != "" {
		return d
	}
	wt, gt := want.text(), got.text()
	for i := range wt {
		if *wt[i] != *gt[i] {
			return fmt.Sprintf("text property %d: got %q, want %q", i, *gt[i], *wt[i])
		}
	}
	if want.Persistent != got.Persistent || want.Priority != got.Priority {
		return fmt.Sprintf("Persistent, Priority: got %t, %d, want %t, %d",
			got.Persistent, got.Priority, want.Persistent, want.Priority)
	}
	return ""
}

// roundTrip encodes m after a prefix, decodes it followed by other bytes, and checks that the
// message is exactly m, that it took all of its encoding and no more, and that it re-encodes to
// the same bytes. It returns the encoding.
func roundTrip(t testing.TB, m *Message) []byte {
	t.Helper()
	prefix := []byte("prefix")
	enc := appendMessage(slices.Clip(prefix), m)
	require.Equal(t, prefix, enc[:len(prefix)], "appendMessage changed dst's bytes")
	enc = enc[len(prefix):]
	got, n, err := decodeMessage(append(slices.Clip(enc), 9, 9, 9))
	require.NoError(t, err)
	require.Equal(t, len(enc), n, "bytes used")
	if d := diffMessage(m, &got); d != "" {
		t.Fatalf("decode(encode(m)): %s", d)
	}
	require.Equal(t, enc, appendMessage(nil, &got), "re-encoding")
	return enc
}

// codecFieldCases has values of every field type, with their tags and extremes.
var codecFieldCases = []struct {
	name string
	v    any
	tag  byte
}{
	{"nil", nil, tagNil},
	{"false", false, tagFalse},
	{"true", true, tagTrue},
	{"int8 min", int8(math.MinInt8), tagInt8},
	{"int8 max", int8(math.MaxInt8), tagInt8},
	{"int8 zero", int8(0), tagInt8},
	{"int16 min", int16(math.MinInt16), tagInt16},
	{"int16 max", int16(math.MaxInt16), tagInt16},
	{"int32 min", int32(math.MinInt32), tagInt32},
	{"int32 max", int32(math.MaxInt32), tagInt32},
	{"int64 min", int64(math.MinInt64), tagInt64},
	{"int64 max", int64(math.MaxInt64), tagInt64},
	{"int64 -1", int64(-1), tagInt64},
	{"int min", math.MinInt, tagInt},
	{"int max", math.MaxInt, tagInt},
	{"int zero", 0, tagInt},
	{"int 1", 1, tagInt},
	{"uint8 max", uint8(math.MaxUint8), tagUint8},
	{"uint8 zero", uint8(0), tagUint8},
	{"uint16 max", uint16(math.MaxUint16), tagUint16},
	{"uint32 max", uint32(math.MaxUint32), tagUint32},
	{"float32 NaN", float32(math.NaN()), tagFloat32},
	{"float32 NaN with payload", math.Float32frombits(0x7fa00001), tagFloat32},
	{"float32 -0", float32(math.Copysign(0, -1)), tagFloat32},
	{"float32 +Inf", float32(math.Inf(1)), tagFloat32},
	{"float32 -Inf", float32(math.Inf(-1)), tagFloat32},
	{"float32 smallest", float32(math.SmallestNonzeroFloat32), tagFloat32},
	{"float32 max", float32(math.MaxFloat32), tagFloat32},
	{"float64 NaN", math.NaN(), tagFloat64},
	{"float64 signalling NaN", math.Float64frombits(0x7ff0000000000001), tagFloat64},
	{"float64 negative NaN", math.Float64frombits(0xfff8000000000000), tagFloat64},
	{"float64 -0", math.Copysign(0, -1), tagFloat64},
	{"float64 +0", 0.0, tagFloat64},
	{"float64 +Inf", math.Inf(1), tagFloat64},
	{"float64 -Inf", math.Inf(-1), tagFloat64},
	{"float64 smallest", math.SmallestNonzeroFloat64, tagFloat64},
	{"float64 max", math.MaxFloat64, tagFloat64},
	{"float64 0.1", 0.1, tagFloat64},
	{"string empty", "", tagString},
	{"string", "héllo\x00\xff", tagString},
	{"string of 300 bytes", strings.Repeat("x", 300), tagString},
	{"bytes nil", []byte(nil), tagBytes},
	{"bytes empty", []byte{}, tagBytes},
	{"bytes", []byte{0, 1, 0xff}, tagBytes},
	{"time zero", time.Time{}, tagTime},
	{"time in UTC", time.Date(2024, 2, 29, 12, 0, 0, 0, time.UTC), tagTime},
	{"time with nanoseconds in a zone", time.Date(2024, 2, 29, 23, 59, 59, 999999999, time.FixedZone("X", 3600)), tagTime},
	{"time local with a monotonic reading", time.Now(), tagTime},
	{"time before 1970", time.Date(1900, 1, 1, 0, 0, 0, 1, time.UTC), tagTime},
	{"time in year 1", time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC), tagTime},
	{"time in year 9999", time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC), tagTime},
	{"time earliest Unix", time.Unix(math.MinInt64, 0), tagTime},
	{"time latest Unix", time.Unix(math.MaxInt64, 999999999), tagTime},
	{"decimal zero", Decimal{}, tagDecimal},
	{"decimal extreme", Decimal{Scale: math.MaxUint8, Value: math.MinInt32}, tagDecimal},
	{"decimal", Decimal{Scale: 2, Value: 12345}, tagDecimal},
	{"table nil", Table(nil), tagTable},
	{"table empty", Table{}, tagTable},
	{"table", Table{"b": 1, "a": "x", "": nil, "c": Table{"d": []byte(nil)}}, tagTable},
	{"map nil", map[string]any(nil), tagMap},
	{"map empty", map[string]any{}, tagMap},
	{"map", map[string]any{"k": map[string]any{"k": int16(-2)}, "t": Table{}}, tagMap},
	{"array nil", []any(nil), tagArray},
	{"array empty", []any{}, tagArray},
	{"array", []any{1, "x", nil, []any{int8(1), []any(nil)}, Table(nil), math.NaN()}, tagArray},
}

// TestCodecFieldTypes round-trips every field type, alone in a message's headers, in a table
// of appendTable's, and in an array, and checks that checkTable accepts the same types.
func TestCodecFieldTypes(t *testing.T) {
	tags := map[byte]bool{}
	for _, tc := range codecFieldCases {
		t.Run(tc.name, func(t *testing.T) {
			tags[tc.tag] = true
			require.Equal(t, tc.tag, appendValue(nil, tc.v, 0)[0], "tag")
			h := Table{"v": tc.v}
			require.NoError(t, checkTable(h), "checkTable")
			roundTrip(t, &Message{Headers: h})
			roundTrip(t, &Message{Headers: Table{"a": []any{tc.v, tc.v}, "m": map[string]any{"v": tc.v}}})

			enc := appendTable([]byte{7}, h)[1:]
			got, n, err := decodeTable(append(enc, 7))
			require.NoError(t, err)
			require.Equal(t, len(enc), n)
			if d := diffField("table", h, got); d != "" {
				t.Fatal(d)
			}
		})
	}
	for tag := byte(tagNil); tag <= tagArray; tag++ {
		assert.True(t, tags[tag], "no case has tag %d", tag)
	}
}

// TestCodecMessageProperties round-trips each property alone, every one at once, and the
// Timestamps of TestCodecFieldTypes.
func TestCodecMessageProperties(t *testing.T) {
	full := Message{
		Body:            []byte("body"),
		Headers:         Table{"h": "v"},
		ContentType:     "text/plain",
		ContentEncoding: "gzip",
		Persistent:      true,
		Priority:        255,
		CorrelationID:   "corr",
		ReplyTo:         "reply",
		Expiration:      "60000",
		MessageID:       "id",
		Timestamp:       time.Date(2025, 6, 1, 2, 3, 4, 5, time.UTC),
		Type:            "type",
		UserID:          "user",
		AppID:           "app",
	}
	tests := []struct {
		name string
		set  func(*Message)
	}{
		{"zero message", func(*Message) {}},
		{"Body", func(m *Message) { m.Body = full.Body }},
		{"Headers", func(m *Message) { m.Headers = full.Headers }},
		{"Persistent", func(m *Message) { m.Persistent = true }},
		{"Priority 1", func(m *Message) { m.Priority = 1 }},
		{"Priority 255", func(m *Message) { m.Priority = 255 }},
		{"Timestamp", func(m *Message) { m.Timestamp = full.Timestamp }},
		{"every property", func(m *Message) { *m = full }},
	}
	for i, s := range (&full).text() {
		tests = append(tests, struct {
			name string
			set  func(*Message)
		}{fmt.Sprintf("text property %d", i), func(m *Message) { *m.text()[i] = *s }})
	}
	for _, tc := range codecFieldCases {
		if ts, ok := tc.v.(time.Time); ok {
			tests = append(tests, struct {
				name string
				set  func(*Message)
			}{"Timestamp " + tc.name, func(m *Message) { m.Timestamp = ts }})
		}
	}
	seen := map[string]string{} // encoding → case
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var m Message
			tc.set(&m)
			enc := roundTrip(t, &m)
			if !strings.HasPrefix(tc.name, "Timestamp ") {
				// Each property is written apart: no two of them encode alike.
				require.NotContains(t, seen, string(enc), "same encoding as %s", seen[string(enc)])
				seen[string(enc)] = tc.name
			}
		})
	}
	// The zero message is 4 bytes: version, flags, nil headers, nil body.
	assert.Equal(t, []byte{codecVersion, 0, 0, 0}, appendMessage(nil, &Message{}))
}

// TestCodecBody round-trips bodies of several sizes, nil apart from empty.
func TestCodecBody(t *testing.T) {
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	for _, body := range [][]byte{nil, {}, {0}, bytes.Repeat([]byte{1}, 127), bytes.Repeat([]byte{2}, 128), big} {
		t.Run(fmt.Sprintf("%d bytes, nil %t", len(body), body == nil), func(t *testing.T) {
			m := Message{Body: body, Headers: Table{"big": big[:len(body)]}}
			roundTrip(t, &m)
		})
	}
}

// TestCodecEmptyStrings tells empty from absent: an empty header string from a missing key,
// and empty text properties take no bytes.
func TestCodecEmptyStrings(t *testing.T) {
	for _, h := range []Table{nil, {}, {"k": ""}, {"": ""}, {"": nil}, {"k": []byte{}}, {"k": []byte(nil)}, {"k": "", "l": nil}} {
		roundTrip(t, &Message{Headers: h, ContentType: "", AppID: "a"})
	}
	assert.Equal(t, appendMessage(nil, &Message{}), appendMessage(nil, &Message{ContentType: "", Type: ""}))
}

// TestCodecNesting round-trips tables and arrays nested as deeply as checkTable allows, and
// checks that decoding refuses exactly what checkTable refuses.
func TestCodecNesting(t *testing.T) {
	for levels := range maxFieldDepth + 4 {
		for _, inner := range []any{int8(1), []any{}, Table{}, Table{"x": nil}} {
			// levels containers around inner, alternating arrays and both kinds of tables.
			v := inner
			for i := range levels {
				switch i % 3 {
				case 0:
					v = []any{v, "s"}
				case 1:
					v = Table{"t": v}
				default:
					v = map[string]any{"m": v}
				}
			}
			h := Table{"v": v}
			name := fmt.Sprintf("%d levels around %#v", levels, inner)
			if checkTable(h) != nil {
				require.Panics(t, func() { appendMessage(nil, &Message{Headers: h}) }, name)
				// The same bytes as appendMessage would write, had it not refused.
				enc := slices.Concat([]byte{codecVersion, 0, 2, 1, 'v'}, encodeUnchecked(v), []byte{0})
				_, _, err := decodeMessage(enc)
				require.ErrorIs(t, err, errBadRecord, name)
				require.ErrorContains(t, err, "nested deeper than 32", name)
				continue
			}
			enc := roundTrip(t, &Message{Headers: h})
			require.Equal(t, slices.Concat([]byte{codecVersion, 0, 2, 1, 'v'}, encodeUnchecked(v), []byte{0}), enc, name)
		}
	}
}

// encodeUnchecked encodes v as appendValue does at depth 0, however deep it is.
func encodeUnchecked(v any) []byte {
	switch v := v.(type) {
	case []any:
		out := binary.AppendUvarint([]byte{tagArray}, uint64(len(v))+1)
		for _, e := range v {
			out = append(out, encodeUnchecked(e)...)
		}
		return out
	case Table:
		return encodeUncheckedTable(tagTable, v)
	case map[string]any:
		return encodeUncheckedTable(tagMap, v)
	}
	return appendValue(nil, v, 0)
}

func encodeUncheckedTable(tag byte, t map[string]any) []byte {
	out := binary.AppendUvarint([]byte{tag}, uint64(len(t))+1)
	for _, k := range slices.Sorted(maps.Keys(t)) {
		out = append(appendString(out, k), encodeUnchecked(t[k])...)
	}
	return out
}

// TestCodecCanonical checks that a table's encoding does not depend on its map's order, and
// that every strict prefix of an encoding fails as truncated.
func TestCodecCanonical(t *testing.T) {
	h := Table{}
	for i := range 50 {
		h[fmt.Sprintf("key-%d", i)] = i
	}
	m := Message{Headers: h, Body: []byte("b"), Timestamp: time.Unix(1, 2), MessageID: "id"}
	first := appendMessage(nil, &m)
	for range 20 {
		h2 := Table{}
		// another insertion order
		maps.Copy(h2, h)
		require.Equal(t, first, appendMessage(nil, &Message{Headers: h2, Body: m.Body, Timestamp: m.Timestamp, MessageID: m.MessageID}))
	}
	for n := range len(first) {
		_, _, err := decodeMessage(first[:n])
		require.ErrorIs(t, err, errBadRecord, "prefix of %d bytes", n)
		require.ErrorContains(t, err, "truncated", "prefix of %d bytes", n)
	}
}

// TestCodecBadRecords decodes hand-made bad records: each fails with errBadRecord saying why.
func TestCodecBadRecords(t *testing.T) {
	msg := func(parts ...[]byte) []byte { return slices.Concat(parts...) }
	head := []byte{codecVersion, 0} // a message without properties, up to its headers
	oneHeader := func(value ...byte) []byte { return msg(head, []byte{2, 1, 'k'}, value, []byte{0}) }
	varint := func(x int64) []byte { return binary.AppendVarint(nil, x) }
	uvarint := func(x uint64) []byte { return binary.AppendUvarint(nil, x) }
	tests := []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"version 0", []byte{0, 0, 0, 0}, "unknown version 0 at byte 0"},
		{"version 2", []byte{2, 0, 0, 0}, "unknown version 2"},
		{"unknown flag", []byte{codecVersion, 0x80, 0x40, 0, 0}, "unknown flags 0x2000"},
		{"flags not shortest", []byte{codecVersion, 0x80, 0, 0, 0}, "shortest form"},
		{"varint overflow", msg([]byte{codecVersion}, bytes.Repeat([]byte{0xff}, 10), []byte{1}), "overflows"},
		{"priority 0", []byte{codecVersion, flagPriority, 0, 0, 0}, "priority 0"},
		{"empty text", []byte{codecVersion, flagText, 0, 0, 0}, "empty text"},
		{"zero timestamp", msg([]byte{codecVersion, flagTimestamp}, varint(time.Time{}.Unix()), []byte{0, 0, 0}), "zero timestamp"},
		{"nanoseconds", msg([]byte{codecVersion, flagTimestamp, 0}, uvarint(1e9), []byte{0, 0}), "nanoseconds 1000000000"},
		{"unknown tag", oneHeader(tagArray + 1), "unknown tag 20"},
		{"keys out of order", msg(head, []byte{3, 1, 'b', tagNil, 1, 'a', tagNil, 0}), `key "a" not after key "b"`},
		{"duplicate keys", msg(head, []byte{3, 1, 'a', tagNil, 1, 'a', tagNil, 0}), `key "a" not after key "a"`},
		{"int16 range", oneHeader(msg([]byte{tagInt16}, varint(math.MaxInt16+1))...), "out of range"},
		{"int32 range", oneHeader(msg([]byte{tagInt32}, varint(math.MinInt32-1))...), "out of range"},
		{"uint16 range", oneHeader(msg([]byte{tagUint16}, uvarint(math.MaxUint16+1))...), "out of range"},
		{"uint32 range", oneHeader(msg([]byte{tagUint32}, uvarint(math.MaxUint32+1))...), "out of range"},
		{"decimal range", oneHeader(msg([]byte{tagDecimal, 0}, varint(math.MaxInt32+1))...), "out of range"},
		{"float64 truncated", msg(head, []byte{2, 1, 'k', tagFloat64, 1, 2, 3}), "truncated"},
		{"huge body", msg(head, []byte{0}, uvarint(math.MaxUint64)), "truncated"},
		{"huge string", msg([]byte{codecVersion, flagText}, uvarint(1<<62), []byte{'a', 0, 0}), "truncated"},
		{"huge table", msg(head, uvarint(1<<62), []byte{1, 'k', 0, 0}), "cannot fit"},
		{"huge array", oneHeader(msg([]byte{tagArray}, uvarint(math.MaxUint64))...), "cannot fit"},
		{"table bigger than the record", msg(head, []byte{4, 1, 'a', tagNil, 1, 'b'}), "cannot fit"},
		{"too deep", oneHeader(msg(bytes.Repeat([]byte{tagArray, 2}, maxFieldDepth+1), []byte{tagNil})...), "nested deeper than 32"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, n, err := decodeMessage(tc.b)
			require.ErrorIs(t, err, errBadRecord)
			require.ErrorContains(t, err, tc.want)
			require.True(t, strings.HasPrefix(err.Error(), "warren: bad log record: "), err.Error())
			require.Zero(t, n)
			require.Zero(t, diffMessage(&Message{}, &m))
		})
	}
	_, _, err := decodeTable([]byte{2, 1, 'k', tagArray + 1})
	require.ErrorIs(t, err, errBadRecord)
}

// TestCodecDecodeAllocation decodes records whose nested arrays and tables each claim as many
// entries as the rest of the record could hold: decoding fails having allocated a small
// multiple of the record's size, not that multiple per level.
func TestCodecDecodeAllocation(t *testing.T) {
	const size = 1 << 16
	for _, tag := range []byte{tagArray, tagTable} {
		b := []byte{codecVersion, 0, 2, 1, 'k'}
		for range maxFieldDepth {
			b = append(b, tag)
			left := uint64(size - len(b) - 3) // bytes after a 3-byte count
			if tag == tagTable {
				b = append(binary.AppendUvarint(b, left/2+1), 0) // an empty key, then the value
			} else {
				b = binary.AppendUvarint(b, left+1)
			}
		}
		b = append(b, make([]byte, size-len(b))...)

		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, _, err := decodeMessage(b)
		runtime.ReadMemStats(&after)
		require.ErrorIs(t, err, errBadRecord)
		allocated := after.TotalAlloc - before.TotalAlloc
		t.Logf("tag %d: %d bytes allocated decoding %d", tag, allocated, len(b))
		require.Less(t, allocated, uint64(64*len(b)), "tag %d", tag)
	}
}

// codecBenchMessage is a typical message: a 128-byte body, 3 headers, a few properties.
func codecBenchMessage() Message {
	return Message{
		Body:        bytes.Repeat([]byte("x"), 128),
		Headers:     Table{"tenant": "acme", "attempt": int64(3), "sent": time.Unix(1700000000, 123).UTC()},
		ContentType: "application/json",
		Persistent:  true,
		MessageID:   "0190a5c2-7b1e-7c3a-9f5e-3c2d1b0a9e8f",
		Timestamp:   time.Unix(1700000000, 0),
	}
}

// TestCodecAppendMessageAllocs checks that encoding allocates nothing once dst has room.
func TestCodecAppendMessageAllocs(t *testing.T) {
	m := codecBenchMessage()
	buf := appendMessage(nil, &m)
	allocs := testing.AllocsPerRun(100, func() { buf = appendMessage(buf[:0], &m) })
	require.Zero(t, allocs)
}

func BenchmarkAppendMessage(b *testing.B) {
	m := codecBenchMessage()
	buf := appendMessage(nil, &m)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = appendMessage(buf[:0], &m)
	}
}

func BenchmarkDecodeMessage(b *testing.B) {
	m := codecBenchMessage()
	enc := appendMessage(nil, &m)
	b.SetBytes(int64(len(enc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := decodeMessage(enc); err != nil {
			b.Fatal(err)
		}
	}
}

// codecSeeds returns encodings of messages with every field type, and some of their prefixes.
func codecSeeds() [][]byte {
	full := codecBenchMessage()
	full.Priority, full.ReplyTo, full.AppID = 9, "r", "a"
	seeds := [][]byte{appendMessage(nil, &full), appendMessage(nil, &Message{}), {}, {codecVersion}}
	for _, tc := range codecFieldCases {
		enc := appendMessage(nil, &Message{Headers: Table{"v": tc.v, "a": []any{tc.v}}, Body: []byte{}})
		seeds = append(seeds, enc, enc[:len(enc)/2])
	}
	return seeds
}

// FuzzDecodeMessage decodes arbitrary bytes as a message and as a table: it must not panic; an
// error wraps errBadRecord; what decodes took at most the input and re-encodes to exactly the
// bytes it took (the encoding is canonical, and the decoder accepts nothing else).
func FuzzDecodeMessage(f *testing.F) {
	for _, s := range codecSeeds() {
		f.Add(s)
		if len(s) > 2 {
			f.Add(s[2:]) // as a table: from the flags on, for a message without properties
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, n, err := decodeMessage(b)
		if err != nil {
			require.ErrorIs(t, err, errBadRecord)
		} else {
			require.LessOrEqual(t, n, len(b))
			require.Equal(t, b[:n], appendMessage(nil, &m), "re-encoding")
		}
		tb, n, err := decodeTable(b)
		if err != nil {
			require.ErrorIs(t, err, errBadRecord)
		} else {
			require.LessOrEqual(t, n, len(b))
			require.Equal(t, b[:n], appendTable(nil, tb), "re-encoding")
		}
	})
}

// codecChoices reads a fuzz input's choices, as big-endian integers of 1 to 8 bytes; bytes past
// the input's end are zeros.
type codecChoices struct{ b []byte }

func (c *codecChoices) next(n int) uint64 {
	var x uint64
	for i := range n {
		x <<= 8
		if i < len(c.b) {
			x |= uint64(c.b[i])
		}
	}
	c.b = c.b[min(n, len(c.b)):]
	return x
}

func (c *codecChoices) byte() byte { return byte(c.next(1)) }

func (c *codecChoices) uint64() uint64 { return c.next(8) }

func (c *codecChoices) string() string {
	s := make([]byte, c.byte()%6)
	for i := range s {
		s[i] = c.byte()
	}
	return string(s)
}

// value returns a field value at depth, of a type and value the choices pick; a container
// at maxFieldDepth is empty, as checkTable requires.
func (c *codecChoices) value(depth int) any {
	kind := c.byte()
	n := int(kind>>5) % 4 // entries of a container
	if depth >= maxFieldDepth {
		n = 0
	}
	u := c.uint64()
	switch kind % 22 {
	case 0:
		return nil
	case 1:
		return u&1 == 1
	case 2:
		return int8(u)
	case 3:
		return int16(u)
	case 4:
		return int32(u)
	case 5:
		return int64(u)
	case 6:
		return int(u)
	case 7:
		return uint8(u)
	case 8:
		return uint16(u)
	case 9:
		return uint32(u)
	case 10:
		return math.Float32frombits(uint32(u))
	case 11:
		return math.Float64frombits(u)
	case 12:
		return c.string()
	case 13:
		if u&1 == 1 {
			return []byte(nil)
		}
		return []byte(c.string())
	case 14:
		zones := []*time.Location{time.UTC, time.Local, time.FixedZone("Z", -5*3600)}
		return time.Unix(int64(u), int64(c.uint64()%2e9)).In(zones[c.byte()%3])
	case 15:
		return Decimal{Scale: uint8(u), Value: int32(u >> 8)}
	case 16:
		return Table(c.table(n, u&1 == 1, depth+1))
	case 17:
		return c.table(n, u&1 == 1, depth+1)
	case 18, 19:
		if u&1 == 1 {
			return []any(nil)
		}
		a := make([]any, n)
		for i := range a {
			a[i] = c.value(depth + 1)
		}
		return a
	}
	return time.Time{}
}

// table returns a table of up to n entries at depth, or nil.
func (c *codecChoices) table(n int, isNil bool, depth int) map[string]any {
	if isNil {
		return nil
	}
	t := make(map[string]any, n)
	for range n {
		t[c.string()] = c.value(depth)
	}
	return t
}

// FuzzMessageRoundTrip builds a message from the fuzzer's body, text properties (split on
// "|"), timestamp and choices (flags, priority, headers of every type, nested), and checks that
// decode(encode(m)) is exactly m.
func FuzzMessageRoundTrip(f *testing.F) {
	f.Add([]byte("body"), "text/plain|gzip|id", int64(1700000000), uint32(5), []byte{7, 3, 0x61, 1, 'k', 11, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Add([]byte{}, "", int64(math.MinInt64), uint32(math.MaxUint32), []byte{0xff, 0xff, 0x70, 0, 16, 0xff})
	f.Add([]byte(nil), "a|b|c|d|e|f|g|h|i|j", int64(math.MaxInt64), uint32(0), []byte{2, 0, 0x71, 2, 'k', 'l', 18})
	f.Fuzz(func(t *testing.T, body []byte, text string, sec int64, nsec uint32, choices []byte) {
		c := codecChoices{choices}
		flags := c.byte()
		m := Message{Body: body, Persistent: flags&1 != 0, Priority: c.byte()}
		if flags&2 != 0 && len(body) == 0 {
			m.Body = nil
		}
		if flags&4 != 0 {
			m.Timestamp = time.Unix(sec, int64(nsec)).In(time.FixedZone("Z", int(flags)))
		}
		for i, s := range strings.SplitN(text, "|", textProps) {
			*m.text()[i] = s
		}
		if flags&8 != 0 {
			m.Headers = c.table(int(c.byte()%8), flags&16 != 0, 0)
		}
		require.NoError(t, checkTable(m.Headers))
		roundTrip(t, &m)
	})
}

func TestCodecEnvelope(t *testing.T) {
	m := Message{Body: []byte("job"), Headers: Table{"k": int8(1)}, Persistent: true, MessageID: "m-1"}
	b := appendEnvelope(nil, "jobs", "email.send", &m)
	x, key, got, err := decodeEnvelope(b)
	require.NoError(t, err)
	require.Equal(t, "jobs", x)
	require.Equal(t, "email.send", key)
	require.Equal(t, appendMessage(nil, &m), appendMessage(nil, &got), "the message comes back exactly")
	for i := range b {
		_, _, _, err := decodeEnvelope(b[:i])
		require.ErrorIs(t, err, errBadRecord, "truncated at %d", i)
	}
	_, _, _, err = decodeEnvelope(append(b, 0))
	require.ErrorIs(t, err, errBadRecord, "trailing bytes")
}

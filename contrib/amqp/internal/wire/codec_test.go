package wire

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// everyMethod returns a zero value of every method of the specification.
func everyMethod() []Method {
	var out []Method
	for class := range uint16(100) {
		for method := range uint16(200) {
			if m := NewMethod(class, method); m != nil {
				out = append(out, m)
			}
		}
	}
	return out
}

// fill sets every field of the struct v points to a random value.
func fill(rng *rand.Rand, v reflect.Value) {
	v = v.Elem()
	for _, f := range v.Fields() {
		switch f.Kind() {
		case reflect.Bool:
			f.SetBool(rng.IntN(2) == 1)
		case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			f.SetUint(rng.Uint64() >> (64 - 8*f.Type().Size()))
		case reflect.String:
			f.SetString(string(bytes.Repeat([]byte{'a' + byte(rng.IntN(26))}, rng.IntN(40))))
		default:
			switch f.Interface().(type) {
			case warren.Table:
				f.Set(reflect.ValueOf(warren.Table{"n": int64(rng.IntN(1000)), "s": "x", "nested": warren.Table{"b": true}}))
			case time.Time:
				f.Set(reflect.ValueOf(time.Unix(rng.Int64N(1<<40), 0)))
			default:
				panic("fill: " + f.Type().String())
			}
		}
	}
}

// Every method of the specification reads back what it wrote, with its ids.
func TestMethodsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	methods := everyMethod()
	require.Len(t, methods, 64, "the specification's methods, RabbitMQ's extensions included")
	for _, m := range methods {
		for range 20 {
			fill(rng, reflect.ValueOf(m))
			frame := AppendMethod(nil, 7, m)
			fr := NewFrameReader(bytes.NewReader(frame))
			fr.Max = 1 << 20
			f, err := fr.Read()
			require.NoError(t, err, m.Name())
			require.Equal(t, Frame{Type: FrameMethod, Channel: 7, Payload: frame[7 : len(frame)-1]}, f)
			got, err := ReadMethod(f.Payload)
			require.NoError(t, err, m.Name())
			require.Equal(t, m, got, m.Name())
		}
	}
}

// Bits are packed as the specification says: queue.declare's five flags in one octet, in
// order.
func TestBitsPacked(t *testing.T) {
	w := Writer{}
	(&QueueDeclare{Queue: "q", Passive: true, Durable: false, Exclusive: true, AutoDelete: false, NoWait: true}).Write(&w)
	// reserved short, "q", then the flags, then an empty table.
	require.Equal(t, []byte{0, 0, 1, 'q', 0b10101, 0, 0, 0, 0}, w.B)
}

// Field tables read back with RabbitMQ's field types.
func TestTableRoundTrip(t *testing.T) {
	in := warren.Table{
		"bool": true, "i8": int8(-3), "u8": uint8(200), "i16": int16(-300), "u16": uint16(60000),
		"i32": int32(-70000), "u32": uint32(4000000000), "i64": int64(-1 << 40), "f32": float32(1.5), "f64": 2.25,
		"dec": warren.Decimal{Scale: 2, Value: 314}, "str": "text", "bytes": []byte{0, 1, 2},
		"array": []any{"a", int64(1), warren.Table{"k": "v"}, []any{}}, "time": time.Unix(1700000000, 0),
		"table": warren.Table{"inner": warren.Table{}}, "void": nil,
	}
	w := Writer{}
	w.Table(in)
	r := NewReader(w.B)
	out := r.Table()
	require.NoError(t, r.Err())
	require.Zero(t, r.Rest())
	require.Equal(t, in, out)
}

// What does not parse is an error, never a panic: truncated payloads, unknown field types,
// tables nested without end, bytes left over, unknown methods.
func TestMalformed(t *testing.T) {
	frame := AppendMethod(nil, 1, &QueueDeclare{Queue: "q", Arguments: warren.Table{"x-max-length": int64(3)}})
	payload := frame[7 : len(frame)-1]
	for n := range len(payload) {
		_, err := ReadMethod(payload[:n])
		require.ErrorIs(t, err, ErrMalformed, "cut at %d", n)
	}
	_, err := ReadMethod(append(append([]byte{}, payload...), 0))
	require.ErrorIs(t, err, ErrMalformed, "a byte left over")
	_, err = ReadMethod([]byte{0, 99, 0, 1})
	require.ErrorIs(t, err, ErrUnknownMethod)

	r := NewReader([]byte{0, 0, 0, 3, 1, 'k', '?'})
	r.Table()
	require.ErrorIs(t, r.Err(), ErrMalformed, "an unknown field type")

	deep := warren.Table{}
	for range maxTableDepth + 1 {
		deep = warren.Table{"t": deep}
	}
	w := Writer{}
	w.Table(deep)
	r = NewReader(w.B)
	r.Table()
	require.ErrorIs(t, r.Err(), ErrMalformed, "nested too deep")
}

// A frame over frame-max, or without its frame end, fails; a body larger than frame-max is
// split into frames that fit.
func TestFrames(t *testing.T) {
	big := AppendMethod(nil, 1, &BasicPublish{Exchange: string(bytes.Repeat([]byte{'x'}, 200)), RoutingKey: "k"})
	fr := NewFrameReader(bytes.NewReader(big))
	fr.Max = 100
	_, err := fr.Read()
	require.ErrorIs(t, err, ErrFrameTooLarge)

	bad := AppendHeartbeat(nil)
	bad[len(bad)-1] = 0
	_, err = NewFrameReader(bytes.NewReader(bad)).Read()
	require.ErrorIs(t, err, ErrMalformed)

	body := bytes.Repeat([]byte("0123456789"), 100)
	props := &BasicProperties{ContentType: "text/plain", Headers: warren.Table{"h": "v"}, DeliveryMode: 2, Timestamp: time.Unix(1700000000, 0)}
	buf := AppendContent(nil, 3, props, body, 256)
	fr = NewFrameReader(bytes.NewReader(buf))
	fr.Max = 256
	f, err := fr.Read()
	require.NoError(t, err)
	require.Equal(t, uint8(FrameHeader), f.Type)
	h, err := ReadContentHeader(f.Payload)
	require.NoError(t, err)
	require.Equal(t, ContentHeader{Class: 60, BodySize: uint64(len(body)), Properties: *props}, h)
	var got []byte
	frames := 0
	for len(got) < len(body) {
		f, err := fr.Read()
		require.NoError(t, err)
		require.Equal(t, uint8(FrameBody), f.Type)
		require.LessOrEqual(t, len(f.Payload)+8, 256)
		got = append(got, f.Payload...)
		frames++
	}
	require.Equal(t, body, got)
	require.Equal(t, 5, frames, "1000 bytes in frames of at most 248")
}

// Decoding arbitrary bytes never panics; what decodes encodes to what decodes the same.
func FuzzReadMethod(f *testing.F) {
	for _, m := range everyMethod() {
		fill(rand.New(rand.NewPCG(3, 4)), reflect.ValueOf(m))
		frame := AppendMethod(nil, 0, m)
		f.Add(frame[7 : len(frame)-1])
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		m, err := ReadMethod(payload)
		if err != nil {
			return
		}
		frame := AppendMethod(nil, 0, m)
		again, err := ReadMethod(frame[7 : len(frame)-1])
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("%v", m), fmt.Sprintf("%v", again), "as printed: a NaN is not equal to itself")
	})
}

// Content headers: the same.
func FuzzReadContentHeader(f *testing.F) {
	buf := AppendContent(nil, 1, &BasicProperties{ContentType: "a", Headers: warren.Table{"x": int32(1)}, Priority: 3}, nil, 0)
	f.Add(buf[7 : len(buf)-1])
	f.Fuzz(func(t *testing.T, payload []byte) {
		h, err := ReadContentHeader(payload)
		if err != nil {
			return
		}
		w := Writer{}
		w.Short(h.Class)
		w.Short(0)
		w.LongLong(h.BodySize)
		h.Properties.Write(&w)
		again, err := ReadContentHeader(w.B)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("%v", h), fmt.Sprintf("%v", again))
	})
}

// methods_gen.go is what the generator writes from the specification today.
func TestGeneratedIsCurrent(t *testing.T) {
	out := filepath.Join(t.TempDir(), "methods_gen.go")
	cmd := exec.Command("go", "run", "./gen", "-o", out)
	msg, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", msg)
	want, err := os.ReadFile(out)
	require.NoError(t, err)
	got, err := os.ReadFile("methods_gen.go")
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "methods_gen.go is stale: run go generate in contrib/amqp/internal/wire")
}

// A MethodReader reads what ReadMethod reads; it returns its kept basic.publish and basic.ack
// again (a caller copies what it keeps), and its string cache returns equal strings, the
// cached one for a string read before, whatever the other strings sharing its slot.
func TestMethodReader(t *testing.T) {
	mr := NewMethodReader()
	read := func(m Method) Method {
		t.Helper()
		frame := AppendMethod(nil, 1, m)
		got, err := mr.Method(frame[7 : len(frame)-1])
		require.NoError(t, err)
		require.Equal(t, m, got)
		return got
	}
	for _, m := range everyMethod() {
		read(m)
	}
	first := read(&BasicPublish{Exchange: "x", RoutingKey: "k1", Mandatory: true})
	kept := *first.(*BasicPublish)
	second := read(&BasicPublish{RoutingKey: "k2"})
	require.Same(t, first, second, "basic.publish is kept, not allocated")
	require.Equal(t, BasicPublish{Exchange: "x", RoutingKey: "k1", Mandatory: true}, kept)
	require.Same(t, read(&BasicAck{DeliveryTag: 1}), read(&BasicAck{DeliveryTag: 2, Multiple: true}))

	// More keys than slots: every read is still the key it was.
	for round := range 3 {
		for i := range 200 {
			key := fmt.Sprintf("key-%d", i)
			got := read(&BasicPublish{RoutingKey: key}).(*BasicPublish)
			require.Equal(t, key, got.RoutingKey, "round %d", round)
		}
	}
	// The content header's strings go through the same cache.
	props := &BasicProperties{ContentType: "application/json", Type: "t"}
	for range 2 {
		buf := AppendContent(nil, 1, props, []byte("body"), 0)
		h, err := mr.ContentHeader(buf[7 : bytes.IndexByte(buf[7:], FrameEnd)+7])
		require.NoError(t, err)
		require.Equal(t, *props, h.Properties)
	}
	publish := AppendMethod(nil, 1, &BasicPublish{RoutingKey: "wb1.backlog"})
	ack := AppendMethod(nil, 1, &BasicAck{DeliveryTag: 7})
	allocs := testing.AllocsPerRun(100, func() {
		mr.Method(publish[7 : len(publish)-1])
		mr.Method(ack[7 : len(ack)-1])
	})
	require.Zero(t, allocs, "a publish with a routing key read before, and an ack, allocate nothing")
}

package admin_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// How a message is shown (messages.go).

func TestReadableHeaders(t *testing.T) {
	e := newEnv(t)
	_, err := e.b.DeclareQueue("h")
	require.NoError(t, err)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	publish(t, e.b, "h", warren.Message{Body: []byte{0xff, 0x00}, Headers: warren.Table{
		"when": at, "raw": []byte{0xff}, "text": []byte("hi"), "price": warren.Decimal{Scale: 2, Value: -5},
		"nested": warren.Table{"n": int32(7), "list": []any{"a", int64(2)}},
	}})
	var page struct {
		Messages []struct {
			Body         string
			BodyEncoding string `json:"body_encoding"`
			Headers      map[string]any
		}
	}
	e.get(t, "api/queues/h/messages", &page)
	require.Len(t, page.Messages, 1)
	m := page.Messages[0]
	assert.Equal(t, "base64", m.BodyEncoding)
	assert.Equal(t, "/wA=", m.Body)
	assert.Equal(t, map[string]any{"when": "2026-01-02T03:04:05Z", "raw": "base64:/w==", "text": "hi", "price": "-0.05",
		"nested": map[string]any{"n": float64(7), "list": []any{"a", float64(2)}}}, m.Headers)
}

// TestOpaqueHeaders: header values of types AMQP has none for, which an in-memory broker passes
// along, are shown without being followed: a number as Go prints it, a list of routing keys as
// a list, anything else by its type alone. A slice of tables holding the headers themselves
// (not a cycle the broker sees: it does not look into values of other types) made the view
// print them without end, and the process died of it.
func TestOpaqueHeaders(t *testing.T) {
	e := newEnv(t)
	_, err := e.b.DeclareQueue("h")
	require.NoError(t, err)
	loop := warren.Table{"wait": 1500 * time.Millisecond, "CC": []string{"a", "b"}, "big": uint64(1 << 40)}
	loop["loop"] = []warren.Table{loop}
	publish(t, e.b, "h", warren.Message{Body: []byte("x"), Headers: loop})
	var page struct {
		Messages []struct{ Headers map[string]any }
	}
	e.get(t, "api/queues/h/messages", &page)
	require.Len(t, page.Messages, 1)
	assert.Equal(t, map[string]any{"wait": "1.5s", "CC": []any{"a", "b"}, "big": "1099511627776", "loop": "([]warren.Table)"},
		page.Messages[0].Headers)
	code, _, body := e.page(t, "queues/h")
	require.Equal(t, 200, code)
	assert.Contains(t, body, "loop: ([]warren.Table)")
}

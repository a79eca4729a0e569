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

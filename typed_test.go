package warren_test

// Tests of typed payloads (typed.go): codecs, PublishJSON, Encode, Decode and the typed
// handlers, under Serve.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// order is the payload of the typed tests.
type order struct {
	ID    int      `json:"id"`
	Items []string `json:"items"`
}

// TestJSONHandlerRoundTrip: a struct published with PublishJSON through the Backend interface
// is received typed by a JSONHandler served through it, with content type "application/json";
// a T that is a pointer decodes into a new value; the handler's own result settles the
// delivery as any handler's does (an error retries, nil acks).
func TestJSONHandlerRoundTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "orders")
		var be warren.Backend = b // what contrib/rabbitmq's Client also is
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()

		var (
			mu   sync.Mutex
			got  []order
			seen []string
		)
		h := func(ctx context.Context, o *order, d warren.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, fmt.Sprintf("%d/%d %s", o.ID, d.DeliveryCount, d.Message.ContentType))
			if o.ID == 2 && d.DeliveryCount == 0 {
				return errors.New("downstream unavailable") // retried
			}
			got = append(got, *o)
			return nil
		}
		served := make(chan error, 1)
		go func() { served <- be.Serve(ctx, "orders", warren.JSONHandler(h)) }()
		synctest.Wait()

		require.NoError(t, warren.PublishJSON(ctx, be, "", "orders", order{ID: 1, Items: []string{"apple", "pear"}}))
		require.NoError(t, warren.PublishJSON(ctx, be, "", "orders", &order{ID: 2}))
		synctest.Wait()

		mu.Lock()
		require.Equal(t, []string{"1/0 application/json", "2/0 application/json", "2/1 application/json"}, seen)
		require.Equal(t, []order{{ID: 1, Items: []string{"apple", "pear"}}, {ID: 2}}, got)
		mu.Unlock()
		s := q.Stats()
		require.Equal(t, [3]uint64{2, 1, 0}, [3]uint64{s.Acked, s.Nacked, s.Rejected}, "Acked, Nacked, Rejected")

		cancel()
		require.NoError(t, <-served)
	})
}

// TestJSONHandlerBadPayloadDeadLetteredOnFirstAttempt (issue 18's acceptance test): a payload
// that does not decode — not JSON, JSON of the wrong shape, or of another content type — is a
// permanent failure: it never reaches the handler, and Serve rejects it on its first attempt
// (DeliveryCount 0), without waiting for the backoff and although the queue's delivery limit
// would allow 5 more, so it is dead-lettered at once with x-death reason "rejected" (a retried
// message would come with "delivery_limit", after 6 attempts). The decode error is logged with
// the rejection, and a good message next to the bad ones is handled.
func TestJSONHandlerBadPayloadDeadLetteredOnFirstAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs logBuffer
		b := newBroker(t, warren.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
		main, dlq := dlqTopology(t, b, warren.DeliveryLimit(5))
		start := time.Now()
		bad := map[string]warren.Message{
			"not json":     {Body: []byte(`{"id": 1,`), ContentType: "application/json"},
			"wrong shape":  {Body: []byte(`{"id": "one"}`)},
			"content type": {Body: []byte(`{"id": 3}`), ContentType: "text/plain"},
		}
		for _, m := range bad {
			publishMsg(t, b, "main", m)
		}
		require.NoError(t, warren.PublishJSON(t.Context(), b, "", "main", order{ID: 4}))

		var (
			tries   attempts
			handled []int
		)
		h := warren.JSONHandler(func(ctx context.Context, o order, d warren.Delivery) error {
			handled = append(handled, o.ID) // one worker
			return nil
		})
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, main, h, warren.Middleware(tries.middleware), warren.Backoff(time.Minute, time.Hour))
		synctest.Wait()

		require.Equal(t, []int{4}, handled, "only the good message reaches the handler")
		require.Zero(t, time.Since(start), "no backoff was waited for")
		s := main.Stats()
		require.Equal(t, [4]uint64{4, 1, 0, 3}, [4]uint64{s.Delivered, s.Acked, s.Nacked, s.Rejected},
			"Delivered, Acked, Nacked, Rejected: each message once, the bad ones rejected")
		require.Equal(t, 0, main.Len()+main.Unacked())
		for name, m := range bad {
			a := tries.of(string(m.Body))
			require.Len(t, a, 1, "%s: attempted once", name)
			require.Equal(t, 0, a[0].count, "%s: on its first delivery", name)
			require.ErrorIs(t, a[0].err, warren.ErrPermanent, name)
		}

		dead := getAll(t, dlq)
		require.Len(t, dead, len(bad))
		for _, d := range dead {
			x := xDeath(t, d)
			require.Len(t, x, 1)
			require.Equal(t, "rejected", x[0]["reason"], "%s", d.Message.Body)
			require.Equal(t, "main", x[0]["queue"])
			require.Equal(t, int64(1), x[0]["count"])
			require.Equal(t, 0, d.DeliveryCount)
			require.False(t, d.Redelivered)
		}

		recs := logs.records(t, "warren: handler failed permanently; delivery rejected")
		require.Len(t, recs, len(bad), "each rejection is logged with its reason")
		var reasons []string
		for _, r := range recs {
			require.Equal(t, "WARN", r["level"])
			require.Equal(t, "main", r["queue"])
			reasons = append(reasons, fmt.Sprint(r["err"]))
		}
		all := strings.Join(reasons, "\n")
		require.Contains(t, all, "warren: decode warren_test.order from \"application/json\": permanent failure: unexpected end of JSON input")
		require.Contains(t, all, "cannot unmarshal string into Go struct field order.id of type int")
		require.Contains(t, all, "content type \"text/plain\", want \"application/json\"")

		cancel()
		require.NoError(t, run.wait())
	})
}

// TestDecodeContentType: Decode compares content types as media types — case-insensitive,
// parameters ignored — and checks nothing when either side has none; a mismatch, and a body
// that does not decode, are errors wrapping ErrPermanent, and the codec's own error is kept.
// It serves a pull consumer (Get) as the typed handlers serve Serve.
func TestDecodeContentType(t *testing.T) {
	for _, tc := range []struct {
		contentType string
		ok          bool
	}{
		{"", true},
		{"application/json", true},
		{"Application/JSON", true},
		{"application/json; charset=utf-8", true},
		{" application/json ;charset=utf-8", true},
		{"text/plain", false},
		{"application/jsonx", false},
		{"application/vnd.shop.order+json", false}, // another type: a codec of its own (see JSONCodec)
		{";", false},
	} {
		got, err := warren.Decode[order](warren.JSONCodec{}, warren.Message{Body: []byte(`{"id":7}`), ContentType: tc.contentType})
		if tc.ok {
			require.NoError(t, err, "Decode(%q)", tc.contentType)
			require.Equal(t, order{ID: 7}, got)
			continue
		}
		require.ErrorIs(t, err, warren.ErrPermanent, "Decode(%q)", tc.contentType)
		require.Zero(t, got)
	}

	_, err := warren.Decode[order](nil, warren.Message{Body: []byte(`[1]`)}) // nil is JSON
	require.ErrorIs(t, err, warren.ErrPermanent)
	var typeErr *json.UnmarshalTypeError
	require.ErrorAs(t, err, &typeErr, "the codec's error is kept")
	requireOnePrefix(t, err)

	v, err := warren.Decode[string](textCodec{contentType: ""}, warren.Message{Body: []byte("x"), ContentType: "image/png"})
	require.NoError(t, err, "a codec without a content type checks none")
	require.Equal(t, "x", v)

	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		require.NoError(t, warren.PublishJSON(t.Context(), b, "", "q", order{ID: 9}))
		d, err := q.Get(t.Context())
		require.NoError(t, err)
		o, err := warren.Decode[order](nil, d.Message)
		require.NoError(t, err)
		require.Equal(t, order{ID: 9}, o)
		require.NoError(t, d.Ack())
	})
}

// textCodec is a Codec of strings and fmt.Stringers as their text, and of ints as decimal
// text, with a content type of its choosing.
type textCodec struct{ contentType string }

func (c textCodec) ContentType() string { return c.contentType }

func (textCodec) Marshal(v any) ([]byte, error) {
	switch v := v.(type) {
	case string:
		return []byte(v), nil
	case int:
		return strconv.AppendInt(nil, int64(v), 10), nil
	case fmt.Stringer:
		return []byte(v.String()), nil
	}
	return nil, fmt.Errorf("textCodec: cannot marshal %T", v)
}

func (textCodec) Unmarshal(data []byte, v any) error {
	switch v := v.(type) {
	case *string:
		*v = string(data)
		return nil
	case *int:
		n, err := strconv.Atoi(string(data))
		*v = n
		return err
	}
	return fmt.Errorf("textCodec: cannot unmarshal into %T", v)
}

// TestCodecHandlerCustomCodec: a codec of one's own encodes with Encode (which sets its content
// type) and decodes with CodecHandler; a message of another content type, or that the codec
// cannot read, is rejected at once; a value the codec cannot encode is refused by Encode and
// PublishJSON with ErrInvalidArgument, and nothing is published; a nil handler makes a nil
// Handler, which Serve refuses.
func TestCodecHandlerCustomCodec(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		main, dlq := dlqTopology(t, b, warren.DeliveryLimit(3))
		codec := textCodec{contentType: "text/x-int"}

		m, err := warren.Encode(codec, 42)
		require.NoError(t, err)
		require.Equal(t, warren.Message{Body: []byte("42"), ContentType: "text/x-int"}, m)
		m.MessageID = "the answer" // Encode's message is the publisher's to complete
		publishMsg(t, b, "main", m)
		publishMsg(t, b, "main", warren.Message{Body: []byte("forty-two"), ContentType: "text/x-int"})
		require.NoError(t, warren.PublishJSON(t.Context(), b, "", "main", 43))

		_, err = warren.Encode(codec, 1.5)
		require.ErrorIs(t, err, warren.ErrInvalidArgument)
		require.ErrorContains(t, err, "textCodec: cannot marshal float64")
		err = warren.PublishJSON(t.Context(), b, "", "main", make(chan int))
		require.ErrorIs(t, err, warren.ErrInvalidArgument)
		var unsupported *json.UnsupportedTypeError
		require.ErrorAs(t, err, &unsupported)
		requireOnePrefix(t, err)
		ended, cancelEnded := context.WithCancel(t.Context())
		cancelEnded()
		require.ErrorIs(t, warren.PublishJSON(ended, b, "", "main", 44), context.Canceled)
		require.Equal(t, 3, main.Len(), "nothing more was published")

		var (
			mu  sync.Mutex
			got []string
		)
		h := warren.CodecHandler(codec, func(ctx context.Context, n int, d warren.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, fmt.Sprintf("%d %s", n, d.Message.MessageID))
			return nil
		})
		ctx, cancel := context.WithCancel(t.Context())
		run := startServe(ctx, main, h)
		synctest.Wait()
		mu.Lock()
		require.Equal(t, []string{"42 the answer"}, got)
		mu.Unlock()
		dead := getAll(t, dlq)
		require.Equal(t, "forty-two 43", bodies(dead))
		for _, d := range dead {
			require.Equal(t, "rejected", xDeath(t, d)[0]["reason"])
		}
		cancel()
		require.NoError(t, run.wait())

		nilHandler := warren.CodecHandler[int](codec, nil)
		require.Nil(t, nilHandler)
		require.ErrorIs(t, main.Serve(t.Context(), nilHandler), warren.ErrInvalidArgument)
	})
}

package warren

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
)

// Typed payloads: values in message bodies, encoded by a [Codec] (JSON unless told otherwise),
// published with [PublishJSON] or [Encode], and handed to a typed handler by [JSONHandler] or
// [CodecHandler], which are plain [Handler]s: they run under [Queue.Serve], [Broker.Serve], any
// [Backend]'s Serve and [ServeSource] alike, with the same settlement by the handler's result.
//
// A body that does not decode cannot be fixed by delivering it again, so it is a permanent
// failure: the error wraps [ErrPermanent], Serve rejects the message on its first delivery, and
// the queue dead-letters it (x-death reason "rejected") or drops it. Serve logs the decode error
// with the rejection (see [Queue.Serve]); the message itself is dead-lettered unchanged, as
// RabbitMQ does, so the text is not in its headers.

// Codec turns values into message bodies and back: a body format. Marshal and Unmarshal must be
// safe for concurrent use; Unmarshal is given a pointer to the value to fill, as
// [encoding/json.Unmarshal] is, and must not keep data, which is the message's shared body.
//
// Wherever warren takes a Codec, nil means [JSONCodec].
type Codec interface {
	// ContentType is the MIME type of what Marshal writes, without parameters
	// ("application/json"): [Encode] sets it as the message's ContentType, and [Decode] refuses
	// a message that says it is of another type. "" sets and checks nothing.
	ContentType() string
	// Marshal returns the encoding of v.
	Marshal(v any) ([]byte, error)
	// Unmarshal decodes data into the value v points to.
	Unmarshal(data []byte, v any) error
}

// JSONCodec is the default [Codec]: encoding/json, content type "application/json". Its zero
// value is ready to use. Unknown object fields are ignored, as encoding/json ignores them, so a
// consumer keeps reading what a newer publisher writes. For JSON under a media type of its own
// ("application/vnd.shop.order+json"), embed JSONCodec in a type whose ContentType says so.
type JSONCodec struct{}

// ContentType returns "application/json".
func (JSONCodec) ContentType() string { return "application/json" }

// Marshal returns json.Marshal(v).
func (JSONCodec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal returns json.Unmarshal(data, v).
func (JSONCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// Publisher publishes a message and returns its confirm, as [Broker.Publish] does. A [Broker]
// is one, and so is every [Backend] (contrib/rabbitmq's Client).
type Publisher interface {
	Publish(ctx context.Context, exchange, key string, msg Message, opts ...PublishOption) error
}

var _ Publisher = Backend(nil)

// Encode returns a message whose Body is v encoded by c and whose ContentType is c's, for a
// publisher that sets more properties (MessageID, Persistent, Headers, …) before it publishes.
// A value that c cannot encode is an error wrapping [ErrInvalidArgument] and c's error.
func Encode(c Codec, v any) (Message, error) {
	if c == nil {
		c = JSONCodec{}
	}
	body, err := c.Marshal(v)
	if err != nil {
		return Message{}, errorf("encode %T as %q: %w: %w", v, c.ContentType(), ErrInvalidArgument, err)
	}
	return Message{Body: body, ContentType: c.ContentType()}, nil
}

// PublishJSON publishes v as JSON ([JSONCodec]) through p, as p.Publish(ctx, exchange, key, m,
// opts...) does with m a message that holds only the Body and a ContentType of
// "application/json". It returns the publish's confirm; an error wrapping [ErrInvalidArgument]
// when v does not encode (nothing is published); ctx.Err() when ctx is already done. It blocks
// as p.Publish does.
func PublishJSON(ctx context.Context, p Publisher, exchange, key string, v any, opts ...PublishOption) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m, err := Encode(JSONCodec{}, v)
	if err != nil {
		return err
	}
	return p.Publish(ctx, exchange, key, m, opts...)
}

// Decode returns the value m's body holds, decoded by c: the typed counterpart of reading
// [Delivery.Message] for a consumer of [Queue.Consume] or [Queue.Get]. Its errors wrap
// [ErrPermanent], since the same body never decodes: c's error when the body does not decode,
// and a content-type mismatch when m says it is of a type other than c's. Types are compared
// as MIME media types: case-insensitive, parameters ignored ("application/json;
// charset=utf-8" is JSON); a message without a ContentType, or a codec without one, is not
// checked, and Message.ContentEncoding is not consulted (a compressed body fails to decode
// unless c undoes the compression).
func Decode[T any](c Codec, m Message) (T, error) {
	return decode[T](c, &m)
}

// decode is Decode without copying the message.
func decode[T any](c Codec, m *Message) (T, error) {
	var v T
	if c == nil {
		c = JSONCodec{}
	}
	if want := c.ContentType(); !sameMediaType(m.ContentType, want) {
		return v, errorf("decode %v: content type %q, want %q: %w", reflect.TypeFor[T](), m.ContentType, want, ErrPermanent)
	}
	if err := c.Unmarshal(m.Body, &v); err != nil {
		var zero T
		return zero, errorf("decode %v from %q: %w", reflect.TypeFor[T](), c.ContentType(), Permanent(err))
	}
	return v, nil
}

// sameMediaType reports whether content types got and want name the same media type, or one
// of them is empty. The comparison is RFC 2045's: the type and subtype, case-insensitive,
// without parameters. It does not allocate.
func sameMediaType(got, want string) bool {
	if got == "" || want == "" {
		return true
	}
	return strings.EqualFold(mediaType(got), mediaType(want))
}

// mediaType returns a content type without its parameters and surrounding space.
func mediaType(s string) string {
	if i := strings.IndexByte(s, ';'); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}

// JSONHandler returns a [Handler] that decodes each delivery's body as JSON into a T and calls
// h with it: CodecHandler(JSONCodec{}, h).
func JSONHandler[T any](h func(ctx context.Context, v T, d Delivery) error) Handler {
	return CodecHandler(JSONCodec{}, h)
}

// CodecHandler returns a [Handler] that decodes each delivery's body into a T with c, as
// [Decode] does, and calls h with the value and the delivery; h's result is the handler's, and
// settles the delivery as [Queue.Serve] says. A body that does not decode, or whose content
// type is not c's, is not given to h: the handler fails with Decode's error, which wraps
// [ErrPermanent], so Serve rejects the message on its first delivery — dead-lettered with
// reason "rejected" when the queue has a dead-letter exchange, dropped otherwise — and logs
// the error. A nil c is [JSONCodec]. A nil h returns a nil Handler, which Serve refuses with
// [ErrInvalidArgument].
//
// Each delivery decodes into a new T; h may keep it. T may be a pointer type (*Order), which
// decodes into a new value.
func CodecHandler[T any](c Codec, h func(ctx context.Context, v T, d Delivery) error) Handler {
	if h == nil {
		return nil
	}
	if c == nil {
		c = JSONCodec{}
	}
	return func(ctx context.Context, d Delivery) error {
		v, err := decode[T](c, &d.Message)
		if err != nil {
			return err
		}
		return h(ctx, v, d)
	}
}

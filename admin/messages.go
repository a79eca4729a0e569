package admin

import (
	"encoding/base64"
	"fmt"
	"reflect"
	"time"
	"unicode/utf8"

	"github.com/warrenmq/warren"
)

// Messages as the API shows them: properties by name, headers as plain JSON values, the x-death
// history parsed, and the body as text when it is UTF-8.

// messageInfo is a ready message as GET /api/queues/{name}/messages lists it.
type messageInfo struct {
	ID            uint64         `json:"id"` // for after= and a move's ids
	Redelivered   bool           `json:"redelivered"`
	DeliveryCount int            `json:"delivery_count"`
	Properties    properties     `json:"properties"`
	Headers       map[string]any `json:"headers,omitempty"` // readable; x-death is in Deaths
	Deaths        []death        `json:"deaths,omitempty"`  // the x-death history, newest first
	Body          string         `json:"body"`              // up to maxShownBody bytes of it
	BodyEncoding  string         `json:"body_encoding"`     // "text" (UTF-8) or "base64"
	BodySize      int            `json:"body_size"`
	BodyTruncated bool           `json:"body_truncated,omitempty"`
}

// maxShownBody is how much of a body a page shows.
const maxShownBody = 4 << 10

// properties are a message's AMQP properties; those not set are left out.
type properties struct {
	ContentType     string    `json:"content_type,omitempty"`
	ContentEncoding string    `json:"content_encoding,omitempty"`
	Persistent      bool      `json:"persistent,omitempty"`
	Priority        uint8     `json:"priority,omitempty"`
	CorrelationID   string    `json:"correlation_id,omitempty"`
	ReplyTo         string    `json:"reply_to,omitempty"`
	Expiration      string    `json:"expiration,omitempty"`
	MessageID       string    `json:"message_id,omitempty"`
	Timestamp       time.Time `json:"timestamp,omitzero"`
	Type            string    `json:"type,omitempty"`
	UserID          string    `json:"user_id,omitempty"`
	AppID           string    `json:"app_id,omitempty"`
}

// death is one entry of a message's x-death history ([warren.Death]).
type death struct {
	Queue              string    `json:"queue"`
	Reason             string    `json:"reason"`
	Count              int64     `json:"count"`
	Time               time.Time `json:"time,omitzero"`
	Exchange           string    `json:"exchange"`
	RoutingKeys        []string  `json:"routing_keys,omitempty"`
	OriginalExpiration string    `json:"original_expiration,omitempty"`
}

func messageInfoOf(r warren.ReadyMessage) messageInfo {
	m := r.Message
	info := messageInfo{ID: r.ID, Redelivered: r.Redelivered, DeliveryCount: r.DeliveryCount, BodySize: len(m.Body),
		Properties: properties{ContentType: m.ContentType, ContentEncoding: m.ContentEncoding,
			Persistent: m.Persistent, Priority: m.Priority, CorrelationID: m.CorrelationID, ReplyTo: m.ReplyTo,
			Expiration: m.Expiration, MessageID: m.MessageID, Timestamp: m.Timestamp, Type: m.Type,
			UserID: m.UserID, AppID: m.AppID}}
	for _, d := range m.Deaths() {
		info.Deaths = append(info.Deaths, death{Queue: d.Queue, Reason: string(d.Reason), Count: d.Count, Time: d.Time,
			Exchange: d.Exchange, RoutingKeys: d.RoutingKeys, OriginalExpiration: d.OriginalExpiration})
	}
	info.Headers = readableTable(m.Headers)
	if info.Deaths != nil {
		delete(info.Headers, "x-death")
		if len(info.Headers) == 0 {
			info.Headers = nil
		}
	}
	body := m.Body
	if len(body) > maxShownBody {
		body, info.BodyTruncated = body[:maxShownBody], true
		for i := 0; i < 3 && len(body) > 0 && !utf8.Valid(body); i++ {
			body = body[:len(body)-1] // a rune cut at the end
		}
	}
	if utf8.Valid(body) {
		info.Body, info.BodyEncoding = string(body), "text"
	} else {
		info.Body, info.BodyEncoding = base64.StdEncoding.EncodeToString(body), "base64"
	}
	return info
}

// readableTable returns t with each value made readable; nil for an empty t.
func readableTable(t warren.Table) map[string]any { return readableAt(t, 0) }

// maxShownDepth bounds how deeply readable follows tables and arrays: as deep as a broker lets
// them nest (it refuses deeper headers and arguments, and tables that contain themselves), and
// no deeper whatever it is given, so that no table can make a read recurse without end.
const maxShownDepth = 32

// tooDeep is what readable shows for a value deeper than maxShownDepth.
const tooDeep = "(nested too deep to show)"

// readableAt is readableTable for a table whose values are at depth.
func readableAt(t map[string]any, depth int) map[string]any {
	if len(t) == 0 {
		return nil
	}
	out := make(map[string]any, len(t))
	for k, v := range t {
		out[k] = readable(v, depth)
	}
	return out
}

// readable returns an AMQP field value ([warren.Table]'s types), at depth, as a plain JSON value:
// numbers, strings and booleans as they are, tables and arrays element by element down to
// maxShownDepth, a time in RFC 3339, bytes as text when they are UTF-8 (else base64, prefixed
// "base64:"), and a decimal as its decimal string. A value of another type, which an in-memory
// broker passes along in headers, is shown by [opaque].
func readable(v any, depth int) any {
	if depth > maxShownDepth {
		return tooDeep
	}
	switch v := v.(type) {
	case warren.Table:
		return readableAt(v, depth+1)
	case map[string]any:
		return readableAt(v, depth+1)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = readable(e, depth+1)
		}
		return out
	case []byte:
		if utf8.Valid(v) {
			return string(v)
		}
		return "base64:" + base64.StdEncoding.EncodeToString(v)
	case time.Time:
		return v.UTC().Format(time.RFC3339)
	case warren.Decimal:
		return v.String()
	case nil, bool, string, int8, int16, int32, int64, int, uint8, uint16, uint32, float32, float64:
		return v
	case []string:
		return v // CC and BCC routing keys, as a publisher may give them
	}
	return opaque(v)
}

// opaque shows a value that is not an AMQP field type: a number, string or boolean as Go prints
// it; anything else by its type alone, "([]main.Order)", since printing it could follow its
// pointers, maps and slices without end (a slice holding the table it is in).
func opaque(v any) string {
	switch reflect.ValueOf(v).Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint,
		reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr, reflect.Float32,
		reflect.Float64, reflect.Complex64, reflect.Complex128, reflect.String:
		return fmt.Sprint(v)
	}
	return fmt.Sprintf("(%T)", v)
}

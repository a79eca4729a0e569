package rabbitmq

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
)

// Conversions between warren's values and amqp091-go's.

// amqpTable returns t as an amqp.Table, nested tables and arrays converted too, and a
// warren.Decimal as amqp091-go's (its other field types are warren's). A nil or empty t is nil.
func amqpTable(t warren.Table) amqp.Table {
	if len(t) == 0 {
		return nil
	}
	out := make(amqp.Table, len(t))
	for k, v := range t {
		out[k] = amqpField(v)
	}
	return out
}

func amqpField(v any) any {
	switch v := v.(type) {
	case warren.Table:
		return amqpTableOrEmpty(v)
	case map[string]any:
		return amqpTableOrEmpty(v)
	case []any:
		a := make([]any, len(v))
		for i, e := range v {
			a[i] = amqpField(e)
		}
		return a
	case warren.Decimal:
		return amqp.Decimal{Scale: v.Scale, Value: v.Value}
	}
	return v
}

func amqpTableOrEmpty(t warren.Table) amqp.Table {
	if out := amqpTable(t); out != nil {
		return out
	}
	return amqp.Table{}
}

// publishing returns msg as amqp091-go's Publishing, with headers (copied) plus extra when
// extra is not empty.
func publishing(msg warren.Message, extraKey, extraValue string) amqp.Publishing {
	headers := amqpTable(msg.Headers)
	if extraKey != "" {
		if headers == nil {
			headers = amqp.Table{}
		}
		headers[extraKey] = extraValue
	}
	mode := amqp.Transient
	if msg.Persistent {
		mode = amqp.Persistent
	}
	return amqp.Publishing{
		Headers: headers, ContentType: msg.ContentType, ContentEncoding: msg.ContentEncoding, DeliveryMode: mode,
		Priority: msg.Priority, CorrelationId: msg.CorrelationID, ReplyTo: msg.ReplyTo, Expiration: msg.Expiration,
		MessageId: msg.MessageID, Timestamp: msg.Timestamp, Type: msg.Type, UserId: msg.UserID, AppId: msg.AppID,
		Body: msg.Body,
	}
}

// message returns a RabbitMQ delivery's message as warren's, without the client's own headers.
func message(d amqp.Delivery) warren.Message {
	var headers warren.Table
	for k, v := range d.Headers {
		if k == publishIDHeader || k == retriesHeader {
			continue
		}
		if headers == nil {
			headers = warren.Table{}
		}
		headers[k] = warrenField(v)
	}
	return warren.Message{Body: d.Body, Headers: headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		Persistent: d.DeliveryMode == amqp.Persistent, Priority: d.Priority, CorrelationID: d.CorrelationId, ReplyTo: d.ReplyTo,
		Expiration: d.Expiration, MessageID: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, UserID: d.UserId, AppID: d.AppId}
}

// warrenField returns an AMQP field value as warren's: tables as warren.Table, decimals as
// warren.Decimal.
func warrenField(v any) any {
	switch v := v.(type) {
	case amqp.Table:
		t := make(warren.Table, len(v))
		for k, e := range v {
			t[k] = warrenField(e)
		}
		return t
	case []any:
		a := make([]any, len(v))
		for i, e := range v {
			a[i] = warrenField(e)
		}
		return a
	case amqp.Decimal:
		return warren.Decimal{Scale: v.Scale, Value: v.Value}
	}
	return v
}

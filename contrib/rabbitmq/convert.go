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

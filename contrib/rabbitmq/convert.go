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

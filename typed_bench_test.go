package warren_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/warrenmq/warren"
)

// BenchmarkJSONHandler: the cost of a typed handler, called directly on a delivery of a small
// JSON order (no broker): handler is JSONHandler's decode and call; unmarshal is
// json.Unmarshal of the same body into a new order, the floor it adds to.
func BenchmarkJSONHandler(b *testing.B) {
	body, err := json.Marshal(order{ID: 42, Items: []string{"apple", "pear"}})
	if err != nil {
		b.Fatal(err)
	}
	d := warren.Delivery{Message: warren.Message{Body: body, ContentType: "application/json; charset=utf-8"}}
	b.Run("handler", func(b *testing.B) {
		h := warren.JSONHandler(func(ctx context.Context, o order, d warren.Delivery) error {
			if o.ID != 42 {
				b.Fatalf("decoded %+v", o)
			}
			return nil
		})
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			if err := h(ctx, d); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var o order
			if err := json.Unmarshal(body, &o); err != nil || o.ID != 42 {
				b.Fatal(o, err)
			}
		}
	})
}

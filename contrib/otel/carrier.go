package warrenotel

import (
	"maps"
	"slices"

	"go.opentelemetry.io/otel/propagation"

	"github.com/warrenmq/warren"
)

// HeaderCarrier is a [propagation.TextMapCarrier] over a message's headers: how a span
// context travels in a [warren.Message], for the rare code that injects or extracts one itself
// (a consumer that uses [warren.Queue.Get] or [warren.Consumer.Deliveries] rather than Serve).
// [Tracer.Publish] and [Tracer.Middleware] use it.
//
// Values are strings, the type AMQP clients give a header's long string; Get also reads a
// []byte value, which some clients make of one, and treats any other type as absent. Set writes
// into the table: give it a table of your own, never a published message's Headers, which are
// shared with every copy of the message ([warren.Message]).
type HeaderCarrier warren.Table

var _ propagation.TextMapCarrier = HeaderCarrier(nil)

// Get returns the value of the header key as a string, or "" when it is absent or not a string.
func (c HeaderCarrier) Get(key string) string {
	switch v := c[key].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// Set sets the header key to value. It panics on a nil HeaderCarrier, as a nil map does.
func (c HeaderCarrier) Set(key, value string) { c[key] = value }

// Keys returns the names of the headers, sorted.
func (c HeaderCarrier) Keys() []string { return slices.Sorted(maps.Keys(c)) }

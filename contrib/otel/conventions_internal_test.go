package warrenotel

import "testing"

// Destination names, as RabbitMQ's conventions (semconv v1.43.0, rabbitmq.md note [1]) give
// them.

func TestPublishDestination(t *testing.T) {
	for _, tc := range []struct{ exchange, key, want string }{
		{"logs", "warning", "logs:warning"},
		{"logs", "", "logs"},
		{"", "jobs", "jobs"},
		{"", "", "amq.default"},
	} {
		if got := publishDestination(tc.exchange, tc.key); got != tc.want {
			t.Errorf("publishDestination(%q, %q) = %q, want %q", tc.exchange, tc.key, got, tc.want)
		}
	}
}

func TestConsumeDestination(t *testing.T) {
	for _, tc := range []struct{ exchange, key, queue, want string }{
		{"logs", "warning", "warnings", "logs:warning:warnings"},
		{"logs", "warning", "warning", "logs:warning"}, // the queue is the routing key
		{"", "jobs", "jobs", "jobs"},                   // the default exchange's usual case
		{"", "jobs", "other", "jobs:other"},
		{"logs", "", "all", "logs:all"}, // a fanout exchange
		{"logs", "warning", "", "logs:warning"},
		{"", "", "", ""},
	} {
		if got := consumeDestination(tc.exchange, tc.key, tc.queue); got != tc.want {
			t.Errorf("consumeDestination(%q, %q, %q) = %q, want %q", tc.exchange, tc.key, tc.queue, got, tc.want)
		}
	}
}

func TestSpanName(t *testing.T) {
	for _, tc := range []struct {
		op, dest string
		anon     bool
		want     string
	}{
		{"publish", "logs:warning", false, "publish logs:warning"},
		{"process", "amq.gen-x", true, "process"},
		{"ack", "", false, "ack"},
	} {
		if got := spanName(tc.op, tc.dest, tc.anon); got != tc.want {
			t.Errorf("spanName(%q, %q, %v) = %q, want %q", tc.op, tc.dest, tc.anon, got, tc.want)
		}
	}
}

func TestAnonymous(t *testing.T) {
	for _, tc := range []struct {
		exchange, key, queue string
		want                 bool
	}{
		{"", "amq.gen-abc", "", true},   // a publish to a server-named queue
		{"", "", "amq.gen-abc", true},   // consuming from one
		{"x", "amq.gen-abc", "", false}, // a routing key, not a queue
		{"", "jobs", "jobs", false},
	} {
		if got := anonymous(tc.exchange, tc.key, tc.queue); got != tc.want {
			t.Errorf("anonymous(%q, %q, %q) = %v, want %v", tc.exchange, tc.key, tc.queue, got, tc.want)
		}
	}
}

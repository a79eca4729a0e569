package warren_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Tests of RabbitMQ's definitions files (definitions.go).

func TestDefinitionsRoundTrip(t *testing.T) {
	b := newBroker(t)
	richTopology(t, b)
	top := b.Topology()

	for _, vhost := range []string{"", "/", "staging"} {
		var buf bytes.Buffer
		require.NoError(t, top.WriteDefinitions(&buf, vhost))
		back, err := warren.ReadDefinitions(bytes.NewReader(buf.Bytes()), vhost)
		require.NoError(t, err)
		require.Equal(t, top, back, "warren → definitions → topology is the identity (vhost %q)", vhost)

		c := newBroker(t)
		require.NoError(t, c.DeclareTopology(back))
		require.Equal(t, top, c.Topology(), "→ warren")

		other, err := warren.ReadDefinitions(bytes.NewReader(buf.Bytes()), "elsewhere")
		require.NoError(t, err)
		require.Equal(t, warren.Topology{}, other, "another virtual host's: nothing")
	}

	// The file is RabbitMQ's shape: the virtual host listed, each entry with its vhost, the
	// destination type spelled out, arguments as objects (never null).
	var buf bytes.Buffer
	require.NoError(t, top.WriteDefinitions(&buf, "staging"))
	var raw struct {
		VHosts    []map[string]any `json:"vhosts"`
		Queues    []map[string]any `json:"queues"`
		Exchanges []map[string]any `json:"exchanges"`
		Bindings  []map[string]any `json:"bindings"`
	}
	require.NoError(t, json.Unmarshal(buf.Bytes(), &raw))
	require.Equal(t, []map[string]any{{"name": "staging"}}, raw.VHosts)
	require.Len(t, raw.Queues, len(top.Queues))
	require.Equal(t, map[string]any{"name": "orders.dead", "vhost": "staging", "durable": true, "auto_delete": false,
		"arguments": map[string]any{}}, raw.Queues[2])
	require.Equal(t, map[string]any{"name": "billing", "vhost": "staging", "type": "direct", "durable": false, "auto_delete": false,
		"internal": false, "arguments": map[string]any{"alternate-exchange": "unrouted"}}, raw.Exchanges[1])
	require.Equal(t, map[string]any{"source": "billing", "vhost": "staging", "destination": "orders.dlx", "destination_type": "exchange",
		"routing_key": "failed", "arguments": map[string]any{}}, raw.Bindings[2])
}

// Arguments of Go types JSON does not keep come back as their JSON equivalents, which a
// redeclaration finds equivalent.
func TestDefinitionsArgumentTypes(t *testing.T) {
	b := newBroker(t)
	declare(t, b, "typed", warren.Arguments(warren.Table{"x-max-length": int32(7), "x-message-ttl": uint16(500),
		"x-note": []byte("bytes"), "x-ratio": 0.5, "x-nested": warren.Table{"a": int8(1), "list": []any{int16(2), "s", true}}}))
	var buf bytes.Buffer
	require.NoError(t, b.Topology().WriteDefinitions(&buf, ""))
	back, err := warren.ReadDefinitions(&buf, "")
	require.NoError(t, err)
	require.Equal(t, warren.Table{"x-max-length": int64(7), "x-message-ttl": int64(500), "x-note": "bytes", "x-ratio": 0.5,
		"x-nested": warren.Table{"a": int64(1), "list": []any{int64(2), "s", true}}}, back.Queues[0].Arguments)
	require.NoError(t, b.DeclareTopology(warren.Topology{Queues: []warren.QueueDecl{{Name: "typed",
		Arguments: warren.Table{"x-max-length": int64(7), "x-message-ttl": int64(500)}}}}), "numbers compare by value")
}

// A file exported by a real RabbitMQ 3.10.8 (testdata/README.md says how it was made) declares
// in warren, and the broker routes as the RabbitMQ did.
func TestReadRabbitMQ310Definitions(t *testing.T) {
	f, err := os.Open("testdata/rabbitmq-3.10-definitions.json")
	require.NoError(t, err)
	defer f.Close()
	top, err := warren.ReadDefinitions(f, "/")
	require.NoError(t, err)

	var names []string
	for _, q := range top.Queues {
		names = append(names, q.Name)
	}
	require.Equal(t, []string{"audit.log", "billing.invoices", "billing.single", "jobs.quorum", "orders.created", "orders.dead",
		"orders.unrouted", "transient.work"}, names)
	require.Equal(t, warren.QueueDecl{Name: "orders.created", Durable: true, Arguments: warren.Table{
		"x-dead-letter-exchange": "orders.dlx", "x-max-length": int64(10000), "x-message-ttl": int64(60000),
		"x-overflow": "reject-publish"}}, top.Queues[4])
	require.Equal(t, warren.QueueDecl{Name: "transient.work", AutoDelete: true}, top.Queues[7])
	require.Equal(t, warren.ExchangeDecl{Name: "billing", Kind: warren.ExchangeDirect, Durable: true,
		Arguments: warren.Table{"alternate-exchange": "orders.unrouted"}}, top.Exchanges[0])
	require.Contains(t, top.Bindings, warren.BindingDecl{Source: "match", Destination: "billing.single",
		Arguments: warren.Table{"x-match": "all", "region": "eu", "tier": int64(2)}})
	require.Contains(t, top.Bindings, warren.BindingDecl{Source: "orders", Destination: "orders.dlx", ToExchange: true, RoutingKey: "order.failed"})
	require.Len(t, top.Bindings, 9)

	b := newBroker(t)
	require.ErrorIs(t, b.DeclareTopology(top), warren.ErrPreconditionFailed, "a quorum queue, until made classic")
	require.NoError(t, b.DeclareTopology(top.Classic()))
	ctx := context.Background()
	require.NoError(t, b.Publish(ctx, "orders", "order.eu.created", msg("created")))
	require.NoError(t, b.Publish(ctx, "orders", "order.failed", msg("failed")))
	require.NoError(t, b.Publish(ctx, "billing", "nobody", msg("unrouted")))
	require.NoError(t, b.Publish(ctx, "billing", "job", msg("job")))
	require.NoError(t, b.Publish(ctx, "match", "", warren.Message{Body: []byte("eu2"), Headers: warren.Table{"region": "eu", "tier": int32(2)}}))
	for queue, want := range map[string]string{"orders.created": "created", "orders.dead": "failed", "orders.unrouted": "unrouted",
		"jobs.quorum": "job", "billing.single": "eu2", "billing.invoices": "", "audit.log": ""} {
		q, err := b.Queue(queue)
		require.NoError(t, err)
		require.Equal(t, want, drain(t, q), queue)
	}
}

func TestReadDefinitionsRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       error
	}{
		{"not JSON", `{"queues": [`, warren.ErrInvalidArgument},
		{"not an object", `[1, 2]`, warren.ErrInvalidArgument},
		{"a queue without a name", `{"queues": [{"vhost": "/", "durable": true}]}`, warren.ErrInvalidArgument},
		{"an exchange without a name", `{"exchanges": [{"vhost": "/", "type": "direct"}]}`, warren.ErrInvalidArgument},
		{"an unknown destination type", `{"bindings": [{"vhost": "/", "source": "x", "destination": "q", "destination_type": "stream"}]}`, warren.ErrInvalidArgument},
		{"a policy of the virtual host", `{"policies": [{"vhost": "/", "name": "dlx", "pattern": ".*", "apply-to": "queues",
			"definition": {"dead-letter-exchange": "dlx"}, "priority": 0}]}`, warren.ErrUnsupported},
		{"a policy of a one-vhost file", `{"policies": [{"name": "ttl", "pattern": ".*", "definition": {"message-ttl": 1}}]}`, warren.ErrUnsupported},
	} {
		_, err := warren.ReadDefinitions(strings.NewReader(tc.file), "/")
		require.ErrorIs(t, err, tc.want, tc.name)
	}

	// What does not apply to an embedded broker is not read; another virtual host's policy
	// does not apply.
	top, err := warren.ReadDefinitions(strings.NewReader(`{
		"rabbit_version": "3.10.8",
		"users": [{"name": "guest", "password_hash": "x", "tags": ["administrator"]}],
		"vhosts": [{"name": "/"}, {"name": "other"}],
		"permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}],
		"parameters": [], "global_parameters": [{"name": "cluster_name", "value": "rabbit@host"}],
		"policies": [{"vhost": "other", "name": "p", "pattern": ".*", "definition": {"max-length": 1}}],
		"queues": [{"name": "q", "vhost": "/", "durable": true, "auto_delete": false, "arguments": {}},
			{"name": "q2", "vhost": "other", "durable": true, "auto_delete": false, "arguments": {}}],
		"exchanges": [], "bindings": []
	}`), "")
	require.NoError(t, err)
	require.Equal(t, warren.Topology{Queues: []warren.QueueDecl{{Name: "q", Durable: true}}}, top)

	// A file of one virtual host (the management API's /api/definitions/{vhost}) has no vhost
	// fields: its entries are the virtual host's.
	top, err = warren.ReadDefinitions(strings.NewReader(`{"queues": [{"name": "q", "durable": false, "auto_delete": true, "arguments": {"x-max-length": 3}}]}`), "any")
	require.NoError(t, err)
	require.Equal(t, warren.Topology{Queues: []warren.QueueDecl{{Name: "q", AutoDelete: true, Arguments: warren.Table{"x-max-length": int64(3)}}}}, top)
}

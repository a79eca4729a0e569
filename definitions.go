package warren

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"time"
)

// RabbitMQ's definitions: the JSON of `rabbitmqctl export_definitions` and of the management
// API's /api/definitions, for the parts that apply to a warren broker: one virtual host's
// exchanges, queues and bindings.

// definitions is the file's shape. Users, permissions, parameters and limits have no meaning in
// an embedded broker; policies are refused until warren has them (see ReadDefinitions).
type definitions struct {
	RabbitVersion string            `json:"rabbit_version,omitempty"`
	VHosts        []defVHost        `json:"vhosts,omitempty"`
	Queues        []defQueue        `json:"queues"`
	Exchanges     []defExchange     `json:"exchanges"`
	Bindings      []defBinding      `json:"bindings"`
	Policies      []json.RawMessage `json:"policies,omitempty"`
}

type defVHost struct {
	Name string `json:"name"`
}

type defQueue struct {
	Name       string         `json:"name"`
	VHost      string         `json:"vhost"`
	Durable    bool           `json:"durable"`
	AutoDelete bool           `json:"auto_delete"`
	Arguments  map[string]any `json:"arguments"`
}

type defExchange struct {
	Name       string         `json:"name"`
	VHost      string         `json:"vhost"`
	Type       string         `json:"type"`
	Durable    bool           `json:"durable"`
	AutoDelete bool           `json:"auto_delete"`
	Internal   bool           `json:"internal"`
	Arguments  map[string]any `json:"arguments"`
}

type defBinding struct {
	Source          string         `json:"source"`
	VHost           string         `json:"vhost"`
	Destination     string         `json:"destination"`
	DestinationType string         `json:"destination_type"`
	RoutingKey      string         `json:"routing_key"`
	Arguments       map[string]any `json:"arguments"`
}

type defPolicy struct {
	Name  string `json:"name"`
	VHost string `json:"vhost"`
}

// DefaultVHost is RabbitMQ's default virtual host, "/".
const DefaultVHost = "/"

// ReadDefinitions reads a RabbitMQ definitions file (JSON, as `rabbitmqctl export_definitions`
// writes it, or the management API's /api/definitions; a file of one virtual host, as
// /api/definitions/{vhost} gives, too) and returns the topology of the virtual host vhost ("" is
// [DefaultVHost]): its exchanges, queues and bindings, in [Broker.Topology]'s order. Declare it
// with [Broker.DeclareTopology] (after [Topology.Classic] if it has quorum queues).
//
// The file's users, permissions, virtual hosts' limits and parameters are not read: an
// embedded broker has none. Its policies are refused, with an error wrapping
// [ErrUnsupported], when one applies to vhost: warren has no policies, and declaring the queues
// without theirs would run them differently than RabbitMQ does (set the policies' keys as the
// queues' arguments instead). Numbers in arguments become int64 when they are integers,
// float64 otherwise. A file that is not such JSON, or an entry without a name where one is
// needed, is an error wrapping [ErrInvalidArgument].
func ReadDefinitions(r io.Reader, vhost string) (Topology, error) {
	if vhost == "" {
		vhost = DefaultVHost
	}
	dec := json.NewDecoder(r)
	dec.UseNumber()
	var d definitions
	if err := dec.Decode(&d); err != nil {
		return Topology{}, errorf("read definitions: %v: %w", err, ErrInvalidArgument)
	}
	// A file of one virtual host (/api/definitions/{vhost}) leaves vhost out of its entries.
	in := func(v string) bool { return v == vhost || v == "" }
	for _, raw := range d.Policies {
		var p defPolicy
		if err := json.Unmarshal(raw, &p); err != nil {
			return Topology{}, errorf("read definitions: policy: %v: %w", err, ErrInvalidArgument)
		}
		if in(p.VHost) {
			return Topology{}, errorf("read definitions: policy %q of virtual host %q: warren has no policies; set its keys as the queues' arguments: %w", p.Name, vhost, ErrUnsupported)
		}
	}
	var t Topology
	for _, x := range d.Exchanges {
		if !in(x.VHost) {
			continue
		}
		if x.Name == "" {
			return Topology{}, errorf("read definitions: an exchange without a name: %w", ErrInvalidArgument)
		}
		t.Exchanges = append(t.Exchanges, ExchangeDecl{Name: x.Name, Kind: x.Type, Durable: x.Durable,
			AutoDelete: x.AutoDelete, Internal: x.Internal, Arguments: tableFromJSON(x.Arguments)})
	}
	for _, q := range d.Queues {
		if !in(q.VHost) {
			continue
		}
		if q.Name == "" {
			return Topology{}, errorf("read definitions: a queue without a name: %w", ErrInvalidArgument)
		}
		t.Queues = append(t.Queues, QueueDecl{Name: q.Name, Durable: q.Durable, AutoDelete: q.AutoDelete,
			Arguments: tableFromJSON(q.Arguments)})
	}
	for _, bd := range d.Bindings {
		if !in(bd.VHost) {
			continue
		}
		var toExchange bool
		switch bd.DestinationType {
		case "queue":
		case "exchange":
			toExchange = true
		default:
			return Topology{}, errorf("read definitions: binding from %q to %q: destination type %q is neither queue nor exchange: %w",
				bd.Source, bd.Destination, bd.DestinationType, ErrInvalidArgument)
		}
		t.Bindings = append(t.Bindings, BindingDecl{Source: bd.Source, Destination: bd.Destination, ToExchange: toExchange,
			RoutingKey: bd.RoutingKey, Arguments: tableFromJSON(bd.Arguments)})
	}
	t.sort()
	return t, nil
}

// WriteDefinitions writes t as a RabbitMQ definitions file of the virtual host vhost ("" is
// [DefaultVHost]), which `rabbitmqctl import_definitions` and the management API's
// /api/definitions take: the virtual host (created if it is missing), and t's exchanges,
// queues and bindings. Argument values are written as JSON: a byte string and a time as
// strings (RFC 3339), a [Decimal] as a number.
func (t Topology) WriteDefinitions(w io.Writer, vhost string) error {
	if vhost == "" {
		vhost = DefaultVHost
	}
	d := definitions{VHosts: []defVHost{{Name: vhost}}, Queues: []defQueue{}, Exchanges: []defExchange{}, Bindings: []defBinding{}}
	for _, x := range t.Exchanges {
		d.Exchanges = append(d.Exchanges, defExchange{Name: x.Name, VHost: vhost, Type: x.Kind, Durable: x.Durable,
			AutoDelete: x.AutoDelete, Internal: x.Internal, Arguments: tableToJSON(x.Arguments)})
	}
	for _, q := range t.Queues {
		d.Queues = append(d.Queues, defQueue{Name: q.Name, VHost: vhost, Durable: q.Durable, AutoDelete: q.AutoDelete,
			Arguments: tableToJSON(q.Arguments)})
	}
	for _, bd := range t.Bindings {
		dt := "queue"
		if bd.ToExchange {
			dt = "exchange"
		}
		d.Bindings = append(d.Bindings, defBinding{Source: bd.Source, VHost: vhost, Destination: bd.Destination,
			DestinationType: dt, RoutingKey: bd.RoutingKey, Arguments: tableToJSON(bd.Arguments)})
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(d); err != nil {
		return errorf("write definitions: %v: %w", err, ErrInvalidArgument)
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// tableFromJSON turns decoded JSON arguments into a Table: numbers as int64 when they are
// integers, float64 otherwise; objects as Tables. An empty object is nil.
func tableFromJSON(m map[string]any) Table {
	if len(m) == 0 {
		return nil
	}
	t := make(Table, len(m))
	for k, v := range m {
		t[k] = fieldFromJSON(v)
	}
	return t
}

func fieldFromJSON(v any) any {
	switch v := v.(type) {
	case json.Number:
		if n, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			return n
		}
		f, _ := v.Float64()
		return f
	case map[string]any:
		t := make(Table, len(v))
		for k, e := range v {
			t[k] = fieldFromJSON(e)
		}
		return t
	case []any:
		a := make([]any, len(v))
		for i, e := range v {
			a[i] = fieldFromJSON(e)
		}
		return a
	}
	return v
}

// tableToJSON returns t's values as JSON values; never nil (RabbitMQ writes {}).
func tableToJSON(t Table) map[string]any {
	m := make(map[string]any, len(t))
	for k, v := range t {
		m[k] = fieldToJSON(v)
	}
	return m
}

func fieldToJSON(v any) any {
	switch v := v.(type) {
	case []byte:
		return string(v)
	case time.Time:
		return v.Format(time.RFC3339)
	case Decimal:
		f := float64(v.Value)
		for range v.Scale {
			f /= 10
		}
		return f
	case Table:
		return tableToJSON(v)
	case map[string]any:
		return tableToJSON(v)
	case []any:
		a := make([]any, len(v))
		for i, e := range v {
			a[i] = fieldToJSON(e)
		}
		return a
	}
	return v
}

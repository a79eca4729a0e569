package warren

import (
	"cmp"
	"maps"
	"slices"
	"strings"
)

// Topology is a broker's exchanges, queues and bindings as plain values: what
// [Broker.Topology] returns, what [Broker.DeclareTopology] declares, and what RabbitMQ's
// definitions files hold (definitions.go). A queue's configuration is its arguments in
// RabbitMQ's "x-" form, however it was declared: the typed options ([MessageTTL], [MaxLength],
// …) write those arguments. So the same value declares the same topology in another warren
// broker, or, through the contrib module, on RabbitMQ.
//
// A topology leaves out what every broker has or what belongs to one owner: the default
// exchange and the predeclared "amq." exchanges (bindings from them are in), exclusive queues
// and their bindings, and warren's own settings that have no argument ([Alerts]).
type Topology struct {
	Exchanges []ExchangeDecl
	Queues    []QueueDecl
	Bindings  []BindingDecl
}

// ExchangeDecl is an exchange's declaration.
type ExchangeDecl struct {
	Name       string
	Kind       string // ExchangeDirect, ExchangeFanout, ExchangeTopic or ExchangeHeaders
	Durable    bool
	AutoDelete bool
	Internal   bool
	Arguments  Table // e.g. "alternate-exchange"; nil when none
}

// QueueDecl is a queue's declaration.
type QueueDecl struct {
	Name       string
	Durable    bool
	AutoDelete bool
	Arguments  Table // RabbitMQ's "x-" arguments; nil when none
}

// Declaration returns the queue's declaration: its name, flags and arguments (a copy), as
// [Broker.Topology] lists it — which leaves exclusive queues out. It takes no lock: a queue's
// declaration never changes.
func (q *Queue) Declaration() QueueDecl {
	return QueueDecl{Name: q.name, Durable: q.cfg.durable, AutoDelete: q.cfg.autoDelete, Arguments: cloneTable(q.cfg.args)}
}

// Declaration returns the exchange's declaration: its name, kind, flags and arguments (a copy,
// with its alternate exchange, if any, as "alternate-exchange"), as [Broker.Topology] lists it
// — which leaves the predeclared exchanges out. It takes no lock: an exchange's declaration
// never changes.
func (x *Exchange) Declaration() ExchangeDecl {
	args := cloneTable(x.cfg.args)
	if x.cfg.alternate != "" {
		if args == nil {
			args = Table{}
		}
		args["alternate-exchange"] = x.cfg.alternate
	}
	return ExchangeDecl{Name: x.name, Kind: x.kind, Durable: x.cfg.durable, AutoDelete: x.cfg.autoDelete,
		Internal: x.cfg.internal, Arguments: args}
}

// BindingDecl is a binding: from the exchange Source to the queue Destination, or to the
// exchange Destination when ToExchange (an exchange-to-exchange binding).
type BindingDecl struct {
	Source      string
	Destination string
	ToExchange  bool
	RoutingKey  string
	Arguments   Table // a headers exchange's match; nil when none
}

// Topology returns the broker's topology as of the call: exchanges and queues sorted by name,
// bindings by source, destination and routing key.
func (b *Broker) Topology() Topology {
	b.mu.RLock()
	xs, qs, bs := b.topologyLocked()
	b.mu.RUnlock()
	// The declarations are read, the arguments copied and everything sorted after the lock: a
	// declaration and a binding's table never change once made.
	t := Topology{Exchanges: make([]ExchangeDecl, 0, len(xs)), Queues: make([]QueueDecl, 0, len(qs)), Bindings: bs}
	for _, x := range xs {
		if !predeclared(x.name) {
			t.Exchanges = append(t.Exchanges, x.Declaration())
		}
	}
	for _, q := range qs {
		if !q.Exclusive() {
			t.Queues = append(t.Queues, q.Declaration())
		}
	}
	for i := range t.Bindings {
		t.Bindings[i].Arguments = cloneTable(t.Bindings[i].Arguments)
	}
	t.sort()
	return t
}

// topologyLocked returns the broker's exchanges and queues, and its bindings but those of
// exclusive queues, with their own argument tables (not copies): Topology's critical section.
func (b *Broker) topologyLocked() ([]*Exchange, []*Queue, []BindingDecl) {
	n := 0
	for _, x := range b.exchanges {
		n += len(x.bindings)
	}
	bs := make([]BindingDecl, 0, n)
	for _, x := range b.exchanges {
		for _, bd := range x.bindings {
			if bd.queue != nil && bd.queue.Exclusive() {
				continue
			}
			d := BindingDecl{Source: x.name, RoutingKey: bd.key, Arguments: bd.args}
			if bd.queue != nil {
				d.Destination = bd.queue.name
			} else {
				d.Destination, d.ToExchange = bd.exchange.name, true
			}
			bs = append(bs, d)
		}
	}
	return slices.Collect(maps.Values(b.exchanges)), slices.Collect(maps.Values(b.queues)), bs
}

// sort puts the topology in Topology's order. Bindings that differ only in their arguments keep
// their order.
func (t *Topology) sort() {
	slices.SortFunc(t.Exchanges, func(x, y ExchangeDecl) int { return cmp.Compare(x.Name, y.Name) })
	slices.SortFunc(t.Queues, func(x, y QueueDecl) int { return cmp.Compare(x.Name, y.Name) })
	slices.SortStableFunc(t.Bindings, func(x, y BindingDecl) int {
		return cmp.Or(cmp.Compare(x.Source, y.Source), cmpBool(x.ToExchange, y.ToExchange),
			cmp.Compare(x.Destination, y.Destination), cmp.Compare(x.RoutingKey, y.RoutingKey))
	})
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

// predeclared reports whether an exchange exists in every broker: the default exchange and
// the "amq." ones.
func predeclared(name string) bool { return name == "" || strings.HasPrefix(name, "amq.") }

// cloneTable returns a copy of t's top level, nil for an empty t.
func cloneTable(t Table) Table {
	if len(t) == 0 {
		return nil
	}
	return maps.Clone(t)
}

// DeclareTopology declares t's exchanges, then its queues, then its bindings, each as
// [Broker.DeclareExchange], [Broker.DeclareQueue], [Broker.Bind] and [Broker.BindExchange] do:
// what exists already and is equivalent is left as it is, so declaring a topology twice, or
// the broker's own [Broker.Topology], changes nothing. A declaration of a predeclared exchange
// is checked for equivalence the same way. It stops at the first error, which names the
// declaration, leaving what it declared before in place (as RabbitMQ's import of definitions
// does): an inequivalent redeclaration wraps [ErrPreconditionFailed], a binding whose exchange
// or queue is neither in t nor in the broker wraps [ErrNotFound], and a queue type other than
// classic wraps [ErrPreconditionFailed] (see [Topology.Classic]).
func (b *Broker) DeclareTopology(t Topology) error {
	for _, x := range t.Exchanges {
		if predeclared(x.Name) {
			if err := b.checkPredeclared(x); err != nil {
				return err
			}
			continue
		}
		opts := []ExchangeOption{Arguments(x.Arguments)}
		if x.Durable {
			opts = append(opts, Durable())
		}
		if x.AutoDelete {
			opts = append(opts, AutoDelete())
		}
		if x.Internal {
			opts = append(opts, Internal())
		}
		if _, err := b.DeclareExchange(x.Name, x.Kind, opts...); err != nil {
			return err
		}
	}
	for _, q := range t.Queues {
		opts := []QueueOption{Arguments(q.Arguments)}
		if q.Durable {
			opts = append(opts, Durable())
		}
		if q.AutoDelete {
			opts = append(opts, AutoDelete())
		}
		if _, err := b.DeclareQueue(q.Name, opts...); err != nil {
			return err
		}
	}
	for _, bd := range t.Bindings {
		var err error
		if bd.ToExchange {
			err = b.BindExchange(bd.Destination, bd.Source, bd.RoutingKey, bd.Arguments)
		} else {
			err = b.Bind(bd.Destination, bd.Source, bd.RoutingKey, bd.Arguments)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// checkPredeclared checks that a declaration of a predeclared exchange matches it, as a
// redeclaration would.
func (b *Broker) checkPredeclared(d ExchangeDecl) error {
	if d.Name == "" {
		return errorf("declare the default exchange: %w", ErrAccessRefused)
	}
	x, err := b.Exchange(d.Name)
	if err != nil {
		return errorf("declare exchange %q: %w", d.Name, err)
	}
	cfg := exchangeConfig{durable: d.Durable, autoDelete: d.AutoDelete, internal: d.Internal, args: d.Arguments}
	if err := cfg.parseArgs(); err != nil {
		return errorf("declare exchange %q: %w", d.Name, err)
	}
	if err := x.equivalent(d.Kind, cfg); err != nil {
		return errorf("declare exchange %q: %w", d.Name, err)
	}
	return nil
}

// Classic returns t with every quorum queue made a classic one, the only type warren has, for
// a topology read from a RabbitMQ whose queues are quorum queues. What changes for such a
// queue, in warren as in a classic queue of RabbitMQ: it is not replicated; its
// "x-delivery-limit" is kept (warren's classic queues have it, [DeliveryLimit]), but a quorum
// queue of RabbitMQ 4 without one has a limit of 20, and the classic queue has none; quorum
// queues ignore "x-max-priority" before RabbitMQ 4, classic ones have priorities; arguments
// only quorum queues know ("x-quorum-initial-group-size", …) are kept and ignored. Streams are
// left as they are: nothing in warren behaves like one, and declaring one fails.
func (t Topology) Classic() Topology {
	qs := slices.Clone(t.Queues)
	for i, q := range qs {
		if q.Arguments["x-queue-type"] == "quorum" {
			q.Arguments = maps.Clone(q.Arguments)
			delete(q.Arguments, "x-queue-type")
			qs[i] = q
		}
	}
	t.Queues = qs
	return t
}

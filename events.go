package warren

import (
	"slices"
	"sync"
	"sync/atomic"
)

// EventKind says what an [Event] reports.
type EventKind uint8

// Event kinds.
const (
	// EventHandlerPanicked: a handler run by [Queue.Serve] panicked. Err holds the panic value;
	// the delivery is treated as failed (returned, or dead-lettered past the delivery limit).
	EventHandlerPanicked EventKind = iota + 1
)

func (k EventKind) String() string {
	switch k {
	case EventHandlerPanicked:
		return "handler-panicked"
	}
	return "unknown"
}

// Event is something that happened in a broker, as told to its listeners ([Broker.Listen]).
// Fields that do not apply to its Kind are zero.
type Event struct {
	Kind     EventKind
	Queue    string   // the queue concerned
	Consumer string   // the consumer tag concerned
	Message  *Message // the message concerned; shared and read-only
	Err      error    // what went wrong
}

// listeners is a broker's set of event listeners, copy-on-write: emitting reads one atomic
// pointer and, when nobody listens, does nothing else.
type listeners struct {
	mu   sync.Mutex                  // serialises changes
	list atomic.Pointer[[]*listener] // nil when empty
}

type listener struct{ fn func(Event) }

// Listen registers fn to be told of the broker's events, and returns a function that
// unregisters it (idempotent). fn is called on the goroutine that caused the event, with no
// lock of the broker's held, so it may call into the broker; it must not block, since that
// goroutine is a publisher, a consumer's settlement or a handler worker. Listeners registered
// several times are called once per registration.
func (b *Broker) Listen(fn func(Event)) (stop func()) {
	if fn == nil {
		return func() {}
	}
	l := &listener{fn: fn}
	b.listeners.mu.Lock()
	defer b.listeners.mu.Unlock()
	var list []*listener
	if p := b.listeners.list.Load(); p != nil {
		list = slices.Clone(*p)
	}
	list = append(list, l)
	b.listeners.list.Store(&list)
	return func() {
		b.listeners.mu.Lock()
		defer b.listeners.mu.Unlock()
		p := b.listeners.list.Load()
		if p == nil {
			return
		}
		list := slices.DeleteFunc(slices.Clone(*p), func(x *listener) bool { return x == l })
		if len(list) == 0 {
			b.listeners.list.Store(nil)
		} else {
			b.listeners.list.Store(&list)
		}
	}
}

// emit tells every listener of e. The caller holds no lock.
func (b *Broker) emit(e Event) {
	p := b.listeners.list.Load()
	if p == nil {
		return
	}
	for _, l := range *p {
		b.call(l, e)
	}
}

// call calls one listener. A listener that panics is a bug of the application's, but it runs on
// a broker goroutine or inside a broker call: the panic is logged, not propagated.
func (b *Broker) call(l *listener, e Event) {
	defer func() {
		if p := recover(); p != nil {
			b.cfg.logger.Error("warren: event listener panicked", "event", e.Kind.String(), "panic", p)
		}
	}()
	l.fn(e)
}

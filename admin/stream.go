package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenmq/warren"
)

// The live view: GET /api/stream is a stream of server-sent events, one "sample" a second, fed
// by one listener on the broker per handler.
//
// While at least one stream is open, the hub has a listener registered with Broker.Listen,
// which counts events by kind with one atomic add each (no lock, no allocation, no goroutine per
// event), and one goroutine, which once a second turns the counts into rates, reads every
// queue's Stats (one short critical section each, as a metrics scrape does), and hands the
// sample to every stream. When the last stream closes, the listener is removed at once and the
// goroutine ends at its next tick, so a handler nobody watches costs the broker nothing.

// sample is one second of the live view, as each stream's "sample" event carries it in JSON.
type sample struct {
	Time time.Time `json:"time"`
	// Rates is events a second by kind ("published", "delivered", "acked", "dead-lettered",
	// "moved", …; see warren.EventKind.String), over the last sample's interval.
	Rates      map[string]float64 `json:"rates"`
	Totals     warren.QueueStats  `json:"totals"` // as in overview
	Unroutable uint64             `json:"unroutable"`
	Memory     warren.MemoryStats `json:"memory"` // as in overview
	Queues     []queueSample      `json:"queues"` // every queue, or the stream's one
}

// queueSample is one queue in a sample: its depth, and its rates from the change of its
// counters over the interval.
type queueSample struct {
	Queue     string  `json:"queue"`
	Ready     int     `json:"ready"`
	Unacked   int     `json:"unacked"`
	Consumers int     `json:"consumers"`
	In        float64 `json:"in"`      // messages a second that entered
	Deliver   float64 `json:"deliver"` // deliveries a second
	Out       float64 `json:"out"`     // messages a second that left: acked, expired, dead-lettered, dropped or moved
}

// maxKinds bounds the event kinds counted: above every warren.EventKind there is.
const maxKinds = 64

// hub is a Server's live view: the listener and the goroutine that feed its streams. The zero
// hub is not usable: newHub makes one.
type hub struct {
	b      *warren.Broker
	counts [maxKinds]atomic.Uint64 // events by kind since the last sample; written by the listener
	done   chan struct{}           // closed by close
	wg     sync.WaitGroup          // the goroutine (run)

	mu      sync.Mutex           // guards the fields below
	streams map[*stream]struct{} // those open
	stop    func()               // removes the listener; nil while none is registered
	running bool                 // whether run is running (or about to end)
	closed  bool
}

// stream is one open GET /api/stream.
type stream struct {
	queue string      // the one queue its samples carry; "" for every queue
	c     chan []byte // samples, in JSON: capacity 1, the latest; closed by the hub's close
}

func newHub(b *warren.Broker) *hub {
	return &hub{b: b, done: make(chan struct{}), streams: make(map[*stream]struct{})}
}

// count is the listener: it counts e by kind.
func (h *hub) count(e warren.Event) {
	if int(e.Kind) < maxKinds {
		h.counts[e.Kind].Add(1)
	}
}

// open registers a stream of the named queue's samples ("" for every queue), with the listener
// and the goroutine if it is the first. It returns false after close.
func (h *hub) open(queue string) (*stream, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, false
	}
	st := &stream{queue: queue, c: make(chan []byte, 1)}
	h.streams[st] = struct{}{}
	if h.stop == nil {
		for i := range h.counts {
			h.counts[i].Store(0)
		}
		h.stop = h.b.Listen(h.count)
	}
	if !h.running {
		h.running = true
		h.wg.Go(h.run)
	}
	return st, true
}

// shut unregisters st, and the listener with the last stream.
func (h *hub) shut(st *stream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.streams, st)
	if len(h.streams) == 0 && h.stop != nil {
		h.stop()
		h.stop = nil
	}
}

// close ends every stream, removes the listener and waits for the goroutine to end. Later opens
// fail. Idempotent.
func (h *hub) close() {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		close(h.done)
		if h.stop != nil {
			h.stop()
			h.stop = nil
		}
		for st := range h.streams {
			close(st.c)
		}
		clear(h.streams)
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// run samples once a second while any stream is open; it ends at the first tick with none, or
// at close.
func (h *hub) run() {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last, prev := time.Now(), h.b.Stats()
	for {
		select {
		case <-h.done:
			return
		case <-tick.C:
		}
		h.mu.Lock()
		if len(h.streams) == 0 {
			h.running = false
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		now, st := time.Now(), h.b.Stats()
		h.send(h.sample(now, now.Sub(last), prev, st))
		last, prev = now, st
	}
}

// sample makes the sample of the interval dt that ends at now, from the queues' stats at its
// start (prev) and end (st) and the events counted meanwhile.
func (h *hub) sample(now time.Time, dt time.Duration, prev, st warren.BrokerStats) sample {
	sec := dt.Seconds()
	s := sample{Time: now, Rates: make(map[string]float64), Totals: sum(st.Queues), Unroutable: st.Unroutable,
		Memory: st.Memory}
	for k := range h.counts {
		if n := h.counts[k].Swap(0); n > 0 {
			s.Rates[warren.EventKind(k).String()] = float64(n) / sec
		}
	}
	before := make(map[string]warren.QueueStats, len(prev.Queues))
	for _, q := range prev.Queues {
		before[q.Queue] = q
	}
	for _, q := range st.Queues {
		p := before[q.Queue] // zero for a queue new since: its counters are all this interval's
		if restarted(p, q) {
			p = warren.QueueStats{}
		}
		s.Queues = append(s.Queues, queueSample{Queue: q.Queue, Ready: q.Ready, Unacked: q.Unacked,
			Consumers: q.Consumers, In: float64(q.Enqueued-p.Enqueued) / sec,
			Deliver: float64(q.Delivered-p.Delivered) / sec, Out: float64(left(q)-left(p)) / sec})
	}
	return s
}

// restarted reports whether a queue's counters went down between the stats p and q: it was
// deleted and declared again meanwhile, and counts from 0. Any counter a rate is made of may
// tell, the others having passed their old values in the interval (the rate from one that went
// down would be a difference of unsigned counts, about 1.8e19 a second). A queue declared again
// whose counters all passed their old values is not told from one that went on: its rates for
// that one interval are too low.
func restarted(p, q warren.QueueStats) bool {
	return q.Enqueued < p.Enqueued || q.Delivered < p.Delivered || q.Acked < p.Acked || q.Expired < p.Expired ||
		q.DeadLettered < p.DeadLettered || q.Dropped < p.Dropped || q.Moved < p.Moved
}

// left is how many messages have left a queue for good.
func left(q warren.QueueStats) uint64 {
	return q.Acked + q.Expired + q.DeadLettered + q.Dropped + q.Moved
}

// send hands s to every stream, as JSON, replacing a sample the stream has not taken yet: a
// slow reader gets the latest, and the hub never waits for one.
func (h *hub) send(s sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	encoded := make(map[string][]byte) // by stream queue
	for st := range h.streams {
		b, ok := encoded[st.queue]
		if !ok {
			one := s
			if st.queue != "" {
				one.Queues = nil
				for _, q := range s.Queues {
					if q.Queue == st.queue {
						one.Queues = append(one.Queues, q)
					}
				}
			}
			b, _ = json.Marshal(one) // plain values: cannot fail
			encoded[st.queue] = b
		}
		select {
		case st.c <- b:
		default:
			select {
			case <-st.c: // the stale one: only the hub sends, so the send below has room
			default:
			}
			st.c <- b
		}
	}
}

// getStream serves GET /api/stream[?queue=name]: server-sent events, a "sample" a second, until
// the client goes or the handler is closed (503 once closed).
func (s *Server) getStream(w http.ResponseWriter, r *http.Request) {
	st, ok := s.hub.open(r.URL.Query().Get("queue"))
	if !ok {
		writeError(w, http.StatusServiceUnavailable, errors.New("admin: handler closed"))
		return
	}
	defer s.hub.shut(st)
	rc := http.NewResponseController(w)
	rc.SetWriteDeadline(time.Time{}) // a stream outlives the server's WriteTimeout; unsupported is fine
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no") // a proxy must not hold events back
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, "retry: 2000\n\n")
	if rc.Flush() != nil {
		return
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case b, ok := <-st.c:
			if !ok {
				return
			}
			fmt.Fprintf(w, "event: sample\ndata: %s\n\n", b)
			if rc.Flush() != nil {
				return
			}
		}
	}
}

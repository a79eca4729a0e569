package admin

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warrenmq/warren"
)

// The live stream (stream.go): samples, the listener's life, and Close. White-box, to see
// whether the hub has its listener registered.

// chunkWriter is a ResponseWriter that hands each flushed chunk to a channel, unbuffered: the
// handler waits in Flush until the test reads, as it waits for a slow client (or the request
// ends).
type chunkWriter struct {
	ctx    context.Context // the request's
	header http.Header
	code   int
	buf    bytes.Buffer
	chunks chan string
}

func newChunkWriter(ctx context.Context) *chunkWriter {
	return &chunkWriter{ctx: ctx, header: make(http.Header), chunks: make(chan string)}
}

func (w *chunkWriter) Header() http.Header         { return w.header }
func (w *chunkWriter) Write(b []byte) (int, error) { return w.buf.Write(b) }
func (w *chunkWriter) WriteHeader(code int)        { w.code = code }
func (w *chunkWriter) Flush() {
	select {
	case w.chunks <- w.buf.String():
	case <-w.ctx.Done():
	}
	w.buf.Reset()
}

// watching reports whether the hub has its listener registered.
func (s *Server) watching() bool {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return s.hub.stop != nil
}

// openStream serves GET path on s in a goroutine, returning its writer and a function that
// ends the request and waits for the handler to return.
func openStream(t *testing.T, s *Server, path string) (*chunkWriter, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	w := newChunkWriter(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { s.ServeHTTP(w, httptest.NewRequestWithContext(ctx, http.MethodGet, path, nil)) })
	require.Equal(t, "retry: 2000\n\n", <-w.chunks)
	return w, func() { cancel(); wg.Wait() }
}

// nextSample reads w's next sample.
func nextSample(t *testing.T, w *chunkWriter) sample {
	t.Helper()
	chunk := <-w.chunks
	data, ok := strings.CutPrefix(chunk, "event: sample\ndata: ")
	require.True(t, ok, chunk)
	var s sample
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(data)), &s))
	return s
}

func TestStreamSamples(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := warren.New()
		defer b.Close()
		s := Handler(b)
		defer s.Close()
		q, err := b.DeclareQueue("q")
		require.NoError(t, err)
		_, err = b.DeclareQueue("other")
		require.NoError(t, err)
		assert.False(t, s.watching(), "no listener before anyone watches")

		all, endAll := openStream(t, s, "/api/stream")
		one, endOne := openStream(t, s, "/api/stream?queue=q")
		synctest.Wait() // the sampler has taken its first snapshot, which rates are counted from
		assert.True(t, s.watching())
		assert.Equal(t, "text/event-stream", all.header.Get("Content-Type"))
		for range 10 {
			require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("x")}))
		}
		for range 4 {
			d, err := q.Get(t.Context())
			require.NoError(t, err)
			require.NoError(t, d.Ack())
		}
		time.Sleep(time.Second)
		sa, so := nextSample(t, all), nextSample(t, one)
		assert.Equal(t, map[string]float64{"published": 10, "enqueued": 10, "delivered": 4, "acked": 4}, sa.Rates)
		assert.Equal(t, sa.Rates, so.Rates)
		assert.Equal(t, 6, sa.Totals.Ready)
		require.Len(t, sa.Queues, 2)
		assert.Equal(t, "other", sa.Queues[0].Queue)
		assert.Equal(t, []queueSample{{Queue: "q", Ready: 6, In: 10, Deliver: 4, Out: 4}}, so.Queues)

		// A slow reader: the stream holds the sample of 2 s while the client does not read;
		// that of 3 s waits, and that of 4 s replaces it.
		start := sa.Time
		time.Sleep(3 * time.Second)
		synctest.Wait()
		so = nextSample(t, one)
		assert.Equal(t, 1*time.Second, so.Time.Sub(start))
		so = nextSample(t, one)
		assert.Equal(t, 3*time.Second, so.Time.Sub(start), "the sample of 3 s was replaced by the latest")
		assert.Empty(t, so.Rates, "quiet seconds")
		assert.Equal(t, []queueSample{{Queue: "q", Ready: 6}}, so.Queues)

		endAll()
		assert.True(t, s.watching(), "one stream is still open")
		endOne()
		assert.False(t, s.watching(), "the listener goes with the last stream")
		time.Sleep(time.Second)
		synctest.Wait()
		s.hub.mu.Lock()
		running := s.hub.running
		s.hub.mu.Unlock()
		assert.False(t, running, "the goroutine ends at its next tick")

		_, endAgain := openStream(t, s, "/api/stream")
		assert.True(t, s.watching(), "a new stream starts it again")
		endAgain()
	})
}

// TestStreamRatesAfterRedeclare: a queue deleted and declared again within one sample, whose new
// count of messages in passes the old one while its other counters do not, gets the rates of
// its new counters, from 0: not the difference of unsigned counts that went down, about 1.8e19
// a second.
func TestStreamRatesAfterRedeclare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := warren.New()
		defer b.Close()
		s := Handler(b)
		defer s.Close()
		get := func(q *warren.Queue, n int) {
			for range n {
				d, err := q.Get(t.Context())
				require.NoError(t, err)
				require.NoError(t, d.Ack())
			}
		}
		q, err := b.DeclareQueue("q")
		require.NoError(t, err)
		w, end := openStream(t, s, "/api/stream?queue=q")
		defer end()
		synctest.Wait()
		for range 5 {
			require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{}))
		}
		get(q, 5)
		time.Sleep(time.Second)
		assert.Equal(t, []queueSample{{Queue: "q", In: 5, Deliver: 5, Out: 5}}, nextSample(t, w).Queues)

		_, err = b.DeleteQueue("q")
		require.NoError(t, err)
		q, err = b.DeclareQueue("q")
		require.NoError(t, err)
		for range 7 {
			require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{}))
		}
		get(q, 2)
		time.Sleep(time.Second)
		assert.Equal(t, []queueSample{{Queue: "q", Ready: 5, In: 7, Deliver: 2, Out: 2}}, nextSample(t, w).Queues)
	})
}

func TestCloseEndsStreams(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := warren.New()
		defer b.Close()
		s := Handler(b)
		_, end := openStream(t, s, "/api/stream")
		time.Sleep(1500 * time.Millisecond)
		require.NoError(t, s.Close())
		end() // returns: the handler saw its stream end
		assert.False(t, s.watching())
		require.NoError(t, s.Close(), "idempotent")

		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/api/stream", nil))
		assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
		rec = httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/api/overview", nil))
		assert.Equal(t, http.StatusOK, rec.Code, "the rest keeps answering")
	})
}

// TestStreamHTTP: the stream over a real connection, as a browser's EventSource reads it; once
// the client goes and the handler is closed, no goroutine is left. (Not in a bubble: network
// I/O does not block durably.)
func TestStreamHTTP(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	b := warren.New()
	defer b.Close()
	s := Handler(b)
	defer s.Close()
	_, err := b.DeclareQueue("q")
	require.NoError(t, err)
	srv := httptest.NewServer(s)
	defer srv.Close()

	res, err := http.Get(srv.URL + "/api/stream")
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, "text/event-stream", res.Header.Get("Content-Type"))
	require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{}))
	r := bufio.NewReader(res.Body)
	for {
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			var smp sample
			require.NoError(t, json.Unmarshal([]byte(data), &smp))
			require.Len(t, smp.Queues, 1)
			assert.Equal(t, 1, smp.Queues[0].Ready)
			break
		}
	}
}

// TestStreamMemory: each sample carries the broker's memory budget, so the live view follows
// the alarm: set with a publish waiting, then cleared.
func TestStreamMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := warren.New(warren.WithMemoryLimit(1))
		defer b.Close()
		s := Handler(b)
		defer s.Close()
		q, err := b.DeclareQueue("q")
		require.NoError(t, err)
		w, end := openStream(t, s, "/api/stream?queue=q")
		defer end()
		time.Sleep(time.Second)
		assert.Equal(t, warren.MemoryStats{Limit: 1}, nextSample(t, w).Memory)

		require.NoError(t, b.Publish(t.Context(), "", "q", warren.Message{Body: []byte("over")}))
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		waiting := make(chan error, 1)
		go func() { waiting <- b.Publish(ctx, "", "q", warren.Message{Body: []byte("late")}) }()
		time.Sleep(time.Second)
		m := nextSample(t, w).Memory
		assert.Equal(t, warren.MemoryStats{Used: b.Memory().Used, Limit: 1, Alarm: true, Waiting: 1, Alarms: 1}, m)
		assert.Positive(t, m.Used)

		cancel()
		require.ErrorIs(t, <-waiting, context.Canceled)
		_, err = q.Purge()
		require.NoError(t, err)
		time.Sleep(time.Second)
		assert.Equal(t, warren.MemoryStats{Limit: 1, Alarms: 1}, nextSample(t, w).Memory)
	})
}

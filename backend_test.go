package warren_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

func TestReadPublishOptions(t *testing.T) {
	s, err := warren.ReadPublishOptions()
	require.NoError(t, err)
	require.Equal(t, warren.PublishSettings{}, s)
	s, err = warren.ReadPublishOptions(warren.Mandatory(), nil, warren.ExpireAfter(1500*time.Millisecond), warren.DeliverAfter(time.Second))
	require.NoError(t, err)
	require.Equal(t, warren.PublishSettings{Mandatory: true, Delay: time.Second, Expiration: "1500"}, s)
	s, err = warren.ReadPublishOptions(warren.Immediate(), warren.DeliverAfter(-time.Second))
	require.NoError(t, err)
	require.Equal(t, warren.PublishSettings{Immediate: true}, s, "a delay ≤ 0 is none")
	_, err = warren.ReadPublishOptions(warren.Immediate(), warren.DeliverAfter(time.Second))
	require.ErrorIs(t, err, warren.ErrInvalidArgument, "as Publish refuses it")
	_, err = warren.ReadPublishOptions(warren.ExpireAfter(time.Microsecond))
	require.ErrorIs(t, err, warren.ErrInvalidArgument)
}

// recordingSettler is a Settler that keeps what each delivery was settled with, once.
type recordingSettler struct {
	mu      sync.Mutex
	settled map[uint64]string
}

func (s *recordingSettler) Settle(tag uint64, o warren.Outcome, delay time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.settled[tag]; ok {
		return fmt.Errorf("delivery %d: %w", tag, warren.ErrAlreadySettled)
	}
	name := map[warren.Outcome]string{warren.Acked: "acked", warren.Requeued: "requeued", warren.Rejected: "rejected"}[o]
	if delay > 0 {
		name += " after " + delay.String()
	}
	s.settled[tag] = name
	return nil
}

func (s *recordingSettler) outcomes() map[uint64]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.settled)
}

func TestNewDelivery(t *testing.T) {
	s := &recordingSettler{settled: map[uint64]string{}}
	info := warren.Delivery{Message: warren.Message{Body: []byte("b")}, Exchange: "x", RoutingKey: "k", Redelivered: true,
		DeliveryCount: 2, ConsumerTag: "c"}
	for tag, settle := range map[uint64]func(warren.Delivery) error{
		1: warren.Delivery.Ack, 2: warren.Delivery.Nack, 3: warren.Delivery.Reject,
		4: func(d warren.Delivery) error { return d.NackWithDelay(time.Second) },
		5: func(d warren.Delivery) error { return d.NackWithDelay(0) },
	} {
		info.DeliveryTag = tag
		d := warren.NewDelivery(info, s)
		require.Equal(t, []any{info.Message, "x", "k", true, 2, tag, "c"},
			[]any{d.Message, d.Exchange, d.RoutingKey, d.Redelivered, d.DeliveryCount, d.DeliveryTag, d.ConsumerTag}, "its fields are d's")
		require.NoError(t, settle(d))
		require.ErrorIs(t, d.Ack(), warren.ErrAlreadySettled, "the settler refuses a second settlement")
	}
	require.Equal(t, map[uint64]string{1: "acked", 2: "requeued", 3: "rejected", 4: "requeued after 1s", 5: "requeued"}, s.outcomes())
}

// chanSource is a Source of deliveries made by NewDelivery, fed by the test.
type chanSource struct {
	ch        chan warren.Delivery
	done      chan struct{}
	once      sync.Once
	cancelled bool
	err       error
}

func newChanSource(n int) *chanSource {
	return &chanSource{ch: make(chan warren.Delivery, n), done: make(chan struct{})}
}

func (s *chanSource) Deliveries() <-chan warren.Delivery { return s.ch }
func (s *chanSource) Done() <-chan struct{}              { return s.done }
func (s *chanSource) Err() error                         { return s.err }
func (s *chanSource) Cancel() error {
	s.once.Do(func() { s.cancelled = true; close(s.ch); close(s.done) })
	return nil
}

// end ends the source on its own, with err.
func (s *chanSource) end(err error) {
	s.once.Do(func() { s.err = err; close(s.ch); close(s.done) })
}

// ServeSource settles another backend's deliveries as Serve settles warren's: nil acks, an
// error requeues (after the backoff), ErrPermanent rejects, a panic requeues; once ctx ends,
// what was received and not handled is given back (requeued).
func TestServeSourceSettles(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		settler := &recordingSettler{settled: map[uint64]string{}}
		src := newChanSource(8)
		results := map[string]error{"ok": nil, "fail": errors.New("try again"), "poison": warren.Permanent(errors.New("bad"))}
		for i, body := range []string{"ok", "fail", "poison", "panic"} {
			src.ch <- warren.NewDelivery(warren.Delivery{Message: warren.Message{Body: []byte(body)}, DeliveryTag: uint64(i + 1), DeliveryCount: 1}, settler)
		}
		ctx, cancel := context.WithCancel(context.Background())
		handled := make(chan string, 8)
		h := func(ctx context.Context, d warren.Delivery) error {
			body := string(d.Message.Body)
			handled <- body
			if body == "panic" {
				panic("boom")
			}
			return results[body]
		}
		served := make(chan error, 1)
		go func() { served <- warren.ServeSource(ctx, src, h, warren.Backoff(time.Second, time.Minute)) }()
		for range 4 {
			<-handled
		}
		synctest.Wait()
		require.Equal(t, map[uint64]string{1: "acked", 2: "requeued after 2s", 3: "rejected", 4: "requeued after 2s"}, settler.outcomes(),
			"the backoff doubles with the delivery count, as Serve's")

		cancel()
		synctest.Wait()
		require.True(t, src.cancelled, "ServeSource cancels its source when ctx ends")
		require.NoError(t, <-served)
		require.Empty(t, handled)
	})
}

// Stopping: what a worker receives once ctx has ended is given back (requeued), not handled.
func TestServeSourceGivesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		settler := &recordingSettler{settled: map[uint64]string{}}
		src := newChanSource(8)
		for i, body := range []string{"slow", "late"} {
			src.ch <- warren.NewDelivery(warren.Delivery{Message: warren.Message{Body: []byte(body)}, DeliveryTag: uint64(i + 1)}, settler)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var handled []string
		h := func(hctx context.Context, d warren.Delivery) error {
			handled = append(handled, string(d.Message.Body))
			<-hctx.Done()
			return nil
		}
		served := make(chan error, 1)
		go func() { served <- warren.ServeSource(ctx, src, h) }()
		synctest.Wait()
		cancel()
		require.NoError(t, <-served)
		require.Equal(t, []string{"slow"}, handled)
		require.Equal(t, map[uint64]string{1: "acked", 2: "requeued"}, settler.outcomes())
	})
}

// A source that ends on its own ends ServeSource with its error; invalid options fail at once.
func TestServeSourceEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newChanSource(1)
		served := make(chan error, 1)
		go func() {
			served <- warren.ServeSource(context.Background(), src, func(context.Context, warren.Delivery) error { return nil }, warren.Workers(3))
		}()
		synctest.Wait()
		gone := errors.New("connection gone")
		src.end(gone)
		require.ErrorIs(t, <-served, gone)
	})
	ok := func(context.Context, warren.Delivery) error { return nil }
	require.ErrorIs(t, warren.ServeSource(context.Background(), newChanSource(1), nil), warren.ErrInvalidArgument)
	require.ErrorIs(t, warren.ServeSource(context.Background(), nil, ok), warren.ErrInvalidArgument)
	require.ErrorIs(t, warren.ServeSource(context.Background(), newChanSource(1), ok, warren.Workers(0)), warren.ErrInvalidArgument)
	require.ErrorIs(t, warren.ServeSource(context.Background(), newChanSource(1), ok, warren.Backoff(0, 0)), warren.ErrInvalidArgument)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, warren.ServeSource(done, newChanSource(1), ok), context.Canceled)
}

func TestReadServeOptions(t *testing.T) {
	s, err := warren.ReadServeOptions()
	require.NoError(t, err)
	require.Equal(t, warren.ServeSettings{Workers: 1, Prefetch: 1}, s)
	s, err = warren.ReadServeOptions(warren.Workers(4))
	require.NoError(t, err)
	require.Equal(t, warren.ServeSettings{Workers: 4, Prefetch: 4}, s, "the prefetch follows the workers, as Serve's")
	s, err = warren.ReadServeOptions(warren.Workers(2), warren.Prefetch(10), warren.ConsumerTag("t"), warren.ConsumerPriority(3),
		warren.Exclusive(), warren.Selector(func(*warren.Message) bool { return true }), warren.AckTimeout(time.Minute), warren.Backoff(time.Second, time.Minute))
	require.NoError(t, err)
	require.Equal(t, warren.ServeSettings{Workers: 2, Prefetch: 10, Tag: "t", Priority: 3, Exclusive: true, Selector: true,
		AckTimeout: time.Minute, BackoffMax: time.Minute}, s)
	for _, bad := range []warren.ServeOption{warren.Workers(0), warren.Prefetch(0), warren.AutoAck(), warren.Selector(nil), warren.GracePeriod(-1)} {
		_, err := warren.ReadServeOptions(bad)
		require.ErrorIs(t, err, warren.ErrInvalidArgument)
	}
}

// Broker.Serve serves a queue by name, as the Backend interface has it.
func TestBrokerServe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var backend warren.Backend = newBroker(t)
		b := backend.(*warren.Broker)
		require.NoError(t, b.DeclareTopology(warren.Topology{Queues: []warren.QueueDecl{{Name: "jobs"}}}))
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan string, 1)
		served := make(chan error, 1)
		go func() {
			served <- backend.Serve(ctx, "jobs", func(_ context.Context, d warren.Delivery) error {
				got <- string(d.Message.Body)
				return nil
			})
		}()
		synctest.Wait()
		require.NoError(t, backend.Publish(ctx, "", "jobs", warren.Message{Body: []byte("job")}))
		require.Equal(t, "job", <-got)
		cancel()
		require.NoError(t, <-served)
		require.ErrorIs(t, backend.Serve(context.Background(), "nothing", func(context.Context, warren.Delivery) error { return nil }), warren.ErrNotFound)
	})
}

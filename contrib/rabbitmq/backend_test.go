package rabbitmq

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/backendtest"
)

// The suite of warren.Backend, which warren's broker passes, on RabbitMQ through the client,
// with quorum queues (the queue type of a cluster).
func TestBackendSuite(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) warren.Backend {
		conn := dial(t)
		c, err := Dial(rabbitURL(t), WithQueueType(Quorum), WithLogger(quiet))
		require.NoError(t, err)
		b := &forgetful{Client: c}
		// What the scenario declared, and the retry queues the client declared for it, are
		// deleted when it ends: RabbitMQ outlives the test.
		t.Cleanup(func() {
			ch, err := conn.Channel()
			if err != nil {
				return
			}
			defer ch.Close()
			b.mu.Lock()
			defer b.mu.Unlock()
			for _, top := range b.declared {
				for _, q := range top.Queues {
					ch.QueueDelete(q.Name, false, false, false)
				}
				for _, x := range top.Exchanges {
					ch.ExchangeDelete(x.Name, false, false)
				}
			}
			for q := range c.retryQueues {
				ch.QueueDelete(q, false, false, false)
			}
		})
		return b
	})
}

// forgetful is a client that remembers what it declared, to delete it.
type forgetful struct {
	*Client
	mu       sync.Mutex
	declared []warren.Topology
}

func (f *forgetful) DeclareTopology(t warren.Topology) error {
	f.mu.Lock()
	f.declared = append(f.declared, t)
	f.mu.Unlock()
	return f.Client.DeclareTopology(t)
}

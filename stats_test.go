package warren_test

import (
	"encoding/json"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// TestStatsJSON: stats marshal with snake_case names and the oldest message's age as a duration
// a person can read, and read back to what they were; an admin API serves them as they are.
func TestStatsJSON(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q")
		publishN(t, b, q, 2)
		time.Sleep(1500 * time.Millisecond)
		d, err := q.Get(t.Context())
		require.NoError(t, err)
		require.NoError(t, d.Nack())

		st := q.Stats()
		require.Equal(t, 1500*time.Millisecond, st.OldestAge)
		data, err := json.Marshal(st)
		require.NoError(t, err)
		var fields map[string]any
		require.NoError(t, json.Unmarshal(data, &fields))
		require.Equal(t, map[string]any{
			"queue": "q", "ready": 2.0, "unacked": 0.0, "delayed": 0.0, "consumers": 0.0, "bytes": 2.0,
			"oldest_age": "1.5s", "enqueued": 2.0, "delivered": 1.0, "redelivered": 0.0, "acked": 0.0,
			"nacked": 1.0, "rejected": 0.0, "expired": 0.0, "dead_lettered": 0.0, "dropped": 0.0,
		}, fields)
		var back warren.QueueStats
		require.NoError(t, json.Unmarshal(data, &back))
		require.Equal(t, st, back)

		data, err = json.Marshal(b.Stats())
		require.NoError(t, err)
		var broker map[string]any
		require.NoError(t, json.Unmarshal(data, &broker))
		require.Equal(t, 6.0, broker["exchanges"])
		require.Equal(t, 0.0, broker["unroutable"])
		require.Len(t, broker["queues"], 1)
		var bs warren.BrokerStats
		require.NoError(t, json.Unmarshal(data, &bs))
		require.Equal(t, b.Stats(), bs)

		require.Error(t, json.Unmarshal([]byte(`{"oldest_age": "soon"}`), &back))
	})
}

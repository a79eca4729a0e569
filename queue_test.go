package warren_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// TestConsumerTimeoutAppliesToGet: the queue's "x-consumer-timeout" applies to Get deliveries
// too, as RabbitMQ (up to 4.2) applies it to basic.get: one held past it goes back to its place,
// redelivered, and settling it afterwards fails with ErrAlreadySettled; one settled in time, an
// auto-acked one, and one from a queue without the argument are left alone.
func TestConsumerTimeoutAppliesToGet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		q := declare(t, b, "q", warren.Arguments(warren.Table{"x-consumer-timeout": int32(10_000)}))
		plain := declare(t, b, "plain")
		publishN(t, b, q, 4)
		publishN(t, b, plain, 1)
		held, err := q.Get(t.Context())
		require.NoError(t, err)
		inTime, err := q.Get(t.Context())
		require.NoError(t, err)
		_, err = q.Get(t.Context(), warren.AutoAck())
		require.NoError(t, err)
		other, err := plain.Get(t.Context())
		require.NoError(t, err)

		time.Sleep(9 * time.Second)
		require.NoError(t, inTime.Ack())
		time.Sleep(time.Second - time.Millisecond)
		synctest.Wait()
		require.Equal(t, 1, q.Unacked(), "not yet")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		require.Equal(t, [2]int{2, 0}, [2]int{q.Len(), q.Unacked()}, "back at 10 s")
		require.ErrorIs(t, held.Ack(), warren.ErrAlreadySettled)
		again, err := q.Get(t.Context())
		require.NoError(t, err)
		require.Equal(t, "0", string(again.Message.Body), "in its place")
		require.True(t, again.Redelivered)
		require.Equal(t, 1, again.DeliveryCount)
		require.NoError(t, again.Ack())

		time.Sleep(time.Hour)
		require.NoError(t, other.Ack(), "no consumer timeout on that queue")
	})
}

package warren_test

import (
	"testing"
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

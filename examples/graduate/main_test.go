package main

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/contrib/rabbitmq"
)

// The program prints what it should in process, and the same on RabbitMQ when
// $WARREN_RABBITMQ_URL points at one (CI sets it).
func TestSameOnBothBackends(t *testing.T) {
	var inProcess bytes.Buffer
	b := warren.New()
	require.NoError(t, run(context.Background(), b, &inProcess))
	require.NoError(t, b.Close())
	require.Equal(t, `shipped: [apples bread dates figs flaky-cheese]
dead:    [always-out-of-grapes bad-eggs]
apples                 1 attempt(s)
bread                  1 attempt(s)
flaky-cheese           2 attempt(s)
dates                  1 attempt(s)
bad-eggs               1 attempt(s)
figs                   1 attempt(s)
always-out-of-grapes   3 attempt(s)
`, inProcess.String())

	url := os.Getenv("WARREN_RABBITMQ_URL")
	if url == "" {
		t.Skip("WARREN_RABBITMQ_URL is not set: the RabbitMQ half is skipped (CI sets it)")
	}
	c, err := rabbitmq.Dial(url, rabbitmq.WithQueueType(rabbitmq.Quorum))
	require.NoError(t, err)
	defer c.Close()
	var onRabbit bytes.Buffer
	require.NoError(t, run(context.Background(), c, &onRabbit))
	require.Equal(t, inProcess.String(), onRabbit.String())
}

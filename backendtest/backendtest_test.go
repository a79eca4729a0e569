package backendtest_test

import (
	"testing"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/backendtest"
)

// The suite on warren's own broker.
func TestBroker(t *testing.T) {
	backendtest.Run(t, func(*testing.T) warren.Backend { return warren.New() })
}

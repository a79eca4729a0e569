package backendtest_test

import (
	"testing"
	"testing/synctest"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/backendtest"
)

// The suite on warren's own broker.
func TestBroker(t *testing.T) {
	backendtest.Run(t, func(*testing.T) warren.Backend { return warren.New() })
}

// The suite on warren's own broker in virtual time: every delay, TTL and wait of the suite is
// exact, and a goroutine left behind by a scenario fails it.
func TestBrokerInVirtualTime(t *testing.T) {
	for _, sc := range backendtest.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { sc.Run(t, warren.New()) })
		})
	}
}

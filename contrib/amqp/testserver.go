package amqp

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"testing"

	"github.com/warrenmq/warren"
)

// NewTestServer starts a server for b on a random loopback port, as httptest.NewServer does,
// closes it when the test ends, and returns the URL a client dials:
// "amqp://guest:guest@127.0.0.1:PORT/", or, when [Users] leaves guest out, the user whose name
// sorts first.
func NewTestServer(t testing.TB, b *warren.Broker, opts ...Option) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("amqp: listen on loopback: %v", err)
	}
	s := NewServer(b, opts...)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("amqp: test server: %v", err)
		}
	})
	user := "guest"
	if _, ok := s.cfg.users[user]; !ok && len(s.cfg.users) > 0 {
		user = slices.Min(slices.Collect(maps.Keys(s.cfg.users)))
	}
	password := s.cfg.users[user]
	return fmt.Sprintf("amqp://%s:%s@%s/", user, password, ln.Addr())
}

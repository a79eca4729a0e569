package amqp

import (
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/warrenmq/warren"
)

// NewTestServer starts a server for b on a random loopback port, as httptest.NewServer does,
// closes it when the test ends, and returns the URL a client dials:
// "amqp://guest:guest@127.0.0.1:PORT/" (with opts' first user instead of guest, if Users is
// given).
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
	user, password := "guest", "guest"
	for u, p := range s.cfg.users {
		if _, ok := s.cfg.users["guest"]; !ok {
			user, password = u, p
		}
		break
	}
	return fmt.Sprintf("amqp://%s:%s@%s/", user, password, ln.Addr())
}

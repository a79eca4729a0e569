package bench

import (
	"errors"
	"fmt"
	"net"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/contrib/amqp"
)

func init() {
	register(Spec{
		Info: Info{
			Name: "warren-amqp", Ordered: true, Acks: true, Backlog: true, WithServer: true,
			Setup: "the `rabbitmq` system's client code (`amqp091-go`: one connection and channel per producer and per consumer; queues declared with the same arguments, `x-queue-type: classic` and `x-expires: 600000`, which warren accepts; transient messages; publisher confirms with at most 4000 unconfirmed per producer, `-rabbit-window`; `basic.qos(prefetch)`, `basic.consume` with manual ack, `basic.ack` per message, `basic.nack(multiple, requeue)` to requeue) against `warren.New()` served by contrib/amqp's `Server` (`amqp.NewServer(b)`, default options) on a loopback port (127.0.0.1:0) that the system opens. **The server runs in the bench process**: allocations and peak RSS are the client's and the server's together",
		},
		Open: func() (System, error) { return newWarrenAMQP() },
	})
}

// warrenAMQPSys is the rabbitmq system's client against a warren broker that contrib/amqp
// serves in this process, over loopback TCP.
type warrenAMQPSys struct {
	*rabbitSys // the producers, consumers and topic code, connected to the server below

	b      *warren.Broker
	srv    *amqp.Server
	served chan error // Serve's result, once Close has stopped it
}

func newWarrenAMQP() (*warrenAMQPSys, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &warrenAMQPSys{b: warren.New(), served: make(chan error, 1)}
	s.srv = amqp.NewServer(s.b)
	go func() { s.served <- s.srv.Serve(ln) }()
	s.rabbitSys, err = newRabbit(fmt.Sprintf("amqp://guest:guest@%s/", ln.Addr()), false)
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// ServerRSS hides rabbitSys's, which reads the RabbitMQ node's: this server is the process
// itself, whose RSS the workloads measure anyway.
func (s *warrenAMQPSys) ServerRSS() (int64, bool) { return 0, false }

// Close deletes the queues and closes the client's connections, then the server and the
// broker.
func (s *warrenAMQPSys) Close() error {
	var err error
	if s.rabbitSys != nil {
		err = s.rabbitSys.Close()
	}
	s.srv.Close()
	if serr := <-s.served; !errors.Is(serr, amqp.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return errors.Join(err, s.b.Close())
}

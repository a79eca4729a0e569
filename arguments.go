package warren

import (
	"context"
	"time"
)

// RabbitMQ's declaration arguments: a queue's "x-" arguments and an exchange's
// "alternate-exchange", parsed and validated as RabbitMQ does (a bad value is its 406, an error
// wrapping [ErrPreconditionFailed]) into the typed configuration the queue and the exchange run
// on, and compared on redeclaration. The typed options ([MessageTTL], [MaxLength], …) write the
// same arguments (options.go), so a declaration has one form however it was written.

// parseArgs validates an exchange's arguments and sets the typed fields from them.
func (c *exchangeConfig) parseArgs() error {
	if v, ok := c.args["alternate-exchange"]; ok {
		s, ok := v.(string)
		if !ok {
			return errorf("alternate-exchange %v is not a string: %w", v, ErrPreconditionFailed)
		}
		c.alternate = s
	}
	return nil
}

// equivalent reports whether a redeclaration matches the declaration: flags and the arguments
// RabbitMQ compares. Unrecognised arguments are not compared.
func (c queueConfig) equivalent(d queueConfig) error {
	if c.durable != d.durable {
		return errorf("inequivalent durable %t, was %t: %w", d.durable, c.durable, ErrPreconditionFailed)
	}
	if c.autoDelete != d.autoDelete {
		return errorf("inequivalent auto-delete %t, was %t: %w", d.autoDelete, c.autoDelete, ErrPreconditionFailed)
	}
	if (c.owner != nil) != (d.owner != nil) {
		return errorf("inequivalent exclusive %t, was %t: %w", d.owner != nil, c.owner != nil, ErrPreconditionFailed)
	}
	for _, k := range comparedQueueArgs {
		v1, ok1 := c.args[k]
		v2, ok2 := d.args[k]
		if ok1 != ok2 || !sameField(v1, v2) {
			return errorf("inequivalent arg %q: %v, was %v: %w", k, v2, v1, ErrPreconditionFailed)
		}
	}
	return nil
}

// comparedQueueArgs are the queue arguments RabbitMQ checks for equivalence on redeclaration.
var comparedQueueArgs = []string{
	"x-dead-letter-exchange", "x-dead-letter-routing-key", "x-delivery-limit", "x-expires",
	"x-max-length", "x-max-length-bytes", "x-max-priority", "x-message-ttl", "x-overflow",
	"x-queue-type", "x-single-active-consumer",
}

func (x *Exchange) equivalent(kind string, c exchangeConfig) error {
	switch {
	case x.kind != kind:
		return errorf("inequivalent kind %q, was %q: %w", kind, x.kind, ErrPreconditionFailed)
	case x.cfg.durable != c.durable:
		return errorf("inequivalent durable %t, was %t: %w", c.durable, x.cfg.durable, ErrPreconditionFailed)
	case x.cfg.autoDelete != c.autoDelete:
		return errorf("inequivalent auto-delete %t, was %t: %w", c.autoDelete, x.cfg.autoDelete, ErrPreconditionFailed)
	case x.cfg.internal != c.internal:
		return errorf("inequivalent internal %t, was %t: %w", c.internal, x.cfg.internal, ErrPreconditionFailed)
	case x.cfg.alternate != c.alternate:
		return errorf("inequivalent alternate-exchange %q, was %q: %w", c.alternate, x.cfg.alternate, ErrPreconditionFailed)
	}
	return nil
}

// queueConfig is a queue's declaration. Two declarations of one queue must be equivalent.
// args is the declaration as RabbitMQ sees it (typed options write into it); the fields after
// it are parsed from args by parseArgs.
type queueConfig struct {
	durable    bool
	autoDelete bool
	args       Table

	ttl           time.Duration // message TTL; -1 for none
	dlx           string        // dead-letter exchange, when hasDLX
	hasDLX        bool
	dlrk          string // dead-letter routing key, when hasDLRK
	hasDLRK       bool
	expires       time.Duration   // queue expiry; 0 for none
	maxLen        int64           // ready messages; -1 for no limit
	maxBytes      int64           // ready body bytes; -1 for no limit
	overflow      OverflowPolicy  // what a length limit does
	deliveryLimit int64           // returns before dead-lettering; -1 for no limit
	maxPriority   int             // highest message priority; 0 for a queue without priorities
	singleActive  bool            // single active consumer
	ackTimeout    time.Duration   // x-consumer-timeout: consumers' default ack timeout; 0 for none
	owner         context.Context // the context an exclusive queue belongs to; nil if not exclusive
	alerts        Alerts          // thresholds and slow-consumer policy (alerts.go)
	alerting      bool            // some alert threshold is set
	err           error           // a typed option's invalid value
}

// levels returns the number of priority levels of the queue's ready set.
func (c *queueConfig) levels() int { return c.maxPriority + 1 }

// limited reports whether the queue has a length limit: a plain integer check that keeps the
// overflow policy off the path of queues without one.
func (c *queueConfig) limited() bool { return c.maxLen >= 0 || c.maxBytes >= 0 }

// refusesToDLX reports whether the queue dead-letters what its length limits refuse
// (reject-publish-dlx with a dead-letter exchange).
func (c *queueConfig) refusesToDLX() bool { return c.overflow == RejectPublishDLX && c.hasDLX }

// parseArgs validates the queue arguments warren understands, as RabbitMQ does (406 →
// [ErrPreconditionFailed]), and sets the typed fields from them.
func (c *queueConfig) parseArgs() error {
	c.ttl, c.maxLen, c.maxBytes, c.deliveryLimit, c.overflow = -1, -1, -1, -1, DropHead
	if v, ok := c.args["x-queue-type"]; ok && v != "classic" {
		return errorf("argument x-queue-type: %v (%T): warren implements classic queues only: %w", v, v, ErrPreconditionFailed)
	}
	if v, ok := c.args["x-expires"]; ok {
		d, err := ttlArg("x-expires", v)
		if err != nil || d == 0 {
			return errorf("argument x-expires: %v (%T) is not an integer from 1 to 2^32-1: %w", v, v, ErrPreconditionFailed)
		}
		c.expires = d
	}
	for _, a := range []struct {
		name string
		dst  *int64
		min  int64
	}{{"x-max-length", &c.maxLen, 0}, {"x-max-length-bytes", &c.maxBytes, 0}, {"x-delivery-limit", &c.deliveryLimit, -1}} {
		if v, ok := c.args[a.name]; ok {
			n, ok := intArg(v)
			if !ok || n < a.min {
				return errorf("argument %s: %v (%T) is not an integer from %d: %w", a.name, v, v, a.min, ErrPreconditionFailed)
			}
			*a.dst = n
		}
	}
	if v, ok := c.args["x-overflow"]; ok {
		s, _ := v.(string)
		switch p := OverflowPolicy(s); p {
		case DropHead, RejectPublish, RejectPublishDLX, Block:
			c.overflow = p
		default:
			return errorf("argument x-overflow: %v (%T) is not drop-head, reject-publish, reject-publish-dlx or block: %w", v, v, ErrPreconditionFailed)
		}
	}
	if v, ok := c.args["x-max-priority"]; ok {
		n, ok := intArg(v)
		if !ok || n < 0 || n > maxPriority {
			return errorf("argument x-max-priority: %v (%T) is not an integer from 0 to %d: %w", v, v, maxPriority, ErrPreconditionFailed)
		}
		c.maxPriority = int(n)
	}
	if v, ok := c.args["x-single-active-consumer"]; ok {
		b, ok := v.(bool)
		if !ok {
			return errorf("argument x-single-active-consumer: %v (%T) is not a boolean: %w", v, v, ErrPreconditionFailed)
		}
		c.singleActive = b
	}
	if v, ok := c.args["x-consumer-timeout"]; ok {
		d, err := ttlArg("x-consumer-timeout", v)
		if err != nil || d == 0 {
			return errorf("argument x-consumer-timeout: %v (%T) is not an integer from 1 to 2^32-1: %w", v, v, ErrPreconditionFailed)
		}
		c.ackTimeout = d
	}
	if v, ok := c.args["x-message-ttl"]; ok {
		ttl, err := ttlArg("x-message-ttl", v)
		if err != nil {
			return err
		}
		c.ttl = ttl
	}
	if v, ok := c.args["x-dead-letter-exchange"]; ok {
		s, ok := v.(string)
		if !ok {
			return errorf("argument x-dead-letter-exchange: %v (%T) is not a string: %w", v, v, ErrPreconditionFailed)
		}
		c.dlx, c.hasDLX = s, true
	}
	if v, ok := c.args["x-dead-letter-routing-key"]; ok {
		s, ok := v.(string)
		switch {
		case !ok:
			return errorf("argument x-dead-letter-routing-key: %v (%T) is not a string: %w", v, v, ErrPreconditionFailed)
		case !c.hasDLX:
			return errorf("argument x-dead-letter-routing-key without x-dead-letter-exchange: %w", ErrPreconditionFailed)
		}
		c.dlrk, c.hasDLRK = s, true
	}
	return nil
}

type exchangeConfig struct {
	durable    bool
	autoDelete bool
	internal   bool
	alternate  string // "" when none
	args       Table
}

// maxTTL is RabbitMQ's largest TTL, 2^32-1 milliseconds.
const maxTTL = (1<<32 - 1) * time.Millisecond

// ttlArg parses an "x-message-ttl"-like queue argument: an AMQP integer from 0 to 2^32-1
// milliseconds.
func ttlArg(name string, v any) (time.Duration, error) {
	n, ok := intArg(v)
	if !ok || n < 0 || n > int64(maxTTL/time.Millisecond) {
		return 0, errorf("argument %s: %v (%T) is not an integer from 0 to 2^32-1: %w", name, v, v, ErrPreconditionFailed)
	}
	return time.Duration(n) * time.Millisecond, nil
}

// intArg returns the value of an AMQP integer field.
func intArg(v any) (int64, bool) {
	switch v := v.(type) {
	case int8:
		return int64(v), true
	case int16:
		return int64(v), true
	case int32:
		return int64(v), true
	case int64:
		return v, true
	case int:
		return int64(v), true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	}
	return 0, false
}

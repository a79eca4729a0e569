package rabbitmq

import (
	"context"
	"fmt"
	"maps"
	"math"
	"strconv"
	"time"

	"github.com/warrenmq/warren"
)

// Retries with a delay ([warren.Backoff], [warren.Delivery.NackWithDelay]) on RabbitMQ, which
// cannot hold a message back in its queue: the standard retry pattern. A failed delivery of
// queue q that is to come back after d is published (confirmed, mandatory) to the retry queue
// "q.retry.<d in ms>", whose message TTL is d and whose dead-letter route is the default
// exchange with q's name, and then acked: after d it expires back into q, at the tail. The
// client declares each retry queue the first time it needs it (durable; with the client's
// queue type, a quorum one dead-lettering at least once) and again after every reconnect.
//
// The copy carries how many deliveries the message had before it ([retriesHeader]), so that
// its DeliveryCount goes on from there, and the work queue's delivery limit, which counts only
// the returns of one copy, is kept by the client: a failure that would exceed the limit
// rejects the message instead (it is dead-lettered with reason "rejected"). The client knows a
// queue's limit from the topologies it declared ([Client.DeclareTopology]); a queue it did not
// declare is retried without one.
//
// A copy is published before the original is acked: if the connection drops in between, the
// original comes back too, and the message is handled twice (at least once, as everywhere).

// retriesHeader carries, on a retry's copy, the deliveries its message had before the copy
// was made. A consumer of this package does not see it; other consumers of the queue do.
const retriesHeader = "x-warren-deliveries"

// maxRetryDelay is the longest delay a retry queue can hold a message for: RabbitMQ's largest
// message TTL, 2³²−1 ms (about 49.7 days).
const maxRetryDelay = math.MaxUint32 * time.Millisecond

// retryQueue returns the name and declaration of the queue where a message of queue waits for
// delay, rounded up to a millisecond.
func (c *Client) retryQueue(queue string, delay time.Duration) warren.QueueDecl {
	ms := int64((delay + time.Millisecond - 1) / time.Millisecond)
	args := warren.Table{"x-message-ttl": ms, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue}
	if c.cfg.queueType == Quorum {
		// Expiring back into the work queue at least once (RabbitMQ 3.10+) needs reject-publish.
		args["x-overflow"] = string(warren.RejectPublish)
		args["x-dead-letter-strategy"] = "at-least-once"
	}
	return warren.QueueDecl{Name: queue + ".retry." + strconv.FormatInt(ms, 10), Durable: true, Arguments: args}
}

// declareRetryQueue declares q unless the client has already, and keeps it to declare again
// after a reconnect.
func (c *Client) declareRetryQueue(q warren.QueueDecl) error {
	c.retryMu.Lock()
	defer c.retryMu.Unlock()
	if c.retryQueues[q.Name] {
		return nil
	}
	if err := c.DeclareTopology(warren.Topology{Queues: []warren.QueueDecl{q}}); err != nil {
		return err
	}
	c.retryQueues[q.Name] = true
	return nil
}

// deliveryLimit returns the delivery limit of a queue the client declared, or -1.
func (c *Client) deliveryLimit(queue string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	limit := int64(-1)
	for _, t := range c.topologies {
		for _, q := range t.Queues {
			if q.Name != queue {
				continue
			}
			limit = -1 // the last declaration counts
			if n, ok := q.Arguments.Int("x-delivery-limit"); ok {
				limit = n
			}
		}
	}
	return limit
}

// retry settles a failed delivery that is to come back after delay: a copy to the retry
// queue, then an ack; or a reject when the failure exceeds the queue's delivery limit. If the
// copy cannot be published, the delivery is returned at once and the error says why.
func (k *consumer) retry(tag uint64, h held, delay time.Duration) error {
	returns := int64(h.deliveries) + 1 // this failure's included
	if k.limit >= 0 && returns > k.limit {
		if err := k.ch.Reject(tag, false); err != nil {
			return wrap(err, "settle delivery %d", tag)
		}
		return nil
	}
	q := k.c.retryQueue(k.queue, delay)
	err := k.c.declareRetryQueue(q)
	if err == nil {
		msg := h.msg
		msg.Headers = maps.Clone(msg.Headers)
		if msg.Headers == nil {
			msg.Headers = warren.Table{}
		}
		msg.Headers[retriesHeader] = returns
		err = k.c.Publish(context.Background(), "", q.Name, msg, warren.Mandatory())
	}
	if err != nil {
		if nerr := k.ch.Nack(tag, false, true); nerr != nil {
			return wrap(nerr, "settle delivery %d", tag)
		}
		return fmt.Errorf("rabbitmq: retry delivery %d after %v: returned at once: %w", tag, delay, err)
	}
	if err := k.ch.Ack(tag, false); err != nil {
		return wrap(err, "settle delivery %d", tag)
	}
	return nil
}

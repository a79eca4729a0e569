"""A smoke test of the server with pika, Python's AMQP 0-9-1 client (Debian's python3-pika).

Run by contrib/amqp's otherclients_test.go as `/usr/bin/python3 smoke.py URL` against a server of
a fresh broker, and against RabbitMQ when the test has one; smoke.js does the same with Node's
amqplib, and the test expects the same summary from both. The plan:

  1. declare a direct dead-letter exchange and its queue, and a work queue whose
     x-dead-letter-exchange (and -routing-key) is it;
  2. confirm.select, publish N messages to the work queue, each confirmed (pika's blocking
     channel waits for each publish's basic.ack);
  3. basic.get one: the get-ok's message count is what is left (N-1); ack it;
  4. basic.qos 1 and consume with manual ack: nack the 2nd message with requeue, see it
     again with the redelivered flag, reject the 3rd without requeue, ack the rest;
  5. consume the rejected message from the dead-letter queue, with an x-death header whose
     reason is "rejected";
  6. basic.get on the empty work queue: get-empty;
  7. publish mandatory to a key no queue is bound to: basic.return, NO_ROUTE (312);
  8. both queues are empty (queue.declare passive); delete them and the exchange (before step 1
     too: a long-lived RabbitMQ may keep them from a run that was interrupted); close the
     channel and the connection.

It prints a JSON summary on stdout and exits 1 if it differs from expected.json, what RabbitMQ
does.
"""

import json
import os
import sys
import time

import pika
import pika.exceptions

N = 10
WORK, DLX, DLQ = "smoke.work", "smoke.dlx", "smoke.dlq"
DEAD_KEY = "dead"
UNROUTABLE = "smoke.nowhere"
TIMEOUT = 10  # seconds to wait for any one thing the server sends


def text(v):
    """Returns a table value that pika may decode as bytes as a str."""
    return v.decode() if isinstance(v, bytes) else v


def main():
    url = sys.argv[1]
    errors = []

    def check(what, got, want):
        if got != want:
            errors.append(f"{what} = {got!r}, want {want!r}")

    summary = {"client": "pika", "version": pika.__version__}
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()

    # 1. The topology.
    delete(ch)
    ch.exchange_declare(DLX, exchange_type="direct")
    ch.queue_declare(DLQ)
    ch.queue_bind(DLQ, DLX, routing_key=DEAD_KEY)
    ok = ch.queue_declare(WORK, arguments={"x-dead-letter-exchange": DLX, "x-dead-letter-routing-key": DEAD_KEY})
    check("queue.declare-ok queue", ok.method.queue, WORK)

    # 2. Publisher confirms: basic_publish returns once the server has confirmed the message, and
    # raises NackError or UnroutableError if it is not confirmed positively.
    ch.confirm_delivery()
    confirmed = 0
    for i in range(N):
        ch.basic_publish("", WORK, f"m{i}".encode(), pika.BasicProperties(
            content_type="text/plain", delivery_mode=2, headers={"i": i}))
        confirmed += 1
    summary["published"] = N
    summary["confirmed"] = confirmed

    # 3. basic.get: the message count is what is left in the queue.
    method, props, body = ch.basic_get(WORK)
    if method is None:
        errors.append("basic.get on the work queue: get-empty, want a message")
        summary["get"] = None
    else:
        summary["get"] = {"body": body.decode(), "message_count": method.message_count,
                          "redelivered": method.redelivered}
        check("basic.get headers", props.headers, {"i": 0})
        ch.basic_ack(method.delivery_tag)

    # 4. Consume with manual ack, one message at a time.
    ch.basic_qos(prefetch_count=1)
    deliveries = []  # "mI", or "mI*" when redelivered
    acked = 0
    nacked = rejected = None
    for method, props, body in ch.consume(WORK, inactivity_timeout=TIMEOUT):
        if method is None:
            errors.append(f"consume: nothing for {TIMEOUT} s after {deliveries}")
            break
        b = body.decode()
        deliveries.append(b + ("*" if method.redelivered else ""))
        check(f"delivery of {b}: content type", props.content_type, "text/plain")
        check(f"delivery of {b}: delivery mode", props.delivery_mode, 2)
        if b == "m1" and nacked is None:
            nacked = b
            ch.basic_nack(method.delivery_tag, requeue=True)
        elif b == "m2" and rejected is None:
            rejected = b
            ch.basic_reject(method.delivery_tag, requeue=False)
        else:
            ch.basic_ack(method.delivery_tag)
            acked += 1
        if len(deliveries) == N:  # N-1 messages, one of them twice
            break
    ch.cancel()
    summary["deliveries"] = deliveries
    summary["acked"] = acked

    # 5. The rejected message, dead-lettered.
    summary["dead_lettered"] = None
    for method, props, body in ch.consume(DLQ, inactivity_timeout=TIMEOUT):
        if method is None:
            errors.append(f"consume from {DLQ}: nothing for {TIMEOUT} s")
            break
        deaths = (props.headers or {}).get("x-death") or [{}]
        death = deaths[0]
        summary["dead_lettered"] = {
            "body": body.decode(),
            "exchange": method.exchange,
            "routing_key": method.routing_key,
            "x_death": {
                "entries": len(deaths),
                "reason": text(death.get("reason")),
                "queue": text(death.get("queue")),
                "exchange": text(death.get("exchange")),
                "routing_keys": [text(k) for k in death.get("routing-keys", [])],
                "count": death.get("count"),
            },
            "x_first_death_reason": text((props.headers or {}).get("x-first-death-reason")),
        }
        ch.basic_ack(method.delivery_tag)
        break
    ch.cancel()

    # 6. Nothing is left to get.
    method, _, _ = ch.basic_get(WORK)
    summary["get_empty"] = method is None

    # 7. A mandatory publish that no queue takes comes back. In confirm mode the blocking
    # channel raises UnroutableError with the returned messages (basic.return, then basic.ack).
    summary["returned"] = None
    try:
        ch.basic_publish("", UNROUTABLE, b"lost", mandatory=True)
        errors.append("mandatory publish to an unbound key: no basic.return")
    except pika.exceptions.UnroutableError as e:
        r = e.messages[0]
        summary["returned"] = {"reply_code": r.method.reply_code, "reply_text": r.method.reply_text,
                               "exchange": r.method.exchange, "routing_key": r.method.routing_key,
                               "body": r.body.decode()}

    # 8. Both queues are empty, and everything closes cleanly.
    summary["left"] = {q: ch.queue_declare(q, passive=True).method.message_count for q in (WORK, DLQ)}
    delete(ch)
    ch.close()
    conn.close()
    summary["closed"] = ch.is_closed and conn.is_closed

    expect(summary, check)
    summary["errors"] = errors
    print(json.dumps(summary, sort_keys=True))
    return 1 if errors else 0


def delete(ch):
    """Deletes the queues and the exchange, if they exist."""
    for q in (WORK, DLQ):
        ch.queue_delete(q)
    ch.exchange_delete(DLX)


def expect(summary, check):
    """Checks the summary against expected.json, what RabbitMQ does (the same for every client).
    Among it: RabbitMQ requeues a nacked message to its place, the head here, so it comes again
    at once ("m1*", the redelivery, right after "m1")."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "expected.json")) as f:
        want = json.load(f)
    for key, value in want.items():
        check(key, summary.get(key), value)


if __name__ == "__main__":
    started = time.monotonic()
    try:
        rc = main()
    except Exception as e:  # an unexpected exception is a failure with a summary, not a traceback alone
        print(json.dumps({"client": "pika", "version": pika.__version__, "errors": [f"{type(e).__name__}: {e!r}"]}))
        raise
    print(f"pika {pika.__version__}: {time.monotonic() - started:.2f} s", file=sys.stderr)
    sys.exit(rc)

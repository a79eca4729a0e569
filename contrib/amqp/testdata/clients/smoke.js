// A smoke test of the server with amqplib, Node's AMQP 0-9-1 client, pinned in node/package.json
// (npm ci there installs it).
//
// Run by contrib/amqp's otherclients_test.go as `node smoke.js URL` against a server of a fresh
// broker, and against RabbitMQ when the test has one; smoke.py does the same with Python's pika,
// and the test expects the same summary from both. The plan:
//
//  1. declare a direct dead-letter exchange and its queue, and a work queue whose
//     x-dead-letter-exchange (and -routing-key) is it;
//  2. on a confirm channel, publish N messages to the work queue at once, then wait for their
//     confirms (amqplib's waitForConfirms, and each publish's callback);
//  3. basic.get one: the get-ok's message count is what is left (N-1); ack it;
//  4. basic.qos 1 and consume with manual ack: nack the 2nd message with requeue, see it
//     again with the redelivered flag, reject the 3rd without requeue, ack the rest;
//  5. consume the rejected message from the dead-letter queue, with an x-death header whose
//     reason is "rejected";
//  6. basic.get on the empty work queue: get-empty;
//  7. publish mandatory to a key no queue is bound to: basic.return, NO_ROUTE (312);
//  8. both queues are empty (queue.declare passive); delete them and the exchange (before step 1
//     too: a long-lived RabbitMQ may keep them from a run that was interrupted); close the
//     channel and the connection.
//
// It prints a JSON summary on stdout and exits 1 if it differs from expected.json, what RabbitMQ
// does.

const fs = require('node:fs');
const path = require('node:path');
const { createRequire } = require('node:module');
const { isDeepStrictEqual } = require('node:util');

// amqplib is installed in node/, not beside this script.
const nodeDir = path.join(__dirname, 'node');
const amqp = createRequire(path.join(nodeDir, 'package.json'))('amqplib');
// amqplib's package.json is not among its exports: read the file.
const version = JSON.parse(fs.readFileSync(path.join(nodeDir, 'node_modules', 'amqplib', 'package.json'))).version;

const N = 10;
const WORK = 'smoke.work';
const DLX = 'smoke.dlx';
const DLQ = 'smoke.dlq';
const DEAD_KEY = 'dead';
const UNROUTABLE = 'smoke.nowhere';
const TIMEOUT = 10_000; // ms to wait for any one thing the server sends

// within rejects if promise has not settled after TIMEOUT.
function within(what, promise) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: nothing for ${TIMEOUT} ms`)), TIMEOUT);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function main(url) {
  const errors = [];
  const check = (what, got, want) => {
    if (!isDeepStrictEqual(got, want)) {
      errors.push(`${what} = ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
    }
  };
  const summary = { client: 'amqplib', version };

  const conn = await amqp.connect(url);
  conn.on('error', (err) => errors.push(`connection error: ${err.message}`));
  const ch = await conn.createConfirmChannel();
  ch.on('error', (err) => errors.push(`channel error: ${err.message}`));

  // 1. The topology. amqplib declares durable by default; pika does not: neither is, here.
  await remove(ch);
  await ch.assertExchange(DLX, 'direct', { durable: false });
  await ch.assertQueue(DLQ, { durable: false });
  await ch.bindQueue(DLQ, DLX, DEAD_KEY);
  const ok = await ch.assertQueue(WORK, { durable: false, deadLetterExchange: DLX, deadLetterRoutingKey: DEAD_KEY });
  check('queue.declare-ok queue', ok.queue, WORK);

  // 2. Publisher confirms: every publish at once, then wait for all the confirms.
  let confirmed = 0;
  for (let i = 0; i < N; i++) {
    ch.publish('', WORK, Buffer.from(`m${i}`), { contentType: 'text/plain', persistent: true, headers: { i } }, (err) => {
      if (err) {
        errors.push(`publish of m${i}: nacked`);
      } else {
        confirmed++;
      }
    });
  }
  await within('confirms', ch.waitForConfirms());
  summary.published = N;
  summary.confirmed = confirmed;

  // 3. basic.get: the message count is what is left in the queue.
  const got = await ch.get(WORK, { noAck: false });
  if (got === false) {
    errors.push('basic.get on the work queue: get-empty, want a message');
    summary.get = null;
  } else {
    summary.get = {
      body: got.content.toString(),
      message_count: got.fields.messageCount,
      redelivered: got.fields.redelivered,
    };
    check('basic.get headers', got.properties.headers, { i: 0 });
    ch.ack(got);
  }

  // 4. Consume with manual ack, one message at a time.
  await ch.prefetch(1);
  const deliveries = []; // "mI", or "mI*" when redelivered
  let acked = 0;
  let nacked = null;
  let rejected = null;
  let consumerTag;
  await within(
    'consume',
    new Promise((resolve, reject) => {
      ch.consume(
        WORK,
        (msg) => {
          if (msg === null) {
            reject(new Error('consume: cancelled by the server'));
            return;
          }
          const b = msg.content.toString();
          deliveries.push(b + (msg.fields.redelivered ? '*' : ''));
          check(`delivery of ${b}: content type`, msg.properties.contentType, 'text/plain');
          check(`delivery of ${b}: delivery mode`, msg.properties.deliveryMode, 2);
          if (b === 'm1' && nacked === null) {
            nacked = b;
            ch.nack(msg, false, true);
          } else if (b === 'm2' && rejected === null) {
            rejected = b;
            ch.reject(msg, false);
          } else {
            ch.ack(msg);
            acked++;
          }
          if (deliveries.length === N) {
            resolve(); // N-1 messages, one of them twice
          }
        },
        { noAck: false },
      ).then((reply) => {
        consumerTag = reply.consumerTag;
      }, reject);
    }),
  ).catch((err) => errors.push(`${err.message} after ${JSON.stringify(deliveries)}`));
  if (consumerTag !== undefined) {
    await ch.cancel(consumerTag);
  }
  summary.deliveries = deliveries;
  summary.acked = acked;

  // 5. The rejected message, dead-lettered.
  summary.dead_lettered = null;
  let dlqTag;
  await within(
    `consume from ${DLQ}`,
    new Promise((resolve, reject) => {
      ch.consume(
        DLQ,
        (msg) => {
          if (msg === null) {
            reject(new Error(`consume from ${DLQ}: cancelled by the server`));
            return;
          }
          if (summary.dead_lettered !== null) {
            return; // only one is expected: a second one shows in "left"
          }
          const headers = msg.properties.headers || {};
          const deaths = headers['x-death'] || [{}];
          const death = deaths[0];
          summary.dead_lettered = {
            body: msg.content.toString(),
            exchange: msg.fields.exchange,
            routing_key: msg.fields.routingKey,
            x_death: {
              entries: deaths.length,
              reason: death.reason,
              queue: death.queue,
              exchange: death.exchange,
              routing_keys: death['routing-keys'] || [],
              count: death.count,
            },
            x_first_death_reason: headers['x-first-death-reason'],
          };
          ch.ack(msg);
          resolve();
        },
        { noAck: false },
      ).then((reply) => {
        dlqTag = reply.consumerTag;
      }, reject);
    }),
  ).catch((err) => errors.push(err.message));
  if (dlqTag !== undefined) {
    await ch.cancel(dlqTag);
  }

  // 6. Nothing is left to get.
  summary.get_empty = (await ch.get(WORK, { noAck: false })) === false;

  // 7. A mandatory publish that no queue takes comes back: basic.return, then the confirm.
  summary.returned = null;
  const returned = new Promise((resolve) => ch.once('return', resolve));
  ch.publish('', UNROUTABLE, Buffer.from('lost'), { mandatory: true });
  await within('confirm of the mandatory publish', ch.waitForConfirms());
  await within('basic.return', returned).then(
    (r) => {
      summary.returned = {
        reply_code: r.fields.replyCode,
        reply_text: r.fields.replyText,
        exchange: r.fields.exchange,
        routing_key: r.fields.routingKey,
        body: r.content.toString(),
      };
    },
    (err) => errors.push(err.message),
  );

  // 8. Both queues are empty, and everything closes cleanly.
  summary.left = {};
  for (const q of [WORK, DLQ]) {
    summary.left[q] = (await ch.checkQueue(q)).messageCount;
  }
  await remove(ch);
  const closed = new Promise((resolve) => conn.once('close', resolve));
  await ch.close();
  await conn.close();
  const closeErr = await within('connection close event', closed);
  summary.closed = closeErr === undefined;

  expect(summary, check);
  summary.errors = errors;
  return summary;
}

// remove deletes the queues and the exchange, if they exist.
async function remove(ch) {
  for (const q of [WORK, DLQ]) {
    await ch.deleteQueue(q);
  }
  await ch.deleteExchange(DLX);
}

// expect checks the summary against expected.json, what RabbitMQ does (the same for every
// client). Among it: RabbitMQ requeues a nacked message to its place, the head here, so it comes
// again at once ("m1*", the redelivery, right after "m1").
function expect(summary, check) {
  const want = JSON.parse(fs.readFileSync(path.join(__dirname, 'expected.json')));
  for (const [key, value] of Object.entries(want)) {
    check(key, summary[key], value);
  }
}

const started = process.hrtime.bigint();
main(process.argv[2]).then(
  (summary) => {
    console.log(JSON.stringify(summary));
    console.error(`amqplib ${version}: ${(Number(process.hrtime.bigint() - started) / 1e9).toFixed(2)} s`);
    process.exitCode = summary.errors.length > 0 ? 1 : 0;
  },
  (err) => {
    // An unexpected failure is a summary with the error, not a stack trace alone.
    console.log(JSON.stringify({ client: 'amqplib', version, errors: [String(err)] }));
    console.error(err);
    process.exit(1); // the connection may still be open, and would keep node running
  },
);

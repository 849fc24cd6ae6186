// Drives the official RocketMQ 5 Node client (rocketmq-client-nodejs, pinned in package.json)
// for tests/compat/test_node_client.py. Usage: node client.js <scenario> '<json arguments>'.
// Every scenario writes one JSON object per line on stdout; the test reads them.
'use strict';

const readline = require('node:readline');
const { ConsumeResult, FilterExpression, Producer, PushConsumer, SimpleConsumer } = require('rocketmq-client-nodejs');
const { Code, FilterType, TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

const [scenario, rawArguments] = process.argv.slice(2);
const args = JSON.parse(rawArguments || '{}');

function emit(record) {
  process.stdout.write(`${JSON.stringify(record)}\n`);
}

function viewOf(message) {
  return {
    messageId: message.messageId,
    body: message.body.toString(),
    tag: message.tag || null,
    keys: message.keys,
    messageGroup: message.messageGroup || null,
    properties: Object.fromEntries(message.properties),
    deliveryAttempt: message.deliveryAttempt,
    receiptHandle: message.receiptHandle,
    corrupted: message.corrupted === true,  // the client sets it only when the digest is wrong
    receivedAtMs: Date.now(),
  };
}

function messageOf(spec) {
  const message = { topic: args.topic, body: Buffer.from(spec.body) };
  if (spec.tag) message.tag = spec.tag;
  if (spec.keys) message.keys = spec.keys;
  if (spec.messageGroup) message.messageGroup = spec.messageGroup;
  if (spec.properties) message.properties = new Map(Object.entries(spec.properties));
  if (spec.deliveryAtMs) message.deliveryTimestamp = new Date(spec.deliveryAtMs);
  return message;
}

// Answers a check-back from the half message's body: "commit…", "rollback…", else unknown (throws).
const bodyChecker = {
  async check(message) {
    const body = message.body.toString();
    emit({ checked: body });
    if (body.startsWith('commit')) return TransactionResolution.COMMIT;
    if (body.startsWith('rollback')) return TransactionResolution.ROLLBACK;
    throw new Error("the local transaction's outcome cannot be read");
  },
};

// Until stdin closes: each line read ("commit" or "rollback") ends the transactions again
// that way, reporting the status codes (a gRPC status such as UNAVAILABLE while reconnecting).
async function endOnRequest(transactions) {
  for await (const resolution of readline.createInterface({ input: process.stdin })) {
    const ends = [];
    for (const transaction of transactions) ends.push(await end(transaction, resolution));
    emit({ ends });
  }
}

// Signs every call when args.accessKey is given (without it the client sends no authorization).
const sessionCredentials = args.accessKey ? { accessKey: args.accessKey, accessSecret: args.secretKey } : undefined;

// Ends a transaction with "commit" or "rollback"; the broker's status code (a Code value).
async function end(transaction, resolution) {
  try {
    await transaction[resolution]();
    return Code.OK;
  } catch (error) {
    if (error.code === undefined) throw error;
    return error.code;
  }
}

// Sends args.messages; a message with "ends" (say ["commit"], or [] to leave it to the
// check-back) is sent in a transaction, then ended that way, each end's status code reported.
async function send() {
  const producer = new Producer({ endpoints: args.endpoint, topic: args.topic, checker: bodyChecker,
    sessionCredentials });
  await producer.startup();
  try {
    const transactions = [];
    for (const spec of args.messages) {
      if (!spec.ends) {
        const receipt = await producer.send(messageOf(spec));
        emit({ messageId: receipt.messageId });
        continue;
      }
      const transaction = producer.beginTransaction();
      const receipt = await producer.send(messageOf(spec), transaction);
      transactions.push(transaction);
      const ends = [];
      for (const resolution of spec.ends) ends.push(await end(transaction, resolution));
      emit({ messageId: receipt.messageId, transactionId: receipt.transactionId, ends });
    }
    // A producer asked to stay answers check-backs, and ends its transactions on request.
    if (args.stay) {
      emit({ ready: true });
      await endOnRequest(transactions);
    }
  } finally {
    await producer.shutdown();
  }
}

function consumer() {
  return new SimpleConsumer({
    endpoints: args.endpoint,
    consumerGroup: args.group,
    // a TAG expression, or with args.sql an SQL92 one
    subscriptions: new Map().set(args.topic, args.sql ? new FilterExpression(args.sql, FilterType.SQL) : args.filter || '*'),
    awaitDuration: 1000,
    sessionCredentials,
  });
}

// Receives args.count messages one receive at a time (each batch reported), acking each;
// then reports whether one more receive comes back empty.
async function receive() {
  const simpleConsumer = consumer();
  await simpleConsumer.startup();
  try {
    let got = 0;
    const deadline = Date.now() + 30000;
    while (got < args.count && Date.now() < deadline) {
      const batch = await simpleConsumer.receive(32, 20000);
      if (batch.length === 0) continue;
      emit({ batch: batch.map(viewOf) });
      for (const message of batch) await simpleConsumer.ack(message);
      got += batch.length;
    }
    const more = await simpleConsumer.receive(32, 20000);
    emit({ emptyAfter: more.length === 0 });
  } finally {
    await simpleConsumer.shutdown();
  }
}

// Receives one message, shortens its invisible duration to 1 s, and receives it again.
async function changeInvisibleDuration() {
  const simpleConsumer = consumer();
  await simpleConsumer.startup();
  try {
    const first = await receiveOne(simpleConsumer);
    const firstHandle = first.receiptHandle;
    await simpleConsumer.changeInvisibleDuration(first, 1000);
    emit({ first: viewOf(first), firstHandle });
    const again = await receiveOne(simpleConsumer);
    await simpleConsumer.ack(again);
    emit({ again: viewOf(again) });
    const more = await simpleConsumer.receive(1, 30000);
    emit({ emptyAfter: more.length === 0 });
  } finally {
    await simpleConsumer.shutdown();
  }
}

async function receiveOne(simpleConsumer) {
  const deadline = Date.now() + 30000;
  while (Date.now() < deadline) {
    const [message] = await simpleConsumer.receive(1, 30000);
    if (message) return message;
  }
  throw new Error('no message within 30 s');
}

// A PushConsumer (as the PushConsumer.ts example: a group, a subscription, a listener) that
// reports each delivery; it works args.workMs on each, and fails the messages whose body starts
// with args.failPrefix on their first args.failTimes attempts. It runs until stdin closes.
async function push() {
  const pushConsumer = new PushConsumer({
    endpoints: args.endpoint,
    consumerGroup: args.group,
    subscriptions: new Map().set(args.topic, '*'),
    sessionCredentials,
    messageListener: {
      async consume(message) {
        const view = viewOf(message);
        const fails = args.failPrefix !== undefined && view.body.startsWith(args.failPrefix) &&
          message.deliveryAttempt <= args.failTimes;
        emit({ delivered: view, failed: fails });
        if (args.workMs) await new Promise(resolve => setTimeout(resolve, args.workMs));
        return fails ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
      },
    },
  });
  await pushConsumer.startup();
  try {
    emit({ ready: true });
    for await (const _ of readline.createInterface({ input: process.stdin })); // until stdin closes
  } finally {
    await pushConsumer.shutdown();
  }
}

// As ProducerRecallMessageExample: sends args.messages (delayed ones carry deliveryAtMs), each
// receipt reported with its recall handle; then recalls those named in args.recall (by body),
// and tries args.badHandles, reporting the recalled message ids and the refusals.
async function recall() {
  const producer = new Producer({ endpoints: args.endpoint, topic: args.topic, sessionCredentials });
  await producer.startup();
  try {
    const handles = new Map();
    for (const spec of args.messages) {
      const receipt = await producer.send(messageOf(spec));
      handles.set(spec.body, receipt.recallHandle);
      emit({ sent: spec.body, messageId: receipt.messageId, recallHandle: receipt.recallHandle || null });
    }
    for (const body of args.recall) {
      const receipt = await producer.recallMessage(args.topic, handles.get(body));
      emit({ recalled: body, messageId: receipt.messageId });
    }
    for (const handle of args.badHandles || []) {
      try {
        await producer.recallMessage(args.topic, handle);
        emit({ badHandle: handle, refused: null });
      } catch (error) {
        emit({ badHandle: handle, refused: error.message });
      }
    }
  } finally {
    await producer.shutdown();
  }
}

const scenarios = { send, receive, push, recall, 'change-invisible-duration': changeInvisibleDuration };

scenarios[scenario]().then(() => process.exit(0), error => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});

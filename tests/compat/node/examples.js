// The example programs of rocketmq-client-nodejs 1.0.x (nodejs/examples/ of
// apache/rocketmq-clients), each as a program of our own making the same client calls with the
// same settings, for tests/compat/test_node_examples.py. Usage: node examples.js <example>
// '<json arguments>' (args.endpoint, args.topic, args.group); one JSON object per line on stdout.
'use strict';

const readline = require('node:readline');
const {
  ConsumeResult, LitePushConsumerBuilder, OffsetOption, Producer, PushConsumer, SimpleConsumer,
} = require('rocketmq-client-nodejs');
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

const [example, rawArguments] = process.argv.slice(2);
const args = JSON.parse(rawArguments || '{}');

function emit(record) {
  process.stdout.write(`${JSON.stringify(record)}\n`);
}

function viewOf(message) {
  return {
    messageId: message.messageId,
    topic: message.topic,
    body: message.body.toString('utf-8'),
    tag: message.tag || null,
    keys: message.keys,
    messageGroup: message.messageGroup || null,
    priority: message.priority ?? null,
    deliveryAttempt: message.deliveryAttempt,
    corrupted: message.corrupted === true,
  };
}

// The client's own logger is the console (Producer.cjs: `logger: console`), on stderr here so
// that stdout carries only the records.
const stderrConsole = new console.Console(process.stderr);

// ProducerSingleton.ts: endpoints and namespace from the environment (here: the broker's
// address and ''), no credentials unless keys are set.
const singleton = { endpoints: args.endpoint, namespace: '', sessionCredentials: undefined };

// The body the producer examples send: JSON with a greeting (non-ASCII) and the time.
function demoBody() {
  return Buffer.from(JSON.stringify({ hello: 'rocketmq-client-nodejs world 😄', now: Date() }));
}

async function withProducer(options, work) {
  const producer = new Producer(options);
  await producer.startup();
  try {
    await work(producer);
  } finally {
    await producer.shutdown();
  }
}

// Producer.cjs: `logger: console`, one message tagged 'nodejs-demo'.
async function producerCjs() {
  await withProducer({ endpoints: args.endpoint, logger: stderrConsole }, async producer => {
    const receipt = await producer.send({ topic: args.topic, tag: 'nodejs-demo', body: demoBody() });
    emit({ messageId: receipt.messageId });
  });
}

// Producer.ts: an empty namespace and a 5 s request timeout.
async function producerTs() {
  await withProducer({ endpoints: args.endpoint, namespace: '', requestTimeout: 5000 }, async producer => {
    const receipt = await producer.send({ topic: args.topic, tag: 'nodejs-demo', body: demoBody() });
    emit({ messageId: receipt.messageId });
  });
}

// ProducerNormalMessageExample.ts: the singleton's settings, maxAttempts 3, tag 'nodejs-normal'.
async function normal() {
  await withProducer({ ...singleton, maxAttempts: 3 }, async producer => {
    const receipt = await producer.send({ topic: args.topic, tag: 'nodejs-normal', body: demoBody() });
    emit({ messageId: receipt.messageId });
  });
}

// ProducerDelayMessageExample.ts: deliveryTimestamp a Date args.delayMs ahead (the example: 5 s);
// the receipt's id and offset.
async function delay() {
  await withProducer({ ...singleton, maxAttempts: 3 }, async producer => {
    const deliveryTimestamp = new Date(Date.now() + args.delayMs);
    const receipt = await producer.send({ topic: args.topic, tag: 'rocketmq-delay', deliveryTimestamp,
      body: demoBody() });
    emit({ messageId: receipt.messageId, offset: String(receipt.offset), dueMs: deliveryTimestamp.getTime() });
  });
}

// ProducerFifoMessageExample.ts: three message groups, each a sequence of JSON bodies numbered
// from 1, tag 'fifo-message', 10 ms apart.
async function fifo() {
  const sequences = {
    'Order-001': [ 'CREATE', 'PAY', 'SHIP', 'COMPLETE' ],
    'Order-002': [ 'CREATE', 'PAY', 'CANCEL' ],
    'Account-Alice': [ 'DEPOSIT', 'WITHDRAW', 'TRANSFER' ],
  };
  await withProducer({ ...singleton, maxAttempts: 3 }, async producer => {
    for (const [ messageGroup, actions ] of Object.entries(sequences)) {
      for (const [ i, action ] of actions.entries()) {
        const body = Buffer.from(JSON.stringify({ sequence: i + 1, messageGroup, timestamp: Date.now(), action }));
        const receipt = await producer.send({ topic: args.topic, tag: 'fifo-message', body, messageGroup });
        emit({ messageGroup, sequence: i + 1, messageId: receipt.messageId });
        await new Promise(resolve => setTimeout(resolve, 10));
      }
    }
  });
}

// ProducerPriorityMessageExample.ts: priorities 1, 5, 10 and 100, then the three sends the
// client itself refuses (priority with a message group, with a delivery time, negative).
async function priority() {
  await withProducer({ ...singleton, maxAttempts: 3 }, async producer => {
    for (const [ level, tag ] of [[ 1, 'low' ], [ 5, 'medium' ], [ 10, 'high' ], [ 100, 'critical' ]]) {
      const body = Buffer.from(JSON.stringify({ type: `${tag.toUpperCase()}_PRIORITY`, timestamp: Date.now() }));
      const receipt = await producer.send({ topic: args.topic, tag: `${tag}-priority`, body, priority: level });
      emit({ priority: level, messageId: receipt.messageId });
    }
    const refused = [
      { priority: 5, messageGroup: 'group-1' },
      { priority: 5, deliveryTimestamp: new Date(Date.now() + 60000) },
      { priority: -1 },
    ];
    for (const fields of refused) {
      try {
        await producer.send({ topic: args.topic, body: Buffer.from('test'), ...fields });
        emit({ refused: null });
      } catch (error) {
        emit({ refused: error.message });
      }
    }
  });
}

// ProducerTransactionMessageExample.ts: a checker answering COMMIT, a transaction whose message
// carries the singleton's tag ('*' unless TAG is set), committed.
async function transaction() {
  const checker = { async check() { return TransactionResolution.COMMIT; } };
  await withProducer({ ...singleton, maxAttempts: 3, checker }, async producer => {
    const tx = producer.beginTransaction();
    const receipt = await producer.send({ topic: args.topic, tag: '*', body: demoBody() }, tx);
    await tx.commit();
    emit({ messageId: receipt.messageId });
  });
}

// LiteProducerExample.ts: messages with a liteTopic under a parent topic, keys `key-i`; each
// failure reported (LiteTopicQuotaExceededException or another).
async function liteProducer() {
  await withProducer({ ...singleton, maxAttempts: 3 }, async producer => {
    for (let i = 1; i <= args.count; i++) {
      try {
        const receipt = await producer.send({ topic: args.topic, keys: [ `key-${i}` ], liteTopic: `lite-topic-${i}`,
          body: Buffer.from('This is a lite message for Apache RocketMQ') });
        emit({ sent: receipt.messageId });
      } catch (error) {
        emit({ failed: error.message, kind: error.constructor.name });
      }
    }
  });
}

// LitePushConsumerExample.ts: a LitePushConsumer built with the builder, then subscribeLite with
// each offset option; each outcome reported.
async function litePushConsumer() {
  const consumer = await new LitePushConsumerBuilder()
    .setClientConfiguration({ endpoints: args.endpoint, namespace: '', sessionCredentials: undefined })
    .setConsumerGroup(args.group)
    .bindTopic(args.topic)
    .setMessageListener({ async consume() { return ConsumeResult.SUCCESS; } })
    .setMaxCacheMessageCount(1024)
    .setMaxCacheMessageSizeInBytes(64 * 1024 * 1024)
    .setConsumptionThreadCount(20)
    .build();
  try {
    for (const [ liteTopic, option ] of [[ 'lite-topic-1' ], [ 'lite-topic-2', OffsetOption.MIN_OFFSET ],
      [ 'lite-topic-3', OffsetOption.ofTailN(100) ]]) {
      try {
        await consumer.subscribeLite(liteTopic, option);
        emit({ subscribed: liteTopic });
      } catch (error) {
        emit({ refused: liteTopic, error: error.message });
      }
    }
  } finally {
    await consumer.close();
  }
}

// SimpleConsumer.cjs: subscribed to the tag 'nodejs-demo', one receive(20), each message acked.
async function simpleConsumerCjs() {
  const simpleConsumer = new SimpleConsumer({ consumerGroup: args.group, endpoints: args.endpoint,
    subscriptions: new Map().set(args.topic, 'nodejs-demo') });
  await receiveAndAck(simpleConsumer);
}

// SimpleConsumer.ts: the singleton's settings, the tag '*', awaitDuration 3 s, one receive(20).
async function simpleConsumerTs() {
  const simpleConsumer = new SimpleConsumer({ ...singleton, consumerGroup: args.group,
    subscriptions: new Map().set(args.topic, '*'), awaitDuration: 3000 });
  await receiveAndAck(simpleConsumer);
}

async function receiveAndAck(simpleConsumer) {
  await simpleConsumer.startup();
  try {
    const messages = await simpleConsumer.receive(20);
    for (const message of messages) await simpleConsumer.ack(message);
    emit({ received: messages.map(viewOf) });
  } finally {
    await simpleConsumer.shutdown();
  }
}

// PushConsumer.ts, PushConsumerFifoMessageExample.ts, PushConsumerFifoAcceleratorExample.ts:
// a PushConsumer with the example's settings (args.settings names which), whose listener works
// on each message (100 ms, or 50 ms for the FIFO ones) and reports it. It runs until stdin closes.
const pushSettings = {
  // PushConsumer.ts: a namespace, placeholder credentials, cache and polling settings.
  push: { namespace: 'yourNamespace', sessionCredentials: { accessKey: 'yourAccessKey', accessSecret: 'yourSecretKey' },
    maxCacheMessageCount: 1024, maxCacheMessageSizeInBytes: 67108864, longPollingTimeout: 30000, requestTimeout: 3000,
    workMs: 100 },
  // PushConsumerFifoMessageExample.ts: the singleton's settings, the FIFO accelerator.
  fifo: { namespace: '', sessionCredentials: undefined, maxCacheMessageCount: 512,
    maxCacheMessageSizeInBytes: 33554432, longPollingTimeout: 30000, requestTimeout: 3000,
    enableFifoConsumeAccelerator: true, workMs: 50 },
  // PushConsumerFifoAcceleratorExample.ts: as the FIFO one, with PushConsumer.ts's namespace and credentials.
  fifoAccelerator: { namespace: 'yourNamespace',
    sessionCredentials: { accessKey: 'yourAccessKey', accessSecret: 'yourSecretKey' }, maxCacheMessageCount: 512,
    maxCacheMessageSizeInBytes: 33554432, longPollingTimeout: 30000, requestTimeout: 3000,
    enableFifoConsumeAccelerator: true, workMs: 50 },
  // PushConsumerQuickStart.ts: an empty namespace and nothing else.
  quickStart: { namespace: '', workMs: 0 },
};

async function pushConsumer() {
  const { workMs, ...settings } = pushSettings[args.settings];
  const consumer = new PushConsumer({
    ...settings,
    endpoints: args.endpoint,
    consumerGroup: args.group,
    subscriptions: new Map([[ args.topic, '*' ]]),
    messageListener: {
      async consume(messageView) {
        emit({ delivered: viewOf(messageView), at: Date.now() });
        await new Promise(resolve => setTimeout(resolve, workMs));
        emit({ done: messageView.messageId, at: Date.now() });
        return ConsumeResult.SUCCESS;
      },
    },
  });
  await consumer.startup();
  emit({ ready: true, clientId: consumer.getClientId(), group: consumer.getConsumerGroup() });
  for await (const _ of readline.createInterface({ input: process.stdin })); // until stdin closes
  await consumer.shutdown();
}

const examples = {
  'producer-cjs': producerCjs, 'producer-ts': producerTs, normal, delay, fifo, priority, transaction,
  'lite-producer': liteProducer, 'lite-push-consumer': litePushConsumer, 'simple-consumer-cjs': simpleConsumerCjs,
  'simple-consumer-ts': simpleConsumerTs, 'push-consumer': pushConsumer,
};

examples[example]().then(() => process.exit(0), error => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});

// A Node.js publisher that knows amqpjobs only from its AsyncAPI document (amqplib, pinned
// in package-lock.json). Run by tests/integration/test_node_publisher.py:
//
//   node wire_publisher.cjs publish  ASYNCAPI.json AMQP_URL JOB  GOOD_ID TENANT BAD_ID
//     publishes job JOB twice, built from the document alone: a good one (payload made from
//     the payload schema, with TENANT) and a malformed one (a required field of the wrong
//     type, no tenant), plus one to a routing key no channel has (mandatory: returned).
//     Prints {"good": {...}, "bad": {...}, "returned": [message ids]}.
//   node wire_publisher.cjs evidence AMQP_URL QUEUE
//     takes every message from QUEUE (basic.get) and prints [{properties, headers}].
'use strict';

const fs = require('fs');
const amqp = require('amqplib');

// zlib's CRC-32 (zlib.crc32 needs Node 20.15+; Debian 12 ships Node 18)
const CRC_TABLE = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});
function crc32(buffer) {
  let crc = 0xffffffff;
  for (const byte of buffer) crc = CRC_TABLE[(crc ^ byte) & 0xff] ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

function resolve(doc, node) {
  while (node && node.$ref) {
    node = node.$ref.replace(/^#\//, '').split('/').reduce((at, part) => at[part], doc);
  }
  return node;
}

// A value for a JSON Schema: required properties only, the first branch of an anyOf.
function sample(doc, schema, name) {
  schema = resolve(doc, schema);
  if (schema.anyOf) return sample(doc, schema.anyOf.find((s) => resolve(doc, s).type !== 'null'), name);
  switch (schema.type) {
    case 'object': {
      const out = {};
      for (const key of schema.required || []) out[key] = sample(doc, schema.properties[key], key);
      return out;
    }
    case 'string': return `node-${name}`;
    case 'integer': return Math.max(schema.minimum ?? 1, (schema.exclusiveMinimum ?? 0) + 1);
    case 'number': return 1.5;
    case 'boolean': return true;
    case 'array': return [];
    default: return null;
  }
}

// What the document says about sending job `job`: the message, and its channels and operations.
function describe(doc, job) {
  const [messageKey, message] = Object.entries(doc.components.messages)
    .find(([, m]) => m.bindings.amqp.messageType === job);
  const targets = Object.entries(doc.operations)
    .filter(([, op]) => op.action === 'send' && op.messages.some((m) => resolve(doc, m) === message))
    .map(([, op]) => ({ channel: resolve(doc, op.channel), operation: op }));
  return { messageKey, message, targets };
}

async function publish(docPath, url, job, goodId, tenant, badId) {
  const doc = JSON.parse(fs.readFileSync(docPath, 'utf8'));
  const { message, targets } = describe(doc, job);
  const headersSchema = resolve(doc, message.headers);
  const props = message['x-amqp-properties'].properties;

  function route(tenantKey, messageId) { // the shard rule of x-amqpjobs-shard, when sharded
    const shardOf = targets[0].channel['x-amqpjobs-shard'];
    if (!shardOf) return targets[0];
    const index = crc32(Buffer.from(tenantKey || messageId, 'utf8')) % shardOf.of;
    return targets.find((t) => t.channel['x-amqpjobs-shard'].index === index);
  }
  function build(messageId, payload, tenantKey) {
    const target = route(tenantKey, messageId);
    const amqpOp = target.operation.bindings.amqp;
    const headers = { 'amqpjobs-attempt': headersSchema.properties['amqpjobs-attempt'].default,
      'amqpjobs-enqueued-at': new Date().toISOString() };
    if (tenantKey) headers['amqpjobs-tenant'] = tenantKey;
    return {
      exchange: target.channel.bindings.amqp.exchange.name,
      routingKey: target.channel.address,
      payload,
      options: {
        contentType: props.content_type.const,
        type: props.type.const,
        messageId,
        timestamp: Math.floor(Date.now() / 1000), // integer seconds: amqplib throws on a float
        deliveryMode: amqpOp.deliveryMode,
        mandatory: amqpOp.mandatory,
        appId: 'node-wire-test',
        headers,
      },
    };
  }

  const good = build(goodId, sample(doc, message.payload, 'payload'), tenant);
  const badPayload = { ...good.payload };
  const field = resolve(doc, message.payload).required[0];
  badPayload[field] = typeof badPayload[field] === 'string' ? 12345 : `not-a-${typeof badPayload[field]}`;
  const bad = build(badId, badPayload, null);
  const stray = build(`${goodId}-stray`, good.payload, tenant);
  stray.routingKey = `${stray.routingKey}.no-such-channel`;

  const connection = await amqp.connect(url);
  const channel = await connection.createConfirmChannel();
  const returned = [];
  channel.on('return', (msg) => returned.push(msg.properties.messageId));
  for (const m of [good, bad, stray]) {
    channel.publish(m.exchange, m.routingKey, Buffer.from(JSON.stringify(m.payload)), m.options);
  }
  await channel.waitForConfirms();
  await connection.close();
  const shown = (m) => ({ exchange: m.exchange, routingKey: m.routingKey, payload: m.payload, options: m.options });
  return { good: shown(good), bad: shown(bad), returned };
}

async function evidence(url, queue) {
  const connection = await amqp.connect(url);
  const channel = await connection.createChannel();
  const out = [];
  for (let msg = await channel.get(queue); msg; msg = await channel.get(queue)) {
    out.push({ properties: { messageId: msg.properties.messageId, type: msg.properties.type,
      timestamp: msg.properties.timestamp }, headers: msg.properties.headers });
    channel.ack(msg);
  }
  await connection.close();
  return out;
}

async function main() {
  const [command, ...args] = process.argv.slice(2);
  const result = command === 'publish' ? await publish(...args) : await evidence(...args);
  process.stdout.write(JSON.stringify(result, (_, v) => (typeof v === 'bigint' ? Number(v) : v)));
}

main().catch((err) => { console.error(err); process.exit(1); });

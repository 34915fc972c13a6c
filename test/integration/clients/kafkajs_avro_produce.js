// Produce Avro records with kafkajs and @kafkajs/confluent-schema-registry
// (its own Avro serializer, avsc, and the Confluent wire format), reporting
// as JSON.
//
// Usage: node kafkajs_avro_produce.js '{"bootstrap": "H:P", "registry": "http://H:P",
//   "topic": "t", "subject": "t-value", "schema": "<avsc JSON text>",
//   "records": [{"key": "k", "value": {...}}, ...]}'
//
// Prints one JSON object: id (the schema id the registry gave), produced
// (keys acknowledged by the broker).
'use strict';

const { Kafka, logLevel } = require('kafkajs');
const { SchemaRegistry, SchemaType } = require('@kafkajs/confluent-schema-registry');

async function main() {
  const cfg = JSON.parse(process.argv[2]);
  const registry = new SchemaRegistry({ host: cfg.registry });
  const { id } = await registry.register({ type: SchemaType.AVRO, schema: cfg.schema }, { subject: cfg.subject });
  const messages = [];
  for (const r of cfg.records) {
    messages.push({ key: r.key, value: await registry.encode(id, r.value) });
  }
  const kafka = new Kafka({ clientId: 'rtproxy-it-kafkajs-avro', brokers: [cfg.bootstrap], logLevel: logLevel.ERROR, retry: { retries: 8 } });
  const producer = kafka.producer();
  await producer.connect();
  await producer.send({ topic: cfg.topic, messages });
  await producer.disconnect();
  console.log(JSON.stringify({ id, produced: messages.map((m) => m.key) }));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});

// Produce gzip-compressed records and group-consume them with kafkajs,
// reporting as JSON.
//
// Usage: node kafkajs_gzip_group.js '{"bootstrap": "H:P", "topic": "t", "group": "g", "n": 50, "timeout": 30}'
//
// Prints one JSON object: produced (values acknowledged), records (what the
// group consumer received), brokers (addresses from describeCluster) and
// coordinator-related committed offsets per partition.
'use strict';

const { Kafka, CompressionTypes, logLevel } = require('kafkajs');

async function main() {
  const cfg = JSON.parse(process.argv[2]);
  const kafka = new Kafka({
    clientId: 'rtproxy-it-kafkajs',
    brokers: [cfg.bootstrap],
    logLevel: logLevel.ERROR,
    retry: { retries: 8 },
  });

  const producer = kafka.producer();
  await producer.connect();
  const messages = [];
  for (let i = 0; i < cfg.n; i++) {
    messages.push({ key: `k-${i}`, value: `gzip-${i}` });
  }
  const acks = await producer.send({
    topic: cfg.topic,
    compression: CompressionTypes.GZIP,
    messages,
  });
  await producer.disconnect();
  const produced = messages.map((m) => m.value);

  const consumer = kafka.consumer({ groupId: cfg.group });
  await consumer.connect();
  await consumer.subscribe({ topic: cfg.topic, fromBeginning: true });
  const records = [];
  const done = new Promise((resolve) => {
    consumer.run({
      eachMessage: async ({ partition, message }) => {
        records.push({
          key: message.key ? message.key.toString() : null,
          value: message.value.toString(),
          partition,
          offset: message.offset,
        });
        if (records.length >= cfg.n) resolve();
      },
    });
  });
  let timer;
  const timeout = new Promise((resolve) => { timer = setTimeout(resolve, cfg.timeout * 1000); });
  await Promise.race([done, timeout]);
  clearTimeout(timer);
  // Let the auto-commit of the last batch happen before leaving.
  await consumer.commitOffsets([]).catch(() => {});
  await consumer.disconnect();

  const admin = kafka.admin();
  await admin.connect();
  const cluster = await admin.describeCluster();
  const brokers = cluster.brokers.map((b) => `${b.host}:${b.port}`).sort();
  const offsets = await admin.fetchOffsets({ groupId: cfg.group, topics: [cfg.topic] });
  const committed = {};
  for (const t of offsets) {
    for (const p of t.partitions) committed[p.partition] = Number(p.offset);
  }
  await admin.disconnect();

  process.stdout.write(JSON.stringify({ produced, acks, records, brokers, committed }) + '\n', () => process.exit(0));
}

main().catch((err) => {
  process.stderr.write(`kafkajs: ${err.stack || err}\n`);
  process.exit(1);
});

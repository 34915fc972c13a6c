// Group-consume a topic (a view) with kafkajs and report every record as
// JSON, headers and null values included.
//
// Usage: node views_kafkajs.js '{"bootstrap": "H:P", "topic": "t", "group": "g", "want": 40, "timeout": 30}'
//
// Consumes from the group's committed offsets (earliest when none), stops
// at `want` records or the timeout, commits what it got and disconnects.
'use strict';

const { Kafka, logLevel } = require('kafkajs');

async function main() {
  const cfg = JSON.parse(process.argv[2]);
  const kafka = new Kafka({
    clientId: 'rtproxy-it-views-kafkajs',
    brokers: [cfg.bootstrap],
    logLevel: logLevel.ERROR,
    retry: { retries: 8 },
  });
  const consumer = kafka.consumer({ groupId: cfg.group, maxWaitTimeInMs: 300 });
  await consumer.connect();
  await consumer.subscribe({ topic: cfg.topic, fromBeginning: true });
  const records = [];
  const done = new Promise((resolve) => {
    consumer.run({
      autoCommit: true,
      eachMessage: async ({ partition, message }) => {
        const headers = Object.entries(message.headers || {}).map(([k, v]) => [k, v == null ? null : v.toString()]);
        records.push({
          partition,
          offset: Number(message.offset),
          key: message.key == null ? null : message.key.toString(),
          value: message.value == null ? null : message.value.toString(),
          headers,
        });
        if (records.length >= cfg.want) resolve();
      },
    });
  });
  let timer;
  const timeout = new Promise((resolve) => { timer = setTimeout(resolve, cfg.timeout * 1000); });
  await Promise.race([done, timeout]);
  clearTimeout(timer);
  await consumer.disconnect(); // commits the resolved offsets
  process.stdout.write(JSON.stringify({ records, errors: [] }) + '\n');
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});

// Group-consume a topic from the beginning with kafkajs, reporting as JSON.
//
// Usage: node kafkajs_consume.js '{"bootstrap": "H:P", "topic": "t", "group": "g", "want": 300, "timeout": 30}'
//
// Prints one JSON object: values (what the consumer received, in arrival
// order) and brokers (addresses from describeCluster).
'use strict';

const { Kafka, logLevel } = require('kafkajs');

async function main() {
  const cfg = JSON.parse(process.argv[2]);
  const kafka = new Kafka({
    clientId: 'rtproxy-it-kafkajs-consume',
    brokers: [cfg.bootstrap],
    logLevel: logLevel.ERROR,
    retry: { retries: 8 },
  });
  const consumer = kafka.consumer({ groupId: cfg.group });
  await consumer.connect();
  await consumer.subscribe({ topic: cfg.topic, fromBeginning: true });
  const values = [];
  const done = new Promise((resolve) => {
    consumer.run({
      eachMessage: async ({ message }) => {
        values.push(message.value.toString());
        if (values.length >= cfg.want) resolve();
      },
    });
  });
  let timer;
  const timeout = new Promise((resolve) => { timer = setTimeout(resolve, cfg.timeout * 1000); });
  await Promise.race([done, timeout]);
  clearTimeout(timer);
  const admin = kafka.admin();
  await admin.connect();
  const cluster = await admin.describeCluster();
  await admin.disconnect();
  await consumer.disconnect();
  const brokers = cluster.brokers.map((b) => `${b.host}:${b.port}`).sort();
  process.stdout.write(JSON.stringify({ values, brokers }) + '\n');
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});

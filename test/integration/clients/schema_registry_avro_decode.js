// Decode Confluent-framed Avro values with @kafkajs/confluent-schema-registry
// (avsc; the schema fetched from the registry by the id in each value),
// reporting as JSON. The values are read from Kafka by the caller: rtproxy
// writes snappy batches, which kafkajs cannot read.
//
// Usage: node schema_registry_avro_decode.js '{"registry": "http://H:P",
//   "records": [{"key": "k", "value": "<base64>"}, ...]}'
//
// Prints one JSON object: records ([{key, value}], value as decoded) and
// errors (values that did not decode).
'use strict';

const { SchemaRegistry } = require('@kafkajs/confluent-schema-registry');

async function main() {
  const cfg = JSON.parse(process.argv[2]);
  const registry = new SchemaRegistry({ host: cfg.registry });
  const records = [];
  const errors = [];
  for (const r of cfg.records) {
    try {
      records.push({ key: r.key, value: await registry.decode(Buffer.from(r.value, 'base64')) });
    } catch (err) {
      errors.push(`${r.key}: ${err}`);
    }
  }
  console.log(JSON.stringify({ records, errors }));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});

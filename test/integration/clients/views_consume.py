"""Group-consume a topic (a view) with kafka-python or confluent-kafka and
report every record as JSON, headers and null values included.

Usage: /usr/bin/python3 views_consume.py kafka-python|confluent '{"bootstrap": "H:P",
        "topic": "t", "group": "g", "want": 40, "timeout": 30}'

Consumes from the group's committed offsets (earliest when none), stops at
`want` records or the timeout, commits synchronously and closes. Prints one
JSON object: records (partition, offset, key, value or null, headers as
[key, value] pairs) and errors.
"""
import json
import sys
import time


def rec(partition, offset, key, value, headers):
    return {
        "partition": partition,
        "offset": offset,
        "key": key.decode() if key is not None else None,
        "value": value.decode() if value is not None else None,
        "headers": [[k, v.decode() if v is not None else None] for k, v in (headers or [])],
    }


def kafka_python(cfg):
    from kafka import KafkaConsumer
    c = KafkaConsumer(cfg["topic"], bootstrap_servers=cfg["bootstrap"], group_id=cfg["group"],
                      auto_offset_reset="earliest", enable_auto_commit=False,
                      client_id="rtproxy-it-views-kafka-python")
    out = []
    deadline = time.time() + cfg["timeout"]
    while len(out) < cfg["want"] and time.time() < deadline:
        for _, msgs in c.poll(timeout_ms=300).items():
            for m in msgs:
                out.append(rec(m.partition, m.offset, m.key, m.value, m.headers))
    c.commit()
    c.close()
    return out, []


def confluent(cfg):
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": cfg["bootstrap"], "group.id": cfg["group"],
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "client.id": "rtproxy-it-views-confluent"})
    c.subscribe([cfg["topic"]])
    out, errs = [], []
    deadline = time.time() + cfg["timeout"]
    while len(out) < cfg["want"] and time.time() < deadline:
        m = c.poll(0.3)
        if m is None:
            continue
        if m.error():
            errs.append(str(m.error()))
            continue
        out.append(rec(m.partition(), m.offset(), m.key(), m.value(), m.headers()))
    if out:
        c.commit(asynchronous=False)
    c.close()
    return out, errs


def main():
    lib, cfg = sys.argv[1], json.loads(sys.argv[2])
    records, errors = (kafka_python if lib == "kafka-python" else confluent)(cfg)
    print(json.dumps({"records": records, "errors": errors}))


if __name__ == "__main__":
    main()

"""Consume a topic to its end with confluent-kafka and report as JSON.

Usage: /usr/bin/python3 confluent_consume.py '{"bootstrap": "H:P", "topic": "t",
        "group": "g", "isolation": "read_committed", "timeout": 30}'

Reads from the beginning until every assigned partition reports end of
partition (enable.partition.eof), so for read_committed the result is
exactly what committed transactions left visible. Prints one JSON object:
values, errors, brokers (addresses from list_topics).
"""
import json
import sys
import time

from confluent_kafka import Consumer, KafkaError


def main():
    cfg = json.loads(sys.argv[1])
    c = Consumer({
        "bootstrap.servers": cfg["bootstrap"],
        "group.id": cfg["group"],
        "isolation.level": cfg["isolation"],
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        "enable.auto.commit": False,
        "client.id": "rtproxy-it-confluent-consumer",
    })
    c.subscribe([cfg["topic"]])
    values, errors = [], []
    partitions = len(c.list_topics(cfg["topic"], timeout=10).topics[cfg["topic"]].partitions)
    at_eof = set()
    deadline = time.time() + cfg["timeout"]
    while len(at_eof) < partitions and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                at_eof.add(m.partition())
            else:
                errors.append(str(m.error()))
            continue
        at_eof.discard(m.partition())
        values.append(m.value().decode())
    if len(at_eof) < partitions:
        errors.append("reached the end of %d of %d partitions before the timeout" % (len(at_eof), partitions))
    md = c.list_topics(timeout=10)
    brokers = sorted("%s:%d" % (b.host, b.port) for b in md.brokers.values())
    c.close()
    print(json.dumps({"values": values, "errors": errors, "brokers": brokers}))


if __name__ == "__main__":
    main()

"""Group-consume with kafka-python (Debian python3-kafka) and report as JSON.

Usage: /usr/bin/python3 kafka_python_group.py '{"bootstrap": "H:P", "topic": "t",
        "group": "g", "want": 100, "timeout": 30}'

Prints one JSON object: records (key, value, partition, offset), the broker
addresses kafka-python learned from cluster metadata, the group coordinator's
address, and committed offsets per partition.
"""
import json
import sys
import time

from kafka import KafkaConsumer, TopicPartition


def main():
    cfg = json.loads(sys.argv[1])
    consumer = KafkaConsumer(
        cfg["topic"],
        bootstrap_servers=cfg["bootstrap"],
        group_id=cfg["group"],
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        client_id="rtproxy-it-kafka-python",
    )
    records = []
    deadline = time.time() + cfg["timeout"]
    while len(records) < cfg["want"] and time.time() < deadline:
        for tp, msgs in consumer.poll(timeout_ms=500).items():
            for m in msgs:
                records.append({
                    "key": m.key.decode() if m.key is not None else None,
                    "value": m.value.decode(),
                    "partition": m.partition,
                    "offset": m.offset,
                })
    consumer.commit()

    cluster = consumer._client.cluster
    brokers = sorted("%s:%d" % (b.host, b.port) for b in cluster.brokers())
    coordinator = None
    coord_id = consumer._coordinator.coordinator_id
    if coord_id is not None:
        b = cluster.broker_metadata(coord_id)
        if b is not None:
            coordinator = "%s:%d" % (b.host, b.port)
    committed = {}
    for p in sorted(consumer.partitions_for_topic(cfg["topic"]) or []):
        off = consumer.committed(TopicPartition(cfg["topic"], p))
        committed[str(p)] = off if off is not None else -1
    consumer.close()
    print(json.dumps({
        "records": records,
        "brokers": brokers,
        "coordinator": coordinator,
        "committed": committed,
    }))


if __name__ == "__main__":
    main()

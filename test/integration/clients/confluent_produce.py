"""Produce with confluent-kafka (Debian python3-confluent-kafka) and report as JSON.

Usage: /usr/bin/python3 confluent_produce.py MODE '{"bootstrap": "H:P", "topic": "t", "n": 50}'

MODE "idempotent": enable.idempotence=true, n records "idem-<i>".
MODE "transactions": one committed transaction of n records "committed-<i>"
and one aborted transaction of n records "aborted-<i>".

Prints one JSON object: delivered (values acknowledged by the broker),
errors (delivery errors as text), brokers (addresses from list_topics).
"""
import json
import sys

from confluent_kafka import KafkaException, Producer


def main():
    mode = sys.argv[1]
    cfg = json.loads(sys.argv[2])
    topic, n = cfg["topic"], cfg["n"]
    conf = {
        "bootstrap.servers": cfg["bootstrap"],
        "linger.ms": 0,
        "client.id": "rtproxy-it-confluent",
        "enable.idempotence": True,
    }
    if mode == "transactions":
        conf["transactional.id"] = cfg.get("txn_id", "rtproxy-it-txn")
    delivered, errors = [], []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))
        else:
            delivered.append(msg.value().decode())

    p = Producer(conf)
    try:
        if mode == "idempotent":
            for i in range(n):
                p.produce(topic, key=b"k-%d" % i, value=b"idem-%d" % i, on_delivery=on_delivery)
                p.poll(0)
            remaining = p.flush(30)
            if remaining:
                errors.append("%d records not delivered after flush" % remaining)
        elif mode == "transactions":
            p.init_transactions(30)
            p.begin_transaction()
            for i in range(n):
                p.produce(topic, key=b"k-%d" % i, value=b"committed-%d" % i, on_delivery=on_delivery)
            p.commit_transaction(30)
            p.begin_transaction()
            for i in range(n):
                p.produce(topic, key=b"k-%d" % i, value=b"aborted-%d" % i, on_delivery=on_delivery)
            p.flush(30)  # make sure the aborted records really reached the log
            p.abort_transaction(30)
        else:
            raise SystemExit("unknown mode %r" % mode)
    except KafkaException as e:
        errors.append(str(e))
    md = p.list_topics(timeout=10)
    brokers = sorted("%s:%d" % (b.host, b.port) for b in md.brokers.values())
    print(json.dumps({"delivered": delivered, "errors": errors, "brokers": brokers}))


if __name__ == "__main__":
    main()

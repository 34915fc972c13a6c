"""Produce values one at a time and report each one's outcome as JSON.

Usage: /usr/bin/python3 guard_produce.py LIB '{"bootstrap": "H:P", "topic": "t", "values": ["a", "b"]}'

LIB "confluent": confluent-kafka (librdkafka) with enable.idempotence=true.
LIB "confluent-txn": confluent-kafka, every value in its own transaction;
a transaction whose record fails is aborted.
LIB "kafka-python": kafka-python (its producer, acks=all).

Each value is sent and waited for before the next, so each is its own
batch. Prints one JSON object: results, one per value in order, each
{"value", "error"} with error "" when the broker acknowledged it, and for
confluent-txn "aborted" (the transaction was aborted), "abort_error" and
"retried_after_purge" (librdkafka purged the value locally after the
previous transaction's abort; it was sent once more).
"""
import json
import sys


def confluent(cfg, txn):
    from confluent_kafka import KafkaException, Producer
    conf = {"bootstrap.servers": cfg["bootstrap"], "linger.ms": 0, "enable.idempotence": True,
            "client.id": "rtproxy-it-guard-confluent"}
    if txn:
        conf["transactional.id"] = cfg.get("txn_id", "rtproxy-it-guard-txn")
    p = Producer(conf)
    if txn:
        p.init_transactions(30)
    results = []
    for v in cfg["values"]:
        res = one(p, cfg["topic"], v, txn, KafkaException)
        if txn and "Purged in queue" in res["error"]:
            # librdkafka 2.0 can purge the first message of the transaction
            # after an aborted one (its abort's purge racing the new
            # transaction); the value is sent again, once, and says so.
            res = one(p, cfg["topic"], v, txn, KafkaException)
            res["retried_after_purge"] = True
        results.append(res)
    return results


def one(p, topic, v, txn, KafkaException):
    res = {"value": v, "error": ""}

    def on_delivery(err, msg):
        if err is not None:
            res["error"] = str(err)
    try:
        if txn:
            p.begin_transaction()
        p.produce(topic, value=v.encode(), on_delivery=on_delivery)
        left = p.flush(30)
        if left:
            res["error"] = "not delivered after 30s"
        if txn:
            if res["error"]:
                res["aborted"] = True
                try:
                    p.abort_transaction(30)
                except KafkaException as e:
                    res["abort_error"] = str(e)
            else:
                p.commit_transaction(30)
    except KafkaException as e:
        res["error"] = res["error"] or str(e)
        if txn:
            res["aborted"] = True
            try:
                p.abort_transaction(30)
            except KafkaException as e2:
                res["abort_error"] = str(e2)
    return res


def kafka_python(cfg):
    from kafka import KafkaProducer
    p = KafkaProducer(bootstrap_servers=cfg["bootstrap"], acks="all", retries=0,
                      client_id="rtproxy-it-guard-kafka-python")
    results = []
    for v in cfg["values"]:
        res = {"value": v, "error": ""}
        try:
            p.send(cfg["topic"], value=v.encode()).get(timeout=30)
        except Exception as e:  # kafka.errors.KafkaError and its kin
            res["error"] = "%s: %s" % (type(e).__name__, e)
        results.append(res)
    p.close()
    return results


def main():
    lib = sys.argv[1]
    cfg = json.loads(sys.argv[2])
    if lib == "confluent":
        results = confluent(cfg, False)
    elif lib == "confluent-txn":
        results = confluent(cfg, True)
    elif lib == "kafka-python":
        results = kafka_python(cfg)
    else:
        raise SystemExit("unknown lib %r" % lib)
    print(json.dumps({"results": results}))


if __name__ == "__main__":
    main()

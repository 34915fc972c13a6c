"""Produce Protobuf records with confluent-kafka's ProtobufSerializer
(Debian python3-confluent-kafka, python3-protobuf, python3-requests) and
report as JSON.

Usage: /usr/bin/python3 confluent_protobuf_produce.py '{"bootstrap": "H:P",
  "registry": "http://H:P", "topic": "t", "descriptor": "<base64 FileDescriptorProto>",
  "message": "pkg.Message", "records": [{"key": "k", "value": {...protobuf JSON...}}]}'

The message class is built from the file descriptor (no protoc needed); its
imports must be well-known types. The serializer registers the schema and
its references itself. Prints one JSON object: produced (keys acknowledged),
errors.
"""
import base64
import json
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2, wrappers_pb2  # noqa: F401 (into the default pool)

from confluent_kafka import SerializingProducer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import StringSerializer


def main():
    cfg = json.loads(sys.argv[1])
    fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(cfg["descriptor"]))
    pool = descriptor_pool.Default()
    pool.Add(fdp)
    desc = pool.FindMessageTypeByName(cfg["message"])
    cls = message_factory.MessageFactory(pool).GetPrototype(desc)

    registry = SchemaRegistryClient({"url": cfg["registry"]})
    producer = SerializingProducer({
        "bootstrap.servers": cfg["bootstrap"],
        "linger.ms": 0,
        "key.serializer": StringSerializer("utf_8"),
        "value.serializer": ProtobufSerializer(cls, registry),
    })
    produced, errors = [], []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))
        else:
            produced.append(msg.key().decode())

    for r in cfg["records"]:
        msg = json_format.Parse(json.dumps(r["value"]), cls())
        producer.produce(cfg["topic"], key=r["key"], value=msg, on_delivery=on_delivery)
        producer.poll(0)
    left = producer.flush(30)
    if left:
        errors.append("%d records not delivered after flush" % left)
    print(json.dumps({"produced": produced, "errors": errors}))


if __name__ == "__main__":
    main()

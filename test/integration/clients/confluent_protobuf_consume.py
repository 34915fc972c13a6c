"""Consume Protobuf records with confluent-kafka's ProtobufDeserializer
(Debian python3-confluent-kafka, python3-protobuf) and report as JSON.

Usage: /usr/bin/python3 confluent_protobuf_consume.py '{"bootstrap": "H:P",
  "topic": "t", "group": "g", "descriptor": "<base64 FileDescriptorProto>",
  "message": "pkg.Message", "n": 4, "timeout": 45}'

Prints one JSON object: records ([{key, value}], value as protobuf JSON with
the .proto field names) once n arrived, and errors.
"""
import base64
import json
import sys
import time

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

from confluent_kafka import DeserializingConsumer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import StringDeserializer


def main():
    cfg = json.loads(sys.argv[1])
    fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(cfg["descriptor"]))
    pool = descriptor_pool.Default()
    pool.Add(fdp)
    cls = message_factory.MessageFactory(pool).GetPrototype(pool.FindMessageTypeByName(cfg["message"]))
    consumer = DeserializingConsumer({
        "bootstrap.servers": cfg["bootstrap"],
        "group.id": cfg["group"],
        "auto.offset.reset": "earliest",
        "key.deserializer": StringDeserializer("utf_8"),
        "value.deserializer": ProtobufDeserializer(cls),
    })
    consumer.subscribe([cfg["topic"]])
    records, errors = [], []
    deadline = time.time() + cfg["timeout"]
    while len(records) + len(errors) < cfg["n"] and time.time() < deadline:
        try:
            msg = consumer.poll(0.5)
        except Exception as e:  # a value the deserializer refused
            errors.append(str(e))
            continue
        if msg is None:
            continue
        if msg.error():
            errors.append(str(msg.error()))
            continue
        records.append({"key": msg.key(), "value": json_format.MessageToDict(
            msg.value(), preserving_proto_field_name=True, including_default_value_fields=True)})
    consumer.close()
    print(json.dumps({"records": records, "errors": errors}))


if __name__ == "__main__":
    main()

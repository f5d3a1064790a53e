#!/usr/bin/env python3
"""Decodes what Sluice published with Confluent's own Python deserializers (PyPI
confluent-kafka: AvroDeserializer, ProtobufDeserializer, JSONDeserializer), asking the
registry for each schema by the id in the message, as any consumer would.

Reads one message per line on stdin: the hex of its key or value bytes (an empty line is a
null). Writes one JSON line per message: {"ok": <decoded value as JSON>} or
{"error": "<what the deserializer raised>"}.

    deserialize.py --registry URL [--auth USER:PASSWORD] --format avro|protobuf|json-schema
                   --topic TOPIC [--field value|key]
"""

import argparse
import json
import sys

from confluent_kafka.schema_registry import SchemaRegistryClient, dual_schema_id_deserializer
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.schema_registry.common.serde import SchemaId
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, json_format, timestamp_pb2
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message_factory import GetMessageClass
import base64


def protobuf_class(client, data, ctx):
    """The message class a consumer's generated code would have for this message: the writer's
    schema fetched by the frame's schema id, the message picked by the frame's message indexes
    (both read by confluent-kafka's own frame reader)."""
    schema_id = SchemaId("PROTOBUF")
    dual_schema_id_deserializer(data, ctx, schema_id)
    schema = client.get_schema(schema_id.id, fmt="serialized")
    fd = descriptor_pb2.FileDescriptorProto()
    fd.ParseFromString(base64.standard_b64decode(schema.schema_str))
    pool = DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fd)
    indexes = schema_id.message_indexes or [0]
    message = fd.message_type[indexes[0]]
    name = message.name
    for i in indexes[1:]:
        message = message.nested_type[i]
        name += "." + message.name
    full = f"{fd.package}.{name}" if fd.package else name
    return GetMessageClass(pool.FindMessageTypeByName(full))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--registry", required=True)
    parser.add_argument("--auth")
    parser.add_argument("--format", required=True, choices=["avro", "protobuf", "json-schema"])
    parser.add_argument("--topic", required=True)
    parser.add_argument("--field", default="value", choices=["value", "key"])
    args = parser.parse_args()

    conf = {"url": args.registry}
    if args.auth:
        conf["basic.auth.user.info"] = args.auth
    client = SchemaRegistryClient(conf)
    if args.format == "avro":
        deserializer = AvroDeserializer(client)
    elif args.format == "protobuf":
        deserializer = None  # per message: ProtobufDeserializer needs the message class
    else:
        deserializer = JSONDeserializer(None, schema_registry_client=client)
    field = MessageField.VALUE if args.field == "value" else MessageField.KEY
    ctx = SerializationContext(args.topic, field)

    for line in sys.stdin:
        line = line.strip()
        data = bytes.fromhex(line) if line else None
        try:
            if args.format == "protobuf" and data is not None:
                message_class = protobuf_class(client, data, ctx)
                decoded = ProtobufDeserializer(message_class, {"use.deprecated.format": False}, client)(data, ctx)
            else:
                decoded = deserializer(data, ctx)
            if args.format == "protobuf" and decoded is not None:
                decoded = {
                    "type": decoded.DESCRIPTOR.full_name,
                    "message": json_format.MessageToDict(
                        decoded, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
                    ),
                }
            print(json.dumps({"ok": decoded}, default=str), flush=True)
        except Exception as e:  # noqa: BLE001 - reported to the test, which decides
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    main()

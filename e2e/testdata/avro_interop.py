"""Avro interop client for keiro-go's e2e tests: confluent-kafka's Avro serializer (librdkafka's
Python binding with its schema registry client) against a Confluent-compatible schema registry.

Run with Debian's /usr/bin/python3 (python3-confluent-kafka, python3-avro and python3-requests are
installed for that interpreter).

  avro_interop.py produce BROKERS TOPIC REGISTRY_URL SCHEMA_FILE
        reads JSON lines {"key": str, "value": {...}} from stdin and produces each value
        Avro-encoded with the schema in SCHEMA_FILE, registered under TOPIC-value (Confluent
        framing); prints the schema id
  avro_interop.py consume BROKERS TOPIC REGISTRY_URL N
        prints N records as JSON lines {"key": str, "value": {...}}, each value decoded with
        the writer schema the registry has for the frame's id
Exits non-zero on any error.
"""
import json
import sys
import uuid

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.avro import CachedSchemaRegistryClient, loads
from confluent_kafka.avro.serializer.message_serializer import MessageSerializer

# Keys are plain UTF-8 strings; values go through confluent-kafka's Avro serializer (the one its
# AvroProducer and AvroConsumer use, which would make the keys Avro too).


def produce(brokers, topic, registry, schema_file):
    with open(schema_file) as f:
        value_schema = loads(f.read())
    client = CachedSchemaRegistryClient({"url": registry})
    ser = MessageSerializer(client)
    p = Producer({"bootstrap.servers": brokers})
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        rec = json.loads(line)
        value = ser.encode_record_with_schema(topic, value_schema, rec["value"])
        p.produce(topic, value=value, key=rec["key"].encode("utf-8"))
    if p.flush(30) != 0:
        raise SystemExit("records left unflushed")
    print(client.get_latest_schema(topic + "-value")[0], flush=True)


def consume(brokers, topic, registry, n):
    ser = MessageSerializer(CachedSchemaRegistryClient({"url": registry}))
    c = Consumer({
        "bootstrap.servers": brokers,
        "group.id": "avro-interop-" + uuid.uuid4().hex,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    c.subscribe([topic])
    got = 0
    misses = 0
    try:
        while got < n:
            m = c.poll(1.0)
            if m is None:
                misses += 1
                if misses > 60:
                    raise SystemExit("timed out after %d of %d records" % (got, n))
                continue
            if m.error():
                raise KafkaException(m.error())
            value = ser.decode_message(m.value())
            print(json.dumps({"key": m.key().decode("utf-8"), "value": value}), flush=True)
            got += 1
    finally:
        c.close()


def main(argv):
    if len(argv) == 5 and argv[0] == "produce":
        produce(argv[1], argv[2], argv[3], argv[4])
    elif len(argv) == 5 and argv[0] == "consume":
        consume(argv[1], argv[2], argv[3], int(argv[4]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])

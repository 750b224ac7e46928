"""Kafka interop client for keiro-go's e2e tests, on librdkafka's Python binding.

Run with Debian's /usr/bin/python3 (python3-confluent-kafka is installed for that interpreter).

  interop.py consume BROKERS TOPIC N   prints N records as JSON lines:
                                       {"key", "value", "headers": [[name, value], ...], "partition", "offset"}
  interop.py consume-committed BROKERS TOPIC
                                       prints every record a read_committed reader sees, from the
                                       start of each partition up to its high watermark as it
                                       stands when the command starts (same JSON lines)
  interop.py produce BROKERS TOPIC     reads JSON lines {"key", "value", "headers": [[name, value], ...]}
                                       from stdin and produces them, then flushes
Strings are UTF-8; exits non-zero on any error.
"""
import json
import sys
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition


def consume(brokers, topic, n):
    c = Consumer({
        "bootstrap.servers": brokers,
        "group.id": "interop-" + uuid.uuid4().hex,
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
            hdrs = [[k, v.decode("utf-8") if v is not None else None] for k, v in (m.headers() or [])]
            print(json.dumps({
                "key": m.key().decode("utf-8") if m.key() is not None else None,
                "value": m.value().decode("utf-8") if m.value() is not None else None,
                "headers": hdrs,
                "partition": m.partition(),
                "offset": m.offset(),
            }), flush=True)
            got += 1
    finally:
        c.close()


def record_json(m):
    hdrs = [[k, v.decode("utf-8") if v is not None else None] for k, v in (m.headers() or [])]
    return json.dumps({
        "key": m.key().decode("utf-8") if m.key() is not None else None,
        "value": m.value().decode("utf-8") if m.value() is not None else None,
        "headers": hdrs,
        "partition": m.partition(),
        "offset": m.offset(),
    })


def consume_committed(brokers, topic):
    c = Consumer({
        "bootstrap.servers": brokers,
        "group.id": "interop-" + uuid.uuid4().hex,
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
    })
    try:
        md = c.list_topics(topic, timeout=30)
        if md.topics[topic].error is not None:
            raise KafkaException(md.topics[topic].error)
        parts = sorted(md.topics[topic].partitions)
        highs = {}
        for p in parts:
            _, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            highs[p] = hi
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        # A partition is done once the reader's position reached its high watermark: the
        # commit and abort markers occupy offsets, so the last data record's offset may be
        # below it; the end-of-partition event tells where the reader stands.
        pending = set(p for p in parts if highs[p] > 0)
        idle = 0
        while pending:
            m = c.poll(1.0)
            if m is None:
                idle += 1
                if idle > 60:
                    raise SystemExit("timed out; partitions not read to their high watermark: %s" %
                                     sorted((p, highs[p]) for p in pending))
                continue
            idle = 0
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    if m.offset() >= highs[m.partition()]:
                        pending.discard(m.partition())
                    continue
                raise KafkaException(m.error())
            print(record_json(m), flush=True)
    finally:
        c.close()


def produce(brokers, topic):
    p = Producer({"bootstrap.servers": brokers, "acks": "all", "enable.idempotence": True})
    errors = []

    def report(err, _msg):
        if err is not None:
            errors.append(str(err))

    for line in sys.stdin:
        if not line.strip():
            continue
        r = json.loads(line)
        p.produce(topic, key=r["key"].encode("utf-8"), value=r["value"].encode("utf-8"),
                  headers=[(k, v.encode("utf-8")) for k, v in r["headers"]], on_delivery=report)
    left = p.flush(30)
    if left or errors:
        raise SystemExit("produce failed: %d undelivered, errors %s" % (left, errors))


if __name__ == "__main__":
    if sys.argv[1] == "consume":
        consume(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "consume-committed":
        consume_committed(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "produce":
        produce(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("usage: interop.py consume|consume-committed|produce ...")

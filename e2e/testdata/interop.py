"""Kafka interop client for keiro-go's e2e tests, on librdkafka's Python binding.

Run with Debian's /usr/bin/python3 (python3-confluent-kafka is installed for that interpreter).

  interop.py consume BROKERS TOPIC N   prints N records as JSON lines:
                                       {"key", "value", "headers": [[name, value], ...], "partition", "offset"}
  interop.py produce BROKERS TOPIC     reads JSON lines {"key", "value", "headers": [[name, value], ...]}
                                       from stdin and produces them, then flushes
Strings are UTF-8; exits non-zero on any error.
"""
import json
import sys
import uuid

from confluent_kafka import Consumer, KafkaException, Producer


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
    elif sys.argv[1] == "produce":
        produce(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("usage: interop.py consume|produce ...")

#!/usr/bin/python3
"""A service written in Python writing keiro's outbox: keiro.enqueue(...) with psycopg2.

Each order is written in its own transaction, next to the service's own writes, with one call
to the outbox's SQL function <schema>.enqueue. The relay publishes the rows to Kafka in commit
order per (source, message_key); nothing here takes a lock or counts a sequence: the database
orders every writer.

    DATABASE_URL=postgresql://keiro:keiro@127.0.0.1:15432/keiro /usr/bin/python3 producer.py

Environment: DATABASE_URL (libpq URL or DSN), KEIRO_SCHEMA (default keiro), N (orders,
default 10), RUN_ID (message id prefix, default random), TOPIC (default billing.orders.v1).
Prints one JSON object per line: each order's outcome, then a retry of the first order (a
duplicate: the same message id with the same content), then a changed copy of it (an identity
conflict, rolled back). Needs Debian's python3-psycopg2.
"""

import datetime
import json
import os
import re
import sys
import uuid

import psycopg2
import psycopg2.errors


def main():
    dsn = os.environ.get("DATABASE_URL", "postgresql://keiro:keiro@127.0.0.1:15432/keiro")
    schema = os.environ.get("KEIRO_SCHEMA", "keiro")
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", schema):
        sys.exit(f"KEIRO_SCHEMA {schema!r} is not a lowercase SQL identifier")
    n = int(os.environ.get("N", "10"))
    run = os.environ.get("RUN_ID") or uuid.uuid4().hex[:8]
    topic = os.environ.get("TOPIC", "billing.orders.v1")

    # Named arguments: the optional ones (causation, trace context, schema reference, ...) keep
    # their defaults. The schema name was validated above, so it can be part of the text.
    enqueue = f"""
        SELECT outbox_id, outcome FROM {schema}.enqueue(
            source      => %(source)s,
            message_id  => %(message_id)s,
            destination => %(destination)s,
            event_type  => %(event_type)s,
            payload     => %(payload)s,
            occurred_at => %(occurred_at)s,
            message_key => %(key)s,
            attributes  => %(attributes)s::jsonb)"""

    def order_event(i, quantity):
        customer = f"customer-{i % 3}"
        return {
            "source": "ordering",
            "message_id": f"order-{run}-{i}",
            "destination": topic,
            "event_type": "OrderSubmitted",
            "payload": json.dumps({"orderId": f"order-{run}-{i}", "customer": customer,
                                   "quantity": quantity}).encode(),
            "occurred_at": datetime.datetime(2026, 12, 1, 12, 0, i % 60, tzinfo=datetime.timezone.utc),
            "key": customer,
            "attributes": json.dumps({"lang": "python"}),
        }

    def report(**fields):
        print(json.dumps(fields), flush=True)

    conn = psycopg2.connect(dsn)
    try:
        for i in range(n):
            ev = order_event(i, 1 + i % 5)
            with conn:  # one transaction: commit on success, roll back on error
                with conn.cursor() as cur:
                    # ... the service's own writes for the order go here, in the same transaction.
                    cur.execute(enqueue, ev)
                    outbox_id, outcome = cur.fetchone()
            report(message_id=ev["message_id"], outbox_id=str(outbox_id), outcome=outcome)

        # A retry of an order already enqueued (say, after a lost reply): a duplicate, no new row.
        ev = order_event(0, 1)
        with conn:
            with conn.cursor() as cur:
                cur.execute(enqueue, ev)
                outbox_id, outcome = cur.fetchone()
        report(message_id=ev["message_id"], outbox_id=str(outbox_id), outcome=outcome)

        # The same message id with other content is a bug in the producer: the call raises
        # unique_violation naming the differing fields, and the transaction is rolled back.
        ev = order_event(0, 99)
        try:
            with conn:
                with conn.cursor() as cur:
                    cur.execute(enqueue, ev)
        except psycopg2.errors.UniqueViolation as e:
            report(message_id=ev["message_id"], outcome="conflict", detail=e.diag.message_detail)
    finally:
        conn.close()


if __name__ == "__main__":
    main()

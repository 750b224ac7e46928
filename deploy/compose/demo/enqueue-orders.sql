-- Demo producer: enqueues :n OrderSubmitted events into keiro's outbox in ONE transaction, the
-- way a service written in any language does next to its business writes. The relay publishes
-- them to billing.orders.v1; the consumer records each once in billing.orders_received.
--   docker compose --profile demo run --rm demo-orders            # 100 orders
--   docker compose --profile demo run --rm -e N=5000 demo-orders
-- Keys cycle over 10 customers, so per-key ordering is visible in the consumer's table.
\set ON_ERROR_STOP on
BEGIN;
INSERT INTO keiro.keiro_outbox
    (outbox_id, message_id, source, destination, message_key, event_type, schema_version,
     content_type, payload_bytes, attributes, occurred_at)
SELECT gen_random_uuid(),
       'order-' || gen_random_uuid(),
       'ordering',
       'billing.orders.v1',
       'customer-' || (i % 10),
       'OrderSubmitted',
       1,
       'application/json',
       convert_to(jsonb_build_object('orderId', 'order-' || i, 'customer', 'customer-' || (i % 10),
                                     'quantity', 1 + i % 5)::text, 'UTF8'),
       jsonb_build_object('demo', true),
       clock_timestamp()
FROM generate_series(1, :n) AS i;
-- Wake the relay at commit (it also polls, so this is only a latency optimisation).
SELECT pg_notify('keiro.keiro_outbox', '');
COMMIT;
SELECT count(*) AS pending FROM keiro.keiro_outbox WHERE status = 'pending';

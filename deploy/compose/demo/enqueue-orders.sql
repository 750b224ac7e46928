-- Demo producer: enqueues :n OrderSubmitted events into keiro's outbox in ONE transaction, the
-- way a service written in any language does next to its business writes: through
-- keiro.enqueue(...), the outbox's SQL API (docs/compose.md). The relay publishes them to
-- billing.orders.v1; the consumer records each once in billing.orders_received.
--   docker compose --profile demo run --rm demo-orders            # 100 orders
--   docker compose --profile demo run --rm -e N=5000 demo-orders
-- Keys cycle over 10 customers, so per-key ordering is visible in the consumer's table. The
-- outbox orders each customer's rows by commit, whoever writes them (a plain INSERT into
-- keiro.keiro_outbox is ordered the same way); keiro.enqueue adds validation, the
-- duplicate/conflict answer and a wake-up of a sleeping relay at commit.
\set ON_ERROR_STOP on
BEGIN;
SELECT e.outcome, count(*)
FROM generate_series(1, :n) AS i
CROSS JOIN LATERAL keiro.enqueue(
    source       => 'ordering',
    message_id   => 'order-' || gen_random_uuid(),
    destination  => 'billing.orders.v1',
    event_type   => 'OrderSubmitted',
    payload      => convert_to(jsonb_build_object('orderId', 'order-' || i, 'customer', 'customer-' || (i % 10),
                                                  'quantity', 1 + i % 5)::text, 'UTF8'),
    occurred_at  => clock_timestamp(),
    message_key  => 'customer-' || (i % 10),
    content_type => 'application/json',
    schema_version => 1,
    attributes   => jsonb_build_object('demo', true)) AS e
GROUP BY e.outcome;
COMMIT;
SELECT count(*) AS pending FROM keiro.keiro_outbox WHERE status = 'pending';

-- Demo effects for the compose consumer (KEIRO_CONSUMER_HANDLER=sql,
-- KEIRO_CONSUMER_SQL_FUNCTION=billing.apply_order_event). The consumer calls the function as
-- SELECT billing.apply_order_event($1::jsonb) inside the inbox transaction, so its writes commit
-- exactly once per message. The argument is the handler document (inbox/handlers.Document):
-- message_id, source, destination, key, event_type, schema_version, content_type, occurred_at,
-- source_event_id, causation_id, correlation_id, attributes, payload.
-- Runs once, when the postgres volume is first initialised. keiro's own tables are created by
-- the relay and consumer (KEIRO_*_MIGRATE=true).
CREATE SCHEMA IF NOT EXISTS billing;

CREATE TABLE IF NOT EXISTS billing.orders_received (
    message_id  text        PRIMARY KEY,
    order_key   text,
    event_type  text        NOT NULL,
    payload     jsonb       NOT NULL,
    occurred_at timestamptz NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION billing.apply_order_event(doc jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(doc->>'event_type', '') = '' THEN
        -- Poison: the same input always fails, so the consumer dead-letters it at once.
        RAISE EXCEPTION 'event without event_type: %', doc->>'message_id' USING ERRCODE = 'KP001';
    END IF;
    -- A plain INSERT (no ON CONFLICT): the inbox already guarantees one call per message, and a
    -- second call would show up as a unique violation instead of being hidden.
    INSERT INTO billing.orders_received (message_id, order_key, event_type, payload, occurred_at)
    VALUES (doc->>'message_id', doc->>'key', doc->>'event_type', coalesce(doc->'payload', 'null'::jsonb),
            (doc->>'occurred_at')::timestamptz);
END;
$$;

-- The inbox: one row per (consumer, source, dedupe_key), written in the same transaction as the
-- handler's effects. Status: completed | failed. Primary key includes the consumer, so two
-- bounded contexts sharing a database never collide.
--
-- A failed row keeps the full envelope (including the Kafka key in message_key) so that an
-- operator can re-run it with inbox.(*Store).Reprocess after its offset was committed.
-- poisoned marks a failed row that must not run again on redelivery (attempt ceiling reached or
-- a permanent handler error); the runner dead-letters such deliveries.
CREATE TABLE {{.schema}}.keiro_inbox (
    consumer               text        NOT NULL,
    source                 text        NOT NULL,
    dedupe_key             text        NOT NULL,
    message_id             text,
    message_key            text,
    source_event_id        uuid,
    source_global_position bigint,
    destination            text,
    event_type             text,
    schema_version         bigint,
    content_type           text        NOT NULL,
    schema_registry        text,
    schema_subject         text,
    schema_version_ref     bigint,
    schema_id              bigint,
    schema_fingerprint     text,
    causation_id           uuid,
    correlation_id         uuid,
    traceparent            text,
    tracestate             text,
    kafka_topic            text,
    kafka_partition        integer,
    kafka_offset           bigint,
    payload_bytes          bytea       NOT NULL,
    attributes             jsonb,
    occurred_at            timestamptz,
    received_at            timestamptz NOT NULL DEFAULT now(),
    status                 text        NOT NULL
        CHECK (status IN ('completed', 'failed')),
    attempt_count          integer     NOT NULL DEFAULT 0,
    poisoned               boolean     NOT NULL DEFAULT false,
    completed_at           timestamptz,
    failed_at              timestamptz,
    last_error             text,
    PRIMARY KEY (consumer, source, dedupe_key)
);

CREATE INDEX keiro_inbox_failed_idx ON {{.schema}}.keiro_inbox (consumer, failed_at)
    WHERE status = 'failed';

CREATE INDEX keiro_inbox_completed_idx ON {{.schema}}.keiro_inbox (consumer, completed_at)
    WHERE status = 'completed';

-- Log mode's outbox (docs/architecture.md, "Log mode"): an insert-only table that the relay
-- reads through a logical replication slot (a publication of its inserts, pgoutput) instead of
-- claiming and marking rows. It holds the event's envelope only, the columns of keiro_outbox's
-- event: no status, no claim token, no lease, no ordering trigger; a row is written once, at
-- enqueue, and never updated by the relay. The publication order is the transactions' commit
-- order, so no ordering column is drawn either.
--
-- The table stays the source of truth: a slot that is lost or invalidated can be recreated and
-- the rows it had not confirmed found again here. The unique index keeps enqueue idempotent on
-- (source, message id), as in keiro_outbox; it is the only index. The relay creates the
-- publication and the slot when it starts in log mode (they are database objects, not schema
-- objects, and need the REPLICATION privilege), not this migration.
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_outbox_log (
    message_id             text        NOT NULL,
    source                 text        NOT NULL,
    destination            text        NOT NULL,
    message_key            text,
    event_type             text        NOT NULL,
    schema_version         bigint      NOT NULL,
    content_type           text        NOT NULL,
    schema_registry        text,
    schema_subject         text,
    schema_version_ref     bigint,
    schema_id              bigint,
    schema_fingerprint     text,
    source_event_id        uuid,
    source_global_position bigint,
    causation_id           uuid,
    correlation_id         uuid,
    traceparent            text,
    tracestate             text,
    payload_bytes          bytea       NOT NULL,
    attributes             jsonb,
    occurred_at            timestamptz NOT NULL
);

CREATE UNIQUE INDEX IF NOT EXISTS keiro_outbox_log_identity_idx
    ON {{.schema}}.keiro_outbox_log (source, message_id);

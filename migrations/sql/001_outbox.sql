-- The outbox: integration events written in the producer's transaction, published by the relay.
-- Status machine (docs/architecture.md): pending -> publishing -> sent | failed | dead | rejected,
-- failed -> publishing (retry). Terminal: sent, dead, rejected.
CREATE TABLE {{.schema}}.keiro_outbox (
    seq                    bigint GENERATED ALWAYS AS IDENTITY,
    outbox_id              uuid        NOT NULL PRIMARY KEY,
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
    occurred_at            timestamptz NOT NULL,
    status                 text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'publishing', 'sent', 'failed', 'dead', 'rejected')),
    attempt_count          integer     NOT NULL DEFAULT 0,
    next_attempt_at        timestamptz NOT NULL DEFAULT now(),
    claim_token            uuid,
    lease_until            timestamptz,
    last_error             text,
    published_at           timestamptz,
    kafka_partition        integer,
    kafka_offset           bigint,
    rejected_at            timestamptz,
    rejection_code         text,
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now(),
    -- phase is what the partial indexes are built on: 0 = open (pending, failed, publishing),
    -- 1 = sent, 2 = dead or rejected. A claim (pending/failed -> publishing) and a retry
    -- (publishing -> failed) change status but not phase, so they change no indexed column and
    -- are HOT updates (no index entry written) when the page has room: see fillfactor below.
    phase                  smallint GENERATED ALWAYS AS (
        CASE status WHEN 'sent' THEN 1 WHEN 'dead' THEN 2 WHEN 'rejected' THEN 2 ELSE 0 END) STORED,
    CONSTRAINT keiro_outbox_source_message_id_key UNIQUE (source, message_id),
    -- seq is unique by construction (identity, never supplied); no unique index, because
    -- every move to or from a terminal status is a non-HOT update that inserts into every index.
    -- keiro §1.4 item 2: a rejected row carries when and why; the code is a lowercase token.
    CONSTRAINT keiro_outbox_rejection_check CHECK (
        (status = 'rejected') = (rejected_at IS NOT NULL AND rejection_code IS NOT NULL)),
    CONSTRAINT keiro_outbox_rejection_code_check CHECK (
        rejection_code IS NULL OR rejection_code ~ '^[a-z][a-z0-9._-]{0,63}$')
)
-- Free space on every page for the claim's new row versions, so claims stay HOT.
WITH (fillfactor = 50);

-- Claimable rows only: stays small however many sent rows are retained.
CREATE INDEX keiro_outbox_claim_idx ON {{.schema}}.keiro_outbox (seq) WHERE phase = 0;

-- Head-of-line checks: earlier non-terminal rows of the same (source, key).
CREATE INDEX keiro_outbox_head_of_line_idx ON {{.schema}}.keiro_outbox (source, message_key, seq)
    WHERE phase = 0;

-- Retention of sent rows.
CREATE INDEX keiro_outbox_sent_gc_idx ON {{.schema}}.keiro_outbox (published_at) WHERE phase = 1;

-- Operator listing of dead and rejected rows.
CREATE INDEX keiro_outbox_dead_idx ON {{.schema}}.keiro_outbox (seq) WHERE phase = 2;

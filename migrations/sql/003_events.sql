-- The event store: streams with versions, events with a global position, subscription
-- checkpoints and advisory snapshots. See docs/architecture.md, "Event store".

-- One row per stream; version is the number of events in the stream. Every append updates (or
-- inserts) this row first, which serialises appends per stream, implements the expected-version
-- check and assigns the transaction id before any global position is drawn (the gap guard
-- relies on that order).
CREATE TABLE {{.schema}}.keiro_streams (
    stream_name text        NOT NULL PRIMARY KEY,
    category    text        NOT NULL,
    version     bigint      NOT NULL CHECK (version >= 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The log. global_position comes from an identity sequence (cache 1, so values are increasing
-- in the order they are drawn); tx_id is the writing transaction's xid8.
CREATE TABLE {{.schema}}.keiro_events (
    global_position bigint      GENERATED ALWAYS AS IDENTITY (CACHE 1) PRIMARY KEY,
    event_id        uuid        NOT NULL,
    stream_name     text        NOT NULL,
    category        text        NOT NULL,
    stream_version  bigint      NOT NULL CHECK (stream_version >= 1),
    event_type      text        NOT NULL,
    schema_version  integer     NOT NULL,
    data            jsonb       NOT NULL,
    metadata        jsonb,
    correlation_id  uuid,
    causation_id    uuid,
    traceparent     text,
    tracestate      text,
    tx_id           xid8        NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT keiro_events_event_id_key UNIQUE (event_id),
    CONSTRAINT keiro_events_stream_version_key UNIQUE (stream_name, stream_version)
);

-- Category reads and category subscriptions.
CREATE INDEX keiro_events_category_idx ON {{.schema}}.keiro_events (category, global_position);

-- Subscription checkpoints: the last global position whose effects are committed.
CREATE TABLE {{.schema}}.keiro_subscriptions (
    name       text        NOT NULL PRIMARY KEY,
    position   bigint      NOT NULL DEFAULT 0 CHECK (position >= 0),
    rebuilt_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Advisory snapshots of command-runner state, one row per stream. Never required for
-- correctness: a missing or undecodable row means a full replay.
CREATE TABLE {{.schema}}.keiro_snapshots (
    stream_name    text        NOT NULL PRIMARY KEY,
    stream_version bigint      NOT NULL,
    state_version  integer     NOT NULL,
    state          jsonb       NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

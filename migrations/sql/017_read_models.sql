-- Read models (keiro's Keiro.ReadModel family; docs/architecture.md "Read models"): the registry
-- of queryable projections with their schema identity and lifecycle status, and the dedup keys
-- of asynchronous projection applications. Idempotent: every statement can run twice.

-- One row per read model. version and shape_hash are the schema identity the model was built
-- with: a query whose definition disagrees is refused (stale schema) until the model is rebuilt.
-- status is live, rebuilding, paused or abandoned; it has no CHECK on purpose, so that a status
-- written by a newer version or by hand is read back and reported with its raw text rather than
-- failing the read. last_built_at is set only by a transition to live.
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_read_models (
    name          text        NOT NULL PRIMARY KEY,
    version       bigint      NOT NULL,
    shape_hash    text        NOT NULL,
    status        text        NOT NULL DEFAULT 'live',
    last_built_at timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- The events an asynchronous projection applied, keyed by its idempotency key (the event id by
-- default), written in the application's transaction: a redelivered event is recognised and not
-- applied twice. Rows older than the redelivery window may be pruned (applied_at index); a
-- rebuild deletes its projections' rows.
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_projection_dedup (
    projection_name text        NOT NULL,
    event_id        uuid        NOT NULL,
    applied_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection_name, event_id)
);

CREATE INDEX IF NOT EXISTS keiro_projection_dedup_applied_at_idx
    ON {{.schema}}.keiro_projection_dedup (applied_at);

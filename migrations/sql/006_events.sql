-- Event store additions: subscription dead letters and the integration producer's mark.
-- See docs/architecture.md, "Event store". Idempotent: every statement can run twice.

-- Events a subscription's handler failed on MaxDeliveries times (or rejected as permanent),
-- which the subscription then moved past. One row per (subscription, event). status: dead
-- (parked), replay (an operator asked the running subscription to deliver it again), replayed
-- (delivered successfully by a replay). Rows are never deleted by keiro.
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_subscription_dead_letters (
    dead_letter_id    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subscription_name text        NOT NULL,
    global_position   bigint      NOT NULL,
    event_id          uuid        NOT NULL,
    stream_name       text        NOT NULL,
    stream_version    bigint      NOT NULL,
    event_type        text        NOT NULL,
    error_class       text        NOT NULL,
    error_text        text        NOT NULL,
    attempts          integer     NOT NULL CHECK (attempts >= 1),
    status            text        NOT NULL DEFAULT 'dead' CHECK (status IN ('dead', 'replay', 'replayed')),
    dead_lettered_at  timestamptz NOT NULL DEFAULT now(),
    replay_requested_at timestamptz,
    replayed_at       timestamptz,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT keiro_subscription_dead_letters_event_key UNIQUE (subscription_name, event_id)
);

-- Operator listing, newest first, per subscription.
CREATE INDEX IF NOT EXISTS keiro_subscription_dead_letters_list_idx
    ON {{.schema}}.keiro_subscription_dead_letters (subscription_name, dead_letter_id);

-- The running subscription's check for requested replays (part of every poll): stays tiny.
CREATE INDEX IF NOT EXISTS keiro_subscription_dead_letters_replay_idx
    ON {{.schema}}.keiro_subscription_dead_letters (subscription_name, dead_letter_id)
    WHERE status = 'replay';

-- The integration producer's mark: the highest global position whose integration events are
-- committed to the outbox. A replay (Rebuild, checkpoint rewind) below it enqueues nothing
-- unless the producer is told to republish, so history is not published again after the
-- outbox's retention deleted the rows that made replays recognisable duplicates.
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_producer_marks (
    producer_name text        NOT NULL PRIMARY KEY,
    position      bigint      NOT NULL CHECK (position >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

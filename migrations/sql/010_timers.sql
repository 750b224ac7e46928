-- Consumer-side dispatch: routers' and process managers' dead letters, and durable timers.
-- See docs/process-managers.md. Idempotent: every statement can run twice.

-- Commands a router or process manager gave up on under RejectedDeadLetter (keiro's
-- keiro_dead_letters): the target refused the command, so the input was acknowledged and the
-- command parked here. One row per (dispatcher, source event, emit index): a redelivered input
-- records nothing new. emit_index is the command's position in the dispatch (-1: a process
-- manager's own event). source_global_position is set when the input came from the event
-- store. Rows are never deleted by keiro.
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_dispatch_dead_letters (
    dead_letter_id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dispatcher_kind        text        NOT NULL CHECK (dispatcher_kind IN ('process-manager', 'router')),
    dispatcher_name        text        NOT NULL,
    correlation_id         text        NOT NULL,
    source_event_id        uuid        NOT NULL,
    source_global_position bigint,
    emit_index             integer     NOT NULL CHECK (emit_index >= -1),
    target_stream_name     text        NOT NULL,
    command_id             uuid        NOT NULL,
    error_class            text        NOT NULL,
    error_detail           text        NOT NULL,
    created_at             timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT keiro_dispatch_dead_letters_source_key UNIQUE (dispatcher_name, source_event_id, emit_index)
);

-- Operator listing, newest first, per dispatcher.
CREATE INDEX IF NOT EXISTS keiro_dispatch_dead_letters_list_idx
    ON {{.schema}}.keiro_dispatch_dead_letters (dispatcher_name, created_at DESC, dead_letter_id DESC);

-- Durable timers (keiro's keiro_timers). status: scheduled -> firing (a worker claimed it and
-- counted the attempt) -> fired (its effect committed, fired_event_id set) | cancelled | dead
-- (past the attempt ceiling); firing -> scheduled when a worker left it stale (requeue, fire_at
-- kept). fired, cancelled and dead are terminal: nothing moves a timer out of them. timer_id is
-- the caller's (deterministic ids make scheduling idempotent).
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_timers (
    timer_id             uuid        PRIMARY KEY,
    process_manager_name text        NOT NULL,
    correlation_id       text        NOT NULL,
    fire_at              timestamptz NOT NULL,
    payload              jsonb       NOT NULL DEFAULT 'null',
    status               text        NOT NULL DEFAULT 'scheduled'
        CHECK (status IN ('scheduled', 'firing', 'fired', 'cancelled', 'dead')),
    attempts             bigint      NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    fired_event_id       uuid,
    last_error           text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);

-- The claim (earliest due scheduled timer), the stale requeue and the gauges read only live
-- timers: the index stays as small as the backlog.
CREATE INDEX IF NOT EXISTS keiro_timers_due_idx
    ON {{.schema}}.keiro_timers (status, fire_at, process_manager_name)
    WHERE status IN ('scheduled', 'firing');

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

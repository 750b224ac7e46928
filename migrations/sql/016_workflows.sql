-- Durable workflows (keiro's Keiro.Workflow family). See docs/workflows.md. Idempotent: every
-- statement can run twice.

-- One row per workflow instance (keiro's keiro_workflows). status: pending (started, never run)
-- -> running (a worker holds its lease, or held it and crashed: the lease expires) -> suspended
-- (parked on an await, a sleep, an awakeable or a child) -> running ... -> completed | failed |
-- cancelled, which are terminal: nothing moves an instance out of them. generation is bumped by
-- continue-as-new. wake_after is when the instance is next runnable (NULL: only a wake source
-- makes it runnable again); wakes counts the wake sources, so a run that suspends after a wake
-- it did not see keeps the instance runnable.
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_workflows (
    workflow_name text        NOT NULL,
    workflow_id   text        NOT NULL,
    generation    integer     NOT NULL DEFAULT 0 CHECK (generation >= 0),
    status        text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'running', 'suspended', 'completed', 'failed', 'cancelled')),
    input         jsonb       NOT NULL DEFAULT 'null',
    result        jsonb,
    last_error    text,
    attempts      integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    wake_after    timestamptz,
    wakes         bigint      NOT NULL DEFAULT 0,
    lease_owner   text,
    lease_until   timestamptz,
    parent_name   text,
    parent_id     text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    completed_at  timestamptz,
    PRIMARY KEY (workflow_name, workflow_id),
    CONSTRAINT keiro_workflows_parent_check CHECK ((parent_name IS NULL) = (parent_id IS NULL))
);

-- The worker's claim reads only live, scheduled instances: the index stays as small as the
-- runnable backlog however many finished instances are retained.
CREATE INDEX IF NOT EXISTS keiro_workflows_runnable_idx
    ON {{.schema}}.keiro_workflows (wake_after)
    WHERE status IN ('pending', 'running', 'suspended') AND wake_after IS NOT NULL;

-- Children of an instance (cancellation propagation, GC).
CREATE INDEX IF NOT EXISTS keiro_workflows_parent_idx
    ON {{.schema}}.keiro_workflows (parent_name, parent_id)
    WHERE parent_id IS NOT NULL;

-- GC of finished instances, oldest first.
CREATE INDEX IF NOT EXISTS keiro_workflows_finished_idx
    ON {{.schema}}.keiro_workflows (completed_at)
    WHERE status IN ('completed', 'failed', 'cancelled');

-- The journal (keiro's journal stream and its keiro_workflow_steps index, in one table): one row
-- per recorded step of an instance's generation. The primary key makes every write of a step
-- insert-first: two writers of one step agree on the first one's result.
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_workflow_steps (
    workflow_name text        NOT NULL,
    workflow_id   text        NOT NULL,
    generation    integer     NOT NULL,
    step_name     text        NOT NULL,
    result        jsonb       NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_name, workflow_id, generation, step_name)
);

-- Awakeables (keiro's keiro_workflow_awakeables): an id handed to the outside world, resolved
-- once. status: pending -> completed | failed | cancelled (terminal).
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_workflow_awakeables (
    awakeable_id  uuid        PRIMARY KEY,
    workflow_name text        NOT NULL,
    workflow_id   text        NOT NULL,
    generation    integer     NOT NULL,
    step_name     text        NOT NULL,
    status        text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'completed', 'failed', 'cancelled')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    resolved_at   timestamptz
);

CREATE INDEX IF NOT EXISTS keiro_workflow_awakeables_instance_idx
    ON {{.schema}}.keiro_workflow_awakeables (workflow_name, workflow_id);

CREATE INDEX IF NOT EXISTS keiro_workflow_awakeables_pending_idx
    ON {{.schema}}.keiro_workflow_awakeables (created_at)
    WHERE status = 'pending';

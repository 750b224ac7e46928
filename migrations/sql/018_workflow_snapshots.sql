-- Advisory snapshots of long workflow journals (keiro's Keiro.Workflow.Snapshot). See
-- docs/workflows.md, "Snapshots". Idempotent: every statement can run twice.

-- The journal version: every recorded step takes the next version of its instance, drawn from
-- journal_version under the instance row's lock, so an instance's committed steps always hold
-- every version up to the highest (versions are drawn in commit order; a version drawn by a
-- write that found its step recorded is skipped). The versions keep increasing across
-- generations.
ALTER TABLE {{.schema}}.keiro_workflows
    ADD COLUMN IF NOT EXISTS journal_version bigint NOT NULL DEFAULT 0;

ALTER TABLE {{.schema}}.keiro_workflow_steps
    ADD COLUMN IF NOT EXISTS version bigint NOT NULL DEFAULT 0;

-- Number the steps recorded before this migration in recording order, and carry each
-- instance's count over to its journal_version.
WITH numbered AS (
    SELECT workflow_name, workflow_id, generation, step_name,
           row_number() OVER (PARTITION BY workflow_name, workflow_id
                              ORDER BY generation, recorded_at, step_name) AS version
    FROM {{.schema}}.keiro_workflow_steps
    WHERE version = 0)
UPDATE {{.schema}}.keiro_workflow_steps s
SET version = n.version
FROM numbered n
WHERE s.workflow_name = n.workflow_name AND s.workflow_id = n.workflow_id
  AND s.generation = n.generation AND s.step_name = n.step_name;

UPDATE {{.schema}}.keiro_workflows w
SET journal_version = m.version
FROM (SELECT workflow_name, workflow_id, max(version) AS version
      FROM {{.schema}}.keiro_workflow_steps GROUP BY workflow_name, workflow_id) m
WHERE w.workflow_name = m.workflow_name AND w.workflow_id = m.workflow_id
  AND w.journal_version < m.version;

-- The tail a run reads after a snapshot: one generation's steps above a version.
CREATE INDEX IF NOT EXISTS keiro_workflow_steps_version_idx
    ON {{.schema}}.keiro_workflow_steps (workflow_name, workflow_id, generation, version);

-- One advisory snapshot per instance (the event store's keiro_snapshots, for journals): the
-- accumulated step map of one generation at journal_version, encoded by the codec
-- state_version whose layout is shape_hash. Never required for correctness: a missing row, one
-- of another generation, codec or shape, or one that does not decode means a full read of
-- the generation's journal.
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_workflow_snapshots (
    workflow_name   text        NOT NULL,
    workflow_id     text        NOT NULL,
    generation      integer     NOT NULL,
    journal_version bigint      NOT NULL,
    state_version   integer     NOT NULL,
    shape_hash      text        NOT NULL,
    state           jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_name, workflow_id)
);

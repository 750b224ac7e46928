-- Archive (docs/console.md, "Archive"): an operator sets aside dead or
-- rejected outbox rows and failed inbox rows that need no action (a test message, a cancelled
-- order): archived_at is when. Archived rows leave the working lists (the console's lists and
-- groups, `relay dead list`, `consumer inbox failed list`, requeue and retry of "all" or of a
-- filter) but stay in the table and in the archived listing and search. A requeue of a named
-- archived row brings it back (archived_at cleared). Nullable and without a default: adding
-- the columns rewrites nothing. Idempotent.
ALTER TABLE {{.schema}}.keiro_outbox ADD COLUMN IF NOT EXISTS archived_at timestamptz;
ALTER TABLE {{.schema}}.keiro_inbox ADD COLUMN IF NOT EXISTS archived_at timestamptz;

-- Per-attempt error history: attempt_errors holds the last 20 failed attempts of a row, oldest
-- first, each {"attempt": n, "at": time, "error": text} (and "code" for a rejection), appended by
-- the relay's mark of a failed or rejected produce and by the inbox's record of a failed
-- attempt; NULL for a row that never failed. Kept across a requeue or a retry.
ALTER TABLE {{.schema}}.keiro_outbox ADD COLUMN IF NOT EXISTS attempt_errors jsonb;
ALTER TABLE {{.schema}}.keiro_inbox ADD COLUMN IF NOT EXISTS attempt_errors jsonb;

-- dead_lettered_at: when the consumer runner's dead-letter produce of a poisoned row was
-- acknowledged. A redelivery of a message whose row is poisoned and dead-lettered is a duplicate
-- (counted, not dead-lettered again); a poisoned row without it (the runner stopped before the
-- acknowledgement) is dead-lettered by the next delivery. Resetting a row for a retry clears it.
ALTER TABLE {{.schema}}.keiro_inbox ADD COLUMN IF NOT EXISTS dead_lettered_at timestamptz;

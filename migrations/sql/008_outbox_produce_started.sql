-- The relay records that the produce of a row's last attempt starts, so that a lease that
-- expires on that attempt makes the row dead only if the attempt may have reached Kafka
-- (docs/architecture.md, "Row state machine"). The record is a column of its own, set under the
-- claim token and cleared with it; it used to be the token's "started" form (the same UUID with
-- version digit 8), which made every fenced statement accept two tokens. No index covers the
-- column, so setting it keeps the update HOT; with a constant default, PostgreSQL adds it
-- without rewriting the table.
ALTER TABLE {{.schema}}.keiro_outbox
    ADD COLUMN IF NOT EXISTS produce_started boolean NOT NULL DEFAULT false;

-- Rows publishing under a started token of an earlier release keep their record. Only open
-- rows are visited (the claim index).
UPDATE {{.schema}}.keiro_outbox SET produce_started = true
WHERE phase = 0 AND status = 'publishing' AND NOT produce_started
  AND substr(claim_token::text, 15, 1) = '8';

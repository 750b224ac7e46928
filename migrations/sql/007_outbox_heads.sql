-- The relay's claim past the front of the backlog finds each key's head through the
-- head-of-line index, one descent per key (a loose index scan), instead of walking the rows
-- behind the heads: its cost follows the keys and the batch, not the backlog's depth
-- (docs/architecture.md, "Claims past the front"). Rows without a key are unordered and have no
-- head: they get an index of their own, so that claim finds them without walking the keyed
-- rows. It holds only open null-key rows, so keyed rows and sent rows cost it nothing.
CREATE INDEX IF NOT EXISTS keiro_outbox_null_key_idx ON {{.schema}}.keiro_outbox (seq)
    WHERE phase = 0 AND message_key IS NULL;

-- The mode switch's fence (migration 009) takes keiro_outbox's EXCLUSIVE lock instead of SHARE.
-- A producer that found the schema in log mode enqueues with a statement that names keiro_outbox
-- only in its probe for an event already there, whose rows it locks FOR KEY SHARE: the
-- statement holds keiro_outbox's ROW SHARE lock, not the ROW EXCLUSIVE lock of an insert
-- target (setting up an insert target that inserts nothing cost a quarter of a single event's
-- enqueue). EXCLUSIVE conflicts with both, so the switch still waits for every transaction
-- that wrote the outbox in either mode and holds new writers back until it commits; unlike
-- ACCESS EXCLUSIVE it lets plain reads of keiro_outbox (the console, relay status, pg_dump) go
-- on. The outbox package checks for this text before it uses that statement, so a service
-- upgraded before its schema keeps the statement whose ROW EXCLUSIVE lock SHARE waits for.
CREATE OR REPLACE FUNCTION {{.schema}}.keiro_outbox_settings_fence() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    LOCK TABLE {{.schema}}.keiro_outbox IN EXCLUSIVE MODE;
    RETURN NULL;
END
$fn$;

-- Log mode's outbox (docs/architecture.md, "Log mode"): an insert-only table that the relay
-- reads through a logical replication slot (a publication of its inserts, pgoutput) instead of
-- claiming and marking rows. It holds the event's envelope only, the columns of keiro_outbox's
-- event: no status, no claim token, no lease, no ordering trigger; a row is written once, at
-- enqueue, and never updated by the relay. The publication order is the transactions' commit
-- order, so no ordering column is drawn either.
--
-- outbox_id is the id EnqueueTx returned (it tells the call that wrote the row from a later
-- duplicate); the relay does not read it.
--
-- The table stays the source of truth: a slot that is lost or invalidated can be recreated and
-- the rows it had not confirmed found again here. The unique index keeps enqueue idempotent on
-- (source, message id), as in keiro_outbox; a BRIN index on created_at, which costs an insert
-- almost nothing, serves retention. The relay creates the
-- publication and the slot when it starts in log mode (they are database objects, not schema
-- objects, and need the REPLICATION privilege), not this migration.
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_outbox_log (
    outbox_id              uuid        NOT NULL,
    message_id             text        NOT NULL,
    source                 text        NOT NULL,
    destination            text        NOT NULL,
    message_key            text,
    event_type             text        NOT NULL,
    schema_version         bigint      NOT NULL,
    content_type           text        NOT NULL,
    schema_registry        text,
    schema_subject         text,
    schema_version_ref     bigint,
    schema_id              bigint,
    schema_fingerprint     text,
    source_event_id        uuid,
    source_global_position bigint,
    causation_id           uuid,
    correlation_id         uuid,
    traceparent            text,
    tracestate             text,
    payload_bytes          bytea       NOT NULL,
    attributes             jsonb,
    occurred_at            timestamptz NOT NULL,
    -- When the row was written (its transaction's start): what retention goes by.
    created_at             timestamptz NOT NULL DEFAULT now()
);

CREATE UNIQUE INDEX IF NOT EXISTS keiro_outbox_log_identity_idx
    ON {{.schema}}.keiro_outbox_log (source, message_id);

-- Retention finds old rows through a block-range index: rows are appended in created_at order,
-- so a range summary per 128 pages is enough, and an insert into the table's last, unsummarized
-- range writes nothing to it.
CREATE INDEX IF NOT EXISTS keiro_outbox_log_created_idx
    ON {{.schema}}.keiro_outbox_log USING brin (created_at);

-- Retention's marks: the log-mode relay records, once a minute, the time and the WAL position.
-- Once the slot's confirmed_flush_lsn passes a mark, every transaction committed before the mark
-- was published, so rows written well before the mark's time (an hour, for transactions that
-- were still open) may be deleted once older than the relay's Retention (docs/architecture.md,
-- "Retention of keiro_outbox_log").
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_outbox_log_marks (
    at  timestamptz NOT NULL PRIMARY KEY,
    lsn pg_lsn      NOT NULL
);

-- The outbox's mode, one row: 'claim' (keiro_outbox, the claim relay) or 'log' (keiro_outbox_log,
-- the log-mode relay). Producers do not choose: every writer of keiro_outbox (EnqueueTx,
-- <schema>.enqueue, a plain INSERT) is routed by the trigger below, so a service switches mode
-- without a redeploy (`relay mode set log|claim`, outbox.Store.SetMode).
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_outbox_settings (
    singleton  boolean     NOT NULL DEFAULT true PRIMARY KEY CHECK (singleton),
    mode       text        NOT NULL DEFAULT 'claim' CHECK (mode IN ('claim', 'log')),
    changed_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO {{.schema}}.keiro_outbox_settings DEFAULT VALUES ON CONFLICT DO NOTHING;

-- A change of mode waits for every transaction writing the outbox and holds new writers back
-- until it commits, as keiro_outbox_source's fence does: no transaction writes rows under both
-- modes, and every writer that starts after the change sees it. It locks keiro_outbox alone:
-- every producer's statement takes keiro_outbox's ROW EXCLUSIVE lock, in either mode (EnqueueTx's
-- one statement names keiro_outbox as an insert target whatever the mode; the other writers insert
-- into keiro_outbox and the trigger routes their rows). A fence taking a second table's lock too
-- would deadlock with the writers that lock the two tables in the other order (EnqueueTx parses
-- keiro_outbox_log's insert first, the trigger inserts into it after keiro_outbox's).
CREATE OR REPLACE FUNCTION {{.schema}}.keiro_outbox_settings_fence() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    LOCK TABLE {{.schema}}.keiro_outbox IN SHARE MODE;
    RETURN NULL;
END
$fn$;

DROP TRIGGER IF EXISTS keiro_outbox_settings_fence ON {{.schema}}.keiro_outbox_settings;
CREATE TRIGGER keiro_outbox_settings_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON {{.schema}}.keiro_outbox_settings
    FOR EACH STATEMENT EXECUTE FUNCTION {{.schema}}.keiro_outbox_settings_fence();

-- The outbox's insert trigger (migration 004) routes by mode. In log mode a row goes to
-- keiro_outbox_log instead (the trigger returns NULL: keiro_outbox gets nothing, the INSERT's
-- RETURNING returns nothing) and takes no key lock and no seq: the slot publishes in commit
-- order. A duplicate of a row already in keiro_outbox_log writes nothing (ON CONFLICT); the
-- caller tells a duplicate from a conflict by reading the row back (EnqueueTx,
-- <schema>.enqueue). Idempotence holds across a switch: in log mode an event already in
-- keiro_outbox (enqueued in claim mode) goes on to keiro_outbox, where the unique constraint
-- meets it as before; in claim mode an event already in keiro_outbox_log writes nothing. The
-- cost is one lookup of the settings row and one index probe of the other table per row.
--
-- Only a row inserted as 'pending' (the default, what every producer writes) is routed. A row
-- inserted with another status goes to keiro_outbox in either mode, with the key lock and seq
-- of any row: it is the log-mode relay's dead letter, an event of keiro_outbox_log Kafka
-- refused for good, written as 'rejected' where `relay dead list|requeue` and the console read
-- dead letters (docs/architecture.md, "Failures and dead letters").
-- A row routed to keiro_outbox_log whose event is already there (same source and message id):
-- the same event again writes nothing, as EnqueueTx's and <schema>.enqueue's duplicates; a
-- changed one raises unique_violation on the outbox's identity constraint, with the changed
-- fields, as a plain INSERT of a duplicate into keiro_outbox does (the comparison is
-- <schema>.enqueue's: the trace only when the new row carries one). EnqueueTx in log mode writes
-- keiro_outbox_log itself and reads duplicates back; this is for the other writers.
CREATE OR REPLACE FUNCTION {{.schema}}.keiro_outbox_log_duplicate(n {{.schema}}.keiro_outbox)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    o      {{.schema}}.keiro_outbox_log;
    fields text[] := '{}';
BEGIN
    SELECT * INTO o FROM {{.schema}}.keiro_outbox_log l
    WHERE l.source = n.source AND l.message_id = n.message_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF n.destination IS DISTINCT FROM o.destination OR n.message_key IS DISTINCT FROM o.message_key THEN
        fields := fields || 'routing'::text;
    END IF;
    IF n.event_type IS DISTINCT FROM o.event_type OR n.schema_version IS DISTINCT FROM o.schema_version
       OR n.content_type IS DISTINCT FROM o.content_type
       OR n.schema_registry IS DISTINCT FROM o.schema_registry
       OR n.schema_subject IS DISTINCT FROM o.schema_subject
       OR n.schema_version_ref IS DISTINCT FROM o.schema_version_ref
       OR n.schema_id IS DISTINCT FROM o.schema_id
       OR n.schema_fingerprint IS DISTINCT FROM o.schema_fingerprint THEN
        fields := fields || 'schema'::text;
    END IF;
    IF n.payload_bytes IS DISTINCT FROM o.payload_bytes THEN fields := fields || 'payload'::text; END IF;
    IF n.occurred_at IS DISTINCT FROM o.occurred_at THEN fields := fields || 'occurred_at'::text; END IF;
    IF n.causation_id IS DISTINCT FROM o.causation_id OR n.correlation_id IS DISTINCT FROM o.correlation_id THEN
        fields := fields || 'causal'::text;
    END IF;
    IF n.traceparent IS NOT NULL AND (n.traceparent IS DISTINCT FROM o.traceparent
                                      OR n.tracestate IS DISTINCT FROM o.tracestate) THEN
        fields := fields || 'trace'::text;
    END IF;
    IF n.attributes IS DISTINCT FROM o.attributes THEN fields := fields || 'attributes'::text; END IF;
    IF n.source_event_id IS DISTINCT FROM o.source_event_id
       OR n.source_global_position IS DISTINCT FROM o.source_global_position THEN
        fields := fields || 'provenance'::text;
    END IF;
    IF cardinality(fields) > 0 THEN
        RAISE EXCEPTION USING
            MESSAGE = format('outbox: message "%s" of source "%s" already enqueued with different %s',
                n.message_id, n.source, array_to_string(fields, ', ')),
            ERRCODE = 'unique_violation', CONSTRAINT = 'keiro_outbox_source_message_id_key',
            DETAIL = 'conflicting fields: ' || array_to_string(fields, ','),
            HINT = 'roll the transaction back: a message id names one event; give a changed event a new message id';
    END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION {{.schema}}.keiro_outbox_order() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NEW.status IS DISTINCT FROM 'pending' THEN
        NULL; -- a dead letter (or another non-producer row): keiro_outbox, below
    ELSIF (SELECT s.mode FROM {{.schema}}.keiro_outbox_settings s) = 'log' THEN
        IF NOT EXISTS (SELECT 1 FROM {{.schema}}.keiro_outbox o
                       WHERE o.source = NEW.source AND o.message_id = NEW.message_id) THEN
            INSERT INTO {{.schema}}.keiro_outbox_log (outbox_id, message_id, source, destination,
                message_key, event_type, schema_version, content_type, schema_registry,
                schema_subject, schema_version_ref, schema_id, schema_fingerprint, source_event_id,
                source_global_position, causation_id, correlation_id, traceparent, tracestate,
                payload_bytes, attributes, occurred_at)
            VALUES (NEW.outbox_id, NEW.message_id, NEW.source, NEW.destination, NEW.message_key,
                NEW.event_type, NEW.schema_version, NEW.content_type, NEW.schema_registry,
                NEW.schema_subject, NEW.schema_version_ref, NEW.schema_id, NEW.schema_fingerprint,
                NEW.source_event_id, NEW.source_global_position, NEW.causation_id,
                NEW.correlation_id, NEW.traceparent, NEW.tracestate, NEW.payload_bytes,
                NEW.attributes, NEW.occurred_at)
            ON CONFLICT (source, message_id) DO NOTHING;
            IF NOT FOUND THEN
                PERFORM {{.schema}}.keiro_outbox_log_duplicate(NEW);
            END IF;
            RETURN NULL;
        END IF;
    ELSIF EXISTS (SELECT 1 FROM {{.schema}}.keiro_outbox_log l
                  WHERE l.source = NEW.source AND l.message_id = NEW.message_id) THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM {{.schema}}.keiro_outbox_source s WHERE s.source = NEW.source) THEN
        PERFORM pg_catalog.pg_advisory_xact_lock(
            pg_catalog.hashtextextended('{{.schema}}' || chr(30) || NEW.source, 0));
    ELSIF NEW.message_key IS NOT NULL THEN
        PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(
            '{{.schema}}' || chr(31) || NEW.source || chr(31) || NEW.message_key, 0));
    END IF;
    NEW.seq := nextval('{{.schema}}.keiro_outbox_seq');
    RETURN NEW;
END
$fn$;

-- <schema>.enqueue (migration 004) in either mode: in log mode the row it writes lands in
-- keiro_outbox_log, and a duplicate or conflict is read from the table that holds the event.
-- The NOTIFY is sent only for a row of keiro_outbox: the log-mode relay needs none.
CREATE OR REPLACE FUNCTION {{.schema}}.enqueue(
    source                 text,
    message_id             text,
    destination            text,
    event_type             text,
    payload                bytea,
    occurred_at            timestamptz,
    message_key            text        DEFAULT NULL,
    content_type           text        DEFAULT 'application/json',
    schema_version         bigint      DEFAULT 0,
    attributes             jsonb       DEFAULT NULL,
    causation_id           uuid        DEFAULT NULL,
    correlation_id         uuid        DEFAULT NULL,
    traceparent            text        DEFAULT NULL,
    tracestate             text        DEFAULT NULL,
    source_event_id        uuid        DEFAULT NULL,
    source_global_position bigint      DEFAULT NULL,
    schema_registry        text        DEFAULT NULL,
    schema_subject         text        DEFAULT NULL,
    schema_version_ref     bigint      DEFAULT NULL,
    schema_id              bigint      DEFAULT NULL,
    schema_fingerprint     text        DEFAULT NULL,
    OUT outbox_id          uuid,
    OUT outcome            text)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_variable
DECLARE
    problems text[] := '{}';
    old      record;
    new_id   uuid := gen_random_uuid();
    fields   text[] := '{}';
BEGIN
    IF coalesce(source, '') = '' THEN problems := problems || 'source is required'::text; END IF;
    IF coalesce(message_id, '') = '' THEN
        problems := problems || 'message_id is required'::text;
    ELSIF octet_length(message_id) > 256 THEN
        problems := problems || format('message_id is %s bytes, longer than 256', octet_length(message_id));
    END IF;
    IF coalesce(destination, '') = '' THEN
        problems := problems || 'destination is required'::text;
    ELSIF destination !~ '^[a-zA-Z0-9._-]{1,249}$' OR destination IN ('.', '..') THEN
        problems := problems || 'destination is not a legal Kafka topic (1-249 of a-z A-Z 0-9 . _ -, not "." or "..")'::text;
    END IF;
    IF coalesce(event_type, '') = '' THEN problems := problems || 'event_type is required'::text; END IF;
    IF coalesce(content_type, '') = '' THEN problems := problems || 'content_type is required'::text; END IF;
    IF payload IS NULL THEN problems := problems || 'payload is required (use an empty bytea for none)'::text; END IF;
    IF occurred_at IS NULL THEN
        problems := problems || 'occurred_at is required'::text;
    ELSIF occurred_at < '0001-01-01T00:00:00Z' OR occurred_at >= '10000-01-01T00:00:00Z' THEN
        problems := problems || 'occurred_at is outside years 0001-9999'::text;
    END IF;
    IF schema_version IS NULL OR schema_version < 0 THEN
        problems := problems || 'schema_version must be 0 or more'::text;
    END IF;
    IF traceparent IS NOT NULL AND NOT (
        traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?$'
        AND left(traceparent, 2) <> 'ff'
        AND substr(traceparent, 4, 32) <> repeat('0', 32)
        AND substr(traceparent, 37, 16) <> repeat('0', 16)
        AND (length(traceparent) = 55 OR left(traceparent, 2) <> '00')) THEN
        problems := problems || 'traceparent is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)'::text;
    END IF;
    IF tracestate IS NOT NULL AND traceparent IS NULL THEN
        problems := problems || 'tracestate needs a traceparent'::text;
    END IF;
    IF cardinality(problems) > 0 THEN
        RAISE EXCEPTION 'enqueue outbox event %: %', coalesce(quote_literal(message_id), 'NULL'),
            array_to_string(problems, '; ')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'correct the arguments and call again';
    END IF;

    INSERT INTO {{.schema}}.keiro_outbox AS o (outbox_id, message_id, source, destination,
        message_key, event_type, schema_version, content_type, schema_registry, schema_subject,
        schema_version_ref, schema_id, schema_fingerprint, source_event_id,
        source_global_position, causation_id, correlation_id, traceparent, tracestate,
        payload_bytes, attributes, occurred_at)
    VALUES (new_id, message_id, source, destination, message_key, event_type,
        schema_version, content_type, schema_registry, schema_subject, schema_version_ref,
        schema_id, schema_fingerprint, source_event_id, source_global_position, causation_id,
        correlation_id, traceparent, tracestate, payload, attributes, occurred_at)
    ON CONFLICT ON CONSTRAINT keiro_outbox_source_message_id_key DO NOTHING
    RETURNING o.outbox_id INTO outbox_id;
    IF FOUND THEN
        outcome := 'inserted';
        -- The sleep locks of sql.go: notify only while a relay sleeps.
        IF NOT pg_catalog.pg_try_advisory_xact_lock_shared(hashtext('keiro.outbox.sleep'), hashtext('{{.schema}}'))
           OR NOT pg_catalog.pg_try_advisory_xact_lock_shared(hashtext('keiro.outbox.sleep.filtered'), hashtext('{{.schema}}')) THEN
            PERFORM pg_catalog.pg_notify('{{.schema}}.keiro_outbox', '');
        END IF;
        RETURN;
    END IF;

    SELECT * INTO old FROM {{.schema}}.keiro_outbox o
    WHERE o.source = enqueue.source AND o.message_id = enqueue.message_id;
    IF NOT FOUND THEN
        -- Log mode: the trigger wrote the row to keiro_outbox_log (it carries this call's id)
        -- or found it there.
        SELECT * INTO old FROM {{.schema}}.keiro_outbox_log l
        WHERE l.source = enqueue.source AND l.message_id = enqueue.message_id;
        IF FOUND AND old.outbox_id = new_id THEN
            outbox_id := new_id;
            outcome := 'inserted';
            RETURN;
        END IF;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'enqueue outbox event %: neither inserted nor found', quote_literal(message_id)
            USING ERRCODE = 'serialization_failure', HINT = 'retry the transaction';
    END IF;
    IF destination IS DISTINCT FROM old.destination OR message_key IS DISTINCT FROM old.message_key THEN
        fields := fields || 'routing'::text;
    END IF;
    IF event_type IS DISTINCT FROM old.event_type OR schema_version IS DISTINCT FROM old.schema_version
       OR content_type IS DISTINCT FROM old.content_type
       OR schema_registry IS DISTINCT FROM old.schema_registry
       OR schema_subject IS DISTINCT FROM old.schema_subject
       OR schema_version_ref IS DISTINCT FROM old.schema_version_ref
       OR schema_id IS DISTINCT FROM old.schema_id
       OR schema_fingerprint IS DISTINCT FROM old.schema_fingerprint THEN
        fields := fields || 'schema'::text;
    END IF;
    IF payload IS DISTINCT FROM old.payload_bytes THEN fields := fields || 'payload'::text; END IF;
    IF occurred_at IS DISTINCT FROM old.occurred_at THEN fields := fields || 'occurred_at'::text; END IF;
    IF causation_id IS DISTINCT FROM old.causation_id OR correlation_id IS DISTINCT FROM old.correlation_id THEN
        fields := fields || 'causal'::text;
    END IF;
    -- As in EnqueueTx, the trace is compared only when the call carries one: a retry from
    -- another request naturally has another trace.
    IF traceparent IS NOT NULL AND (traceparent IS DISTINCT FROM old.traceparent
                                    OR tracestate IS DISTINCT FROM old.tracestate) THEN
        fields := fields || 'trace'::text;
    END IF;
    IF attributes IS DISTINCT FROM old.attributes THEN fields := fields || 'attributes'::text; END IF;
    IF source_event_id IS DISTINCT FROM old.source_event_id
       OR source_global_position IS DISTINCT FROM old.source_global_position THEN
        fields := fields || 'provenance'::text;
    END IF;
    outbox_id := old.outbox_id;
    IF cardinality(fields) > 0 THEN
        RAISE EXCEPTION USING
            MESSAGE = format('outbox: message "%s" of source "%s" already enqueued with different %s',
                message_id, source, array_to_string(fields, ', ')),
            ERRCODE = 'unique_violation', CONSTRAINT = 'keiro_outbox_source_message_id_key',
                  DETAIL = 'conflicting fields: ' || array_to_string(fields, ','),
                  HINT = 'roll the transaction back: a message id names one event; give a changed event a new message id';
    END IF;
    outcome := 'duplicate';
END
$fn$;


-- Order enforced by the database for every writer of the outbox, whatever its client library
-- (docs/architecture.md, "Order at enqueue"): a BEFORE INSERT trigger takes the per-(source, key)
-- transaction lock, or the per-source lock of a source declared in keiro_outbox_source, and only
-- then draws seq. A transaction that inserts a key's row therefore holds that key until it
-- commits or rolls back, and a later writer of the key draws a larger seq only after that: seq
-- order is commit order per key (per source for declared sources), for EnqueueTx, for
-- <schema>.enqueue(...) and for a plain INSERT alike.

LOCK TABLE {{.schema}}.keiro_outbox IN ACCESS EXCLUSIVE MODE;

-- seq was an identity, drawn when the row is formed, before any trigger runs. It becomes a plain
-- column drawn from keiro_outbox_seq by the trigger; existing rows keep their values and the
-- sequence continues after the identity's last value. CACHE 1: values are increasing in the
-- order they are drawn, across sessions.
CREATE SEQUENCE IF NOT EXISTS {{.schema}}.keiro_outbox_seq AS bigint CACHE 1
    OWNED BY {{.schema}}.keiro_outbox.seq;

DO $migrate$
DECLARE
    identity_seq text;
    last_seq     bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
               WHERE attrelid = '{{.schema}}.keiro_outbox'::regclass AND attname = 'seq'
                 AND attidentity <> '') THEN
        identity_seq := pg_catalog.pg_get_serial_sequence('{{.schema}}.keiro_outbox', 'seq');
        EXECUTE format('SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM %s',
            identity_seq) INTO last_seq;
        last_seq := greatest(last_seq,
            coalesce((SELECT max(seq) FROM {{.schema}}.keiro_outbox), 0));
        ALTER TABLE {{.schema}}.keiro_outbox ALTER COLUMN seq DROP IDENTITY;
        IF last_seq > 0 THEN
            PERFORM setval('{{.schema}}.keiro_outbox_seq', last_seq, true);
        END IF;
    END IF;
END
$migrate$;

-- Sources whose rows are ordered as one stream (the relay's PerSourceStream policy): the trigger
-- takes one lock per source instead of one per key, null keys included, so the source's writers
-- serialise and its seq order is its commit order. Declare a source before its producers start
-- (Store.DeclarePerSourceOrder, or an INSERT here); see keiro_outbox_source_fence below for a
-- declaration made while they run.
CREATE TABLE IF NOT EXISTS {{.schema}}.keiro_outbox_source (
    source      text        NOT NULL PRIMARY KEY,
    ordering    text        NOT NULL DEFAULT 'per-source' CHECK (ordering IN ('per-source')),
    declared_at timestamptz NOT NULL DEFAULT now()
);

-- The trigger that orders every insert. The key lock is the one EnqueueTx has always taken
-- (hashtextextended of schema, source and key joined by chr(31)), so both paths serialise with
-- each other; the source lock hashes schema and source joined by chr(30). Null keys of an
-- undeclared source take no lock: they are unordered.
CREATE OR REPLACE FUNCTION {{.schema}}.keiro_outbox_order() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
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

DROP TRIGGER IF EXISTS keiro_outbox_order ON {{.schema}}.keiro_outbox;
CREATE TRIGGER keiro_outbox_order BEFORE INSERT ON {{.schema}}.keiro_outbox
    FOR EACH ROW EXECUTE FUNCTION {{.schema}}.keiro_outbox_order();

-- seq never changes once drawn (the identity refused it too).
CREATE OR REPLACE FUNCTION {{.schema}}.keiro_outbox_seq_fixed() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NEW.seq IS DISTINCT FROM OLD.seq THEN
        RAISE EXCEPTION 'keiro_outbox.seq of row % cannot change', OLD.outbox_id
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'seq is the publishing order, drawn when the row is inserted; insert a new row instead';
    END IF;
    RETURN NEW;
END
$fn$;

DROP TRIGGER IF EXISTS keiro_outbox_seq_fixed ON {{.schema}}.keiro_outbox;
CREATE TRIGGER keiro_outbox_seq_fixed BEFORE UPDATE OF seq ON {{.schema}}.keiro_outbox
    FOR EACH ROW EXECUTE FUNCTION {{.schema}}.keiro_outbox_seq_fixed();

-- A change of keiro_outbox_source waits for every transaction that is writing the outbox, and
-- holds new writers back until it commits: a writer still running under the old rule (a key
-- lock, or none for a null key) must not overlap one under the new rule (the source lock), or a
-- row drawn under one could commit after a row drawn under the other. Writers that start after
-- the change see it (in READ COMMITTED; a REPEATABLE READ or SERIALIZABLE transaction that began
-- before the change keeps the old rule until it ends).
CREATE OR REPLACE FUNCTION {{.schema}}.keiro_outbox_source_fence() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    LOCK TABLE {{.schema}}.keiro_outbox IN SHARE MODE;
    RETURN NULL;
END
$fn$;

DROP TRIGGER IF EXISTS keiro_outbox_source_fence ON {{.schema}}.keiro_outbox_source;
CREATE TRIGGER keiro_outbox_source_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON {{.schema}}.keiro_outbox_source
    FOR EACH STATEMENT EXECUTE FUNCTION {{.schema}}.keiro_outbox_source_fence();

-- {{.schema}}.enqueue: the supported way to write the outbox from any language (docs/compose.md).
-- It validates the event as EnqueueTx does, inserts it (the trigger above orders it), and
-- returns the row's outbox id and the outcome: 'inserted', or 'duplicate' when the same
-- (source, message_id) is already there with identical content. The same (source, message_id)
-- with different content is an identity conflict: it raises unique_violation (SQLSTATE 23505)
-- naming the differing field classes (routing, schema, payload, occurred_at, causal, trace,
-- attributes, provenance), and nothing is written; roll the transaction back. Invalid input
-- raises invalid_parameter_value (22023). Like EnqueueTx it wakes a sleeping relay with a NOTIFY
-- (sent at commit), and only then.
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
    old      {{.schema}}.keiro_outbox;
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
    VALUES (gen_random_uuid(), message_id, source, destination, message_key, event_type,
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

COMMENT ON FUNCTION {{.schema}}.enqueue(text, text, text, text, bytea, timestamptz, text, text,
    bigint, jsonb, uuid, uuid, text, text, uuid, bigint, text, text, bigint, bigint, text) IS
'Writes one event to the keiro outbox in the caller''s transaction and returns (outbox_id, outcome): '
'outcome ''inserted'', or ''duplicate'' for the same (source, message_id) with identical content. '
'Different content raises unique_violation (23505) naming the differing fields; roll back. '
'Rows are published per (source, message_key) in commit order; null keys are unordered.';

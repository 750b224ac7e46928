package outbox

import "strings"

// All of the outbox's SQL lives in this file. Every statement names its tables through the
// {{schema}} placeholder, replaced once by [newQueries] with a schema name that
// migrations.ValidateSchema accepted, so no statement relies on search_path and none is built
// from user input at run time.

// sqlEnqueue inserts one call's events in one statement. The locks CTE takes a transaction-scoped
// advisory lock per distinct keyed (source, key), in hash order, before any row gets its seq:
// the INSERT reads the one-row locks CTE, so the locks are held before nextval runs. Same-key
// enqueuing transactions therefore serialise and seq order equals commit order per key. With
// $23 = false (StoreOptions.DisableKeyLocks) no lock is taken.
const sqlEnqueue = `
WITH input AS (
    SELECT * FROM unnest(
        $1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[],
        $8::text[], $9::text[], $10::text[], $11::bigint[], $12::bigint[], $13::text[],
        $14::uuid[], $15::bigint[], $16::uuid[], $17::uuid[], $18::text[], $19::text[],
        $20::bytea[], $21::text[], $22::timestamptz[]
    ) WITH ORDINALITY AS t(outbox_id, message_id, source, destination, message_key, event_type,
        schema_version, content_type, schema_registry, schema_subject, schema_version_ref,
        schema_id, schema_fingerprint, source_event_id, source_global_position, causation_id,
        correlation_id, traceparent, tracestate, payload_bytes, attributes, occurred_at, ord)
), locks AS (
    SELECT count(pg_advisory_xact_lock(h)) AS n FROM (
        SELECT DISTINCT hashtextextended('{{schema}}' || chr(31) || source || chr(31) || message_key, 0) AS h
        FROM input WHERE message_key IS NOT NULL AND $23::boolean
        ORDER BY h
    ) k
), ins AS (
    INSERT INTO {{schema}}.keiro_outbox (outbox_id, message_id, source, destination, message_key,
        event_type, schema_version, content_type, schema_registry, schema_subject,
        schema_version_ref, schema_id, schema_fingerprint, source_event_id,
        source_global_position, causation_id, correlation_id, traceparent, tracestate,
        payload_bytes, attributes, occurred_at)
    SELECT i.outbox_id, i.message_id, i.source, i.destination, i.message_key, i.event_type,
        i.schema_version, i.content_type, i.schema_registry, i.schema_subject,
        i.schema_version_ref, i.schema_id, i.schema_fingerprint, i.source_event_id,
        i.source_global_position, i.causation_id, i.correlation_id, i.traceparent, i.tracestate,
        i.payload_bytes, i.attributes::jsonb, i.occurred_at
    FROM input i CROSS JOIN locks
    WHERE locks.n >= 0
    ORDER BY i.ord
    ON CONFLICT (source, message_id) DO NOTHING
    RETURNING outbox_id
), notified AS (
    SELECT pg_notify('{{schema}}.keiro_outbox', '') FROM (SELECT 1 FROM ins LIMIT 1) x
)
SELECT outbox_id, (SELECT count(*) FROM notified) FROM ins`

// sqlEnqueueExisting reads back the rows that an enqueue did not insert, to tell a duplicate
// from an identity conflict.
const sqlEnqueueExisting = `
SELECT o.outbox_id, o.source, o.message_id, o.destination, o.message_key, o.event_type,
    o.schema_version, o.content_type, o.schema_registry, o.schema_subject, o.schema_version_ref,
    o.schema_id, o.schema_fingerprint, o.source_event_id, o.source_global_position,
    o.causation_id, o.correlation_id, o.traceparent, o.tracestate, o.payload_bytes,
    o.attributes::text, o.occurred_at
FROM {{schema}}.keiro_outbox o
JOIN unnest($1::text[], $2::text[]) AS k(source, message_id)
  ON o.source = k.source AND o.message_id = k.message_id`

// queries holds the statements with the schema substituted.
type queries struct {
	enqueue, enqueueExisting string
}

func newQueries(schema string) queries {
	r := strings.NewReplacer("{{schema}}", schema)
	return queries{
		enqueue:         r.Replace(sqlEnqueue),
		enqueueExisting: r.Replace(sqlEnqueueExisting),
	}
}

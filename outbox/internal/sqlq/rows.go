package sqlq

// The statements that read whole rows, for the outbox's row codec (outbox/rowcodec.go).

// RowColumns are the columns of a whole row, in the order outbox's scanRow reads them: the
// row's state, then its event, the payload's full size after the payload. {{payload}} is the
// expression that reads the payload: payload_bytes, or in the listings a prefix of it
// (pgtext.PrefixSQL).
const RowColumns = `seq, status, attempt_count, next_attempt_at, last_error, published_at, kafka_partition,
    kafka_offset, rejection_code, created_at, updated_at,
    outbox_id, source, message_id, destination, message_key, event_type,
    schema_version, content_type, schema_registry, schema_subject, schema_version_ref,
    schema_id, schema_fingerprint, source_event_id, source_global_position,
    causation_id, correlation_id, traceparent, tracestate, {{payload}},
    octet_length(payload_bytes), attributes::text, occurred_at`

// sqlLookupRow reads one row by outbox id ($1).
const sqlLookupRow = `SELECT ` + RowColumns + ` FROM {{schema}}.keiro_outbox WHERE outbox_id = $1`

// sqlEnqueueExistingRows reads back the rows of the (source $1[i], message id $2[i]) pairs
// that an enqueue did not insert into keiro_outbox, to tell a duplicate from an identity
// conflict: from keiro_outbox, or from keiro_outbox_log (an event enqueued in the other mode,
// migration 009). A log row has no delivery state: its columns read as a pending row's.
const sqlEnqueueExistingRows = `SELECT ` + RowColumns + ` FROM {{schema}}.keiro_outbox
WHERE (source, message_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
UNION ALL
SELECT 0::bigint, 'pending', 0, now(), NULL::text, NULL::timestamptz, NULL::integer,
    NULL::bigint, NULL::text, now(), now(),
    outbox_id, source, message_id, destination, message_key, event_type,
    schema_version, content_type, schema_registry, schema_subject, schema_version_ref,
    schema_id, schema_fingerprint, source_event_id, source_global_position,
    causation_id, correlation_id, traceparent, tracestate, {{payload}},
    octet_length(payload_bytes), attributes::text, occurred_at
FROM {{schema}}.keiro_outbox_log
WHERE (source, message_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`

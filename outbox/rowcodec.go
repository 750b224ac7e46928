package outbox

import (
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/envelope"
)

// The outbox row codec: the one column list every statement reading whole rows selects
// (inspection listings, Lookup, the enqueue's read-back of existing rows), and the one
// function that maps it to a Row. The claim reads its own columns (claim.go, sql.go) and
// shares fillEvent only.

// rowColumns are the columns scanRow reads, in its order: the row's state, then its event.
const rowColumns = `seq, status, attempt_count, next_attempt_at, last_error, published_at, kafka_partition,
    kafka_offset, rejection_code, created_at, updated_at,
    outbox_id, source, message_id, destination, message_key, event_type,
    schema_version, content_type, schema_registry, schema_subject, schema_version_ref,
    schema_id, schema_fingerprint, source_event_id, source_global_position,
    causation_id, correlation_id, traceparent, tracestate, payload_bytes,
    attributes::text, occurred_at`

// sqlLookupRow reads one row by outbox id ($1).
const sqlLookupRow = `SELECT ` + rowColumns + ` FROM {{schema}}.keiro_outbox WHERE outbox_id = $1`

// sqlEnqueueExistingRows reads back the rows of the (source $1[i], message id $2[i]) pairs
// that an enqueue did not insert into keiro_outbox, to tell a duplicate from an identity
// conflict: from keiro_outbox, or from keiro_outbox_log (log mode, migration 009: there the
// row may be the one this enqueue wrote, which carries its outbox id). A log row has no
// delivery state: its columns read as a pending row's.
const sqlEnqueueExistingRows = `SELECT ` + rowColumns + ` FROM {{schema}}.keiro_outbox
WHERE (source, message_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
UNION ALL
SELECT 0::bigint, 'pending', 0, now(), NULL::text, NULL::timestamptz, NULL::integer,
    NULL::bigint, NULL::text, now(), now(),
    outbox_id, source, message_id, destination, message_key, event_type,
    schema_version, content_type, schema_registry, schema_subject, schema_version_ref,
    schema_id, schema_fingerprint, source_event_id, source_global_position,
    causation_id, correlation_id, traceparent, tracestate, payload_bytes,
    attributes::text, occurred_at
FROM {{schema}}.keiro_outbox_log
WHERE (source, message_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`

// scanRow reads one row of rowColumns.
func scanRow(row pgx.Row) (Row, error) {
	var (
		r                              Row
		rid                            [16]byte
		lastErr, code                  *string
		key, registry, subject, fp     *string
		versionRef, schemaID, position *int64
		sourceEventID, causation, corr *[16]byte
		tp, ts, attrs                  *string
	)
	e := &r.Event
	err := row.Scan(&r.Seq, &r.Status, &r.Attempts, &r.NextAttemptAt,
		&lastErr, &r.PublishedAt, &r.Partition, &r.Offset, &code, &r.CreatedAt, &r.UpdatedAt,
		&rid, &e.Source, &e.MessageID, &e.Destination, &key, &e.EventType,
		&e.SchemaVersion, &e.ContentType, &registry, &subject, &versionRef, &schemaID, &fp,
		&sourceEventID, &position, &causation, &corr, &tp, &ts, &e.Payload, &attrs, &e.OccurredAt)
	if err != nil {
		return r, err
	}
	r.OutboxID = rid
	if lastErr != nil {
		r.LastError = *lastErr
	}
	if code != nil {
		r.RejectionCode = *code
	}
	fillEvent(e, key, registry, subject, fp, versionRef, schemaID, position, sourceEventID, causation, corr, tp, ts, attrs)
	return r, nil
}

// fillEvent sets the event's fields read from nullable columns.
func fillEvent(e *envelope.Event, key, registry, subject, fp *string, versionRef, schemaID, position *int64,
	sourceEventID, causation, corr *[16]byte, tp, ts, attrs *string) {
	e.Key = key
	if registry != nil || subject != nil || fp != nil || versionRef != nil || schemaID != nil {
		e.SchemaRef = &envelope.SchemaRef{Registry: registry, Subject: subject, Version: versionRef, SchemaID: schemaID, Fingerprint: fp}
	}
	e.SourceGlobalPosition = position
	toUUID := func(b *[16]byte) *envelope.UUID {
		if b == nil {
			return nil
		}
		u := envelope.UUID(*b)
		return &u
	}
	e.SourceEventID, e.CausationID, e.CorrelationID = toUUID(sourceEventID), toUUID(causation), toUUID(corr)
	if tp != nil {
		e.TraceContext = &envelope.TraceContext{Traceparent: *tp}
		if ts != nil {
			e.TraceContext.Tracestate = *ts
		}
	}
	if attrs != nil {
		e.Attributes = json.RawMessage(*attrs)
	}
	e.OccurredAt = e.OccurredAt.UTC()
}

package outbox

import (
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/envelope"
)

// The outbox row codec: the one function that maps the one column list every statement
// reading whole rows selects (sqlq.RowColumns: inspection listings, Lookup, the enqueue's
// read-back of existing rows) to a Row. The claim reads its own columns (claim.go,
// internal/sqlq) and shares fillEvent only.

// scanRow reads one row of sqlq.RowColumns.
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
		&sourceEventID, &position, &causation, &corr, &tp, &ts, &e.Payload, &r.PayloadSize, &attrs, &e.OccurredAt)
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

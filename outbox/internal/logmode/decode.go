package logmode

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/keiro-go/keiro/envelope"
)

// The decoding of keiro_outbox_log's rows from pgoutput's binary tuples (the slot is started
// with binary 'true', so values arrive in PostgreSQL's binary send format and need no text
// parsing; bytea in particular arrives as is, not hex-encoded).

// The PostgreSQL type OIDs of the table's columns.
const (
	oidBytea       = 17
	oidInt8        = 20
	oidText        = 25
	oidTimestamptz = 1184
	oidUUID        = 2950
	oidJSONB       = 3802
)

// The table's columns, in the order of field indexes.
const (
	colMessageID = iota
	colSource
	colDestination
	colMessageKey
	colEventType
	colSchemaVersion
	colContentType
	colSchemaRegistry
	colSchemaSubject
	colSchemaVersionRef
	colSchemaID
	colSchemaFingerprint
	colSourceEventID
	colSourceGlobalPosition
	colCausationID
	colCorrelationID
	colTraceparent
	colTracestate
	colPayload
	colAttributes
	colOccurredAt
	numColumns
)

// columns names each column and its type.
var columns = [numColumns]struct {
	name     string
	oid      uint32
	required bool
}{
	colMessageID:            {"message_id", oidText, true},
	colSource:               {"source", oidText, true},
	colDestination:          {"destination", oidText, true},
	colMessageKey:           {"message_key", oidText, false},
	colEventType:            {"event_type", oidText, true},
	colSchemaVersion:        {"schema_version", oidInt8, true},
	colContentType:          {"content_type", oidText, true},
	colSchemaRegistry:       {"schema_registry", oidText, false},
	colSchemaSubject:        {"schema_subject", oidText, false},
	colSchemaVersionRef:     {"schema_version_ref", oidInt8, false},
	colSchemaID:             {"schema_id", oidInt8, false},
	colSchemaFingerprint:    {"schema_fingerprint", oidText, false},
	colSourceEventID:        {"source_event_id", oidUUID, false},
	colSourceGlobalPosition: {"source_global_position", oidInt8, false},
	colCausationID:          {"causation_id", oidUUID, false},
	colCorrelationID:        {"correlation_id", oidUUID, false},
	colTraceparent:          {"traceparent", oidText, false},
	colTracestate:           {"tracestate", oidText, false},
	colPayload:              {"payload_bytes", oidBytea, true},
	colAttributes:           {"attributes", oidJSONB, false},
	colOccurredAt:           {"occurred_at", oidTimestamptz, true},
}

// layout maps the table's columns to their positions in a relation's tuples.
type layout struct {
	pos [numColumns]int // tuple position of each column
	n   int             // the relation's column count
}

// newLayout checks a Relation message of keiro_outbox_log against the columns the engine
// reads and returns where each is. Extra columns are ignored.
func newLayout(rel *pglogrepl.RelationMessage) (*layout, error) {
	l := &layout{n: len(rel.Columns)}
	for i := range l.pos {
		l.pos[i] = -1
	}
	for p, c := range rel.Columns {
		for i, want := range columns {
			if c.Name != want.name {
				continue
			}
			if c.DataType != want.oid {
				return nil, fmt.Errorf("column %s.%s.%s has type oid %d, want %d; apply keiro's migrations",
					rel.Namespace, rel.RelationName, c.Name, c.DataType, want.oid)
			}
			l.pos[i] = p
		}
	}
	for i, p := range l.pos {
		if p < 0 && columns[i].required {
			return nil, fmt.Errorf("%s.%s has no column %s; apply keiro's migrations", rel.Namespace, rel.RelationName, columns[i].name)
		}
	}
	return l, nil
}

// pgEpoch is the origin of PostgreSQL's timestamps.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// event decodes one inserted row into an event. The event's strings and payload copy the
// tuple's bytes, which pglogrepl allocated for this message alone.
func (l *layout) event(tuple *pglogrepl.TupleData) (envelope.Event, error) {
	var e envelope.Event
	if tuple == nil || len(tuple.Columns) != l.n {
		return e, fmt.Errorf("tuple has %d columns, the relation %d", len(tupleColumns(tuple)), l.n)
	}
	raw := func(i int) []byte {
		if l.pos[i] < 0 {
			return nil
		}
		c := tuple.Columns[l.pos[i]]
		if c.DataType != pglogrepl.TupleDataTypeBinary {
			return nil
		}
		return c.Data
	}
	present := func(i int) bool { return raw(i) != nil }
	str := func(i int) *string {
		if !present(i) {
			return nil
		}
		s := string(raw(i))
		return &s
	}
	var errs []error
	int8 := func(i int) *int64 {
		b := raw(i)
		if b == nil {
			return nil
		}
		if len(b) != 8 {
			errs = append(errs, fmt.Errorf("column %s: %d bytes, want 8", columns[i].name, len(b)))
			return nil
		}
		v := int64(binary.BigEndian.Uint64(b))
		return &v
	}
	uuid := func(i int) *envelope.UUID {
		b := raw(i)
		if b == nil {
			return nil
		}
		if len(b) != 16 {
			errs = append(errs, fmt.Errorf("column %s: %d bytes, want 16", columns[i].name, len(b)))
			return nil
		}
		u := envelope.UUID(b)
		return &u
	}
	for i, c := range columns {
		if c.required && !present(i) {
			errs = append(errs, fmt.Errorf("column %s is null", c.name))
		}
	}
	if len(errs) > 0 {
		return e, fmt.Errorf("decode keiro_outbox_log row: %v", errs)
	}
	e.MessageID = string(raw(colMessageID))
	e.Source = string(raw(colSource))
	e.Destination = string(raw(colDestination))
	e.Key = str(colMessageKey)
	e.EventType = string(raw(colEventType))
	if v := int8(colSchemaVersion); v != nil {
		e.SchemaVersion = *v
	}
	e.ContentType = string(raw(colContentType))
	registry, subject, fp := str(colSchemaRegistry), str(colSchemaSubject), str(colSchemaFingerprint)
	versionRef, schemaID := int8(colSchemaVersionRef), int8(colSchemaID)
	if registry != nil || subject != nil || fp != nil || versionRef != nil || schemaID != nil {
		e.SchemaRef = &envelope.SchemaRef{Registry: registry, Subject: subject, Version: versionRef, SchemaID: schemaID, Fingerprint: fp}
	}
	e.SourceEventID = uuid(colSourceEventID)
	e.SourceGlobalPosition = int8(colSourceGlobalPosition)
	e.CausationID, e.CorrelationID = uuid(colCausationID), uuid(colCorrelationID)
	if tp := str(colTraceparent); tp != nil {
		e.TraceContext = &envelope.TraceContext{Traceparent: *tp}
		if ts := str(colTracestate); ts != nil {
			e.TraceContext.Tracestate = *ts
		}
	}
	e.Payload = raw(colPayload) // pglogrepl's own copy
	if b := raw(colAttributes); b != nil {
		if len(b) < 1 || b[0] != 1 {
			errs = append(errs, fmt.Errorf("column attributes: unknown jsonb format version"))
		} else {
			e.Attributes = json.RawMessage(b[1:])
		}
	}
	if v := int8(colOccurredAt); v != nil {
		e.OccurredAt = pgEpoch.Add(time.Duration(*v) * time.Microsecond)
	}
	if len(errs) > 0 {
		return e, fmt.Errorf("decode keiro_outbox_log row %q: %v", e.MessageID, errs)
	}
	return e, nil
}

// tupleColumns returns the tuple's columns (none for a nil tuple).
func tupleColumns(t *pglogrepl.TupleData) []*pglogrepl.TupleDataColumn {
	if t == nil {
		return nil
	}
	return t.Columns
}

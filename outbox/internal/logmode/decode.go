package logmode

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

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
	pos   [numColumns]int // tuple position of each column
	field []int           // column of each tuple position; -1 for a column the engine does not read
	what  string          // what a tuple is, for errors: "keiro_outbox_log row" unless set
}

// newLayout checks a Relation message of keiro_outbox_log against the columns the engine
// reads and returns where each is. Extra columns are ignored.
func newLayout(rel *pglogrepl.RelationMessage) (*layout, error) {
	l := &layout{field: make([]int, len(rel.Columns))}
	for i := range l.pos {
		l.pos[i] = -1
	}
	for p := range l.field {
		l.field[p] = -1
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
			l.pos[i], l.field[p] = p, i
		}
	}
	for i, p := range l.pos {
		if p < 0 && columns[i].required {
			return nil, fmt.Errorf("%s.%s has no column %s; apply keiro's migrations", rel.Namespace, rel.RelationName, columns[i].name)
		}
	}
	return l, nil
}

// name is what the layout's tuples are, for errors.
func (l *layout) name() string {
	if l.what == "" {
		return "keiro_outbox_log row"
	}
	return l.what
}

// pgEpoch is the origin of PostgreSQL's timestamps.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// row is one decoded insert: its event and the Kafka record built from it, with everything
// both point to that fits in one allocation (the key, the trace context). A row lives while
// its record is in flight: franz-go holds the record until its promise ran, and the promise
// reads the event (its message id, its dead letter).
//
// A row whose record Kafka acknowledged is recycled (recycle), with its payload's buffer and
// its record's header slice: the payload's copy is most of what the stream allocates, and a
// stream that allocated it afresh for every row spent a share of its CPU collecting it. A row
// that is rejected, or whose record failed, is left to the collector: its dead letter, or the
// session's end, may still read it.
type row struct {
	ev  envelope.Event
	rec kgo.Record
	key string
	tc  envelope.TraceContext
	buf []byte // the payload's buffer, kept across recycling
}

// rowPool holds the recycled rows.
var rowPool = sync.Pool{New: func() any { return new(row) }}

// maxRecycledPayload is the largest payload buffer a recycled row keeps: a row that carried a
// larger payload is left to the collector, so that the pool holds no large buffers.
const maxRecycledPayload = 64 << 10

// newRow returns an empty row, recycled if one is.
func newRow() *row {
	r := rowPool.Get().(*row)
	buf, headers := r.buf, r.rec.Headers[:0]
	*r = row{buf: buf}
	r.rec.Headers = headers
	return r
}

// recycle makes r, whose record Kafka acknowledged and whose promise has run, reusable: nothing
// reads r, its event or its record afterwards (franz-go drops a record once its promise ran).
func (r *row) recycle() {
	if cap(r.buf) > maxRecycledPayload {
		return
	}
	rowPool.Put(r)
}

// The pgoutput tuple's column kinds (protocol "TupleData").
const (
	tupleNull      = 'n'
	tupleUnchanged = 'u' // an unchanged TOASTed value: never in an insert
	tupleText      = 't'
	tupleBinary    = 'b'
)

// row decodes the TupleData of an Insert message of the layout's relation (tuple: the bytes
// after the message's 'N'), as pgoutput sends it with binary 'true'. tuple may be the
// connection's read buffer: every byte the row keeps is copied, in four allocations besides
// the row (the text columns in one string, the payload, the key and attributes in one slice),
// instead of pglogrepl's one per column and its copies turned into strings again.
func (l *layout) row(tuple []byte) (*row, error) {
	var c cols
	if err := l.split(tuple, &c.raw); err != nil {
		return nil, err
	}
	// From here on the tuple is whole: a column value that does not make an event (a
	// required column null or not binary, a value of the wrong size, an occurred_at of
	// infinity) is that row's failure, reported with what could be decoded (badRowError).
	for i, col := range columns {
		if col.required && c.raw[i] == nil {
			c.errs = append(c.errs, fmt.Errorf("column %s is null", col.name))
		}
	}
	c.cutText()
	r := newRow()
	c.event(r)
	c.bytes(r)
	if len(c.errs) > 0 {
		e := &r.ev
		return nil, &badRowError{r: r, err: fmt.Errorf("decode %s %q of source %q: %w", l.name(), e.MessageID, e.Source, errors.Join(c.errs...))}
	}
	return r, nil
}

// split cuts tuple into its columns' binary values, in raw by column (nil when null,
// absent or not binary). An error means the tuple itself is broken: the stream's failure.
func (l *layout) split(tuple []byte, raw *[numColumns][]byte) error {
	if len(tuple) < 2 {
		return fmt.Errorf("tuple of %d bytes has no column count", len(tuple))
	}
	n := int(binary.BigEndian.Uint16(tuple))
	if n != len(l.field) {
		return fmt.Errorf("tuple has %d columns, the relation %d", n, len(l.field))
	}
	p := 2
	for i := range n {
		if p >= len(tuple) {
			return fmt.Errorf("tuple ends before column %d of %d", i+1, n)
		}
		kind := tuple[p]
		p++
		var v []byte
		switch kind {
		case tupleNull, tupleUnchanged:
		case tupleText, tupleBinary:
			if len(tuple)-p < 4 {
				return fmt.Errorf("tuple ends in the length of column %d", i+1)
			}
			size := int(binary.BigEndian.Uint32(tuple[p:]))
			p += 4
			if size < 0 || size > len(tuple)-p {
				return fmt.Errorf("column %d: %d bytes, the tuple has %d left", i+1, size, len(tuple)-p)
			}
			v = tuple[p : p+size : p+size]
			p += size
		default:
			return fmt.Errorf("column %d: unknown tuple data kind %q", i+1, kind)
		}
		if f := l.field[i]; f >= 0 && kind == tupleBinary {
			raw[f] = v
		}
	}
	return nil
}

// cols are one tuple's column values on their way into a row: raw, the text columns cut
// from one string (str), and the problems met (errs).
type cols struct {
	raw  [numColumns][]byte
	str  [numColumns]string
	errs []error
}

// textCols are the text columns, copied into one string that the event's strings are cut
// from.
var textCols = [...]int{colMessageID, colSource, colDestination, colMessageKey, colEventType, colContentType,
	colSchemaRegistry, colSchemaSubject, colSchemaFingerprint, colTraceparent, colTracestate}

// cutText copies the text columns into one string and cuts str from it.
func (c *cols) cutText() {
	size := 0
	for _, i := range textCols {
		size += len(c.raw[i])
	}
	var sb strings.Builder
	sb.Grow(size)
	for _, i := range textCols {
		sb.Write(c.raw[i])
	}
	text := sb.String()
	off := 0
	for _, i := range textCols {
		c.str[i] = text[off : off+len(c.raw[i])]
		off += len(c.raw[i])
	}
}

// strPtr is text column i, nil when null; for the rare columns: an allocation each.
func (c *cols) strPtr(i int) *string {
	if c.raw[i] == nil {
		return nil
	}
	s := c.str[i]
	return &s
}

// int8 is bigint column i; false when null or of the wrong size (a problem then).
func (c *cols) int8(i int) (int64, bool) {
	b := c.raw[i]
	if b == nil {
		return 0, false
	}
	if len(b) != 8 {
		c.errs = append(c.errs, fmt.Errorf("column %s: %d bytes, want 8", columns[i].name, len(b)))
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(b)), true
}

// int8Ptr is bigint column i, nil when null; for the optional columns: an allocation each.
func (c *cols) int8Ptr(i int) *int64 {
	v, ok := c.int8(i)
	if !ok {
		return nil
	}
	p := new(int64)
	*p = v
	return p
}

// uuid is uuid column i, nil when null or of the wrong size (a problem then).
func (c *cols) uuid(i int) *envelope.UUID {
	b := c.raw[i]
	if b == nil {
		return nil
	}
	if len(b) != 16 {
		c.errs = append(c.errs, fmt.Errorf("column %s: %d bytes, want 16", columns[i].name, len(b)))
		return nil
	}
	u := envelope.UUID(b)
	return &u
}

// event fills r's event from the columns, all but its bytes.
func (c *cols) event(r *row) {
	str := &c.str
	e := &r.ev
	e.MessageID, e.Source, e.Destination = str[colMessageID], str[colSource], str[colDestination]
	e.EventType, e.ContentType = str[colEventType], str[colContentType]
	e.SchemaVersion, _ = c.int8(colSchemaVersion)
	registry, subject, fp := c.strPtr(colSchemaRegistry), c.strPtr(colSchemaSubject), c.strPtr(colSchemaFingerprint)
	versionRef, schemaID := c.int8Ptr(colSchemaVersionRef), c.int8Ptr(colSchemaID)
	if registry != nil || subject != nil || fp != nil || versionRef != nil || schemaID != nil {
		e.SchemaRef = &envelope.SchemaRef{Registry: registry, Subject: subject, Version: versionRef, SchemaID: schemaID, Fingerprint: fp}
	}
	e.SourceEventID = c.uuid(colSourceEventID)
	e.SourceGlobalPosition = c.int8Ptr(colSourceGlobalPosition)
	e.CausationID, e.CorrelationID = c.uuid(colCausationID), c.uuid(colCorrelationID)
	if c.raw[colTraceparent] != nil {
		r.tc = envelope.TraceContext{Traceparent: str[colTraceparent], Tracestate: str[colTracestate]}
		e.TraceContext = &r.tc
	}
	if v, ok := c.int8(colOccurredAt); ok {
		switch v {
		case math.MaxInt64:
			c.errs = append(c.errs, errors.New("column occurred_at is infinity, which no event can carry"))
		case math.MinInt64:
			c.errs = append(c.errs, errors.New("column occurred_at is -infinity, which no event can carry"))
		default:
			e.OccurredAt = pgTime(v)
		}
	}
}

// bytes fills r's bytes: the payload in a buffer of its own (it is most of the row; a
// recycled row's buffer when it is large enough), the key's bytes (the record's key) and the
// attributes in one more allocation.
func (c *cols) bytes(r *row) {
	e := &r.ev
	payload := c.raw[colPayload]
	buf := r.buf
	if buf == nil || cap(buf) < len(payload) {
		buf = make([]byte, 0, len(payload)) // never nil: a nil value would be a tombstone
	}
	e.Payload = append(buf[:0], payload...)
	r.buf = e.Payload
	attrs := c.raw[colAttributes]
	if attrs != nil {
		if len(attrs) < 1 || attrs[0] != 1 {
			c.errs = append(c.errs, fmt.Errorf("column attributes: unknown jsonb format version"))
			attrs = nil
		} else {
			attrs = attrs[1:]
		}
	}
	if key, n := c.raw[colMessageKey], len(c.raw[colMessageKey])+len(attrs); n > 0 || key != nil || attrs != nil {
		b := make([]byte, 0, n)
		b = append(b, key...)
		if key != nil {
			r.key = c.str[colMessageKey]
			e.Key = &r.key
			r.rec.Key = b[:len(key):len(key)]
		}
		if attrs != nil {
			e.Attributes = json.RawMessage(append(b, attrs...)[len(key):])
		}
	}
}

// badRowError is a row whose tuple is whole but whose column values do not make an event: the
// row's failure, not the stream's. r holds what was decoded (the columns that failed are
// zero), for the row's dead letter.
type badRowError struct {
	r   *row
	err error
}

func (e *badRowError) Error() string { return e.err.Error() }

func (e *badRowError) Unwrap() error { return e.err }

// pgEpochUnix is pgEpoch in Unix seconds.
const pgEpochUnix = 946_684_800

// pgTime is the time of a timestamptz in pgoutput's binary form (microseconds since pgEpoch),
// exact over PostgreSQL's whole range (a time.Duration holds only 292 years).
func pgTime(us int64) time.Time {
	sec, frac := us/1_000_000, us%1_000_000
	if frac < 0 {
		sec, frac = sec-1, frac+1_000_000
	}
	return time.Unix(pgEpochUnix+sec, frac*1000).UTC()
}

// Package logmsg is the format of the outbox events that Store.EmitTx writes as transactional
// logical decoding messages (pg_logical_emit_message), and that the log-mode engine decodes
// from the slot beside keiro_outbox_log's inserts.
//
// A message's prefix names the outbox's schema (Prefix), so that relays of other schemas
// ignore it. Its content is one event: a format byte (Version), then the event's columns in
// the order of Columns, encoded exactly as pgoutput sends a row of keiro_outbox_log with
// binary 'true' (TupleData: a column count, then per column 'n' for NULL or 'b', a 32-bit
// length and PostgreSQL's binary send format of the value). So the engine decodes a message's
// event with the decoder of the table's rows: one row codec for both. A new format takes the
// next version byte; the engine dead-letters a version it does not know.
package logmsg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/keiro-go/keiro/envelope"
)

// PrefixBase is the start of every prefix: the prefix of schema s is PrefixBase + s.
const PrefixBase = "keiro.outbox:"

// Prefix is the prefix of the messages of schema's outbox.
func Prefix(schema string) string { return PrefixBase + schema }

// Version is the format byte EmitTx writes first: the event as a binary TupleData of Columns.
const Version byte = 1

// The PostgreSQL type OIDs of the columns, as pgoutput's Relation message names them.
const (
	OIDBytea       = 17
	OIDInt8        = 20
	OIDText        = 25
	OIDTimestamptz = 1184
	OIDUUID        = 2950
	OIDJSONB       = 3802
)

// Column is a column of the content: its name in keiro_outbox_log and its type.
type Column struct {
	Name string
	OID  uint32
}

// Columns are the content's columns, in their order: keiro_outbox_log's columns of the event,
// without the outbox id (an emitted event has no row).
var Columns = [...]Column{
	{"message_id", OIDText}, {"source", OIDText}, {"destination", OIDText}, {"message_key", OIDText},
	{"event_type", OIDText}, {"schema_version", OIDInt8}, {"content_type", OIDText},
	{"schema_registry", OIDText}, {"schema_subject", OIDText}, {"schema_version_ref", OIDInt8},
	{"schema_id", OIDInt8}, {"schema_fingerprint", OIDText}, {"source_event_id", OIDUUID},
	{"source_global_position", OIDInt8}, {"causation_id", OIDUUID}, {"correlation_id", OIDUUID},
	{"traceparent", OIDText}, {"tracestate", OIDText}, {"payload_bytes", OIDBytea},
	{"attributes", OIDJSONB}, {"occurred_at", OIDTimestamptz},
}

// pgEpochMicros is 2000-01-01 UTC, PostgreSQL's timestamp origin, in Unix microseconds.
const pgEpochMicros = 946_684_800 * 1_000_000

// Size is an upper bound of the content of e: what Append adds.
func Size(e *envelope.Event, tc *envelope.TraceContext) int {
	n := 1 + 2 + len(Columns)*5 + len(e.MessageID) + len(e.Source) + len(e.Destination) + len(e.EventType) +
		len(e.ContentType) + len(e.Payload) + len(e.Attributes) + 1 + 8*5 + 16*3
	if e.Key != nil {
		n += len(*e.Key)
	}
	if r := e.SchemaRef; r != nil {
		n += strLen(r.Registry) + strLen(r.Subject) + strLen(r.Fingerprint)
	}
	if tc != nil {
		n += len(tc.Traceparent) + len(tc.Tracestate)
	}
	return n
}

func strLen(s *string) int {
	if s == nil {
		return 0
	}
	return len(*s)
}

// Append appends the content of event e, with trace context tc (e's own or the caller's span's;
// nil: none), to dst. e must be valid (envelope.Event.Validate).
func Append(dst []byte, e *envelope.Event, tc *envelope.TraceContext) []byte {
	dst = append(dst, Version)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(Columns)))
	var ref envelope.SchemaRef
	if e.SchemaRef != nil {
		ref = *e.SchemaRef
	}
	dst = text(dst, e.MessageID)
	dst = text(dst, e.Source)
	dst = text(dst, e.Destination)
	dst = textPtr(dst, e.Key)
	dst = text(dst, e.EventType)
	dst = bigint(dst, e.SchemaVersion)
	dst = text(dst, e.ContentType)
	dst = textPtr(dst, ref.Registry)
	dst = textPtr(dst, ref.Subject)
	dst = bigintPtr(dst, ref.Version)
	dst = bigintPtr(dst, ref.SchemaID)
	dst = textPtr(dst, ref.Fingerprint)
	dst = uuid(dst, e.SourceEventID)
	dst = bigintPtr(dst, e.SourceGlobalPosition)
	dst = uuid(dst, e.CausationID)
	dst = uuid(dst, e.CorrelationID)
	if tc != nil && tc.Traceparent != "" {
		dst = text(dst, tc.Traceparent)
		if tc.Tracestate != "" {
			dst = text(dst, tc.Tracestate)
		} else {
			dst = append(dst, 'n')
		}
	} else {
		dst = append(dst, 'n', 'n')
	}
	dst = value(dst, e.Payload)
	if e.Attributes != nil {
		// jsonb's binary send format: a version byte (1), then the JSON text.
		dst = append(dst, 'b')
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(e.Attributes)+1))
		dst = append(dst, 1)
		dst = append(dst, e.Attributes...)
	} else {
		dst = append(dst, 'n')
	}
	return bigint(dst, micros(e.OccurredAt))
}

// micros is t in PostgreSQL's timestamptz: microseconds since 2000-01-01 UTC, truncated as
// PostgreSQL stores it.
func micros(t time.Time) int64 {
	us := t.Unix()*1_000_000 + int64(t.Nanosecond()/1000)
	return us - pgEpochMicros
}

func value(dst, v []byte) []byte {
	dst = append(dst, 'b')
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(v)))
	return append(dst, v...)
}

func text(dst []byte, s string) []byte {
	dst = append(dst, 'b')
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(s)))
	return append(dst, s...)
}

func textPtr(dst []byte, s *string) []byte {
	if s == nil {
		return append(dst, 'n')
	}
	return text(dst, *s)
}

func bigint(dst []byte, v int64) []byte {
	dst = append(dst, 'b', 0, 0, 0, 8)
	return binary.BigEndian.AppendUint64(dst, uint64(v))
}

func bigintPtr(dst []byte, v *int64) []byte {
	if v == nil {
		return append(dst, 'n')
	}
	return bigint(dst, *v)
}

func uuid(dst []byte, u *envelope.UUID) []byte {
	if u == nil {
		return append(dst, 'n')
	}
	dst = append(dst, 'b', 0, 0, 0, 16)
	return append(dst, u[:]...)
}

// ErrUnknownVersion reports a content whose format byte this relay does not know: a newer
// producer's, or not EmitTx's at all.
var ErrUnknownVersion = errors.New("unknown format version")

// Tuple returns the TupleData of content, after its format byte; an error if the content is
// empty or of another format.
func Tuple(content []byte) ([]byte, error) {
	if len(content) == 0 {
		return nil, errors.New("empty content, no format version")
	}
	if content[0] != Version {
		return nil, fmt.Errorf("%w %d (this relay reads version %d)", ErrUnknownVersion, content[0], Version)
	}
	return content[1:], nil
}

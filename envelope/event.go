package envelope

import (
	"encoding/json"
	"time"
)

// Event is an integration event: the unit the outbox publishes and the inbox receives. It
// carries every field of keiro's IntegrationEvent, and travels as a Kafka record whose key is
// Key, whose value is Payload and whose headers are produced by [Event.Headers].
type Event struct {
	// MessageID is the application-level identity of the message, stable across publish
	// retries. Required; at most [MaxMessageIDLen] bytes.
	MessageID string
	// Source is the producing bounded context, for example "ordering". Required.
	Source string
	// Destination is the Kafka topic, conventionally versioned ("billing.orders.v1"). Required;
	// it must be a legal Kafka topic name.
	Destination string
	// Key is the Kafka partition key. Nil means no key: the event is not ordered relative to
	// any other event.
	Key *string
	// EventType is the public event type, for example "OrderPlaced". Required.
	EventType string
	// SchemaVersion is the version of the payload's schema.
	SchemaVersion int64
	// ContentType is the payload's media type, kept verbatim ("application/json",
	// "application/vnd.apache.avro+binary", ...). Required. See [IsJSONContentType].
	ContentType string
	// SchemaRef points at the payload's schema in a registry. Nil when no sub-field is set.
	SchemaRef *SchemaRef
	// SourceEventID is the id of the private event that produced this one, if any.
	SourceEventID *UUID
	// SourceGlobalPosition is the global log position of that private event, if any.
	SourceGlobalPosition *int64
	// Payload is the opaque payload, sent as the Kafka record value.
	Payload []byte
	// OccurredAt is when the fact happened (UTC).
	OccurredAt time.Time
	// CausationID is the id of the message that caused this one, if any.
	CausationID *UUID
	// CorrelationID groups the messages of one business flow, if any.
	CorrelationID *UUID
	// TraceContext is the W3C trace context the event continues, if any.
	TraceContext *TraceContext
	// Attributes is free-form JSON. Nil means absent.
	Attributes json.RawMessage
}

// SchemaRef points at a payload schema in a schema registry. Every field is optional.
type SchemaRef struct {
	// Registry names the registry (a logical name or URL).
	Registry *string
	// Subject is the registry subject.
	Subject *string
	// Version is the subject version.
	Version *int64
	// SchemaID is the registry's global schema id.
	SchemaID *int64
	// Fingerprint is the schema's fingerprint (for Avro, the canonical-form fingerprint).
	Fingerprint *string
}

// TraceContext is a W3C trace context as carried in the traceparent and tracestate headers.
type TraceContext struct {
	// Traceparent is the W3C traceparent value.
	Traceparent string
	// Tracestate is the W3C tracestate value; empty means absent.
	Tracestate string
}

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Record is the part of a consumed Kafka record that decoding needs.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	// Timestamp is the record's timestamp; it stands in for OccurredAt when the
	// keiro-occurred-at header is absent.
	Timestamp time.Time
}

// The canonical header names, in emission order (keiro's integrationHeaders).
const (
	HeaderMessageID            = "keiro-message-id"
	HeaderSource               = "keiro-source"
	HeaderDestination          = "keiro-destination"
	HeaderEventType            = "keiro-event-type"
	HeaderSchemaVersion        = "keiro-schema-version"
	HeaderContentType          = "content-type"
	HeaderSchemaRegistry       = "keiro-schema-registry"
	HeaderSchemaSubject        = "keiro-schema-subject"
	HeaderSchemaVersionRef     = "keiro-schema-version-ref"
	HeaderSchemaID             = "keiro-schema-id"
	HeaderSchemaFingerprint    = "keiro-schema-fingerprint"
	HeaderSourceEventID        = "keiro-source-event-id"
	HeaderSourceGlobalPosition = "keiro-source-global-position"
	HeaderCausationID          = "keiro-causation-id"
	HeaderCorrelationID        = "keiro-correlation-id"
	HeaderTraceparent          = "traceparent"
	HeaderTracestate           = "tracestate"
	HeaderOccurredAt           = "keiro-occurred-at"
	HeaderAttributes           = "keiro-attributes"
)

// HeaderNames lists the 19 canonical header names in emission order.
var HeaderNames = [...]string{
	HeaderMessageID, HeaderSource, HeaderDestination, HeaderEventType, HeaderSchemaVersion,
	HeaderContentType, HeaderSchemaRegistry, HeaderSchemaSubject, HeaderSchemaVersionRef,
	HeaderSchemaID, HeaderSchemaFingerprint, HeaderSourceEventID, HeaderSourceGlobalPosition,
	HeaderCausationID, HeaderCorrelationID, HeaderTraceparent, HeaderTracestate,
	HeaderOccurredAt, HeaderAttributes,
}

// ContentTypeJSON is the content type of JSON payloads.
const ContentTypeJSON = "application/json"

// MaxMessageIDLen bounds MessageID, in bytes.
const MaxMessageIDLen = 256

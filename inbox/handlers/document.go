package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/keiro-go/keiro/envelope"
)

// PayloadEncodingBase64 is the value of the document's "payload_encoding" field when the payload
// is not JSON and is carried as base64 text.
const PayloadEncodingBase64 = "base64"

// PayloadDecoder turns a non-JSON payload (for example Confluent-framed Avro) into JSON for the
// document. It returns (nil, nil) when it does not handle the event's content type; the payload
// is then carried as base64. An error it returns is treated like a handler error: wrap it with
// inbox.Permanent when the bytes can never be decoded, leave it plain when the cause is
// transient (the schema registry is unreachable).
type PayloadDecoder func(ctx context.Context, ev envelope.Event) (json.RawMessage, error)

// Document is the JSON shape in which both handler modes hand an event over. Field names are
// snake_case and stable; absent optional values are null.
type Document struct {
	MessageID     string          `json:"message_id"`
	Source        string          `json:"source"`
	Destination   string          `json:"destination"`
	Key           *string         `json:"key"`
	EventType     string          `json:"event_type"`
	SchemaVersion int64           `json:"schema_version"`
	ContentType   string          `json:"content_type"`
	OccurredAt    time.Time       `json:"occurred_at"`
	SourceEventID *string         `json:"source_event_id"`
	CausationID   *string         `json:"causation_id"`
	CorrelationID *string         `json:"correlation_id"`
	Attributes    json.RawMessage `json:"attributes"`
	// Payload is the event's payload: embedded JSON when the content type is JSON (or a
	// [PayloadDecoder] produced JSON), else a JSON string holding base64.
	Payload json.RawMessage `json:"payload"`
	// PayloadEncoding is "base64" when Payload is base64 text, else omitted.
	PayloadEncoding string `json:"payload_encoding,omitempty"`
}

// ErrInvalidJSONPayload reports an event whose content type says JSON but whose payload (or
// attributes) is not valid JSON. Handlers return it wrapped as permanent.
var ErrInvalidJSONPayload = errors.New("payload is not valid JSON")

// NewDocument builds the document for ev. decode may be nil. Non-JSON payloads that decode
// does not handle are carried as base64.
func NewDocument(ctx context.Context, ev envelope.Event, decode PayloadDecoder) (Document, error) {
	d := Document{
		MessageID:     ev.MessageID,
		Source:        ev.Source,
		Destination:   ev.Destination,
		Key:           ev.Key,
		EventType:     ev.EventType,
		SchemaVersion: ev.SchemaVersion,
		ContentType:   ev.ContentType,
		OccurredAt:    ev.OccurredAt.UTC(),
		SourceEventID: uuidString(ev.SourceEventID),
		CausationID:   uuidString(ev.CausationID),
		CorrelationID: uuidString(ev.CorrelationID),
	}
	if len(ev.Attributes) > 0 {
		if !json.Valid(ev.Attributes) {
			return Document{}, fmt.Errorf("attributes of message %q: %w", ev.MessageID, ErrInvalidJSONPayload)
		}
		d.Attributes = ev.Attributes
	}
	switch {
	case envelope.IsJSONContentType(ev.ContentType):
		if !json.Valid(ev.Payload) {
			return Document{}, fmt.Errorf("message %q with content type %q: %w", ev.MessageID, ev.ContentType, ErrInvalidJSONPayload)
		}
		d.Payload = ev.Payload
		return d, nil
	case decode != nil:
		js, err := decode(ctx, ev)
		if err != nil {
			return Document{}, fmt.Errorf("decode payload of message %q (content type %q): %w", ev.MessageID, ev.ContentType, err)
		}
		if js != nil {
			if !json.Valid(js) {
				return Document{}, fmt.Errorf("payload decoder for message %q returned invalid JSON", ev.MessageID)
			}
			d.Payload = js
			return d, nil
		}
	}
	b64, err := json.Marshal(ev.Payload) // []byte marshals as a base64 string
	if err != nil {
		return Document{}, fmt.Errorf("encode payload of message %q: %w", ev.MessageID, err)
	}
	d.Payload = b64
	d.PayloadEncoding = PayloadEncodingBase64
	return d, nil
}

// MarshalDocument builds the document for ev and encodes it as JSON.
func MarshalDocument(ctx context.Context, ev envelope.Event, decode PayloadDecoder) ([]byte, error) {
	d, err := NewDocument(ctx, ev, decode)
	if err != nil {
		return nil, err
	}
	// json.Marshal would rewrite <, > and & inside the payload and attributes as \u003c, \u003e
	// and \u0026: the same JSON value, but not the producer's bytes, which a receiver that checks
	// a signature or a digest of the payload must see unchanged.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(d); err != nil {
		return nil, fmt.Errorf("encode document of message %q: %w", ev.MessageID, err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func uuidString(u *envelope.UUID) *string {
	if u == nil {
		return nil
	}
	s := u.String()
	return &s
}

package handlers

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
)

// PayloadEncodingBase64 is the value of the document's "payload_encoding" field when the payload
// is not JSON and is carried as base64 text, and of its "key_encoding" field when the key is not
// text (not valid UTF-8, or with a NUL byte: a binary key such as a Confluent-framed one).
const PayloadEncodingBase64 = "base64"

// PayloadDecoder turns a non-JSON payload (for example Confluent-framed Avro) into JSON for the
// document. It returns (nil, nil) when it does not handle the event's content type; the payload
// is then carried as base64. An error it returns is treated like a handler error: wrap it with
// inbox.Permanent when the bytes can never be decoded, with inbox.Outage when a dependency is
// down for every message (the schema registry is unreachable), and leave it plain otherwise
// (it uses an attempt).
type PayloadDecoder func(ctx context.Context, ev envelope.Event) (json.RawMessage, error)

// Document is the JSON shape in which both handler modes hand an event over. Field names are
// snake_case and stable; absent optional values are null.
type Document struct {
	MessageID   string `json:"message_id"`
	Source      string `json:"source"`
	Destination string `json:"destination"`
	// Key is the Kafka key: its text, or base64 when KeyEncoding is "base64".
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
	// KeyEncoding is "base64" when Key is the base64 of a key that is not text (not valid
	// UTF-8, or with a NUL byte, which JSON cannot carry unchanged or PostgreSQL's jsonb
	// refuses), else omitted.
	KeyEncoding string `json:"key_encoding,omitempty"`
}

// ErrInvalidJSONPayload reports an event whose content type says JSON but whose payload (or
// attributes) is not valid JSON (UTF-8 text, RFC 8259), or a PayloadDecoder that returned
// invalid JSON. [NewDocument] returns it wrapped as permanent: the same event always fails so.
var ErrInvalidJSONPayload = errors.New("payload is not valid JSON")

// ErrInvalidUTF8 reports an event with a text field (message id, source, destination, event
// type or content type) that is not valid UTF-8, which a JSON document cannot carry unchanged
// (encoding/json would replace the bytes with U+FFFD, and the receiver would see another id).
// [MarshalDocument] returns it wrapped as permanent. (A key that is not text travels as base64,
// see [Document].KeyEncoding.)
var ErrInvalidUTF8 = errors.New("not valid UTF-8")

// NewDocument builds the document for ev. decode may be nil. Non-JSON payloads that decode
// does not handle are carried as base64. A payload or attributes that are not valid JSON are
// a permanent [ErrInvalidJSONPayload]; decode's errors keep their class.
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
	if ev.Key != nil && !isText(*ev.Key) {
		k := base64.StdEncoding.EncodeToString([]byte(*ev.Key))
		d.Key, d.KeyEncoding = &k, PayloadEncodingBase64
	}
	if len(ev.Attributes) > 0 {
		if !validJSON(ev.Attributes) {
			return Document{}, inbox.Permanent(fmt.Errorf("attributes of message %q: %w", ev.MessageID, ErrInvalidJSONPayload))
		}
		d.Attributes = ev.Attributes
	}
	switch {
	case envelope.IsJSONContentType(ev.ContentType):
		if !validJSON(ev.Payload) {
			return Document{}, inbox.Permanent(fmt.Errorf("message %q with content type %q: %w", ev.MessageID, ev.ContentType, ErrInvalidJSONPayload))
		}
		d.Payload = ev.Payload
		return d, nil
	case decode != nil:
		js, err := decode(ctx, ev)
		if err != nil {
			return Document{}, fmt.Errorf("decode payload of message %q (content type %q): %w", ev.MessageID, ev.ContentType, err)
		}
		if js != nil {
			if !validJSON(js) {
				return Document{}, inbox.Permanent(fmt.Errorf("payload decoder for message %q (content type %q): %w", ev.MessageID, ev.ContentType, ErrInvalidJSONPayload))
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

// MarshalDocument builds the document for ev and encodes it as JSON. Besides NewDocument's
// errors, a text field that is not valid UTF-8 is a permanent [ErrInvalidUTF8].
func MarshalDocument(ctx context.Context, ev envelope.Event, decode PayloadDecoder) ([]byte, error) {
	if err := checkDocumentText(ev); err != nil {
		return nil, err
	}
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

// validJSON reports whether b is JSON text: valid JSON and valid UTF-8 (json.Valid accepts
// invalid UTF-8 inside strings).
func validJSON(b []byte) bool { return json.Valid(b) && utf8.Valid(b) }

// isText reports whether a key can travel as a JSON string unchanged, everywhere the document
// goes: valid UTF-8 without a NUL byte (PostgreSQL's jsonb refuses \u0000).
func isText(k string) bool { return utf8.ValidString(k) && strings.IndexByte(k, 0) < 0 }

// checkDocumentText returns a permanent [ErrInvalidUTF8] naming the first text field of ev
// (besides the key, see [Document].KeyEncoding) that a JSON document cannot carry unchanged.
func checkDocumentText(ev envelope.Event) error {
	fields := [...]struct{ name, v string }{
		{"message id", ev.MessageID}, {"source", ev.Source}, {"destination", ev.Destination},
		{"event type", ev.EventType}, {"content type", ev.ContentType},
	}
	for _, f := range fields {
		if err := checkUTF8(ev, f.name, f.v); err != nil {
			return err
		}
	}
	return nil
}

// checkUTF8 returns a permanent [ErrInvalidUTF8] when v, the field name of ev, is not UTF-8.
func checkUTF8(ev envelope.Event, name, v string) error {
	if utf8.ValidString(v) {
		return nil
	}
	i := 0
	for i < len(v) {
		r, n := utf8.DecodeRuneInString(v[i:])
		if r == utf8.RuneError && n <= 1 {
			break
		}
		i += n
	}
	return inbox.Permanent(fmt.Errorf("%s of message %q is %w (byte %d is %#02x): a JSON document cannot carry it unchanged; correct the producer",
		name, ev.MessageID, ErrInvalidUTF8, i, v[i]))
}

func uuidString(u *envelope.UUID) *string {
	if u == nil {
		return nil
	}
	s := u.String()
	return &s
}

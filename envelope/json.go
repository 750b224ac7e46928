package envelope

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Errors of [DecodeJSON], in the order keiro's decodeJsonIntegrationEvent checks for them.
var (
	// ErrUnsupportedContentType: the event's content type is not JSON.
	ErrUnsupportedContentType = errors.New("unsupported content type")
	// ErrMalformedPayload: the payload is not valid JSON.
	ErrMalformedPayload = errors.New("malformed payload")
	// ErrDecodeFailed: the payload is JSON but does not fit the target value.
	ErrDecodeFailed = errors.New("decode failed")
)

// IsJSON reports whether the event's content type names JSON (see [IsJSONContentType]).
func (e *Event) IsJSON() bool { return IsJSONContentType(e.ContentType) }

// DecodeJSON unmarshals the event's JSON payload into v. The error wraps, in keiro's order,
// [ErrUnsupportedContentType] when the content type is not JSON, [ErrMalformedPayload] when
// the payload is not JSON, and [ErrDecodeFailed] when the JSON does not fit v (a type
// mismatch; unlike Aeson, encoding/json does not fail on missing fields).
func DecodeJSON(e *Event, v any) error {
	if !e.IsJSON() {
		return fmt.Errorf("envelope: decode JSON payload of %q: %w %s", e.MessageID, ErrUnsupportedContentType, quoteBounded(e.ContentType))
	}
	if !json.Valid(e.Payload) {
		return fmt.Errorf("envelope: decode JSON payload of %q: %w", e.MessageID, ErrMalformedPayload)
	}
	if err := json.Unmarshal(e.Payload, v); err != nil {
		return fmt.Errorf("envelope: decode JSON payload of %q: %w: %w", e.MessageID, ErrDecodeFailed, err)
	}
	return nil
}

// EncodeJSON returns a copy of tpl whose payload is v marshalled as JSON and whose content
// type is [ContentTypeJSON] (keiro's encodeJsonIntegrationEvent).
func EncodeJSON(tpl Event, v any) (Event, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return Event{}, fmt.Errorf("envelope: encode JSON payload of %q: %w", tpl.MessageID, err)
	}
	tpl.ContentType = ContentTypeJSON
	tpl.Payload = b
	return tpl, nil
}

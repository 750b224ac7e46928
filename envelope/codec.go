package envelope

import "errors"

// EncodeOptions tunes [Event.AppendHeaders].
type EncodeOptions struct {
	// CloudEvents also emits the CloudEvents binary-mode headers (ce_id, ce_source, ce_type,
	// ce_specversion, ce_time) after the keiro headers. Defaults to false.
	CloudEvents bool
}

// Headers returns the event's Kafka headers in keiro's emission order.
func (e *Event) Headers() []Header { return e.AppendHeaders(nil, EncodeOptions{}) }

// AppendHeaders appends the event's Kafka headers to dst in keiro's emission order.
// TODO(envelope codec): implemented by the codec work.
func (e *Event) AppendHeaders(dst []Header, opts EncodeOptions) []Header { return dst }

// Decode decodes a consumed record into an Event, checking headers in keiro's order and
// returning the first problem as a *HeaderError.
// TODO(envelope codec): implemented by the codec work.
func Decode(r Record) (Event, error) { return Event{}, errors.New("envelope: Decode not implemented") }

// IsJSONContentType reports whether raw names JSON: the part before the first ';', trimmed
// and lowercased, equals "application/json".
func IsJSONContentType(raw string) bool { return false }

// Validate reports every problem with the event at once (joined), or nil.
func (e *Event) Validate() error { return nil }

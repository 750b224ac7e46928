package schema

import (
	"errors"
	"fmt"
)

// Sentinel errors. Decoding errors that can never succeed on retry (the bytes are wrong) match
// [ErrMalformedPayload] through errors.Is as well as their specific sentinel; the only
// retryable decoding error is [ErrRegistryUnavailable].
var (
	// ErrMalformedPayload matches every permanent decoding failure: a consumer should
	// dead-letter the message with the error's text as the reason.
	ErrMalformedPayload = errors.New("malformed Avro payload")
	// ErrWrongMagicByte means the payload does not start with the Confluent magic byte 0: it
	// was not written by a Schema Registry serializer (plain JSON, plain Avro, or another
	// framing).
	ErrWrongMagicByte = errors.New("wrong magic byte")
	// ErrTruncatedFrame means the payload is shorter than the 5-byte Confluent header.
	ErrTruncatedFrame = errors.New("truncated Confluent frame")
	// ErrUnknownSchemaID means the registry answered that the frame's schema id does not exist
	// (the message was written against another registry, or the schema was hard-deleted).
	ErrUnknownSchemaID = errors.New("unknown schema id")
	// ErrPayloadMismatch means the Avro body does not decode with its writer schema, or leaves
	// trailing bytes after the datum.
	ErrPayloadMismatch = errors.New("payload does not match its writer schema")

	// ErrRegistryUnavailable means the schema registry could not be reached (connection
	// refused, timeout, HTTP 5xx/429) or rejected our credentials (HTTP 401/403), after
	// retries, and the answer was not cached. It is retryable: nothing is lost by trying the
	// same message again later.
	ErrRegistryUnavailable = errors.New("schema registry unavailable")
	// ErrSubjectNotFound means the registry has no such subject, or no version of it matches
	// the schema looked up.
	ErrSubjectNotFound = errors.New("schema not registered under subject")
	// ErrIncompatibleSchema means the registry refused to register a schema because it breaks
	// the subject's compatibility rule (HTTP 409).
	ErrIncompatibleSchema = errors.New("schema incompatible with subject")
	// ErrInvalidSchema means the schema text is not a valid Avro schema, either locally or in
	// the registry's opinion (HTTP 422).
	ErrInvalidSchema = errors.New("invalid Avro schema")
	// ErrInvalidValue means a value given to [Serializer.Encode] does not match the writer
	// schema. It is the caller's bug, not the registry's.
	ErrInvalidValue = errors.New("value does not match the writer schema")
)

// DecodeError is a permanent failure to decode a framed Avro payload. It matches its Kind and
// [ErrMalformedPayload] with errors.Is, unwraps to the underlying cause, if any, and is marked
// permanent for the inbox (a Permanent method).
type DecodeError struct {
	// Kind is one of ErrWrongMagicByte, ErrTruncatedFrame, ErrUnknownSchemaID,
	// ErrPayloadMismatch.
	Kind error
	// SchemaID is the frame's schema id; -1 when the header could not be read.
	SchemaID int
	// Detail says what was wrong and what to do about it.
	Detail string
	// Err is the underlying cause (goavro's or the registry's error), if any.
	Err error
}

// Error implements error.
func (e *DecodeError) Error() string {
	s := "decode Avro payload: " + e.Kind.Error()
	if e.SchemaID >= 0 {
		s += fmt.Sprintf(" (schema id %d)", e.SchemaID)
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is reports whether target is the error's Kind or ErrMalformedPayload.
func (e *DecodeError) Is(target error) bool {
	return target == e.Kind || target == ErrMalformedPayload
}

// Unwrap returns the underlying cause.
func (e *DecodeError) Unwrap() error { return e.Err }

// Permanent reports true: the same bytes never decode. It is the marker inbox.IsPermanent (and
// events.IsPermanent) look for, so a DecodeError returned through the consumer's SchemaDecoder
// (EventHook) dead-letters its record instead of being retried forever.
func (e *DecodeError) Permanent() bool { return true }

// RegistryError is a failure talking to the schema registry. It matches Kind with errors.Is
// (ErrRegistryUnavailable, ErrSubjectNotFound, ErrUnknownSchemaID, ErrIncompatibleSchema,
// ErrInvalidSchema, or nil for an unclassified answer) and unwraps to the transport or HTTP
// error.
type RegistryError struct {
	// Op says what was being done ("fetch schema id 7", "look up subject orders-value").
	Op string
	// Kind classifies the failure; nil when unclassified.
	Kind error
	// Status is the HTTP status, 0 when no answer was received.
	Status int
	// Code is the registry's error code (40401, 40403, 409, 42201, ...), 0 if none.
	Code int
	// Err is the underlying error.
	Err error
}

// Error implements error.
func (e *RegistryError) Error() string {
	s := e.Op
	if e.Kind != nil {
		s += ": " + e.Kind.Error()
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is reports whether target is the error's Kind.
func (e *RegistryError) Is(target error) bool { return e.Kind != nil && target == e.Kind }

// Unwrap returns the underlying error.
func (e *RegistryError) Unwrap() error { return e.Err }

// IsRetryable reports whether err is worth retrying later: it matches ErrRegistryUnavailable
// (the registry could not be reached, or rejected our credentials, and the answer was not
// cached). Every other error from this package is permanent for the same input, except the
// caller's own context ending.
func IsRetryable(err error) bool {
	return errors.Is(err, ErrRegistryUnavailable)
}

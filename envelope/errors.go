package envelope

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// Sentinels for the kinds of [HeaderError], usable with errors.Is. They mirror keiro's
// KafkaDecodeError constructors.
var (
	// ErrMissingHeader: a required header is absent.
	ErrMissingHeader = errors.New("missing header")
	// ErrInvalidIntHeader: a header is not an optionally signed decimal integer.
	ErrInvalidIntHeader = errors.New("invalid integer header")
	// ErrInvalidUUIDHeader: a header is not a hyphenated UUID.
	ErrInvalidUUIDHeader = errors.New("invalid UUID header")
	// ErrInvalidTimeHeader: a header is not an ISO-8601 timestamp.
	ErrInvalidTimeHeader = errors.New("invalid time header")
	// ErrInvalidJSONHeader: a header is not valid JSON.
	ErrInvalidJSONHeader = errors.New("invalid JSON header")
)

// HeaderErrorKind classifies a [HeaderError].
type HeaderErrorKind int

// The kinds of [HeaderError], one per keiro KafkaDecodeError constructor.
const (
	// MissingHeader is keiro's MissingHeader name.
	MissingHeader HeaderErrorKind = iota + 1
	// InvalidIntHeader is keiro's InvalidIntHeader name raw.
	InvalidIntHeader
	// InvalidUUIDHeader is keiro's InvalidUuidHeader name raw.
	InvalidUUIDHeader
	// InvalidTimeHeader is keiro's InvalidTimeHeader name raw.
	InvalidTimeHeader
	// InvalidJSONHeader is keiro's InvalidJsonHeader name raw.
	InvalidJSONHeader
)

// sentinel returns the errors.Is target of k.
func (k HeaderErrorKind) sentinel() error {
	switch k {
	case MissingHeader:
		return ErrMissingHeader
	case InvalidIntHeader:
		return ErrInvalidIntHeader
	case InvalidUUIDHeader:
		return ErrInvalidUUIDHeader
	case InvalidTimeHeader:
		return ErrInvalidTimeHeader
	case InvalidJSONHeader:
		return ErrInvalidJSONHeader
	}
	return nil
}

// String returns the kind's keiro constructor name, for example "InvalidIntHeader".
func (k HeaderErrorKind) String() string {
	switch k {
	case MissingHeader:
		return "MissingHeader"
	case InvalidIntHeader:
		return "InvalidIntHeader"
	case InvalidUUIDHeader:
		return "InvalidUuidHeader"
	case InvalidTimeHeader:
		return "InvalidTimeHeader"
	case InvalidJSONHeader:
		return "InvalidJsonHeader"
	}
	return fmt.Sprintf("HeaderErrorKind(%d)", int(k))
}

// MaxErrorValueLen bounds the bytes of a header value quoted in a [HeaderError] message.
const MaxErrorValueLen = 64

// HeaderError reports why a record's headers do not decode. errors.Is(err, ErrMissingHeader)
// (and the other Err…Header sentinels) matches on Kind.
type HeaderError struct {
	// Kind says what is wrong.
	Kind HeaderErrorKind
	// Header is the offending header's name.
	Header string
	// Value is the offending raw value (empty for MissingHeader), kept in full.
	Value string
}

func newHeaderError(kind HeaderErrorKind, header string, value []byte) *HeaderError {
	return &HeaderError{Kind: kind, Header: header, Value: string(value)}
}

// Error names the header and quotes at most [MaxErrorValueLen] bytes of the bad value.
func (e *HeaderError) Error() string {
	if e.Kind == MissingHeader {
		return fmt.Sprintf("envelope: missing header %q", e.Header)
	}
	return fmt.Sprintf("envelope: %s %q: %s", e.Kind.sentinel(), e.Header, quoteBounded(e.Value))
}

// Is reports whether target is the sentinel of e's Kind.
func (e *HeaderError) Is(target error) bool {
	s := e.Kind.sentinel()
	return s != nil && target == s
}

// quoteBounded quotes s, cut to MaxErrorValueLen bytes on a rune boundary.
func quoteBounded(s string) string {
	if len(s) <= MaxErrorValueLen {
		return fmt.Sprintf("%q", s)
	}
	cut := MaxErrorValueLen
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q… (%d bytes)", s[:cut], len(s))
}

package envelope

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// MaxHeaderBytes bounds the total size of an event's keiro headers (names plus values, with
// the CloudEvents ones), well below Kafka's default 1 MiB message limit.
const MaxHeaderBytes = 64 << 10

// MaxTopicLen is the longest legal Kafka topic name.
const MaxTopicLen = 249

// Validate reports every problem with the event at once (joined with errors.Join, each naming
// the field), or nil. It checks: MessageID, Source, Destination, EventType and ContentType are
// non-empty; MessageID is at most [MaxMessageIDLen] bytes; Destination is a legal Kafka topic;
// SchemaVersion is not negative; text fields are valid UTF-8 (keiro's fields are Text, so a
// keiro consumer could not represent anything else); Attributes, when set, is valid JSON;
// OccurredAt is set and within years 0000–9999; TraceContext.Traceparent is W3C-shaped; and the
// headers total at most [MaxHeaderBytes].
func (e *Event) Validate() error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("envelope: "+format, args...))
	}
	required := func(field, v string) {
		if v == "" {
			add("%s is required", field)
		}
	}
	text := func(field, v string) {
		if !utf8.ValidString(v) {
			add("%s is not valid UTF-8", field)
		}
	}

	required("MessageID", e.MessageID)
	required("Source", e.Source)
	required("Destination", e.Destination)
	required("EventType", e.EventType)
	required("ContentType", e.ContentType)
	if len(e.MessageID) > MaxMessageIDLen {
		add("MessageID is %d bytes, longer than %d", len(e.MessageID), MaxMessageIDLen)
	}
	if e.Destination != "" {
		if err := ValidateTopic(e.Destination); err != nil {
			add("Destination %s: %w", quoteBounded(e.Destination), err)
		}
	}
	if e.SchemaVersion < 0 {
		add("SchemaVersion %d is negative", e.SchemaVersion)
	}
	text("MessageID", e.MessageID)
	text("Source", e.Source)
	text("EventType", e.EventType)
	text("ContentType", e.ContentType)
	if e.Key != nil {
		text("Key", *e.Key)
	}
	if r := e.SchemaRef; r != nil {
		if r.Registry != nil {
			text("SchemaRef.Registry", *r.Registry)
		}
		if r.Subject != nil {
			text("SchemaRef.Subject", *r.Subject)
		}
		if r.Fingerprint != nil {
			text("SchemaRef.Fingerprint", *r.Fingerprint)
		}
	}
	if e.Attributes != nil && !json.Valid(e.Attributes) {
		add("Attributes is not valid JSON")
	}
	if e.OccurredAt.IsZero() {
		add("OccurredAt is required")
	} else if y := e.OccurredAt.UTC().Year(); y < 0 || y > 9999 {
		add("OccurredAt year %d is outside 0000–9999", y)
	}
	if tc := e.TraceContext; tc != nil {
		if !validTraceparent(tc.Traceparent) {
			add("TraceContext.Traceparent %s is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)", quoteBounded(tc.Traceparent))
		}
		text("TraceContext.Tracestate", tc.Tracestate)
	}
	size := 0
	for _, h := range e.AppendHeaders(nil, EncodeOptions{CloudEvents: true}) {
		size += len(h.Key) + len(h.Value)
	}
	if size > MaxHeaderBytes {
		add("headers total %d bytes, more than %d", size, MaxHeaderBytes)
	}
	return errors.Join(errs...)
}

// ValidateTopic applies Kafka's topic name rules to t: 1–249 characters of [a-zA-Z0-9._-],
// not "." or "..". The error says what is wrong, without the name.
func ValidateTopic(t string) error {
	if t == "" {
		return errors.New("is empty")
	}
	if len(t) > MaxTopicLen {
		return fmt.Errorf("is %d characters, longer than Kafka's %d", len(t), MaxTopicLen)
	}
	if t == "." || t == ".." {
		return errors.New(`is not a legal Kafka topic ("." and ".." are reserved)`)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("is not a legal Kafka topic (byte %d %q; allowed: a-z A-Z 0-9 . _ -)", i, c)
		}
	}
	return nil
}

// validTraceparent reports whether s has the W3C Trace Context shape:
// version-traceid-parentid-flags as 2-32-16-2 lowercase hex digits, version not ff, trace and
// parent ids not all zero; version 00 is exactly 55 characters, later versions may append
// "-…" fields.
func validTraceparent(s string) bool {
	if len(s) < 55 || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return false
	}
	if len(s) > 55 && (s[:2] == "00" || s[55] != '-') {
		return false
	}
	hex := func(p string) (zero, ok bool) {
		zero = true
		for i := 0; i < len(p); i++ {
			c := p[i]
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false, false
			}
			if c != '0' {
				zero = false
			}
		}
		return zero, true
	}
	if _, ok := hex(s[0:2]); !ok || s[0:2] == "ff" {
		return false
	}
	if zero, ok := hex(s[3:35]); !ok || zero {
		return false
	}
	if zero, ok := hex(s[36:52]); !ok || zero {
		return false
	}
	_, ok := hex(s[53:55])
	return ok
}

package handlers

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
)

// FuzzNewDocument feeds arbitrary payloads, attributes and content types (bytes from Kafka)
// to the document builder: it must never panic, must either fail permanently with
// ErrInvalidJSONPayload or ErrInvalidUTF8 or produce valid JSON, and must carry the payload
// and the content type unchanged (embedded or base64).
func FuzzNewDocument(f *testing.F) {
	f.Add("application/json", []byte(`{"a":1}`), []byte(`{"t":"x"}`))
	f.Add("application/json; charset=utf-8", []byte(`[1, 2`), []byte(nil))
	f.Add("application/avro", []byte{0, 0, 0, 0, 1, 2}, []byte(`null`))
	f.Add("text/plain", []byte("\xff\xfe"), []byte(`{`))
	f.Fuzz(func(t *testing.T, contentType string, payload, attrs []byte) {
		ev := envelope.Event{MessageID: "m", Source: "s", ContentType: contentType, Payload: payload,
			Attributes: attrs, OccurredAt: time.Unix(0, 0)}
		b, err := MarshalDocument(context.Background(), ev, nil)
		if err != nil {
			if !errors.Is(err, ErrInvalidJSONPayload) && !errors.Is(err, ErrInvalidUTF8) || !inbox.IsPermanent(err) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		if !json.Valid(b) || !utf8.Valid(b) {
			t.Fatalf("invalid JSON document: %s", b)
		}
		var doc struct {
			ContentType     string          `json:"content_type"`
			Payload         json.RawMessage `json:"payload"`
			PayloadEncoding string          `json:"payload_encoding"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		if doc.ContentType != contentType {
			t.Fatalf("content type changed: %q → %q", contentType, doc.ContentType)
		}
		if doc.PayloadEncoding == PayloadEncodingBase64 {
			var s string
			if err := json.Unmarshal(doc.Payload, &s); err != nil {
				t.Fatal(err)
			}
			raw, err := base64.StdEncoding.DecodeString(s)
			if err != nil || !bytes.Equal(raw, payload) {
				t.Fatalf("base64 payload does not round-trip: %v", err)
			}
			return
		}
		var want, got bytes.Buffer
		if json.Compact(&want, payload) != nil || json.Compact(&got, doc.Payload) != nil || !bytes.Equal(want.Bytes(), got.Bytes()) {
			t.Fatalf("embedded payload changed: %q → %q", payload, doc.Payload)
		}
	})
}

// FuzzParseRetryAfter feeds arbitrary Retry-After values (bytes from the HTTP endpoint).
func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"0", "120", "-1", "Wed, 21 Oct 2015 07:28:00 GMT", "9999999999999999999", " 5 "} {
		f.Add(s)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		d := parseRetryAfter(v, now)
		if d < 0 || d > 24*time.Hour && !bytes.ContainsAny([]byte(v), ",:") {
			t.Fatalf("parseRetryAfter(%q) = %s", v, d)
		}
	})
}

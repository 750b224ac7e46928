package console

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"unicode/utf8"

	"github.com/keiro-go/keiro/envelope"
)

// Payload is a stored payload as the API and the pages show it: complete or a capped prefix.
type Payload struct {
	// Size is the payload's full size in bytes.
	Size int `json:"size"`
	// Truncated reports that only the first bytes are shown.
	Truncated bool `json:"truncated"`
	// JSON is the payload when it is complete, valid JSON.
	JSON json.RawMessage `json:"json,omitempty"`
	// Text is the payload (or its prefix) when it is UTF-8 text and not shown as JSON.
	Text string `json:"text,omitempty"`
	// Base64 is the payload (or its prefix) when it is binary (Avro, Protobuf…).
	Base64 string `json:"base64,omitempty"`
}

// newPayload describes the first bytes b of a size-byte payload.
func newPayload(b []byte, size int, contentType string) Payload {
	p := Payload{Size: size, Truncated: len(b) < size}
	switch {
	case !p.Truncated && envelope.IsJSONContentType(contentType) && json.Valid(b):
		p.JSON = json.RawMessage(b)
	case utf8.Valid(b) || (p.Truncated && utf8.Valid(trimPartialRune(b))):
		p.Text = string(b)
	default:
		p.Base64 = base64.StdEncoding.EncodeToString(b)
	}
	return p
}

// trimPartialRune drops a rune cut in half at the end of a prefix.
func trimPartialRune(b []byte) []byte {
	for i := 0; i < utf8.UTFMax && len(b) > 0; i++ {
		if utf8.Valid(b) {
			return b
		}
		b = b[:len(b)-1]
	}
	return b
}

// Display is what a page shows: JSON indented, text as is, binary as a hex dump.
func (p Payload) Display() string {
	switch {
	case p.JSON != nil:
		var out bytes.Buffer
		if err := json.Indent(&out, p.JSON, "", "  "); err == nil {
			return out.String()
		}
		return string(p.JSON)
	case p.Base64 != "":
		raw, _ := base64.StdEncoding.DecodeString(p.Base64)
		return hex.Dump(raw)
	}
	return p.Text
}

// Kind names how the payload is shown: "json", "text" or "binary".
func (p Payload) Kind() string {
	switch {
	case p.JSON != nil:
		return "json"
	case p.Base64 != "":
		return "binary"
	}
	return "text"
}

// Header is one Kafka header of a row, as published or received.
type Header struct {
	// Key is the header name.
	Key string `json:"key"`
	// Value is the header's value (UTF-8 text for every keiro header).
	Value string `json:"value"`
}

func headersOf(e *envelope.Event) []Header {
	hs := e.Headers()
	out := make([]Header, len(hs))
	for i, h := range hs {
		out[i] = Header{Key: h.Key, Value: string(h.Value)}
	}
	return out
}

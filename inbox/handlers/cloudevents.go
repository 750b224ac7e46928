package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/keiro-go/keiro/envelope"
)

// HTTP body formats of [HTTPConfig.Format].
const (
	// FormatKeiro POSTs keiro's JSON document ([Document]) as application/json.
	FormatKeiro = "keiro"
	// FormatCloudEventsStructured POSTs a CloudEvents 1.0 structured-mode event
	// (application/cloudevents+json): the attributes and the data in one JSON object.
	FormatCloudEventsStructured = "cloudevents-structured"
	// FormatCloudEventsBinary POSTs a CloudEvents 1.0 binary-mode event: the attributes as
	// ce-* HTTP headers, the data (the payload, or its JSON form from DecodePayload) as the
	// body with its own Content-Type.
	FormatCloudEventsBinary = "cloudevents-binary"
)

// ContentTypeCloudEventsJSON is the media type of a structured-mode CloudEvent.
const ContentTypeCloudEventsJSON = "application/cloudevents+json"

// validFormat reports whether f is a known HTTPConfig.Format ("" is FormatKeiro).
func validFormat(f string) bool {
	switch f {
	case "", FormatKeiro, FormatCloudEventsStructured, FormatCloudEventsBinary:
		return true
	}
	return false
}

// encodeRequest returns the request body of ev in format, its Content-Type and the extra
// headers it needs (the ce-* attributes in binary mode).
func encodeRequest(ctx context.Context, format string, ev envelope.Event, decode PayloadDecoder) ([]byte, string, http.Header, error) {
	if format != FormatCloudEventsStructured && format != FormatCloudEventsBinary {
		body, err := MarshalDocument(ctx, ev, decode)
		return body, envelope.ContentTypeJSON, nil, err
	}
	d, err := NewDocument(ctx, ev, decode)
	if err != nil {
		return nil, "", nil, err
	}
	base64Data := d.PayloadEncoding == "base64"
	if format == FormatCloudEventsBinary {
		h := http.Header{}
		h.Set("ce-specversion", envelope.CloudEventsSpecVersion)
		h.Set("ce-id", d.MessageID)
		h.Set("ce-source", d.Source)
		h.Set("ce-type", d.EventType)
		h.Set("ce-time", d.OccurredAt.Format(time.RFC3339Nano))
		if d.Key != nil {
			h.Set("ce-partitionkey", *d.Key)
		}
		if base64Data {
			return ev.Payload, ev.ContentType, h, nil // the payload's own bytes and media type
		}
		return d.Payload, envelope.ContentTypeJSON, h, nil
	}
	ce := map[string]any{
		"specversion": envelope.CloudEventsSpecVersion, "id": d.MessageID, "source": d.Source,
		"type": d.EventType, "time": d.OccurredAt.Format(time.RFC3339Nano),
	}
	if d.Key != nil {
		ce["partitionkey"] = *d.Key
	}
	if base64Data {
		var b64 string
		if err := json.Unmarshal(d.Payload, &b64); err != nil {
			return nil, "", nil, fmt.Errorf("encode CloudEvent data: %w", err)
		}
		ce["datacontenttype"], ce["data_base64"] = d.ContentType, b64
	} else {
		ce["datacontenttype"], ce["data"] = envelope.ContentTypeJSON, d.Payload
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(ce); err != nil {
		return nil, "", nil, fmt.Errorf("encode CloudEvent: %w", err)
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), ContentTypeCloudEventsJSON, nil, nil
}

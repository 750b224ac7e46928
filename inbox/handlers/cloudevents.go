package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"time"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
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

// ErrInvalidCloudEvent reports an event that a CloudEvents format cannot represent: an empty
// id, source or type (required attributes), or a content type that is not a media type (RFC
// 2046), which datacontenttype must be. The handler returns it wrapped as permanent.
var ErrInvalidCloudEvent = errors.New("event cannot be sent as a CloudEvent")

// ceAttr is a CloudEvents attribute sent as a ce-* header in binary mode, not yet encoded.
type ceAttr struct{ name, value string }

// encoded is an event's request body in a format, with what its header needs: the
// Content-Type (and where it comes from) and, in binary mode, the ce-* attributes. The header
// itself is built by [HTTP.requestHeader].
type encoded struct {
	body            []byte
	contentType     string // "" sends none
	contentTypeFrom string // the event field contentType comes from, "" when the handler's own
	ce              []ceAttr
}

// encodeRequest returns the request body of ev in format and what its header needs. Its errors
// for the event itself (invalid JSON, text that is not UTF-8, an event no CloudEvent can carry)
// are permanent.
func encodeRequest(ctx context.Context, format string, ev envelope.Event, decode PayloadDecoder) (encoded, error) {
	if format != FormatCloudEventsStructured && format != FormatCloudEventsBinary {
		body, err := MarshalDocument(ctx, ev, decode)
		return encoded{body: body, contentType: envelope.ContentTypeJSON}, err
	}
	if err := checkCloudEvent(ev); err != nil {
		return encoded{}, err
	}
	d, err := NewDocument(ctx, ev, decode)
	if err != nil {
		return encoded{}, err
	}
	base64Data := d.PayloadEncoding == PayloadEncodingBase64
	if base64Data {
		if err := checkMediaType(ev); err != nil {
			return encoded{}, err
		}
	}
	if format == FormatCloudEventsBinary {
		e := encoded{ce: []ceAttr{
			{"specversion", envelope.CloudEventsSpecVersion}, {"id", d.MessageID}, {"source", d.Source},
			{"type", d.EventType}, {"time", d.OccurredAt.Format(time.RFC3339Nano)},
		}}
		if ev.Key != nil {
			e.ce = append(e.ce, ceAttr{"partitionkey", *ev.Key}) // the raw key, percent-encoded
		}
		if base64Data {
			// The payload's own bytes and media type.
			e.body, e.contentType, e.contentTypeFrom = ev.Payload, ev.ContentType, "the event's content type"
			return e, nil
		}
		e.body, e.contentType = d.Payload, envelope.ContentTypeJSON
		return e, nil
	}
	if err := checkDocumentText(ev); err != nil {
		return encoded{}, err
	}
	if ev.Key != nil {
		// partitionkey is a String attribute: a key that is not UTF-8 cannot be one.
		if err := checkUTF8(ev, "key", *ev.Key); err != nil {
			return encoded{}, fmt.Errorf("%w (a binary key travels with the cloudevents-binary format, percent-encoded)", err)
		}
	}
	ce := map[string]any{
		"specversion": envelope.CloudEventsSpecVersion, "id": d.MessageID, "source": d.Source,
		"type": d.EventType, "time": d.OccurredAt.Format(time.RFC3339Nano),
	}
	if ev.Key != nil {
		ce["partitionkey"] = *ev.Key
	}
	if base64Data {
		var b64 string
		if err := json.Unmarshal(d.Payload, &b64); err != nil {
			return encoded{}, fmt.Errorf("encode CloudEvent data: %w", err)
		}
		ce["data_base64"] = b64
		if d.ContentType != "" {
			ce["datacontenttype"] = d.ContentType
		}
	} else {
		ce["datacontenttype"], ce["data"] = envelope.ContentTypeJSON, d.Payload
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(ce); err != nil {
		return encoded{}, fmt.Errorf("encode CloudEvent: %w", err)
	}
	return encoded{body: bytes.TrimRight(buf.Bytes(), "\n"), contentType: ContentTypeCloudEventsJSON}, nil
}

// checkCloudEvent returns a permanent [ErrInvalidCloudEvent] when ev lacks a required
// CloudEvents attribute.
func checkCloudEvent(ev envelope.Event) error {
	for _, a := range []ceAttr{{"id", ev.MessageID}, {"source", ev.Source}, {"type", ev.EventType}} {
		if a.value == "" {
			return inbox.Permanent(fmt.Errorf("message %q: %w: its %s is empty, and a CloudEvent requires id, source and type; send it with the keiro format or correct the producer",
				ev.MessageID, ErrInvalidCloudEvent, a.name))
		}
	}
	return nil
}

// checkMediaType returns a permanent [ErrInvalidCloudEvent] when ev's content type, sent as the
// CloudEvent's datacontenttype, is not a media type (an empty one is sent as none).
func checkMediaType(ev envelope.Event) error {
	if ev.ContentType == "" {
		return nil
	}
	if _, _, err := mime.ParseMediaType(ev.ContentType); err != nil {
		return inbox.Permanent(fmt.Errorf("message %q: %w: its content type %q is not a media type (%v), which a CloudEvent's datacontenttype must be; correct the producer",
			ev.MessageID, ErrInvalidCloudEvent, ev.ContentType, err))
	}
	return nil
}

package handlers

import (
	"context"
	"encoding/json"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/schema"
)

// AvroDecoder returns a [PayloadDecoder] that renders Confluent-framed Avro payloads
// ([schema.IsAvroContentType]) as JSON with d; other content types are left to the base64
// fallback. Payloads that can never decode (bad framing, unknown schema id, bytes that do not
// match the writer schema) are permanent; an unreachable registry is retried.
func AvroDecoder(d *schema.Deserializer) PayloadDecoder {
	return func(ctx context.Context, ev envelope.Event) (json.RawMessage, error) {
		if !schema.IsAvroContentType(ev.ContentType) {
			return nil, nil
		}
		js, err := d.DecodeJSON(ctx, ev.Payload)
		if err != nil {
			if schema.IsRetryable(err) {
				return nil, err
			}
			return nil, inbox.Permanent(err)
		}
		return js, nil
	}
}

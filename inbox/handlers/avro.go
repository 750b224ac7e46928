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
// match the writer schema) are permanent; an unreachable registry (or one that rejects the
// credentials) is an [inbox.Outage], down for every message, retried without using an attempt;
// a cancelled ctx (the consumer stopping) is returned as is.
func AvroDecoder(d *schema.Deserializer) PayloadDecoder {
	return func(ctx context.Context, ev envelope.Event) (json.RawMessage, error) {
		if !schema.IsAvroContentType(ev.ContentType) {
			return nil, nil
		}
		js, err := d.DecodeJSON(ctx, ev.Payload)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return nil, err
		case schema.IsRetryable(err):
			return nil, inbox.Outage(err)
		default:
			return nil, inbox.Permanent(err)
		}
		return js, nil
	}
}

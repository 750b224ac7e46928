package schema

import (
	"context"
	"errors"
	"fmt"

	"github.com/keiro-go/keiro/envelope"
	"github.com/linkedin/goavro/v2"
)

// DeserializerConfig configures a [Deserializer].
type DeserializerConfig struct {
	// JSON is the JSON form DecodeJSON and EventHook produce. Defaults to AvroJSON.
	JSON JSONForm
}

// Deserializer decodes Confluent-framed Avro payloads with their writer schema, fetched from
// the registry by the frame's schema id and cached for the life of the [Registry]. It is safe
// for concurrent use.
//
// Errors are of two kinds. Permanent ones match [ErrMalformedPayload] (and one of
// ErrWrongMagicByte, ErrTruncatedFrame, ErrUnknownSchemaID, ErrPayloadMismatch): the same bytes
// will never decode, so a consumer should dead-letter the message with err.Error() as the
// reason. [ErrRegistryUnavailable] is retryable: the schema could not be fetched now.
type Deserializer struct {
	reg *Registry
	cfg DeserializerConfig
}

// NewDeserializer returns a Deserializer reading schemas from reg.
func NewDeserializer(reg *Registry, cfg DeserializerConfig) (*Deserializer, error) {
	var errs []error
	if reg == nil {
		errs = append(errs, errors.New("registry: required"))
	}
	if cfg.JSON != AvroJSON && cfg.JSON != PlainJSON {
		errs = append(errs, fmt.Errorf("JSON: unknown %s", cfg.JSON))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new Avro deserializer: %w", err)
	}
	return &Deserializer{reg: reg, cfg: cfg}, nil
}

// Decode returns the payload's value in goavro's native form and its writer schema.
func (d *Deserializer) Decode(ctx context.Context, payload []byte) (any, *Schema, error) {
	sch, body, err := d.writer(ctx, payload)
	if err != nil {
		return nil, nil, err
	}
	v, err := decodeBody(sch.codecs, sch.codec, sch.ID, body)
	if err != nil {
		return nil, nil, err
	}
	return v, sch, nil
}

// DecodeJSON returns the payload's value as JSON in the configured form.
func (d *Deserializer) DecodeJSON(ctx context.Context, payload []byte) ([]byte, error) {
	sch, body, err := d.writer(ctx, payload)
	if err != nil {
		return nil, err
	}
	codec := sch.codec
	if d.cfg.JSON == PlainJSON {
		if codec, err = sch.plainCodec(); err != nil {
			return nil, &DecodeError{Kind: ErrPayloadMismatch, SchemaID: sch.ID,
				Detail: "the writer schema cannot be used for plain JSON", Err: err}
		}
	}
	v, err := decodeBody(sch.codecs, codec, sch.ID, body)
	if err != nil {
		return nil, err
	}
	out, err := codec.TextualFromNative(nil, v)
	if err != nil {
		return nil, &DecodeError{Kind: ErrPayloadMismatch, SchemaID: sch.ID, Detail: "render as JSON", Err: err}
	}
	return out, nil
}

// EventHook returns a function for the consumer's event hook: when ev carries an Avro payload
// ([IsAvroContentType]), it replaces ev.Payload with its JSON form (see DecodeJSON) and
// ev.ContentType with application/json, so that handlers that expect JSON (the HTTP and SQL
// handler modes) work unchanged; SchemaRef is kept, and is filled with the frame's schema id if
// the producer did not set it. Other events pass through untouched. Its errors are Decode's:
// dead-letter on ErrMalformedPayload, retry on ErrRegistryUnavailable.
func (d *Deserializer) EventHook() func(ctx context.Context, ev *envelope.Event) error {
	return func(ctx context.Context, ev *envelope.Event) error {
		if !IsAvroContentType(ev.ContentType) {
			return nil
		}
		js, err := d.DecodeJSON(ctx, ev.Payload)
		if err != nil {
			return fmt.Errorf("rewrite Avro payload of message %s as JSON: %w", ev.MessageID, err)
		}
		id, _, _ := DecodeFrame(ev.Payload) // cannot fail: DecodeJSON checked the frame
		if ev.SchemaRef == nil {
			ev.SchemaRef = &envelope.SchemaRef{}
		}
		if ev.SchemaRef.SchemaID == nil {
			v := int64(id)
			ev.SchemaRef.SchemaID = &v
		}
		ev.Payload = js
		ev.ContentType = envelope.ContentTypeJSON
		return nil
	}
}

// writer checks the frame and fetches its writer schema.
func (d *Deserializer) writer(ctx context.Context, payload []byte) (*Schema, []byte, error) {
	id, body, err := DecodeFrame(payload)
	if err != nil {
		return nil, nil, err
	}
	sch, err := d.reg.SchemaByID(ctx, int(id))
	switch {
	case errors.Is(err, ErrUnknownSchemaID):
		return nil, nil, &DecodeError{Kind: ErrUnknownSchemaID, SchemaID: int(id),
			Detail: "the registry does not know this id; the message was written against another registry or the schema was deleted",
			Err:    err}
	case errors.Is(err, ErrInvalidSchema):
		return nil, nil, &DecodeError{Kind: ErrPayloadMismatch, SchemaID: int(id),
			Detail: "the registry's writer schema does not compile", Err: err}
	case err != nil:
		return nil, nil, fmt.Errorf("decode Avro payload: %w", err)
	}
	return sch, body, nil
}

// decodeBody checks body against the schema's shape (bounded, allocation-free), then decodes it.
func decodeBody(cs *codecs, codec *goavro.Codec, id int, body []byte) (v any, err error) {
	if err := checkBody(cs.shape, body); err != nil {
		var trailing errTrailing
		if errors.As(err, &trailing) {
			return nil, &DecodeError{Kind: ErrPayloadMismatch, SchemaID: id, Detail: trailing.Error()}
		}
		return nil, &DecodeError{Kind: ErrPayloadMismatch, SchemaID: id,
			Detail: "the Avro body does not decode with its writer schema", Err: err}
	}
	defer func() {
		// goavro is not known to panic on bad input, but a decoder of outside bytes must
		// never take the process down.
		if p := recover(); p != nil {
			v, err = nil, &DecodeError{Kind: ErrPayloadMismatch, SchemaID: id, Detail: fmt.Sprintf("decoder panic: %v", p)}
		}
	}()
	v, rest, err := codec.NativeFromBinary(body)
	if err != nil {
		return nil, &DecodeError{Kind: ErrPayloadMismatch, SchemaID: id,
			Detail: "the Avro body does not decode with its writer schema", Err: err}
	}
	if len(rest) != 0 {
		return nil, &DecodeError{Kind: ErrPayloadMismatch, SchemaID: id,
			Detail: fmt.Sprintf("%d trailing bytes after the datum", len(rest))}
	}
	return v, nil
}

package schema

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/keiro-go/keiro/envelope"
	"github.com/linkedin/goavro/v2"
)

// ContentTypeAvro is the content type [Serializer.Encode] writes: Avro binary in the
// Confluent frame. It is the media type the CloudEvents Kafka binding and most Kafka tooling
// use for Avro values; the frame itself is recognised by its magic byte.
const ContentTypeAvro = "application/avro"

// avroContentTypes are the media types [IsAvroContentType] accepts.
var avroContentTypes = map[string]bool{
	"application/avro":                   true,
	"avro/binary":                        true,
	"application/vnd.apache.avro+binary": true,
	"application/vnd.confluent.avro":     true,
	"application/x-avro-binary":          true,
}

// IsAvroContentType reports whether raw names a binary Avro payload: the part before the first
// ';', trimmed and lowercased, is one of application/avro (what this package writes),
// avro/binary, application/vnd.apache.avro+binary, application/vnd.confluent.avro or
// application/x-avro-binary.
func IsAvroContentType(raw string) bool {
	mt, _, _ := strings.Cut(raw, ";")
	return avroContentTypes[strings.ToLower(strings.TrimSpace(mt))]
}

// JSONForm selects how JSON text maps onto Avro values.
type JSONForm int

const (
	// AvroJSON is the Avro specification's JSON encoding: a non-null union value is wrapped
	// in an object naming its branch ({"string": "x"}), bytes and fixed are strings of
	// code points 0-255, logical types use their underlying type (timestamp-millis is a
	// number of milliseconds, decimal is bytes). Lossless and unambiguous; the default.
	AvroJSON JSONForm = iota
	// PlainJSON is ordinary JSON: union values are written bare and their branch is inferred
	// (the first branch that accepts the value, in schema order). Convenient for HTTP and SQL
	// consumers; ambiguous for unions of several record or numeric types.
	PlainJSON
)

// String names the form.
func (f JSONForm) String() string {
	switch f {
	case AvroJSON:
		return "avro"
	case PlainJSON:
		return "plain"
	}
	return fmt.Sprintf("JSONForm(%d)", int(f))
}

// SerializerConfig configures a [Serializer].
type SerializerConfig struct {
	// SubjectStrategy derives the subject from the event's destination and the schema's
	// name. Defaults to TopicNameStrategy ("<destination>-value").
	SubjectStrategy SubjectStrategy
	// AutoRegister registers the schema under the subject on first use instead of requiring
	// it to be registered already. Meant for development; in production register schemas
	// with `relay schema register` so that compatibility is checked before deploying.
	// Defaults to false (lookup-only).
	AutoRegister bool
	// JSON is the JSON form Encode accepts for json.RawMessage values. Defaults to AvroJSON.
	JSON JSONForm
}

func (c SerializerConfig) validate() error {
	var errs []error
	if c.SubjectStrategy < TopicNameStrategy || c.SubjectStrategy > TopicRecordNameStrategy {
		errs = append(errs, fmt.Errorf("SubjectStrategy: unknown %s", c.SubjectStrategy))
	}
	if c.JSON != AvroJSON && c.JSON != PlainJSON {
		errs = append(errs, fmt.Errorf("JSON: unknown %s", c.JSON))
	}
	return errors.Join(errs...)
}

// maxSizeHint caps the buffer Encode preallocates.
const maxSizeHint = 64 << 10

// Serializer turns values of one writer schema into Confluent-framed Avro payloads on
// envelope events, for enqueuing into the outbox. Its registry answers are cached, so
// steady-state encoding makes no HTTP request. It is safe for concurrent use.
type Serializer struct {
	reg        *Registry
	cfg        SerializerConfig
	text       string
	codec      *goavro.Codec
	plain      *goavro.Codec
	recordName string
	fp         string

	sizeHint atomic.Int64 // largest payload so far, up to maxSizeHint

	mu       sync.Mutex                             // serialises writers of subjects
	subjects atomic.Pointer[map[string]*registered] // topic → registry identity; copy on write
}

type registered struct {
	header  [FrameHeaderLen]byte
	subject string
	vals    refValues
}

// refValues backs one event's SchemaRef, so that events never share mutable pointers.
type refValues struct {
	registry, subject, fingerprint string
	version, id                    int64
}

// refBox is a SchemaRef and the values it points at, in one allocation.
type refBox struct {
	ref  envelope.SchemaRef
	vals refValues
}

func (r *registered) newRef() *envelope.SchemaRef {
	b := &refBox{vals: r.vals}
	b.ref = envelope.SchemaRef{Registry: &b.vals.registry, Subject: &b.vals.subject, Version: &b.vals.version,
		SchemaID: &b.vals.id, Fingerprint: &b.vals.fingerprint}
	return &b.ref
}

// NewSerializer returns a Serializer writing values of the Avro schema text. The schema is
// compiled now, so a bad schema fails here rather than at the first event.
func NewSerializer(reg *Registry, text string, cfg SerializerConfig) (*Serializer, error) {
	var errs []error
	if reg == nil {
		errs = append(errs, errors.New("registry: required"))
	}
	if err := cfg.validate(); err != nil {
		errs = append(errs, err)
	}
	codec, err := goavro.NewCodec(text)
	if err != nil {
		errs = append(errs, fmt.Errorf("schema: %w: %v", ErrInvalidSchema, err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new Avro serializer: %w", err)
	}
	s := &Serializer{reg: reg, cfg: cfg, text: text, codec: codec, recordName: fullName(codec),
		fp: Fingerprint(codec)}
	s.subjects.Store(&map[string]*registered{})
	if cfg.JSON == PlainJSON {
		if s.plain, err = goavro.NewCodecForStandardJSONFull(text); err != nil {
			return nil, fmt.Errorf("new Avro serializer: schema: %w: %v", ErrInvalidSchema, err)
		}
	}
	return s, nil
}

// fullName returns the full name of a named schema (record, enum, fixed), or "".
func fullName(c *goavro.Codec) string {
	var v struct {
		Type, Name, Namespace string
	}
	if json.Unmarshal([]byte(c.CanonicalSchema()), &v) != nil {
		return ""
	}
	return v.Name // the canonical form writes full names in "name" and drops "namespace"
}

// Codec returns the writer schema's codec.
func (s *Serializer) Codec() *goavro.Codec { return s.codec }

// Subject returns the subject the serializer uses for values written to topic.
func (s *Serializer) Subject(topic string) (string, error) {
	return s.cfg.SubjectStrategy.Subject(topic, s.recordName, false)
}

// Encode sets ev.Payload to value written with the writer schema and framed with the
// registry's schema id, ev.ContentType to [ContentTypeAvro], and ev.SchemaRef to the
// registry's name, the subject (from ev.Destination and the strategy), its version, the
// schema id and the fingerprint. ev.SchemaVersion, the application's own version number, is
// left alone.
//
// value is either goavro's native form (map[string]any for records, map[string]any{"branch":
// v} for non-null unions, time.Time for timestamps, *big.Rat for decimals, ...) or a
// json.RawMessage in the configured JSON form.
//
// Errors: ErrInvalidValue (the value does not fit the schema), ErrSubjectNotFound (lookup-only
// and the schema is not registered under the subject; the message says how to fix it),
// ErrRegistryUnavailable (retryable; nothing was changed on ev).
func (s *Serializer) Encode(ctx context.Context, ev *envelope.Event, value any) error {
	reg, err := s.registered(ctx, ev.Destination)
	if err != nil {
		return err
	}
	if raw, ok := value.(json.RawMessage); ok {
		c := s.codec
		if s.cfg.JSON == PlainJSON {
			c = s.plain
		}
		native, rest, err := c.NativeFromTextual(raw)
		if err != nil {
			return fmt.Errorf("encode Avro payload for %s: %w: JSON (%s form): %v", reg.subject, ErrInvalidValue, s.cfg.JSON, err)
		}
		if len(strings.TrimSpace(string(rest))) != 0 {
			return fmt.Errorf("encode Avro payload for %s: %w: JSON has trailing data after the value", reg.subject, ErrInvalidValue)
		}
		value = native
	}
	// Size the buffer like the previous payload, so that goavro rarely has to grow it.
	buf := make([]byte, 0, max(64, s.sizeHint.Load()))
	buf = append(buf, reg.header[:]...)
	buf, err = s.codec.BinaryFromNative(buf, value)
	if err != nil {
		return fmt.Errorf("encode Avro payload for %s: %w: %v", reg.subject, ErrInvalidValue, err)
	}
	if n := int64(len(buf)); n > s.sizeHint.Load() && n <= maxSizeHint {
		s.sizeHint.Store(n)
	}
	ev.Payload = buf
	ev.ContentType = ContentTypeAvro
	ev.SchemaRef = reg.newRef()
	return nil
}

// AppendEncode appends the framed payload of value to dst, for callers that manage their own
// buffers; it resolves the subject from topic like Encode.
func (s *Serializer) AppendEncode(ctx context.Context, dst []byte, topic string, value any) ([]byte, error) {
	reg, err := s.registered(ctx, topic)
	if err != nil {
		return dst, err
	}
	out, err := s.codec.BinaryFromNative(append(dst, reg.header[:]...), value)
	if err != nil {
		return dst, fmt.Errorf("encode Avro payload for %s: %w: %v", reg.subject, ErrInvalidValue, err)
	}
	return out, nil
}

// registered resolves the registry identity of the writer schema for topic, from the cache
// when possible.
func (s *Serializer) registered(ctx context.Context, topic string) (*registered, error) {
	if r := (*s.subjects.Load())[topic]; r != nil {
		return r, nil
	}
	subject, err := s.Subject(topic)
	if err != nil {
		return nil, fmt.Errorf("encode Avro payload: %w", err)
	}
	var sch *Schema
	if s.cfg.AutoRegister {
		sch, err = s.reg.RegisterSchema(ctx, subject, s.text)
	} else {
		sch, err = s.reg.LookupSchema(ctx, subject, s.text)
		if errors.Is(err, ErrSubjectNotFound) {
			name := s.recordName
			if name == "" {
				name = "the writer schema"
			}
			return nil, fmt.Errorf("encode Avro payload: subject %s has no schema matching %s (fingerprint %s); "+
				"register it with `relay schema register %s <file.avsc>` or enable auto-register: %w",
				subject, name, s.fp, subject, err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("encode Avro payload: %w", err)
	}
	if sch.ID < 0 || int64(sch.ID) > int64(^uint32(0)) {
		return nil, fmt.Errorf("encode Avro payload: registry returned schema id %d, outside the 4-byte frame", sch.ID)
	}
	r := &registered{subject: subject, vals: refValues{registry: s.reg.Name(), subject: subject,
		fingerprint: s.fp, version: int64(sch.Version), id: int64(sch.ID)}}
	copy(r.header[:], AppendFrameHeader(nil, uint32(sch.ID)))
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.subjects.Load()
	next := make(map[string]*registered, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[topic] = r
	s.subjects.Store(&next)
	return r, nil
}

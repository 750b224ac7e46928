package events

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
)

// Codec turns a command runner's domain events into stored events and back. Decoding goes by
// the stored type tag, never by the payload's shape.
type Codec[E any] interface {
	// Encode returns the type tag, schema version and JSON data of e (EventData's ID and
	// Metadata are left for the runner to fill).
	Encode(e E) (EventData, error)
	// Decode rebuilds the domain event from a stored one.
	Decode(e RecordedEvent) (E, error)
}

// Upcaster rewrites the JSON data of one schema version into the next version's shape.
type Upcaster func(data json.RawMessage) (json.RawMessage, error)

// JSONCodec is a Codec for a sum type E (usually an interface implemented by one struct per
// event) that stores each registered case as JSON under its type tag. Register cases with
// [RegisterJSON]; register upcasters with [JSONCodec.Upcast]. A JSONCodec must be fully
// registered before use; it is then safe for concurrent use.
type JSONCodec[E any] struct {
	byName map[string]*jsonCase[E]
	byType map[reflect.Type]*jsonCase[E]
}

type jsonCase[E any] struct {
	name      string
	version   int32
	decode    func([]byte) (E, error)
	upcasters map[int32]Upcaster // from version → to version+1
}

// NewJSONCodec returns an empty JSONCodec.
func NewJSONCodec[E any]() *JSONCodec[E] {
	return &JSONCodec[E]{byName: map[string]*jsonCase[E]{}, byType: map[reflect.Type]*jsonCase[E]{}}
}

// RegisterJSON registers the event type T (a value type that is an E) under the type tag name,
// at schema version schemaVersion (≥ 1). It fails if T is not an E or if the tag or type is
// already registered.
func RegisterJSON[T any, E any](c *JSONCodec[E], name string, schemaVersion int32) error {
	var zero T
	if _, ok := any(zero).(E); !ok {
		return fmt.Errorf("register %s: %T does not implement the codec's event type", name, zero)
	}
	t := reflect.TypeFor[T]()
	switch {
	case name == "":
		return fmt.Errorf("register %v: empty type tag", t)
	case schemaVersion < 1:
		return fmt.Errorf("register %s: schema version %d is below 1", name, schemaVersion)
	case c.byName[name] != nil:
		return fmt.Errorf("register %s: type tag already registered", name)
	case c.byType[t] != nil:
		return fmt.Errorf("register %s: %v already registered as %s", name, t, c.byType[t].name)
	}
	jc := &jsonCase[E]{name: name, version: schemaVersion, upcasters: map[int32]Upcaster{},
		decode: func(b []byte) (E, error) {
			var v T
			if err := json.Unmarshal(b, &v); err != nil {
				var e E
				return e, err
			}
			return any(v).(E), nil
		}}
	c.byName[name], c.byType[t] = jc, jc
	return nil
}

// Upcast registers fn to rewrite the data of type tag name from schema version from to from+1.
// Stored events older than the registered version are decoded through the chain of upcasters,
// in version order; a missing link fails the decode.
func (c *JSONCodec[E]) Upcast(name string, from int32, fn Upcaster) error {
	jc := c.byName[name]
	if jc == nil {
		return fmt.Errorf("upcast %s: type tag not registered", name)
	}
	if from < 1 || from >= jc.version {
		return fmt.Errorf("upcast %s from version %d: want a version in [1, %d)", name, from, jc.version)
	}
	jc.upcasters[from] = fn
	return nil
}

// Encode implements Codec.
func (c *JSONCodec[E]) Encode(e E) (EventData, error) {
	t := reflect.TypeOf(any(e))
	jc := c.byType[t]
	if jc == nil && t != nil && t.Kind() == reflect.Pointer {
		jc = c.byType[t.Elem()]
	}
	if jc == nil {
		return EventData{}, fmt.Errorf("encode event: %v is not registered", t)
	}
	data, err := json.Marshal(e)
	if err != nil {
		return EventData{}, fmt.Errorf("encode %s: %w", jc.name, err)
	}
	return EventData{Type: jc.name, SchemaVersion: jc.version, Data: data}, nil
}

// Decode implements Codec.
func (c *JSONCodec[E]) Decode(r RecordedEvent) (E, error) {
	var zero E
	jc := c.byName[r.Type]
	if jc == nil {
		known := make([]string, 0, len(c.byName))
		for n := range c.byName {
			known = append(known, n)
		}
		slices.Sort(known)
		return zero, fmt.Errorf("decode %s@%d: %w %q (known: %v)", r.StreamName, r.StreamVersion, ErrUnknownEventType, r.Type, known)
	}
	data := r.Data
	if r.SchemaVersion > jc.version {
		return zero, fmt.Errorf("decode %s@%d: %s schema version %d is newer than the codec's %d",
			r.StreamName, r.StreamVersion, r.Type, r.SchemaVersion, jc.version)
	}
	for v := r.SchemaVersion; v < jc.version; v++ {
		up := jc.upcasters[v]
		if up == nil {
			return zero, fmt.Errorf("decode %s@%d: %s has no upcaster from schema version %d", r.StreamName, r.StreamVersion, r.Type, v)
		}
		var err error
		if data, err = up(data); err != nil {
			return zero, fmt.Errorf("decode %s@%d: upcast %s from version %d: %w", r.StreamName, r.StreamVersion, r.Type, v, err)
		}
	}
	e, err := jc.decode(data)
	if err != nil {
		return zero, fmt.Errorf("decode %s@%d (%s): %w", r.StreamName, r.StreamVersion, r.Type, err)
	}
	return e, nil
}

package schema_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"testing"
	"time"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/schema"
)

// normalise maps decoded values onto comparable ones: times as RFC 3339 UTC text, decimals as
// exact fractions.
func normalise(v any) any {
	switch x := v.(type) {
	case time.Time:
		return "time:" + x.UTC().Format(time.RFC3339Nano)
	case *big.Rat:
		return "rat:" + x.RatString()
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = normalise(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalise(e)
		}
		return out
	}
	return v
}

func orderValue(note, discount any, lines []any, tags map[string]any, total *big.Rat) map[string]any {
	return map[string]any{
		"id":        "018f0f18-17aa-7000-8000-000000000003",
		"placed_at": time.Date(2026, 11, 29, 7, 30, 15, 123_000_000, time.UTC),
		"total":     total,
		"status":    "PAID",
		"lines":     lines,
		"tags":      tags,
		"note":      note,
		"discount":  discount,
		"paid":      true,
		"weight":    float32(2.5),
	}
}

func TestRoundTripNative(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	real := newRealRegistry(t)
	reg := newRegistry(t, real.URL())
	ser, err := schema.NewSerializer(reg, orderSchema, schema.SerializerConfig{AutoRegister: true})
	if err != nil {
		t.Fatal(err)
	}
	de, err := schema.NewDeserializer(reg, schema.DeserializerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	line := func(sku string, qty int32) any { return map[string]any{"sku": sku, "qty": qty} }
	cases := map[string]map[string]any{
		"unions set": orderValue(map[string]any{"string": "leave at door ✓"}, map[string]any{"double": 1.5},
			[]any{line("A-1", 2), line("B-7", 1)}, map[string]any{"channel": "web", "ref": "x"}, big.NewRat(12345, 100)),
		"unions null, empty collections": orderValue(nil, nil, []any{}, map[string]any{}, big.NewRat(0, 1)),
		"string branch, negative decimal": orderValue(nil, map[string]any{"string": "SUMMER"},
			[]any{line("Z", -3)}, map[string]any{"k": ""}, big.NewRat(-98765, 100)),
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			ev := envelope.Event{Destination: real.Name("orders.v1")}
			if err := ser.Encode(ctx, &ev, in); err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if ev.ContentType != schema.ContentTypeAvro || !schema.IsAvroContentType(ev.ContentType) {
				t.Fatalf("ContentType = %q", ev.ContentType)
			}
			if ev.Payload[0] != 0 {
				t.Fatalf("payload does not start with the magic byte: % x", ev.Payload[:5])
			}
			got, sch, err := de.Decode(ctx, ev.Payload)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if int64(sch.ID) != *ev.SchemaRef.SchemaID {
				t.Fatalf("writer schema id %d, SchemaRef says %d", sch.ID, *ev.SchemaRef.SchemaID)
			}
			if want, have := normalise(in), normalise(got); !reflect.DeepEqual(want, have) {
				t.Fatalf("round trip changed the value\n in: %#v\nout: %#v", want, have)
			}
		})
	}
}

func TestSchemaRefFilled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	real := newRealRegistry(t)
	real.register(t, real.Name("other-value"), `"string"`) // so that our id is not 1
	topic, subject := real.Name("orders.v1"), real.Name("orders.v1-value")
	reg := newRegistry(t, real.URL(), func(c *schema.RegistryConfig) { c.Name = "main-registry" })
	ser, err := schema.NewSerializer(reg, orderSchema, schema.SerializerConfig{AutoRegister: true})
	if err != nil {
		t.Fatal(err)
	}
	ev := envelope.Event{Destination: topic, SchemaVersion: 7}
	if err := ser.Encode(ctx, &ev, orderValue(nil, nil, []any{}, map[string]any{}, big.NewRat(1, 1))); err != nil {
		t.Fatal(err)
	}
	id := real.register(t, subject, orderSchema) // idempotent: tells us the truth
	version := 1
	ref := ev.SchemaRef
	if ref == nil || ref.Registry == nil || ref.Subject == nil || ref.Version == nil || ref.SchemaID == nil || ref.Fingerprint == nil {
		t.Fatalf("SchemaRef not fully set: %+v", ref)
	}
	if *ref.Registry != "main-registry" || *ref.Subject != subject || *ref.Version != int64(version) || *ref.SchemaID != int64(id) {
		t.Fatalf("SchemaRef = %s %s v%d id%d; want main-registry %s v%d id%d",
			*ref.Registry, *ref.Subject, *ref.Version, *ref.SchemaID, subject, version, id)
	}
	if want := fmt.Sprintf("%016x", rabin([]byte(codec(t, orderSchemaPlain).CanonicalSchema()))); *ref.Fingerprint != want {
		t.Fatalf("Fingerprint = %s, want CRC-64-AVRO of the canonical form %s", *ref.Fingerprint, want)
	}
	if ev.SchemaVersion != 7 {
		t.Fatalf("Encode changed the application's SchemaVersion to %d", ev.SchemaVersion)
	}
	if got := binaryID(ev.Payload); got != id {
		t.Fatalf("frame carries id %d, want %d", got, id)
	}
	// Two events never share the SchemaRef's storage.
	ev2 := envelope.Event{Destination: topic}
	if err := ser.Encode(ctx, &ev2, orderValue(nil, nil, []any{}, map[string]any{}, big.NewRat(1, 1))); err != nil {
		t.Fatal(err)
	}
	*ev2.SchemaRef.Subject = "mutated"
	if *ev.SchemaRef.Subject != subject {
		t.Fatal("events share SchemaRef storage")
	}
}

func binaryID(p []byte) int { return int(p[1])<<24 | int(p[2])<<16 | int(p[3])<<8 | int(p[4]) }

// rabin is CRC-64-AVRO exactly as the Avro specification writes it, independent of goavro.
func rabin(buf []byte) uint64 {
	const empty = 0xc15d213aa4d7a795
	var table [256]uint64
	for i := range table {
		fp := uint64(i)
		for range 8 {
			fp = (fp >> 1) ^ (empty & -(fp & 1))
		}
		table[i] = fp
	}
	fp := uint64(empty)
	for _, b := range buf {
		fp = (fp >> 8) ^ table[byte(fp)^b]
	}
	return fp
}

const jsonSchema = `{"type":"record","name":"Shipment","namespace":"com.acme","fields":[
  {"name":"id","type":"string"},
  {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
  {"name":"carrier","type":["null","string"],"default":null},
  {"name":"weights","type":{"type":"array","items":"double"}},
  {"name":"dims","type":{"type":"map","values":"long"}},
  {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["PARCEL","PALLET"]}}
]}`

func TestRoundTripJSON(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	real := newRealRegistry(t)
	topic := real.Name("ship.v1")
	real.register(t, topic+"-value", jsonSchema)
	reg := newRegistry(t, real.URL())
	cases := []struct {
		form schema.JSONForm
		in   string
	}{
		{schema.AvroJSON, `{"id":"s-1","at":1764400000123,"carrier":{"string":"DHL"},"weights":[1.5,2],"dims":{"h":10,"w":20},"kind":"PALLET"}`},
		{schema.AvroJSON, `{"id":"s-2","at":0,"carrier":null,"weights":[],"dims":{},"kind":"PARCEL"}`},
		{schema.PlainJSON, `{"id":"s-3","at":1764400000123,"carrier":"UPS","weights":[0.25],"dims":{"d":-1},"kind":"PARCEL"}`},
		{schema.PlainJSON, `{"id":"s-4","at":5,"carrier":null,"weights":[],"dims":{},"kind":"PALLET"}`},
	}
	for _, tc := range cases {
		t.Run(tc.form.String()+"/"+tc.in[7:10], func(t *testing.T) {
			ser, err := schema.NewSerializer(reg, jsonSchema, schema.SerializerConfig{JSON: tc.form})
			if err != nil {
				t.Fatal(err)
			}
			de, err := schema.NewDeserializer(reg, schema.DeserializerConfig{JSON: tc.form})
			if err != nil {
				t.Fatal(err)
			}
			ev := envelope.Event{Destination: topic}
			if err := ser.Encode(ctx, &ev, json.RawMessage(tc.in)); err != nil {
				t.Fatalf("Encode: %v", err)
			}
			out, err := de.DecodeJSON(ctx, ev.Payload)
			if err != nil {
				t.Fatalf("DecodeJSON: %v", err)
			}
			var want, got any
			if err := json.Unmarshal([]byte(tc.in), &want); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("DecodeJSON output is not JSON: %s", out)
			}
			if !reflect.DeepEqual(want, got) {
				t.Fatalf("JSON round trip:\n in: %s\nout: %s", tc.in, out)
			}
		})
	}
}

func TestEncodeRejectsBadValues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	real := newRealRegistry(t)
	topic := real.Name("ship.v1")
	real.register(t, topic+"-value", jsonSchema)
	reg := newRegistry(t, real.URL())
	ser, err := schema.NewSerializer(reg, jsonSchema, schema.SerializerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]any{
		"missing field":       map[string]any{"id": "x"},
		"wrong type":          map[string]any{"id": 5, "at": int64(1), "carrier": nil, "weights": []any{}, "dims": map[string]any{}, "kind": "PARCEL"},
		"bad enum":            map[string]any{"id": "x", "at": int64(1), "carrier": nil, "weights": []any{}, "dims": map[string]any{}, "kind": "BOAT"},
		"not JSON":            json.RawMessage(`{"id":`),
		"JSON trailing data":  json.RawMessage(`{"id":"s","at":1,"carrier":null,"weights":[],"dims":{},"kind":"PARCEL"} {}`),
		"plain union in avro": json.RawMessage(`{"id":"s","at":1,"carrier":"DHL","weights":[],"dims":{},"kind":"PARCEL"}`),
		"not a record":        "just a string",
	} {
		ev := envelope.Event{Destination: topic, ContentType: "application/json", Payload: []byte("{}")}
		err := ser.Encode(ctx, &ev, v)
		if !errors.Is(err, schema.ErrInvalidValue) {
			t.Errorf("%s: err = %v, want ErrInvalidValue", name, err)
		}
		if ev.ContentType != "application/json" || string(ev.Payload) != "{}" || ev.SchemaRef != nil {
			t.Errorf("%s: a failed Encode changed the event: %+v", name, ev)
		}
	}
}

func TestNewSerializerRejectsBadSchema(t *testing.T) {
	t.Parallel()
	reg := newRegistry(t, "http://127.0.0.1:1")
	for _, text := range []string{``, `{`, `{"type":"record","name":"X"}`, `{"type":"nope"}`} {
		if _, err := schema.NewSerializer(reg, text, schema.SerializerConfig{}); !errors.Is(err, schema.ErrInvalidSchema) {
			t.Errorf("schema %q: err = %v, want ErrInvalidSchema", text, err)
		}
	}
	if _, err := schema.NewSerializer(nil, `"string"`, schema.SerializerConfig{SubjectStrategy: 9, JSON: 4}); err == nil {
		t.Fatal("nil registry and bad config accepted")
	} else {
		for _, want := range []string{"registry", "SubjectStrategy", "JSON"} {
			if !contains(err.Error(), want) {
				t.Errorf("error %q does not name %s", err, want)
			}
		}
	}
}

package schema_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/schema"
	"github.com/linkedin/goavro/v2"
)

// bench20Schema is a 20-field record: the benchmark's payload.
var bench20Schema = func() string {
	types := []string{`"string"`, `"long"`, `"int"`, `"double"`, `"boolean"`,
		`["null","string"]`, `{"type":"long","logicalType":"timestamp-millis"}`, `{"type":"array","items":"string"}`,
		`{"type":"map","values":"long"}`, `"float"`}
	var fields []string
	for i := range 20 {
		fields = append(fields, fmt.Sprintf(`{"name":"f%02d","type":%s}`, i, types[i%len(types)]))
	}
	return `{"type":"record","name":"Bench20","namespace":"bench","fields":[` + strings.Join(fields, ",") + `]}`
}()

func bench20Value() map[string]any {
	v := map[string]any{}
	for i := range 20 {
		var x any
		switch i % 10 {
		case 0:
			x = "order-2026-000123"
		case 1:
			x = int64(1_700_000_000_123)
		case 2:
			x = int32(42)
		case 3:
			x = 3.14159
		case 4:
			x = true
		case 5:
			x = map[string]any{"string": "leave at the door"}
		case 6:
			x = time.UnixMilli(1_764_400_000_123).UTC()
		case 7:
			x = []any{"a", "bb", "ccc"}
		case 8:
			x = map[string]any{"x": int64(1), "y": int64(2)}
		case 9:
			x = float32(2.5)
		}
		v[fmt.Sprintf("f%02d", i)] = x
	}
	return v
}

type benchEnv struct {
	codec   *goavro.Codec
	ser     *schema.Serializer
	de      *schema.Deserializer
	value   map[string]any
	payload []byte
	fake    *fakeRegistry
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	fake := newFakeRegistry(b)
	fake.register(b, "bench.v1-value", bench20Schema)
	reg := newRegistry(b, fake.URL())
	ser, err := schema.NewSerializer(reg, bench20Schema, schema.SerializerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	de, _ := schema.NewDeserializer(reg, schema.DeserializerConfig{})
	e := &benchEnv{codec: ser.Codec(), ser: ser, de: de, value: bench20Value(), fake: fake}
	ev := envelope.Event{Destination: "bench.v1"}
	if err := ser.Encode(context.Background(), &ev, e.value); err != nil {
		b.Fatal(err)
	}
	if _, _, err := de.Decode(context.Background(), ev.Payload); err != nil {
		b.Fatal(err)
	}
	e.payload = ev.Payload
	return e
}

// done fails the benchmark if the measured loop talked to the registry.
func (e *benchEnv) done(b *testing.B, before int) {
	if got := e.fake.requests(""); got != before {
		b.Fatalf("the cached path made %d registry requests", got-before)
	}
}

// BenchmarkEncode: framed encoding with a cached registry next to plain goavro (the limit).
func BenchmarkEncode(b *testing.B) {
	e := newBenchEnv(b)
	ctx := context.Background()
	b.Run("goavro", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := e.codec.BinaryFromNative(nil, e.value); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("serializer", func(b *testing.B) {
		before := e.fake.requests("")
		b.ReportAllocs()
		for b.Loop() {
			ev := envelope.Event{Destination: "bench.v1"}
			if err := e.ser.Encode(ctx, &ev, e.value); err != nil {
				b.Fatal(err)
			}
		}
		e.done(b, before)
	})
	b.Run("goavro-reuse", func(b *testing.B) {
		buf := make([]byte, 0, 512)
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if buf, err = e.codec.BinaryFromNative(buf[:0], e.value); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("serializer-append", func(b *testing.B) {
		before := e.fake.requests("")
		buf := make([]byte, 0, 512)
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if buf, err = e.ser.AppendEncode(ctx, buf[:0], "bench.v1", e.value); err != nil {
				b.Fatal(err)
			}
		}
		e.done(b, before)
	})
}

// BenchmarkDecode: framed decoding with a cached registry (frame check, bounded pre-check,
// decode) next to plain goavro on the unframed body (the limit).
func BenchmarkDecode(b *testing.B) {
	e := newBenchEnv(b)
	ctx := context.Background()
	body := e.payload[schema.FrameHeaderLen:]
	b.Run("goavro", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := e.codec.NativeFromBinary(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("deserializer", func(b *testing.B) {
		before := e.fake.requests("")
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := e.de.Decode(ctx, e.payload); err != nil {
				b.Fatal(err)
			}
		}
		e.done(b, before)
	})
	b.Run("goavro-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			v, _, err := e.codec.NativeFromBinary(body)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := e.codec.TextualFromNative(nil, v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("deserializer-json", func(b *testing.B) {
		before := e.fake.requests("")
		b.ReportAllocs()
		for b.Loop() {
			if _, err := e.de.DecodeJSON(ctx, e.payload); err != nil {
				b.Fatal(err)
			}
		}
		e.done(b, before)
	})
}

// BenchmarkOverhead measures only what the serializer and deserializer add to goavro on the
// cached path, so that the ratio to BenchmarkEncode/goavro and BenchmarkDecode/goavro holds
// up on a loaded machine.
func BenchmarkOverhead(b *testing.B) {
	e := newBenchEnv(b)
	ctx := context.Background()
	reg := newRegistry(b, e.fake.URL())
	id, _, _ := schema.DecodeFrame(e.payload)
	sch, err := reg.SchemaByID(ctx, int(id))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("decode-frame+cache+check", func(b *testing.B) {
		before := e.fake.requests("")
		b.ReportAllocs()
		for b.Loop() {
			id, body, err := schema.DecodeFrame(e.payload)
			if err != nil {
				b.Fatal(err)
			}
			s, err := reg.SchemaByID(ctx, int(id))
			if err != nil {
				b.Fatal(err)
			}
			if err := schema.CheckBody(s, body); err != nil {
				b.Fatal(err)
			}
		}
		e.done(b, before)
	})
	_ = sch
	b.Run("encode-cache+frame+ref", func(b *testing.B) {
		before := e.fake.requests("")
		buf := make([]byte, 0, 512)
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if buf, _, err = e.ser.EncodeOverhead(ctx, "bench.v1", buf[:0]); err != nil {
				b.Fatal(err)
			}
		}
		e.done(b, before)
	})
}

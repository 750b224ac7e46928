package schema_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/schema"
)

func TestFrameHeader(t *testing.T) {
	t.Parallel()
	for _, id := range []uint32{0, 1, 255, 256, 1 << 24, 0x7fffffff, 0xffffffff} {
		framed := append(schema.AppendFrameHeader([]byte("x"), id)[1:], 0xAA, 0xBB)
		if len(framed) != schema.FrameHeaderLen+2 || framed[0] != schema.MagicByte {
			t.Fatalf("id %d: frame % x", id, framed)
		}
		got, body, err := schema.DecodeFrame(framed)
		if err != nil || got != id || !bytes.Equal(body, []byte{0xAA, 0xBB}) {
			t.Fatalf("id %d: DecodeFrame = %d, % x, %v", id, got, body, err)
		}
	}
	// Known bytes: id 258 is 00 00 01 02 big-endian.
	if got := schema.AppendFrameHeader(nil, 258); !bytes.Equal(got, []byte{0, 0, 0, 1, 2}) {
		t.Fatalf("header for 258 = % x", got)
	}
	for _, bad := range [][]byte{nil, {0}, {0, 0, 0, 0}} {
		if _, _, err := schema.DecodeFrame(bad); !errors.Is(err, schema.ErrTruncatedFrame) || !errors.Is(err, schema.ErrMalformedPayload) {
			t.Errorf("DecodeFrame(% x) err = %v, want ErrTruncatedFrame", bad, err)
		}
	}
	for _, bad := range [][]byte{{1, 0, 0, 0, 1}, []byte(`{"a":1}`), {0xC3, 0x01, 0, 0, 0, 0, 0, 0, 0, 0}} {
		if _, _, err := schema.DecodeFrame(bad); !errors.Is(err, schema.ErrWrongMagicByte) || !errors.Is(err, schema.ErrMalformedPayload) {
			t.Errorf("DecodeFrame(% x) err = %v, want ErrWrongMagicByte", bad, err)
		}
	}
}

// FuzzDecodeFrame: the frame decoder never panics, accepts exactly the well-formed headers, and
// re-encodes what it accepts to the same bytes.
func FuzzDecodeFrame(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0, 1})
	f.Add([]byte{0, 0, 0, 0, 1, 2, 3})
	f.Add([]byte{1, 0, 0, 0, 1, 2})
	f.Add([]byte(`{"json":true}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		id, body, err := schema.DecodeFrame(payload)
		wellFormed := len(payload) >= schema.FrameHeaderLen && payload[0] == 0
		if (err == nil) != wellFormed {
			t.Fatalf("DecodeFrame(% x): err = %v, well-formed = %v", payload, err, wellFormed)
		}
		if err != nil {
			if !errors.Is(err, schema.ErrMalformedPayload) || err.Error() == "" {
				t.Fatalf("error %v is not a permanent decode error", err)
			}
			return
		}
		if again := append(schema.AppendFrameHeader(nil, id), body...); !bytes.Equal(again, payload) {
			t.Fatalf("re-encoded % x, want % x", again, payload)
		}
	})
}

// FuzzDeserializer feeds arbitrary bodies behind a valid header to the full decoder: it must
// never panic and must classify every failure as a permanent decode error.
func FuzzDeserializer(f *testing.F) {
	fake := newFakeRegistry(f)
	id := fake.register(f, "ship.v1-value", jsonSchema)
	reg := newRegistry(f, fake.URL())
	ser, err := schema.NewSerializer(reg, jsonSchema, schema.SerializerConfig{})
	if err != nil {
		f.Fatal(err)
	}
	de, _ := schema.NewDeserializer(reg, schema.DeserializerConfig{})
	plain, _ := schema.NewDeserializer(reg, schema.DeserializerConfig{JSON: schema.PlainJSON})
	ev := envelope.Event{Destination: "ship.v1"}
	if err := ser.Encode(context.Background(), &ev, map[string]any{"id": "s", "at": int64(1), "carrier": map[string]any{"string": "x"},
		"weights": []any{1.0, 2.0}, "dims": map[string]any{"a": int64(3)}, "kind": "PALLET"}); err != nil {
		f.Fatal(err)
	}
	f.Add(ev.Payload[schema.FrameHeaderLen:])
	f.Add([]byte{})
	f.Add([]byte{2, 'x', 0})
	f.Fuzz(func(t *testing.T, body []byte) {
		payload := append(schema.AppendFrameHeader(nil, uint32(id)), body...)
		for _, d := range []*schema.Deserializer{de, plain} {
			if _, err := d.DecodeJSON(context.Background(), payload); err != nil && !errors.Is(err, schema.ErrMalformedPayload) {
				t.Fatalf("body % x: err = %v, want a permanent decode error", body, err)
			}
		}
	})
}

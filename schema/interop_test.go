package schema_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/schema"
)

// debianPython is Debian's interpreter, which sees the python3-avro package (a pyenv python3
// earlier on PATH does not).
const debianPython = "/usr/bin/python3"

// pythonAvro runs testdata/avro_interop.py. Without Apache Avro's Python package the test
// skips locally and fails under CI (CI installs python3-avro).
func pythonAvro(t *testing.T, args ...string) string {
	t.Helper()
	if err := exec.Command(debianPython, "-c", "import avro").Run(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s cannot import avro (%v); install the Debian package python3-avro", debianPython, err)
		}
		t.Skipf("%s cannot import avro; apt-get install python3-avro", debianPython)
	}
	cmd := exec.Command(debianPython, append([]string{filepath.Join("testdata", "avro_interop.py")}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("python avro %v: %v\n%s", args, err, stderr)
	}
	return strings.TrimSpace(string(out))
}

func TestInteropPythonAvro(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schemaFile := filepath.Join(t.TempDir(), "order.avsc")
	writeFile(t, schemaFile, []byte(orderSchema))
	real := newRealRegistry(t)
	topic := real.Name("orders.v1")
	real.register(t, topic+"-value", orderSchema)
	reg := newRegistry(t, real.URL())
	ser, err := schema.NewSerializer(reg, orderSchema, schema.SerializerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	de, _ := schema.NewDeserializer(reg, schema.DeserializerConfig{})

	t.Run("canonical form and fingerprint", func(t *testing.T) {
		// Python's avro 1.11 keeps {"type":"string"} for a primitive with a logical type,
		// against the specification's [PRIMITIVES] rule; compare on the plain layout.
		plainFile := filepath.Join(t.TempDir(), "order-plain.avsc")
		writeFile(t, plainFile, []byte(orderSchemaPlain))
		pcf := pythonAvro(t, "canonical", plainFile)
		if pcf != schema.CanonicalForm(ser.Codec()) {
			t.Fatalf("Parsing Canonical Form differs:\npython: %s\nours:   %s", pcf, schema.CanonicalForm(ser.Codec()))
		}
		if got, want := schema.Fingerprint(ser.Codec()), hexRabin(pcf); got != want {
			t.Fatalf("fingerprint %s, want CRC-64-AVRO of Python's canonical form %s", got, want)
		}
	})

	t.Run("go writes, python reads", func(t *testing.T) {
		in := orderValue(map[string]any{"string": "go → py"}, map[string]any{"string": "CODE10"},
			[]any{map[string]any{"sku": "go-1", "qty": int32(3)}}, map[string]any{"lang": "go"}, big.NewRat(-12345678, 100))
		in["id"] = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
		ev := envelope.Event{Destination: topic}
		if err := ser.Encode(ctx, &ev, in); err != nil {
			t.Fatal(err)
		}
		body := ev.Payload[schema.FrameHeaderLen:] // Python reads schemaless binary
		var got any
		if err := json.Unmarshal([]byte(pythonAvro(t, "decode", schemaFile, hex.EncodeToString(body))), &got); err != nil {
			t.Fatal(err)
		}
		want := map[string]any{
			"id": in["id"], "placed_at": map[string]any{"epoch_ms": float64(in["placed_at"].(time.Time).UnixMilli())},
			"total": map[string]any{"decimal": "-123456.78"}, "status": "PAID",
			"lines": []any{map[string]any{"sku": "go-1", "qty": float64(3)}}, "tags": map[string]any{"lang": "go"},
			"note": "go → py", "discount": "CODE10", "paid": true, "weight": 2.5,
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("python decoded\n%v\nwant\n%v", got, want)
		}
	})

	t.Run("python writes, go reads", func(t *testing.T) {
		body, err := hex.DecodeString(pythonAvro(t, "encode", schemaFile))
		if err != nil {
			t.Fatal(err)
		}
		payload := append(schema.AppendFrameHeader(nil, uint32(*mustRef(t, ser, topic).SchemaID)), body...)
		got, _, err := de.Decode(ctx, payload)
		if err != nil {
			t.Fatalf("decode Python's bytes: %v", err)
		}
		want := map[string]any{
			"id": "018f0f18-17aa-7000-8000-00000000beef", "placed_at": time.Date(2026, 11, 29, 7, 30, 15, 123e6, time.UTC),
			"total": big.NewRat(-471105, 100), "status": "SHIPPED",
			"lines": []any{map[string]any{"sku": "py-1", "qty": int32(7)}, map[string]any{"sku": "py-2", "qty": int32(-1)}},
			"tags":  map[string]any{"lang": "python", "empty": ""}, "note": map[string]any{"string": "from python é"},
			"discount": map[string]any{"double": 0.25}, "paid": false, "weight": float32(0.5),
		}
		if !reflect.DeepEqual(normalise(got), normalise(want)) {
			t.Fatalf("go decoded\n%#v\nwant\n%#v", normalise(got), normalise(want))
		}
		// And our bytes for the same value are Python's bytes, but for the order of the map's
		// entries: Avro leaves it open and a Go map has none, so compare with the entries of
		// "tags" in either order.
		ev := envelope.Event{Destination: topic}
		if err := ser.Encode(ctx, &ev, want); err != nil {
			t.Fatal(err)
		}
		lang, empty := []byte("\x08lang\x0cpython"), []byte("\x0aempty\x00")
		swapped := bytes.Replace(payload, append(append([]byte{}, lang...), empty...), append(append([]byte{}, empty...), lang...), 1)
		if bytes.Equal(swapped, payload) {
			t.Fatalf("python's bytes hold no \"lang\", \"empty\" map entries:\n% x", payload)
		}
		if !bytes.Equal(ev.Payload, payload) && !bytes.Equal(ev.Payload, swapped) {
			t.Fatalf("go encodes\n% x\npython wrote\n% x", ev.Payload, payload)
		}
	})
}

func mustRef(t *testing.T, ser *schema.Serializer, topic string) *envelope.SchemaRef {
	t.Helper()
	ev := envelope.Event{Destination: topic}
	if err := ser.Encode(context.Background(), &ev, sampleOrder()); err != nil {
		t.Fatal(err)
	}
	return ev.SchemaRef
}

func hexRabin(s string) string {
	const digits = "0123456789abcdef"
	v := rabin([]byte(s))
	out := make([]byte, 16)
	for i := 15; i >= 0; i-- {
		out[i] = digits[v&0xf]
		v >>= 4
	}
	return string(out)
}

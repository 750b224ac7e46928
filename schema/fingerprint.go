package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/linkedin/goavro/v2"
)

// CanonicalForm returns the schema's Parsing Canonical Form as the Avro specification (and
// Java's SchemaNormalization, the reference) defines it. It starts from goavro's
// CanonicalSchema and corrects the two places where goavro keeps more than the specification
// allows: a primitive with a logical type stays an object ({"type":"long"} for
// timestamp-millis, where the specification says "long"), and goavro names decimal bytes
// "bytes.decimal". For schemas without logical types on primitives the two forms are equal.
func CanonicalForm(c *goavro.Codec) string {
	var v any
	if err := json.Unmarshal([]byte(c.CanonicalSchema()), &v); err != nil {
		return c.CanonicalSchema() // cannot happen: goavro produced it from a parsed schema
	}
	var b bytes.Buffer
	writeCanonical(&b, v)
	return b.String()
}

var primitives = map[string]bool{"null": true, "boolean": true, "int": true, "long": true,
	"float": true, "double": true, "bytes": true, "string": true}

// canonicalKeys is the attribute order of [ORDER] in the specification.
var canonicalKeys = []string{"name", "type", "fields", "symbols", "items", "values", "size"}

// writeCanonical writes a schema (not a record field) in canonical form.
func writeCanonical(b *bytes.Buffer, v any) {
	switch x := v.(type) {
	case map[string]any:
		if t, ok := x["type"].(string); ok && primitives[t] {
			writeString(b, t) // [PRIMITIVES]: {"type":"long", ...} is "long"
			return
		}
		b.WriteByte('{')
		first := true
		for _, k := range canonicalKeys {
			e, ok := x[k]
			if !ok {
				continue
			}
			if !first {
				b.WriteByte(',')
			}
			first = false
			writeString(b, k)
			b.WriteByte(':')
			switch k {
			case "fields":
				fields, _ := e.([]any)
				b.WriteByte('[')
				for i, f := range fields {
					if i > 0 {
						b.WriteByte(',')
					}
					fm, _ := f.(map[string]any)
					b.WriteString(`{"name":`)
					name, _ := fm["name"].(string)
					writeString(b, name)
					b.WriteString(`,"type":`)
					writeCanonical(b, fm["type"])
					b.WriteByte('}')
				}
				b.WriteByte(']')
			case "symbols":
				syms, _ := e.([]any)
				b.WriteByte('[')
				for i, sym := range syms {
					if i > 0 {
						b.WriteByte(',')
					}
					str, _ := sym.(string)
					writeString(b, str)
				}
				b.WriteByte(']')
			case "size":
				n, _ := e.(float64)
				b.WriteString(strconv.FormatInt(int64(n), 10))
			case "name":
				str, _ := e.(string)
				writeString(b, str)
			default: // type (a name), items, values: schemas
				writeCanonical(b, e)
			}
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			writeCanonical(b, e)
		}
		b.WriteByte(']')
	case string:
		writeString(b, x)
	default:
		fmt.Fprint(b, x)
	}
}

func writeString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	b.Truncate(b.Len() - 1) // Encode's newline
}

// crc64AvroTable is the CRC-64-AVRO (Rabin) lookup table of the specification.
var crc64AvroTable = func() (t [256]uint64) {
	for i := range t {
		fp := uint64(i)
		for range 8 {
			fp = (fp >> 1) ^ (crc64AvroEmpty & -(fp & 1))
		}
		t[i] = fp
	}
	return t
}()

const crc64AvroEmpty = 0xc15d213aa4d7a795

// Fingerprint returns the schema fingerprint this package writes into SchemaRef.Fingerprint:
// the CRC-64-AVRO (Rabin) fingerprint of [CanonicalForm], as 16 lowercase hexadecimal digits,
// most significant first (Avro's single-object encoding carries the same number
// little-endian). It equals goavro's Codec.Rabin whenever goavro's canonical form is the
// specification's, that is for schemas without logical types on primitive types.
func Fingerprint(c *goavro.Codec) string {
	fp := uint64(crc64AvroEmpty)
	for _, ch := range []byte(CanonicalForm(c)) {
		fp = (fp >> 8) ^ crc64AvroTable[byte(fp)^ch]
	}
	return fmt.Sprintf("%016x", fp)
}

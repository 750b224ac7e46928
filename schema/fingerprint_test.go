package schema_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/keiro-go/keiro/schema"
	"github.com/linkedin/goavro/v2"
)

func codec(t *testing.T, text string) *goavro.Codec {
	t.Helper()
	c, err := goavro.NewCodec(text)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// orderSchemaPlain is orderSchema without its logical types: the same binary layout.
var orderSchemaPlain = strings.NewReplacer(
	`{"type": "string", "logicalType": "uuid"}`, `"string"`,
	`{"type": "long", "logicalType": "timestamp-millis"}`, `"long"`,
	`{"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}`, `"bytes"`,
).Replace(orderSchema)

func TestFingerprint(t *testing.T) {
	t.Parallel()
	if orderSchemaPlain == orderSchema || strings.Contains(orderSchemaPlain, "logicalType") {
		t.Fatal("test setup: logical types not replaced")
	}
	// Without logical types, goavro's canonical form is the specification's.
	for _, text := range []string{`"null"`, `"long"`, strings.Replace(jsonSchema, `{"type":"long","logicalType":"timestamp-millis"}`, `"long"`, 1), orderSchemaPlain,
		`{"type":"fixed","name":"md5","namespace":"x.y","size":16,"doc":"ignored"}`} {
		c := codec(t, text)
		if got, want := schema.Fingerprint(c), fmt.Sprintf("%016x", c.Rabin); got != want {
			t.Errorf("%s: Fingerprint %s, goavro's Rabin %016x", text, got, c.Rabin)
		}
		if schema.CanonicalForm(c) != c.CanonicalSchema() {
			t.Errorf("%s: canonical form\n%s\ngoavro\n%s", text, schema.CanonicalForm(c), c.CanonicalSchema())
		}
		if got, want := schema.Fingerprint(c), fmt.Sprintf("%016x", rabin([]byte(schema.CanonicalForm(c)))); got != want {
			t.Errorf("%s: Fingerprint %s, specification's CRC-64-AVRO %s", text, got, want)
		}
	}
	// Logical types do not change the canonical form (the specification strips them); goavro
	// keeps traces of them, which we remove.
	logical, plain := codec(t, orderSchema), codec(t, orderSchemaPlain)
	if schema.CanonicalForm(logical) != plain.CanonicalSchema() {
		t.Fatalf("canonical form with logical types\n%s\nwant\n%s", schema.CanonicalForm(logical), plain.CanonicalSchema())
	}
	if schema.Fingerprint(logical) != schema.Fingerprint(plain) || len(schema.Fingerprint(logical)) != 16 {
		t.Fatalf("fingerprints differ: %s %s", schema.Fingerprint(logical), schema.Fingerprint(plain))
	}
	// The specification's test vector: "null" has CRC-64-AVRO fingerprint 0x63dd24e7cc258f8a.
	if got := schema.Fingerprint(codec(t, `"null"`)); got != "63dd24e7cc258f8a" {
		t.Fatalf(`fingerprint of "null" = %s`, got)
	}
}

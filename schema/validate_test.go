package schema

import (
	"strings"
	"testing"

	"github.com/linkedin/goavro/v2"
)

func mustShape(t *testing.T, text string) (*shape, *goavro.Codec) {
	t.Helper()
	c, err := goavro.NewCodec(text)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newShape(c.CanonicalSchema())
	if err != nil {
		t.Fatalf("shape of %s: %v", c.CanonicalSchema(), err)
	}
	return s, c
}

// Hostile payloads are rejected before goavro preallocates from their block counts.
func TestCheckBodyRejectsHostileCounts(t *testing.T) {
	t.Parallel()
	cases := []struct {
		schema string
		body   []byte
		says   string
	}{
		// count 2^31-ish of doubles in 5 bytes
		{`{"type":"array","items":"double"}`, []byte{0xfe, 0xff, 0xff, 0xff, 0x0f}, "cannot fit"},
		{`{"type":"map","values":"null"}`, []byte{0xfe, 0xff, 0xff, 0xff, 0x0f}, "cannot fit"},
		// a billion nulls take no bytes at all
		{`{"type":"array","items":"null"}`, []byte{0x80, 0xa8, 0xd6, 0xb9, 0x07, 0}, "empty array items"},
		{`{"type":"array","items":{"type":"array","items":"null"}}`, append([]byte{0x80, 0x01}, strings.Repeat("\xfe\xff\x03", 64)...), "empty array items"},
		// negative count with a block size
		{`{"type":"array","items":"long"}`, []byte{0x01, 0x02, 0x02, 0x00}, ""},
		{`"string"`, []byte{0xfe, 0xff, 0xff, 0xff, 0x0f, 'a'}, "1 left"},
		{`"long"`, []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, "longer than 10 bytes"},
		{`["null","long"]`, []byte{0x04}, "union branch"},
		{`{"type":"enum","name":"E","symbols":["A"]}`, []byte{0x02}, "enum index"},
	}
	for _, tc := range cases {
		s, _ := mustShape(t, tc.schema)
		err := checkBody(s, tc.body)
		if tc.says == "" {
			if err != nil {
				t.Errorf("%s % x: %v, want accepted", tc.schema, tc.body, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s % x: err = %v, want one saying %q", tc.schema, tc.body, err, tc.says)
		}
	}
}

// Recursive schemas are followed, and a hostile nesting depth is refused.
func TestCheckBodyDepth(t *testing.T) {
	t.Parallel()
	s, c := mustShape(t, `{"type":"record","name":"Node","fields":[{"name":"v","type":"int"},{"name":"next","type":["null","Node"]}]}`)
	nest := func(n int) any {
		var v any
		for i := range n {
			v = map[string]any{"v": int32(i), "next": goavro.Union("Node", v)}
			if i == 0 {
				v = map[string]any{"v": int32(0), "next": nil}
			}
		}
		return v
	}
	ok, err := c.BinaryFromNative(nil, nest(50))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkBody(s, ok); err != nil {
		t.Fatalf("50 levels: %v", err)
	}
	deep := []byte(strings.Repeat("\x00\x02", 100_000) + "\x00\x00")
	if err := checkBody(s, deep); err == nil || !strings.Contains(err.Error(), "deeper than") {
		t.Fatalf("100000 levels: err = %v", err)
	}
}

// Everything goavro encodes passes the check, including logical types and fixed.
func TestCheckBodyAcceptsEncoded(t *testing.T) {
	t.Parallel()
	s, c := mustShape(t, `{"type":"record","name":"R","namespace":"n","fields":[
		{"name":"f","type":{"type":"fixed","name":"F","size":3}},
		{"name":"g","type":"F"},
		{"name":"b","type":"boolean"},
		{"name":"x","type":"float"},
		{"name":"m","type":{"type":"map","values":{"type":"array","items":"n.F"}}},
		{"name":"e","type":{"type":"record","name":"Empty","fields":[]}},
		{"name":"es","type":{"type":"array","items":"Empty"}}
	]}`)
	bin, err := c.BinaryFromNative(nil, map[string]any{"f": []byte("abc"), "g": []byte("xyz"), "b": true, "x": float32(1),
		"m": map[string]any{"k": []any{[]byte("123")}}, "e": map[string]any{}, "es": []any{map[string]any{}, map[string]any{}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := checkBody(s, bin); err != nil {
		t.Fatal(err)
	}
	if err := checkBody(s, bin[:len(bin)-1]); err == nil {
		t.Fatal("truncated body accepted")
	}
}

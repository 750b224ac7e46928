package workflow

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// FuzzEncodeJSON: a value is refused exactly when it holds a NUL character, whatever escapes
// surround it.
func FuzzEncodeJSON(f *testing.F) {
	for _, s := range []string{"", "a", "\x00", `\u0000`, `\\u0000`, "x\x00y", `\` + "\x00", "u0000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, err := encodeJSON(map[string]string{s: s})
		if got, want := err != nil, strings.ContainsRune(s, 0); got != want {
			t.Fatalf("encodeJSON(%q): error %v, want refused=%v", s, err, want)
		}
	})
}

// FuzzDecodeStepMap: a stored snapshot's state decodes to a step map or is refused (and the
// journal is read in full); a decoded map encodes and decodes to itself.
func FuzzDecodeStepMap(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, `{"sleep:x":null,"b":[1,"2"]}`, `"bad"`, `null`, `[1]`, `{"a":`, ` {"a":{"b":{}}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeStepMap(b)
		if err != nil {
			return
		}
		enc, err := encodeStepMap(m)
		if err != nil {
			t.Fatalf("encode %q: %v", b, err)
		}
		again, err := decodeStepMap(enc)
		if err != nil || len(again) != len(m) {
			t.Fatalf("round trip of %q: %v, %d entries for %d", b, err, len(again), len(m))
		}
		for k, v := range m {
			if !jsonEqual(v, again[k]) {
				t.Fatalf("round trip of %q: %s became %s", k, v, again[k])
			}
		}
	})
}

// jsonEqual reports whether a and b are the same JSON value, spaces aside.
func jsonEqual(a, b json.RawMessage) bool {
	var ca, cb bytes.Buffer
	return json.Compact(&ca, a) == nil && json.Compact(&cb, b) == nil && bytes.Equal(ca.Bytes(), cb.Bytes())
}

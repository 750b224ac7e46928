package workflow

import (
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

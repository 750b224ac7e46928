package pgtext

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// TestStorable: stored text is valid UTF-8 without NUL bytes and is cut on a character
// boundary.
func TestStorable(t *testing.T) {
	require.Equal(t, "plain", Storable("plain", 100))
	require.Equal(t, "a\uFFFDb\uFFFDc", Storable("a\x00b\xffc", 100))
	long := strings.Repeat("é", 10) // 2 bytes each
	got := Storable(long, 7)
	require.True(t, utf8.ValidString(got), "%q", got)
	require.Equal(t, strings.Repeat("é", 3), got)
	require.Len(t, Storable(long, 20), 20)
	require.Equal(t, "ab", Storable("ab€", 4), "a 3-byte character across the cut is dropped whole")
}

func TestJSONHasNUL(t *testing.T) {
	for doc, want := range map[string]bool{
		`{}`:                       false,
		`{"a":"\u0000"}`:           true,
		`{"a":"\\u0000"}`:          false,
		`{"a":"\\\u0000"}`:         true,
		`{"u0000":"u0000"}`:        false,
		`{"a":"\\\\u0000 \u0000"}`: true,
		`\u0000`:                   true,
	} {
		if got := JSONHasNUL([]byte(doc)); got != want {
			t.Errorf("JSONHasNUL(%s) = %v, want %v", doc, got, want)
		}
	}
}

package inbox

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// TestStorableText: error messages stored in last_error are valid UTF-8 without NUL bytes and
// are cut on a character boundary.
func TestStorableText(t *testing.T) {
	require.Equal(t, "plain", storableText("plain", 100))
	require.Equal(t, "a\uFFFDb\uFFFDc", storableText("a\x00b\xffc", 100))
	long := strings.Repeat("é", 10) // 2 bytes each
	got := storableText(long, 7)
	require.True(t, utf8.ValidString(got), "%q", got)
	require.Equal(t, strings.Repeat("é", 3), got)
	require.Len(t, storableText(long, 20), 20)
}

package schemaname

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// TestValidate: plain lowercase identifiers of at most 63 bytes pass; anything that would need
// quoting, is too long or is a pg_* system schema is refused with ErrInvalid, naming the input.
func TestValidate(t *testing.T) {
	for _, bad := range []string{"", "Keiro", "1keiro", "ke-iro", "ke iro", `k"`, "pg_catalog", "pg_", strings.Repeat("a", 64), "keiro;drop"} {
		err := Validate(bad)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("Validate(%q) = %v, want ErrInvalid", bad, err)
			continue
		}
		if !strings.Contains(err.Error(), strconv.Quote(bad)) {
			t.Errorf("Validate(%q) = %v, want the name in the message", bad, err)
		}
	}
	for _, good := range []string{Default, "_x", "keiro_test_42", "pgx", strings.Repeat("a", 63)} {
		if err := Validate(good); err != nil {
			t.Errorf("Validate(%q) = %v", good, err)
		}
	}
}

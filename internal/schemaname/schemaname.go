// Package schemaname holds the name rules of keiro's PostgreSQL schema: its default and the
// validation every component applies before placing a configured name into SQL text.
//
// It is dependency-free so that the library packages (outbox, inbox, events) validate schema
// names without importing the migration runner; package migrations re-exports it as
// migrations.DefaultSchema, migrations.ValidateSchema and migrations.ErrInvalidSchema.
package schemaname

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Default is the PostgreSQL schema that holds keiro's tables unless configured otherwise.
const Default = "keiro"

var pattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ErrInvalid reports a schema name that is not a plain lowercase SQL identifier.
var ErrInvalid = errors.New("invalid schema name")

// Validate checks that name is usable as keiro's schema: a lowercase SQL identifier of at most
// 63 bytes (letters, digits, underscores; not starting with a digit), and not pg_*. Such a name
// needs no quoting, so it can be placed into SQL text safely. The error wraps [ErrInvalid].
func Validate(name string) error {
	if !pattern.MatchString(name) || strings.HasPrefix(name, "pg_") {
		return fmt.Errorf("%w %q: use a lowercase identifier of letters, digits and underscores (at most 63 bytes, not starting with a digit or pg_)", ErrInvalid, name)
	}
	return nil
}

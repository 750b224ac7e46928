package migrations

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
)

// MigrateBefore applies the embedded migrations that come before the one whose file name ends
// in suffix, so a test can build a schema as an older release left it.
func MigrateBefore(ctx context.Context, conn *pgx.Conn, schema, suffix string) error {
	names, err := migrate.FindMigrations(sqlFS())
	if err != nil {
		return err
	}
	for i, n := range names {
		if strings.HasSuffix(n, suffix) {
			m, err := newMigrator(ctx, conn, schema)
			if err != nil {
				return err
			}
			return m.MigrateTo(ctx, int32(i))
		}
	}
	return fmt.Errorf("no migration named *%s", suffix)
}

// Rendered returns the SQL of the embedded migration whose file name ends in suffix, with
// schema substituted.
func Rendered(schema, suffix string) (string, error) {
	names, err := migrate.FindMigrations(sqlFS())
	if err != nil {
		return "", err
	}
	for _, n := range names {
		if strings.HasSuffix(n, suffix) {
			b, err := files.ReadFile("sql/" + n)
			if err != nil {
				return "", err
			}
			return strings.ReplaceAll(string(b), "{{.schema}}", schema), nil
		}
	}
	return "", fmt.Errorf("no migration named *%s", suffix)
}

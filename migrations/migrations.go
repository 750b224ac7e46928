package migrations

import (
	"context"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"

	"github.com/keiro-go/keiro/internal/advisorylock"
	"github.com/keiro-go/keiro/internal/schemaname"
)

//go:embed sql/*.sql
var files embed.FS

// DefaultSchema is the PostgreSQL schema that holds keiro's tables unless configured otherwise.
const DefaultSchema = schemaname.Default

// versionTable is the table, inside the schema, where the applied version is recorded.
const versionTable = "keiro_schema_version"

// ErrInvalidSchema reports a schema name that is not a plain lowercase SQL identifier.
var ErrInvalidSchema = schemaname.ErrInvalid

// ValidateSchema checks that name is usable as keiro's schema: a lowercase SQL identifier of at
// most 63 bytes (letters, digits, underscores; not starting with a digit), and not pg_*.
// Such a name needs no quoting, so it can be placed into SQL text safely. The outbox, inbox and
// event stores apply the same check to their configured schema.
func ValidateSchema(name string) error { return schemaname.Validate(name) }

// Migration describes one embedded migration and whether it is applied.
type Migration struct {
	// Version is the migration's sequence number (1-based).
	Version int32
	// Name is the migration's file name.
	Name string
	// Applied reports whether the schema is at or past this version.
	Applied bool
}

// Status is the state of a schema's migrations.
type Status struct {
	// Schema is the schema inspected.
	Schema string
	// Current is the applied version (0 when none is).
	Current int32
	// Latest is the newest embedded version.
	Latest int32
	// Migrations lists every embedded migration.
	Migrations []Migration
}

// Pending reports whether embedded migrations remain to be applied.
func (s Status) Pending() bool { return s.Current < s.Latest }

// Migrate applies every embedded migration not yet applied to schema, creating the schema if
// needed. It runs under a PostgreSQL advisory lock taken on the connection, so concurrent
// migrators (several relays starting at once) apply each migration exactly once; applying
// twice is a no-op. Each migration runs in its own transaction.
func Migrate(ctx context.Context, conn *pgx.Conn, schema string) error {
	if err := ValidateSchema(schema); err != nil {
		return err
	}
	return withSchemaLock(ctx, conn, schema, func() error {
		if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+schema); err != nil {
			return fmt.Errorf("create schema %s: %w", schema, err)
		}
		m, err := newMigrator(ctx, conn, schema)
		if err != nil {
			return err
		}
		if err := m.Migrate(ctx); err != nil {
			return fmt.Errorf("migrate schema %s: %w", schema, err)
		}
		return nil
	})
}

// GetStatus reports which embedded migrations are applied to schema. A schema that does not
// exist yet reports version 0.
func GetStatus(ctx context.Context, conn *pgx.Conn, schema string) (Status, error) {
	if err := ValidateSchema(schema); err != nil {
		return Status{}, err
	}
	names, err := migrate.FindMigrations(sqlFS())
	if err != nil {
		return Status{}, fmt.Errorf("find embedded migrations: %w", err)
	}
	st := Status{Schema: schema, Latest: int32(len(names))}
	var exists bool
	err = conn.QueryRow(ctx,
		`SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = $1 AND tablename = $2)`,
		schema, versionTable).Scan(&exists)
	if err != nil {
		return Status{}, fmt.Errorf("read migration status of %s: %w", schema, err)
	}
	if exists {
		if err := conn.QueryRow(ctx, "SELECT version FROM "+schema+"."+versionTable).Scan(&st.Current); err != nil {
			return Status{}, fmt.Errorf("read migration version of %s: %w", schema, err)
		}
	}
	for i, n := range names {
		v := int32(i + 1)
		st.Migrations = append(st.Migrations, Migration{Version: v, Name: n, Applied: v <= st.Current})
	}
	return st, nil
}

// Latest returns the newest embedded migration version.
func Latest() int32 {
	names, _ := migrate.FindMigrations(sqlFS())
	return int32(len(names))
}

func sqlFS() fs.FS {
	sub, err := fs.Sub(files, "sql")
	if err != nil {
		panic(err) // the embed pattern guarantees the directory
	}
	return sub
}

func newMigrator(ctx context.Context, conn *pgx.Conn, schema string) (*migrate.Migrator, error) {
	m, err := migrate.NewMigratorEx(ctx, conn, schema+"."+versionTable, &migrate.MigratorOptions{})
	if err != nil {
		return nil, fmt.Errorf("prepare migrator for %s: %w", schema, err)
	}
	m.Data["schema"] = schema
	if err := m.LoadMigrations(sqlFS()); err != nil {
		return nil, fmt.Errorf("load embedded migrations: %w", err)
	}
	return m, nil
}

// withSchemaLock runs fn while holding the schema's session advisory lock (advisorylock.Migrate),
// so that creating the schema and its version table is not raced by another migrator.
func withSchemaLock(ctx context.Context, conn *pgx.Conn, schema string, fn func() error) (err error) {
	lockSQL := "SELECT pg_advisory_lock(" + advisorylock.Migrate("$1") + ")"
	unlockSQL := "SELECT pg_advisory_unlock(" + advisorylock.Migrate("$1") + ")"
	if _, err := conn.Exec(ctx, lockSQL, schema); err != nil {
		return fmt.Errorf("take migration lock for %s: %w", schema, err)
	}
	defer func() {
		// Unlock on a fresh context so a cancelled caller still releases the lock.
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), unlockSQL, schema); uerr != nil && err == nil {
			err = fmt.Errorf("release migration lock for %s: %w", schema, uerr)
		}
	}()
	return fn()
}

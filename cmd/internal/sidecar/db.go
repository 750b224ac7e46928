package sidecar

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/cmd/internal/pgconfig"
	"github.com/keiro-go/keiro/migrations"
)

// DB are the database flags of both binaries, embedded in their grammars: where keiro's tables
// are and how to reach them.
type DB struct {
	DatabaseURL cli.DSN `help:"PostgreSQL connection URL (required); TLS through sslmode.${database_url_help}" placeholder:"URL"`
	Schema      string  `help:"Schema holding keiro's tables." default:"${schema}"`
	PgBouncer   bool    `name:"pgbouncer" help:"The database URL points at PgBouncer in transaction pooling mode: no named prepared statements (pgx cache_describe)${pgbouncer_help}; migrations must then run on a direct connection."`
}

// Validate reports a missing URL, naming the variable of envPrefix that can set it, and a bad
// schema name. A grammar's ValidateFlags calls it.
func (f *DB) Validate(envPrefix string) error {
	var p cli.Problems
	if f.DatabaseURL == "" {
		p.Add("database-url", "is required (or set $%s_DATABASE_URL)", envPrefix)
	}
	p.AddErr("schema", migrations.ValidateSchema(f.Schema))
	return p.Err()
}

// PG is the connection setup of the flags.
func (f *DB) PG() pgconfig.Options { return pgconfig.Options{PgBouncer: f.PgBouncer} }

// Connect opens one connection, for an operator command or a check before starting. A URL that
// does not parse is a usage error (exit 2).
func (f *DB) Connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := f.PG().ParseConn(f.DatabaseURL.Reveal())
	if err != nil {
		return nil, f.usageError(err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, f.connectError(err)
	}
	return conn, nil
}

// OpenPool opens a pool and checks that PostgreSQL answers. A URL that does not parse is a
// usage error (exit 2).
func (f *DB) OpenPool(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := f.PG().ParsePool(f.DatabaseURL.Reveal())
	if err != nil {
		return nil, f.usageError(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open PostgreSQL pool for %s: %w", f.DatabaseURL, cli.RedactError(err, f.DatabaseURL))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, f.connectError(err)
	}
	return pool, nil
}

// usageError is a --database-url that does not parse (exit 2).
func (f *DB) usageError(err error) error {
	return &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf("--database-url %s: %w", f.DatabaseURL, err)}
}

// connectError is a connection PostgreSQL refused or never answered, without the URL's secrets.
func (f *DB) connectError(err error) error {
	return fmt.Errorf("connect to PostgreSQL at %s: %w", f.DatabaseURL, cli.RedactError(pgconfig.ConnectError(err), f.DatabaseURL))
}

// errMigrateThroughPgBouncer explains why migrations do not run with --pgbouncer.
const errMigrateThroughPgBouncer = "migrations hold a session advisory lock, which PgBouncer in transaction mode " +
	"does not keep: run `%s` without --pgbouncer, with --database-url pointing at PostgreSQL directly " +
	"(or at a session-pooled PgBouncer database)"

// MigrationsAllowed refuses (exit 2) to migrate through a transaction-pooling PgBouncer; command
// is the migrate command to run instead on a direct connection ("relay migrate").
func (f *DB) MigrationsAllowed(command string) error {
	if f.PgBouncer {
		return &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf(errMigrateThroughPgBouncer, command)}
	}
	return nil
}

// Migrate is the migrate command of both binaries (command names it, as "relay migrate"): it
// applies every pending migration on a connection of its own, under the migrations' advisory
// lock, and returns the schema's status after.
func (f *DB) Migrate(ctx context.Context, command string) (migrations.Status, error) {
	if err := f.MigrationsAllowed(command); err != nil {
		return migrations.Status{}, err
	}
	conn, err := f.Connect(ctx)
	if err != nil {
		return migrations.Status{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := migrations.Migrate(ctx, conn, f.Schema); err != nil {
		return migrations.Status{}, fmt.Errorf("migrate: %w", err)
	}
	return migrations.GetStatus(ctx, conn, f.Schema)
}

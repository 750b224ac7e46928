package pgconfig_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/cmd/internal/pgconfig"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/keirotest/testenv/pgbouncer"
)

// interleave runs, through PgBouncer in transaction mode, a statement on c1, then holds that
// server connection in a transaction of c2, and runs the statement again on c1 (which now lands
// on another server connection).
func interleave(t *testing.T, cfg *pgx.ConnConfig) error {
	ctx := context.Background()
	c1, err := pgx.ConnectConfig(ctx, cfg.Copy())
	require.NoError(t, err)
	defer c1.Close(ctx)
	c2, err := pgx.ConnectConfig(ctx, cfg.Copy())
	require.NoError(t, err)
	defer c2.Close(ctx)

	const q = `SELECT $1::int + 1`
	var n int
	require.NoError(t, c1.QueryRow(ctx, q, 1).Scan(&n))
	tx, err := c2.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	if err := c1.QueryRow(ctx, q, 2).Scan(&n); err != nil {
		return err
	}
	require.Equal(t, 3, n)
	return nil
}

func TestPgBouncerModeSurvivesTransactionPooling(t *testing.T) {
	t.Parallel()
	b := pgbouncer.Start(t)

	// pgx's default: the named statement stays on the first server connection.
	plain, err := pgconfig.Options{}.ParseConn(b.URL())
	require.NoError(t, err)
	err = interleave(t, plain)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "the default mode must break behind PgBouncer (got %v); the test would prove nothing otherwise", err)
	require.Equal(t, "26000", pgErr.Code)

	pooled, err := pgconfig.Options{PgBouncer: true}.ParseConn(b.URL())
	require.NoError(t, err)
	require.Equal(t, pgx.QueryExecModeCacheDescribe, pooled.DefaultQueryExecMode)
	require.NoError(t, interleave(t, pooled))

	pool, err := pgconfig.Options{PgBouncer: true}.ParsePool(b.URL())
	require.NoError(t, err)
	require.Equal(t, pgx.QueryExecModeCacheDescribe, pool.ConnConfig.DefaultQueryExecMode)
}

func TestExecModeFromTheURL(t *testing.T) {
	t.Parallel()
	const base = "postgres://u@127.0.0.1:5432/db?sslmode=disable"

	require.False(t, pgconfig.Options{}.Pooled(base))
	require.True(t, pgconfig.Options{PgBouncer: true}.Pooled(base))
	require.True(t, pgconfig.Options{}.Pooled(base+"&default_query_exec_mode=cache_describe"), "the URL's mode says pooled")
	require.False(t, pgconfig.Options{}.Pooled(base+"&default_query_exec_mode=cache_statement"))

	cfg, err := pgconfig.Options{PgBouncer: true}.ParseConn(base + "&default_query_exec_mode=describe_exec")
	require.NoError(t, err)
	require.Equal(t, pgx.QueryExecModeDescribeExec, cfg.DefaultQueryExecMode, "the URL's mode wins")
	require.Zero(t, cfg.StatementCacheCapacity)

	for _, mode := range []string{"exec", "simple_protocol"} {
		_, err = pgconfig.Options{}.ParsePool(base + "&default_query_exec_mode=" + mode)
		require.ErrorContains(t, err, "cannot encode the typed parameters", mode)
	}

	cfg, err = pgconfig.Options{}.ParseConn(base)
	require.NoError(t, err)
	require.Equal(t, pgx.QueryExecModeCacheStatement, cfg.DefaultQueryExecMode, "without PgBouncer mode pgx's default stays")

	_, err = pgconfig.Options{PgBouncer: true}.ParseConn(base + "&default_query_exec_mode=cache_statement")
	require.ErrorContains(t, err, "cache_statement prepares named statements")
	_, err = pgconfig.Options{PgBouncer: true}.ParsePool("host=x default_query_exec_mode=cache_statement")
	require.ErrorContains(t, err, "remove it from the connection URL")
}

// envelope.UUID goes in and out of PostgreSQL as a uuid in both the default mode and the
// PgBouncer mode, NULL included through *envelope.UUID.
func TestEnvelopeUUIDThroughPgx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, o := range []pgconfig.Options{{}, {PgBouncer: true}} {
		cfg, err := o.ParseConn(testenv.DatabaseURL())
		require.NoError(t, err)
		conn, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		u := envelope.NewUUIDv7()
		var got envelope.UUID
		var text string
		require.NoError(t, conn.QueryRow(ctx, `SELECT $1::uuid, $1::uuid::text`, u).Scan(&got, &text))
		require.Equal(t, u, got)
		require.Equal(t, u.String(), text)
		var null *envelope.UUID
		require.NoError(t, conn.QueryRow(ctx, `SELECT NULL::uuid`).Scan(&null))
		require.Nil(t, null)
		require.Error(t, conn.QueryRow(ctx, `SELECT NULL::uuid`).Scan(&got))
		require.NoError(t, conn.Close(ctx))
	}
}

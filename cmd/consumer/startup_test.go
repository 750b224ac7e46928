package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// runFlags are the flags a sql-mode run needs, without the database and brokers.
var runFlags = []string{"run", "--group=billing", "--topics=orders.v1", "--handler=sql", "--sql-function=billing.apply", "--http-addr="}

// A broker address that is not host:port is a configuration error (exit 2), reported before the
// consumer touches the database: --migrate has not run.
func TestBadBrokerAddressExitsBeforeMigrating(t *testing.T) {
	schema := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true}).Schema
	args := append([]string{"--database-url=" + testenv.DatabaseURL(), "--schema=" + schema}, runFlags...)
	code, _, stderr := runArgs(t, append(args, "--brokers=k1:9092,127.0.0.1:kafka", "--migrate")...)
	require.Equal(t, cli.ExitUsage, code, stderr)
	require.Contains(t, stderr, `consumer: error: --brokers: "127.0.0.1:kafka" is not host:port: port "kafka" is not a number from 1 to 65535`+"\n")

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.DatabaseURL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var tables int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&tables))
	require.Zero(t, tables, "the consumer migrated schema %s before rejecting its configuration", schema)
}

// Values from the environment that fail validation name their variable; a negative number after
// a flag is the flag's value, rejected with the flag's name and range.
func TestInvalidValuesNameTheirSource(t *testing.T) {
	t.Setenv("KEIRO_CONSUMER_BATCH_SIZE", "-1")
	t.Setenv("KEIRO_CONSUMER_CONCURRENCY", "0")
	t.Setenv("KEIRO_CONSUMER_PERSISTENCE", "some")
	args := append([]string{"--database-url=postgres://h/db", "--brokers=k:9092"}, runFlags...)
	code, _, stderr := runArgs(t, append(args, "--max-attempts", "-1", "--shutdown-timeout", "-1s")...)
	require.Equal(t, cli.ExitUsage, code, stderr)
	for _, want := range []string{
		"--batch-size: must be 0 (the mode's default) or more, got -1 (from $KEIRO_CONSUMER_BATCH_SIZE)\n",
		"--concurrency: must be at least 1, got 0 (from $KEIRO_CONSUMER_CONCURRENCY)\n",
		`--persistence: unknown mode "some": use full or dedupe-only (from $KEIRO_CONSUMER_PERSISTENCE)` + "\n",
		"--max-attempts: must be at least 1, got -1\n",
		"--shutdown-timeout: must be positive, got -1s\n",
	} {
		require.Contains(t, stderr, want)
	}
	require.NotContains(t, stderr, "short flag")
}

// An unreachable database, with the default sslmode (prefer: TLS, then plaintext), is one line
// that names the address and the last attempt's cause.
func TestUnreachableDatabaseIsOneLine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	args := append([]string{fmt.Sprintf("--database-url=postgres://billing:pw@%s/app", addr), "--brokers=k:9092"}, runFlags...)
	code, _, stderr := runArgs(t, args...)
	require.Equal(t, cli.ExitFailure, code, stderr)
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if strings.HasPrefix(l, "consumer: error: ") || strings.HasPrefix(l, "\t") {
			lines = append(lines, l)
		}
	}
	require.Len(t, lines, 1, stderr)
	require.Contains(t, lines[0], addr)
	require.Contains(t, lines[0], "connection refused")
	require.NotContains(t, lines[0], ":pw@")
}

package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// tablesIn counts the tables of schema: 0 means no migration ran.
func tablesIn(t *testing.T, schema string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// errorLines are the lines the relay printed as errors.
func errorLines(stderr string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if strings.HasPrefix(l, "relay: error: ") || strings.HasPrefix(l, "\t") {
			out = append(out, l)
		}
	}
	return out
}

// A broker address that is not host:port is a configuration error (exit 2), reported with the
// rest of the configuration before the relay touches the database: --migrate has not run.
func TestBadBrokerAddressExitsBeforeMigrating(t *testing.T) {
	schema := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true}).Schema
	for _, tc := range []struct{ brokers, want string }{
		{"127.0.0.1:kafka", `--brokers: "127.0.0.1:kafka" is not host:port: port "kafka" is not a number from 1 to 65535`},
		{"k1:9092,:9092", `--brokers: ":9092" is not host:port: the host is missing`},
		{"k1:9092,k2:70000", `--brokers: "k2:70000" is not host:port: port "70000" is not a number from 1 to 65535`},
		{"k1:9092,k2", `--brokers: "k2" is not host:port: the port is missing`},
		{"::1:9092", `--brokers: "::1:9092" is not host:port: too many colons in address (an IPv6 address is written [addr]:port)`},
	} {
		r := invoke(t, "--database-url="+testenv.DatabaseURL(), "--schema="+schema, "--brokers="+tc.brokers,
			"--migrate", "--http-addr=", "--batch-size=0")
		if r.code != cli.ExitUsage {
			t.Fatalf("--brokers=%s: exit %d, want %d\n%s", tc.brokers, r.code, cli.ExitUsage, r.stderr)
		}
		if !strings.Contains(r.stderr, "relay: error: "+tc.want+"\n") {
			t.Fatalf("--brokers=%s: stderr lacks %q:\n%s", tc.brokers, tc.want, r.stderr)
		}
		if !strings.Contains(r.stderr, "--batch-size: must be at least 1") {
			t.Fatalf("--brokers=%s: not reported with the other problems:\n%s", tc.brokers, r.stderr)
		}
	}
	if n := tablesIn(t, schema); n != 0 {
		t.Fatalf("schema %s has %d tables: the relay migrated before rejecting its configuration", schema, n)
	}
}

// A value from the environment that fails validation names its variable.
func TestInvalidEnvironmentValueNamesItsVariable(t *testing.T) {
	t.Setenv("KEIRO_RELAY_BATCH_SIZE", "-1")
	t.Setenv("KEIRO_RELAY_POLICY", "fifo")
	t.Setenv("KEIRO_RELAY_LEASE", "500ms")
	r := invoke(t, "--database-url=postgres://h/db", "--brokers=k:9092", "--lease=1m")
	if r.code != cli.ExitUsage {
		t.Fatalf("exit %d, want %d\n%s", r.code, cli.ExitUsage, r.stderr)
	}
	for _, want := range []string{
		"relay: error: --batch-size: must be at least 1, got -1 (from $KEIRO_RELAY_BATCH_SIZE)\n",
		`relay: error: --policy: unknown policy "fifo": use per-key, per-source, stop-the-line, best-effort (from $KEIRO_RELAY_POLICY)` + "\n",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "lease") {
		t.Errorf("--lease on the command line wins over $KEIRO_RELAY_LEASE:\n%s", r.stderr)
	}
}

// A negative number after a flag is that flag's value, rejected by validation with the flag's
// name and range, not read as a short flag.
func TestNegativeValueAfterFlag(t *testing.T) {
	r := invoke(t, "--database-url=postgres://h/db", "--brokers", "k:9092", "--batch-size", "-1",
		"--backoff-multiplier", "-0.5", "--lease", "-5s", "--max-record-bytes", "-1")
	if r.code != cli.ExitUsage {
		t.Fatalf("exit %d, want %d\n%s", r.code, cli.ExitUsage, r.stderr)
	}
	for _, want := range []string{
		"--batch-size: must be at least 1, got -1\n",
		"--backoff-multiplier: must be at least 1, got -0.5\n",
		"--lease: must be positive, got -5s\n",
		"--max-record-bytes: must not be negative (0 means the producer's limit), got -1\n",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "short flag") {
		t.Errorf("a negative value was read as a short flag:\n%s", r.stderr)
	}
}

// An unreachable database, with the default sslmode (prefer: TLS, then plaintext), is one line
// that names the address and the last attempt's cause.
func TestUnreachableDatabaseIsOneLine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	r := invoke(t, fmt.Sprintf("--database-url=postgres://relay:pw@%s/app", addr), "--brokers=k:9092", "--http-addr=")
	if r.code != cli.ExitFailure {
		t.Fatalf("exit %d, want %d\n%s", r.code, cli.ExitFailure, r.stderr)
	}
	lines := errorLines(r.stderr)
	if len(lines) != 1 {
		t.Fatalf("want one error line, got %d:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, want := range []string{addr, "connection refused", "relay:******@"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("error line lacks %q: %s", want, lines[0])
		}
	}
	if strings.Contains(lines[0], ":pw@") {
		t.Errorf("password printed: %s", lines[0])
	}
}

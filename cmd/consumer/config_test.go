package main

import (
	"bytes"
	"context"
	"fmt"
	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/cmd/internal/cli/dsntest"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func runArgs(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestHelpListsEveryFlagWithItsVariable(t *testing.T) {
	code, out, _ := runArgs(t, "run", "--help")
	require.Equal(t, 0, code)
	for _, v := range []string{
		"DATABASE_URL", "SCHEMA", "BROKERS", "GROUP", "NAME", "TOPICS", "HANDLER", "HTTP_URL",
		"HTTP_TIMEOUT", "HTTP_HEADER", "SQL_FUNCTION", "DLQ_TOPIC", "MAX_ATTEMPTS", "BATCH_SIZE",
		"CONCURRENCY", "BACKOFF_INITIAL", "BACKOFF_MAX", "DEDUPE_POLICY", "ISOLATION_LEVEL", "PERSISTENCE", "RETENTION", "HTTP_ADDR", "MIGRATE",
		"SCHEMA_REGISTRY_URL", "SCHEMA_REGISTRY_USER", "SCHEMA_REGISTRY_PASSWORD", "LOG_LEVEL",
	} {
		require.Regexp(t, `\$`+EnvPrefix+"_"+v+`[;)]`, out, "help of run lists $%s_%s", EnvPrefix, v)
	}
	for flag, def := range map[string]any{
		"max-attempts": DefaultMaxAttempts, "batch-size": DefaultBatchSize, "concurrency": DefaultConcurrency,
		"retention": DefaultRetention, "shutdown-timeout": DefaultShutdownTimeout, "dlq-topic": DefaultDLQTopic,
		"http-addr": DefaultHTTPAddr, "dedupe-policy": DefaultDedupePolicy, "isolation-level": DefaultIsolationLevel, "persistence": DefaultPersistence,
		"http-timeout": DefaultHTTPTimeout, "backoff-initial": DefaultBackoffInitial, "backoff-max": DefaultBackoffMax,
	} {
		want := fmt.Sprint(def)
		if d, ok := def.(time.Duration); ok {
			want = d.String() // 168h0m0s is written 168h in the tags
			if strings.HasSuffix(want, "m0s") {
				want = strings.TrimSuffix(want, "0s")
			}
			if strings.HasSuffix(want, "h0m") {
				want = strings.TrimSuffix(want, "0m")
			}
		}
		require.Regexp(t, `--`+flag+`="?`+regexp.QuoteMeta(want)+`"?\s`, out, "default of --%s", flag)
	}

	code, out, _ = runArgs(t, "--help")
	require.Equal(t, 0, code)
	for _, c := range []string{"run", "migrate", "status", "inbox failed list", "inbox failed retry"} {
		require.Contains(t, out, c)
	}
}

func TestConfigReportsEveryProblemAtOnce(t *testing.T) {
	code, _, stderr := runArgs(t, "run", "--handler=ftp", "--max-attempts=0", "--batch-size=-1",
		"--concurrency=0", "--dedupe-policy=zz", "--isolation-level=serializable", "--persistence=some", "--retention=-1s", "--schema=Bad-Name")
	require.Equal(t, 2, code)
	for _, want := range []string{
		"--database-url: is required", "--schema:", "--group: is required", "--brokers: is required",
		"--topics: is required", `--handler: unknown mode "ftp"`, "--max-attempts", "--batch-size",
		"--concurrency", `--dedupe-policy: unknown policy "zz"`, `--isolation-level: unknown level "serializable"`, `--persistence: unknown mode "some"`,
		"--retention: must not be negative",
	} {
		require.Contains(t, stderr, want)
	}
}

func TestConfigFromEnvironment(t *testing.T) {
	t.Setenv("KEIRO_CONSUMER_DATABASE_URL", "postgres://app:pg-secret@db/app")
	t.Setenv("KEIRO_CONSUMER_HANDLER", "sql")
	t.Setenv("KEIRO_CONSUMER_SQL_FUNCTION", "billing.apply; DROP TABLE x")
	t.Setenv("KEIRO_CONSUMER_MAX_ATTEMPTS", "many")
	t.Setenv("KEIRO_CONSUMER_GROUP", "billing")
	t.Setenv("KEIRO_CONSUMER_BROKERS", "k1:9092,k2:9092")
	t.Setenv("KEIRO_CONSUMER_TOPICS", "orders.v1")
	t.Setenv("KEIRO_CONSUMER_DLQ_TOPIC", "orders.v1")
	code, _, stderr := runArgs(t)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `--sql-function: "billing.apply; DROP TABLE x" is not a name`)
	require.Contains(t, stderr, `--max-attempts: expected a valid 64 bit int but got "many" (from $KEIRO_CONSUMER_MAX_ATTEMPTS="many")`)
	require.Contains(t, stderr, `--dlq-topic: "orders.v1" is also consumed`)
	require.NotContains(t, stderr, "--group")
	require.NotContains(t, stderr, "--brokers")
	require.NotContains(t, stderr, "pg-secret")
}

func TestSecretsAreNeverPrinted(t *testing.T) {
	code, out, stderr := runArgs(t, "--database-url=postgres://app:pg-secret@db/app", "run",
		"--handler=http", "--http-url=ftp://svc:url-secret@host/x", "--http-header=Authorization: Bearer hdr-secret",
		"--http-header=not a header hdr-secret2", "--schema-registry-password=sr-secret", "--http-timeout=0s")
	require.Equal(t, 2, code)
	all := out + stderr
	for _, s := range []string{"pg-secret", "url-secret", "hdr-secret", "sr-secret"} {
		require.NotContains(t, all, s)
	}
	require.Contains(t, stderr, "--http-url: must be an absolute http:// or https:// URL, got ftp://svc:******@host/x")
	require.Contains(t, stderr, "--http-header: value #2 is not 'Name: value'")
	require.Contains(t, stderr, "--http-timeout: must be positive")
	require.Contains(t, stderr, "--schema-registry-user: is required when --schema-registry-password is set")
	require.Contains(t, stderr, "--schema-registry-url: is required")
}

func TestHeadersParse(t *testing.T) {
	f := handlerFlags{HTTPHeader: []cli.Secret{"authorization:  Bearer x", "X-Tenant: t1", "x-tenant: t2"}}
	h, err := f.headers()
	require.NoError(t, err)
	require.Equal(t, "Bearer x", h.Get("Authorization"))
	require.Equal(t, []string{"t1", "t2"}, h.Values("X-Tenant"))
	for _, bad := range []cli.Secret{"novalue-s3", ": s3", "Bad Name: s3", "A: s3\r\nInjected: x"} {
		f.HTTPHeader = []cli.Secret{bad}
		_, err := f.headers()
		require.Error(t, err, "%q", bad)
		require.False(t, strings.Contains(err.Error(), "s3"))
	}
}

// Property: a connection string with a random secret in any place and form (generated, valid or
// broken) never shows it in what the consumer prints when it cannot parse or reach the
// database.
func TestGeneratedDSNSecretsNeverPrinted(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 3))
	for range 150 {
		c := dsntest.Gen(r)
		code, out, stderr := runArgs(t, "--database-url="+c.DSN, "status")
		require.NotEqual(t, 0, code, "status with %q succeeded", c.DSN)
		for _, f := range c.Forbidden {
			if strings.Contains(out+stderr, f) {
				t.Fatalf("the secret %q (as %q) of\n%q\nwas printed:\n%s", c.Secret, f, c.DSN, stderr)
			}
		}
	}
}

package sidecar_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/cmd/internal/healthcheck/healthchecktest"
	"github.com/keiro-go/keiro/cmd/internal/sidecar"
)

// grammar is a binary's command line reduced to what the package gives it.
type grammar struct {
	DB          dbFlags                `embed:""`
	Run         runCmd                 `cmd:"" default:"withargs" help:"Run."`
	Healthcheck sidecar.HealthcheckCmd `cmd:"" help:"Check."`
}

type dbFlags struct{ sidecar.DB }

func (f *dbFlags) ValidateFlags() error { return f.Validate("KEIRO_SIDECARTEST") }

type runCmd struct{}

func (c *runCmd) Run(env *cli.Env) error {
	_, err := io.WriteString(env.Stdout, "running\n")
	return err
}

func testSidecar() *sidecar.Sidecar {
	return &sidecar.Sidecar{
		Name: "test", EnvPrefix: "KEIRO_SIDECARTEST", DefaultHTTPAddr: "127.0.0.1:9",
		DatabaseURLHelp: " The password is never printed.", PgBouncerHelp: ", polling only",
	}
}

func run(s *sidecar.Sidecar, args ...string) (code int, stdout, stderr string) {
	var out, errb strings.Builder
	code = s.Run(context.Background(), &grammar{}, args, &out, &errb)
	return code, out.String(), errb.String()
}

// The shared flags keep each binary's help: the Sidecar's words are put into the tags.
func TestDBFlagsHelp(t *testing.T) {
	code, out, _ := run(testSidecar(), "--help")
	require.Equal(t, 0, code)
	flat := strings.Join(strings.Fields(out), " ")
	require.Contains(t, flat, "PostgreSQL connection URL (required); TLS through sslmode. The password is never printed ($KEIRO_SIDECARTEST_DATABASE_URL)")
	require.Contains(t, flat, "no named prepared statements (pgx cache_describe), polling only; migrations must then run on a direct connection")
	require.Contains(t, flat, `Schema holding keiro's tables ($KEIRO_SIDECARTEST_SCHEMA; default: keiro)`)

	code, out, _ = run(&sidecar.Sidecar{Name: "bare", EnvPrefix: "KEIRO_SIDECARTEST", DefaultHTTPAddr: "127.0.0.1:9"}, "--help")
	require.Equal(t, 0, code)
	flat = strings.Join(strings.Fields(out), " ")
	require.Contains(t, flat, "TLS through sslmode ($KEIRO_SIDECARTEST_DATABASE_URL)")
	require.Contains(t, flat, "(pgx cache_describe); migrations")
}

// A missing URL is a usage error that names the variable setting it; a set one runs the command.
func TestDBFlagsValidate(t *testing.T) {
	code, _, stderr := run(testSidecar(), "--schema=Bad")
	require.Equal(t, cli.ExitUsage, code)
	require.Contains(t, stderr, "test: error: --database-url: is required (or set $KEIRO_SIDECARTEST_DATABASE_URL)")
	require.Contains(t, stderr, "--schema")

	code, stdout, stderr := run(testSidecar(), "--database-url=postgres://h/db")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "running\n", stdout)
}

// Migrations never run through a transaction-pooling PgBouncer: exit 2, and the command to
// run on a direct connection instead.
func TestMigrateRefusesPgBouncer(t *testing.T) {
	db := sidecar.DB{DatabaseURL: "postgres://h/db", Schema: "keiro", PgBouncer: true}
	_, err := db.Migrate(context.Background(), "test migrate")
	var ee *cli.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, cli.ExitUsage, ee.Code)
	require.Contains(t, err.Error(), "run `test migrate` without --pgbouncer")
}

// "NAME healthcheck" needs no database flags, typed first or after other flags.
func TestHealthcheck(t *testing.T) {
	healthchecktest.Command(t, func(args []string, stdout, stderr io.Writer) int {
		return testSidecar().Run(context.Background(), &grammar{}, args, stdout, stderr)
	})
}

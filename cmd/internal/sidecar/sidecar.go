package sidecar

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kong"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/cmd/internal/gctune"
	"github.com/keiro-go/keiro/cmd/internal/healthcheck"
	"github.com/keiro-go/keiro/migrations"
)

// Sidecar describes one of the binaries: what its command line and its healthcheck need to
// know about it.
type Sidecar struct {
	// Name is the binary's name as typed ("relay"). Required.
	Name string
	// EnvPrefix is prepended to every flag's environment variable ("KEIRO_RELAY"). Required.
	EnvPrefix string
	// Description is the one-paragraph summary --help shows. Defaults to none.
	Description string
	// DefaultHTTPAddr is where the binary's HTTP server listens unless configured, which its
	// healthcheck calls. Required.
	DefaultHTTPAddr string
	// DatabaseURLHelp ends the help of --database-url (" The password is never printed.").
	// Defaults to nothing.
	DatabaseURLHelp string
	// PgBouncerHelp is what --pgbouncer implies besides pgx's cache_describe mode, appended to
	// its help (", polling only (implies --poll-only)"). Defaults to nothing.
	PgBouncerHelp string
	// Options are the binary's own kong options (mappers, vars). Defaults to none.
	Options []kong.Option
}

// RunFunc is a binary's whole command line: it parses args, runs the selected command and
// returns the process exit code.
type RunFunc func(ctx context.Context, args []string, stdout, stderr io.Writer) int

// Main runs a binary: the garbage collector tuned for a sidecar (gctune), run under a context
// that SIGINT and SIGTERM cancel, then the process exits with run's code.
func Main(run RunFunc) {
	gctune.Apply()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// App is the binary's command line: its name, environment prefix and description, the
// variables the shared flags' tags read, the binary's own options, and the Sidecar bound for
// the commands' Run methods.
func (s *Sidecar) App() cli.App {
	vars := kong.Vars{
		"sidecar":           s.Name,
		"schema":            migrations.DefaultSchema,
		"database_url_help": s.DatabaseURLHelp,
		"pgbouncer_help":    s.PgBouncerHelp,
	}
	return cli.App{
		Name:        s.Name,
		Description: s.Description,
		EnvPrefix:   s.EnvPrefix,
		Options:     append([]kong.Option{vars, kong.Bind(s)}, s.Options...),
	}
}

// Run is the binary's command line: "NAME healthcheck …" goes to the healthcheck before any
// flag is parsed (a container's check needs no database flags); anything else is parsed into
// grammar, whose selected command runs. It returns the process exit code.
func (s *Sidecar) Run(ctx context.Context, grammar any, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == healthcheck.Command {
		return s.healthcheck(ctx, args[1:], stdout, stderr)
	}
	a := s.App()
	a.Stdout, a.Stderr = stdout, stderr
	return a.Run(ctx, grammar, args)
}

// healthcheck runs "NAME healthcheck args…" and returns its exit code.
func (s *Sidecar) healthcheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return healthcheck.Run(ctx, s.Name, s.EnvPrefix, s.DefaultHTTPAddr, args, stdout, stderr)
}

// HealthcheckCmd is the healthcheck in a binary's grammar, for --help and for flags typed before
// it ("relay --log-level=debug healthcheck"); [Sidecar.Run] dispatches "NAME healthcheck …"
// before parsing, so the database flags are not needed.
type HealthcheckCmd struct {
	Args []string `arg:"" optional:"" passthrough:"" help:"--http-addr, --endpoint=readyz|healthz, --timeout (${sidecar} healthcheck --help)."`
}

// Run runs the healthcheck; its exit code is the binary's.
func (c *HealthcheckCmd) Run(ctx context.Context, env *cli.Env, s *Sidecar) error {
	if code := s.healthcheck(ctx, c.Args, env.Stdout, env.Stderr); code != 0 {
		return &cli.ExitError{Code: code}
	}
	return nil
}

package main

import (
	"context"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/cmd/internal/healthcheck"
)

// healthcheckCmd is in the grammar for --help; run dispatches "consumer healthcheck …" before
// parsing, so the database flags are not needed (cmd/internal/healthcheck).
type healthcheckCmd struct {
	Args []string `arg:"" optional:"" passthrough:"" help:"--http-addr, --endpoint=readyz|healthz, --timeout (consumer healthcheck --help)."`
}

// Run runs the healthcheck (reached when consumer flags precede "healthcheck").
func (c *healthcheckCmd) Run(ctx context.Context, env *cli.Env) error {
	return runHealthcheck(ctx, c.Args, env)
}

func runHealthcheck(ctx context.Context, args []string, env *cli.Env) error {
	if code := healthcheck.Run(ctx, "consumer", EnvPrefix, DefaultHTTPAddr, args, env.Stdout, env.Stderr); code != 0 {
		return &cli.ExitError{Code: code}
	}
	return nil
}

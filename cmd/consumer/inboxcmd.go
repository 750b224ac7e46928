package main

import (
	"context"
	"errors"

	"github.com/keiro-go/keiro/internal/cli"
)

// inboxCmd groups the operator commands on inbox rows.
type inboxCmd struct {
	Failed failedCmd `cmd:"" help:"Failed (and poisoned) inbox rows."`
}

// failedCmd lists and re-runs failed rows.
type failedCmd struct {
	List  failedListCmd  `cmd:"" help:"List the consumer's failed rows, oldest first."`
	Retry failedRetryCmd `cmd:"" help:"Re-run failed rows through the configured handler."`
}

// failedListCmd lists failed rows.
type failedListCmd struct {
	ID    identityFlags `embed:""`
	Limit int           `help:"Rows listed at most." default:"100"`
}

// ValidateFlags requires a consumer name.
func (c *failedListCmd) ValidateFlags() error {
	var p cli.Problems
	if c.ID.consumerName() == "" {
		p.Add("name", "is required (or --group)")
	}
	if c.Limit < 1 {
		p.Add("limit", "must be at least 1, got %d", c.Limit)
	}
	return p.Err()
}

// Run lists the rows.
func (c *failedListCmd) Run(ctx context.Context, env *cli.Env, g *grammar) error {
	return errors.New("inbox failed list: not wired yet")
}

// failedRetryCmd re-runs failed rows.
type failedRetryCmd struct {
	ID   identityFlags `embed:""`
	H    handlerFlags  `embed:""`
	All  bool          `help:"Re-run every failed row of the consumer."`
	Keys []string      `arg:"" optional:"" help:"Rows to re-run, as source:dedupe-key (as printed by list)." placeholder:"SOURCE:KEY"`
}

// ValidateFlags requires a consumer name and either keys or --all.
func (c *failedRetryCmd) ValidateFlags() error {
	var p cli.Problems
	if c.ID.consumerName() == "" {
		p.Add("name", "is required (or --group)")
	}
	if c.All == (len(c.Keys) > 0) {
		p.Add("all", "give either row keys or --all")
	}
	return p.Err()
}

// Run re-runs the rows.
func (c *failedRetryCmd) Run(ctx context.Context, env *cli.Env, g *grammar) error {
	return errors.New("inbox failed retry: not wired yet")
}

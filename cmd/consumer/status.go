package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/internal/cli"
	"github.com/keiro-go/keiro/migrations"
)

// statusCmd prints the schema version and the inbox's row counts per consumer.
type statusCmd struct{}

// Run prints the status.
func (c *statusCmd) Run(ctx context.Context, env *cli.Env, g *grammar) error {
	conn, err := pgx.Connect(ctx, g.DB.DatabaseURL.Reveal())
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL at %s: %w", g.DB.DatabaseURL, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	st, err := migrations.GetStatus(ctx, conn, g.DB.Schema)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "schema %s at version %d of %d\n", st.Schema, st.Current, st.Latest)
	if st.Pending() {
		fmt.Fprintf(env.Stdout, "migrations pending: run `consumer migrate`\n")
	}
	return nil
}

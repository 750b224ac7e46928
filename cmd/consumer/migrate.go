package main

import (
	"context"
	"fmt"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/migrations"
)

// migrateCmd applies the embedded migrations.
type migrateCmd struct{}

// Run applies every pending migration under the migrations' advisory lock.
func (c *migrateCmd) Run(ctx context.Context, env *cli.Env, g *grammar) error {
	if err := g.DB.migrationsAllowed("consumer migrate"); err != nil {
		return err
	}
	conn, err := g.DB.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := migrations.Migrate(ctx, conn, g.DB.Schema); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	st, err := migrations.GetStatus(ctx, conn, g.DB.Schema)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "schema %s at version %d of %d\n", st.Schema, st.Current, st.Latest)
	return nil
}

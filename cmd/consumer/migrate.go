package main

import (
	"context"
	"fmt"

	"github.com/keiro-go/keiro/cmd/internal/cli"
)

// migrateCmd applies the embedded migrations.
type migrateCmd struct{}

// Run applies every pending migration under the migrations' advisory lock.
func (c *migrateCmd) Run(ctx context.Context, env *cli.Env, g *grammar) error {
	st, err := g.DB.Migrate(ctx, "consumer migrate")
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "schema %s at version %d of %d\n", st.Schema, st.Current, st.Latest)
	return nil
}

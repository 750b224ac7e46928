package main

import (
	"context"
	"fmt"

	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/internal/cli"
	"github.com/keiro-go/keiro/migrations"
)

// statusCmd prints the schema version and, for a named consumer, its failed-row count.
type statusCmd struct {
	ID identityFlags `embed:""`
}

// Run prints the status. It fails (exit 1) when migrations are pending, so that it can serve
// as a deployment check.
func (c *statusCmd) Run(ctx context.Context, env *cli.Env, g *grammar) error {
	conn, err := g.DB.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	st, err := migrations.GetStatus(ctx, conn, g.DB.Schema)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "schema %s at version %d of %d\n", st.Schema, st.Current, st.Latest)
	if st.Pending() {
		return &cli.ExitError{Code: cli.ExitFailure, Err: fmt.Errorf("migrations pending: run `consumer migrate`")}
	}
	if name := c.ID.consumerName(); name != "" {
		store, err := inbox.NewStore(inbox.StoreConfig{Schema: g.DB.Schema, Consumer: name})
		if err != nil {
			return err
		}
		n, err := store.CountFailed(ctx, conn)
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "consumer %s: %d failed rows\n", name, n)
	}
	return nil
}

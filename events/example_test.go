package events_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/migrations"
)

// A tiny bank account: deposits must be positive, withdrawals must be covered.
type (
	Deposited struct{ Amount int }
	Withdrawn struct{ Amount int }
	Account   struct{ Balance int }
	Move      struct{ Amount int } // positive: deposit; negative: withdrawal
)

func Example() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDB()
	defer cleanup()

	store, err := events.NewStore(events.StoreConfig{Schema: schema})
	if err != nil {
		panic(err)
	}
	codec := events.NewJSONCodec[any]()
	_ = events.RegisterJSON[Deposited](codec, "Deposited", 1)
	_ = events.RegisterJSON[Withdrawn](codec, "Withdrawn", 1)
	account := events.Decider[Account, Move, any]{
		Decide: func(a Account, m Move) ([]any, error) {
			switch {
			case m.Amount > 0:
				return []any{Deposited{m.Amount}}, nil
			case a.Balance+m.Amount < 0:
				return nil, errors.New("insufficient funds")
			}
			return []any{Withdrawn{-m.Amount}}, nil
		},
		Evolve: func(a Account, e any) Account {
			switch e := e.(type) {
			case Deposited:
				a.Balance += e.Amount
			case Withdrawn:
				a.Balance -= e.Amount
			}
			return a
		},
	}
	runner, err := events.NewRunner(store, account, codec, events.RunnerConfig[Account]{})
	if err != nil {
		panic(err)
	}
	for _, amount := range []int{100, -30, -500} {
		res, err := runner.Run(ctx, pool, "account-42", Move{amount})
		if err != nil {
			fmt.Println("rejected:", err)
			continue
		}
		fmt.Println("version", res.StreamVersion, "type", res.Events[0].Type)
	}
	state, version, _ := runner.Load(ctx, pool, "account-42")
	fmt.Println("balance", state.Balance, "at version", version)
	// Output:
	// version 1 type Deposited
	// version 2 type Withdrawn
	// rejected: command on account-42 rejected: insufficient funds
	// balance 70 at version 2
}

// exampleDB gives the example a migrated schema of its own, dropped by cleanup.
func exampleDB() (*pgxpool.Pool, string, func()) {
	ctx := context.Background()
	schema := fmt.Sprintf("example_%d", time.Now().UnixNano())
	conn, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		panic(err)
	}
	defer conn.Close(ctx)
	if err := migrations.Migrate(ctx, conn, schema); err != nil {
		panic(err)
	}
	pool, err := pgxpool.New(ctx, testenv.DatabaseURL())
	if err != nil {
		panic(err)
	}
	return pool, schema, func() {
		pool.Close()
		c, err := pgx.Connect(ctx, testenv.DatabaseURL())
		if err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			_ = c.Close(ctx)
		}
	}
}

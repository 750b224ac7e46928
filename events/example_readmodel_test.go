package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/events"
)

// A read model of account balances, filled by an asynchronous projection from a subscription
// and queried with read-your-writes consistency.
func ExampleReadModels() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDB()
	defer cleanup()
	store, err := events.NewStore(events.StoreConfig{Schema: schema})
	if err != nil {
		panic(err)
	}
	rms, err := events.NewReadModels(store, pool, events.ReadModelsConfig{})
	if err != nil {
		panic(err)
	}
	balances := events.ReadModel{Name: "balances", Schema: schema, Table: "balances",
		Subscription: "balances", Version: 1, ShapeHash: "account,balance"}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+balances.QualifiedTable()+` (account text PRIMARY KEY, balance bigint NOT NULL)`); err != nil {
		panic(err)
	}
	if _, err := rms.Register(ctx, balances); err != nil { // once, at startup
		panic(err)
	}
	projection := events.AsyncProjection{Name: "balances", ReadModel: "balances",
		Apply: func(ctx context.Context, tx pgx.Tx, e events.RecordedEvent) error {
			var d Deposited
			if err := json.Unmarshal(e.Data, &d); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+balances.QualifiedTable()+` AS b VALUES ($1, $2)
                ON CONFLICT (account) DO UPDATE SET balance = b.balance + excluded.balance`, e.StreamName, d.Amount)
			return err
		}}
	sub, err := events.NewSubscription(store, pool, events.SubscriptionConfig{Name: "balances"}, rms.Handler(projection))
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = sub.Run(runCtx); close(done) }()
	defer func() { stop(); <-done }()

	var res events.AppendResult
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		data, _ := json.Marshal(Deposited{Amount: 100})
		res, err = store.AppendTx(ctx, tx, "account-7", events.Any, events.EventData{Type: "Deposited", SchemaVersion: 1, Data: data})
		return err
	})
	if err != nil {
		panic(err)
	}
	// Read your write: wait until the subscription has applied the append, then query.
	var balance int64
	err = rms.Query(ctx, balances, events.PositionWait{Target: res.GlobalPosition, Timeout: time.Minute},
		func(ctx context.Context, tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT balance FROM `+balances.QualifiedTable()+` WHERE account = 'account-7'`).Scan(&balance)
		})
	fmt.Println("balance", balance, err)

	// A definition that no longer matches the registry is refused until the model is rebuilt.
	changed := balances
	changed.Version = 2
	err = rms.Query(ctx, changed, events.Eventual{}, func(context.Context, pgx.Tx) error { return nil })
	fmt.Println(errors.Is(err, events.ErrReadModelStaleSchema))
	// Output:
	// balance 100 <nil>
	// true
}

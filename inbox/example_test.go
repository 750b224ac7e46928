package inbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/migrations"
)

// A redelivered message runs its handler once: the second Process is a duplicate.
func ExampleStore_Process() {
	ctx := context.Background()
	schema := "inbox_example_" + envelope.NewUUIDv7().String()[24:]
	conn, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := migrations.Migrate(ctx, conn, schema); err != nil {
		log.Fatal(err)
	}
	defer conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck
	pool, err := pgxpool.New(ctx, testenv.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	store, err := inbox.NewStore(inbox.StoreConfig{Schema: schema, Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	d := inbox.Delivery{Event: envelope.Event{
		MessageID: "order-42-placed", Source: "ordering", Destination: "billing.orders.v1",
		EventType: "OrderPlaced", SchemaVersion: 1, ContentType: envelope.ContentTypeJSON,
		Payload: []byte(`{"order":42}`),
	}}
	charge := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		// The handler's writes go through tx: they commit with the inbox row, or not at all.
		fmt.Println("charging for", string(ev.Payload))
		return nil
	}
	for range 2 {
		res, err := store.Process(ctx, pool, d, charge)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(res.Outcome)
	}
	// Output:
	// charging for {"order":42}
	// processed
	// duplicate
}

package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/migrations"
)

// An operator finds the messages whose handler failed through the consumer's Admin, and
// re-runs one from its stored envelope once the cause is fixed.
func ExampleAdmin_Reprocess() {
	ctx := context.Background()
	schema := "inbox_admin_example_" + envelope.NewUUIDv7().String()[24:]
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
	down := func(context.Context, pgx.Tx, envelope.Event) error { return errors.New("payments service unavailable") }
	if _, err := store.Process(ctx, pool, d, down); err != nil {
		log.Fatal(err)
	}

	admin := inbox.NewAdmin(store)
	failed, err := admin.ListFailed(ctx, pool, inbox.ListOptions{})
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range failed {
		fmt.Println(e.Status, e.DedupeKey, "after", e.Attempts, "attempt:", e.LastError)
	}
	up := func(context.Context, pgx.Tx, envelope.Event) error { return nil }
	res, err := admin.Reprocess(ctx, pool, inbox.Key{Source: failed[0].Source, DedupeKey: failed[0].DedupeKey}, up)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("reprocessed:", res.Outcome)
	// Output:
	// failed order-42-placed after 1 attempt: payments service unavailable
	// reprocessed: processed
}

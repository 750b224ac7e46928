package outbox_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// An operator's view of the outbox goes through an Admin, apart from the producer's Store:
// here the overview and the listing of the rows no relay has published yet.
func ExampleAdmin_ListOutbox() {
	ctx := context.Background()
	db, dropDB := testenv.NewExampleDB()
	defer dropDB()
	store, err := outbox.NewStore(db.Schema)
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := store.EnqueueTx(ctx, tx, envelope.Event{
			MessageID: "order-42-placed", Source: "ordering", Destination: "billing.orders.v1",
			EventType: "OrderPlaced", ContentType: envelope.ContentTypeJSON,
			Payload: []byte(`{"order":42}`), OccurredAt: time.Now().UTC(),
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	admin, err := outbox.NewAdmin(db.Schema)
	if err != nil {
		log.Fatal(err)
	}
	overview, err := admin.Overview(ctx, db.Pool)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("backlog:", overview.Backlog, "dead:", overview.Dead)
	rows, err := admin.ListOutbox(ctx, db.Pool, outbox.ListOptions{Status: outbox.StatusPending})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range rows {
		fmt.Println(r.Status, r.Event.MessageID, "→", r.Event.Destination)
	}
	// Output:
	// backlog: 1 dead: 0
	// pending order-42-placed → billing.orders.v1
}

package keirotest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest"
	"github.com/keiro-go/keiro/outbox"
)

// createInvoice is the billing handler of the consumer examples: it invoices an order, and
// refuses for good an order without an id.
func createInvoice(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
	var p struct {
		OrderID string `json:"orderId"`
	}
	if err := envelope.DecodeJSON(&ev, &p); err != nil {
		return inbox.Permanent(err)
	}
	if p.OrderID == "" {
		return inbox.Permanent(fmt.Errorf("%s %s has no order id", ev.EventType, ev.MessageID))
	}
	_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id) VALUES ($1)`, p.OrderID)
	return err
}

// billingDB is a test database with the invoices table of createInvoice.
func billingDB(t testing.TB) *keirotest.DB {
	db := keirotest.NewDB(t)
	if _, err := db.Pool.Exec(context.Background(), `CREATE TABLE invoices (order_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return db
}

func ExampleRunConsumer() {
	test(func(t testing.TB) {
		db := billingDB(t)
		kafka := keirotest.NewKafka(t, "ordering.orders.v1")
		// The consumer the service runs, with its production configuration; stopped when the
		// test ends.
		consumer := keirotest.RunConsumer(t, db.Pool, kafka, createInvoice, inbox.ConsumerConfig{
			Topics: []string{"ordering.orders.v1"},
		})
		ev := keirotest.JSONEvent(t, "OrderPlaced", map[string]any{"orderId": "1001"})
		ev.Destination = "ordering.orders.v1"
		keirotest.Produce(t, kafka, ev) // as the relay publishes it
		row := consumer.WaitProcessed(t, ev.MessageID)
		fmt.Println(row.Status, row.Entry.Delivery.Event.EventType, "invoices:", count(t, db, "invoices"))
	})
	// Output:
	// completed OrderPlaced invoices: 1
}

func ExampleRequireDeadLettered() {
	test(func(t testing.TB) {
		db := billingDB(t)
		kafka := keirotest.NewKafka(t, "ordering.orders.v1")
		consumer := keirotest.RunConsumer(t, db.Pool, kafka, createInvoice, inbox.ConsumerConfig{
			Topics: []string{"ordering.orders.v1"},
		})
		poison := keirotest.JSONEvent(t, "OrderPlaced", map[string]any{"customer": "ada"}) // no order id
		poison.Destination, poison.MessageID = "ordering.orders.v1", "m-1"
		keirotest.Produce(t, kafka, poison)
		consumer.WaitDeadLettered(t, "m-1")
		dl := keirotest.RequireDeadLettered(t, kafka, "ordering.orders.v1.dlq", keirotest.DeadLettered{
			MessageID: "m-1", Reason: inbox.ReasonPermanent, Count: 1,
		})
		fmt.Println(dl[0].Reason, dl[0].SourceTopic, dl[0].SourceOffset)
		fmt.Println(dl[0].Error)
	})
	// Output:
	// permanent ordering.orders.v1 0
	// permanent: OrderPlaced m-1 has no order id
}

// count returns the number of rows of table.
func count(t testing.TB, db *keirotest.DB, table string) int {
	var n int
	if err := db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func ExampleRequireProcessed() {
	test(func(t testing.TB) {
		db := billingDB(t)
		ev := keirotest.JSONEvent(t, "OrderPlaced", map[string]any{"orderId": "1001"})
		keirotest.Deliver(t, db.Pool, ev, keirotest.DeliverConfig{Handler: createInvoice})
		// The consumer defaults to the one Deliver uses (keirotest.DefaultConsumer).
		row := keirotest.RequireProcessed(t, db.Pool, ev.MessageID)
		fmt.Println(row.Status, row.Entry.Attempts)
	})
	// Output:
	// completed 0
}

func ExampleRequireInboxFailed() {
	test(func(t testing.TB) {
		db := billingDB(t)
		ev := keirotest.JSONEvent(t, "OrderPlaced", map[string]any{"customer": "ada"}) // no order id
		keirotest.Deliver(t, db.Pool, ev, keirotest.DeliverConfig{Handler: createInvoice, Want: inbox.Poisoned})
		row := keirotest.RequireInboxFailed(t, db.Pool, ev.MessageID, keirotest.InboxOptions{
			Status: keirotest.InboxPoisoned, // Deliver produces no dead letter; RunConsumer does
			Error:  "has no order id",
		})
		fmt.Println(row.Status, row.Entry.Attempts)
	})
	// Output:
	// poisoned 1
}

// Header matchers check the Kafka headers the relay wrote: the flow's correlation id, the
// trace, the registry's schema id, any header by name.
func ExampleRequirePublished_headers() {
	test(func(t testing.TB) {
		kafka := keirotest.NewKafka(t, "ordering.orders.v1")
		ev := keirotest.JSONEvent(t, "OrderPlaced", map[string]any{"orderId": "1001"})
		corr, _ := envelope.ParseUUID("0190b0a8-7c4e-7d2a-9f1e-5b3c2d1e0f4a")
		ev.Destination, ev.CorrelationID = "ordering.orders.v1", &corr
		ev.TraceContext = &envelope.TraceContext{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
		keirotest.Produce(t, kafka, ev)
		recs := keirotest.RequirePublished(t, kafka, "ordering.orders.v1", keirotest.Published{EventType: "OrderPlaced"},
			keirotest.WithCorrelationID("0190b0a8-7c4e-7d2a-9f1e-5b3c2d1e0f4a"),
			keirotest.WithTraceID("4bf92f3577b34da6a3ce929d0e0e4736"),
			keirotest.WithHeader("keiro-source", "keirotest"),
			keirotest.WithoutHeader("keiro-causation-id"))
		fmt.Println(len(recs), recs[0].Event.CorrelationID)
	})
	// Output:
	// 1 0190b0a8-7c4e-7d2a-9f1e-5b3c2d1e0f4a
}

// The fastest tests run the service's function in a transaction the kit rolls back when the
// test ends; the assertions read through it.
func ExampleNewTx() {
	test(func(t testing.TB) {
		ctx := context.Background()
		tx := keirotest.NewTx(t) // no schema per test: a migrated one shared, nothing ever committed
		// The service's function under test, in the test's transaction.
		placeOrderTx := func(ctx context.Context, tx pgx.Tx, id string) error {
			_, err := outbox.EnqueueTx(ctx, tx, envelope.Event{
				MessageID: "example-placed-" + id, Source: "ordering", Destination: "ordering.orders.v1", Key: &id,
				EventType: "OrderPlaced", SchemaVersion: 1, ContentType: envelope.ContentTypeJSON,
				Payload: fmt.Appendf(nil, `{"orderId":%q}`, id), OccurredAt: time.Now(),
			})
			return err
		}
		if err := placeOrderTx(ctx, tx, "1001"); err != nil {
			t.Fatal(err)
		}
		rows := keirotest.RequireEnqueued(t, tx, keirotest.Enqueued{Key: "1001", Count: 1})
		fmt.Println(rows[0].Event.EventType, rows[0].Status)

		// The consumer side too: Deliver's inbox transaction is nested in the test's.
		if _, err := tx.Exec(ctx, `CREATE TABLE invoices (order_id text PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		ev := keirotest.JSONEvent(t, "OrderPlaced", map[string]any{"orderId": "1001"})
		keirotest.Deliver(t, tx, ev, keirotest.DeliverConfig{Handler: createInvoice})
		fmt.Println(keirotest.RequireProcessed(t, tx, ev.MessageID).Status)
		fmt.Println(errors.Is(tx.Commit(ctx), keirotest.ErrTxCommit)) // only the kit ends it: a rollback
	})
	// Output:
	// OrderPlaced pending
	// completed
	// true
}

// A poison message, end to end (docs/testing.md): the service's consumer runs against the
// embedded broker; a good record is processed, a bad one is dead-lettered with its reason, the
// inbox remembers both, and the good one's effect happened once.
func Example_poisonMessage() {
	test(func(t testing.TB) {
		db := billingDB(t)
		kafka := keirotest.NewKafka(t, "ordering.orders.v1")
		consumer := keirotest.RunConsumer(t, db.Pool, kafka, createInvoice, inbox.ConsumerConfig{
			Topics: []string{"ordering.orders.v1"},
			Store:  inbox.StoreConfig{MaxAttempts: 3},
		})

		good := keirotest.JSONEvent(t, "OrderPlaced", map[string]any{"orderId": "1001"})
		poison := keirotest.JSONEvent(t, "OrderPlaced", map[string]any{"customer": "ada"}) // no order id
		good.Destination, poison.Destination = "ordering.orders.v1", "ordering.orders.v1"
		poison.MessageID = "m-poison"
		keirotest.Produce(t, kafka, poison)
		keirotest.Produce(t, kafka, good)

		consumer.WaitDeadLettered(t, poison.MessageID)
		consumer.WaitProcessed(t, good.MessageID) // the partition moved on past the poison
		dl := keirotest.RequireDeadLettered(t, kafka, "ordering.orders.v1.dlq", keirotest.DeadLettered{
			MessageID: poison.MessageID, Reason: inbox.ReasonPermanent, Error: "has no order id", Count: 1,
		}, keirotest.WithHeader("keiro-source", "keirotest"))
		failed := consumer.RequireInboxFailed(t, poison.MessageID, keirotest.InboxOptions{Status: keirotest.InboxDeadLettered})
		consumer.RequireProcessed(t, good.MessageID)

		fmt.Println("dead letter:", dl[0].Reason, "from", dl[0].SourceTopic, "offset", dl[0].SourceOffset)
		fmt.Println("inbox:", failed.Status, "after", failed.Entry.Attempts, "attempt")
		fmt.Println("invoices:", count(t, db, "invoices"))
	})
	// Output:
	// dead letter: permanent from ordering.orders.v1 offset 0
	// inbox: dead_lettered after 1 attempt
	// invoices: 1
}

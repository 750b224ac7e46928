package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest"
)

// The example's own test suite, written with keirotest as a service's suite would be: the
// command's transaction, the outbox, the relay, the topic and the consumer's effect.

// newOrders returns the orders command runner on db's schema.
func newOrders(t *testing.T, db *keirotest.DB) (*events.Store, *events.Runner[Order, any, OrderEvent]) {
	t.Helper()
	store, err := events.NewStore(events.StoreConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	codec, err := NewOrderCodec()
	if err != nil {
		t.Fatal(err)
	}
	orders, err := events.NewRunner(store, OrderDecider, codec, events.RunnerConfig[Order]{})
	if err != nil {
		t.Fatal(err)
	}
	return store, orders
}

// run runs cmd on order id's stream and fails t on an error.
func run(t *testing.T, db *keirotest.DB, orders *events.Runner[Order, any, OrderEvent], id string, cmd any) {
	t.Helper()
	if _, err := orders.Run(context.Background(), db.Pool, "order-"+id, cmd, events.RunOptions{}); err != nil {
		t.Fatalf("%T on order %s: %v", cmd, id, err)
	}
}

// catchUp runs the integration producer until the outbox holds every public event.
func catchUp(t *testing.T, db *keirotest.DB, store *events.Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := CatchUp(ctx, db.Pool, store, db.Schema); err != nil {
		t.Fatalf("integration producer: %v", err)
	}
}

func TestPlacingAndPayingEnqueuesPublicEvents(t *testing.T) {
	t.Parallel()
	db := keirotest.NewDB(t)
	store, orders := newOrders(t, db)
	run(t, db, orders, "1001", PlaceOrder{Customer: "ada", Items: []Item{{SKU: "book", Quantity: 2, Price: 1500}}})
	run(t, db, orders, "1001", PayOrder{Amount: 3000})
	catchUp(t, db, store)

	keirotest.RequireEnqueued(t, db.Pool, keirotest.Enqueued{
		Source: Source, Destination: Topic, Key: "1001", EventType: "OrderPlaced", Count: 1,
		Payload: keirotest.JSONEqual(`{"orderId":"1001","customer":"ada","totalCents":3000}`),
	})
	keirotest.RequireEnqueued(t, db.Pool, keirotest.Enqueued{
		Key: "1001", EventType: "OrderPaid", Count: 1, Payload: keirotest.JSONSubset(`{"totalCents":3000}`),
	})
	// The public payload leaves the private details (the items) out.
	keirotest.RequireNotEnqueued(t, db.Pool, keirotest.Enqueued{Payload: keirotest.JSONFunc(func(p map[string]any) error {
		if _, ok := p["items"]; !ok {
			return errors.New("no items")
		}
		return nil
	})})
	keirotest.RequireNotEnqueued(t, db.Pool, keirotest.Enqueued{EventType: "OrderCancelled"})
}

func TestRejectedCommandEnqueuesNothing(t *testing.T) {
	t.Parallel()
	db := keirotest.NewDB(t)
	store, orders := newOrders(t, db)
	_, err := orders.Run(context.Background(), db.Pool, "order-1002", PlaceOrder{Customer: "alan"}, events.RunOptions{})
	if !errors.Is(err, ErrRejected) {
		t.Fatalf("want an order without items rejected, got %v", err)
	}
	catchUp(t, db, store)
	keirotest.RequireNotEnqueued(t, db.Pool, keirotest.Enqueued{Key: "1002"})
}

// TestOrderFlowFromCommandToInvoice follows a paid order from the command to billing's
// invoice: outbox, relay, topic (in order, keiro headers), inbox, handler, exactly once.
func TestOrderFlowFromCommandToInvoice(t *testing.T) {
	t.Parallel()
	db := keirotest.NewDB(t)
	kafka := keirotest.NewKafka(t, Topic)
	store, orders := newOrders(t, db)
	run(t, db, orders, "1001", PlaceOrder{Customer: "ada", Items: []Item{{SKU: "book", Quantity: 2, Price: 1500}}})
	run(t, db, orders, "1001", PayOrder{Amount: 3000})
	catchUp(t, db, store)

	if sent := keirotest.DrainOutbox(t, db.Pool, kafka); len(sent) != 2 {
		t.Fatalf("want 2 events published, got %d", len(sent))
	}
	recs := keirotest.RequirePublished(t, kafka, Topic, keirotest.Published{Source: Source, Key: "1001", Count: 2})
	if recs[0].Event.EventType != "OrderPlaced" || recs[1].Event.EventType != "OrderPaid" {
		t.Fatalf("want OrderPlaced then OrderPaid on the order's key, got %s then %s",
			recs[0].Event.EventType, recs[1].Event.EventType)
	}

	if err := CreateBillingTables(context.Background(), db.Pool, db.Schema); err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		keirotest.Deliver(t, db.Pool, rec.Event, keirotest.DeliverConfig{
			Handler: InvoicePaidOrders(db.Schema), Consumer: "billing", Twice: true,
			Kafka: &inbox.KafkaRef{Topic: rec.Record.Topic, Partition: rec.Record.Partition, Offset: rec.Record.Offset},
		})
	}
	var n, total int64
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT count(*), coalesce(sum(total_cents), 0) FROM invoices WHERE order_id = '1001'`).Scan(&n, &total); err != nil {
		t.Fatal(err)
	}
	if n != 1 || total != 3000 {
		t.Fatalf("want one invoice of 3000 for order 1001, got %d invoices totalling %d", n, total)
	}
}

// TestOrdersDuringKafkaOutage: the broker refuses produces for a while; commands do not depend
// on Kafka, and every event still reaches the topic exactly once.
func TestOrdersDuringKafkaOutage(t *testing.T) {
	t.Parallel()
	db := keirotest.NewDB(t)
	kafka := keirotest.NewKafka(t, Topic)
	outage := kafka.FailProduces(t, keirotest.ProduceFailure{Requests: 4})
	store, orders := newOrders(t, db)
	run(t, db, orders, "1001", PlaceOrder{Customer: "ada", Items: []Item{{SKU: "book", Quantity: 1, Price: 900}}})
	run(t, db, orders, "1002", PlaceOrder{Customer: "grace", Items: []Item{{SKU: "lamp", Quantity: 1, Price: 4200}}})
	run(t, db, orders, "1002", CancelOrder{Reason: "changed mind"})
	catchUp(t, db, store)

	keirotest.DrainOutbox(t, db.Pool, kafka)
	if outage.Refused() != 4 {
		t.Fatalf("want the relay to have met the outage (4 refused produces), got %d", outage.Refused())
	}
	keirotest.RequirePublished(t, kafka, Topic, keirotest.Published{Key: "1001", EventType: "OrderPlaced", Count: 1})
	keirotest.RequirePublished(t, kafka, Topic, keirotest.Published{Key: "1002", Count: 2})
	keirotest.RequirePublished(t, kafka, Topic, keirotest.Published{EventType: "OrderCancelled",
		Payload: keirotest.JSONSubset(`{"reason":"changed mind"}`), Count: 1})
}

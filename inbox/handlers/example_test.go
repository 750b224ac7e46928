package handlers_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/inbox/handlers"
)

// The document both handler modes hand over: JSON payloads are embedded, others are base64.
func ExampleMarshalDocument() {
	key := "order-7"
	ev := envelope.Event{
		MessageID: "msg-1", Source: "ordering", Destination: "billing.orders.v1", Key: &key,
		EventType: "OrderPlaced", SchemaVersion: 1, ContentType: "application/json",
		OccurredAt: time.Date(2026, 11, 29, 7, 0, 0, 0, time.UTC), Payload: []byte(`{"amount": 42}`),
	}
	doc, _ := handlers.MarshalDocument(context.Background(), ev, nil)
	fmt.Println(string(doc))

	ev.ContentType, ev.Payload = "application/octet-stream", []byte{1, 2, 3}
	doc, _ = handlers.MarshalDocument(context.Background(), ev, nil)
	fmt.Println(string(doc))
	// Output:
	// {"message_id":"msg-1","source":"ordering","destination":"billing.orders.v1","key":"order-7","event_type":"OrderPlaced","schema_version":1,"content_type":"application/json","occurred_at":"2026-11-29T07:00:00Z","source_event_id":null,"causation_id":null,"correlation_id":null,"attributes":null,"payload":{"amount":42}}
	// {"message_id":"msg-1","source":"ordering","destination":"billing.orders.v1","key":"order-7","event_type":"OrderPlaced","schema_version":1,"content_type":"application/octet-stream","occurred_at":"2026-11-29T07:00:00Z","source_event_id":null,"causation_id":null,"correlation_id":null,"attributes":null,"payload":"AQID","payload_encoding":"base64"}
}

// Library mode: run the inbox consumer inside your service with your own handler, writing
// effects through the inbox transaction (exactly once), and fall back to the SQL handler
// mode for events you do not handle in Go. (Not run: it needs PostgreSQL and Kafka.)
func Example_libraryMode() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	fallback, err := handlers.NewSQL(handlers.SQLConfig{Function: "billing.apply_event"})
	if err != nil {
		log.Fatal(err)
	}
	handle := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if ev.EventType != "OrderPlaced" {
			return fallback.Handle(ctx, tx, ev)
		}
		doc, err := handlers.NewDocument(ctx, ev, nil)
		if err != nil {
			return inbox.Permanent(err) // malformed payload: dead-letter it
		}
		_, err = tx.Exec(ctx, `INSERT INTO billing.invoices (order_key, body) VALUES ($1, $2)`, doc.Key, doc.Payload)
		return err // any other error is retried, then poisoned after MaxAttempts
	}

	consumer, err := inbox.NewConsumer(pool, inbox.ConsumerConfig{
		Brokers: []string{"localhost:9092"},
		Group:   "billing",
		Topics:  []string{"ordering.orders.v1"},
		Store:   inbox.StoreConfig{Schema: "keiro", MaxAttempts: 5},
	}, handle)
	if err != nil {
		log.Fatal(err)
	}
	// Run returns after SIGTERM, once in-flight messages committed and the group was left.
	if err := consumer.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

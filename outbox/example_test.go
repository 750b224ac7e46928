package outbox_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/migrations"
	"github.com/keiro-go/keiro/outbox"
)

// Example shows the outbox inside a service: the business transaction enqueues an integration
// event, and a relay running in the same process publishes it to Kafka.
func Example() {
	ctx := context.Background()
	db := exampleDB()
	defer db.close()
	cluster, _ := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "billing.orders.v1"))
	defer cluster.Close()

	// The relay gets its own client, built with the relay's producer options.
	client, err := kgo.NewClient(append(outbox.ProducerOpts(), kgo.SeedBrokers(cluster.ListenAddrs()...))...)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	published := make(chan outbox.BatchResult, 1)
	relay, err := outbox.NewRelay(db.pool, client, outbox.RelayConfig{
		Schema:  db.schema,
		OnBatch: func(b outbox.BatchResult) { published <- b },
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()

	// The business transaction: write the order and, atomically, its integration event.
	store, _ := outbox.NewStore(db.schema)
	key := "order-42"
	err = pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		// ... INSERT INTO orders ... in the same tx ...
		res, err := store.EnqueueTx(ctx, tx, envelope.Event{
			MessageID:   "order-42-placed",
			Source:      "ordering",
			Destination: "billing.orders.v1",
			Key:         &key,
			EventType:   "OrderPlaced",
			ContentType: envelope.ContentTypeJSON,
			Payload:     []byte(`{"order":42}`),
			OccurredAt:  time.Now().UTC(),
		})
		if err == nil {
			fmt.Println("enqueued:", res[0].Outcome)
		}
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	b := <-published
	fmt.Println("published:", b.Published)
	stop()
	fmt.Println("relay stopped:", <-done)
	// Output:
	// enqueued: inserted
	// published: 1
	// relay stopped: <nil>
}

type exampleSchema struct {
	pool   *pgxpool.Pool
	schema string
	close  func()
}

// exampleDB creates a migrated schema for the example and drops it on close.
func exampleDB() exampleSchema {
	ctx := context.Background()
	schema := fmt.Sprintf("example_%d", time.Now().UnixNano())
	conn, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}
	if err := migrations.Migrate(ctx, conn, schema); err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, testenv.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	return exampleSchema{pool: pool, schema: schema, close: func() {
		_, _ = pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		pool.Close()
	}}
}

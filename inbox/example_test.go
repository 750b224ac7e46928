package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// A redelivered message runs its handler once: the second Process is a duplicate.
func ExampleStore_Process() {
	ctx := context.Background()
	db, dropDB := testenv.NewExampleDB()
	defer dropDB()

	store, err := inbox.NewStore(inbox.StoreConfig{Schema: db.Schema, Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	d := inbox.Delivery{Event: exampleEvent("order-42-placed", `{"order":42}`)}
	charge := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		// The handler's writes go through tx: they commit with the inbox row, or not at all.
		fmt.Println("charging for", string(ev.Payload))
		return nil
	}
	for range 2 {
		res, err := store.Process(ctx, db.Pool, d, charge)
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

// A consumer reads its topics in a consumer group and runs the handler for each record in one
// transaction with the record's inbox row; it commits the offset only after that transaction.
// cmd/consumer is the same consumer as a sidecar, with HTTP and SQL handlers.
func ExampleNewConsumer() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	db, dropDB := testenv.NewExampleDB()
	defer dropDB()
	cluster, _ := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "billing.orders.v1"))
	defer cluster.Close()
	publishExample(cluster, exampleEvent("order-42-placed", `{"order":42}`)) // as the relay publishes it

	committed := make(chan inbox.Commit, 1)
	consumer, err := inbox.NewConsumer(db.Pool, inbox.ConsumerConfig{
		Brokers:     cluster.ListenAddrs(),
		Group:       "billing",
		Topics:      []string{"billing.orders.v1"},
		Store:       inbox.StoreConfig{Schema: db.Schema},
		OnCommitted: func(c inbox.Commit) { committed <- c },
	}, func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		// ... INSERT INTO invoices ... through tx ...
		fmt.Println("invoicing", ev.MessageID, string(ev.Payload))
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()
	c := <-committed
	fmt.Printf("committed %s/%d up to offset %d\n", c.Topic, c.Partition, c.Offset)
	stop()
	fmt.Println("consumer stopped:", <-done)
	// Output:
	// invoicing order-42-placed {"order":42}
	// committed billing.orders.v1/0 up to offset 1
	// consumer stopped: <nil>
}

// A handler error wrapped with Permanent poisons the message at once (other errors are retried
// up to the attempt ceiling): the consumer writes the record to the dead-letter topic, with
// its original bytes and headers and the reason (here billing.orders.v1.dlq, the default
// DeadLetterTopic), and moves on to the next one.
func ExamplePermanent() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	db, dropDB := testenv.NewExampleDB()
	defer dropDB()
	cluster, _ := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.SeedTopics(1, "billing.orders.v1", "billing.orders.v1.dlq"))
	defer cluster.Close()
	publishExample(cluster, exampleEvent("order-43-placed", `{"order":"forty-three"}`))

	deadLettered := make(chan string, 1)
	consumer, err := inbox.NewConsumer(db.Pool, inbox.ConsumerConfig{
		Brokers: cluster.ListenAddrs(),
		Group:   "billing",
		Topics:  []string{"billing.orders.v1"},
		Store:   inbox.StoreConfig{Schema: db.Schema},
		Logger:  slog.New(slog.DiscardHandler), // it logs each dead letter as a warning
		OnDeadLettered: func(r *kgo.Record, reason string) {
			deadLettered <- fmt.Sprintf("%s of %s dead-lettered: %s", r.Key, r.Topic, reason)
		},
	}, func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		var order struct{ Order int }
		if err := envelope.DecodeJSON(&ev, &order); err != nil {
			return inbox.Permanent(err) // retrying cannot fix the payload
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()
	fmt.Println(<-deadLettered)
	stop()
	fmt.Println("consumer stopped:", <-done)
	// Output:
	// order-43 of billing.orders.v1 dead-lettered: permanent
	// consumer stopped: <nil>
}

// ProcessBatch runs a batch of deliveries in one transaction (the consumer's group commit):
// each delivery gets its own outcome, and duplicates inside or across batches do not run.
func ExampleStore_ProcessBatch() {
	ctx := context.Background()
	db, store, dropDB := exampleStore() // as in ExampleStore_Process
	defer dropDB()
	charge := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		fmt.Println("charging", ev.MessageID)
		return nil
	}
	first := []inbox.Delivery{
		{Event: exampleEvent("order-1-placed", `{"order":1}`)},
		{Event: exampleEvent("order-2-placed", `{"order":2}`)},
	}
	second := []inbox.Delivery{ // order-2 is delivered again
		{Event: exampleEvent("order-2-placed", `{"order":2}`)},
		{Event: exampleEvent("order-3-placed", `{"order":3}`)},
	}
	for _, batch := range [][]inbox.Delivery{first, second} {
		results, err := store.ProcessBatch(ctx, db.Pool, batch, charge)
		if err != nil {
			log.Fatal(err)
		}
		for i, res := range results {
			fmt.Println(batch[i].Event.MessageID, res.Outcome)
		}
	}
	// Output:
	// charging order-1-placed
	// charging order-2-placed
	// order-1-placed processed
	// order-2-placed processed
	// charging order-3-placed
	// order-2-placed duplicate
	// order-3-placed processed
}

// A poisoned message stays in the inbox with its full envelope. After the fix, an operator
// re-runs it with the consumer's Admin (cmd/consumer: `consumer inbox failed retry`): its
// offset was committed long ago, so no redelivery would bring it back.
func ExampleAdmin_Reprocess() {
	ctx := context.Background()
	db, store, dropDB := exampleStore() // as in ExampleStore_Process
	defer dropDB()
	d := inbox.Delivery{Event: exampleEvent("order-44-placed", `{"order":44}`)}
	broken := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		return inbox.Permanent(errors.New("no price list for region eu-west"))
	}
	res, err := store.Process(ctx, db.Pool, d, broken)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Outcome, "-", res.Err)

	fixed := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error { return nil }
	res, err = inbox.NewAdmin(store).Reprocess(ctx, db.Pool, inbox.Key{Source: "ordering", DedupeKey: res.DedupeKey}, fixed)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Outcome)
	// Output:
	// poisoned - permanent: no price list for region eu-west
	// processed
}

// exampleEvent is an OrderPlaced event of source "ordering" on topic billing.orders.v1, keyed by
// the order.
func exampleEvent(messageID, payload string) envelope.Event {
	key := messageID[:len("order-42")]
	return envelope.Event{
		MessageID: messageID, Source: "ordering", Destination: "billing.orders.v1", Key: &key,
		EventType: "OrderPlaced", SchemaVersion: 1, ContentType: envelope.ContentTypeJSON,
		Payload: []byte(payload), OccurredAt: time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC),
	}
}

// publishExample writes ev to Kafka as the relay publishes it: keiro's headers, the key, the payload.
func publishExample(cluster *kfake.Cluster, ev envelope.Event) {
	client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	r := ev.Record(envelope.EncodeOptions{})
	rec := &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value}
	for _, h := range r.Headers {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	if err := client.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		log.Fatal(err)
	}
}

// exampleStore opens a migrated schema and the inbox Store of consumer "billing" on it.
func exampleStore() (*testenv.DB, *inbox.Store, func()) {
	db, dropDB := testenv.NewExampleDB()
	store, err := inbox.NewStore(inbox.StoreConfig{Schema: db.Schema, Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	return db, store, dropDB
}

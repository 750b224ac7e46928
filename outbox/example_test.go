package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/logrelay"
)

// Example shows the outbox inside a service: the business transaction enqueues an integration
// event, and a relay running in the same process publishes it to Kafka.
func Example() {
	ctx := context.Background()
	db, dropDB := testenv.NewExampleDB()
	defer dropDB()
	cluster, _ := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "billing.orders.v1"))
	defer cluster.Close()

	// The relay gets its own client, built with the relay's producer options.
	client, err := kgo.NewClient(append(outbox.ProducerOpts(), kgo.SeedBrokers(cluster.ListenAddrs()...))...)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	published := make(chan outbox.BatchResult, 1)
	relay, err := outbox.NewRelay(db.Pool, client, outbox.RelayConfig{
		Schema:  db.Schema,
		OnBatch: func(b outbox.BatchResult) { published <- b },
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()

	// The business transaction: write the order and, atomically, its integration event.
	store, _ := outbox.NewStore(db.Schema)
	key := "order-42"
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
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

// Example_service is the README's example: the service enqueues OrderPlaced in the transaction
// that writes the order (placeOrder), a relay in the same process publishes the outbox, and a
// consumer of another bounded context applies each event once (publishAndShip). The code of
// placeOrder and publishAndShip is in readme_test.go, which TestREADMEExample keeps identical
// to the README.
func Example_service() {
	ctx, pool, stop := connectService()
	defer stop()
	if err := placeOrder(ctx, pool, "42"); err != nil {
		log.Fatal(err)
	}
	if err := publishAndShip(ctx, pool, []string{"localhost:9092"}); err != nil && !errors.Is(err, context.Canceled) {
		log.Fatal(err)
	}
}

// A relay in log mode follows a logical replication slot instead of claiming and marking rows:
// it switches the schema to log mode when it starts (every producer follows without a
// redeploy, writing the same events) and publishes them in commit order, writing nothing per
// event after the insert. The program links the log engine by importing package
// outbox/logrelay; the pool's role needs the REPLICATION attribute and the server
// wal_level = logical. `relay run --mode=log` is the same relay as a sidecar, and
// `relay mode set claim` switches back.
func ExampleRelayConfig_logMode() {
	ctx, pool, stop := connectService()
	defer stop()
	client, err := kgo.NewClient(append(outbox.ProducerOpts(), kgo.SeedBrokers("localhost:9092"))...)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	relay, err := outbox.NewRelay(pool, client, outbox.RelayConfig{Mode: outbox.ModeLog, LogEngine: logrelay.Engine})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// A producer calls EnqueueTx inside its own transaction: the event commits or rolls back with
// the business data. Enqueuing is idempotent on (source, message id), so a retried command
// that enqueues the same event again writes nothing.
func ExampleStore_EnqueueTx() {
	ctx := context.Background()
	db, dropDB := testenv.NewExampleDB()
	defer dropDB()
	store, err := outbox.NewStore(db.Schema)
	if err != nil {
		log.Fatal(err)
	}
	key := "order-42"
	placed := envelope.Event{
		MessageID: "order-42-placed", Source: "ordering", Destination: "billing.orders.v1", Key: &key,
		EventType: "OrderPlaced", ContentType: envelope.ContentTypeJSON,
		Payload: []byte(`{"order":42,"total":1250}`), OccurredAt: time.Now(),
	}
	for range 2 { // the command runs twice: the second enqueue is a duplicate
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			// ... INSERT INTO orders ... through tx ...
			res, err := store.EnqueueTx(ctx, tx, placed)
			if err == nil {
				fmt.Println(res[0].MessageID, res[0].Outcome)
			}
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}

	// The same message id with other content is a conflict: nothing is written, roll back.
	changed := placed
	changed.Payload = []byte(`{"order":42,"total":9999}`)
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := store.EnqueueTx(ctx, tx, changed)
		return err
	})
	fmt.Println("conflict:", errors.Is(err, outbox.ErrIdentityConflict))
	// Output:
	// order-42-placed inserted
	// order-42-placed duplicate
	// conflict: true
}

// A producer of a schema in log mode may opt into EmitTx: each event is a logical decoding
// message in the caller's transaction, the cheapest enqueue, without duplicate detection or a
// row to list or recover. It refuses, writing nothing, while the schema is in claim mode (whose
// relays read no message): roll back, or enqueue with EnqueueTx.
func ExampleStore_EmitTx() {
	ctx := context.Background()
	db, dropDB := testenv.NewExampleDB()
	defer dropDB()
	store, err := outbox.NewStore(db.Schema)
	if err != nil {
		log.Fatal(err)
	}
	key := "order-42"
	placed := envelope.Event{
		MessageID: "order-42-placed", Source: "ordering", Destination: "billing.orders.v1", Key: &key,
		EventType: "OrderPlaced", ContentType: envelope.ContentTypeJSON,
		Payload: []byte(`{"order":42,"total":1250}`), OccurredAt: time.Now(),
	}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		// ... INSERT INTO orders ... through tx ...
		return store.EmitTx(ctx, tx, placed)
	})
	fmt.Println("claim mode refused:", errors.Is(err, outbox.ErrEmitNeedsLogMode))
	// Output:
	// claim mode refused: true
}

// The package-level EnqueueTx writes to the outbox of the schema the transaction's search_path
// resolves (else schema keiro), so a service whose connections already use its own schema
// needs no Store.
func ExampleEnqueueTx() {
	ctx := context.Background()
	db, dropDB := testenv.NewExampleDB()
	defer dropDB()
	// db.Pool's connections use db.Schema as their search_path, as a service's connections use
	// its schema (search_path in the connection string, or pgx's RuntimeParams).

	key := "order-42"
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		res, err := outbox.EnqueueTx(ctx, tx, envelope.Event{
			MessageID: "order-42-placed", Source: "ordering", Destination: "billing.orders.v1", Key: &key,
			EventType: "OrderPlaced", ContentType: envelope.ContentTypeJSON,
			Payload: []byte(`{"order":42}`), OccurredAt: time.Now(),
		})
		if err == nil {
			fmt.Println(res[0].Outcome)
		}
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// inserted
}

// The relay's Kafka client is built from ProducerOpts, followed by the deployment's own
// options (seed brokers, TLS, SASL, client id). NewRelay refuses a client that could publish
// a key out of order or lose a record.
func ExampleProducerOpts() {
	db, dropDB := testenv.NewExampleDB()
	defer dropDB()
	opts := append(outbox.ProducerOpts(), kgo.SeedBrokers("localhost:9092"), kgo.ClientID("ordering-relay"))
	client, err := kgo.NewClient(opts...)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	_, err = outbox.NewRelay(db.Pool, client, outbox.RelayConfig{Schema: db.Schema})
	fmt.Println("relay with ProducerOpts:", err)

	plain, err := kgo.NewClient(kgo.SeedBrokers("localhost:9092")) // no manual flushing
	if err != nil {
		log.Fatal(err)
	}
	defer plain.Close()
	_, err = outbox.NewRelay(db.Pool, plain, outbox.RelayConfig{Schema: db.Schema})
	fmt.Println("relay without them refused:", err != nil)
	// Output:
	// relay with ProducerOpts: <nil>
	// relay without them refused: true
}

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

// An event the relay cannot publish is kept as a dead or rejected row for an operator: here a
// record larger than the relay's limit is rejected before it reaches Kafka. Once the cause is
// fixed (a relay with a higher limit), the operator's Admin requeues it to pending and a relay
// publishes it. cmd/relay offers the same as `relay dead list` and `relay dead requeue`.
func ExampleAdmin_Requeue() {
	ctx := context.Background()
	db, dropDB := testenv.NewExampleDB()
	defer dropDB()
	cluster, _ := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "billing.invoices.v1"))
	defer cluster.Close()
	store, _ := outbox.NewStore(db.Schema)
	key := "invoice-7"
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := store.EnqueueTx(ctx, tx, envelope.Event{
			MessageID: "invoice-7-issued", Source: "billing", Destination: "billing.invoices.v1", Key: &key,
			EventType: "InvoiceIssued", ContentType: envelope.ContentTypeJSON,
			Payload: []byte(`{"lines":"` + strings.Repeat("x", 2048) + `"}`), OccurredAt: time.Now(),
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	runExampleRelay(db, cluster, outbox.RelayConfig{MaxRecordBytes: 1024}, 1)
	admin, _ := outbox.NewAdmin(db.Schema)
	dead, err := admin.ListDead(ctx, db.Pool, outbox.ListDeadOptions{Destination: "billing.invoices.v1"})
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range dead {
		fmt.Println(d.MessageID, d.Status, d.RejectionCode)
	}

	n, err := admin.Requeue(ctx, db.Pool, outbox.RequeueFilter{Destination: "billing.invoices.v1"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("requeued:", n)
	b := runExampleRelay(db, cluster, outbox.RelayConfig{MaxRecordBytes: 1 << 20}, 1)
	fmt.Println("published:", b.Published)
	// Output:
	// invoice-7-issued rejected message_too_large
	// requeued: 1
	// published: 1
}

// Under PerSourceStream a relay publishes every row of a source in order, null keys included;
// for a source declared with DeclarePerSourceOrder that order is the commit order of its
// producers. Kafka orders only within a partition, so the topic has one.
func ExampleAdmin_DeclarePerSourceOrder() {
	ctx := context.Background()
	db, dropDB := testenv.NewExampleDB()
	defer dropDB()
	cluster, _ := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "ledger.entries.v1"))
	defer cluster.Close()
	admin, _ := outbox.NewAdmin(db.Schema)
	if err := admin.DeclarePerSourceOrder(ctx, db.Pool, "ledger"); err != nil {
		log.Fatal(err)
	}
	store, _ := outbox.NewStore(db.Schema)
	for i := 1; i <= 3; i++ {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := store.EnqueueTx(ctx, tx, envelope.Event{ // no key: ordered by the source
				MessageID: fmt.Sprintf("entry-%d", i), Source: "ledger", Destination: "ledger.entries.v1",
				EventType: "EntryPosted", ContentType: envelope.ContentTypeJSON,
				Payload: fmt.Appendf(nil, `{"entry":%d}`, i), OccurredAt: time.Now(),
			})
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	runExampleRelay(db, cluster, outbox.RelayConfig{Policy: outbox.PerSourceStream}, 3)

	reader, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.ConsumeTopics("ledger.entries.v1"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		log.Fatal(err)
	}
	defer reader.Close()
	for n := 0; n < 3; {
		reader.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			fmt.Println(string(r.Value))
			n++
		})
	}
	// Output:
	// {"entry":1}
	// {"entry":2}
	// {"entry":3}
}

// connectService opens a service's pool on DATABASE_URL, under a context an interrupt
// cancels; stop closes both.
func connectService() (context.Context, *pgxpool.Pool, func()) {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	return ctx, pool, func() {
		pool.Close()
		cancel()
	}
}

// runExampleRelay runs a relay on db's schema until it has marked rows rows (published,
// rejected or otherwise), and returns the sum of its batches.
func runExampleRelay(db *testenv.DB, cluster *kfake.Cluster, cfg outbox.RelayConfig, rows int) outbox.BatchResult {
	client, err := kgo.NewClient(append(outbox.ProducerOpts(), kgo.SeedBrokers(cluster.ListenAddrs()...))...)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	marked := make(chan outbox.BatchResult, 1)
	var (
		mu  sync.Mutex // batches in flight may be marked concurrently
		sum outbox.BatchResult
	)
	cfg.Schema = db.Schema
	cfg.OnBatch = func(b outbox.BatchResult) {
		mu.Lock()
		defer mu.Unlock()
		sum.Published += b.Published
		sum.Rejected += b.Rejected
		sum.Dead += b.Dead
		if sum.Published+sum.Rejected+sum.Dead == rows {
			marked <- sum
		}
	}
	relay, err := outbox.NewRelay(db.Pool, client, cfg)
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	b := <-marked
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	return b
}

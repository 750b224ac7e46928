package keirotest_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest"
	"github.com/keiro-go/keiro/outbox"
)

// test runs body as the body of a test would run, with a stand-in for its *testing.T, so that
// the examples run as documentation. In your tests, call the kit with your t directly.
func test(body func(t testing.TB)) {
	t := &exampleT{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		body(t)
	}()
	<-done
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

// exampleT is the testing.TB of the examples: failures are printed.
type exampleT struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
}

func (t *exampleT) Helper()                           {}
func (t *exampleT) Log(...any)                        {}
func (t *exampleT) Logf(string, ...any)               {}
func (t *exampleT) Errorf(format string, args ...any) { fmt.Printf("FAIL: "+format+"\n", args...) }
func (t *exampleT) Fatalf(format string, args ...any) { t.Errorf(format, args...); runtime.Goexit() }
func (t *exampleT) Fatal(args ...any) {
	fmt.Println(append([]any{"FAIL:"}, args...)...)
	runtime.Goexit()
}
func (t *exampleT) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

// placeOrder is the service code under test: it records an order and, in the same transaction,
// enqueues OrderPlaced for the other bounded contexts.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, schema, id, customer string, total int) error {
	store, err := outbox.NewStore(schema)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... INSERT INTO orders ...
		_, err := store.EnqueueTx(ctx, tx, envelope.Event{
			MessageID: "order-placed-" + id, Source: "ordering", Destination: "ordering.orders.v1", Key: &id,
			EventType: "OrderPlaced", SchemaVersion: 1, ContentType: envelope.ContentTypeJSON,
			Payload:    fmt.Appendf(nil, `{"orderId":%q,"customer":%q,"totalCents":%d}`, id, customer, total),
			OccurredAt: time.Now(),
		})
		return err
	})
}

func ExampleNewDB() {
	test(func(t testing.TB) {
		db := keirotest.NewDB(t) // a fresh migrated schema, dropped when the test ends
		var outboxRows int
		if err := db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM keiro_outbox").Scan(&outboxRows); err != nil {
			t.Fatal(err)
		}
		fmt.Println("outbox rows:", outboxRows)
		fmt.Println("components use schema:", db.Schema[:2]+"…")
	})
	// Output:
	// outbox rows: 0
	// components use schema: t_…
}

func ExampleNewSchema() {
	test(func(t testing.TB) {
		pool, err := pgxpool.New(context.Background(), keirotest.DatabaseURL()) // your own pool
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		schema := keirotest.NewSchema(t, pool) // its search_path is untouched: name the schema
		if err := placeOrder(context.Background(), pool, schema, "1001", "ada", 3000); err != nil {
			t.Fatal(err)
		}
		rows := keirotest.RequireEnqueued(t, pool, keirotest.Enqueued{Schema: schema, Key: "1001"})
		fmt.Println(rows[0].Event.EventType, rows[0].Status)
	})
	// Output:
	// OrderPlaced pending
}

func ExampleNewKafka() {
	test(func(t testing.TB) {
		kafka := keirotest.NewKafka(t, "ordering.orders.v1")
		rec := &kgo.Record{Topic: "ordering.orders.v1", Key: []byte("1001"), Value: []byte("hello")}
		if err := kafka.Client.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
		for _, r := range kafka.Records(t, "ordering.orders.v1") {
			fmt.Printf("partition %d offset %d: %s=%s\n", r.Partition, r.Offset, r.Key, r.Value)
		}
	})
	// Output:
	// partition 0 offset 0: 1001=hello
}

func ExampleRequireEnqueued() {
	test(func(t testing.TB) {
		db := keirotest.NewDB(t)
		if err := placeOrder(context.Background(), db.Pool, db.Schema, "1001", "ada", 3000); err != nil {
			t.Fatal(err)
		}
		rows := keirotest.RequireEnqueued(t, db.Pool, keirotest.Enqueued{
			Destination: "ordering.orders.v1",
			Key:         "1001",
			EventType:   "OrderPlaced",
			Payload:     keirotest.JSONSubset(`{"customer": "ada", "totalCents": 3000}`),
			Count:       1,
		})
		fmt.Println(rows[0].Event.MessageID, rows[0].Status)
	})
	// Output:
	// order-placed-1001 pending
}

func ExampleRequireNotEnqueued() {
	test(func(t testing.TB) {
		db := keirotest.NewDB(t)
		if err := placeOrder(context.Background(), db.Pool, db.Schema, "1001", "ada", 3000); err != nil {
			t.Fatal(err)
		}
		// Nothing is announced to billing before the order is paid.
		keirotest.RequireNotEnqueued(t, db.Pool, keirotest.Enqueued{EventType: "OrderPaid"})
		fmt.Println("no OrderPaid enqueued")
	})
	// Output:
	// no OrderPaid enqueued
}

func ExampleJSONSubset() {
	m := keirotest.JSONSubset(map[string]any{"customer": "ada", "items": []any{map[string]any{"sku": "book"}}})
	fmt.Println(m)
	fmt.Println(m.MatchPayload([]byte(`{"orderId":"1001","customer":"ada","items":[{"sku":"book","quantity":2}]}`)))
	fmt.Println(m.MatchPayload([]byte(`{"orderId":"1002","customer":"grace","items":[{"sku":"lamp"}]}`)))
	// Output:
	// JSON containing {"customer":"ada","items":[{"sku":"book"}]}
	// <nil>
	// $.customer is "grace", want "ada"; $.items[0].sku is "lamp", want "book"
}

func ExampleJSONFunc() {
	type placed struct {
		Total int `json:"totalCents"`
	}
	m := keirotest.JSONFunc(func(p placed) error {
		if p.Total <= 0 {
			return fmt.Errorf("total is %d, want a positive amount", p.Total)
		}
		return nil
	})
	fmt.Println(m.MatchPayload([]byte(`{"totalCents": 3000}`)))
	fmt.Println(m.MatchPayload([]byte(`{"totalCents": 0}`)))
	// Output:
	// <nil>
	// total is 0, want a positive amount
}

func ExampleDrainOutbox() {
	test(func(t testing.TB) {
		db := keirotest.NewDB(t)
		kafka := keirotest.NewKafka(t, "ordering.orders.v1")
		for _, id := range []string{"1001", "1002"} {
			if err := placeOrder(context.Background(), db.Pool, db.Schema, id, "ada", 3000); err != nil {
				t.Fatal(err)
			}
		}
		for _, row := range keirotest.DrainOutbox(t, db.Pool, kafka) {
			fmt.Printf("%s %s key=%s offset=%d\n", row.Status, row.Event.Destination, *row.Event.Key, *row.Offset)
		}
		// Nothing is left to publish: statuses are the kit's constants (a misspelt one fails).
		keirotest.RequireNotEnqueued(t, db.Pool, keirotest.Enqueued{Status: outbox.StatusPending})
		keirotest.RequireEnqueued(t, db.Pool, keirotest.Enqueued{Status: outbox.StatusSent, Count: 2})
	})
	// Output:
	// sent ordering.orders.v1 key=1001 offset=0
	// sent ordering.orders.v1 key=1002 offset=1
}

func ExampleRequirePublished() {
	test(func(t testing.TB) {
		db := keirotest.NewDB(t)
		kafka := keirotest.NewKafka(t, "ordering.orders.v1")
		if err := placeOrder(context.Background(), db.Pool, db.Schema, "1001", "ada", 3000); err != nil {
			t.Fatal(err)
		}
		keirotest.DrainOutbox(t, db.Pool, kafka)
		recs := keirotest.RequirePublished(t, kafka, "ordering.orders.v1", keirotest.Published{
			Key: "1001", EventType: "OrderPlaced", Source: "ordering", Payload: keirotest.JSONSubset(`{"customer":"ada"}`),
		})
		ev := recs[0].Event // the keiro headers, decoded
		fmt.Println(ev.MessageID, ev.Source, ev.EventType, ev.SchemaVersion, ev.ContentType)
	})
	// Output:
	// order-placed-1001 ordering OrderPlaced 1 application/json
}

func ExampleDeliver() {
	test(func(t testing.TB) {
		db := keirotest.NewDB(t)
		if _, err := db.Pool.Exec(context.Background(), `CREATE TABLE invoices (order_id text PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		// The billing handler under test.
		createInvoice := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
			var p struct {
				OrderID string `json:"orderId"`
			}
			if err := envelope.DecodeJSON(&ev, &p); err != nil {
				return inbox.Permanent(err)
			}
			_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id) VALUES ($1)`, p.OrderID)
			return err
		}
		ev := keirotest.JSONEvent(t, "OrderPlaced", map[string]any{"orderId": "1001"})
		d := keirotest.Deliver(t, db.Pool, ev, keirotest.DeliverConfig{Handler: createInvoice, Twice: true})
		var n int
		if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM invoices`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		fmt.Println(d.Outcome, d.Redelivery.Outcome, "invoices:", n)
	})
	// Output:
	// processed duplicate invoices: 1
}

// A test of failure handling names the failure it expects; without Want, a failing handler
// fails the test.
func ExampleDeliver_failure() {
	test(func(t testing.TB) {
		db := keirotest.NewDB(t)
		refuseNegative := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
			var p struct {
				TotalCents int `json:"totalCents"`
			}
			if err := envelope.DecodeJSON(&ev, &p); err != nil || p.TotalCents < 0 {
				return inbox.Permanent(fmt.Errorf("refusing a total of %d cents", p.TotalCents))
			}
			return nil
		}
		ev := keirotest.JSONEvent(t, "OrderPlaced", map[string]any{"orderId": "1001", "totalCents": -5})
		d := keirotest.Deliver(t, db.Pool, ev, keirotest.DeliverConfig{Handler: refuseNegative, Want: inbox.Poisoned})
		fmt.Println(d.Outcome, d.Err)
	})
	// Output:
	// poisoned permanent: refusing a total of -5 cents
}

func ExampleDeliver_sql() {
	test(func(t testing.TB) {
		db := keirotest.NewDB(t)
		// The consumer's sql mode: a PostgreSQL function receives the event's JSON document.
		if _, err := db.Pool.Exec(context.Background(), `
			CREATE TABLE invoices (order_id text PRIMARY KEY);
			CREATE FUNCTION create_invoice(doc jsonb) RETURNS void LANGUAGE sql AS
			$$ INSERT INTO invoices (order_id) VALUES (doc->'payload'->>'orderId') $$`); err != nil {
			t.Fatal(err)
		}
		ev := keirotest.JSONEvent(t, "OrderPlaced", map[string]any{"orderId": "1001"})
		d := keirotest.Deliver(t, db.Pool, ev, keirotest.DeliverConfig{SQLFunction: "create_invoice", Twice: true})
		fmt.Println(d.Outcome, d.Redelivery.Outcome)
	})
	// Output:
	// processed duplicate
}

func ExampleDeliver_http() {
	test(func(t testing.TB) {
		db := keirotest.NewDB(t)
		// The consumer's http mode, against the service's handler.
		var mu sync.Mutex
		var keys []string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			keys = append(keys, r.Header.Get("Idempotency-Key"))
		}))
		defer srv.Close()
		ev := keirotest.JSONEvent(t, "OrderPlaced", map[string]any{"orderId": "1001"})
		ev.MessageID = "m-1"
		d := keirotest.Deliver(t, db.Pool, ev, keirotest.DeliverConfig{HTTPURL: srv.URL, Consumer: "billing", Twice: true})
		mu.Lock()
		defer mu.Unlock()
		fmt.Println(d.Outcome, d.Redelivery.Outcome, keys)
	})
	// Output:
	// processed duplicate [billing:keirotest:m-1]
}

func ExampleKafka_FailProduces() {
	test(func(t testing.TB) {
		db := keirotest.NewDB(t)
		kafka := keirotest.NewKafka(t, "ordering.orders.v1")
		// Kafka refuses the next three produce requests, as during a leader election.
		outage := kafka.FailProduces(t, keirotest.ProduceFailure{Requests: 3})
		if err := placeOrder(context.Background(), db.Pool, db.Schema, "1001", "ada", 3000); err != nil {
			t.Fatal(err)
		}
		sent := keirotest.DrainOutbox(t, db.Pool, kafka) // the relay rides the outage out
		fmt.Println("refused:", outage.Refused(), "published:", len(sent))
	})
	// Output:
	// refused: 3 published: 1
}

func ExampleJSONEqual() {
	m := keirotest.JSONEqual(`{"orderId": "1001", "totalCents": 3000}`)
	fmt.Println(m.MatchPayload([]byte(`{"totalCents":3000.0,"orderId":"1001"}`)))
	fmt.Println(m.MatchPayload([]byte(`{"orderId":"1001","totalCents":3000,"customer":"ada"}`)))
	// Output:
	// <nil>
	// $.customer is "ada", not wanted
}

func ExampleOutboxRows() {
	test(func(t testing.TB) {
		db := keirotest.NewDB(t)
		for _, id := range []string{"1001", "1002"} {
			if err := placeOrder(context.Background(), db.Pool, db.Schema, id, "ada", 3000); err != nil {
				t.Fatal(err)
			}
		}
		for _, row := range keirotest.OutboxRows(t, db.Pool, "") { // "": the pool's schema
			fmt.Println(row.Seq, *row.Event.Key, row.Event.EventType, row.Status)
		}
	})
	// Output:
	// 1 1001 OrderPlaced pending
	// 2 1002 OrderPlaced pending
}

func ExamplePublishedRecords() {
	test(func(t testing.TB) {
		kafka := keirotest.NewKafka(t, "ordering.orders.v1")
		// A record produced by another keiro producer, and one that is not a keiro record.
		ev := keirotest.JSONEvent(t, "OrderPlaced", map[string]any{"orderId": "1001"})
		ev.Destination, ev.MessageID = "ordering.orders.v1", "m-1"
		r := ev.Record(envelope.EncodeOptions{})
		rec := &kgo.Record{Topic: ev.Destination, Key: r.Key, Value: r.Value}
		for _, h := range r.Headers {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		plain := &kgo.Record{Topic: "ordering.orders.v1", Value: []byte("hello")}
		if err := kafka.Client.ProduceSync(context.Background(), rec, plain).FirstErr(); err != nil {
			t.Fatal(err)
		}
		for _, r := range keirotest.PublishedRecords(t, kafka, "ordering.orders.v1") {
			if r.DecodeErr != nil {
				fmt.Println(r.Record.Offset, "not a keiro record:", r.DecodeErr)
				continue
			}
			fmt.Println(r.Record.Offset, r.Event.MessageID, r.Event.Source, r.Event.EventType)
		}
	})
	// Output:
	// 0 m-1 keirotest OrderPlaced
	// 1 not a keiro record: envelope: missing header "keiro-source"
}

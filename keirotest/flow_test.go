package keirotest_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest"
)

func TestDrainOutboxAndRequirePublished(t *testing.T) {
	t.Parallel()
	db := keirotest.NewDB(t)
	kafka := keirotest.NewKafka(t, "ordering.orders.v1")
	enqueue(t, db, orderEvent(t, "1001", "ada", 3000), orderEvent(t, "1002", "grace", 4200))

	sent := keirotest.DrainOutbox(t, db.Pool, kafka)
	if len(sent) != 2 || sent[0].Event.MessageID != "placed-1001" || sent[1].Status != "sent" || sent[1].Offset == nil {
		t.Fatalf("want both rows sent in order, got %+v", sent)
	}
	recs := keirotest.RequirePublished(t, kafka, "ordering.orders.v1", keirotest.Published{
		Key: "1002", EventType: "OrderPlaced", Source: "ordering", Payload: keirotest.JSONSubset(`{"totalCents": 4200.0}`)})
	if len(recs) != 1 || recs[0].Event.MessageID != "placed-1002" || string(recs[0].Record.Key) != "1002" {
		t.Fatalf("want the record of order 1002 with its keiro headers decoded, got %+v", recs)
	}
	// A second drain finds nothing to do and returns nothing.
	if again := keirotest.DrainOutbox(t, db.Pool, kafka); len(again) != 0 {
		t.Fatalf("want nothing published by a second drain, got %d rows", len(again))
	}

	t.Run("RequirePublished failure lists the records", func(t *testing.T) {
		if _, err := kafka.Client.ProduceSync(context.Background(),
			&kgo.Record{Topic: "ordering.orders.v1", Key: []byte("stray"), Value: []byte("plain text")}).First(); err != nil {
			t.Fatal(err)
		}
		r := record(t, func(tb testing.TB) {
			keirotest.RequirePublished(tb, kafka, "ordering.orders.v1", keirotest.Published{Key: "1001", EventType: "OrderPaid"})
		})
		requireFailure(t, r, `keirotest.RequirePublished: no record matches on topic "ordering.orders.v1"`,
			`want: key "1001", event type "OrderPaid"`, `found 3 records on topic "ordering.orders.v1"`,
			`partition 0 offset 0: OrderPlaced key "1001"`, `differs: event type is "OrderPlaced", want "OrderPaid"`,
			`partition 0 offset 2: key "stray", value plain text`, "differs: not a keiro record: ")
	})
	t.Run("RequirePublished on an empty topic says so", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.RequirePublished(tb, kafka, "billing.invoices.v1", keirotest.Published{Count: 1})
		})
		requireFailure(t, r, `want exactly 1 record matching, found 0 on topic "billing.invoices.v1"`,
			`topic "billing.invoices.v1" has no records (did the relay run?`)
	})
}

// TestDrainOutboxThroughOutage: the broker refuses the first produce requests; the drain rides
// it out and publishes everything, once.
func TestDrainOutboxThroughOutage(t *testing.T) {
	t.Parallel()
	db := keirotest.NewDB(t)
	kafka := keirotest.NewKafka(t, "ordering.orders.v1")
	outage := kafka.FailProduces(t, keirotest.ProduceFailure{Requests: 3})
	enqueue(t, db, orderEvent(t, "1001", "ada", 3000))

	sent := keirotest.DrainOutbox(t, db.Pool, kafka)
	if len(sent) != 1 {
		t.Fatalf("want the row published after the outage, got %d rows", len(sent))
	}
	select {
	case <-outage.Hit():
	default:
		t.Fatal("the outage was never hit")
	}
	if n := outage.Refused(); n != 3 || !outage.Ended() {
		t.Fatalf("want 3 refused requests and the outage over, got %d (ended %v)", n, outage.Ended())
	}
	keirotest.RequirePublished(t, kafka, "ordering.orders.v1", keirotest.Published{Key: "1001", Count: 1})
}

func TestDrainOutboxFailures(t *testing.T) {
	t.Parallel()
	t.Run("timeout lists the rows left", func(t *testing.T) {
		t.Parallel()
		db := keirotest.NewDB(t)
		kafka := keirotest.NewKafka(t, "ordering.orders.v1")
		kafka.FailProduces(t, keirotest.ProduceFailure{})
		enqueue(t, db, orderEvent(t, "1001", "ada", 3000))
		r := record(t, func(tb testing.TB) {
			keirotest.DrainOutbox(tb, db.Pool, kafka, keirotest.DrainOptions{Timeout: 500 * time.Millisecond})
		})
		requireFailure(t, r, fmt.Sprintf("keirotest.DrainOutbox: the outbox of schema %q still holds 1 unpublished row after 500ms", db.Schema),
			"Is the broker refusing produces (Kafka.FailProduces)", `1. [`, `OrderPlaced key "1001"`)
		if strings.Contains(r.message(), "matches") {
			t.Errorf("the rows left are not matches of anything: %s", r.message())
		}
	})
	t.Run("rejected rows fail the drain unless allowed", func(t *testing.T) {
		t.Parallel()
		db := keirotest.NewDB(t)
		kafka := keirotest.NewKafka(t, "ordering.orders.v1", "billing.invoices.v1")
		kafka.FailProduces(t, keirotest.ProduceFailure{Topics: []string{"billing.invoices.v1"}, Err: kerr.MessageTooLarge})
		invoice := orderEvent(t, "1002", "grace", 4200)
		invoice.Destination = "billing.invoices.v1"
		enqueue(t, db, orderEvent(t, "1001", "ada", 3000), invoice)
		r := record(t, func(tb testing.TB) { keirotest.DrainOutbox(tb, db.Pool, kafka) })
		requireFailure(t, r, "keirotest.DrainOutbox: 1 row could not be published and is now dead or rejected",
			`[rejected] OrderPlaced key "1002" billing.invoices.v1`, "DrainOptions.AllowUnpublished")

		enqueue(t, db, orderEvent(t, "1003", "alan", 100))
		sent := keirotest.DrainOutbox(t, db.Pool, kafka, keirotest.DrainOptions{AllowUnpublished: true})
		if len(sent) != 1 || *sent[0].Event.Key != "1003" {
			t.Fatalf("want order 1003 published, got %+v", sent)
		}
	})
}

func TestFailProducesOnlyListedTopics(t *testing.T) {
	t.Parallel()
	kafka := keirotest.NewKafka(t, "a", "b")
	outage := kafka.FailProduces(t, keirotest.ProduceFailure{Topics: []string{"b"}, Err: kerr.InvalidRecord})
	ctx := context.Background()
	if _, err := kafka.Client.ProduceSync(ctx, &kgo.Record{Topic: "a", Value: []byte("x")}).First(); err != nil {
		t.Fatalf("produce to a topic not in the outage: %v", err)
	}
	if _, err := kafka.Client.ProduceSync(ctx, &kgo.Record{Topic: "b", Value: []byte("x")}).First(); !errors.Is(err, kerr.InvalidRecord) {
		t.Fatalf("want INVALID_RECORD from the outage, got %v", err)
	}
	outage.End()
	if _, err := kafka.Client.ProduceSync(ctx, &kgo.Record{Topic: "b", Value: []byte("y")}).First(); err != nil {
		t.Fatalf("produce after the outage ended: %v", err)
	}
	if got := len(kafka.Records(t, "b")); got != 1 {
		t.Fatalf("want 1 record on b, got %d", got)
	}
}

// applyInvoice is a Go handler that records an invoice; it fails for a negative amount.
func applyInvoice(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
	var p struct {
		OrderID string `json:"orderId"`
		Total   int    `json:"totalCents"`
	}
	if err := envelope.DecodeJSON(&ev, &p); err != nil {
		return inbox.Permanent(err)
	}
	if p.Total < 0 {
		return inbox.Permanent(fmt.Errorf("order %s has a negative total", p.OrderID))
	}
	_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)`, p.OrderID, p.Total)
	return err
}

func invoices(t testing.TB, db *keirotest.DB) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM invoices`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDeliver(t *testing.T) {
	t.Parallel()
	db := keirotest.NewDB(t)
	if _, err := db.Pool.Exec(context.Background(), `
CREATE TABLE invoices (order_id text PRIMARY KEY, total_cents int NOT NULL);
CREATE FUNCTION apply_invoice(doc jsonb) RETURNS void LANGUAGE sql AS $$
  INSERT INTO invoices (order_id, total_cents)
  VALUES (doc->'payload'->>'orderId', (doc->'payload'->>'totalCents')::int) $$;`); err != nil {
		t.Fatal(err)
	}

	t.Run("go handler twice", func(t *testing.T) {
		d := keirotest.Deliver(t, db.Pool, orderEvent(t, "1001", "ada", 3000), keirotest.DeliverConfig{Handler: applyInvoice, Twice: true})
		if d.Outcome != inbox.Processed || d.Redelivery.Outcome != inbox.Duplicate || invoices(t, db) != 1 {
			t.Fatalf("want processed then duplicate with one invoice, got %+v / %+v", d.Result, d.Redelivery)
		}
	})
	t.Run("sql function twice", func(t *testing.T) {
		keirotest.Deliver(t, db.Pool, orderEvent(t, "1002", "grace", 4200), keirotest.DeliverConfig{SQLFunction: "apply_invoice", Twice: true})
		if n := invoices(t, db); n != 2 {
			t.Fatalf("want 2 invoices, got %d", n)
		}
	})
	t.Run("http endpoint twice", func(t *testing.T) {
		var calls atomic.Int64
		var key atomic.Value
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			key.Store(r.Header.Get("Idempotency-Key"))
			body, _ := io.ReadAll(r.Body)
			if !strings.Contains(string(body), `"orderId":"1003"`) {
				http.Error(w, "unexpected body "+string(body), http.StatusBadRequest)
			}
		}))
		defer srv.Close()
		d := keirotest.Deliver(t, db.Pool, orderEvent(t, "1003", "alan", 100),
			keirotest.DeliverConfig{HTTPURL: srv.URL, HTTPClient: srv.Client(), Twice: true})
		if calls.Load() != 1 || key.Load() != "keirotest:ordering:placed-1003" || d.Redelivery.Outcome != inbox.Duplicate {
			t.Fatalf("want one request with the idempotency key, got %d calls, key %v", calls.Load(), key.Load())
		}
	})
	t.Run("an expected handler failure is returned", func(t *testing.T) {
		d := keirotest.Deliver(t, db.Pool, orderEvent(t, "1004", "bad", -1), keirotest.DeliverConfig{Handler: applyInvoice, Want: inbox.Poisoned})
		if d.Outcome != inbox.Poisoned || d.Err == nil {
			t.Fatalf("want the permanent failure poisoned, got %+v", d.Result)
		}
	})
	t.Run("without Want a handler failure fails the test", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.Deliver(tb, db.Pool, orderEvent(tb, "1008", "bad", -8), keirotest.DeliverConfig{Handler: applyInvoice})
		})
		requireFailure(t, r, `keirotest.Deliver: delivering message "placed-1008" (OrderPlaced) to the Go handler failed: outcome poisoned`,
			"order 1008 has a negative total", "set DeliverConfig.Want")
		r = record(t, func(tb testing.TB) {
			keirotest.Deliver(tb, db.Pool, orderEvent(tb, "1009", "bad", 9), keirotest.DeliverConfig{
				Handler: func(context.Context, pgx.Tx, envelope.Event) error { return errors.New("ledger is locked") }})
		})
		requireFailure(t, r, "failed: outcome handler_failed: ledger is locked")
		// A message the inbox already holds is a duplicate: not a failure.
		ev := orderEvent(t, "1010", "eve", 10)
		keirotest.Deliver(t, db.Pool, ev, keirotest.DeliverConfig{Handler: applyInvoice})
		if d := keirotest.Deliver(t, db.Pool, ev, keirotest.DeliverConfig{Handler: applyInvoice}); d.Outcome != inbox.Duplicate {
			t.Fatalf("want a duplicate, got %s", d.Outcome)
		}
	})
	t.Run("an unknown Want fails the test", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.Deliver(tb, db.Pool, orderEvent(tb, "1011", "eve", 11), keirotest.DeliverConfig{Handler: applyInvoice, Want: 42})
		})
		requireFailure(t, r, "keirotest.Deliver: unknown DeliverConfig.Want Outcome(42)")
	})
	t.Run("Want names the outcome and the handler's error", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.Deliver(tb, db.Pool, orderEvent(tb, "1005", "bad", -5), keirotest.DeliverConfig{Handler: applyInvoice, Want: inbox.Processed})
		})
		requireFailure(t, r, `keirotest.Deliver: delivering message "placed-1005" (OrderPlaced) to the Go handler: want outcome processed, got poisoned`,
			"order 1005 has a negative total")
	})
	t.Run("Twice fails when the duplicate is not suppressed", func(t *testing.T) {
		var n atomic.Int64
		everyTimeNew := inbox.DedupeCustom(func(inbox.Delivery) (string, error) { return fmt.Sprint(n.Add(1)), nil })
		r := record(t, func(tb testing.TB) {
			keirotest.Deliver(tb, db.Pool, orderEvent(tb, "1006", "eve", 10),
				keirotest.DeliverConfig{SQLFunction: "apply_invoice", Twice: true, DedupePolicy: everyTimeNew})
		})
		requireFailure(t, r, `the second delivery of message "placed-1006" (OrderPlaced) to the SQL function apply_invoice was not suppressed`,
			"want outcome duplicate, got")
	})
	t.Run("bad configuration", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.Deliver(tb, db.Pool, orderEvent(tb, "1007", "eve", 10), keirotest.DeliverConfig{})
		})
		requireFailure(t, r, "set exactly one of DeliverConfig.Handler, SQLFunction and HTTPURL (got 0)")
		r = record(t, func(tb testing.TB) {
			keirotest.Deliver(tb, db.Pool, envelope.Event{EventType: "X"}, keirotest.DeliverConfig{Handler: applyInvoice})
		})
		requireFailure(t, r, "the event is not valid")
	})
}

func TestNewSchemaOnOwnPool(t *testing.T) {
	t.Parallel()
	db := keirotest.NewDB(t) // only for its pool; the schema below is another one
	schema := keirotest.NewSchema(t, db.Pool)
	if schema == db.Schema {
		t.Fatal("want a new schema")
	}
	rows := keirotest.OutboxRows(t, db.Pool, schema)
	if len(rows) != 0 {
		t.Fatalf("want an empty outbox, got %d rows", len(rows))
	}
}

// TestRequirePublishedWithin waits for a record a background producer sends.
func TestRequirePublishedWithin(t *testing.T) {
	t.Parallel()
	kafka := keirotest.NewKafka(t, "ordering.orders.v1")
	ev := orderEvent(t, "1001", "ada", 3000)
	produced := make(chan error, 1)
	go func() {
		r := ev.Record(envelope.EncodeOptions{})
		rec := &kgo.Record{Topic: ev.Destination, Key: r.Key, Value: r.Value}
		for _, h := range r.Headers {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		produced <- kafka.Client.ProduceSync(context.Background(), rec).FirstErr()
	}()
	recs := keirotest.RequirePublished(t, kafka, "ordering.orders.v1", keirotest.Published{MessageID: "placed-1001", Within: 10 * time.Second})
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	if recs[0].Event.Source != "ordering" {
		t.Fatalf("want the decoded source, got %q", recs[0].Event.Source)
	}
}

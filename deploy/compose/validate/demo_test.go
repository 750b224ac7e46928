package validate_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox/handlers"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// readSQL reads a SQL file the compose stack mounts and points it at schema instead of the
// stack's fixed schema names: psql meta-commands are dropped and psql variables substituted.
func readSQL(t *testing.T, rel string, replace map[string]string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	s := regexp.MustCompile(`(?m)^\\.*$`).ReplaceAllString(string(b), "")
	for old, repl := range replace {
		if !strings.Contains(s, old) {
			t.Fatalf("%s no longer contains %q; update this test", rel, old)
		}
		s = strings.ReplaceAll(s, old, repl)
	}
	return s
}

// TestDemoSQL runs the compose stack's demo SQL on a real PostgreSQL: the consumer's handler
// function through the real SQL handler, and the demo producer's outbox writes (keiro.enqueue)
// against the current migrations, so neither drifts from the code unnoticed.
func TestDemoSQL(t *testing.T) {
	db := testenv.NewDB(t)
	ctx := context.Background()
	s := db.Schema

	handlerSQL := readSQL(t, "deploy/compose/postgres/init/10-demo-handler.sql", map[string]string{
		"CREATE SCHEMA IF NOT EXISTS billing;": "",
		"billing.":                             s + ".",
	})
	if _, err := db.Pool.Exec(ctx, handlerSQL); err != nil {
		t.Fatalf("demo handler SQL: %v", err)
	}
	h, err := handlers.NewSQL(handlers.SQLConfig{Function: s + ".apply_order_event"})
	if err != nil {
		t.Fatal(err)
	}
	key := "customer-1"
	ev := envelope.Event{
		MessageID: "order-1", Source: "ordering", Destination: "billing.orders.v1", Key: &key,
		EventType: "OrderSubmitted", SchemaVersion: 1, ContentType: envelope.ContentTypeJSON,
		Payload: []byte(`{"orderId":"order-1","quantity":2}`), OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	handle := func(ev envelope.Event) error {
		return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return h.Handle(ctx, tx, ev) })
	}
	if err := handle(ev); err != nil {
		t.Fatalf("handle: %v", err)
	}
	var gotKey, gotType string
	var qty int
	var occurred time.Time
	err = db.Pool.QueryRow(ctx, "SELECT order_key, event_type, (payload->>'quantity')::int, occurred_at FROM "+s+".orders_received WHERE message_id = 'order-1'").
		Scan(&gotKey, &gotType, &qty, &occurred)
	if err != nil {
		t.Fatal(err)
	}
	if gotKey != key || gotType != "OrderSubmitted" || qty != 2 || !occurred.Equal(ev.OccurredAt) {
		t.Fatalf("row = %q %q %d %v", gotKey, gotType, qty, occurred)
	}
	// A second call for the same message is a unique violation (retried, not hidden): the
	// inbox, not the function, is what makes effects exactly-once.
	err = handle(ev)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23505" || handlers.IsPermanentSQLError(err) {
		t.Fatalf("second call: err = %v, want a retryable unique violation", err)
	}
	// Poison: an event without a type is permanent (SQLSTATE KP001).
	bad := ev
	bad.MessageID, bad.EventType = "order-2", ""
	if err := handle(bad); !handlers.IsPermanentSQLError(err) {
		t.Fatalf("event without type: err = %v, want permanent", err)
	}

	const n = 25
	enqueueSQL := readSQL(t, "deploy/compose/demo/enqueue-orders.sql", map[string]string{
		"keiro.keiro_outbox": s + ".keiro_outbox",
		"keiro.enqueue(":     s + ".enqueue(",
		":n":                 "25",
	})
	if _, err := db.Pool.Exec(ctx, enqueueSQL); err != nil {
		t.Fatalf("demo enqueue SQL: %v", err)
	}
	rows, err := db.Pool.Query(ctx, "SELECT message_id, source, destination, message_key, event_type, schema_version, content_type, payload_bytes, attributes, occurred_at FROM "+s+".keiro_outbox WHERE status = 'pending'")
	if err != nil {
		t.Fatal(err)
	}
	events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (envelope.Event, error) {
		var e envelope.Event
		err := r.Scan(&e.MessageID, &e.Source, &e.Destination, &e.Key, &e.EventType, &e.SchemaVersion, &e.ContentType, &e.Payload, &e.Attributes, &e.OccurredAt)
		return e, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != n {
		t.Fatalf("demo enqueued %d pending rows, want %d", len(events), n)
	}
	for _, e := range events {
		if err := e.Validate(); err != nil {
			t.Fatalf("demo row %s is not a valid envelope: %v", e.MessageID, err)
		}
		if !e.IsJSON() {
			t.Fatalf("demo row content type %q", e.ContentType)
		}
	}
}

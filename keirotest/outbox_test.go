package keirotest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest"
	"github.com/keiro-go/keiro/outbox"
)

// orderEvent is an OrderPlaced event for order id.
func orderEvent(t testing.TB, id, customer string, total int) envelope.Event {
	ev := keirotest.JSONEvent(t, "OrderPlaced", map[string]any{"orderId": id, "customer": customer, "totalCents": total})
	ev.Source, ev.Destination, ev.Key, ev.MessageID = "ordering", "ordering.orders.v1", &id, "placed-"+id
	return ev
}

// enqueue writes events to the outbox of db in one committed transaction.
func enqueue(t testing.TB, db *keirotest.DB, events ...envelope.Event) {
	t.Helper()
	st, err := outbox.NewStore(db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
		_, err := st.EnqueueTx(context.Background(), tx, events...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func TestRequireEnqueuedInsideAndAfterTransaction(t *testing.T) {
	t.Parallel()
	db := keirotest.NewDB(t)
	ctx := context.Background()
	st, err := outbox.NewStore(db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := st.EnqueueTx(ctx, tx, orderEvent(t, "1001", "ada", 3000)); err != nil {
		t.Fatal(err)
	}
	want := keirotest.Enqueued{Destination: "ordering.orders.v1", Key: "1001", EventType: "OrderPlaced",
		Payload: keirotest.JSONSubset(`{"customer":"ada"}`)}

	// Inside the transaction the row is visible; from the pool it is not yet.
	rows := keirotest.RequireEnqueued(t, tx, want)
	if len(rows) != 1 || rows[0].Status != outbox.StatusPending {
		t.Fatalf("want one pending row, got %+v", rows)
	}
	keirotest.RequireNotEnqueued(t, db.Pool, want)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want.Count = 1
	keirotest.RequireEnqueued(t, db.Pool, want)
}

func TestRequireEnqueuedFailureMessages(t *testing.T) {
	t.Parallel()
	db := keirotest.NewDB(t)
	enqueue(t, db, orderEvent(t, "1001", "ada", 3000), orderEvent(t, "1002", "grace", 4200))

	t.Run("wrong event type lists every row and how it differs", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.RequireEnqueued(tb, db.Pool, keirotest.Enqueued{Key: "1001", EventType: "OrderPaid"})
		})
		requireFailure(t, r,
			"keirotest.RequireEnqueued: no outbox row matches",
			`want: key "1001", event type "OrderPaid"`,
			fmt.Sprintf("found 2 rows in the outbox of schema %q", db.Schema),
			`1. [pending] OrderPlaced key "1001" ordering.orders.v1`,
			`differs: event type is "OrderPlaced", want "OrderPaid"`,
			`differs: key is "1002", want "1001"; event type is "OrderPlaced", want "OrderPaid"`)
	})
	t.Run("payload subset names the differing member", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.RequireEnqueued(tb, db.Pool, keirotest.Enqueued{Key: "1002",
				Payload: keirotest.JSONSubset(map[string]any{"customer": "ada", "currency": "EUR"})})
		})
		requireFailure(t, r, `payload JSON containing {"currency":"EUR","customer":"ada"}`,
			`payload: $.currency is missing, want "EUR"; $.customer is "grace", want "ada"`)
	})
	t.Run("count", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.RequireEnqueued(tb, db.Pool, keirotest.Enqueued{EventType: "OrderPlaced", Count: 3})
		})
		requireFailure(t, r, "want exactly 3 outbox rows matching, found 2", "matches")
	})
	t.Run("func matcher", func(t *testing.T) {
		type placed struct {
			Total int `json:"totalCents"`
		}
		r := record(t, func(tb testing.TB) {
			keirotest.RequireEnqueued(tb, db.Pool, keirotest.Enqueued{Payload: keirotest.JSONFunc(func(p placed) error {
				if p.Total < 5000 {
					return fmt.Errorf("total %d is below 5000", p.Total)
				}
				return nil
			})})
		})
		requireFailure(t, r, "payload a JSON keirotest_test.placed accepted by the JSONFunc",
			"payload: total 3000 is below 5000", "payload: total 4200 is below 5000")
	})
	t.Run("empty outbox", func(t *testing.T) {
		empty := keirotest.NewDB(t)
		r := record(t, func(tb testing.TB) {
			keirotest.RequireEnqueued(tb, empty.Pool, keirotest.Enqueued{EventType: "OrderPlaced"})
		})
		requireFailure(t, r, fmt.Sprintf("found: the outbox of schema %q is empty", empty.Schema))
	})
	t.Run("unknown schema", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.RequireEnqueued(tb, db.Pool, keirotest.Enqueued{Schema: "no_such_schema"})
		})
		requireFailure(t, r, "there is no table no_such_schema.keiro_outbox")
	})
	t.Run("not enqueued lists the matching rows", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.RequireNotEnqueued(tb, db.Pool, keirotest.Enqueued{Payload: keirotest.JSONSubset(`{"customer":"grace"}`)})
		})
		requireFailure(t, r, "keirotest.RequireNotEnqueued: 1 row in the outbox",
			`forbidden: payload JSON containing {"customer":"grace"}`, `OrderPlaced key "1002"`)
	})
	t.Run("status", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.RequireEnqueued(tb, db.Pool, keirotest.Enqueued{Key: "1001", Status: outbox.StatusSent})
		})
		requireFailure(t, r, `want: key "1001", status "sent"`, `status is "pending", want "sent"`)
		r = record(t, func(tb testing.TB) {
			keirotest.RequireEnqueued(tb, db.Pool, keirotest.Enqueued{Key: "1001", Status: outbox.StatusPending, Count: 1})
			keirotest.RequireNotEnqueued(tb, db.Pool, keirotest.Enqueued{Status: outbox.StatusDead})
		})
		requirePass(t, r)
	})
	t.Run("an unknown status fails instead of matching nothing", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.RequireNotEnqueued(tb, db.Pool, keirotest.Enqueued{Key: "1001", Status: "snet"})
		})
		requireFailure(t, r, `keirotest.RequireNotEnqueued: unknown Enqueued.Status "snet": use outbox.StatusPending, StatusPublishing, StatusSent`)
		r = record(t, func(tb testing.TB) {
			keirotest.RequireEnqueued(tb, db.Pool, keirotest.Enqueued{Status: "Pending"})
		})
		requireFailure(t, r, `keirotest.RequireEnqueued: unknown Enqueued.Status "Pending"`)
	})
	t.Run("passing assertions record nothing", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.RequireEnqueued(tb, db.Pool, keirotest.Enqueued{Source: "ordering", Count: 2})
			keirotest.RequireNotEnqueued(tb, db.Pool, keirotest.Enqueued{NoKey: true})
		})
		requirePass(t, r)
	})
}

// TestStatusesAreListable: the outbox listing accepts every outbox.Statuses value (and
// refuses any other), which the kit's Enqueued.Status checks rely on.
func TestStatusesAreListable(t *testing.T) {
	t.Parallel()
	db := keirotest.NewDB(t)
	st, err := outbox.NewAdmin(db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range outbox.Statuses() {
		if _, err := st.ListOutbox(context.Background(), db.Pool, outbox.ListOptions{Status: s}); err != nil {
			t.Errorf("status %q: %v", s, err)
		}
	}
	if _, err := st.ListOutbox(context.Background(), db.Pool, outbox.ListOptions{Status: "snet"}); err == nil {
		t.Fatal("the outbox listing accepts an unknown status; this test cannot tell the constants apart")
	}
}

// The package-level outbox.EnqueueTx writes where the kit looks: on a NewDB pool, the test's
// schema (its search_path), before and after commit, and on every connection of the pool.
func TestPackageEnqueueTxWritesToTheTestSchema(t *testing.T) {
	t.Parallel()
	db := keirotest.NewDB(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := outbox.EnqueueTx(ctx, tx, orderEvent(t, "1001", "ada", 3000)); err != nil {
		t.Fatal(err)
	}
	keirotest.RequireEnqueued(t, tx, keirotest.Enqueued{Key: "1001", Count: 1})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// A second enqueue on each connection checks the outbox the connection remembered.
	for i := range 3 {
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := outbox.EnqueueTx(ctx, tx, orderEvent(t, fmt.Sprint(2000+i), "bob", 100))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	keirotest.RequireEnqueued(t, db.Pool, keirotest.Enqueued{EventType: "OrderPlaced", Count: 4})
	if got := len(keirotest.OutboxRows(t, db.Pool, db.Schema)); got != 4 {
		t.Fatalf("want the 4 rows in the test's schema %s, found %d", db.Schema, got)
	}
	schema, err := outbox.ResolveSchema(ctx, db.Pool)
	if err != nil || schema != db.Schema {
		t.Fatalf("ResolveSchema = %q, %v; want the test's schema %q", schema, err, db.Schema)
	}
}

package keirotest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest"
	"github.com/keiro-go/keiro/outbox"
)

// TestNewTxRollsBack: the service writes through the test's transaction, the assertions read
// through it, and nothing of it is left when the test ends.
func TestNewTxRollsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var messageID string
	t.Run("in the transaction", func(t *testing.T) {
		tx := keirotest.NewTx(t)
		if tx.Schema != keirotest.TxSchema {
			t.Fatalf("want schema %s, got %s", keirotest.TxSchema, tx.Schema)
		}
		ev := orderEvent(t, "1001", "ada", 3000)
		ev.MessageID = "tx-" + ev.MessageID + "-" + t.Name()
		messageID = ev.MessageID
		if _, err := outbox.EnqueueTx(ctx, tx, ev); err != nil { // the package-level EnqueueTx finds the schema
			t.Fatal(err)
		}
		keirotest.RequireEnqueued(t, tx, keirotest.Enqueued{MessageID: ev.MessageID, Status: outbox.StatusPending, Count: 1})

		if _, err := tx.Exec(ctx, `CREATE TABLE invoices (order_id text PRIMARY KEY, total_cents int NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		refused := orderEvent(t, "1002", "grace", -5)
		refused.MessageID = messageID + "-refused"
		keirotest.Deliver(t, tx, ev, keirotest.DeliverConfig{Handler: applyInvoice, Twice: true})
		keirotest.Deliver(t, tx, refused, keirotest.DeliverConfig{Handler: applyInvoice, Want: inbox.Poisoned})
		keirotest.RequireProcessed(t, tx, ev.MessageID)
		keirotest.RequireInboxFailed(t, tx, refused.MessageID, keirotest.InboxOptions{Status: keirotest.InboxPoisoned})
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM invoices`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("want the one invoice in the transaction, got %d (%v)", n, err)
		}
		if err := tx.Commit(ctx); !errors.Is(err, keirotest.ErrTxCommit) {
			t.Fatalf("want Commit refused with ErrTxCommit, got %v", err)
		}
		keirotest.RequireProcessed(t, tx, ev.MessageID) // still open after the refused commit
	})
	// The subtest's cleanup rolled its transaction back: a new one sees nothing of it.
	tx := keirotest.NewTx(t)
	keirotest.RequireNotEnqueued(t, tx, keirotest.Enqueued{MessageID: messageID})
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('invoices') IS NOT NULL`).Scan(&exists); err != nil || exists {
		t.Fatalf("want the invoices table rolled back, got exists=%v (%v)", exists, err)
	}
	r := record(t, func(tb testing.TB) { keirotest.RequireProcessed(tb, tx, messageID) })
	requireFailure(t, r, `no inbox row of message "`+messageID+`"`)
}

// TestNewTxNested: the service's own transactions inside the test's are savepoints, and
// pgx.BeginFunc's commit of one succeeds.
func TestNewTxNested(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tx := keirotest.NewTx(t)
	ev := orderEvent(t, "1001", "ada", 3000)
	ev.MessageID += "-nested-" + t.Name()
	if err := pgx.BeginFunc(ctx, tx, func(inner pgx.Tx) error {
		_, err := outbox.EnqueueTx(ctx, inner, ev)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	keirotest.RequireEnqueued(t, tx, keirotest.Enqueued{MessageID: ev.MessageID, Count: 1})
}

package keirotest_test

import (
	"testing"

	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest"
)

func TestInboxAssertions(t *testing.T) {
	t.Parallel()
	db := newInvoices(t)
	good, refused, locked := orderEvent(t, "1001", "ada", 3000), orderEvent(t, "1002", "grace", -5), orderEvent(t, "1003", "alan", 1)
	keirotest.Deliver(t, db.Pool, good, keirotest.DeliverConfig{Handler: applyInvoice})
	keirotest.Deliver(t, db.Pool, refused, keirotest.DeliverConfig{Handler: applyInvoice, Want: inbox.Poisoned})
	keirotest.Deliver(t, db.Pool, locked, keirotest.DeliverConfig{Handler: flaky, Want: inbox.HandlerFailed})

	row := keirotest.RequireProcessed(t, db.Pool, good.MessageID)
	if row.Status != keirotest.InboxCompleted || row.Entry.Status != inbox.StatusCompleted || row.Entry.Delivery.Event.EventType != "OrderPlaced" {
		t.Fatalf("want the completed row of %s, got %+v", good.MessageID, row)
	}
	row = keirotest.RequireInboxFailed(t, db.Pool, refused.MessageID, keirotest.InboxOptions{
		Status: keirotest.InboxPoisoned, Attempts: 1, Error: "negative total"})
	if !row.Entry.Poisoned || row.Entry.LastError == "" {
		t.Fatalf("want the poisoned row with its last error, got %+v", row.Entry)
	}
	keirotest.RequireInboxFailed(t, db.Pool, locked.MessageID, keirotest.InboxOptions{Status: keirotest.InboxRetrying})
	keirotest.RequireInboxFailed(t, db.Pool, locked.MessageID) // any failed state

	t.Run("a failed message is not processed", func(t *testing.T) {
		r := record(t, func(tb testing.TB) { keirotest.RequireProcessed(tb, db.Pool, refused.MessageID) })
		requireFailure(t, r, `keirotest.RequireProcessed: the inbox row of message "placed-1002" does not match`,
			`want: message id "placed-1002", completed`,
			`found in the inbox of consumer "keirotest" in schema "`+db.Schema+`": [poisoned] message id "placed-1002"`,
			`1 failed attempt, last error: permanent: order 1002 has a negative total`, `differs: it is poisoned, want completed`)
	})
	t.Run("a processed message is not failed", func(t *testing.T) {
		r := record(t, func(tb testing.TB) { keirotest.RequireInboxFailed(tb, db.Pool, good.MessageID) })
		requireFailure(t, r, `differs: it is completed, want a failed state`)
		r = record(t, func(tb testing.TB) {
			keirotest.RequireInboxFailed(tb, db.Pool, refused.MessageID, keirotest.InboxOptions{Status: keirotest.InboxDeadLettered, Attempts: 3})
		})
		requireFailure(t, r, `differs: it is poisoned, want dead_lettered; it has 1 failed attempt, want 3`)
	})
	t.Run("an unknown message lists the consumer's rows", func(t *testing.T) {
		r := record(t, func(tb testing.TB) { keirotest.RequireProcessed(tb, db.Pool, "placed-9999") })
		requireFailure(t, r, `no inbox row of message "placed-9999"`, `found 3 rows in the inbox of consumer "keirotest"`,
			`[completed] message id "placed-1001"`, `[retrying] message id "placed-1003"`)
	})
	t.Run("another consumer's inbox names the consumers", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.RequireProcessed(tb, db.Pool, good.MessageID, keirotest.InboxOptions{Consumer: "billing"})
		})
		requireFailure(t, r, `the inbox of consumer "billing" in schema "`+db.Schema+`" is empty; the inbox holds rows of consumers ["keirotest"]`)
	})
	t.Run("bad options", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			fn   func(tb testing.TB)
			want string
		}{
			{"unknown status", func(tb testing.TB) {
				keirotest.RequireInboxFailed(tb, db.Pool, good.MessageID, keirotest.InboxOptions{Status: "failed"})
			}, `unknown InboxOptions.Status "failed": use InboxCompleted, InboxRetrying, InboxPoisoned or InboxDeadLettered`},
			{"failed state to RequireProcessed", func(tb testing.TB) {
				keirotest.RequireProcessed(tb, db.Pool, good.MessageID, keirotest.InboxOptions{Status: keirotest.InboxPoisoned})
			}, "InboxOptions.Status poisoned is a failed state: use RequireInboxFailed"},
			{"completed to RequireInboxFailed", func(tb testing.TB) {
				keirotest.RequireInboxFailed(tb, db.Pool, good.MessageID, keirotest.InboxOptions{Status: keirotest.InboxCompleted})
			}, "InboxOptions.Status completed is not a failed state: use RequireProcessed"},
			{"empty message id", func(tb testing.TB) { keirotest.RequireProcessed(tb, db.Pool, "") }, "the message id is empty"},
			{"two options", func(tb testing.TB) {
				keirotest.RequireProcessed(tb, db.Pool, good.MessageID, keirotest.InboxOptions{}, keirotest.InboxOptions{})
			}, "at most one InboxOptions may be given, got 2"},
		} {
			t.Run(tc.name, func(t *testing.T) { requireFailure(t, record(t, tc.fn), tc.want) })
		}
	})
}

// TestConsumerInboxAssertions: a RunConsumer handle asserts its own inbox without naming it.
func TestConsumerInboxAssertions(t *testing.T) {
	t.Parallel()
	db := newInvoices(t)
	kafka := keirotest.NewKafka(t, "ordering.orders.v1")
	c := keirotest.RunConsumer(t, db.Pool, kafka, applyInvoice, inbox.ConsumerConfig{
		Group: "billing", Topics: []string{"ordering.orders.v1"}})
	good, refused := orderEvent(t, "1001", "ada", 3000), orderEvent(t, "1002", "grace", -5)
	keirotest.Produce(t, kafka, refused)
	keirotest.Produce(t, kafka, good)
	c.WaitDeadLettered(t, refused.MessageID)
	c.WaitProcessed(t, good.MessageID)

	if c.Name != "billing" {
		t.Fatalf("want the inbox consumer named after the group, got %q", c.Name)
	}
	c.RequireProcessed(t, good.MessageID)
	c.RequireInboxFailed(t, refused.MessageID, keirotest.InboxOptions{Status: keirotest.InboxDeadLettered, Error: "negative total"})
	keirotest.RequireProcessed(t, db.Pool, good.MessageID, keirotest.InboxOptions{Consumer: "billing"})
}

func TestInboxStatuses(t *testing.T) {
	want := []keirotest.InboxStatus{"completed", "retrying", "poisoned", "dead_lettered"}
	if len(keirotest.InboxStatuses) != len(want) {
		t.Fatalf("want %v, got %v", want, keirotest.InboxStatuses)
	}
	for i := range want {
		if keirotest.InboxStatuses[i] != want[i] {
			t.Fatalf("want %v, got %v", want, keirotest.InboxStatuses)
		}
	}
}

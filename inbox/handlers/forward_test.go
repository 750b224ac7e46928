package handlers_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/inbox/handlers"
	"github.com/keiro-go/keiro/keirotest"
	"github.com/keiro-go/keiro/outbox"
)

// invoiceFor is the ForwardFunc of the tests: an OrderPlaced on ordering.orders.v1 becomes an
// InvoiceIssued on billing.invoices.v1, same key.
func invoiceFor(_ context.Context, ev envelope.Event) ([]envelope.Event, error) {
	return []envelope.Event{{
		Source: "billing", Destination: "billing.invoices.v1", Key: ev.Key, EventType: "InvoiceIssued",
		SchemaVersion: 1, ContentType: envelope.ContentTypeJSON, Payload: ev.Payload, OccurredAt: ev.OccurredAt,
	}}, nil
}

// forwardSetup is a database with an outbox Store and a Forward handler of fn on it.
type forwardSetup struct {
	db    *keirotest.DB
	store *outbox.Store
	h     inbox.Handler
}

func setupForward(t *testing.T, fn handlers.ForwardFunc) *forwardSetup {
	t.Helper()
	db := keirotest.NewDB(t)
	store, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	h, err := handlers.Forward(store, fn)
	require.NoError(t, err)
	return &forwardSetup{db: db, store: store, h: h}
}

func orderPlaced(t *testing.T, id string) envelope.Event {
	ev := keirotest.JSONEvent(t, "OrderPlaced", map[string]string{"order": id})
	ev.MessageID, ev.Source, ev.Destination, ev.Key = "order-placed-"+id, "ordering", "ordering.orders.v1", &id
	return ev
}

func TestForwardEnqueuesOncePerConsumedEvent(t *testing.T) {
	t.Parallel()
	s := setupForward(t, invoiceFor)
	ev := orderPlaced(t, "1001")
	keirotest.Deliver(t, s.db.Pool, ev, keirotest.DeliverConfig{Handler: s.h, Twice: true}) // the redelivery is suppressed
	want := keirotest.Enqueued{MessageID: handlers.ForwardedMessageID(ev, 0), Source: "billing",
		Destination: "billing.invoices.v1", Key: "1001", EventType: "InvoiceIssued", Count: 1}
	keirotest.RequireEnqueued(t, s.db.Pool, want)

	// Past the inbox (another consumer name: no inbox row to find), the derived message id
	// makes the enqueue a duplicate: still one row.
	keirotest.Deliver(t, s.db.Pool, ev, keirotest.DeliverConfig{Handler: s.h, Consumer: "billing-replay"})
	keirotest.RequireEnqueued(t, s.db.Pool, want)
	require.Len(t, keirotest.OutboxRows(t, s.db.Pool, s.db.Schema), 1)
}

func TestForwardFailureEnqueuesNothing(t *testing.T) {
	t.Parallel()
	errDown := errors.New("pricing service down")
	s := setupForward(t, func(context.Context, envelope.Event) ([]envelope.Event, error) { return nil, errDown })
	d := keirotest.Deliver(t, s.db.Pool, orderPlaced(t, "1002"), keirotest.DeliverConfig{Handler: s.h, Want: inbox.HandlerFailed})
	require.ErrorIs(t, d.Err, errDown)
	require.Empty(t, keirotest.OutboxRows(t, s.db.Pool, s.db.Schema))
}

func TestForwardPoisonsWhatWouldFailAgain(t *testing.T) {
	t.Parallel()
	t.Run("invalid event", func(t *testing.T) {
		t.Parallel()
		s := setupForward(t, func(ctx context.Context, ev envelope.Event) ([]envelope.Event, error) {
			evs, _ := invoiceFor(ctx, ev)
			evs[0].Destination = "not a topic"
			return evs, nil
		})
		d := keirotest.Deliver(t, s.db.Pool, orderPlaced(t, "1003"), keirotest.DeliverConfig{Handler: s.h, Want: inbox.Poisoned})
		require.ErrorContains(t, d.Err, "event 0 is not valid")
		require.Empty(t, keirotest.OutboxRows(t, s.db.Pool, s.db.Schema))
	})
	t.Run("identity conflict", func(t *testing.T) {
		t.Parallel()
		s := setupForward(t, func(ctx context.Context, ev envelope.Event) ([]envelope.Event, error) {
			evs, _ := invoiceFor(ctx, ev)
			evs[0].MessageID = "invoice" // the same id for every order: the second conflicts
			return evs, nil
		})
		keirotest.Deliver(t, s.db.Pool, orderPlaced(t, "1004"), keirotest.DeliverConfig{Handler: s.h})
		d := keirotest.Deliver(t, s.db.Pool, orderPlaced(t, "1005"), keirotest.DeliverConfig{Handler: s.h, Want: inbox.Poisoned})
		require.ErrorIs(t, d.Err, outbox.ErrIdentityConflict)
		require.Len(t, keirotest.OutboxRows(t, s.db.Pool, s.db.Schema), 1)
	})
}

func TestForwardNothing(t *testing.T) {
	t.Parallel()
	s := setupForward(t, func(context.Context, envelope.Event) ([]envelope.Event, error) { return nil, nil })
	keirotest.Deliver(t, s.db.Pool, orderPlaced(t, "1006"), keirotest.DeliverConfig{Handler: s.h})
	require.Empty(t, keirotest.OutboxRows(t, s.db.Pool, s.db.Schema))
}

func TestForwardRequiresFn(t *testing.T) {
	_, err := handlers.Forward(nil, nil)
	require.ErrorContains(t, err, "fn is required")
}

func TestForwardedMessageID(t *testing.T) {
	a := envelope.Event{Source: "ordering", MessageID: "m1"}
	id := handlers.ForwardedMessageID(a, 0)
	require.Equal(t, id, handlers.ForwardedMessageID(a, 0), "stable")
	require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, id)
	seen := map[string]string{}
	for _, ev := range []envelope.Event{a, {Source: "ordering", MessageID: "m2"}, {Source: "orderin", MessageID: "gm1"}} {
		for i := range 2 {
			id := handlers.ForwardedMessageID(ev, i)
			what := fmt.Sprintf("%s/%s/%d", ev.Source, ev.MessageID, i)
			require.NotContains(t, seen, id, "%s and %s", what, seen[id])
			seen[id] = what
		}
	}
}

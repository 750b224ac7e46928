package workflow_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/workflow"
)

func event(id string) envelope.Event {
	return envelope.Event{
		MessageID: id, Source: "ordering", Destination: "ordering.shipments.v1", EventType: "ShipmentRequested",
		SchemaVersion: 1, ContentType: "application/json", Payload: []byte(`{"order":"o-1"}`), OccurredAt: time.Now().UTC(),
	}
}

// A step that enqueues into the outbox commits the row with its journal entry, once; a step
// that fails rolls its outbox row back.
func TestStepEnqueuesOutboxInSameTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *workflow.Config) { c.MaxAttempts = 1 })
	ctx := context.Background()
	ob, err := outbox.NewStore(b.db.Schema)
	require.NoError(t, err)
	w, err := workflow.Register(b.e, "ship", func(c *workflow.Context, order string) (int, error) {
		if _, err := workflow.Step(c, "request", func(ctx context.Context, tx pgx.Tx) (bool, error) {
			_, err := ob.EnqueueTx(ctx, tx, event("ship-"+order))
			return true, err
		}); err != nil {
			return 0, err
		}
		_, err := workflow.Step(c, "broken", func(ctx context.Context, tx pgx.Tx) (bool, error) {
			if _, err := ob.EnqueueTx(ctx, tx, event("never-"+order)); err != nil {
				return false, err
			}
			return false, errors.New("carrier down")
		})
		return 0, err
	})
	require.NoError(t, err)
	start(t, b, w, "o-1", "o-1")
	for range 2 {
		_, err := w.Run(ctx, "o-1")
		require.NoError(t, err)
	}
	rows, err := b.db.Pool.Query(ctx, `SELECT message_id FROM keiro_outbox ORDER BY message_id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"ship-o-1"}, ids)
	require.Equal(t, workflow.StatusFailed, b.instance(t, "ship", "o-1").Status)
}

// An inbox handler starts a workflow and completes another's awaited step in the delivery's
// transaction: a redelivered message starts and signals nothing twice, and a failed handler
// starts nothing.
func TestInboxHandlerStartsAndSignalsWorkflow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	in, err := inbox.NewStore(inbox.StoreConfig{Schema: b.db.Schema, Consumer: "shipping"})
	require.NoError(t, err)
	started, err := workflow.Register(b.e, "fulfil", func(c *workflow.Context, order string) (string, error) {
		return workflow.Await[string](c, "paid")
	})
	require.NoError(t, err)
	handler := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		switch ev.EventType {
		case "OrderPlaced":
			_, err := started.StartTx(ctx, tx, ev.MessageID, ev.MessageID)
			return err
		case "PaymentTaken":
			_, err := b.e.CompleteStepTx(ctx, tx, "fulfil", "order-1", "paid", ev.MessageID)
			return err
		}
		return errors.New("unexpected " + ev.EventType)
	}
	placed := event("order-1")
	placed.EventType = "OrderPlaced"
	for i, want := range []inbox.Outcome{inbox.Processed, inbox.Duplicate} {
		res, err := in.Process(ctx, b.db.Pool, inbox.Delivery{Event: placed}, handler)
		require.NoError(t, err, i)
		require.Equal(t, want, res.Outcome)
	}
	bad := event("order-2")
	bad.EventType = "Unknown"
	res, err := in.Process(ctx, b.db.Pool, inbox.Delivery{Event: bad}, handler)
	require.NoError(t, err)
	require.Equal(t, inbox.HandlerFailed, res.Outcome)
	_, err = b.e.Instance(ctx, b.db.Pool, "fulfil", "order-2")
	require.ErrorIs(t, err, workflow.ErrNotFound)

	p, err := b.worker(t, "w").RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Suspended)
	paid := event("payment-1")
	paid.EventType = "PaymentTaken"
	for range 2 {
		_, err := in.Process(ctx, b.db.Pool, inbox.Delivery{Event: paid}, handler)
		require.NoError(t, err)
	}
	p, err = b.worker(t, "w").RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Completed)
	got, _, _, err := started.Result(ctx, b.db.Pool, "order-1")
	require.NoError(t, err)
	require.Equal(t, "payment-1", got)
}

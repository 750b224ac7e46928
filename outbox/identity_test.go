package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// TestEnqueueWithIDs: caller-chosen outbox ids are stored as given; a duplicate reports the
// retained row's id; bad id lists are refused; an id taken by another message is a clear error.
func TestEnqueueWithIDs(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	id1, _ := envelope.ParseUUID("61dd62b4-bbfe-81ce-9634-6ce6afd48517")
	id2, _ := envelope.ParseUUID("bc64f902-5e73-8ca8-8a8f-8ead093187fc")
	enqueue := func(ids []envelope.UUID, evs ...envelope.Event) ([]outbox.EnqueueResult, error) {
		var res []outbox.EnqueueResult
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var err error
			res, err = st.EnqueueWithIDsTx(ctx, tx, ids, evs...)
			return err
		})
		return res, err
	}
	e1, e2 := event("m1", "orders", ptr("k"), `{}`), event("m2", "orders", ptr("k"), `{}`)
	res, err := enqueue([]envelope.UUID{id1, id2}, e1, e2)
	require.NoError(t, err)
	require.Equal(t, id1, res[0].OutboxID)
	require.Equal(t, id2, res[1].OutboxID)
	var stored [16]byte
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT outbox_id FROM keiro_outbox WHERE message_id = 'm2'").Scan(&stored))
	require.Equal(t, id2, envelope.UUID(stored))

	res, err = enqueue([]envelope.UUID{envelope.NewUUIDv7()}, e1)
	require.NoError(t, err)
	require.Equal(t, outbox.Duplicate, res[0].Outcome)
	require.Equal(t, id1, res[0].OutboxID)

	_, err = enqueue([]envelope.UUID{id1}, e1, e2)
	require.ErrorContains(t, err, "1 outbox ids for 2 events")
	_, err = enqueue([]envelope.UUID{{}}, e1)
	require.ErrorContains(t, err, "zero UUID")
	_, err = enqueue([]envelope.UUID{id1, id1}, event("m3", "orders", ptr("k"), `{}`), event("m4", "orders", ptr("k"), `{}`))
	require.ErrorContains(t, err, "same outbox id")
	_, err = enqueue([]envelope.UUID{id1}, event("m5", "orders", ptr("k"), `{}`))
	require.ErrorIs(t, err, outbox.ErrOutboxIDTaken)
}

package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// TestSearch finds a consumer's rows, completed or failed, by an exact source, dedupe key,
// message id, key or event type; another consumer's rows are not its.
func TestSearch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	s := newStore(t, db, func(c *inbox.StoreConfig) { c.MaxAttempts = 1 })
	other := newStore(t, db, func(c *inbox.StoreConfig) { c.Consumer = "other" })
	ok := func(context.Context, pgx.Tx, envelope.Event) error { return nil }
	fail := func(context.Context, pgx.Tx, envelope.Event) error { return errors.New("bad") }

	done, failed := newEvent("orders", "t"), newEvent("orders", "t")
	key := "customer-7"
	done.Key, failed.Key = &key, &key
	failed.EventType = "OrderCancelled"
	_, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: done}, ok)
	require.NoError(t, err)
	_, err = s.Process(ctx, db.Pool, inbox.Delivery{Event: failed}, fail)
	require.NoError(t, err)
	_, err = other.Process(ctx, db.Pool, inbox.Delivery{Event: newEvent("orders", "t")}, ok)
	require.NoError(t, err)

	byKey, err := s.Search(ctx, db.Pool, key, 0)
	require.NoError(t, err)
	require.Len(t, byKey, 2)
	require.Equal(t, failed.MessageID, byKey[0].Delivery.Event.MessageID, "newest received first")
	require.Equal(t, "failed", byKey[0].Status)
	require.Equal(t, "completed", byKey[1].Status)

	for term, want := range map[string]int{done.MessageID: 1, "OrderCancelled": 1, "orders": 2, "nothing": 0} {
		got, err := s.Search(ctx, db.Pool, term, 0)
		require.NoError(t, err)
		require.Len(t, got, want, term)
	}
	limited, err := s.Search(ctx, db.Pool, "orders", 1)
	require.NoError(t, err)
	require.Len(t, limited, 1)
	_, err = s.Search(ctx, db.Pool, "", 0)
	require.ErrorContains(t, err, "empty")
}

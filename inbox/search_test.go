package inbox_test

import (
	"context"
	"crypto/rand"
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

	byKey, err := inbox.NewAdmin(s).Search(ctx, db.Pool, inbox.SearchOptions{Term: key})
	require.NoError(t, err)
	require.Len(t, byKey, 2)
	require.Equal(t, failed.MessageID, byKey[0].Delivery.Event.MessageID, "newest received first")
	require.Equal(t, inbox.StatusFailed, byKey[0].Status)
	require.Equal(t, inbox.StatusCompleted, byKey[1].Status)

	for term, want := range map[string]int{done.MessageID: 1, "OrderCancelled": 1, "orders": 2, "nothing": 0} {
		got, err := inbox.NewAdmin(s).Search(ctx, db.Pool, inbox.SearchOptions{Term: term})
		require.NoError(t, err)
		require.Len(t, got, want, term)
	}
	limited, err := inbox.NewAdmin(s).Search(ctx, db.Pool, inbox.SearchOptions{Term: "orders", Limit: 1})
	require.NoError(t, err)
	require.Len(t, limited, 1)
	_, err = inbox.NewAdmin(s).Search(ctx, db.Pool, inbox.SearchOptions{})
	require.ErrorContains(t, err, "empty")
}

// TestListingsReadAPrefixOfEachPayload: ListFailed and Search with PayloadBytes read at most
// that many bytes of each payload (none with NoPayload) and give each payload's whole size;
// Lookup and the default listings read whole payloads; a negative size is refused.
func TestListingsReadAPrefixOfEachPayload(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	s := newStore(t, db, func(c *inbox.StoreConfig) { c.MaxAttempts = 1 })
	fail := func(context.Context, pgx.Tx, envelope.Event) error { return errors.New("bad") }
	big := make([]byte, 1<<20) // incompressible, so it is stored out of line
	_, err := rand.Read(big)
	require.NoError(t, err)
	ev := newEvent("orders", "t")
	ev.ContentType, ev.Payload = "application/octet-stream", big
	_, err = s.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, fail)
	require.NoError(t, err)

	check := func(want int) func([]inbox.Entry, error) {
		return func(entries []inbox.Entry, err error) {
			t.Helper()
			require.NoError(t, err)
			require.Len(t, entries, 1)
			require.Equal(t, len(big), entries[0].PayloadSize)
			require.Equal(t, big[:want], []byte(entries[0].Delivery.Event.Payload))
		}
	}
	check(32)(inbox.NewAdmin(s).ListFailed(ctx, db.Pool, inbox.ListOptions{PayloadBytes: 32}))
	check(0)(inbox.NewAdmin(s).ListFailed(ctx, db.Pool, inbox.ListOptions{PayloadBytes: inbox.NoPayload}))
	check(len(big))(inbox.NewAdmin(s).ListFailed(ctx, db.Pool, inbox.ListOptions{}))
	check(100)(inbox.NewAdmin(s).Search(ctx, db.Pool, inbox.SearchOptions{Term: ev.MessageID, PayloadBytes: 100}))
	check(len(big))(inbox.NewAdmin(s).Search(ctx, db.Pool, inbox.SearchOptions{Term: ev.MessageID}))
	e, err := inbox.NewAdmin(s).Lookup(ctx, db.Pool, inbox.Key{Source: ev.Source, DedupeKey: ev.MessageID})
	check(len(big))([]inbox.Entry{e}, err)

	_, err = inbox.NewAdmin(s).ListFailed(ctx, db.Pool, inbox.ListOptions{PayloadBytes: -2})
	require.ErrorContains(t, err, "PayloadBytes -2 is negative")
	_, err = inbox.NewAdmin(s).Search(ctx, db.Pool, inbox.SearchOptions{Term: "orders", PayloadBytes: -2})
	require.ErrorContains(t, err, "PayloadBytes -2 is negative")
}

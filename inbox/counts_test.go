package inbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// CountByConsumer counts every consumer's rows by state; Activity puts the store consumer's
// rows in the minutes of their latest state.
func TestCountByConsumerAndActivity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	billing := newStore(t, db)
	shipping := newStore(t, db, func(c *inbox.StoreConfig) { c.Consumer = "shipping" })
	ok := func(context.Context, pgx.Tx, envelope.Event) error { return nil }
	fail := func(context.Context, pgx.Tx, envelope.Event) error { return errors.New("try again") }
	poison := func(context.Context, pgx.Tx, envelope.Event) error { return inbox.Permanent(errors.New("never")) }
	process := func(s *inbox.Store, h inbox.Handler, want inbox.Outcome) {
		t.Helper()
		res, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: newEvent("ordering", "orders")}, h)
		require.NoError(t, err)
		require.Equal(t, want, res.Outcome)
	}
	var dbNow time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT date_trunc('minute', now())`).Scan(&dbNow))

	counts, err := inbox.NewAdmin(billing).CountByConsumer(ctx, db.Pool)
	require.NoError(t, err)
	require.Empty(t, counts)

	process(billing, ok, inbox.Processed)
	process(billing, ok, inbox.Processed)
	process(billing, fail, inbox.HandlerFailed)
	process(billing, poison, inbox.Poisoned)
	process(shipping, ok, inbox.Processed)

	counts, err = inbox.NewAdmin(shipping).CountByConsumer(ctx, db.Pool)
	require.NoError(t, err)
	require.Len(t, counts, 2)
	require.NotNil(t, counts[0].OldestFailure)
	require.Equal(t, inbox.Counts{Consumer: "billing", Completed: 2, Retrying: 1, Poisoned: 1, OldestFailure: counts[0].OldestFailure}, counts[0])
	require.Equal(t, inbox.Counts{Consumer: "shipping", Completed: 1}, counts[1])

	// An archived failure leaves the working counts and the oldest failure: archiving both
	// failed rows leaves nothing retrying or poisoned.
	listed, err := inbox.NewAdmin(billing).ListFailed(ctx, db.Pool, inbox.ListOptions{})
	require.NoError(t, err)
	require.Len(t, listed, 2)
	keys := []inbox.Key{{Source: listed[0].Source, DedupeKey: listed[0].DedupeKey}, {Source: listed[1].Source, DedupeKey: listed[1].DedupeKey}}
	archived, err := inbox.NewAdmin(billing).Archive(ctx, db.Pool, keys)
	require.NoError(t, err)
	require.Len(t, archived, 2)
	counts, err = inbox.NewAdmin(billing).CountByConsumer(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, inbox.Counts{Consumer: "billing", Completed: 2, Archived: 2}, counts[0])

	// Two minutes either side of now: everything falls in the current one (a minute boundary
	// passed during the test moves it one bucket on).
	minutes, err := inbox.NewAdmin(billing).Activity(ctx, db.Pool, dbNow.Add(-2*time.Minute), 5)
	require.NoError(t, err)
	require.Len(t, minutes, 5)
	var completed, failed int64
	for i, m := range minutes {
		require.True(t, m.Start.Equal(dbNow.Add(time.Duration(i-2)*time.Minute)), "minute %d starts at %s", i, m.Start)
		if i < 2 {
			require.Zero(t, m.Completed+m.Failed, "nothing happened before the test")
		}
		completed, failed = completed+m.Completed, failed+m.Failed
	}
	require.Equal(t, int64(2), completed)
	require.Equal(t, int64(2), failed)

	_, err = inbox.NewAdmin(billing).Activity(ctx, db.Pool, dbNow, 0)
	require.ErrorContains(t, err, "n must be at least 1")
}

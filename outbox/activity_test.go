package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// TestActivity: Activity counts published rows by published_at and dead or rejected rows by
// updated_at, one Minute per minute from the given start, zero minutes included.
func TestActivity(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	enqueue(t, db.Pool, st, event("a", "orders", nil, `{}`), event("b", "orders", nil, `{}`),
		event("c", "orders", nil, `{}`), event("d", "orders", nil, `{}`), event("e", "orders", nil, `{}`))
	from := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	set := func(status, extra string, at time.Time, ids ...string) {
		_, err := db.Pool.Exec(ctx, `UPDATE keiro_outbox SET status = $1`+extra+` WHERE message_id = ANY($3)`, status, at, ids)
		require.NoError(t, err)
	}
	set("sent", `, published_at = $2`, from.Add(10*time.Second), "a", "b")
	set("sent", `, published_at = $2`, from.Add(2*time.Minute+59*time.Second), "c")
	set("dead", `, updated_at = $2`, from.Add(2*time.Minute), "d")
	set("sent", `, published_at = $2`, from.Add(3*time.Minute), "e") // past the 3 minutes asked

	minutes, err := outbox.AdminOf(st).Activity(ctx, db.Pool, from, 3)
	require.NoError(t, err)
	require.Equal(t, []outbox.Minute{
		{Start: from, Sent: 2},
		{Start: from.Add(time.Minute)},
		{Start: from.Add(2 * time.Minute), Sent: 1, Failed: 1},
	}, minutes)

	_, err = outbox.AdminOf(st).Activity(ctx, db.Pool, from, 0)
	require.ErrorContains(t, err, "n must be at least 1")
}

package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// TestListingQueries: ListOutbox filters and pages in seq order; ListStuckOutbox finds claims
// older than the threshold; ListSentGcCandidates finds sent rows past retention.
func TestListingQueries(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	res := enqueue(t, db.Pool, st,
		event("a", "orders", ptr("k1"), `{}`), event("b", "orders", ptr("k2"), `{}`),
		event("c", "invoices", nil, `{}`), event("d", "orders", ptr("k1"), `{}`), event("e", "orders", nil, `{}`))
	set := func(status, extra string, ids ...string) {
		_, err := db.Pool.Exec(ctx, `UPDATE keiro_outbox SET status = $1`+extra+` WHERE message_id = ANY($2)`, status, ids)
		require.NoError(t, err)
	}
	set("publishing", `, updated_at = now() - interval '10 minutes', lease_until = now() + interval '1 minute', attempt_count = 1`, "b")
	set("publishing", `, attempt_count = 1, lease_until = now() + interval '1 minute'`, "e")
	set("sent", `, published_at = now() - interval '2 days'`, "c")
	set("sent", `, published_at = now()`, "d")

	all, err := st.ListOutbox(ctx, db.Pool, outbox.ListOptions{})
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c", "d", "e"}, rowMessageIDs(all))
	require.Equal(t, res[0].OutboxID, all[0].OutboxID)
	require.Equal(t, "orders", all[0].Event.Destination)

	page, err := st.ListOutbox(ctx, db.Pool, outbox.ListOptions{Destination: "orders", Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, rowMessageIDs(page))
	page, err = st.ListOutbox(ctx, db.Pool, outbox.ListOptions{Destination: "orders", Limit: 2, After: page[1].Seq})
	require.NoError(t, err)
	require.Equal(t, []string{"d", "e"}, rowMessageIDs(page))
	keyed, err := st.ListOutbox(ctx, db.Pool, outbox.ListOptions{Key: "k1", Status: "pending", Source: "ordering"})
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, rowMessageIDs(keyed))

	stuck, err := st.ListStuckOutbox(ctx, db.Pool, 5*time.Minute, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"b"}, rowMessageIDs(stuck))
	stuck, err = st.ListStuckOutbox(ctx, db.Pool, 0, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"b", "e"}, rowMessageIDs(stuck))

	gc, err := st.ListSentGcCandidates(ctx, db.Pool, 24*time.Hour, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"c"}, rowMessageIDs(gc))
	require.NotNil(t, gc[0].PublishedAt)

	_, err = st.ListOutbox(ctx, db.Pool, outbox.ListOptions{Status: "lost"})
	require.ErrorContains(t, err, "unknown status")
	_, err = st.ListOutbox(ctx, db.Pool, outbox.ListOptions{Limit: -1})
	require.ErrorContains(t, err, "negative")
	_, err = st.ListStuckOutbox(ctx, db.Pool, -time.Second, 0)
	require.ErrorContains(t, err, "negative")
	_, err = st.ListSentGcCandidates(ctx, db.Pool, -time.Second, 0)
	require.ErrorContains(t, err, "negative")
}

func rowMessageIDs(rows []outbox.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.Event.MessageID
	}
	return out
}

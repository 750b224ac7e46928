package outbox_test

import (
	"context"
	"crypto/rand"
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

	all, err := outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{})
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c", "d", "e"}, rowMessageIDs(all))
	require.Equal(t, res[0].OutboxID, all[0].OutboxID)
	require.Equal(t, "orders", all[0].Event.Destination)

	page, err := outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{Destination: "orders", Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, rowMessageIDs(page))
	page, err = outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{Destination: "orders", Limit: 2, After: page[1].Seq})
	require.NoError(t, err)
	require.Equal(t, []string{"d", "e"}, rowMessageIDs(page))
	keyed, err := outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{Key: "k1", Status: "pending", Source: "ordering"})
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, rowMessageIDs(keyed))

	stuck, err := outbox.AdminOf(st).ListStuckOutbox(ctx, db.Pool, 5*time.Minute, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"b"}, rowMessageIDs(stuck))
	stuck, err = outbox.AdminOf(st).ListStuckOutbox(ctx, db.Pool, 0, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"b", "e"}, rowMessageIDs(stuck))

	gc, err := outbox.AdminOf(st).ListSentGcCandidates(ctx, db.Pool, 24*time.Hour, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"c"}, rowMessageIDs(gc))
	require.NotNil(t, gc[0].PublishedAt)

	_, err = outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{Status: "lost"})
	require.ErrorContains(t, err, "unknown status")
	_, err = outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{Limit: -1})
	require.ErrorContains(t, err, "negative")
	_, err = outbox.AdminOf(st).ListStuckOutbox(ctx, db.Pool, -time.Second, 0)
	require.ErrorContains(t, err, "negative")
	_, err = outbox.AdminOf(st).ListSentGcCandidates(ctx, db.Pool, -time.Second, 0)
	require.ErrorContains(t, err, "negative")
}

func rowMessageIDs(rows []outbox.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.Event.MessageID
	}
	return out
}

// TestListingsReadAPrefixOfEachPayload: ListOutbox and SearchOutbox with PayloadBytes read at
// most that many bytes of each payload (none with NoPayload) and give every payload's whole
// size; Lookup and the default listings read whole payloads; a negative size is refused.
func TestListingsReadAPrefixOfEachPayload(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	big := make([]byte, 1<<20) // incompressible, so it is stored out of line
	_, err = rand.Read(big)
	require.NoError(t, err)
	large := event("large", "orders", ptr("k1"), "")
	large.ContentType, large.Payload = "application/octet-stream", big
	res := enqueue(t, db.Pool, st, large, event("small", "orders", ptr("k1"), `{"a":1}`))

	check := func(rows []outbox.Row, wantLen ...int) {
		t.Helper()
		require.Len(t, rows, 2)
		byID := map[string]outbox.Row{rows[0].Event.MessageID: rows[0], rows[1].Event.MessageID: rows[1]}
		require.Equal(t, len(big), byID["large"].PayloadSize)
		require.Equal(t, 7, byID["small"].PayloadSize)
		require.Len(t, byID["large"].Event.Payload, wantLen[0])
		require.Equal(t, big[:wantLen[0]], []byte(byID["large"].Event.Payload))
		require.Len(t, byID["small"].Event.Payload, wantLen[1])
	}
	rows, err := outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{PayloadBytes: 16})
	require.NoError(t, err)
	check(rows, 16, 7)
	rows, err = outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{Status: "pending", NewestFirst: true, PayloadBytes: 16})
	require.NoError(t, err)
	check(rows, 16, 7)
	rows, err = outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{PayloadBytes: outbox.NoPayload})
	require.NoError(t, err)
	check(rows, 0, 0)
	rows, err = outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{})
	require.NoError(t, err)
	check(rows, len(big), 7)
	rows, err = outbox.AdminOf(st).SearchOutbox(ctx, db.Pool, outbox.SearchOptions{Term: "k1", PayloadBytes: 100})
	require.NoError(t, err)
	check(rows, 100, 7)
	rows, err = outbox.AdminOf(st).SearchOutbox(ctx, db.Pool, outbox.SearchOptions{Term: "k1"})
	require.NoError(t, err)
	check(rows, len(big), 7)
	row, err := outbox.AdminOf(st).Lookup(ctx, db.Pool, res[0].OutboxID)
	require.NoError(t, err)
	require.Equal(t, big, []byte(row.Event.Payload))
	require.Equal(t, len(big), row.PayloadSize)

	_, err = outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{PayloadBytes: -2})
	require.ErrorContains(t, err, "PayloadBytes -2 is negative")
	_, err = outbox.AdminOf(st).SearchOutbox(ctx, db.Pool, outbox.SearchOptions{Term: "k1", PayloadBytes: -2})
	require.ErrorContains(t, err, "PayloadBytes -2 is negative")
	_, err = outbox.AdminOf(st).SearchOutbox(ctx, db.Pool, outbox.SearchOptions{})
	require.ErrorContains(t, err, "search term is empty")
}

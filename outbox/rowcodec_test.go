package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// TestRowCodec: an event with every optional field set reads back equal through Lookup and
// ListOutbox, and its re-enqueue is compared with the stored row (Duplicate, then Conflict).
func TestRowCodec(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	e := event("full", "orders", ptr("k1"), `{"n":1}`)
	e.SchemaVersion = 3
	e.SchemaRef = &envelope.SchemaRef{Registry: ptr("reg"), Subject: ptr("orders-value"), Version: ptr(int64(4)),
		SchemaID: ptr(int64(17)), Fingerprint: ptr("sha256:ab")}
	sourceEvent, causation, correlation := envelope.NewUUIDv7(), envelope.NewUUIDv7(), envelope.NewUUIDv7()
	e.SourceEventID, e.CausationID, e.CorrelationID = &sourceEvent, &causation, &correlation
	e.SourceGlobalPosition = ptr(int64(42))
	e.TraceContext = &envelope.TraceContext{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: "k=v"}
	e.Attributes = []byte(`{"tenant": "t1"}`) // as jsonb prints it
	res := enqueue(t, db.Pool, st, e)

	row, err := outbox.AdminOf(st).Lookup(ctx, db.Pool, res[0].OutboxID)
	require.NoError(t, err)
	require.Equal(t, res[0].OutboxID, row.OutboxID)
	require.Equal(t, outbox.StatusPending, row.Status)
	require.Equal(t, e, row.Event)
	listed, err := outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{})
	require.NoError(t, err)
	require.Len(t, listed, 1)
	require.Equal(t, row, listed[0])

	again := enqueue(t, db.Pool, st, e)
	require.Equal(t, outbox.Duplicate, again[0].Outcome)
	require.Equal(t, res[0].OutboxID, again[0].OutboxID)
	changed := e
	changed.Payload = []byte(`{"n":2}`)
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := st.EnqueueTx(ctx, tx, changed)
		return err
	})
	require.ErrorIs(t, err, outbox.ErrIdentityConflict)
	require.ErrorContains(t, err, "payload")
}

// TestListNewestFirstAndCounts: ListOutbox lists several statuses newest first and pages with
// Before; CountDead counts what a filter requeue moves; Status gives each destination's oldest
// pending or failed row.
func TestListNewestFirstAndCounts(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	enqueue(t, db.Pool, st,
		event("a", "orders", nil, `{}`), event("b", "orders", nil, `{}`), event("c", "invoices", nil, `{}`),
		event("d", "orders", nil, `{}`), event("e", "invoices", nil, `{}`), event("f", "orders", nil, `{}`))
	set := func(status, extra string, ids ...string) {
		_, err := db.Pool.Exec(ctx, `UPDATE keiro_outbox SET status = $1`+extra+` WHERE message_id = ANY($2)`, status, ids)
		require.NoError(t, err)
	}
	set("dead", "", "a", "c")
	set("rejected", `, rejected_at = now(), rejection_code = 'message_too_large'`, "d")
	set("failed", `, attempt_count = 1, last_error = 'broker down'`, "e")
	set("sent", `, published_at = now()`, "f")
	_, err = db.Pool.Exec(ctx, `UPDATE keiro_outbox SET created_at = created_at - interval '1 hour' WHERE message_id = 'b'`)
	require.NoError(t, err)

	opts := outbox.ListOptions{Statuses: []outbox.Status{"dead", "rejected", "failed"}, NewestFirst: true, Limit: 2}
	page, err := outbox.AdminOf(st).ListOutbox(ctx, db.Pool, opts)
	require.NoError(t, err)
	require.Equal(t, []string{"e", "d"}, rowMessageIDs(page))
	require.Equal(t, "broker down", page[0].LastError)
	require.Equal(t, "message_too_large", page[1].RejectionCode)
	opts.Before = page[1].Seq
	page, err = outbox.AdminOf(st).ListOutbox(ctx, db.Pool, opts)
	require.NoError(t, err)
	require.Equal(t, []string{"c", "a"}, rowMessageIDs(page))
	dead, err := outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{Statuses: []outbox.Status{"dead"}, Destination: "orders"})
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, rowMessageIDs(dead))

	for filter, want := range map[[2]string]int64{{"", ""}: 3, {"", "orders"}: 2, {"ordering", "invoices"}: 1, {"billing", ""}: 0} {
		n, err := outbox.AdminOf(st).CountDead(ctx, db.Pool, filter[0], filter[1])
		require.NoError(t, err)
		require.Equal(t, want, n, "source %q, destination %q", filter[0], filter[1])
	}

	status, err := outbox.AdminOf(st).Overview(ctx, db.Pool)
	require.NoError(t, err)
	b, err := outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{Status: "pending"})
	require.NoError(t, err)
	e, err := outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{Status: "failed"})
	require.NoError(t, err)
	require.Equal(t, map[string]time.Time{"orders": b[0].CreatedAt, "invoices": e[0].CreatedAt}, status.OldestPendingCreatedAt)

	for _, bad := range []struct {
		opts outbox.ListOptions
		want string
	}{
		{outbox.ListOptions{Status: "dead", Statuses: []outbox.Status{"failed"}}, "at most one of Status and Statuses"},
		{outbox.ListOptions{Statuses: []outbox.Status{"dead", "lost"}}, `unknown status "lost"`},
		{outbox.ListOptions{NewestFirst: true, After: 3}, "continue a NewestFirst listing with Before"},
		{outbox.ListOptions{Before: 3}, "set NewestFirst"},
		{outbox.ListOptions{NewestFirst: true, Before: -1}, "positive"},
	} {
		_, err := outbox.AdminOf(st).ListOutbox(ctx, db.Pool, bad.opts)
		require.ErrorContains(t, err, bad.want)
	}
}

package handlers

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

func newStore(t *testing.T, db *testenv.DB, maxAttempts int) *inbox.Store {
	t.Helper()
	s, err := inbox.NewStore(inbox.StoreConfig{Schema: db.Schema, Consumer: "billing", MaxAttempts: maxAttempts})
	require.NoError(t, err)
	return s
}

func TestSQLEffectsExactlyOnceThroughInbox(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	effectsFixture(t, db)
	h, err := NewSQL(SQLConfig{Function: db.Schema + ".apply_event"})
	require.NoError(t, err)
	store := newStore(t, db, 3)
	ctx := context.Background()

	ev := testEvent()
	want := []inbox.Outcome{inbox.Processed, inbox.Duplicate, inbox.Duplicate}
	for i, o := range want {
		res, err := store.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, h.Handle)
		require.NoError(t, err)
		require.Equal(t, o, res.Outcome, "delivery %d", i)
	}

	// A transient failure rolls back and is retried; the retry's effects land once. Contention
	// (40001) uses no attempt; a missing foreign-key parent does.
	flaky := testEvent()
	flaky.MessageID = "msg-flaky"
	flaky.Payload = []byte(`{"mode":"transient"}`)
	res, err := store.Process(ctx, db.Pool, inbox.Delivery{Event: flaky}, h.Handle)
	require.NoError(t, err)
	require.Equal(t, inbox.Deferred, res.Outcome)
	require.True(t, inbox.IsContention(res.Err), "%v", res.Err)
	flaky.Payload = []byte(`{"mode":"missing-parent"}`)
	res, err = store.Process(ctx, db.Pool, inbox.Delivery{Event: flaky}, h.Handle)
	require.NoError(t, err)
	require.Equal(t, inbox.HandlerFailed, res.Outcome)
	require.Equal(t, 1, res.Attempts)
	flaky.Payload = []byte(`{"amount":5}`) // the function's data changed meanwhile: it succeeds
	res, err = store.Process(ctx, db.Pool, inbox.Delivery{Event: flaky}, h.Handle)
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome)

	// A permanent failure poisons at once; a redelivery does not run the function again.
	poison := testEvent()
	poison.MessageID = "msg-poison"
	poison.Payload = []byte(`{"mode":"poison"}`)
	res, err = store.Process(ctx, db.Pool, inbox.Delivery{Event: poison}, h.Handle)
	require.NoError(t, err)
	require.Equal(t, inbox.Poisoned, res.Outcome)
	require.Equal(t, 1, res.Attempts)
	res, err = store.Process(ctx, db.Pool, inbox.Delivery{Event: poison}, h.Handle)
	require.NoError(t, err)
	require.Equal(t, inbox.PreviouslyFailed, res.Outcome)

	var ids []string
	rows, err := db.Pool.Query(ctx, `SELECT message_id FROM `+db.Schema+`.effects ORDER BY message_id`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"msg-1", "msg-flaky"}, ids)
}

func TestHTTPThroughInboxCallsServiceOnce(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	var calls atomic.Int32
	srv, seen := newServer(t, func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	h := newHTTP(t, srv.URL)
	store := newStore(t, db, 3)
	ctx := context.Background()
	ev := testEvent()

	// 503: an outage of the target, no attempt used.
	want := []inbox.Outcome{inbox.Deferred, inbox.Processed, inbox.Duplicate}
	for i, o := range want {
		res, err := store.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, h.Handle)
		require.NoError(t, err)
		require.Equal(t, o, res.Outcome, "delivery %d: %v", i, res.Err)
	}
	require.EqualValues(t, 2, calls.Load(), "the duplicate does not reach the service")
	first, second := <-seen, <-seen
	require.Equal(t, first.header.Get(HeaderIdempotencyKey), second.header.Get(HeaderIdempotencyKey),
		"a retry carries the same Idempotency-Key")
}

func TestSQLBatchThroughInbox(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	effectsFixture(t, db)
	h, err := NewSQL(SQLConfig{Function: db.Schema + ".apply_event"})
	require.NoError(t, err)
	store := newStore(t, db, 3)
	ctx := context.Background()

	var ds []inbox.Delivery
	for i := range 5 {
		ev := testEvent()
		ev.MessageID = "b-" + string(rune('a'+i))
		ds = append(ds, inbox.Delivery{Event: ev})
	}
	poison := testEvent()
	poison.MessageID = "b-poison"
	poison.Payload = []byte(`{"mode":"poison"}`)
	batch := append([]inbox.Delivery{ds[0], ds[1]}, inbox.Delivery{Event: poison}, ds[2], ds[0])

	results, err := store.ProcessBatchWith(ctx, db.Pool, batch, h.HandleBatch)
	require.NoError(t, err)
	var outcomes []inbox.Outcome
	for _, r := range results {
		outcomes = append(outcomes, r.Outcome)
	}
	// The poison message fails the batch call; the inbox re-runs each delivery alone, so the
	// others still apply, the in-batch repeat is a duplicate, and the poison is poisoned.
	require.Equal(t, []inbox.Outcome{inbox.Processed, inbox.Processed, inbox.Poisoned, inbox.Processed, inbox.Duplicate}, outcomes)

	results, err = store.ProcessBatchWith(ctx, db.Pool, ds, h.HandleBatch)
	require.NoError(t, err)
	outcomes = outcomes[:0]
	for _, r := range results {
		outcomes = append(outcomes, r.Outcome)
	}
	require.Equal(t, []inbox.Outcome{inbox.Duplicate, inbox.Duplicate, inbox.Duplicate, inbox.Processed, inbox.Processed}, outcomes)

	var n, distinct int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM `+db.Schema+`.effects`).Scan(&n, &distinct))
	require.Equal(t, 5, n)
	require.Equal(t, 5, distinct)
}

func TestSQLHandleBatchClassifiesTheFailingCall(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	effectsFixture(t, db)
	h, err := NewSQL(SQLConfig{Function: db.Schema + ".apply_event"})
	require.NoError(t, err)
	ctx := context.Background()
	a, bad, c := testEvent(), testEvent(), testEvent()
	a.MessageID, bad.MessageID, c.MessageID = "a", "bad", "c"
	bad.Payload = []byte(`{"amount":"many"}`)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	err = h.HandleBatch(ctx, tx, []envelope.Event{a, bad, c})
	require.Error(t, err)
	require.True(t, inbox.IsPermanent(err), "%v", err)
	require.Contains(t, err.Error(), `"bad"`)

	c.Payload = []byte(`not json`)
	tx2, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx2.Rollback(ctx) }()
	err = h.HandleBatch(ctx, tx2, []envelope.Event{a, c})
	require.ErrorIs(t, err, ErrInvalidJSONPayload)
}

// TestSQLMissingFunctionIsAnOutage: a function that disappears while the consumer runs
// (SQLSTATE 42883, a deploy replacing it) is an outage, not poison: no attempt is used (with
// MaxAttempts 1 a recorded attempt would poison the message), and once the function is back
// the message is processed.
func TestSQLMissingFunctionIsAnOutage(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	h, err := NewSQL(SQLConfig{Function: db.Schema + ".apply_event"})
	require.NoError(t, err)
	store := newStore(t, db, 1)
	ctx := context.Background()
	ev := testEvent()
	res, err := store.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, h.Handle)
	require.NoError(t, err)
	require.Equal(t, inbox.Deferred, res.Outcome, "%v", res.Err)
	require.True(t, inbox.IsOutage(res.Err))
	require.Zero(t, res.Attempts)

	effectsFixture(t, db)
	res, err = store.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, h.Handle)
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome)
}

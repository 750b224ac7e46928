package handlers

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/internal/testdb"
)

func newStore(t *testing.T, db *testdb.DB, maxAttempts int) *inbox.Store {
	t.Helper()
	s, err := inbox.NewStore(inbox.StoreConfig{Schema: db.Schema, Consumer: "billing", MaxAttempts: maxAttempts})
	require.NoError(t, err)
	return s
}

func TestSQLEffectsExactlyOnceThroughInbox(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
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

	// A transient failure rolls back and is retried; the retry's effects land once.
	flaky := testEvent()
	flaky.MessageID = "msg-flaky"
	flaky.Payload = []byte(`{"mode":"transient"}`)
	res, err := store.Process(ctx, db.Pool, inbox.Delivery{Event: flaky}, h.Handle)
	require.NoError(t, err)
	require.Equal(t, inbox.HandlerFailed, res.Outcome)
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
	db := testdb.New(t)
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

	want := []inbox.Outcome{inbox.HandlerFailed, inbox.Processed, inbox.Duplicate}
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

package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

func TestNewStoreRejectsBadSchema(t *testing.T) {
	for _, s := range []string{"", "Bad", "a;drop table x", "1abc"} {
		_, err := outbox.NewStore(s)
		require.Error(t, err, "schema %q", s)
	}
}

func TestEnqueueInsertDuplicateConflict(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()

	e := event("m-1", "billing.orders.v1", ptr("order-1"), `{"a":1}`)
	e.Attributes = []byte(`{"x": 1, "y": [1,2]}`)
	res := enqueue(t, db.Pool, st, e)
	require.Len(t, res, 1)
	require.Equal(t, outbox.Inserted, res[0].Outcome)
	require.Equal(t, "m-1", res[0].MessageID)
	first := res[0].OutboxID

	// Same content (attributes with other whitespace): duplicate, same outbox id.
	dup := e
	dup.Attributes = []byte(`{"y":[1,2],"x":1}`)
	res = enqueue(t, db.Pool, st, dup)
	require.Equal(t, outbox.Duplicate, res[0].Outcome)
	require.Equal(t, first, res[0].OutboxID)

	// Different payload and key: conflict, error names the classes but not the values.
	bad := e
	bad.Payload = []byte(`{"a":2}`)
	bad.Key = ptr("order-2")
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	res, err = st.EnqueueTx(ctx, tx, bad)
	require.ErrorIs(t, err, outbox.ErrIdentityConflict)
	var ice *outbox.IdentityConflictError
	require.True(t, errors.As(err, &ice))
	require.Equal(t, []string{"routing", "payload"}, ice.Fields)
	require.Contains(t, err.Error(), `"m-1"`)
	require.NotContains(t, err.Error(), "order-2")
	require.NotContains(t, err.Error(), `"a":2`)
	require.Equal(t, outbox.Conflict, res[0].Outcome)
	require.NoError(t, tx.Rollback(ctx))

	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM keiro_outbox").Scan(&n))
	require.Equal(t, 1, n)
}

func TestEnqueueManyInOneRoundTrip(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	evs := keyedEvents("billing.orders.v1", 1000, 7)
	evs[3].Key = nil
	evs[4].SchemaRef = &envelope.SchemaRef{Subject: ptr("orders-value"), SchemaID: ptr(int64(42))}
	evs[5].CausationID = ptr(envelope.NewUUIDv7())

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	res, err := st.EnqueueTx(ctx, tx, evs...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Len(t, res, 1000)
	for i, r := range res {
		require.Equal(t, outbox.Inserted, r.Outcome)
		require.Equal(t, evs[i].MessageID, r.MessageID)
	}

	// seq follows the given order, and outbox ids are time-ordered.
	rows, err := db.Pool.Query(ctx, "SELECT message_id, message_key, schema_subject, schema_id, causation_id IS NOT NULL FROM keiro_outbox ORDER BY seq")
	require.NoError(t, err)
	i := 0
	for rows.Next() {
		var mid string
		var key, subj *string
		var sid *int64
		var hasCause bool
		require.NoError(t, rows.Scan(&mid, &key, &subj, &sid, &hasCause))
		require.Equal(t, evs[i].MessageID, mid)
		require.Equal(t, evs[i].Key == nil, key == nil)
		require.Equal(t, i == 4, subj != nil && *subj == "orders-value" && *sid == 42)
		require.Equal(t, i == 5, hasCause)
		i++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 1000, i)
}

func TestEnqueueValidationErrors(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	good := event("ok", "t1", nil, "{}")
	bad1 := event("", "t1", nil, "{}")
	bad2 := event("b2", "", nil, "{}")
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = st.EnqueueTx(ctx, tx, good, bad1, bad2)
	require.Error(t, err)
	require.Contains(t, err.Error(), "event 1")
	require.Contains(t, err.Error(), "MessageID")
	require.Contains(t, err.Error(), "event 2")
	require.Contains(t, err.Error(), "Destination")
	require.NoError(t, tx.Commit(ctx))
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM keiro_outbox").Scan(&n))
	require.Zero(t, n, "nothing may be written when one event is invalid")
}

func TestEnqueueCapturesTraceContext(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	tid, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	sid, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)

	own := event("own", "t1", nil, "{}")
	own.TraceContext = &envelope.TraceContext{Traceparent: "00-11111111111111111111111111111111-2222222222222222-01", Tracestate: "a=b"}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := st.EnqueueTx(ctx, tx, event("ambient", "t1", nil, "{}"), own)
		return err
	})
	require.NoError(t, err)
	got := map[string]string{}
	rows, err := db.Pool.Query(ctx, "SELECT message_id, traceparent || '|' || coalesce(tracestate, '') FROM keiro_outbox")
	require.NoError(t, err)
	for rows.Next() {
		var m, tp string
		require.NoError(t, rows.Scan(&m, &tp))
		got[m] = tp
	}
	require.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01|", got["ambient"])
	require.Equal(t, "00-11111111111111111111111111111111-2222222222222222-01|a=b", got["own"])
}

// listen LISTENs on st's channel and returns a function that reads the payloads of every
// notification received so far: it sends a marker notification and reads up to it, which
// bounds the wait without a sleep.
func listen(t *testing.T, ctx context.Context, db *testenv.DB, st *outbox.Store) func() []string {
	t.Helper()
	listener, err := pgx.Connect(ctx, db.ConnString)
	require.NoError(t, err)
	t.Cleanup(func() { listener.Close(context.Background()) })
	_, err = listener.Exec(ctx, `LISTEN "`+st.NotifyChannel()+`"`)
	require.NoError(t, err)
	return func() []string {
		_, err := db.Pool.Exec(ctx, `SELECT pg_notify($1, 'marker')`, st.NotifyChannel())
		require.NoError(t, err)
		var got []string
		for {
			n, err := listener.WaitForNotification(ctx)
			require.NoError(t, err)
			if n.Payload == "marker" {
				return got
			}
			got = append(got, n.Payload)
		}
	}
}

// sleepLockSQL takes the schema's sleep lock the way a relay about to sleep does (the key is a
// contract between EnqueueTx and relays, see docs/architecture.md).
const sleepLockSQL = `SELECT pg_try_advisory_lock(hashtext('keiro.outbox.sleep'), hashtext($1))`

// sleepLockFilteredSQL is the same for a relay restricted to some destinations.
const sleepLockFilteredSQL = `SELECT pg_try_advisory_lock(hashtext('keiro.outbox.sleep.filtered'), hashtext($1))`

// TestEnqueueNotifiesOnlyWhileARelaySleeps: a committed enqueue notifies only while a relay
// holds the sleep lock (once per transaction, never on rollback); a producer that did not
// notify holds the lock shared until its transaction ends, so a relay cannot fall asleep
// before that producer's row is committed and claimable.
func TestEnqueueNotifiesOnlyWhileARelaySleeps(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	notifications := listen(t, ctx, db, st)
	relay, err := pgx.Connect(ctx, db.ConnString)
	require.NoError(t, err)
	defer relay.Close(ctx)
	trySleep := func() bool {
		t.Helper()
		var ok bool
		require.NoError(t, relay.QueryRow(ctx, sleepLockSQL, db.Schema).Scan(&ok))
		return ok
	}
	wake := func() {
		t.Helper()
		_, err := relay.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
		require.NoError(t, err)
	}

	// No relay sleeps: no notification.
	enqueue(t, db.Pool, st, event("busy", "t1", nil, "{}"))
	require.Empty(t, notifications(), "a relay that is awake needs no notification")

	// A relay sleeps: rolled back, nothing; committed, one notification for the transaction.
	require.True(t, trySleep())
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = st.EnqueueTx(ctx, tx, event("rb", "t1", nil, "{}"))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = st.EnqueueTx(ctx, tx, event("c1", "t1", nil, "{}"))
	require.NoError(t, err)
	_, err = st.EnqueueTx(ctx, tx, event("c2", "t1", nil, "{}"))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, []string{""}, notifications())
	// A duplicate inserts nothing and wakes nobody.
	enqueue(t, db.Pool, st, event("c1", "t1", nil, "{}"))
	require.Empty(t, notifications())

	// The relay woke. A producer enqueues without notifying; until it ends its transaction the
	// relay cannot fall asleep, and afterwards it can (and will claim the row first).
	wake()
	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = st.EnqueueTx(ctx, tx, event("straddle", "t1", nil, "{}"))
	require.NoError(t, err)
	require.False(t, trySleep(), "a producer that did not notify is still in its transaction")
	require.NoError(t, tx.Commit(ctx))
	require.Empty(t, notifications())
	require.True(t, trySleep())

	// A relay restricted to some destinations sleeps: producers notify too.
	wake()
	var filtered bool
	require.NoError(t, relay.QueryRow(ctx, sleepLockFilteredSQL, db.Schema).Scan(&filtered))
	require.True(t, filtered)
	enqueue(t, db.Pool, st, event("for-a-filtered-relay", "t1", nil, "{}"))
	require.Equal(t, []string{""}, notifications())

	// Another schema's relay sleeping does not make this schema's producers notify.
	wake()
	var ok bool
	require.NoError(t, relay.QueryRow(ctx, sleepLockSQL, db.Schema+"_other").Scan(&ok))
	require.True(t, ok)
	enqueue(t, db.Pool, st, event("other", "t1", nil, "{}"))
	require.Empty(t, notifications())
}

// TestEnqueueWithoutNotify: with DisableNotify a committed enqueue sends nothing; Store.Notify,
// called after the commit, wakes the listeners once, and reports a failure.
func TestEnqueueWithoutNotify(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema, outbox.StoreOptions{DisableNotify: true})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	notifications := listen(t, ctx, db, st)
	sleeping, err := pgx.Connect(ctx, db.ConnString) // a relay asleep: producers would notify
	require.NoError(t, err)
	defer sleeping.Close(ctx)
	var ok bool
	require.NoError(t, sleeping.QueryRow(ctx, sleepLockSQL, db.Schema).Scan(&ok))
	require.True(t, ok)

	enqueue(t, db.Pool, st, event("quiet", "t1", nil, "{}"))
	require.NoError(t, st.Notify(ctx, db.Pool))
	require.Equal(t, []string{""}, notifications(), "only Store.Notify's notification, none from the enqueue")

	closed, err := pgx.Connect(ctx, db.ConnString)
	require.NoError(t, err)
	require.NoError(t, closed.Close(ctx))
	require.ErrorContains(t, st.Notify(ctx, closed), "notify outbox relays")
}

// TestEnqueueConcurrentSameKeyCommitOrder: transaction A enqueues key k and stays open; B
// enqueues k concurrently. B waits for A (seen in pg_stat_activity), so B's row commits after
// A's and has the larger seq. (The outbox's insert
// trigger takes the lock for every writer: sqlorder_test.go.)
func TestEnqueueConcurrentSameKeyCommitOrder(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	txA, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer txA.Rollback(ctx)
	_, err = st.EnqueueTx(ctx, txA, event("a", "t1", ptr("k"), "{}"))
	require.NoError(t, err)

	txB, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer txB.Rollback(ctx)
	var pidB int
	require.NoError(t, txB.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pidB))
	done := make(chan error, 1)
	go func() {
		_, err := st.EnqueueTx(ctx, txB, event("b", "t1", ptr("k"), "{}"), event("other", "t1", ptr("k2"), "{}"))
		done <- err
	}()
	// Wait until B is blocked on the advisory lock (observed state, not a sleep).
	for {
		var waiting bool
		require.NoError(t, db.Pool.QueryRow(ctx,
			"SELECT coalesce(bool_or(wait_event_type = 'Lock' AND wait_event = 'advisory'), false) FROM pg_stat_activity WHERE pid = $1", pidB).Scan(&waiting))
		if waiting {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("B enqueued while A held key k (err %v): same-key producers are not serialised", err)
		default:
		}
	}
	require.NoError(t, txA.Commit(ctx))
	require.NoError(t, <-done)
	require.NoError(t, txB.Commit(ctx))
	var seqA, seqB int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT (SELECT seq FROM keiro_outbox WHERE message_id='a'), (SELECT seq FROM keiro_outbox WHERE message_id='b')").Scan(&seqA, &seqB))
	require.Less(t, seqA, seqB)

}

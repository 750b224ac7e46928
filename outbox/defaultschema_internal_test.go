package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// These tests give the package-level outbox a fallback schema of their own in place of
// "keiro", which other processes may use on the test database.

// countRows counts the rows of schema's outbox.
func countRows(t *testing.T, q keiro.DB, schema string) int {
	t.Helper()
	var n int
	require.NoError(t, q.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+".keiro_outbox").Scan(&n))
	return n
}

func pathEvent(id string) envelope.Event {
	k := "k"
	return envelope.Event{MessageID: id, Source: "ordering", Destination: "orders", Key: &k, EventType: "E",
		ContentType: envelope.ContentTypeJSON, Payload: []byte(`{}`), OccurredAt: time.Now().UTC()}
}

func enqueueOn(ctx context.Context, o *searchPathOutbox, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, id string) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		_, err := o.enqueueTx(ctx, tx, nil, []envelope.Event{pathEvent(id)})
		return err
	})
}

// plainPool opens a pool with the server's default search_path (no outbox on it).
func plainPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testenv.DatabaseURL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func TestSearchPathOutboxFallsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := plainPool(t)
	fallback := testenv.NewSchema(t, pool)
	o := &searchPathOutbox{fallback: fallback}
	for _, id := range []string{"m1", "m2"} { // resolved, then remembered and checked
		require.NoError(t, enqueueOn(ctx, o, pool, id))
	}
	require.Equal(t, 2, countRows(t, pool, fallback))
}

// A search_path that resolves an outbox wins over the fallback, which receives nothing.
func TestSearchPathOutboxPrefersTheSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fallback := testenv.NewSchema(t, db.Pool)
	o := &searchPathOutbox{fallback: fallback}
	for _, id := range []string{"m1", "m2"} {
		require.NoError(t, enqueueOn(ctx, o, db.Pool, id))
	}
	require.Equal(t, 2, countRows(t, db.Pool, db.Schema))
	require.Equal(t, 0, countRows(t, db.Pool, fallback))
}

// With no outbox on the search_path nor in the fallback schema the call fails before writing,
// and leaves the transaction usable.
func TestSearchPathOutboxWithoutOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true})
	o := &searchPathOutbox{fallback: "no_such_schema"}
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = o.enqueueTx(ctx, tx, nil, []envelope.Event{pathEvent("m1")})
	require.ErrorIs(t, err, ErrNoOutbox)
	require.ErrorContains(t, err, `schema "no_such_schema" has none`)
	require.ErrorContains(t, err, "outbox.NewStore")
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the transaction is not aborted")
}

// A connection whose search_path moves to another outbox after its first enqueue gets
// ErrSearchPathChanged; once rolled back, neither outbox holds the call's row, and the retry
// writes to the outbox the search_path resolves now.
func TestSearchPathOutboxSearchPathChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	other := testenv.NewSchema(t, db.Pool)
	o := &searchPathOutbox{fallback: "no_such_schema"}
	conn, err := pgx.Connect(ctx, db.ConnString)
	require.NoError(t, err)
	defer conn.Close(ctx)

	require.NoError(t, enqueueOn(ctx, o, conn, "m1"))
	_, err = conn.Exec(ctx, "SET search_path = "+other)
	require.NoError(t, err)
	err = enqueueOn(ctx, o, conn, "m2")
	require.ErrorIs(t, err, ErrSearchPathChanged)
	require.ErrorContains(t, err, `now resolves schema "`+other+`"`)
	require.Equal(t, 1, countRows(t, conn, db.Schema))
	require.Equal(t, 0, countRows(t, conn, other))

	require.NoError(t, enqueueOn(ctx, o, conn, "m2"))
	require.Equal(t, 1, countRows(t, conn, db.Schema))
	require.Equal(t, 1, countRows(t, conn, other))
}

// An outbox dropped after a connection resolved it is reported as ErrNoOutbox, and the
// connection resolves again on its next enqueue.
func TestSearchPathOutboxDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fallback := testenv.NewSchema(t, db.Pool)
	o := &searchPathOutbox{fallback: fallback}
	conn, err := pgx.Connect(ctx, db.ConnString)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, enqueueOn(ctx, o, conn, "m1"))
	_, err = conn.Exec(ctx, "DROP TABLE keiro_outbox CASCADE")
	require.NoError(t, err)
	err = enqueueOn(ctx, o, conn, "m2")
	require.ErrorIs(t, err, ErrNoOutbox)
	require.NoError(t, enqueueOn(ctx, o, conn, "m2"))
	require.Equal(t, 1, countRows(t, conn, fallback))
}

func TestResolveSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	got, err := ResolveSchema(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, db.Schema, got)
	if _, err := (&searchPathOutbox{fallback: "no_such_schema"}).resolve(ctx, plainPool(t)); !errors.Is(err, ErrNoOutbox) {
		t.Fatalf("want ErrNoOutbox, got %v", err)
	}
}

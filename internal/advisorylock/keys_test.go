package advisorylock_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/advisorylock"
	"github.com/keiro-go/keiro/keirotest"
	"github.com/keiro-go/keiro/outbox"
)

// lock is one advisory lock as pg_locks shows it.
type lock struct {
	ClassID, ObjID uint32
	ObjSubID       int16 // 1: one bigint key, 2: two int4 keys
	Shared         bool
}

func (l lock) String() string {
	return fmt.Sprintf("{%d %d sub=%d shared=%t}", l.ClassID, l.ObjID, l.ObjSubID, l.Shared)
}

// held returns the advisory locks tx's session holds.
func held(t *testing.T, ctx context.Context, tx pgx.Tx) []lock {
	t.Helper()
	rows, err := tx.Query(ctx, `SELECT classid::int8, objid::int8, objsubid, mode = 'ShareLock'
        FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted`)
	require.NoError(t, err)
	var out []lock
	for rows.Next() {
		var c, o int64
		var l lock
		require.NoError(t, rows.Scan(&c, &o, &l.ObjSubID, &l.Shared))
		l.ClassID, l.ObjID = uint32(c), uint32(o)
		out = append(out, l)
	}
	require.NoError(t, rows.Err())
	return out
}

// bigintKey evaluates a one-bigint key expression as pg_locks shows it.
func bigintKey(t *testing.T, ctx context.Context, q keiro.DB, expr string, shared bool, args ...any) lock {
	t.Helper()
	var k int64
	require.NoError(t, q.QueryRow(ctx, "SELECT "+expr, args...).Scan(&k))
	return lock{ClassID: uint32(uint64(k) >> 32), ObjID: uint32(k), ObjSubID: 1, Shared: shared}
}

// pairKey evaluates a two-int4 key expression as pg_locks shows it.
func pairKey(t *testing.T, ctx context.Context, q keiro.DB, expr string, shared bool, args ...any) lock {
	t.Helper()
	var a, b int32
	require.NoError(t, q.QueryRow(ctx, "SELECT "+expr, args...).Scan(&a, &b))
	return lock{ClassID: uint32(a), ObjID: uint32(b), ObjSubID: 2, Shared: shared}
}

func requireHolds(t *testing.T, got []lock, want ...lock) {
	t.Helper()
	for _, w := range want {
		require.True(t, slices.Contains(got, w), "lock %v not among the held %v", w, got)
	}
}

// The migrations' SQL (the keiro_outbox_order trigger and the enqueue function) takes the keys
// named here: the per-key lock, the per-source lock of a declared source and, shared, both
// sleep locks.
func TestMigrationFunctionsTakeTheRegistryKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := keirotest.NewDB(t)
	schema := advisorylock.Literal(db.Schema)
	enqueue := fmt.Sprintf(`SELECT outcome FROM %s.enqueue(source => $1, message_id => $2,
        destination => 'orders', event_type => 'OrderPlaced', payload => '\x7b7d'::bytea,
        occurred_at => now(), message_key => $3)`, pgx.Identifier{db.Schema}.Sanitize())

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var outcome string
	require.NoError(t, tx.QueryRow(ctx, enqueue, "shop", "m-1", "order-7").Scan(&outcome))
	require.Equal(t, "inserted", outcome)
	requireHolds(t, held(t, ctx, tx),
		bigintKey(t, ctx, tx, advisorylock.OutboxKey(schema, "$1::text", "$2::text"), false, "shop", "order-7"),
		pairKey(t, ctx, tx, advisorylock.OutboxSleepAll(schema), true),
		pairKey(t, ctx, tx, advisorylock.OutboxSleepFiltered(schema), true))
	require.NoError(t, tx.Rollback(ctx))

	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.keiro_outbox_source (source) VALUES ('ledger')`,
		pgx.Identifier{db.Schema}.Sanitize()))
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(ctx, enqueue, "ledger", "m-2", nil).Scan(&outcome))
	requireHolds(t, held(t, ctx, tx), bigintKey(t, ctx, tx, advisorylock.OutboxSource(schema, "$1::text"), false, "ledger"))
}

// outbox.Store.EnqueueTx takes the same per-key lock and tries the same sleep locks.
func TestEnqueueTxTakesTheRegistryKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := keirotest.NewDB(t)
	schema := advisorylock.Literal(db.Schema)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	key := "order-7"
	ev := envelope.Event{Source: "shop", Destination: "orders", Key: &key, EventType: "OrderPlaced", MessageID: "m-1",
		ContentType: "application/json", Payload: []byte(`{}`), OccurredAt: time.Now().UTC()}
	_, err = st.EnqueueTx(ctx, tx, ev)
	require.NoError(t, err)
	requireHolds(t, held(t, ctx, tx),
		bigintKey(t, ctx, tx, advisorylock.OutboxKey(schema, "$1::text", "$2::text"), false, "shop", "order-7"),
		pairKey(t, ctx, tx, advisorylock.OutboxSleepAll(schema), true),
		pairKey(t, ctx, tx, advisorylock.OutboxSleepFiltered(schema), true))
}

// A relay's maintenance statements take the registry's maintenance key: while another session
// holds it, a pass does nothing.
func TestMaintenanceTakesTheRegistryKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := keirotest.NewDB(t)
	cl, err := kgo.NewClient(append(outbox.ProducerOpts(), kgo.SeedBrokers("127.0.0.1:1"))...)
	require.NoError(t, err)
	defer cl.Close()
	r, err := outbox.NewRelay(db.Pool, cl, outbox.RelayConfig{Schema: db.Schema})
	require.NoError(t, err)

	res, err := r.MaintenancePass(ctx)
	require.NoError(t, err)
	require.True(t, res.Ran, "no one holds the lock")

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, advisorylock.OutboxMaintenance(db.Schema))
	require.NoError(t, err)
	res, err = r.MaintenancePass(ctx)
	require.NoError(t, err)
	require.False(t, res.Ran, "the registry's key is the relay's maintenance lock")
}

// The expressions quote what they are given and nothing else.
func TestLiteral(t *testing.T) {
	require.Equal(t, `'keiro'`, advisorylock.Literal("keiro"))
	require.Equal(t, `'it''s'`, advisorylock.Literal("it's"))
	require.Equal(t, `hashtextextended('keiro.migrate.' || 'keiro', 0)`, advisorylock.Migrate(advisorylock.Literal("keiro")))
}

package testenv_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// The meter counts the WAL of its schema's relations and leaves out another schema's, written
// between the same positions.
func TestWALMeterCountsItsSchemaOnly(t *testing.T) {
	ctx := context.Background()
	db := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true})
	other := testenv.NewSchema(t, db.Pool)
	for _, s := range []string{db.Schema, other} {
		_, err := db.Pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{s, "t"}.Sanitize()+" (id int PRIMARY KEY, pad text)")
		require.NoError(t, err)
	}

	_, err := testenv.StartWAL(ctx, db.Pool, db.Schema)
	require.ErrorContains(t, err, "needs one session", "a pool's sessions would hold and drop the slot apart")

	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	m, err := testenv.StartWAL(ctx, conn, db.Schema)
	require.NoError(t, err)
	insert := func(schema string, rows int) {
		_, err := db.Pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "t"}.Sanitize()+
			" SELECT g, repeat('x', 500) FROM generate_series(1, $1::int) g", rows)
		require.NoError(t, err)
	}
	insert(db.Schema, 1000) // about 0.5 MB of heap tuples, each in the WAL
	insert(other, 10_000)   // ten times as much, not the meter's
	// A checkpoint may recycle the WAL the meter will read: its temporary slot holds the WAL
	// from before its start.
	var held bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots
		WHERE slot_name LIKE 'keiro_walmeter_%' AND temporary AND active_pid = $1
		  AND restart_lsn <= pg_current_wal_lsn())`, conn.Conn().PgConn().PID()).Scan(&held))
	require.True(t, held, "the meter's session holds the WAL with a temporary slot")
	f, err := m.Stop(ctx, conn)
	require.NoError(t, err)
	var slots int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'keiro_walmeter_%'").Scan(&slots))
	require.Zero(t, slots, "the meter's slot is gone once it stopped")

	require.True(t, f.Attributed, "the suite's PostgreSQL ships pg_walinspect")
	require.GreaterOrEqual(t, f.Schema, int64(1000*500), "every inserted tuple is counted")
	require.Less(t, f.Schema, int64(10_000*500), "the other schema's inserts are not")
	require.GreaterOrEqual(t, f.Cluster, f.Schema+int64(10_000*500), "the cluster's count holds both")
	require.InDelta(t, float64(f.Schema)/1000, f.PerMessage(1000), 0.001)
}

package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/migrations"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/logrelay"
)

// publishedTables lists the tables publication pub publishes.
func publishedTables(t *testing.T, pool *pgxpool.Pool, pub string) []string {
	t.Helper()
	var out []string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT coalesce(array_agg(schemaname || '.' || tablename), '{}')
		FROM pg_publication_tables WHERE pubname = $1`, pub).Scan(&out))
	return out
}

// A log-mode schema re-provisioned (the relay stopped, DROP SCHEMA … CASCADE, the slot
// dropped, the migrations applied again) leaves the old publication without its table. The
// next log-mode relay re-points it before its switch to log mode, and publishes every event
// written after. Before, it reused the empty publication: it published nothing, logged
// nothing, and confirmed its slot past the 1,000 new events.
func TestLogModeAfterReprovisionPublishesEverything(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{Partitions: 1}, func(t *testing.T, kc *testenv.Kafka) {
		db := testenv.NewDB(t)
		ctx := context.Background()
		topic := kc.Topic("orders")
		kc.CreateTopic(t, topic, 1)
		slot := outbox.DefaultLogSlot(db.Schema)
		dropLogSlot(t, db.Pool, slot)
		st, err := outbox.NewStore(db.Schema)
		require.NoError(t, err)
		cfg := outbox.RelayConfig{Mode: outbox.ModeLog, LogEngine: logrelay.Engine, PollInterval: 50 * time.Millisecond, Logger: testLogger(t)}
		_, stop, stopped := runRelay(t, db, kc.NewClient(t, outbox.ProducerOpts()...), cfg)
		testenv.WaitFor(t, time.Minute, "the log-mode relay switched the schema", func() bool {
			m, err := outbox.AdminOf(st).Mode(ctx, db.Pool)
			return err == nil && m == outbox.ModeLog
		})
		first := keyedEvents(topic, 5, 1)
		for i := range first {
			first[i].Key = ptr("first-life")
		}
		enqueue(t, db.Pool, st, first...)
		kc.ConsumeRecords(t, 5, time.Minute, topic)
		stop()
		require.NoError(t, <-stopped)

		// Re-provision: a new pool, as a redeployed service would have.
		_, err = db.Pool.Exec(ctx, "DROP SCHEMA "+db.Schema+" CASCADE")
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot)
		require.NoError(t, err)
		pool, err := pgxpool.New(ctx, db.ConnString)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "CREATE SCHEMA "+db.Schema)
		require.NoError(t, err)
		require.NoError(t, migrations.Migrate(ctx, conn.Conn(), db.Schema))
		conn.Release()
		require.Empty(t, publishedTables(t, pool, slot), "the old publication lost its table")

		db2 := &testenv.DB{Pool: pool, Schema: db.Schema, ConnString: db.ConnString}
		st2, err := outbox.NewStore(db.Schema)
		require.NoError(t, err)
		runRelay(t, db2, kc.NewClient(t, outbox.ProducerOpts()...), cfg)
		testenv.WaitFor(t, time.Minute, "the new log-mode relay switched the schema", func() bool {
			m, err := outbox.AdminOf(st2).Mode(ctx, pool)
			return err == nil && m == outbox.ModeLog
		})
		require.Equal(t, []string{db.Schema + ".keiro_outbox_log"}, publishedTables(t, pool, slot), "the publication is re-pointed")
		const n = 1000
		evs := keyedEvents(topic, n, 10)
		for i := range evs {
			evs[i].MessageID = "again-" + evs[i].MessageID
		}
		enqueue(t, pool, st2, evs...)
		distinct, dups := checkOrder(t, kc.ConsumeRecords(t, n+5, 2*time.Minute, topic))
		require.Equal(t, n+5, distinct, "every event of both lives of the schema")
		require.Zero(t, dups)
	})
}

// The relay refuses, with one line naming what is wrong and what to do, a publication of its
// slot's name that is not its own to change: one that publishes another table too, or every
// table. It re-points its own publication that publishes no table before the switch to log
// mode, but once the schema is in log mode it refuses it (the events written since were not
// decoded) until `relay mode prepare` repairs it.
func TestLogModeVerifiesItsReplicationObjects(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	ctx := context.Background()
	slot := outbox.DefaultLogSlot(db.Schema)
	dropLogSlot(t, db.Pool, slot)
	exec := func(sql string) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	startErr := func() error {
		t.Helper()
		r, err := outbox.NewRelay(db.Pool, kc.NewClient(t, outbox.ProducerOpts()...), outbox.RelayConfig{
			Schema: db.Schema, Mode: outbox.ModeLog, LogEngine: logrelay.Engine, Logger: testLogger(t)})
		require.NoError(t, err)
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return r.Run(rctx)
	}

	exec("CREATE TABLE other (x int)")
	exec("CREATE PUBLICATION " + slot + " FOR TABLE keiro_outbox_log, other WITH (publish = 'insert')")
	err := startErr()
	require.ErrorContains(t, err, "publishes other tables")
	require.ErrorContains(t, err, "other")
	require.ErrorContains(t, err, "--log-slot")
	m, err := outbox.AdminOf(st).Mode(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, outbox.ModeClaim, m, "nothing switched")

	// FOR ALL TABLES is refused by the same rule (logslot's TestCheckPublication): it is not
	// created here, since a database-wide publication of updates makes every other test's
	// UPDATE of a table without a replica identity fail.

	// Its own, without a table (and publishing every operation): re-pointed before the switch.
	exec("DROP PUBLICATION " + slot)
	exec("CREATE PUBLICATION " + slot)
	_, err = outbox.AdminOf(st).SetMode(ctx, db.Pool, outbox.ModeLog, "")
	require.NoError(t, err)
	require.Equal(t, []string{db.Schema + ".keiro_outbox_log"}, publishedTables(t, db.Pool, slot))
	var insertOnly bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pubinsert AND NOT (pubupdate OR pubdelete OR pubtruncate)
		FROM pg_publication WHERE pubname = $1`, slot).Scan(&insertOnly))
	require.True(t, insertOnly)

	// In log mode, a publication that lost its table is refused at start, then repaired by
	// PrepareLog (relay mode prepare), which says so.
	exec("ALTER PUBLICATION " + slot + " DROP TABLE keiro_outbox_log")
	err = startErr()
	require.ErrorContains(t, err, "publishes no table")
	require.ErrorContains(t, err, "relay mode prepare --log-slot="+slot)
	require.ErrorContains(t, err, "relay mode recover --since=")
	p, err := outbox.AdminOf(st).PrepareLog(ctx, db.Pool, "", nil)
	require.NoError(t, err)
	require.True(t, p.PublicationRepaired)
	require.Equal(t, []string{db.Schema + ".keiro_outbox_log"}, publishedTables(t, db.Pool, slot))

}

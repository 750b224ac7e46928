package outbox_test

import (
	"context"
	"hash/fnv"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// seedStatuses enqueues rows and forces a spread of statuses through SQL.
func seedStatuses(t *testing.T, db *testenv.DB, st *outbox.Store) {
	t.Helper()
	evs := []envelope.Event{
		event("p1", "t1", ptr("a"), "{}"), event("p2", "t2", nil, "{}"),
		event("d1", "t1", ptr("b"), "{}"), event("d2", "t2", ptr("c"), "{}"),
		event("r1", "t1", ptr("d"), "{}"), event("s1", "t1", nil, "{}"),
	}
	evs[3].Source = "billing"
	enqueue(t, db.Pool, st, evs...)
	_, err := db.Pool.Exec(context.Background(), `
UPDATE keiro_outbox SET status = 'dead', attempt_count = 10, last_error = 'broker unreachable' WHERE message_id IN ('d1', 'd2');
UPDATE keiro_outbox SET status = 'rejected', attempt_count = 1, last_error = 'too big', rejection_code = 'message_too_large', rejected_at = now() WHERE message_id = 'r1';
UPDATE keiro_outbox SET status = 'sent', published_at = now() WHERE message_id = 's1';
UPDATE keiro_outbox SET created_at = now() - interval '1 hour' WHERE message_id = 'p1';`)
	require.NoError(t, err)
}

func TestStatusListDeadRequeueLookup(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	seedStatuses(t, db, st)
	ctx := context.Background()

	s, err := outbox.AdminOf(st).Overview(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, int64(2), s.Backlog)
	require.Equal(t, int64(3), s.Dead)
	require.GreaterOrEqual(t, s.OldestPendingAge, 59*time.Minute)
	require.Contains(t, s.Counts, outbox.StatusCount{Status: "dead", Destination: "t1", Count: 1})
	require.Contains(t, s.Counts, outbox.StatusCount{Status: "sent", Destination: "t1", Count: 1})

	all, err := outbox.AdminOf(st).ListDead(ctx, db.Pool, outbox.ListDeadOptions{})
	require.NoError(t, err)
	require.Equal(t, []string{"d1", "d2", "r1"}, messageIDs(all))
	require.Equal(t, "broker unreachable", all[0].LastError)
	require.Equal(t, "message_too_large", all[2].RejectionCode)
	page, err := outbox.AdminOf(st).ListDead(ctx, db.Pool, outbox.ListDeadOptions{Limit: 1, After: all[0].Seq})
	require.NoError(t, err)
	require.Equal(t, []string{"d2"}, messageIDs(page))
	bySource, err := outbox.AdminOf(st).ListDead(ctx, db.Pool, outbox.ListDeadOptions{Source: "billing"})
	require.NoError(t, err)
	require.Equal(t, []string{"d2"}, messageIDs(bySource))
	byDest, err := outbox.AdminOf(st).ListDead(ctx, db.Pool, outbox.ListDeadOptions{Destination: "t1"})
	require.NoError(t, err)
	require.Equal(t, []string{"d1", "r1"}, messageIDs(byDest))

	_, err = outbox.AdminOf(st).Requeue(ctx, db.Pool, outbox.RequeueFilter{})
	require.Error(t, err)
	n, err := outbox.AdminOf(st).Requeue(ctx, db.Pool, outbox.RequeueFilter{IDs: []envelope.UUID{all[0].OutboxID, all[2].OutboxID}})
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	row, err := outbox.AdminOf(st).Lookup(ctx, db.Pool, all[2].OutboxID)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, row.Status)
	require.Zero(t, row.Attempts)
	require.Empty(t, row.RejectionCode)
	require.Equal(t, "r1", row.Event.MessageID)
	n, err = outbox.AdminOf(st).Requeue(ctx, db.Pool, outbox.RequeueFilter{Source: "billing", Destination: "t1"})
	require.NoError(t, err)
	require.Zero(t, n, "source and destination combine")
	n, err = outbox.AdminOf(st).Requeue(ctx, db.Pool, outbox.RequeueFilter{Destination: "t2"})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	n, err = outbox.AdminOf(st).Requeue(ctx, db.Pool, outbox.RequeueFilter{All: true})
	require.NoError(t, err)
	require.Zero(t, n, "only dead and rejected rows are requeued")

	_, err = outbox.AdminOf(st).Lookup(ctx, db.Pool, envelope.NewUUIDv7())
	require.ErrorIs(t, err, outbox.ErrNotFound)
}

func messageIDs(rows []outbox.DeadRow) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.MessageID
	}
	return out
}

// TestRetentionDeletesInSmallBatches: 2,500 old sent rows are deleted by one maintenance pass in
// statements of RetentionBatch rows; recent sent, pending and dead rows stay.
func TestRetentionDeletesInSmallBatches(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	kc := newKafka(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	enqueue(t, db.Pool, st, keyedEvents("t1", 2600, 10)...)
	seedStatuses(t, db, st)
	_, err = db.Pool.Exec(ctx, `
UPDATE keiro_outbox SET status = 'sent', published_at = now() - interval '2 days' WHERE message_id LIKE 'm-%' AND seq % 26 <> 0;
UPDATE keiro_outbox SET status = 'sent', published_at = now() WHERE message_id LIKE 'm-%' AND seq % 26 = 0;`)
	require.NoError(t, err)
	var old int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM keiro_outbox WHERE status = 'sent' AND published_at < now() - interval '1 day'").Scan(&old))

	// Count DELETE statements through pg_stat_statements-free means: a statement-level trigger.
	_, err = db.Pool.Exec(ctx, `
CREATE TABLE delete_log (n bigint);
CREATE FUNCTION log_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO delete_log SELECT count(*) FROM old_rows; RETURN NULL; END $$;
CREATE TRIGGER log_delete AFTER DELETE ON keiro_outbox REFERENCING OLD TABLE AS old_rows
FOR EACH STATEMENT EXECUTE FUNCTION log_delete();`)
	require.NoError(t, err)

	client := kc.NewClient(t, outbox.ProducerOpts()...)
	r, err := outbox.NewRelay(db.Pool, client, outbox.RelayConfig{Schema: db.Schema, RetentionBatch: 1000, Retention: 24 * time.Hour})
	require.NoError(t, err)
	res, err := r.MaintenancePass(ctx)
	require.NoError(t, err)
	require.True(t, res.Ran)
	require.Equal(t, old, res.Deleted)
	require.Equal(t, int64(2), res.Backlog)
	require.Equal(t, int64(3), res.Dead)
	require.GreaterOrEqual(t, res.OldestPendingAge, 59*time.Minute)
	var stmts []int64
	rows, err := db.Pool.Query(ctx, "SELECT n FROM delete_log")
	require.NoError(t, err)
	for rows.Next() {
		var n int64
		require.NoError(t, rows.Scan(&n))
		stmts = append(stmts, n)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int64{1000, 1000, old - 2000}, stmts)
	var left int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM keiro_outbox").Scan(&left))
	require.Equal(t, int64(2606)-old, left)

	// While another session holds the maintenance lock, a pass does nothing.
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	h := fnv.New64a()
	h.Write([]byte("keiro.outbox.maintenance." + db.Schema))
	key := int64(h.Sum64())
	_, err = conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key)
	require.NoError(t, err)
	res, err = r.MaintenancePass(ctx)
	require.NoError(t, err)
	require.False(t, res.Ran)
	_, err = conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", key)
	require.NoError(t, err)
	res, err = r.MaintenancePass(ctx)
	require.NoError(t, err)
	require.True(t, res.Ran)
}

func TestRelayConfigValidationNamesEveryField(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	kc := newKafka(t)
	client := kc.NewClient(t, outbox.ProducerOpts()...)
	_, err := outbox.NewRelay(db.Pool, client, outbox.RelayConfig{
		Schema: "Bad-Schema", Policy: outbox.Policy(9), BatchSize: -1, MaxInFlightBatches: -2, ClaimConcurrency: -4, MaxAttempts: -3,
		Backoff: keiro.Backoff{Initial: -time.Second, Max: -2 * time.Second, Multiplier: 0.5},
		Lease:   time.Millisecond, PollInterval: -1, ShutdownTimeout: -1, RetentionBatch: -1,
		MaintenanceInterval: -1, MaxRecordBytes: -1, Destinations: []string{""},
	})
	require.Error(t, err)
	for _, field := range []string{"Schema", "Policy", "BatchSize", "MaxInFlightBatches", "ClaimConcurrency", "MaxAttempts",
		"Backoff.Initial", "Backoff.Max", "Backoff.Multiplier", "Lease", "PollInterval", "ShutdownTimeout",
		"RetentionBatch", "MaintenanceInterval", "MaxRecordBytes", "Destinations[0]"} {
		require.Contains(t, err.Error(), field)
	}
	// The zero config is valid.
	_, err = outbox.NewRelay(db.Pool, client, outbox.RelayConfig{Schema: db.Schema})
	require.NoError(t, err)
}

func TestNewRelayRejectsUnsafeClients(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	kc := newKafka(t)
	for name, opts := range map[string][]kgo.Opt{
		"RequiredAcks":           append(outbox.ProducerOpts(), kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite()),
		"idempotent":             append(outbox.ProducerOpts(), kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite()),
		"ManualFlushing":         nil,
		"MaxBufferedRecords (1)": append(outbox.ProducerOpts(), kgo.MaxBufferedRecords(1)),
		"MaxBufferedBytes":       append(outbox.ProducerOpts(), kgo.MaxBufferedBytes(2000)),
	} {
		_, err := outbox.NewRelay(db.Pool, kc.NewClient(t, opts...), outbox.RelayConfig{Schema: db.Schema})
		require.Error(t, err, name)
		require.Contains(t, err.Error(), strings.Fields(name)[0], name)
	}
	_, err := outbox.NewRelay(nil, nil, outbox.RelayConfig{})
	require.ErrorContains(t, err, "pool is nil")
	require.ErrorContains(t, err, "client is nil")
}

func TestParsePolicy(t *testing.T) {
	for _, p := range []outbox.Policy{outbox.PerKeyHeadOfLine, outbox.PerSourceStream, outbox.StopTheLine, outbox.BestEffort} {
		got, err := outbox.ParsePolicy(p.String())
		require.NoError(t, err)
		require.Equal(t, p, got)
	}
	_, err := outbox.ParsePolicy("fifo")
	require.ErrorContains(t, err, "per-key")
}

// TestArchive: archived dead and rejected rows leave the dead list, the count and a filter's
// requeue, stay listed with Archived and found by search, and come back when a requeue names
// them.
func TestArchive(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	seedStatuses(t, db, st)
	ctx := context.Background()
	dead, err := outbox.AdminOf(st).ListDead(ctx, db.Pool, outbox.ListDeadOptions{})
	require.NoError(t, err)
	d1, r1 := dead[0].OutboxID, dead[2].OutboxID
	pending, err := outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{Status: "pending"})
	require.NoError(t, err)

	var archived []envelope.UUID
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		archived, err = outbox.AdminOf(st).ArchiveTx(ctx, tx, []envelope.UUID{d1, r1, pending[0].OutboxID, envelope.NewUUIDv7()})
		return err
	}))
	require.Equal(t, []envelope.UUID{d1, r1}, archived, "only dead and rejected rows are archived")
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		again, err := outbox.AdminOf(st).ArchiveTx(ctx, tx, []envelope.UUID{d1})
		require.Empty(t, again, "archived already")
		return err
	}))

	left, err := outbox.AdminOf(st).ListDead(ctx, db.Pool, outbox.ListDeadOptions{})
	require.NoError(t, err)
	require.Equal(t, []string{"d2"}, messageIDs(left))
	n, err := outbox.AdminOf(st).CountDead(ctx, db.Pool, "", "")
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	working, err := outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{Statuses: []outbox.Status{"dead", "rejected"}})
	require.NoError(t, err)
	require.Len(t, working, 1)
	shelf, err := outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{Statuses: []outbox.Status{"dead", "rejected"}, Archived: true, NewestFirst: true})
	require.NoError(t, err)
	require.Len(t, shelf, 2)
	found, err := outbox.AdminOf(st).SearchOutbox(ctx, db.Pool, outbox.SearchOptions{Term: "r1"})
	require.NoError(t, err)
	require.Len(t, found, 1, "an archived row stays searchable")
	relay, err := outbox.NewRelay(db.Pool, newKafka(t).NewClient(t, outbox.ProducerOpts()...), outbox.RelayConfig{Schema: db.Schema, Retention: -1})
	require.NoError(t, err)
	res, err := relay.MaintenancePass(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Dead, "the dead gauge (and its alert) leaves archived rows aside")

	n, err = outbox.AdminOf(st).Requeue(ctx, db.Pool, outbox.RequeueFilter{All: true})
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "all leaves archived rows alone")
	n, err = outbox.AdminOf(st).Requeue(ctx, db.Pool, outbox.RequeueFilter{IDs: []envelope.UUID{r1}})
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "a named archived row is requeued")
	shelf, err = outbox.AdminOf(st).ListOutbox(ctx, db.Pool, outbox.ListOptions{Archived: true})
	require.NoError(t, err)
	require.Len(t, shelf, 1, "and is no longer archived")
	require.Equal(t, d1, shelf[0].OutboxID)
}

// migrateUpTo applies the migrations of ../migrations/sql up to version to a fresh schema, as an
// older release left it.
func migrateUpTo(t *testing.T, version int32) *testenv.DB {
	t.Helper()
	db := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true})
	ctx := context.Background()
	c, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	_, err = c.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+db.Schema)
	require.NoError(t, err)
	m, err := migrate.NewMigratorEx(ctx, c.Conn(), db.Schema+".keiro_schema_version", &migrate.MigratorOptions{})
	require.NoError(t, err)
	m.Data["schema"] = db.Schema
	require.NoError(t, m.LoadMigrations(os.DirFS("../migrations/sql")))
	require.NoError(t, m.MigrateTo(ctx, version))
	return db
}

// Archived rows (an operator set them aside) are counted apart: neither in Counts nor in Dead,
// which tell what waits for an operator.
func TestStatusCountsArchivedRowsApart(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	seedStatuses(t, db, st)
	ctx := context.Background()
	dead, err := outbox.AdminOf(st).ListDead(ctx, db.Pool, outbox.ListDeadOptions{Destination: "t1"})
	require.NoError(t, err)
	require.Equal(t, []string{"d1", "r1"}, messageIDs(dead))
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		got, err := outbox.AdminOf(st).ArchiveTx(ctx, tx, []envelope.UUID{dead[0].OutboxID, dead[1].OutboxID})
		require.Len(t, got, 2)
		return err
	}))

	s, err := outbox.AdminOf(st).Overview(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, int64(1), s.Dead, "d2 only: d1 and r1 are archived")
	require.Equal(t, int64(2), s.Archived)
	require.Equal(t, int64(2), s.Backlog)
	require.ElementsMatch(t, []outbox.StatusCount{
		{Status: "pending", Destination: "t1", Count: 1}, {Status: "pending", Destination: "t2", Count: 1},
		{Status: "dead", Destination: "t2", Count: 1}, {Status: "sent", Destination: "t1", Count: 1},
	}, s.Counts)
}

// A schema migrated up to 010 has no archive column: Status still counts its rows, none archived.
func TestStatusOnASchemaBeforeTheArchive(t *testing.T) {
	t.Parallel()
	db := migrateUpTo(t, 10)
	var archive bool
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM information_schema.columns
	    WHERE table_schema = $1 AND table_name = 'keiro_outbox' AND column_name = 'archived_at')`, db.Schema).Scan(&archive))
	require.False(t, archive, "migration 011 is not applied")
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	seedStatuses(t, db, st)

	s, err := outbox.AdminOf(st).Overview(context.Background(), db.Pool)
	require.NoError(t, err)
	require.Equal(t, int64(3), s.Dead)
	require.Zero(t, s.Archived)
	require.Equal(t, int64(2), s.Backlog)
	require.GreaterOrEqual(t, s.OldestPendingAge, 59*time.Minute)
	require.Contains(t, s.Counts, outbox.StatusCount{Status: "rejected", Destination: "t1", Count: 1})
}

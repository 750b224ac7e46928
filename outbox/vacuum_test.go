package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// manualVacuums is the number of VACUUMs run on the schema's outbox table other than by
// autovacuum.
func manualVacuums(t *testing.T, db *testenv.DB) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT vacuum_count FROM pg_stat_all_tables WHERE schemaname = $1 AND relname = 'keiro_outbox'`, db.Schema).Scan(&n))
	return n
}

// publishRounds enqueues rounds of rows and waits for each to be published until done says
// the relay has done what the test waits for.
func publishRounds(t *testing.T, db *testenv.DB, st *outbox.Store, p *testenv.Progress, what string, done func() bool) {
	t.Helper()
	round := 0
	testenv.WaitFor(t, 2*time.Minute, what, func() bool {
		evs := keyedEvents("orders", 100, 10)
		for i := range evs {
			evs[i].MessageID = fmt.Sprintf("r%d-%s", round, evs[i].MessageID)
		}
		enqueue(t, db.Pool, st, evs...)
		round++
		p.Wait(t, int64(100*round), time.Minute, nil)
		return done()
	})
}

// A relay vacuums its outbox table itself once it holds VacuumThreshold dead row versions,
// without waiting for autovacuum: a published row's dead index entries are in front of its
// key's head until a vacuum removes them, and a deep backlog's claims step over them.
func TestRelayVacuumsTheOutboxPastTheThreshold(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 2)
	_, err := db.Pool.Exec(context.Background(), `ALTER TABLE keiro_outbox SET (autovacuum_enabled = false)`)
	require.NoError(t, err)
	before := manualVacuums(t, db)
	p := new(testenv.Progress)
	// Batches of 10 rows: each round of 100 keeps the claims full, so the relay is backlogged.
	r, _ := startRelay(t, db, kc, outbox.RelayConfig{OnBatch: onSettled(p), BatchSize: 10, VacuumThreshold: 300, Logger: testLogger(t)})
	publishRounds(t, db, st, p, "the relay's own vacuum of the outbox", func() bool { return r.Stats().Vacuums > 0 })
	require.Greater(t, manualVacuums(t, db), before, "the table was vacuumed")
}

// A relay whose role does not own the outbox table cannot vacuum it: it says so once, keeps
// publishing, and leaves the table to autovacuum.
func TestRelayWithoutOwnershipLeavesVacuumToAutovacuum(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 2)
	ctx := context.Background()
	role := "keiro_relay_" + db.Schema
	for _, q := range []string{
		`CREATE ROLE ` + role + ` NOLOGIN`,
		`GRANT USAGE ON SCHEMA ` + db.Schema + ` TO ` + role,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ` + db.Schema + ` TO ` + role,
		`GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA ` + db.Schema + ` TO ` + role,
	} {
		_, err := db.Pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+role)
	})
	cfg, err := pgxpool.ParseConfig(db.ConnString)
	require.NoError(t, err)
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SET ROLE `+role)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	var logs testenv.LogBuffer
	p := new(testenv.Progress)
	r, err := outbox.NewRelay(pool, kc.NewClient(t, outbox.ProducerOpts()...), outbox.RelayConfig{Schema: db.Schema,
		OnBatch: onSettled(p), BatchSize: 10, VacuumThreshold: 1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	const says = "does not own the outbox table"
	publishRounds(t, db, st, p, "the relay saying it leaves vacuuming to autovacuum", func() bool {
		return strings.Contains(logs.String(), says)
	})
	require.Equal(t, 1, strings.Count(logs.String(), says), "said once")
	require.Zero(t, r.Stats().Vacuums)
	require.NotContains(t, logs.String(), "vacuum failed")
}

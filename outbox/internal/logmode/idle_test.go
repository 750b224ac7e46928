package logmode_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/logmode"
)

// An idle slot follows the WAL the cluster's other databases write, with no heartbeat: the
// server sends a keepalive whenever the WAL it has read is past the reader's reported
// position, and the empty window confirms the keepalive's WAL end. So the WAL an idle slot
// retains stays bounded by about one status interval of the cluster's writes.
func TestIdleSlotFollowsOtherDatabasesWAL(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.KafkaConfig{Topics: []string{"orders"}})
	ctx := context.Background()
	scratch := fmt.Sprintf("keiro_idle_%08x", rand.Uint32())
	_, err := f.db.Pool.Exec(ctx, "CREATE DATABASE "+scratch)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = f.db.Pool.Exec(context.Background(), "DROP DATABASE IF EXISTS "+scratch+" WITH (FORCE)")
	})
	other, err := pgx.Connect(ctx, replaceDB(t, f.db.ConnString, scratch))
	require.NoError(t, err)
	defer func() { _ = other.Close(ctx) }()

	e := f.newEngine(t, f.cfg, logmode.Hooks{})
	run(t, e)
	_, err = other.Exec(ctx, `CREATE TABLE churn (n int, pad text)`)
	require.NoError(t, err)
	for range 20 {
		_, err = other.Exec(ctx, `INSERT INTO churn SELECT g, repeat('x', 200) FROM generate_series(1, 500) g`)
		require.NoError(t, err)
	}
	after := walLSN(t, f)
	testenv.WaitFor(t, time.Minute, "the slot confirms past the other database's writes", func() bool {
		return slotConfirmedLSN(t, f) >= after
	})
	require.Zero(t, e.Stats().Published, "no event was written")
}

// replaceDB returns the connection string cs with its database replaced by db.
func replaceDB(t *testing.T, cs, db string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(cs)
	require.NoError(t, err)
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s", cfg.Host, cfg.Port, cfg.User, db)
}

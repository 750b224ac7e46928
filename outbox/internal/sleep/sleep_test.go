package sleep

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/internal/advisorylock"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/sqlq"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// newSleeper returns a sleeper on db's schema, closed when t ends.
func newSleeper(t *testing.T, db *testenv.DB, filtered bool, onLost func()) *Sleeper {
	t.Helper()
	s := New(db.Pool.Config().ConnConfig, sqlq.New(db.Schema), filtered, onLost)
	t.Cleanup(s.Close)
	return s
}

// A try takes a free lock; another relay's try then finds it held by a relay, until the
// holder releases it. The filtered relays' lock is independent of the others'.
func TestTryTakesTheLockAndNamesItsHolder(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	a, b := newSleeper(t, db, false, nil), newSleeper(t, db, false, nil)
	got, err := a.Try(ctx)
	require.NoError(t, err)
	require.Equal(t, Taken, got)
	require.True(t, a.Held())
	got, err = b.Try(ctx)
	require.NoError(t, err)
	require.Equal(t, Relay, got)
	require.False(t, b.Held())

	f := newSleeper(t, db, true, nil)
	require.True(t, f.Filtered())
	got, err = f.Try(ctx)
	require.NoError(t, err)
	require.Equal(t, Taken, got, "the filtered relays' lock is independent")

	require.NoError(t, a.Release(ctx))
	require.False(t, a.Held())
	got, err = b.Try(ctx)
	require.NoError(t, err)
	require.Equal(t, Taken, got)
}

// While a producer that did not notify holds the lock shared, a try answers Producers and
// leaves the lock to it; the tries space out until the lock is taken or released.
func TestTryWaitsForProducers(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	s := newSleeper(t, db, false, nil)
	require.Equal(t, time.Millisecond, s.RetryIn(time.Hour))
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SELECT pg_advisory_xact_lock_shared("+
		advisorylock.OutboxSleepAll(advisorylock.Literal(db.Schema))+")")
	require.NoError(t, err)
	for i := range 2 {
		got, err := s.Try(ctx)
		require.NoError(t, err)
		require.Equal(t, Producers, got)
		require.Equal(t, time.Millisecond<<(i+1), s.RetryIn(time.Hour), "try %d", i)
	}
	require.Equal(t, time.Millisecond, s.RetryIn(time.Millisecond), "never more than the poll interval")
	require.NoError(t, tx.Commit(ctx))
	got, err := s.Try(ctx)
	require.NoError(t, err)
	require.Equal(t, Taken, got)
	require.Equal(t, time.Millisecond, s.RetryIn(time.Hour), "taking the lock starts the retries over")
}

// When the session holding the lock ends, the sleeper calls onLost, and a later try opens a
// new session and takes the lock again.
func TestLostSessionIsReported(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	lost := make(chan struct{})
	s := newSleeper(t, db, false, func() { close(lost) })
	got, err := s.Try(ctx)
	require.NoError(t, err)
	require.Equal(t, Taken, got)
	var pid uint32
	require.NoError(t, db.Pool.QueryRow(ctx, `
SELECT pid FROM pg_catalog.pg_locks
WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND mode = 'ExclusiveLock'
  AND (classid::int4, objid::int4) = (`+advisorylock.OutboxSleepAll(advisorylock.Literal(db.Schema))+`)`).Scan(&pid))
	var ok bool
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok))
	require.True(t, ok)
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("the end of the lock's session was not reported")
	}
	// The sleeper still believes it holds the lock until the relay releases it; the release
	// fails on the dead session and closes it, and the next try takes the lock again.
	require.Error(t, s.Release(ctx))
	got, err = s.Try(ctx)
	require.NoError(t, err)
	require.Equal(t, Taken, got)
	require.False(t, s.Failing())
}

// A try that cannot reach PostgreSQL fails, says so until one succeeds, and spaces the next.
func TestTryFailsWithoutTheDatabase(t *testing.T) {
	t.Parallel()
	cfg, err := pgx.ParseConfig("postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=1")
	require.NoError(t, err)
	s := New(cfg, sqlq.New("keiro"), false, nil)
	defer s.Close()
	_, err = s.Try(context.Background())
	require.Error(t, err)
	require.True(t, s.Failing())
	require.Equal(t, 2*time.Millisecond, s.RetryIn(time.Hour))
}

package testenv_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// The meter counts the work of the backends it names and of this process.
func TestCPUMeterCountsTheNamedBackends(t *testing.T) {
	db := testenv.NewDB(t)
	pc, err := pgxpool.ParseConfig(db.ConnString)
	require.NoError(t, err)
	pc.ConnConfig.RuntimeParams["application_name"] = "keiro-cpu-meter-test"
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, pool.Ping(context.Background()))

	m := testenv.StartCPU(t, db, "keiro-cpu-meter-test")
	// Work in a named backend (a few hundred milliseconds: many of /proc's 10 ms ticks) ...
	var n int64
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM generate_series(1, 5000000) g WHERE g % 7 = 3`).Scan(&n))
	require.EqualValues(t, 714286, n)
	// ... and in this process.
	x := uint64(1)
	for i := range 20_000_000 {
		x = x*6364136223846793005 + uint64(i)
	}
	f := m.Stop(t)
	require.NotZero(t, x)
	require.Positive(t, f.Postgres, "the named backend's work is counted")
	require.Positive(t, f.Self, "this process's work is counted")
	require.GreaterOrEqual(t, f.Cores, 1)
	require.Equal(t, f.Self+f.Postgres, f.Total())
	require.InDelta(t, float64(f.Total().Microseconds())/1000, f.PerMessage(1000), 0.001)
	require.Positive(t, f.BoundRate(1000))
}

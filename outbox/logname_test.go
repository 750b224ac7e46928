package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/logrelay"
)

// A log-mode relay's replication session carries the relay process's name, as its other
// sessions do: the pool's application_name when it has one, else outbox.ApplicationName, so
// that pg_stat_replication tells which relay holds the slot and the console counts it as the
// relay it is.
func TestLogModeNamesItsReplicationSession(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, poolName, want string }{
		{name: "unnamed pool", want: ""}, // want: outbox.ApplicationName(schema)
		{name: "named pool", poolName: "orders-relay", want: "orders-relay"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, kc, st := rig(t, 1)
			ctx := context.Background()
			slot := outbox.DefaultLogSlot(db.Schema)
			dropLogSlot(t, db.Pool, slot)
			_, err := outbox.AdminOf(st).SetMode(ctx, db.Pool, outbox.ModeLog, "")
			require.NoError(t, err)
			want := tc.want
			if want == "" {
				want = outbox.ApplicationName(db.Schema)
			}
			pc, err := pgxpool.ParseConfig(db.ConnString)
			require.NoError(t, err)
			if tc.poolName != "" {
				pc.ConnConfig.RuntimeParams["application_name"] = tc.poolName
			}
			pool, err := pgxpool.NewWithConfig(ctx, pc)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			runRelay(t, &testenv.DB{Pool: pool, Schema: db.Schema, ConnString: db.ConnString}, kc.NewClient(t, outbox.ProducerOpts()...),
				outbox.RelayConfig{Mode: outbox.ModeLog, LogEngine: logrelay.Engine, Logger: testLogger(t)})

			var name string
			require.Eventually(t, func() bool {
				err := db.Pool.QueryRow(ctx, `SELECT a.application_name FROM pg_replication_slots s
					JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = $1`, slot).Scan(&name)
				return err == nil
			}, time.Minute, 10*time.Millisecond, "the relay's session holds the slot")
			require.Equal(t, want, name)
		})
	}
}

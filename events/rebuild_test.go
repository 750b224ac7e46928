package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// shadowTotals is a projection into table: per stream, the sum of n and the number of events.
func shadowTotals(table string) events.BatchHandler {
	return func(ctx context.Context, tx pgx.Tx, batch []events.RecordedEvent) error {
		for _, e := range batch {
			var a struct{ N int64 }
			if err := json.Unmarshal(e.Data, &a); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (stream, total, n) VALUES ($1, $2, 1)
				ON CONFLICT (stream) DO UPDATE SET total = `+table+`.total + excluded.total, n = `+table+`.n + 1`,
				e.StreamName, a.N); err != nil {
				return err
			}
		}
		return nil
	}
}

// TestRebuildShadowReadersNeverSeeFewerRows: while RebuildShadow replays the log into a shadow
// table (and the live subscription goes on with new events), a reader of the live table never
// sees fewer rows or events than before; after the swap the table equals a from-scratch model
// and the live subscription keeps writing to it.
func TestRebuildShadowReadersNeverSeeFewerRows(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newStore(t, db)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE totals (stream text PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL)`)
	require.NoError(t, err)
	for i := range 120 {
		_, err := appendTx(t, db, s, fmt.Sprintf("counter-%d", i%30), events.Any, ev("Added", fmt.Sprintf(`{"n":%d}`, i)))
		require.NoError(t, err)
	}
	p := new(testenv.Progress)
	live, err := events.NewBatchSubscription(s, db.Pool, events.SubscriptionConfig{Name: "totals", BatchSize: 20, AfterCommit: p.Set},
		shadowTotals("totals"))
	require.NoError(t, err)
	_, errc := runSub(t, live)
	p.Wait(t, head(t, s, db), time.Minute, errc)
	type snap struct{ rows, events int64 }
	read := func() snap {
		var x snap
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(n), 0) FROM totals`).Scan(&x.rows, &x.events))
		return x
	}
	before := read()
	require.Equal(t, snap{30, 120}, before)

	stop := make(chan struct{})
	ticks := make(chan struct{})
	var worst snap
	var wg sync.WaitGroup
	wg.Go(func() {
		worst = before
		for {
			x := read()
			worst = snap{min(worst.rows, x.rows), min(worst.events, x.events)}
			select {
			case <-stop:
				return
			case ticks <- struct{}{}:
			default:
			}
		}
	})
	first := true
	err = live.RebuildShadow(ctx, []string{db.Schema + ".totals"}, func(table func(string) string) events.BatchHandler {
		apply := shadowTotals(table(db.Schema + ".totals"))
		return func(ctx context.Context, tx pgx.Tx, batch []events.RecordedEvent) error {
			if first {
				first = false
				// The shadow is partly built: readers and new events meanwhile.
				<-ticks
				<-ticks
				_, err := appendTx(t, db, s, "counter-new", events.Any, ev("Added", `{"n":1000}`))
				require.NoError(t, err)
			}
			return apply(ctx, tx, batch)
		}
	})
	require.NoError(t, err)
	<-ticks
	close(stop)
	wg.Wait()
	require.GreaterOrEqual(t, worst.rows, before.rows, "a reader saw a partial model")
	require.GreaterOrEqual(t, worst.events, before.events, "a reader saw a partial model")

	p.Wait(t, head(t, s, db), time.Minute, errc)
	want := map[string][2]int64{}
	for e, err := range s.ReadAll(ctx, db.Pool, 0) {
		require.NoError(t, err)
		var a struct{ N int64 }
		require.NoError(t, json.Unmarshal(e.Data, &a))
		v := want[e.StreamName]
		want[e.StreamName] = [2]int64{v[0] + a.N, v[1] + 1}
	}
	got := map[string][2]int64{}
	rows, err := db.Pool.Query(ctx, `SELECT stream, total, n FROM totals`)
	require.NoError(t, err)
	var name string
	var tot, n int64
	_, err = pgx.ForEachRow(rows, []any{&name, &tot, &n}, func() error { got[name] = [2]int64{tot, n}; return nil })
	require.NoError(t, err)
	require.Equal(t, want, got)
	var shadows int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'totals_shadow'`, db.Schema).Scan(&shadows))
	require.Zero(t, shadows)

	// Bad input changes nothing.
	require.ErrorContains(t, live.RebuildShadow(ctx, nil, nil), "give the read model's tables")
	require.ErrorContains(t, live.RebuildShadow(ctx, []string{"a.b.c"}, func(func(string) string) events.BatchHandler { return nil }), "schema.table")
	require.Equal(t, int64(31), read().rows)
}

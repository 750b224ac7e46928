package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// runSub runs s until the test ends; the returned channel reports Run's result.
func runSub(t testing.TB, s *events.Subscription) (cancel func(), errc <-chan error) {
	ctx, cancelCtx := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	done := make(chan struct{})
	go func() { ch <- s.Run(ctx); close(done) }()
	stop := func() { cancelCtx(); <-done }
	t.Cleanup(stop)
	return stop, ch
}

func head(t testing.TB, s *events.Store, db *testenv.DB) int64 {
	h, err := s.Head(context.Background(), db.Pool)
	require.NoError(t, err)
	return h
}

func TestSubscriptionFollowsLogAndCategory(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newStore(t, db)
	ctx := context.Background()
	for i := range 5 {
		_, err := appendTx(t, db, s, fmt.Sprintf("order-%d", i%2), events.Any, ev("Placed", `{}`))
		require.NoError(t, err)
		_, err = appendTx(t, db, s, "invoice-1", events.Any, ev("Raised", `{}`))
		require.NoError(t, err)
	}
	var mu sync.Mutex
	var all, orders []int64
	p1, p2 := new(testenv.Progress), new(testenv.Progress)
	subAll, err := events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Name: "all", BatchSize: 3, AfterCommit: p1.Set},
		func(_ context.Context, _ pgx.Tx, e events.RecordedEvent) error {
			mu.Lock()
			all = append(all, e.GlobalPosition)
			mu.Unlock()
			return nil
		})
	require.NoError(t, err)
	subOrders, err := events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Name: "orders", Category: "order", AfterCommit: p2.Set},
		func(_ context.Context, _ pgx.Tx, e events.RecordedEvent) error {
			require.Equal(t, "order", e.Category())
			mu.Lock()
			orders = append(orders, e.GlobalPosition)
			mu.Unlock()
			return nil
		})
	require.NoError(t, err)
	_, e1 := runSub(t, subAll)
	_, e2 := runSub(t, subOrders)
	p1.Wait(t, head(t, s, db), time.Minute, e1)
	p2.Wait(t, head(t, s, db), time.Minute, e2)

	// Live: new appends are delivered through NOTIFY.
	_, err = appendTx(t, db, s, "order-7", events.Any, ev("Placed", `{}`), ev("Paid", `{}`))
	require.NoError(t, err)
	h := head(t, s, db)
	p1.Wait(t, h, time.Minute, e1)
	p2.Wait(t, h, time.Minute, e2)
	mu.Lock()
	require.Len(t, all, 12)
	require.Len(t, orders, 7)
	require.IsIncreasing(t, all)
	require.IsIncreasing(t, orders)
	mu.Unlock()
	pos, err := subAll.Position(ctx)
	require.NoError(t, err)
	require.Equal(t, h, pos)

	_, err = events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Category: "a-b", BatchSize: -1}, func(context.Context, pgx.Tx, events.RecordedEvent) error { return nil })
	require.ErrorContains(t, err, "Name")
	require.ErrorContains(t, err, "Category")
	require.ErrorContains(t, err, "BatchSize")
}

// TestSubscriptionWaitsForLateLowerPosition reproduces the gap: transaction B takes its xid
// before A, A draws position 1, B draws position 2 and commits first. A reader that trusted
// "xid < snapshot xmin" alone would deliver 2 and never 1. The subscription must deliver
// nothing until A ends, then 1 and 2 in order.
func TestSubscriptionWaitsForLateLowerPosition(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newStore(t, db)
	ctx := context.Background()
	var got []int64
	sub, err := events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Name: "gap"},
		func(_ context.Context, _ pgx.Tx, e events.RecordedEvent) error {
			got = append(got, e.GlobalPosition)
			return nil
		})
	require.NoError(t, err)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	pass := events.CatchUpOnce(sub, conn.Conn())
	// passUntil repeats passes until n events are delivered: a fence ripens once the appends
	// to the store that were open when it was taken have ended.
	passUntil := func(n int) {
		for i := 0; len(got) < n; i++ {
			require.Less(t, i, 10000, "stuck at %v", got)
			require.NoError(t, pass(ctx))
		}
	}

	txB, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer txB.Rollback(ctx)
	_, err = txB.Exec(ctx, "SELECT pg_current_xact_id()")
	require.NoError(t, err)
	txA, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer txA.Rollback(ctx)
	ra, err := s.AppendTx(ctx, txA, "order-a", events.Any, ev("E", `{}`))
	require.NoError(t, err)
	rb, err := s.AppendTx(ctx, txB, "order-b", events.Any, ev("E", `{}`))
	require.NoError(t, err)
	require.Less(t, ra.GlobalPosition, rb.GlobalPosition)
	require.NoError(t, txB.Commit(ctx))

	require.NoError(t, pass(ctx))
	require.Empty(t, got, "position %d is visible but %d may still commit", rb.GlobalPosition, ra.GlobalPosition)
	require.NoError(t, pass(ctx))
	require.Empty(t, got)

	require.NoError(t, txA.Commit(ctx))
	passUntil(2)
	require.Equal(t, []int64{ra.GlobalPosition, rb.GlobalPosition}, got)

	// A rolled-back append leaves a hole that is skipped once it is final.
	txC, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = s.AppendTx(ctx, txC, "order-c", events.Any, ev("E", `{}`))
	require.NoError(t, err)
	rd, err := appendTx(t, db, s, "order-d", events.Any, ev("E", `{}`))
	require.NoError(t, err)
	require.NoError(t, pass(ctx))
	require.Len(t, got, 2)
	require.NoError(t, txC.Rollback(ctx))
	passUntil(3)
	require.Equal(t, []int64{ra.GlobalPosition, rb.GlobalPosition, rd.GlobalPosition}, got)
}

// TestSubscriptionIgnoresUnrelatedTransactions: transactions that hold a transaction id open
// elsewhere — an append to another store (schema) of the same database, a plain transaction in
// the same database, a transaction in another database of the cluster — do not hold a
// subscription back: its fence looks only at the appends to its own store. (A guard on the
// cluster's oldest running transaction, pg_snapshot_xmin, delivered nothing until they ended.)
func TestSubscriptionIgnoresUnrelatedTransactions(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newStore(t, db)
	otherDB := testenv.NewDB(t)
	other := newStore(t, otherDB)
	ctx := context.Background()

	hold := func(tx pgx.Tx, err error) pgx.Tx {
		t.Helper()
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		_, err = tx.Exec(ctx, "SELECT pg_current_xact_id()")
		require.NoError(t, err)
		return tx
	}
	// An append to another store, left open.
	txStore := hold(otherDB.Pool.Begin(ctx))
	_, err := other.AppendTx(ctx, txStore, "order-x", events.Any, ev("E", `{}`))
	require.NoError(t, err)
	// A plain transaction in the same database.
	hold(db.Pool.Begin(ctx))
	// A transaction in another database.
	conn := otherDatabase(t)
	hold(conn.Begin(ctx))

	p := new(testenv.Progress)
	var got []int64
	sub, err := events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Name: "unrelated", AfterCommit: p.Set},
		func(_ context.Context, _ pgx.Tx, e events.RecordedEvent) error {
			got = append(got, e.GlobalPosition)
			return nil
		})
	require.NoError(t, err)
	r1, err := appendTx(t, db, s, "order-1", events.Any, ev("E", `{}`))
	require.NoError(t, err)
	_, errc := runSub(t, sub)
	p.Wait(t, r1.GlobalPosition, time.Minute, errc)
	r2, err := appendTx(t, db, s, "order-2", events.Any, ev("E", `{}`), ev("E", `{}`))
	require.NoError(t, err)
	p.Wait(t, r2.GlobalPosition, time.Minute, errc)
	require.Equal(t, []int64{r1.GlobalPosition, r2.GlobalPosition - 1, r2.GlobalPosition}, got)
}

// otherDatabase connects to a database of the cluster other than the test database, creating
// it if needed (it is shared by test runs and never dropped).
func otherDatabase(t *testing.T) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	const name = "keiro_test_unrelated"
	cfg, err := pgx.ParseConfig(testenv.DatabaseURL())
	require.NoError(t, err)
	admin, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer admin.Close(ctx)
	var exists bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists))
	if !exists {
		_, err := admin.Exec(ctx, "CREATE DATABASE "+name)
		var pgErr *pgconn.PgError
		if err != nil && !(errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505")) {
			require.NoError(t, err) // 42P04, 23505: another test run created it meanwhile
		}
	}
	cfg.Database = name
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestSubscriptionGapSafetyUnderLoad: 8 appenders with random commit delays and a live
// subscriber; the subscriber sees every event exactly once, in position order.
func TestSubscriptionGapSafetyUnderLoad(t *testing.T) {
	t.Parallel()
	total := 20000
	if testing.Short() {
		total = 5000
	}
	if v := os.Getenv("KEIRO_GAP_EVENTS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		total = n
	}
	db := testenv.NewDB(t)
	s := newStore(t, db)
	ctx := context.Background()

	var (
		mu   sync.Mutex
		seen = make(map[int64]bool, total)
		last int64
		dup  []int64
		ooo  []int64
	)
	p := new(testenv.Progress)
	sub, err := events.NewBatchSubscription(s, db.Pool, events.SubscriptionConfig{Name: "gap-load", BatchSize: 500, AfterCommit: p.Set},
		func(_ context.Context, _ pgx.Tx, batch []events.RecordedEvent) error {
			mu.Lock()
			defer mu.Unlock()
			for _, e := range batch {
				if seen[e.GlobalPosition] {
					dup = append(dup, e.GlobalPosition)
				}
				if e.GlobalPosition <= last {
					ooo = append(ooo, e.GlobalPosition)
				}
				seen[e.GlobalPosition], last = true, e.GlobalPosition
			}
			return nil
		})
	require.NoError(t, err)
	_, errc := runSub(t, sub)

	const writers = 8
	var wg sync.WaitGroup
	per := total / writers
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			stream := fmt.Sprintf("load-%d", w)
			for n := 0; n < per; {
				k := min(1+rng.IntN(4), per-n)
				batch := make([]events.EventData, k)
				for i := range batch {
					batch[i] = ev("E", `{}`)
				}
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					if _, err := s.AppendTx(ctx, tx, stream, events.Any, batch...); err != nil {
						return err
					}
					// Hold the transaction open for a random while: a slow commit with low
					// positions while others commit higher ones.
					if d := rng.IntN(3000); d > 2000 {
						time.Sleep(time.Duration(d-2000) * time.Microsecond)
					}
					return nil
				})
				if err != nil {
					t.Errorf("append: %v", err)
					return
				}
				n += k
			}
		})
	}
	wg.Wait()
	p.Wait(t, head(t, s, db), time.Minute, errc)
	stored := collect(t, s.ReadAll(ctx, db.Pool, 0))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, stored, writers*per)
	require.Empty(t, dup, "delivered twice")
	require.Empty(t, ooo, "delivered out of order")
	for _, e := range stored {
		require.True(t, seen[e.GlobalPosition], "position %d never delivered", e.GlobalPosition)
	}
	require.Len(t, seen, len(stored))
}

// projector is a non-idempotent read model (it adds), so applying an event twice shows.
const projectorDDL = `CREATE TABLE IF NOT EXISTS totals (stream text PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL)`

func projectorHandler(failEvery int, rng *rand.Rand, mu *sync.Mutex) events.Handler {
	return func(ctx context.Context, tx pgx.Tx, e events.RecordedEvent) error {
		var a Added
		if err := json.Unmarshal(e.Data, &a); err != nil {
			return err
		}
		if failEvery > 0 {
			mu.Lock()
			fail := rng.IntN(failEvery) == 0
			mu.Unlock()
			if fail {
				return errors.New("injected handler failure")
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO totals VALUES ($1, $2, 1)
			ON CONFLICT (stream) DO UPDATE SET total = totals.total + excluded.total, n = totals.n + 1`, e.StreamName, a.N)
		return err
	}
}

func readTotals(t testing.TB, db *testenv.DB) map[string][2]int64 {
	rows, err := db.Pool.Query(context.Background(), `SELECT stream, total, n FROM totals`)
	require.NoError(t, err)
	out := map[string][2]int64{}
	for rows.Next() {
		var s string
		var total, n int64
		require.NoError(t, rows.Scan(&s, &total, &n))
		out[s] = [2]int64{total, n}
	}
	require.NoError(t, rows.Err())
	return out
}

// TestProjectionExactlyOnceUnderKills: a subscription killed at random points (ctx cancel) and
// failing at random, restarted each time, ends with the same read model as a from-scratch
// rebuild computed from the log.
func TestProjectionExactlyOnceUnderKills(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newStore(t, db)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, projectorDDL)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(7, 7))
	const nEvents = 2000
	for i := 0; i < nEvents; {
		k := 1 + rng.IntN(5)
		batch := make([]events.EventData, k)
		for j := range batch {
			batch[j] = ev("Added", fmt.Sprintf(`{"n":%d}`, 1+rng.IntN(100)))
		}
		_, err := appendTx(t, db, s, fmt.Sprintf("counter-%d", rng.IntN(20)), events.Any, batch...)
		require.NoError(t, err)
		i += k
	}
	h := head(t, s, db)
	var mu sync.Mutex
	sub, err := events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Name: "totals", BatchSize: 50,
		Retry: events.RetryPolicy{Backoff: keiro.Backoff{Initial: time.Millisecond}}},
		projectorHandler(1000, rng, &mu))
	require.NoError(t, err)
	restarts := 0
	for {
		pos, err := sub.Position(ctx)
		require.NoError(t, err)
		if pos >= h {
			break
		}
		restarts++
		require.Less(t, restarts, 500, "no progress")
		mu.Lock()
		// The kill window grows with the restarts, so a loaded machine (where a run's set-up can
		// outlast a short window again and again) still makes progress.
		kill := time.Duration(5+rng.IntN(150)+2*restarts) * time.Millisecond
		mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, kill)
		err = sub.Run(rctx)
		cancel()
		if err != nil {
			require.ErrorContains(t, err, "injected handler failure")
		}
	}
	t.Logf("caught up after %d runs", restarts)

	// The from-scratch model, computed straight from the log.
	want := map[string][2]int64{}
	for e, err := range s.ReadAll(ctx, db.Pool, 0) {
		require.NoError(t, err)
		var a Added
		require.NoError(t, json.Unmarshal(e.Data, &a))
		v := want[e.StreamName]
		want[e.StreamName] = [2]int64{v[0] + int64(a.N), v[1] + 1}
	}
	require.Equal(t, want, readTotals(t, db))

	// Rebuild: reset checkpoint + truncate in one tx, replay from zero, same model.
	_, err = db.Pool.Exec(ctx, `UPDATE totals SET total = -1`) // corrupt it
	require.NoError(t, err)
	clean, err := events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Name: "totals", BatchSize: 500},
		projectorHandler(0, nil, nil))
	require.NoError(t, err)
	require.NoError(t, clean.Rebuild(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `TRUNCATE totals`)
		return err
	}))
	pos, err := clean.Position(ctx)
	require.NoError(t, err)
	require.Zero(t, pos)
	p := new(testenv.Progress)
	clean2, err := events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Name: "totals", BatchSize: 500, AfterCommit: p.Set},
		projectorHandler(0, nil, nil))
	require.NoError(t, err)
	_, errc := runSub(t, clean2)
	p.Wait(t, h, time.Minute, errc)
	require.Equal(t, want, readTotals(t, db))
}

// TestRebuildWhileRunning: a live subscription notices a Rebuild and re-projects.
func TestRebuildWhileRunning(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newStore(t, db)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, projectorDDL)
	require.NoError(t, err)
	for i := range 10 {
		_, err := appendTx(t, db, s, fmt.Sprintf("counter-%d", i%3), events.Any, ev("Added", `{"n":2}`))
		require.NoError(t, err)
	}
	p := new(testenv.Progress)
	sub, err := events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Name: "totals", AfterCommit: p.Set},
		projectorHandler(0, nil, nil))
	require.NoError(t, err)
	_, errc := runSub(t, sub)
	h := head(t, s, db)
	p.Wait(t, h, time.Minute, errc)
	before := readTotals(t, db)
	// Rebuild while the subscription is idle: it is woken, notices the reset checkpoint and
	// re-projects from zero without any new event.
	_, err = db.Pool.Exec(ctx, `UPDATE totals SET total = -1`)
	require.NoError(t, err)
	p.Set(0)
	require.NoError(t, sub.Rebuild(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `TRUNCATE totals`)
		return err
	}))
	p.Wait(t, h, time.Minute, errc)
	require.Equal(t, before, readTotals(t, db))

	// And keeps following the log.
	_, err = appendTx(t, db, s, "counter-0", events.Any, ev("Added", `{"n":5}`))
	require.NoError(t, err)
	p.Wait(t, head(t, s, db), time.Minute, errc)
	before["counter-0"] = [2]int64{before["counter-0"][0] + 5, before["counter-0"][1] + 1}
	require.Equal(t, before, readTotals(t, db))
}

// TestSubscriptionSingleActiveInstance: a second Run of the same name waits, then takes over.
func TestSubscriptionSingleActiveInstance(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	s := newStore(t, db)
	_, err := appendTx(t, db, s, "order-1", events.Any, ev("E", `{}`))
	require.NoError(t, err)
	var mu sync.Mutex
	handledBy := map[string][]int64{}
	mk := func(who string, p *testenv.Progress) *events.Subscription {
		sub, err := events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Name: "solo", AfterCommit: p.Set, MeterProvider: tm.mp},
			func(_ context.Context, _ pgx.Tx, e events.RecordedEvent) error {
				mu.Lock()
				handledBy[who] = append(handledBy[who], e.GlobalPosition)
				mu.Unlock()
				return nil
			})
		require.NoError(t, err)
		return sub
	}
	p1, p2 := new(testenv.Progress), new(testenv.Progress)
	stop1, e1 := runSub(t, mk("first", p1))
	p1.Wait(t, head(t, s, db), time.Minute, e1)
	_, e2 := runSub(t, mk("second", p2))
	_, err = appendTx(t, db, s, "order-1", events.Any, ev("E", `{}`))
	require.NoError(t, err)
	p1.Wait(t, head(t, s, db), time.Minute, e1)
	stop1()
	_, err = appendTx(t, db, s, "order-1", events.Any, ev("E", `{}`))
	require.NoError(t, err)
	p2.Wait(t, head(t, s, db), time.Minute, e2)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, handledBy["first"], 2)
	require.Len(t, handledBy["second"], 1, "the standby handled only what came after the takeover")
	require.Greater(t, handledBy["second"][0], handledBy["first"][1])
	require.Zero(t, tm.counter(t, "keiro.projection.lag"))
}

func TestSubscriptionLagAndHandlerError(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	s := newStore(t, db)
	for range 3 {
		_, err := appendTx(t, db, s, "order-1", events.Any, ev("E", `{}`))
		require.NoError(t, err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	sub, err := events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Name: "lag", BatchSize: 1, MeterProvider: tm.mp,
		Retry: events.RetryPolicy{MaxDeliveries: 1, OnPoison: events.PoisonHalt}},
		func(_ context.Context, _ pgx.Tx, e events.RecordedEvent) error {
			once.Do(func() { close(entered) })
			<-release
			if e.StreamVersion == 2 {
				return errors.New("poison")
			}
			return nil
		})
	require.NoError(t, err)
	_, errc := runSub(t, sub)
	<-entered
	require.Equal(t, int64(3), tm.counter(t, "keiro.projection.lag"))
	close(release)
	err = <-errc
	require.ErrorContains(t, err, "poison")
	require.ErrorContains(t, err, "order-1@2")
	pos, err := sub.Position(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(1), pos, "the failed batch rolled back")
}

// TestSubscriptionPollOnly: without LISTEN (PgBouncer transaction mode) new events are found by
// polling.
func TestSubscriptionPollOnly(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newStore(t, db, events.StoreConfig{DisableNotify: true})
	p := new(testenv.Progress)
	var n atomic.Int64
	sub, err := events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Name: "poll", DisableListen: true,
		PollInterval: 20 * time.Millisecond, AfterCommit: p.Set},
		func(context.Context, pgx.Tx, events.RecordedEvent) error { n.Add(1); return nil })
	require.NoError(t, err)
	_, errc := runSub(t, sub)
	for i := range 3 {
		_, err := appendTx(t, db, s, "order-1", events.Any, ev("E", `{}`))
		require.NoError(t, err)
		p.Wait(t, head(t, s, db), time.Minute, errc)
		require.Equal(t, int64(i+1), n.Load())
	}
}

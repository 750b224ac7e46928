package events_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// BenchmarkShardedSubscription drains b.N events (256 streams, one INSERT per event into a
// projection table in the handler's transaction) with 1, 2 and 4 workers of one sharded
// subscription (16 buckets) on one database. The workers first join and balance on a log held
// back by an open append (the late-commit guard keeps them from reading past it); the timer
// starts when that append commits. It reports events/s, this process's CPU per event
// (getrusage) and the CPU per event of the PostgreSQL processes serving the workers (their
// backends, by application_name, and the server's background processes: testenv.CPUMeter;
// the server must run on this machine).
//
// Its limit is unsharded: the same drain by one Subscription (one transaction per batch of 256
// events, no buckets), in the same run.
func BenchmarkShardedSubscription(b *testing.B) {
	b.Run("unsharded", func(b *testing.B) { benchmarkSharded(b, 0) })
	for _, workers := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("workers-%d", workers), func(b *testing.B) { benchmarkSharded(b, workers) })
	}
}

func benchmarkSharded(b *testing.B, workers int) {
	db := testenv.NewDBWith(b, testenv.DBConfig{MaxConns: 4})
	store := newStore(b, db)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE shard_bench (event_id uuid PRIMARY KEY, stream text NOT NULL, position bigint NOT NULL)`)
	require.NoError(b, err)
	appName := fmt.Sprintf("keiro-shard-bench-%d", time.Now().UnixNano())
	pc, err := pgxpool.ParseConfig(db.ConnString)
	require.NoError(b, err)
	pc.ConnConfig.RuntimeParams["application_name"] = appName
	pc.MaxConns = int32(max(2*workers, 2))
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(b, err)
	defer pool.Close()

	// Hold the log back: an open append with the lowest position.
	hold, err := db.Pool.Begin(ctx)
	require.NoError(b, err)
	defer hold.Rollback(ctx)
	_, err = store.AppendTx(ctx, hold, "order-hold", events.Any, ev("Placed", `{}`))
	require.NoError(b, err)
	const streams, perAppend = 256, 50
	for seeded := 0; seeded < b.N; {
		n := min(perAppend, b.N-seeded)
		batch := make([]events.EventData, n)
		for i := range batch {
			batch[i] = ev("Placed", `{"amount":1}`)
		}
		_, err := appendTx(b, db, store, fmt.Sprintf("order-%d", (seeded/perAppend)%streams), events.Any, batch...)
		require.NoError(b, err)
		seeded += n
	}

	var handled atomic.Int64
	done := make(chan struct{})
	total := int64(b.N + 1)
	// Each worker counts the events of its open transaction and adds them to handled when it
	// commits (a worker's handler and AfterCommit run on its one goroutine).
	cfg := events.ShardedSubscriptionConfig{Name: "bench", Category: "order", Buckets: 16,
		Lease: 30 * time.Second, RenewInterval: 10 * time.Second, PollInterval: 100 * time.Millisecond}
	worker := func() (events.Handler, events.ShardedSubscriptionConfig) {
		pending := int64(0)
		c := cfg
		c.AfterCommit = func(int, int64) {
			if handled.Add(pending) == total {
				close(done)
			}
			pending = 0
		}
		return func(ctx context.Context, tx pgx.Tx, e events.RecordedEvent) error {
			if _, err := tx.Exec(ctx, `INSERT INTO shard_bench (event_id, stream, position) VALUES ($1, $2, $3)`,
				[16]byte(e.ID), e.StreamName, e.GlobalPosition); err != nil {
				return err
			}
			pending++
			return nil
		}, c
	}
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, max(workers, 1))
	var subs []*events.ShardedSubscription
	if workers == 0 {
		h, cfg := worker()
		sub, err := events.NewSubscription(store, pool, events.SubscriptionConfig{Name: "bench", Category: "order",
			PollInterval: cfg.PollInterval, AfterCommit: func(int64) { cfg.AfterCommit(0, 0) }}, h)
		require.NoError(b, err)
		go func() { errc <- sub.Run(runCtx) }()
	}
	for range workers {
		h, cfg := worker()
		sub, err := events.NewShardedSubscription(store, pool, cfg, h)
		require.NoError(b, err)
		subs = append(subs, sub)
		go func() { errc <- sub.Run(runCtx) }()
	}
	defer func() {
		cancel()
		for range max(workers, 1) {
			require.NoError(b, <-errc)
		}
	}()
	want := make([]int, workers)
	for i := range want {
		want[i] = 16 / workers
	}
	testenv.WaitFor(b, time.Minute, "the workers to balance", func() bool {
		if workers == 0 {
			var active bool
			require.NoError(b, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM keiro_subscriptions WHERE name = 'bench')`).Scan(&active))
			return active
		}
		own, err := subs[0].Ownership(ctx)
		require.NoError(b, err)
		per := map[string]int{}
		for _, o := range own {
			if o.Held {
				per[o.Owner]++
			}
		}
		if len(per) != workers {
			return false
		}
		for _, n := range per {
			if n != 16/workers {
				return false
			}
		}
		return true
	})

	m := testenv.StartCPU(b, db, appName)
	b.ResetTimer()
	require.NoError(b, hold.Commit(ctx))
	select {
	case <-done:
	case err := <-errc:
		b.Fatalf("a worker stopped: %v", err)
	case <-time.After(10 * time.Minute):
		b.Fatalf("drained %d of %d", handled.Load(), total)
	}
	b.StopTimer()
	f := m.Stop(b)
	b.ReportMetric(float64(total)/f.Elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(f.Self.Microseconds())/float64(total), "cpu-µs/event")
	b.ReportMetric(f.PostgresPerMessage(int(total)), "pg-cpu-µs/event")
	b.ReportMetric(0, "ns/op")
	var n int64
	require.NoError(b, db.Pool.QueryRow(ctx, `SELECT count(*) FROM shard_bench`).Scan(&n))
	require.Equal(b, total, n)
}

// BenchmarkShardedSubscriptionFailover measures how long a dead worker's buckets take to move:
// two workers hold 8 buckets each (lease 1 s, renewed every 300 ms, polls every 100 ms); one
// dies (its session ends without releasing), and the time until the survivor holds all 16
// (reported by its OnOwnershipChange hook) is the move time, bounded by the lease and one
// poll.
func BenchmarkShardedSubscriptionFailover(b *testing.B) {
	db := testenv.NewDB(b)
	store := newStore(b, db)
	ctx := context.Background()
	h := func(context.Context, pgx.Tx, events.RecordedEvent) error { return nil }
	var worst, sum time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		all := make(chan time.Time, 1)
		cfg := events.ShardedSubscriptionConfig{Name: fmt.Sprintf("failover-%d", i), Buckets: 16,
			Lease: time.Second, RenewInterval: 300 * time.Millisecond, PollInterval: 100 * time.Millisecond}
		dying, err := events.NewShardedSubscription(store, db.Pool, cfg, h)
		require.NoError(b, err)
		events.SkipLeave(dying)
		cfg.OnOwnershipChange = func(owned []int) {
			if len(owned) == 16 {
				select {
				case all <- time.Now():
				default:
				}
			}
		}
		survivor, err := events.NewShardedSubscription(store, db.Pool, cfg, h)
		require.NoError(b, err)
		dctx, dcancel := context.WithCancel(ctx)
		sctx, scancel := context.WithCancel(ctx)
		derr, serr := make(chan error, 1), make(chan error, 1)
		go func() { derr <- dying.Run(dctx) }()
		testenv.WaitFor(b, time.Minute, "the first worker to hold every bucket", func() bool {
			own, err := dying.Ownership(ctx)
			require.NoError(b, err)
			n := 0
			for _, o := range own {
				if o.Held {
					n++
				}
			}
			return n == 16
		})
		go func() { serr <- survivor.Run(sctx) }()
		testenv.WaitFor(b, time.Minute, "8 buckets each", func() bool {
			own, err := dying.Ownership(ctx)
			require.NoError(b, err)
			n := 0
			for _, o := range own {
				if o.Held && o.Owner == survivor.Worker() {
					n++
				}
			}
			return n == 8
		})
		select {
		case <-all: // not yet: drain a stale report
		default:
		}
		b.StartTimer()
		died := time.Now()
		dcancel()
		require.NoError(b, <-derr)
		moved := <-all
		b.StopTimer()
		d := moved.Sub(died)
		sum += d
		worst = max(worst, d)
		scancel()
		require.NoError(b, <-serr)
	}
	b.ReportMetric(float64(sum.Milliseconds())/float64(b.N), "ms-to-move")
	b.ReportMetric(float64(worst.Milliseconds()), "worst-ms")
}

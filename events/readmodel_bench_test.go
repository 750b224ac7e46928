package events_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// BenchmarkReadModelWait measures read-your-writes through an asynchronous read model at a
// steady 1 000 events/s: writers append one event each on a schedule (event i at start + i
// ms), and right after the append commits the writer queries the model with Strong (or
// PositionWait on the append's position). The figure is the time from the append's commit to
// the query's return, whose wait ended when the subscription (LISTEN on appends, applying the
// projection with ReadModels.Handler in its checkpoint's transaction) committed past the event.
// b.N is the number of events; KEIRO_BENCH_READMODEL_RATE sets another rate.
func BenchmarkReadModelWait(b *testing.B) {
	for _, mode := range []string{"strong", "position-wait"} {
		b.Run(mode, func(b *testing.B) { benchmarkReadModelWait(b, mode) })
	}
}

func benchmarkReadModelWait(b *testing.B, mode string) {
	const writers = 12
	rate := 1000
	if v := os.Getenv("KEIRO_BENCH_READMODEL_RATE"); v != "" {
		r, err := strconv.Atoi(v)
		if err != nil || r < 1 {
			b.Fatalf("KEIRO_BENCH_READMODEL_RATE=%q: want a positive number of events per second", v)
		}
		rate = r
	}
	db := testenv.NewDBWith(b, testenv.DBConfig{MaxConns: writers + 4})
	ctx := context.Background()
	s := newStore(b, db)
	rms, err := events.NewReadModels(s, db.Pool, events.ReadModelsConfig{})
	if err != nil {
		b.Fatal(err)
	}
	model := events.ReadModel{Name: "bench", Schema: db.Schema, Table: "bench_counts", Subscription: "bench", Version: 1, ShapeHash: "v1"}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE bench_counts (stream text PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	if _, err := rms.Register(ctx, model); err != nil {
		b.Fatal(err)
	}
	p := events.AsyncProjection{Name: "bench", ReadModel: "bench",
		Apply: func(ctx context.Context, tx pgx.Tx, e events.RecordedEvent) error {
			_, err := tx.Exec(ctx, `INSERT INTO bench_counts AS c (stream, n) VALUES ($1, 1)
                ON CONFLICT (stream) DO UPDATE SET n = c.n + 1`, e.StreamName)
			return err
		}}
	// The subscription's own delay, the wait's limit: when its commits covered each position.
	type commit struct {
		at       time.Time
		position int64
	}
	var (
		mu      sync.Mutex
		commits []commit
	)
	sub, err := events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Name: "bench", AfterCommit: func(position int64) {
		mu.Lock()
		commits = append(commits, commit{time.Now(), position})
		mu.Unlock()
	}}, rms.Handler(p))
	if err != nil {
		b.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = sub.Run(runCtx); close(done) }()
	defer func() { cancel(); <-done }()

	n := b.N
	lat := make([]time.Duration, n)
	subLat := make([]time.Duration, n)
	positions := make([]int64, n)
	committedAt := make([]time.Time, n)
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range writers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
					time.Sleep(d)
				}
				var pos int64
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					res, err := s.AppendTx(ctx, tx, fmt.Sprintf("bench-%d", i%100), events.Any, ev("E", `{}`))
					pos = res.GlobalPosition
					return err
				})
				committed := time.Now()
				if err == nil {
					var c events.Consistency = events.Strong{}
					if mode == "position-wait" {
						c = events.PositionWait{Target: pos}
					}
					err = rms.Query(ctx, model, c, func(ctx context.Context, tx pgx.Tx) error {
						var got int64
						return tx.QueryRow(ctx, `SELECT coalesce((SELECT n FROM bench_counts WHERE stream = $1), 0)`,
							fmt.Sprintf("bench-%d", i%100)).Scan(&got)
					})
				}
				if err != nil {
					failed.Store(err)
					return
				}
				lat[i] = time.Since(committed)
				positions[i], committedAt[i] = pos, committed
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	mu.Lock()
	for i := range n {
		j, _ := slices.BinarySearchFunc(commits, positions[i], func(c commit, p int64) int {
			return int(min(1, max(-1, c.position-p)))
		})
		if j < len(commits) {
			subLat[i] = commits[j].at.Sub(committedAt[i])
		}
	}
	mu.Unlock()
	slices.Sort(lat)
	slices.Sort(subLat)
	q := func(l []time.Duration, f float64) float64 {
		return float64(l[min(n-1, int(f*float64(n)))].Microseconds()) / 1000
	}
	b.ReportMetric(q(lat, 0.50), "p50-ms")
	b.ReportMetric(q(lat, 0.99), "p99-ms")
	b.ReportMetric(float64(lat[n-1].Microseconds())/1000, "max-ms")
	b.ReportMetric(q(subLat, 0.50), "sub-p50-ms")
	b.ReportMetric(q(subLat, 0.99), "sub-p99-ms")
	b.ReportMetric(float64(n)/elapsed.Seconds(), "events/s")
}

package events_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// runParallel runs n operations over the given number of writers and returns the elapsed time.
func runParallel(writers, n int, op func(i int) error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	start := time.Now()
	for range writers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := op(i); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	err, _ := failed.Load().(error)
	return time.Since(start), err
}

// BenchmarkCommand measures single-event commands (hydrate, decide, append, commit, notify) on
// fresh streams next to the raw limit: a transaction with one INSERT of a similar row into a
// table with a primary key and a unique id, at the same concurrency. The two alternate in
// rounds of 100 operations per writer, so load from elsewhere on the machine hits both alike;
// "ratio" is runner/raw throughput.
func BenchmarkCommand(b *testing.B) {
	for _, mode := range []string{"hydrate", "assume-new"} {
		for _, writers := range []int{1, 8} {
			benchmarkCommand(b, mode, writers)
		}
	}
}

// benchmarkCommand: mode "hydrate" is the default path; "assume-new" sets RunOptions.AssumeNew
// (creation commands skip the hydration round trip).
func benchmarkCommand(b *testing.B, mode string, writers int) {
	{
		opts := events.RunOptions{AssumeNew: mode == "assume-new"}
		b.Run(fmt.Sprintf("%s/writers=%d", mode, writers), func(b *testing.B) {
			db := testenv.NewDB(b)
			_, r := newCounterRunnerNotify(b, db, os.Getenv("KEIRO_BENCH_NOTIFY") != "off")
			ctx := context.Background()
			_, err := db.Pool.Exec(ctx, `CREATE TABLE raw_events (
				position bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event_id uuid NOT NULL UNIQUE,
				stream_name text NOT NULL, event_type text NOT NULL, data jsonb NOT NULL,
				recorded_at timestamptz NOT NULL DEFAULT now())`)
			if err != nil {
				b.Fatal(err)
			}
			sql := fmt.Sprintf(`INSERT INTO %s.raw_events (event_id, stream_name, event_type, data) VALUES ($1, $2, $3, $4)`, db.Schema)
			run := time.Now().UnixNano()
			command := func(i int) error {
				_, err := r.Run(ctx, db.Pool, fmt.Sprintf("counter-%d.%d", run, i), counterCmd{N: 1}, opts)
				return err
			}
			raw := func(i int) error {
				return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					id := envelope.NewUUIDv7()
					_, err := tx.Exec(ctx, sql, [16]byte(id), fmt.Sprintf("counter-%d", i), "Added", `{"n":1}`)
					return err
				})
			}
			var tCmd, tRaw time.Duration
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(100*writers, b.N-done)
				d, err := runParallel(writers, n, func(i int) error { return command(done + i) })
				if err != nil {
					b.Fatal(err)
				}
				tCmd += d
				if d, err = runParallel(writers, n, func(i int) error { return raw(done + i) }); err != nil {
					b.Fatal(err)
				}
				tRaw += d
				done += n
			}
			b.StopTimer()
			cmd, rawRate := float64(b.N)/tCmd.Seconds(), float64(b.N)/tRaw.Seconds()
			b.ReportMetric(cmd, "cmds/s")
			b.ReportMetric(rawRate, "raw-commits/s")
			b.ReportMetric(cmd/rawRate, "ratio")
		})
	}
}

// catchUpEvents is the log size for BenchmarkCatchUp: KEIRO_BENCH_CATCHUP_EVENTS, else 1M, or
// 50k under -short.
func catchUpEvents(b *testing.B) int {
	if v := os.Getenv("KEIRO_BENCH_CATCHUP_EVENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			b.Fatal(err)
		}
		return n
	}
	if testing.Short() {
		return 50_000
	}
	return 1_000_000
}

// BenchmarkCatchUp measures a subscription catching up over a pre-filled log, from zero to the
// head, next to the limit: a raw keyset-paged scan of the same rows.
func BenchmarkCatchUp(b *testing.B) {
	n := catchUpEvents(b)
	db := testenv.NewDB(b)
	s := newStore(b, db)
	ctx := context.Background()
	// Fill the log with SQL: 100 events per stream.
	_, err := db.Pool.Exec(ctx, fmt.Sprintf(`
		INSERT INTO %[1]s.keiro_events (event_id, stream_name, category, stream_version, event_type,
			schema_version, data, tx_id)
		SELECT gen_random_uuid(), 'counter-' || (g / 100), 'counter', (g %% 100) + 1, 'Added', 1,
			jsonb_build_object('n', g), pg_current_xact_id()
		FROM generate_series(0, $1 - 1) g`, db.Schema), n)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`ANALYZE %s.keiro_events`, db.Schema)); err != nil {
		b.Fatal(err)
	}
	h := head(b, s, db)

	b.Run(fmt.Sprintf("subscription/events=%d", n), func(b *testing.B) {
		var seen atomic.Int64
		done := make(chan struct{}, 1)
		var target atomic.Int64
		sub, err := events.NewBatchSubscription(s, db.Pool, events.SubscriptionConfig{Name: "bench", BatchSize: 1000,
			AfterCommit: func(pos int64) {
				if pos >= target.Load() {
					select {
					case done <- struct{}{}:
					default:
					}
				}
			}},
			func(_ context.Context, _ pgx.Tx, batch []events.RecordedEvent) error {
				seen.Add(int64(len(batch)))
				return nil
			})
		if err != nil {
			b.Fatal(err)
		}
		target.Store(h)
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			b.StopTimer()
			if err := sub.Rebuild(ctx, nil); err != nil {
				b.Fatal(err)
			}
			rctx, cancel := context.WithCancel(ctx)
			errc := make(chan error, 1)
			b.StartTimer()
			go func() { errc <- sub.Run(rctx) }()
			select {
			case <-done:
			case err := <-errc:
				b.Fatal(err)
			}
			b.StopTimer()
			cancel()
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		b.ReportMetric(float64(seen.Load())/time.Since(start).Seconds(), "events/s")
	})
	b.Run(fmt.Sprintf("raw-keyset-scan/events=%d", n), func(b *testing.B) {
		var seen int64
		start := time.Now()
		for range b.N {
			for _, err := range s.ReadAll(ctx, db.Pool, 0) {
				if err != nil {
					b.Fatal(err)
				}
				seen++
			}
		}
		b.ReportMetric(float64(seen)/time.Since(start).Seconds(), "events/s")
	})
}

func newCounterRunnerNotify(b testing.TB, db *testenv.DB, notify bool) (*events.Store, *events.Runner[counterState, counterCmd, counterEvent]) {
	s, err := events.NewStore(events.StoreConfig{Schema: db.Schema, DisableNotify: !notify})
	if err != nil {
		b.Fatal(err)
	}
	r, err := events.NewRunner(s, counterDecider, counterCodec(b), events.RunnerConfig[counterState]{})
	if err != nil {
		b.Fatal(err)
	}
	return s, r
}

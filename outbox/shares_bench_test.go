package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// benchRelays runs BenchmarkDrain's relays-N sub-benchmarks: N relays, each with its own pool
// and client as in N processes, drain one backlog (benchSizes). Besides msgs/s each reports the
// CPU the drain cost the machine per message: this process (the relays and the in-process
// kfake) and the PostgreSQL processes serving it (its backends and the server's background
// processes), measured by testenv.CPUMeter, and the drain rate that CPU allows on the
// machine's cores (bound-msgs/s = cores / CPU seconds per message), so that the bound is
// measured in the same run; idx-tup/msg is the outbox's index entries read per message
// published (pg_stat_user_indexes: the claims' scans, head lookups and the marks' lookups by
// id), which stays flat when the relays do not waste claims; wal-B/msg is the WAL the drain
// wrote for the benchmark's schema per message (testenv.WALMeter).
// KEIRO_BENCH_SHARES=off runs the relays without claim shares (racing over one front, as
// before them).
func benchRelays(b *testing.B, n, keys int) {
	for _, relays := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("relays-%d", relays), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				kc := testenv.BenchKafka(b, testenv.KafkaConfig{})
				kc.CreateTopic(b, "orders", 6)
				db, _ := filledOutbox(b, n, keys)
				f := drainRelays(b, db, kc, n, relays)
				cores := float64(f.cores)
				b.ReportMetric(float64(n)/f.elapsed.Seconds(), "msgs/s")
				b.ReportMetric(float64(f.cpu.Microseconds())/float64(n), "cpu-us/msg")
				b.ReportMetric(float64((f.cpu-f.selfCPU).Microseconds())/float64(n), "pg-cpu-us/msg")
				b.ReportMetric(cores*float64(n)/f.cpu.Seconds(), "bound-msgs/s")
				b.ReportMetric(100*f.machineBusy.Seconds()/(cores*f.elapsed.Seconds()), "machine-busy-%")
				b.ReportMetric(float64(f.claimIdxTuples)/float64(n), "idx-tup/msg")
				b.ReportMetric(float64(f.claims)/float64(f.batches), "claims/batch")
				b.ReportMetric(float64(f.shareClaims)/float64(max(f.claims, 1)), "share-claims/claim")
				b.ReportMetric(float64(f.drained), "shares-drained")
				b.ReportMetric(float64(f.wal)/float64(n), "wal-B/msg")
			}
		})
	}
}

// drainFigures are what drainRelays measured.
type drainFigures struct {
	elapsed time.Duration
	// cpu is this process's CPU time and that of the PostgreSQL processes serving it during
	// the drain; machineBusy, every core's busy time (other work on the machine included).
	cpu, machineBusy time.Duration
	// selfCPU is the part of cpu spent in this process (the rest is PostgreSQL's).
	selfCPU time.Duration
	// cores is the machine's number of cores.
	cores int
	// claimIdxTuples is the outbox's index entries read during the drain, and idxBlocks its
	// index pages read (dead entries a lookup steps over cost pages, not entries).
	claimIdxTuples, idxBlocks int64
	// misses is the outbox's heap and index pages PostgreSQL read from outside its shared
	// buffers (the OS's cache or the disk) during the drain.
	misses int64
	// vacuums is the relays' own vacuums of the outbox.
	vacuums int64
	// claims, shareClaims and batches are the relays' Stats summed.
	claims, shareClaims, batches int64
	// drained counts the claims of a relay's own shares that came back empty.
	drained int64
	// wal is the WAL bytes the drain wrote for the benchmark's schema (testenv.WALMeter).
	wal int64
}

// drainRelays runs relays relays over n pre-enqueued rows until all are published.
func drainRelays(b *testing.B, db *testenv.DB, kc *testenv.Kafka, n, relays int) drainFigures {
	ctx := context.Background()
	var published atomic.Int64
	all := make(chan struct{})
	appName := ApplicationName(db.Schema)
	rs := make([]*Relay, relays)
	pools := make([]*pgxpool.Pool, relays)
	for i := range rs {
		pc, err := pgxpool.ParseConfig(db.ConnString)
		require.NoError(b, err)
		pc.ConnConfig.RuntimeParams["application_name"] = appName
		pc.MaxConns = 8 // a relay uses up to about six at once
		pools[i], err = pgxpool.NewWithConfig(ctx, pc)
		require.NoError(b, err)
		cfg := RelayConfig{Schema: db.Schema, OnBatch: func(br BatchResult) {
			if published.Add(int64(br.Published)) == int64(n) {
				close(all)
			}
		}}
		cfg.BatchSize, cfg.MaxInFlightBatches = envInt("KEIRO_BENCH_BATCH"), envInt("KEIRO_BENCH_INFLIGHT")
		cfg.ClaimConcurrency = envInt("KEIRO_BENCH_CLAIMERS")
		cfg.VacuumThreshold = int64(envInt("KEIRO_BENCH_VACUUM")) // -1: the relays never vacuum
		if os.Getenv("KEIRO_BENCH_DEBUG") != "" {
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
		rs[i], err = NewRelay(pools[i], kc.NewClient(b, ProducerOpts()...), cfg)
		require.NoError(b, err)
		if os.Getenv("KEIRO_BENCH_SHARES") == "off" {
			rs[i].shares = nil
		}
	}
	_, err := db.Pool.Exec(ctx, `SELECT pg_stat_reset_single_table_counters(i.indexrelid) FROM pg_index i
		WHERE i.indrelid = ($1 || '.keiro_outbox')::regclass`, db.Schema)
	require.NoError(b, err)
	_, err = db.Pool.Exec(ctx, `SELECT pg_stat_reset_single_table_counters(($1 || '.keiro_outbox')::regclass)`, db.Schema)
	require.NoError(b, err)
	walConn, err := db.Pool.Acquire(ctx)
	require.NoError(b, err)
	defer walConn.Release()
	wm, err := testenv.StartWAL(ctx, walConn, db.Schema)
	require.NoError(b, err)
	m := testenv.StartCPU(b, db, appName)
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, relays)
	b.StartTimer()
	start := time.Now()
	for _, r := range rs {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- r.Run(runCtx) }()
	}
	<-all
	f := drainFigures{elapsed: time.Since(start)}
	b.StopTimer()
	cf := m.Stop(b)
	f.machineBusy, f.selfCPU, f.cpu, f.cores = cf.MachineBusy, cf.Self, cf.Total(), cf.Cores
	wf, err := wm.Stop(ctx, walConn)
	require.NoError(b, err)
	f.wal = wf.Schema
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(b, err)
	}
	for i, r := range rs {
		s := r.Stats()
		f.claims += s.Claims
		f.shareClaims += s.ShareClaims
		f.drained += r.stats.sharesDrained.Load()
		f.batches += s.Batches
		f.vacuums += s.Vacuums
		pools[i].Close()
	}
	// A backend reports its index statistics when it ends (or, busy, once a second): wait for
	// the relays' backends to end.
	for {
		var left int
		require.NoError(b, db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", appName).Scan(&left))
		if left == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(b, db.Pool.QueryRow(ctx, `SELECT coalesce(sum(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes
		WHERE schemaname = $1 AND relname = 'keiro_outbox'`, db.Schema).Scan(&f.claimIdxTuples))
	require.NoError(b, db.Pool.QueryRow(ctx, `SELECT coalesce(sum(idx_blks_hit + idx_blks_read), 0)::bigint FROM pg_statio_user_indexes
		WHERE schemaname = $1 AND relname = 'keiro_outbox'`, db.Schema).Scan(&f.idxBlocks))
	require.NoError(b, db.Pool.QueryRow(ctx, `SELECT coalesce(heap_blks_read, 0) + coalesce(idx_blks_read, 0) FROM pg_statio_user_tables
		WHERE schemaname = $1 AND relname = 'keiro_outbox'`, db.Schema).Scan(&f.misses))
	return f
}

package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
// processes), read from getrusage and /proc, and the drain rate that CPU allows on the
// machine's cores (bound-msgs/s = cores / CPU seconds per message), so that the bound is
// measured in the same run; idx-tup/msg is the outbox's index entries read per message
// published (pg_stat_user_indexes: the claims' scans, head lookups and the marks' lookups by
// id), which stays flat when the relays do not waste claims.
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
				cores := float64(numCPU())
				b.ReportMetric(float64(n)/f.elapsed.Seconds(), "msgs/s")
				b.ReportMetric(float64(f.cpu.Microseconds())/float64(n), "cpu-us/msg")
				b.ReportMetric(float64((f.cpu-f.selfCPU).Microseconds())/float64(n), "pg-cpu-us/msg")
				b.ReportMetric(cores*float64(n)/f.cpu.Seconds(), "bound-msgs/s")
				b.ReportMetric(100*f.machineBusy.Seconds()/(cores*f.elapsed.Seconds()), "machine-busy-%")
				b.ReportMetric(float64(f.claimIdxTuples)/float64(n), "idx-tup/msg")
				b.ReportMetric(float64(f.claims)/float64(f.batches), "claims/batch")
				b.ReportMetric(float64(f.shareClaims)/float64(max(f.claims, 1)), "share-claims/claim")
				b.ReportMetric(float64(f.drained), "shares-drained")
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
	pgBefore := pgCPU(b, db, appName)
	selfBefore, busyBefore := selfCPU(), machineBusy()
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
	f.machineBusy = machineBusy() - busyBefore
	f.selfCPU = selfCPU() - selfBefore
	f.cpu = f.selfCPU
	for pid, t := range pgCPU(b, db, appName) {
		f.cpu += t - pgBefore[pid]
	}
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

// clockTick is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// selfCPU is this process's CPU time (user and system).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pgCPU is the CPU time of each PostgreSQL process serving this benchmark: the sessions named
// appName (the relays' pools and own sessions) and the server's background processes
// (WAL writer, checkpointer, autovacuum, ...), by pid. It needs the server on this machine.
func pgCPU(b *testing.B, db *testenv.DB, appName string) map[int]time.Duration {
	rows, err := db.Pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity
		WHERE backend_type <> 'client backend' OR application_name = $1`, appName)
	require.NoError(b, err)
	defer rows.Close()
	out := map[int]time.Duration{}
	for rows.Next() {
		var pid int
		require.NoError(b, rows.Scan(&pid))
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // ended, or another machine's
		}
		f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		out[pid] = time.Duration(utime+stime) * clockTick
	}
	require.NoError(b, rows.Err())
	return out
}

// machineBusy is the busy time of every core since boot (/proc/stat: all but idle and iowait).
func machineBusy() time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(strings.SplitN(string(data), "\n", 2)[0])[1:]
	var busy int64
	for i, v := range f {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i != 3 && i != 4 && i < 8 { // idle, iowait; guest times are in user already
			busy += n
		}
	}
	return time.Duration(busy) * clockTick
}

// numCPU is the number of cores the machine has (not GOMAXPROCS: the database uses them too).
func numCPU() int {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 1
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "cpu") && !strings.HasPrefix(line, "cpu ") {
			n++
		}
	}
	return max(n, 1)
}

package outbox

import (
	"bytes"
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	_ "github.com/keiro-go/keiro/outbox/logrelay"
)

// BenchmarkLogMode measures log mode next to the claim relay in the same run: the enqueue of
// KEIRO_BENCH_EVENTS events (200,000; 20,000 with -short) of KEIRO_BENCH_PAYLOAD bytes (256)
// over KEIRO_BENCH_KEYS keys (10,000) in transactions of 1,000, then the drain of all of them
// to kfake, with the WAL each phase wrote (pg_current_wal_lsn, cluster-wide: run it on a quiet
// cluster) and the process's CPU per message (the relay and the in-process broker alike).
//
//	go test ./outbox/ -run '^$' -bench BenchmarkLogMode -benchtime 1x
func BenchmarkLogMode(b *testing.B) {
	n, keys, size := 200_000, 10_000, 256
	if testing.Short() {
		n = 20_000
	}
	if v := envInt("KEIRO_BENCH_EVENTS"); v > 0 {
		n = v
	}
	if v := envInt("KEIRO_BENCH_KEYS"); v > 0 {
		keys = v
	}
	if v := envInt("KEIRO_BENCH_PAYLOAD"); v > 0 {
		size = v
	}
	for _, mode := range []Mode{ModeClaim, ModeLog} {
		b.Run(string(mode), func(b *testing.B) {
			for range b.N {
				benchLogMode(b, mode, n, keys, size)
			}
		})
	}
}

func benchLogMode(b *testing.B, mode Mode, n, keys, size int) {
	b.StopTimer()
	ctx := context.Background()
	db := testenv.NewDB(b)
	st, err := NewStore(db.Schema)
	require.NoError(b, err)
	kc := testenv.NewKafkaWith(b, testenv.KafkaConfig{Topics: []string{"orders"}, Partitions: 10})
	if mode == ModeLog {
		slot := DefaultLogSlot(db.Schema)
		b.Cleanup(func() {
			_, _ = db.Pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
			for range 100 {
				if _, err := db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot); err == nil {
					break
				}
				time.Sleep(50 * time.Millisecond) // a terminated reader releases its slot shortly after
			}
			_, _ = db.Pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+slot)
		})
		_, err := st.SetMode(ctx, db.Pool, ModeLog, "")
		require.NoError(b, err)
	}
	lsn := func() int64 {
		var v int64
		require.NoError(b, db.Pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`).Scan(&v))
		return v
	}
	pad := bytes.Repeat([]byte("x"), max(0, size-16))
	var encoded int
	wal0 := lsn()
	t0 := time.Now()
	for i := 0; i < n; i += 1000 {
		evs := make([]envelope.Event, 0, 1000)
		for j := i; j < min(n, i+1000); j++ {
			k := "k" + strconv.Itoa(j%keys)
			evs = append(evs, envelope.Event{MessageID: "m" + strconv.Itoa(j), Source: "ordering",
				Destination: "orders", Key: &k, EventType: "E", ContentType: envelope.ContentTypeJSON,
				Payload: append([]byte(`{"i":`+strconv.Itoa(1e9+j)+`,"p":"`), append(pad, `"}`...)...)[:size], OccurredAt: time.Now().UTC()})
		}
		if i == 0 {
			encoded = len(evs[0].Payload) + len(*evs[0].Key)
			for _, h := range evs[0].AppendHeaders(nil, envelope.EncodeOptions{}) {
				encoded += len(h.Key) + len(h.Value)
			}
		}
		require.NoError(b, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := st.EnqueueTx(ctx, tx, evs...)
			return err
		}))
	}
	enqueueTime := time.Since(t0)
	wal1 := lsn()

	r, err := NewRelay(db.Pool, kc.NewClient(b, ProducerOpts()...), RelayConfig{Schema: db.Schema, Mode: mode})
	require.NoError(b, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	cpu0 := cpuTime()
	b.StartTimer()
	start := time.Now()
	go func() { done <- r.Run(rctx) }()
	for r.Stats().Published < int64(n) {
		time.Sleep(2 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cpu := cpuTime() - cpu0
	wal2 := lsn()
	cancel()
	require.NoError(b, <-done)

	b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-µs/msg")
	b.ReportMetric(float64(n)/enqueueTime.Seconds(), "enqueued/s")
	b.ReportMetric(float64(wal1-wal0)/float64(n), "wal-enqueue-B/event")
	b.ReportMetric(float64(wal2-wal1)/float64(n), "wal-drain-B/event")
	b.ReportMetric(float64(encoded), "encoded-B/event")
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

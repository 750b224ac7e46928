package outbox

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/logmsg"
	"github.com/keiro-go/keiro/outbox/logrelay"
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
	for _, run := range []struct {
		name string
		mode Mode
		eo   bool
	}{{"claim", ModeClaim, false}, {"log", ModeLog, false}, {"log-exactly-once", ModeLog, true}} {
		b.Run(run.name, func(b *testing.B) {
			for range b.N {
				benchLogMode(b, run.mode, run.eo, n, keys, size)
			}
		})
	}
}

// benchLogMode is one drain of BenchmarkLogMode; eo publishes exactly once (the drain ends
// when Kafka acknowledged every record, which is at most one transaction before it committed
// them).
func benchLogMode(b *testing.B, mode Mode, eo bool, n, keys, size int) {
	b.StopTimer()
	ctx := context.Background()
	db := testenv.NewDB(b)
	st, err := NewStore(db.Schema)
	require.NoError(b, err)
	kc := testenv.NewKafkaWith(b, testenv.KafkaConfig{Topics: []string{"orders"}, Partitions: 10})
	if mode == ModeLog {
		useLogMode(b, db, st)
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

	r, err := NewRelay(db.Pool, kc.NewClient(b, ProducerOpts()...), RelayConfig{Schema: db.Schema, Mode: mode, LogEngine: logrelay.Engine, ExactlyOnce: eo})
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

	if eo && r.logEngine != nil {
		_, c := r.logEngine.ExactlyOnce()
		b.ReportMetric(float64(c.Committed()), "kafka-txns")
	}
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-µs/msg")
	b.ReportMetric(float64(n)/enqueueTime.Seconds(), "enqueued/s")
	b.ReportMetric(float64(wal1-wal0)/float64(n), "wal-enqueue-B/event")
	b.ReportMetric(float64(wal2-wal1)/float64(n), "wal-drain-B/event")
	b.ReportMetric(float64(encoded), "encoded-B/event")
}

// useLogMode switches db's schema to log mode (creating its publication and slot) and drops
// them when b ends.
func useLogMode(b *testing.B, db *testenv.DB, st *Store) {
	b.Helper()
	ctx := context.Background()
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
	_, err := AdminOf(st).SetMode(ctx, db.Pool, ModeLog, "")
	require.NoError(b, err)
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEnqueueModes8 commits single-event transactions (one 200-byte event each, a key per
// writer) from 8 writers at once with EnqueueTx in log mode and in claim mode, and with EmitTx
// (log mode's logical decoding messages, "emit"), next to the floor: BEGIN, a plain INSERT of the same row into a plain table with keiro_outbox_log's
// columns and its one unique index (source, message_id), COMMIT. Run it several times and
// compare within a run:
//
//	go test ./outbox/ -run '^$' -bench EnqueueModes8 -benchtime 5000x
func BenchmarkEnqueueModes8(b *testing.B) {
	const writers = 8
	payload := bytes.Repeat([]byte("x"), 200)
	run := func(b *testing.B, commit func(ctx context.Context, w, i int) error) {
		ctx := context.Background()
		var next atomic.Int64
		b.ResetTimer()
		require.NoError(b, parallel(writers, func(w int) error {
			for {
				i := int(next.Add(1))
				if i > b.N {
					return nil
				}
				if err := commit(ctx, w, i); err != nil {
					return err
				}
			}
		}))
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
	}
	b.Run("floor", func(b *testing.B) {
		db := testenv.NewDB(b)
		ctx := context.Background()
		_, err := db.Pool.Exec(ctx, `CREATE TABLE bench_floor (LIKE keiro_outbox_log INCLUDING DEFAULTS);
CREATE UNIQUE INDEX ON bench_floor (source, message_id)`)
		require.NoError(b, err)
		q := fmt.Sprintf(`INSERT INTO %s.bench_floor (outbox_id, message_id, source, destination,
    message_key, event_type, schema_version, content_type, payload_bytes, occurred_at)
VALUES ($1, $2, 'ordering', 'orders', $3, 'E', 1, 'application/json', $4, now())`, db.Schema)
		run(b, func(ctx context.Context, w, i int) error {
			return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, q, [16]byte(envelope.NewUUIDv7()), "m"+strconv.Itoa(i), "k"+strconv.Itoa(w), payload)
				return err
			})
		})
	})
	b.Run("emit", func(b *testing.B) {
		db := testenv.NewDB(b)
		st, err := NewStore(db.Schema)
		require.NoError(b, err)
		useLogMode(b, db, st)
		run(b, func(ctx context.Context, w, i int) error {
			k := "k" + strconv.Itoa(w)
			e := envelope.Event{MessageID: "m" + strconv.Itoa(i), Source: "ordering", Destination: "orders",
				Key: &k, EventType: "E", ContentType: envelope.ContentTypeJSON, Payload: payload, OccurredAt: time.Now().UTC()}
			return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				return st.EmitTx(ctx, tx, e)
			})
		})
	})
	b.Run("emit-bare", func(b *testing.B) {
		// EmitTx's message alone, without its fence and mode read: what the fence costs.
		db := testenv.NewDB(b)
		k := "k"
		e := envelope.Event{MessageID: "m", Source: "ordering", Destination: "orders",
			Key: &k, EventType: "E", ContentType: envelope.ContentTypeJSON, Payload: payload, OccurredAt: time.Now().UTC()}
		content := logmsg.Append(nil, &e, nil)
		run(b, func(ctx context.Context, w, i int) error {
			return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'bench', $1::bytea)`, content)
				return err
			})
		})
	})
	for _, mode := range []Mode{ModeLog, ModeClaim} {
		b.Run(string(mode), func(b *testing.B) {
			db := testenv.NewDB(b)
			st, err := NewStore(db.Schema)
			require.NoError(b, err)
			if mode == ModeLog {
				useLogMode(b, db, st)
			}
			run(b, func(ctx context.Context, w, i int) error {
				k := "k" + strconv.Itoa(w)
				e := envelope.Event{MessageID: "m" + strconv.Itoa(i), Source: "ordering", Destination: "orders",
					Key: &k, EventType: "E", ContentType: envelope.ContentTypeJSON, Payload: payload, OccurredAt: time.Now().UTC()}
				return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					_, err := st.EnqueueTx(ctx, tx, e)
					return err
				})
			})
		})
	}
}

package outbox

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// Benchmarks of a deep backlog (the table a broker outage leaves behind), written without an
// ANALYZE afterwards: see BENCHMARKS.md, "Deep backlog". Run them with
//
//	go test ./outbox/ -run '^$' -bench 'DeepBacklog|DeepClaim|EnqueueNullKeys' -benchtime 1x -timeout 2h
//
// KEIRO_BENCH_DEEP_ROWS, KEIRO_BENCH_DEEP_KEYS and KEIRO_BENCH_DEEP_PAYLOADS (comma-separated)
// choose the cells; the defaults are 20000,200000 rows, 100,1000,10000 keys, 256,10240 bytes.

// envInts reads a comma-separated list of integers, or def when unset.
func envInts(tb testing.TB, name string, def ...int) []int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		require.NoError(tb, err, name)
		out = append(out, n)
	}
	return out
}

// fillDeep writes n rows of payload random (incompressible) bytes over keys keys through
// COPY (the insert trigger orders them as for any writer), in transactions of 10,000, and
// leaves the table's statistics as a fresh write leaves them: no ANALYZE.
func fillDeep(tb testing.TB, db *testenv.DB, n, keys, payload int) {
	tb.Helper()
	ctx := context.Background()
	cols := []string{"outbox_id", "message_id", "source", "destination", "message_key", "event_type",
		"schema_version", "content_type", "payload_bytes", "occurred_at"}
	buf := make([]byte, payload)
	now := time.Now().UTC()
	for i := 0; i < n; i += 10_000 {
		var rows [][]any
		for j := i; j < min(n, i+10_000); j++ {
			p := make([]byte, payload)
			_, _ = rand.Read(buf)
			copy(p, buf)
			copy(p, fmt.Sprintf(`{"i":%09d}`, j))
			rows = append(rows, []any{[16]byte(envelope.NewUUIDv7()), "m" + strconv.Itoa(j), "ordering", "orders",
				"k" + strconv.Itoa(j%keys), "E", int64(1), "application/json", p, now})
		}
		_, err := db.Pool.CopyFrom(ctx, pgx.Identifier{"keiro_outbox"}, cols, pgx.CopyFromRows(rows))
		require.NoError(tb, err)
	}
}

// BenchmarkDeepBacklogDrain drains a backlog of each size with a default relay, per key count
// and payload size: the rate at 200k (and 1M) rows should be at least 0.8× the rate at 20k.
// Besides msgs/s (which follows whatever else the machine runs) it reports what the drain
// cost per message, which does not: the CPU of this process and of the PostgreSQL processes
// serving it, the rate that CPU allows on the machine's cores, and the outbox's index pages
// read (the dead entries in front of the keys' heads cost pages). KEIRO_BENCH_VACUUM=-1 runs
// the relay without its own vacuum.
func BenchmarkDeepBacklogDrain(b *testing.B) {
	for _, payload := range envInts(b, "KEIRO_BENCH_DEEP_PAYLOADS", 256, 10240) {
		for _, keys := range envInts(b, "KEIRO_BENCH_DEEP_KEYS", 100, 1000, 10000) {
			for _, n := range envInts(b, "KEIRO_BENCH_DEEP_ROWS", 20_000, 200_000) {
				b.Run(fmt.Sprintf("payload=%d/keys=%d/rows=%d", payload, keys, n), func(b *testing.B) {
					for range b.N {
						b.StopTimer()
						kc := testenv.NewKafka(b)
						kc.CreateTopic(b, "orders", 6)
						db := testenv.NewDB(b)
						fillDeep(b, db, n, keys, payload)
						runtime.GC()
						f := drainRelays(b, db, kc, n, 1)
						b.ReportMetric(float64(n)/f.elapsed.Seconds(), "msgs/s")
						b.ReportMetric(float64(f.cpu.Microseconds())/float64(n), "cpu-us/msg")
						b.ReportMetric(float64((f.cpu-f.selfCPU).Microseconds())/float64(n), "pg-cpu-us/msg")
						b.ReportMetric(float64(f.cores)*float64(n)/f.cpu.Seconds(), "bound-msgs/s")
						b.ReportMetric(float64(f.idxBlocks)/float64(n), "idx-blks/msg")
						b.ReportMetric(float64(f.misses)/float64(n), "buf-misses/msg")
						b.ReportMetric(float64(f.vacuums), "vacuums")
					}
				})
			}
		}
	}
}

// BenchmarkDeepClaimLatency times the relay's claims when every key's head is in flight and
// nothing is claimable, on a backlog of 200,000 rows of 256 bytes over 1,000 keys (no ANALYZE),
// next to the same claims on an empty table: "front" is the bounded claim of the front of the
// backlog, "keys" the claim past the front (sqlClaimKeys), "walk" the former unbounded claim in
// seq order, kept as the reference.
func BenchmarkDeepClaimLatency(b *testing.B) {
	for _, n := range []int{0, envInts(b, "KEIRO_BENCH_DEEP_ROWS", 200_000)[0]} {
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) {
			db := testenv.NewDB(b)
			st, err := NewStore(db.Schema)
			require.NoError(b, err)
			ctx := context.Background()
			if n > 0 {
				fillDeep(b, db, n, 1000, 256)
				_, err = db.Pool.Exec(ctx, `UPDATE keiro_outbox SET status = 'publishing', claim_token = gen_random_uuid(),
    lease_until = now() + interval '1 hour' WHERE seq IN (SELECT min(seq) FROM keiro_outbox GROUP BY message_key)`)
				require.NoError(b, err)
			}
			for _, c := range []struct {
				name string
				sql  string
				args []any
			}{
				// The claims' parameters after the destinations: the scan budget and the
				// shares (none: every share) of the front and the walk; the shares and the key
				// cursor (from the first key) of the claim past the front.
				{"front", st.q.ClaimKey, []any{int64(DefaultMaxInFlightBatches * DefaultBatchSize), nil}},
				{"keys", st.q.ClaimKeys, []any{nil, "", ""}},
				{"walk", st.q.ClaimKey, []any{nil, nil}},
			} {
				b.Run(c.name, func(b *testing.B) {
					var total time.Duration
					for range b.N {
						args := append([]any{[16]byte(envelope.NewUUIDv7()), 10, int64(60e6), DefaultBatchSize, nil}, c.args...)
						batch := &pgx.Batch{}
						batch.Queue("BEGIN")
						batch.Queue("SET LOCAL enable_bitmapscan = off")
						batch.Queue("SET LOCAL enable_seqscan = off")
						batch.Queue(c.sql, args...)
						batch.Queue("COMMIT")
						start := time.Now()
						br := db.Pool.SendBatch(ctx, batch)
						for range 3 {
							_, err := br.Exec()
							require.NoError(b, err)
						}
						rows, err := claimsOf(st).ReadClaim(br)
						require.NoError(b, err)
						_, err = br.Exec()
						require.NoError(b, err)
						require.NoError(b, br.Close())
						total += time.Since(start)
						require.Empty(b, rows)
					}
					b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "claim-ms")
				})
			}
		})
	}
}

// BenchmarkEnqueueNullKeys writes 1,000 rows of 1 KiB without a key per transaction (the only
// rows migration outbox_heads makes cost more: they enter keiro_outbox_null_key_idx), next to
// keyed rows, with and without that index; run it with -count and alternate.
func BenchmarkEnqueueNullKeys(b *testing.B) {
	const perTx = 1000
	payload := make([]byte, 1024)
	for _, c := range []struct {
		name  string
		keyed bool
		index bool
	}{{"null-key/index", false, true}, {"null-key/no-index", false, false}, {"keyed/index", true, true}} {
		b.Run(c.name, func(b *testing.B) {
			db := testenv.NewDB(b)
			st, err := NewStore(db.Schema)
			require.NoError(b, err)
			ctx := context.Background()
			if !c.index {
				_, err := db.Pool.Exec(ctx, "DROP INDEX keiro_outbox_null_key_idx")
				require.NoError(b, err)
			}
			b.ResetTimer()
			for i := range b.N {
				evs := make([]envelope.Event, perTx)
				for j := range evs {
					var key *string
					if c.keyed {
						k := "k" + strconv.Itoa(j%100)
						key = &k
					}
					evs[j] = envelope.Event{MessageID: fmt.Sprintf("m%d-%d", i, j), Source: "ordering",
						Destination: "orders", Key: key, EventType: "E", ContentType: envelope.ContentTypeJSON,
						Payload: payload, OccurredAt: time.Now().UTC()}
				}
				require.NoError(b, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					_, err := st.EnqueueTx(ctx, tx, evs...)
					return err
				}))
			}
			b.ReportMetric(float64(b.N*perTx)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

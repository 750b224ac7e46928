package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/claimsql"
	"github.com/keiro-go/keiro/outbox/logrelay"
)

// Benchmarks of the relay next to their limits, measured in the same run. Run them with
//
//	go test ./outbox/ -run '^$' -bench . -benchtime 1x
//
// (add -short for smaller sizes). See BENCHMARKS.md, section "Relay".

func benchSizes() (rows, keys int) {
	rows, keys = 200_000, 10_000
	if testing.Short() {
		rows, keys = 20_000, 1_000
	}
	if k := envInt("KEIRO_BENCH_KEYS"); k > 0 {
		keys = k
	}
	return rows, keys
}

// fill enqueues n events of 1 KiB payload over keys keys, in transactions of 2,000, and
// analyzes the table (the steady state autovacuum keeps).
func fill(b testing.TB, db *testenv.DB, st *Store, topic string, n, keys int) {
	b.Helper()
	ctx := context.Background()
	payload := bytes.Repeat([]byte("x"), 1024-16)
	for i := 0; i < n; i += 2000 {
		evs := make([]envelope.Event, 0, 2000)
		for j := i; j < min(n, i+2000); j++ {
			k := "k" + strconv.Itoa(j%keys)
			evs = append(evs, envelope.Event{MessageID: "m" + strconv.Itoa(j), Source: "ordering",
				Destination: topic, Key: &k, EventType: "E", ContentType: envelope.ContentTypeJSON,
				Payload: append([]byte(fmt.Sprintf(`{"i":%09d}`, j)), payload...), OccurredAt: time.Now().UTC()})
		}
		require.NoError(b, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := st.EnqueueTx(ctx, tx, evs...)
			return err
		}))
	}
	_, err := db.Pool.Exec(ctx, "ANALYZE keiro_outbox")
	require.NoError(b, err)
}

// filledOutbox returns a fresh schema whose outbox holds n rows over keys keys (see fill).
func filledOutbox(b testing.TB, n, keys int) (*testenv.DB, *Store) {
	b.Helper()
	db := testenv.NewDB(b)
	st, err := NewStore(db.Schema)
	require.NoError(b, err)
	fill(b, db, st, "orders", n, keys)
	return db, st
}

// rssMB returns the process's resident set size in MiB.
func rssMB() float64 {
	data, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	pages, _ := strconv.ParseFloat(f[1], 64)
	return pages * float64(os.Getpagesize()) / (1 << 20)
}

// drainRelay runs a relay over n pre-enqueued rows until all are published and returns the
// elapsed time and the peak RSS seen meanwhile.
func drainRelay(b *testing.B, db *testenv.DB, kc *testenv.Kafka, n int, tweaks ...func(*RelayConfig)) (time.Duration, float64) {
	client := kc.NewClient(b, ProducerOpts()...)
	var published atomic.Int64
	all := make(chan struct{})
	cfg := RelayConfig{Schema: db.Schema, OnBatch: func(br BatchResult) {
		if published.Add(int64(br.Published)) == int64(n) {
			close(all)
		}
	}}
	cfg.BatchSize, cfg.MaxInFlightBatches = envInt("KEIRO_BENCH_BATCH"), envInt("KEIRO_BENCH_INFLIGHT")
	cfg.ClaimConcurrency = envInt("KEIRO_BENCH_CLAIMERS")
	cfg.VacuumThreshold = int64(envInt("KEIRO_BENCH_VACUUM")) // -1: the relay never vacuums
	if p := os.Getenv("KEIRO_BENCH_POLICY"); p != "" {
		policy, err := ParsePolicy(p)
		require.NoError(b, err)
		cfg.Policy = policy
	}
	if os.Getenv("KEIRO_BENCH_DEBUG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	for _, tweak := range tweaks {
		tweak(&cfg)
	}
	r, err := NewRelay(db.Pool, client, cfg)
	require.NoError(b, err)
	r.claims.WalkDeep = os.Getenv("KEIRO_BENCH_CLAIM") == "walk" // the claim before "Deep backlog"
	var peak atomic.Uint64
	stopSampling := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-t.C:
				if v := uint64(rssMB()); v > peak.Load() {
					peak.Store(v)
				}
			}
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	b.StartTimer()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-all
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	require.NoError(b, <-done)
	close(stopSampling)
	wg.Wait()
	if v := r.Stats().Vacuums; v > 0 {
		b.ReportMetric(float64(v), "vacuums")
	}
	return elapsed, float64(peak.Load())
}

// envInt reads an integer setting of a benchmark experiment (0 when unset: the default).
func envInt(name string) int {
	n, _ := strconv.Atoi(os.Getenv(name))
	return n
}

// rawClaim and rawMark are the simplest correct SKIP LOCKED claim and mark (no ordering, no
// lease expiry, no attempt ceiling): the limit the relay's drain rate is compared with. The
// claim returns the columns a publisher needs. rawLockClaim and rawLockMark are the simplest
// single-write loop: the claim only locks (SELECT … FOR UPDATE SKIP LOCKED) in a transaction
// that the mark commits, so each row is written once (unordered, no lease: a publisher must
// hold the transaction open across the produce).
const (
	// rawClaimUpdate is the raw claim's write, without its RETURNING.
	rawClaimUpdate = `
UPDATE %[1]s.keiro_outbox o SET status = 'publishing', claim_token = $1,
    lease_until = now() + interval '1 minute', attempt_count = o.attempt_count + 1, updated_at = now()
WHERE o.outbox_id IN (
    SELECT outbox_id FROM %[1]s.keiro_outbox
    WHERE phase = 0 AND status IN ('pending', 'failed') AND next_attempt_at <= now()
    ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED)`
	rawClaim = rawClaimUpdate + `
RETURNING o.outbox_id, o.seq, o.source, o.message_id, o.destination, o.message_key, o.event_type,
    o.content_type, o.traceparent, o.tracestate, o.payload_bytes, o.attributes, o.occurred_at, o.created_at`
	rawMark = `
UPDATE %[1]s.keiro_outbox o SET status = 'sent', published_at = now(), claim_token = NULL,
    lease_until = NULL, kafka_partition = 0, kafka_offset = m.off, updated_at = now()
FROM unnest($2::uuid[], $3::bigint[]) AS m(id, off)
WHERE o.outbox_id = m.id AND o.claim_token = $1`
	rawLockClaim = `
SELECT o.outbox_id, o.seq, o.source, o.message_id, o.destination, o.message_key, o.event_type,
    o.content_type, o.traceparent, o.tracestate, o.payload_bytes, o.attributes, o.occurred_at, o.created_at
FROM %[1]s.keiro_outbox o
WHERE phase = 0 AND status IN ('pending', 'failed') AND next_attempt_at <= now()
ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED`
	rawLockMark = `
UPDATE %[1]s.keiro_outbox o SET status = 'sent', published_at = now(), attempt_count = o.attempt_count + 1,
    kafka_partition = 0, kafka_offset = m.off, updated_at = now()
FROM unnest($1::uuid[], $2::bigint[]) AS m(id, off)
WHERE o.outbox_id = m.id`
)

// payloadClaim, with payloadReshape, is rawClaim with the payload kept in a companion table
// (bench_payload) instead of the outbox row: the claim and the mark still write the row (its
// status, token and lease stay in it), but the row they rewrite is a few hundred bytes, not the
// payload's kilobyte. At wal_level = logical PostgreSQL logs every updated row whole, so this
// is what the two writes cost in WAL when the payload is not in the row. The claim reads the
// payload through the companion table's primary key, as a publisher must. payloadReshape moves
// the filled rows' payloads there and rewrites the table (VACUUM FULL) before the meters start.
var payloadReshape = []string{
	`CREATE TABLE %[1]s.bench_payload (outbox_id uuid PRIMARY KEY, payload_bytes bytea NOT NULL)`,
	`INSERT INTO %[1]s.bench_payload SELECT outbox_id, payload_bytes FROM %[1]s.keiro_outbox`,
	`UPDATE %[1]s.keiro_outbox SET payload_bytes = ''`,
	`VACUUM FULL %[1]s.keiro_outbox`,
	`ANALYZE %[1]s.keiro_outbox`,
	`ANALYZE %[1]s.bench_payload`,
}

const payloadClaim = `
WITH c AS (` + rawClaimUpdate + `
    RETURNING o.outbox_id, o.seq, o.source, o.message_id, o.destination, o.message_key, o.event_type,
        o.content_type, o.traceparent, o.tracestate, o.attributes, o.occurred_at, o.created_at)
SELECT c.outbox_id, c.seq, c.source, c.message_id, c.destination, c.message_key, c.event_type,
    c.content_type, c.traceparent, c.tracestate, p.payload_bytes, c.attributes, c.occurred_at, c.created_at
FROM c JOIN %[1]s.bench_payload p ON p.outbox_id = c.outbox_id`

// leaseClaim and leaseMark are the ceiling of an ordered design that writes each row once and
// holds no transaction across the produce: a claim writes one lease row (token, deadline, the
// claimed seqs) instead of updating its rows, and excludes the rows of live leases; claims are
// serialized by a transaction-scoped advisory lock (taken in its own statement, so the claim's
// snapshot sees every earlier claim's lease); the mark deletes the lease and writes the outcome,
// and applies nothing if the lease is gone. Per-key heads as in the relay's claim (a LATERAL head
// lookup per candidate), no gap probe, no attempt ceiling, no reclaim of expired leases' attempts.
const (
	leaseTable = `CREATE TABLE %[1]s.bench_lease (token uuid PRIMARY KEY, lease_until timestamptz NOT NULL,
    seqs bigint[] NOT NULL)`
	leaseClaim = `
WITH leased AS MATERIALIZED (
    SELECT unnest(seqs) AS seq FROM %[1]s.bench_lease WHERE lease_until > now()
), candidate AS (
    SELECT r.outbox_id, r.seq, r.source, r.message_id, r.destination, r.message_key, r.event_type,
        r.content_type, r.traceparent, r.tracestate, r.payload_bytes, r.attributes, r.occurred_at, r.created_at
    FROM %[1]s.keiro_outbox r LEFT JOIN LATERAL (
        SELECT (h.status IN ('pending', 'failed') AND h.next_attempt_at <= now()
                AND h.seq NOT IN (SELECT seq FROM leased)) AS ok
        FROM %[1]s.keiro_outbox h
        WHERE h.source = r.source AND h.message_key = r.message_key AND h.phase = 0
        ORDER BY h.source, h.message_key, h.seq LIMIT 1) head ON true
    WHERE r.phase = 0 AND r.status IN ('pending', 'failed') AND r.next_attempt_at <= now()
      AND r.seq NOT IN (SELECT seq FROM leased)
      AND (r.message_key IS NULL OR head.ok)
    ORDER BY r.seq LIMIT $2
), lease AS (
    INSERT INTO %[1]s.bench_lease (token, lease_until, seqs)
    SELECT $1, now() + interval '1 minute', array_agg(seq) FROM candidate HAVING count(*) > 0
)
SELECT * FROM candidate ORDER BY seq`
	leaseMark = `
WITH l AS (DELETE FROM %[1]s.bench_lease WHERE token = $1 RETURNING token)
UPDATE %[1]s.keiro_outbox o SET status = 'sent', published_at = now(), attempt_count = o.attempt_count + 1,
    kafka_partition = 0, kafka_offset = m.off, updated_at = now()
FROM unnest($2::uuid[], $3::bigint[]) AS m(id, off), l
WHERE o.outbox_id = m.id`
)

// leaseDrain drains n rows with workers loops of the lease-table claim and mark.
func leaseDrain(b *testing.B, db *testenv.DB, n, workers int) float64 {
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, fmt.Sprintf(leaseTable, db.Schema))
	require.NoError(b, err)
	claimSQL, markSQL := fmt.Sprintf(leaseClaim, db.Schema), fmt.Sprintf(leaseMark, db.Schema)
	var done atomic.Int64
	start := time.Now()
	require.NoError(b, parallel(workers, func(int) error {
		for done.Load() < int64(n) {
			tok := [16]byte(envelope.NewUUIDv7())
			var ids [][16]byte
			var offs []int64
			batch := &pgx.Batch{} // one implicit transaction: the lock is held until the claim commits
			batch.Queue(`SELECT pg_advisory_xact_lock(hashtext('keiro.bench.lease'))`)
			batch.Queue(claimSQL, tok, DefaultBatchSize).Query(func(rows pgx.Rows) error {
				for rows.Next() {
					ids = append(ids, [16]byte(rows.RawValues()[0]))
					offs = append(offs, int64(len(offs)))
				}
				return rows.Err()
			})
			if err := db.Pool.SendBatch(ctx, batch).Close(); err != nil {
				return err
			}
			if len(ids) == 0 {
				return nil // the rest is leased by (or blocked behind) the other worker's batches
			}
			tag, err := db.Pool.Exec(ctx, markSQL, tok, ids, offs)
			if err != nil {
				return err
			}
			done.Add(tag.RowsAffected())
		}
		return nil
	}))
	return float64(n) / time.Since(start).Seconds()
}

// rawDrain drains n rows with workers loops of claim + mark, each pair in one transaction if
// inTx (the single-write loop), else as two statements (two transactions).
func rawDrain(b *testing.B, pool *pgxpool.Pool, schema string, n, workers int, claim, mark string, inTx bool) float64 {
	claimSQL, markSQL := fmt.Sprintf(claim, schema), fmt.Sprintf(mark, schema)
	ctx := context.Background()
	var done atomic.Int64
	start := time.Now()
	require.NoError(b, parallel(workers, func(int) error {
		for done.Load() < int64(n) {
			// The two-write loop fences its mark with a claim token; the single-write one
			// needs none (its transaction holds the locks).
			var tok []any
			if !inTx {
				tok = []any{[16]byte(envelope.NewUUIDv7())}
			}
			step := func(q keiro.DB) (int64, error) {
				rows, err := q.Query(ctx, claimSQL, append(tok, DefaultBatchSize)...)
				if err != nil {
					return 0, err
				}
				var ids [][16]byte
				var offs []int64
				for rows.Next() {
					ids = append(ids, [16]byte(rows.RawValues()[0]))
					offs = append(offs, int64(len(offs)))
				}
				if err := rows.Err(); err != nil {
					return 0, err
				}
				tag, err := q.Exec(ctx, markSQL, append(tok, ids, offs)...)
				return tag.RowsAffected(), err
			}
			var got int64
			var err error
			if inTx {
				err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { got, err = step(tx); return err })
			} else {
				got, err = step(pool)
			}
			if err != nil {
				return err
			}
			if got == 0 {
				return nil // the rest is locked by the other workers
			}
			done.Add(got)
		}
		return nil
	}))
	return float64(n) / time.Since(start).Seconds()
}

// parallel runs f(0) … f(workers-1) at once and returns their errors joined: a benchmark's
// workers report failures to the benchmark goroutine instead of calling FailNow themselves.
func parallel(workers int, f func(worker int) error) error {
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() { errs[w] = f(w) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// BenchmarkDrain drains pre-enqueued rows (1 KiB payload, default policy) with the relay and,
// in the same run, with raw loops (the limits, no ordering, no Kafka): raw-skip-locked is the
// simplest SKIP LOCKED claim + mark (two writes per row) in one loop, -x2 and -x4 in two and
// four concurrent loops (the relay pipelines too; with their CPU and WAL per message, the limit
// of relays-N's scale-out on this machine); raw-locked-tx-x2 is the single-write loop in two;
// lease-table-x2 an ordered single-write design in two (see leaseClaim); raw-payload-table the
// two-write loop with the payload out of the row (see payloadClaim). claim-mark
// is the relay's own claim and mark statements in one loop, without Kafka. All use the
// relay's batch size. relays-1, relays-2 and relays-4 are that many relays on the backlog, with
// the CPU per message and the bound it sets (benchRelays).
func BenchmarkDrain(b *testing.B) {
	n, keys := benchSizes()
	raw := func(name string, workers int, claim, mark string, inTx bool, reshape ...string) {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			for range b.N {
				b.StopTimer()
				db, _ := filledOutbox(b, n, keys)
				for _, q := range reshape {
					_, err := db.Pool.Exec(ctx, fmt.Sprintf(q, db.Schema))
					require.NoError(b, err)
				}
				pc, err := pgxpool.ParseConfig(db.ConnString)
				require.NoError(b, err)
				pc.ConnConfig.RuntimeParams["application_name"] = "bench-raw-drain"
				pool, err := pgxpool.NewWithConfig(ctx, pc)
				require.NoError(b, err)
				walConn, err := db.Pool.Acquire(ctx)
				require.NoError(b, err)
				b.Cleanup(walConn.Release) // before the pool's own cleanup closes it
				wm, err := testenv.StartWAL(ctx, walConn, db.Schema)
				require.NoError(b, err)
				m := testenv.StartCPU(b, db, "bench-raw-drain")
				b.StartTimer()
				rate := rawDrain(b, pool, db.Schema, n, workers, claim, mark, inTx)
				b.StopTimer()
				cf := m.Stop(b)
				wf, err := wm.Stop(ctx, walConn)
				require.NoError(b, err)
				walConn.Release()
				pool.Close()
				b.ReportMetric(rate, "msgs/s")
				b.ReportMetric(cf.PerMessage(n), "cpu-us/msg")
				b.ReportMetric(cf.PostgresPerMessage(n), "pg-cpu-us/msg")
				b.ReportMetric(wf.PerMessage(n), "wal-B/msg")
			}
		})
	}
	raw("raw-skip-locked", 1, rawClaim, rawMark, false)
	raw("raw-skip-locked-x2", 2, rawClaim, rawMark, false)
	raw("raw-skip-locked-x4", 4, rawClaim, rawMark, false)
	raw("raw-locked-tx-x2", 2, rawLockClaim, rawLockMark, true)
	raw("raw-payload-table", 1, payloadClaim, rawMark, false, payloadReshape...)
	b.Run("lease-table-x2", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			db, _ := filledOutbox(b, n, keys)
			b.StartTimer()
			b.ReportMetric(leaseDrain(b, db, n, 2), "msgs/s")
		}
	})
	b.Run("claim-mark", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			db, st := filledOutbox(b, n, keys)
			ctx := context.Background()
			b.StartTimer()
			start := time.Now()
			done := 0
			for done < n {
				tok, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, DefaultBatchSize, DefaultLease, DefaultMaxAttempts, nil, 0)
				require.NoError(b, err)
				marks := make([]claimsql.Mark, len(rows))
				for i, r := range rows {
					marks[i] = claimsql.Mark{ID: r.ID, Outcome: outcomeSent, Offset: int64(i)}
				}
				tr, err := claimsOf(st).MarkBatch(ctx, db.Pool, tok, marks, DefaultMaxAttempts)
				require.NoError(b, err)
				done += tr.Sent
			}
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "msgs/s")
		}
	})
	relay := func(name string, tweaks ...func(*RelayConfig)) {
		b.Run(name, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				kc := testenv.BenchKafka(b, testenv.KafkaConfig{})
				kc.CreateTopic(b, "orders", 6)
				db, _ := filledOutbox(b, n, keys)
				runtime.GC()
				base := rssMB()
				elapsed, peak := drainRelay(b, db, kc, n, tweaks...)
				b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
				b.ReportMetric(peak, "peakRSS-MiB")
				b.ReportMetric(base, "startRSS-MiB")
			}
		})
	}
	relay("relay")
	// The same drain publishing in Kafka transactions (RelayConfig.ExactlyOnce).
	relay("relay-exactly-once", func(c *RelayConfig) { c.ExactlyOnce = true })
	benchRelays(b, n, keys)
}

// BenchmarkSteadyLatency offers a steady rate and measures enqueue commit → broker ack latency
// per message: the commit time is taken by the producer when its transaction commits, the ack
// time by the relay's Kafka client when the broker acknowledges the record (a produce hook, the
// same in both modes). Variants: 2,000 msgs/s from 4 producers × 5 rows per transaction every
// 10 ms, 200 keys; 20 producers × 1 row every 10 ms, each transaction doing 2 ms of other work
// after the enqueue (producers are nearly always inside a transaction that did not notify, the
// sleep lock's hardest case); and 1,000 msgs/s (4 producers × 5 rows every 20 ms) to the claim
// relay and to log mode, one after the other in the same run. The "visible" variants measure
// enqueue commit → a read_committed consumer's fetch instead, at least once and exactly once
// (where a record is visible only once its Kafka transaction committed).
func BenchmarkSteadyLatency(b *testing.B) {
	for _, c := range []struct {
		name             string
		producers, perTx int
		inTxWork         time.Duration
		period           time.Duration
		mode             Mode
		eo, visible      bool
	}{{"4x5", 4, 5, 0, 10 * time.Millisecond, ModeClaim, false, false},
		{"20x1-busy-tx", 20, 1, 2 * time.Millisecond, 10 * time.Millisecond, ModeClaim, false, false},
		{"1k-claim", 4, 5, 0, 20 * time.Millisecond, ModeClaim, false, false},
		{"1k-log", 4, 5, 0, 20 * time.Millisecond, ModeLog, false, false},
		{"1k-log-visible", 4, 5, 0, 20 * time.Millisecond, ModeLog, false, true},
		{"1k-log-exactly-once-visible", 4, 5, 0, 20 * time.Millisecond, ModeLog, true, true}} {
		b.Run(c.name, func(b *testing.B) {
			steadyLatency(b, c.mode, c.eo, c.visible, c.producers, c.perTx, c.period, c.inTxWork)
		})
	}
}

func steadyLatency(b *testing.B, mode Mode, eo, visible bool, producers, perTx int, period, inTxWork time.Duration) {
	dur := 10 * time.Second
	if testing.Short() {
		dur = 3 * time.Second
	}
	if v := envInt("KEIRO_BENCH_STEADY_SECONDS"); v > 0 {
		dur = time.Duration(v) * time.Second
	}
	for range b.N {
		db := testenv.NewDB(b)
		kc := testenv.BenchKafka(b, testenv.KafkaConfig{})
		kc.CreateTopic(b, "orders", 6)
		st, err := NewStore(db.Schema)
		require.NoError(b, err)
		if mode == ModeLog {
			useLogMode(b, db, st)
		}
		var mu sync.Mutex
		committed := map[string]time.Time{}
		acked := map[string]time.Time{}
		var lat []time.Duration
		onAck := func(id string) {
			now := time.Now()
			mu.Lock()
			if c, ok := committed[id]; ok {
				lat = append(lat, now.Sub(c))
				delete(committed, id)
			} else {
				acked[id] = now // acked before the producer recorded its commit
			}
			mu.Unlock()
		}
		opts := ProducerOpts()
		if !visible {
			opts = append(opts, kgo.WithHooks(ackHook(onAck)))
		}
		client := kc.NewClient(b, opts...)
		r, err := NewRelay(db.Pool, client, RelayConfig{Schema: db.Schema, Mode: mode, LogEngine: logrelay.Engine,
			ClaimConcurrency: envInt("KEIRO_BENCH_CLAIMERS"), ExactlyOnce: eo})
		require.NoError(b, err)
		ctx, cancel := context.WithCancel(context.Background())
		if visible {
			reader := kc.NewClient(b, kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
				kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(100*time.Millisecond))
			readerDone := make(chan struct{})
			b.Cleanup(func() { <-readerDone })
			go func() {
				defer close(readerDone)
				for ctx.Err() == nil {
					reader.PollFetches(ctx).EachRecord(func(rec *kgo.Record) { ackHook(onAck).OnProduceRecordUnbuffered(rec, nil) })
				}
			}()
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		b.ResetTimer()
		// Each producer commits perTx rows every period, even when one commit takes longer
		// than its tick.
		end := time.Now().Add(dur)
		payload := bytes.Repeat([]byte("x"), 1000)
		var offered atomic.Int64
		var pw sync.WaitGroup
		for p := range producers {
			pw.Add(1)
			go func() {
				defer pw.Done()
				tick := time.NewTicker(period)
				defer tick.Stop()
				for i := 0; time.Now().Before(end); {
					<-tick.C
					evs := make([]envelope.Event, perTx)
					for j := range evs {
						k := "k" + strconv.Itoa((p*50+i)%200)
						evs[j] = envelope.Event{MessageID: fmt.Sprintf("m%d-%d", p, i), Source: "ordering", Destination: "orders",
							Key: &k, EventType: "E", ContentType: envelope.ContentTypeJSON, Payload: payload, OccurredAt: time.Now().UTC()}
						i++
					}
					err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
						_, err := st.EnqueueTx(ctx, tx, evs...)
						time.Sleep(inTxWork)
						return err
					})
					if err != nil {
						b.Error(err)
						return
					}
					now := time.Now()
					offered.Add(int64(len(evs)))
					mu.Lock()
					for _, e := range evs {
						if a, ok := acked[e.MessageID]; ok {
							lat = append(lat, max(0, a.Sub(now)))
							delete(acked, e.MessageID)
						} else {
							committed[e.MessageID] = now
						}
					}
					mu.Unlock()
				}
			}()
		}
		pw.Wait()
		i := int(offered.Load())
		b.StopTimer()
		// Let the last commits' records be acknowledged (at most a second).
		for t := time.Now(); time.Since(t) < time.Second; time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			left := len(committed)
			mu.Unlock()
			if left == 0 {
				break
			}
		}
		cancel()
		require.NoError(b, <-done)
		mu.Lock()
		slices.Sort(lat)
		if len(lat) > 0 {
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(len(lat))/dur.Seconds(), "acked-msgs/s")
		}
		b.ReportMetric(float64(len(committed)), "unacked")
		b.ReportMetric(float64(i)/dur.Seconds(), "offered-msgs/s")
		mu.Unlock()
	}
}

// ackHook calls f with the message id of every record the broker acknowledged.
type ackHook func(messageID string)

// OnProduceRecordUnbuffered implements kgo.HookProduceRecordUnbuffered.
func (f ackHook) OnProduceRecordUnbuffered(rec *kgo.Record, err error) {
	if err != nil {
		return
	}
	for _, h := range rec.Headers {
		if h.Key == envelope.HeaderMessageID {
			f(string(h.Value))
			return
		}
	}
}

// BenchmarkHotKey drains 2,000 rows of a single key.
func BenchmarkHotKey(b *testing.B) {
	for range b.N {
		b.StopTimer()
		db := testenv.NewDB(b)
		kc := testenv.BenchKafka(b, testenv.KafkaConfig{})
		kc.CreateTopic(b, "orders", 6)
		st, err := NewStore(db.Schema)
		require.NoError(b, err)
		fill(b, db, st, "orders", 2000, 1)
		elapsed, _ := drainRelay(b, db, kc, 2000)
		b.ReportMetric(float64(elapsed.Milliseconds()), "drain-ms")
	}
}

// BenchmarkClaimLatency measures one claim of 512 rows (the release that makes them claimable
// again is not timed) on a table that also retains many sent rows, next to the same claim on a
// table without them. KEIRO_BENCH_PLAN=1 logs the EXPLAIN ANALYZE of the claim.
func BenchmarkClaimLatency(b *testing.B) {
	retained := 1_000_000
	if testing.Short() {
		retained = 100_000
	}
	for _, sent := range []int{0, retained} {
		b.Run(fmt.Sprintf("sent=%d", sent), func(b *testing.B) {
			db := testenv.NewDB(b)
			st, err := NewStore(db.Schema)
			require.NoError(b, err)
			ctx := context.Background()
			if sent > 0 {
				_, err := db.Pool.Exec(ctx, fmt.Sprintf(`
INSERT INTO keiro_outbox (outbox_id, message_id, source, destination, message_key, event_type,
    schema_version, content_type, payload_bytes, occurred_at, status, published_at, attempt_count)
SELECT gen_random_uuid(), 's' || g, 'ordering', 'orders', 'k' || (g %% 10000), 'E', 1,
    'application/json', convert_to(repeat('x', 1000), 'UTF8'), now(), 'sent', now(), 1
FROM generate_series(1, %d) g`, sent))
				require.NoError(b, err)
			}
			fill(b, db, st, "orders", 2048, 1000)
			_, err = db.Pool.Exec(ctx, "VACUUM ANALYZE keiro_outbox")
			require.NoError(b, err)
			// Write the loaded table back now, so the timed claims do not share the disk with
			// the background write-back of a just-loaded 1M-row table.
			_, err = db.Pool.Exec(ctx, "CHECKPOINT")
			require.NoError(b, err)
			var plan strings.Builder
			rows, err := db.Pool.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+st.q.ClaimKey,
				[16]byte(envelope.NewUUIDv7()), 10, int64(60e6), 512, nil, nil)
			require.NoError(b, err)
			for rows.Next() {
				var l string
				require.NoError(b, rows.Scan(&l))
				plan.WriteString(l + "\n")
			}
			require.NoError(b, rows.Err())
			require.NotContains(b, plan.String(), "Seq Scan on keiro_outbox r")
			if os.Getenv("KEIRO_BENCH_PLAN") != "" {
				b.Log("\n" + plan.String())
			}
			_, err = db.Pool.Exec(ctx, "UPDATE keiro_outbox SET status = 'pending', claim_token = NULL, lease_until = NULL WHERE status = 'publishing'")
			require.NoError(b, err)
			b.ResetTimer()
			var total time.Duration
			for range b.N {
				start := time.Now()
				tok, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 512, time.Minute, 1<<30, nil, 0)
				total += time.Since(start)
				require.NoError(b, err)
				require.NotEmpty(b, rows)
				b.StopTimer()
				marks := make([]claimsql.Mark, len(rows))
				for i, r := range rows {
					marks[i] = claimsql.Mark{ID: r.ID, Outcome: outcomeReleased}
				}
				_, err = claimsOf(st).MarkBatch(ctx, db.Pool, tok, marks, 1<<30)
				require.NoError(b, err)
				b.StartTimer()
			}
			b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "claim-ms")
		})
	}
}

// BenchmarkEnqueue writes 1,000 events of 1 KiB per transaction with EnqueueTx (per-key locks,
// NOTIFY, duplicate detection) and, as its limit, with a plain INSERT … SELECT FROM unnest of the
// same columns (no locks, no NOTIFY) into the same table.
func BenchmarkEnqueue(b *testing.B) {
	const perTx = 1000
	payload := bytes.Repeat([]byte("x"), 1024)
	events := func(round int) []envelope.Event {
		evs := make([]envelope.Event, perTx)
		for j := range evs {
			k := "k" + strconv.Itoa(j%100)
			evs[j] = envelope.Event{MessageID: fmt.Sprintf("m%d-%d", round, j), Source: "ordering",
				Destination: "orders", Key: &k, EventType: "E", ContentType: envelope.ContentTypeJSON,
				Payload: payload, OccurredAt: time.Now().UTC()}
		}
		return evs
	}
	b.Run("enqueue-tx", func(b *testing.B) {
		db := testenv.NewDB(b)
		st, err := NewStore(db.Schema)
		require.NoError(b, err)
		ctx := context.Background()
		b.ResetTimer()
		for i := range b.N {
			evs := events(i)
			require.NoError(b, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := st.EnqueueTx(ctx, tx, evs...)
				return err
			}))
		}
		b.ReportMetric(float64(b.N*perTx)/b.Elapsed().Seconds(), "events/s")
	})
	b.Run("raw-insert", func(b *testing.B) {
		db := testenv.NewDB(b)
		ctx := context.Background()
		q := fmt.Sprintf(`INSERT INTO %s.keiro_outbox (outbox_id, message_id, source, destination, message_key,
    event_type, schema_version, content_type, payload_bytes, occurred_at)
SELECT u.id, u.mid, 'ordering', 'orders', u.k, 'E', 1, 'application/json', u.p, now()
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[]) AS u(id, mid, k, p)`, db.Schema)
		b.ResetTimer()
		for i := range b.N {
			ids, mids, keys, payloads := make([][16]byte, perTx), make([]string, perTx), make([]string, perTx), make([][]byte, perTx)
			for j := range perTx {
				ids[j] = envelope.NewUUIDv7()
				mids[j] = fmt.Sprintf("m%d-%d", i, j)
				keys[j] = "k" + strconv.Itoa(j%100)
				payloads[j] = payload
			}
			_, err := db.Pool.Exec(ctx, q, ids, mids, keys, payloads)
			require.NoError(b, err)
		}
		b.ReportMetric(float64(b.N*perTx)/b.Elapsed().Seconds(), "events/s")
	})
}

// BenchmarkEnqueueConcurrent commits small transactions (one 200-byte event each, a key per
// producer) from 16 producers at once, with EnqueueTx's NOTIFY (the default), without it
// (StoreOptions.DisableNotify, relays poll), and without it but with one Store.Notify per
// commit, next to a raw BEGIN, INSERT of the same row, COMMIT (the limit: a producer's
// transaction has the same round trips).
func BenchmarkEnqueueConcurrent(b *testing.B) {
	const producers = 16
	payload := bytes.Repeat([]byte("x"), 200)
	type commitFunc func(ctx context.Context, p, i int) error
	run := func(b *testing.B, setup func(db *testenv.DB) commitFunc) {
		commit := setup(testenv.NewDB(b))
		ctx := context.Background()
		var next atomic.Int64
		b.ResetTimer()
		require.NoError(b, parallel(producers, func(p int) error {
			for {
				i := int(next.Add(1))
				if i > b.N {
					return nil
				}
				if err := commit(ctx, p, i); err != nil {
					return err
				}
			}
		}))
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
	}
	// Variants: the default store with no relay listening (nothing notifies), with a relay
	// asleep (the sleep lock held: every transaction notifies), with a real relay draining the
	// table at the same time (it sleeps and wakes with the load), and with notifications off.
	for _, c := range []struct {
		name        string
		opts        StoreOptions
		asleep      bool
		relay       bool
		notifyAfter bool
	}{{name: "relay-awake"}, {name: "relay-asleep", asleep: true}, {name: "relay-running", relay: true},
		{name: "relay-running-no-notify", opts: StoreOptions{DisableNotify: true}, relay: true},
		{name: "no-notify", opts: StoreOptions{DisableNotify: true}},
		{name: "notify-after-commit", opts: StoreOptions{DisableNotify: true}, notifyAfter: true}} {
		b.Run(c.name, func(b *testing.B) {
			run(b, func(db *testenv.DB) commitFunc {
				st, err := NewStore(db.Schema, c.opts)
				require.NoError(b, err)
				if c.asleep {
					conn, err := pgx.Connect(context.Background(), db.ConnString)
					require.NoError(b, err)
					b.Cleanup(func() { conn.Close(context.Background()) })
					var got string
					require.NoError(b, conn.QueryRow(context.Background(), st.q.SleepLock).Scan(&got))
					require.Equal(b, "taken", got)
				}
				if c.relay {
					kc := testenv.NewKafka(b)
					kc.CreateTopic(b, "orders", 6)
					r, err := NewRelay(db.Pool, kc.NewClient(b, ProducerOpts()...), RelayConfig{Schema: db.Schema,
						Logger: slog.New(slog.DiscardHandler)})
					require.NoError(b, err)
					runRelay(b, r)
				}
				return func(ctx context.Context, p, i int) error {
					k := "k" + strconv.Itoa(p)
					e := envelope.Event{MessageID: "m" + strconv.Itoa(i), Source: "ordering", Destination: "orders",
						Key: &k, EventType: "E", ContentType: envelope.ContentTypeJSON, Payload: payload, OccurredAt: time.Now().UTC()}
					if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
						_, err := st.EnqueueTx(ctx, tx, e)
						return err
					}); err != nil {
						return err
					}
					if c.notifyAfter {
						return st.Notify(ctx, db.Pool)
					}
					return nil
				}
			})
		})
	}
	b.Run("raw-insert", func(b *testing.B) {
		run(b, func(db *testenv.DB) commitFunc {
			q := fmt.Sprintf(`INSERT INTO %s.keiro_outbox (outbox_id, message_id, source, destination,
    message_key, event_type, schema_version, content_type, payload_bytes, occurred_at)
VALUES ($1, $2, 'ordering', 'orders', $3, 'E', 1, 'application/json', $4, now())`, db.Schema)
			return func(ctx context.Context, p, i int) error {
				return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, q, [16]byte(envelope.NewUUIDv7()), "m"+strconv.Itoa(i), "k"+strconv.Itoa(p), payload)
					return err
				})
			}
		})
	})
}

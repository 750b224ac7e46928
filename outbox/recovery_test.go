package outbox_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// TestRelayCrashRecoveryThroughLease: a relay "crashed" after claiming a batch and producing
// part of it (the rows stay publishing, some records are on Kafka). Once the lease expires a new
// relay re-claims the rows: every committed row reaches Kafka, and the only duplicates are
// records of the crashed relay's in-flight batch.
func TestRelayCrashRecoveryThroughLease(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 3)
	const n = 400
	enqueue(t, db.Pool, st, keyedEvents("orders", n, 10)...)
	ctx := context.Background()

	// The crashed relay's claim: the first 100 rows, publishing under a lease now expired.
	rows, err := db.Pool.Query(ctx, `
UPDATE keiro_outbox SET status = 'publishing', attempt_count = 1, claim_token = gen_random_uuid(),
    lease_until = now() - interval '1 second'
WHERE seq IN (SELECT seq FROM keiro_outbox ORDER BY seq LIMIT 100)
RETURNING message_id, message_key, payload_bytes, seq`)
	require.NoError(t, err)
	type inflight struct {
		id, key string
		value   []byte
		seq     int64
	}
	var batch []inflight
	for rows.Next() {
		var f inflight
		require.NoError(t, rows.Scan(&f.id, &f.key, &f.value, &f.seq))
		batch = append(batch, f)
	}
	require.NoError(t, rows.Err())
	require.Len(t, batch, 100)
	// It had produced the first half (in seq order, as franz-go would per partition).
	inFlight := map[string]bool{}
	pc := kc.NewClient(t)
	for i := range batch {
		for j := i + 1; j < len(batch); j++ {
			if batch[j].seq < batch[i].seq {
				batch[i], batch[j] = batch[j], batch[i]
			}
		}
	}
	for _, f := range batch[:50] {
		h := []kgo.RecordHeader{{Key: "keiro-message-id", Value: []byte(f.id)}, {Key: "keiro-source", Value: []byte("ordering")},
			{Key: "keiro-destination", Value: []byte("orders")}, {Key: "keiro-event-type", Value: []byte("OrderPlaced")},
			{Key: "keiro-schema-version", Value: []byte("0")}, {Key: "content-type", Value: []byte("application/json")},
			{Key: "keiro-occurred-at", Value: []byte("2026-11-29T08:00:00.123456Z")}}
		require.NoError(t, pc.ProduceSync(ctx, &kgo.Record{Topic: "orders", Key: []byte(f.key), Value: f.value, Headers: h}).FirstErr())
	}
	for _, f := range batch {
		inFlight[f.id] = true
	}

	p := new(testenv.Progress)
	r, _ := startRelay(t, db, kc, outbox.RelayConfig{OnBatch: onSettled(p), Logger: testLogger(t)})
	p.Wait(t, int64(n), 60*time.Second, nil)
	require.Equal(t, int64(100), r.Stats().Reclaimed)

	recs := kc.ConsumeRecords(t, n+50, 30*time.Second, "orders")
	distinct, dups := checkOrder(t, recs)
	require.Equal(t, n, distinct)
	require.Equal(t, 50, dups)
	seen := map[string]int{}
	for _, rec := range recs {
		for _, h := range rec.Headers {
			if h.Key == "keiro-message-id" {
				seen[string(h.Value)]++
			}
		}
	}
	for id, c := range seen {
		if c > 1 {
			require.True(t, inFlight[id], "duplicate %s was not in flight", id)
		}
	}
	var attempts int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT max(attempt_count) FROM keiro_outbox").Scan(&attempts))
	require.Equal(t, 2, attempts, "a reclaimed row counts the crashed attempt and its own")
}

// TestRelayGracefulShutdownReleasesInFlight: Run's context is cancelled while a produce hangs
// on the broker; after ShutdownTimeout the relay releases the claimed rows to pending with
// their attempt refunded and returns nil. A new relay then publishes everything.
func TestRelayGracefulShutdownReleasesInFlight(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 2)
	const n = 100
	enqueue(t, db.Pool, st, keyedEvents("orders", n, 5)...)

	release := make(chan struct{})
	held := make(chan struct{}, 1)
	kc.Cluster.ControlKey(int16(kmsgProduce), func(kmsgReq) (kmsgResp, error, bool) {
		kc.Cluster.KeepControl()
		select {
		case held <- struct{}{}:
		default:
		}
		kc.Cluster.SleepControl(func() { <-release })
		return nil, nil, false
	})
	client := kc.NewClient(t, outboxOpts()...)
	r, err := outbox.NewRelay(db.Pool, client, outbox.RelayConfig{Schema: db.Schema, ShutdownTimeout: 100 * time.Millisecond, Logger: testLogger(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-held // a produce request is held by the broker
	cancel()
	require.NoError(t, <-done)
	s := r.Stats()
	require.Equal(t, int64(n), s.Released)
	var pending, attempts int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT count(*), coalesce(max(attempt_count), 0) FROM keiro_outbox WHERE status = 'pending'").Scan(&pending, &attempts))
	require.Equal(t, n, pending)
	require.Zero(t, attempts)
	close(release)

	p := new(testenv.Progress)
	startRelay(t, db, kc, outbox.RelayConfig{OnBatch: onSettled(p), Logger: testLogger(t)})
	p.Wait(t, int64(n), 60*time.Second, nil)
	recs := kc.ConsumeRecords(t, n, 30*time.Second, "orders")
	distinct, _ := checkOrder(t, recs)
	require.Equal(t, n, distinct)
}

// TestShutdownDuringAKafkaOutageUsesNoAttempts: Kafka is unreachable and the relay is stopped
// while its first records still wait for metadata; the shutdown deadline cancels them. Their
// rows are released with the attempt refunded, even on their last attempt: a rolling restart
// during an outage must not kill rows.
func TestShutdownDuringAKafkaOutageUsesNoAttempts(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	const n = 20
	enqueue(t, db.Pool, st, keyedEvents("orders", n, 5)...)
	_, err = db.Pool.Exec(context.Background(), "UPDATE keiro_outbox SET attempt_count = 2")
	require.NoError(t, err)
	client, err := kgo.NewClient(append(outbox.ProducerOpts(), kgo.SeedBrokers("127.0.0.1:1"))...) // nothing listens
	require.NoError(t, err)
	t.Cleanup(client.Close)
	r, err := outbox.NewRelay(db.Pool, client, outbox.RelayConfig{Schema: db.Schema, MaxAttempts: 3,
		ShutdownTimeout: 300 * time.Millisecond, Logger: testLogger(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var publishing int
		require.NoError(t, db.Pool.QueryRow(context.Background(),
			"SELECT count(*) FROM keiro_outbox WHERE status = 'publishing'").Scan(&publishing))
		if publishing > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the relay never claimed")
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	require.NoError(t, <-done)
	var dead, other, maxAttempts int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE status = 'dead'),
        count(*) FILTER (WHERE status NOT IN ('pending', 'failed')), max(attempt_count) FROM keiro_outbox`).Scan(&dead, &other, &maxAttempts))
	require.Zero(t, dead)
	require.Zero(t, other)
	require.Equal(t, 2, maxAttempts, "attempts refunded")
}

// TestStopTheLineHaltsOnARowDeadInTheClaim: a row re-claimed after its lease expired on its
// last attempt, whose produce had started (produce_started), goes dead in the
// claim (its last outcome is unknown). StopTheLine halts on it: nothing after it is published.
func TestStopTheLineHaltsOnARowDeadInTheClaim(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	res := enqueue(t, db.Pool, st, keyedEvents("orders", 6, 2)...)
	_, err := db.Pool.Exec(context.Background(), `UPDATE keiro_outbox SET status = 'publishing', attempt_count = 3,
        claim_token = gen_random_uuid(), produce_started = true,
        lease_until = now() - interval '1 second' WHERE outbox_id = $1`, res[0].OutboxID)
	require.NoError(t, err)
	client := kc.NewClient(t, outboxOpts()...)
	r, err := outbox.NewRelay(db.Pool, client, outbox.RelayConfig{Schema: db.Schema, Policy: outbox.StopTheLine,
		MaxAttempts: 3, Logger: testLogger(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Run(ctx)
	require.ErrorIs(t, err, outbox.ErrHalted)
	require.Contains(t, err.Error(), res[0].OutboxID.String())
	var sent int
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM keiro_outbox WHERE status = 'sent'").Scan(&sent))
	require.Zero(t, sent)
	row, err := outbox.AdminOf(st).Lookup(context.Background(), db.Pool, res[0].OutboxID)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDead, row.Status)
}

// TestRelaySurvivesBrokerOutage: every produce fails (NOT_LEADER_FOR_PARTITION, retriable) for a
// while. Rows are deferred without using attempts (MaxAttempts 2 would kill them otherwise);
// when the broker heals everything is published and nothing is dead.
func TestRelaySurvivesBrokerOutage(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 2)
	f := injectFaults(kc)
	f.set(func(f *faults) { f.all, f.code = true, kerr.NotLeaderForPartition.Code })
	const n = 200
	enqueue(t, db.Pool, st, keyedEvents("orders", n, 20)...)

	deferred := make(chan struct{}, 1)
	p := new(testenv.Progress)
	var r *outbox.Relay
	r, _ = startRelayOpts(t, db, kc, outboxOpts(), outbox.RelayConfig{
		MaxAttempts: 2, Backoff: keiro.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond},
		PollInterval: 10 * time.Millisecond, Logger: testLogger(t),
		OnBatch: func(b outbox.BatchResult) {
			p.Add(settledRows(b))
			if b.Retried > 0 {
				select {
				case deferred <- struct{}{}:
				default:
				}
			}
		},
	})
	// Let the outage last for several failed rounds: more than MaxAttempts.
	for range 3 {
		<-deferred
	}
	require.GreaterOrEqual(t, r.Stats().Deferred, int64(3))
	f.set(func(f *faults) { f.all = false })
	p.Wait(t, int64(n), 60*time.Second, nil)
	var dead int
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM keiro_outbox WHERE status IN ('dead', 'rejected')").Scan(&dead))
	require.Zero(t, dead)
	recs := kc.ConsumeRecords(t, n, 30*time.Second, "orders")
	distinct, dups := checkOrder(t, recs)
	require.Equal(t, n, distinct)
	require.Zero(t, dups)
}

// TestRelayRecoversFromKilledConnections: every PostgreSQL connection of the relay (pool and
// LISTEN connection) is terminated; the relay reconnects by itself and keeps publishing, woken
// again by notifications.
func TestRelayRecoversFromKilledConnections(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 2)
	app := "relaykill_" + db.Schema
	cfg, err := pgxpool.ParseConfig(db.ConnString)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()

	p := new(testenv.Progress)
	client := kc.NewClient(t, outboxOpts()...)
	r, err := outbox.NewRelay(pool, client, outbox.RelayConfig{Schema: db.Schema, OnBatch: onSettled(p),
		PollInterval: time.Hour, Logger: testLogger(t)}) // only notifications wake it
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	enqueue(t, db.Pool, st, keyedEvents("orders", 50, 5)...)
	p.Wait(t, 50, 30*time.Second, nil)
	var killed int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&killed))
	require.Positive(t, killed)
	evs := keyedEvents("orders", 150, 5)[50:]
	// Enqueue until the relay, reconnected, has published them: NOTIFYs sent before its
	// listener is back are lost, later ones wake it.
	enqueue(t, db.Pool, st, evs[:50]...)
	for i := 50; i < 100; i += 10 {
		enqueue(t, db.Pool, st, evs[i:i+10]...)
	}
	p.Wait(t, 150, 60*time.Second, nil)
	recs := kc.ConsumeRecords(t, 150, 30*time.Second, "orders")
	distinct, _ := checkOrder(t, recs)
	require.Equal(t, 150, distinct)
}

// poisonRig is rig for poison tests: a broker that refuses records over 20,000 bytes, and
// topics of one partition.
func poisonRig(t *testing.T, topics ...string) (*testenv.DB, *testenv.Kafka, *outbox.Store) {
	t.Helper()
	db := testenv.NewDB(t)
	kc := newKafka(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "20000"}))
	for _, topic := range topics {
		kc.CreateTopic(t, topic, 1)
	}
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	return db, kc, st
}

// TestRelayRejectsPoisonRows: one row is bigger than the broker accepts
// (message.max.bytes = 20000). It is rejected with code message_too_large and a readable
// reason, without blocking its key, and the rows produced with it are not rejected. A row bigger
// than MaxRecordBytes is rejected before it reaches Kafka.
func TestRelayRejectsPoisonRows(t *testing.T) {
	t.Parallel()
	db, kc, st := poisonRig(t, "orders")
	evs := keyedEvents("orders", 30, 3)
	pad := func(i, size int) []byte { // incompressible, so compression cannot hide the size
		b := make([]byte, size)
		_, _ = rand.Read(b)
		return append([]byte(fmt.Sprintf(`{"i":%d}`, i)), b...)
	}
	evs[13].Payload = pad(13, 30_000)  // refused by the broker, produced with others
	evs[20].Payload = pad(20, 200_000) // over MaxRecordBytes: refused before Kafka
	enqueue(t, db.Pool, st, evs...)

	p := new(testenv.Progress)
	startRelay(t, db, kc, outbox.RelayConfig{OnBatch: onSettled(p), MaxRecordBytes: 100_000,
		Backoff: keiro.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}, PollInterval: 10 * time.Millisecond,
		Logger: testLogger(t)})
	p.Wait(t, 30, 60*time.Second, nil)

	ctx := context.Background()
	dead, err := outbox.AdminOf(st).ListDead(ctx, db.Pool, outbox.ListDeadOptions{})
	require.NoError(t, err)
	require.Len(t, dead, 2)
	for _, d := range dead {
		require.Equal(t, outbox.StatusRejected, d.Status)
		require.Equal(t, "message_too_large", d.RejectionCode)
		require.NotEmpty(t, d.LastError)
	}
	require.Equal(t, evs[13].MessageID, dead[0].MessageID)
	require.Equal(t, evs[20].MessageID, dead[1].MessageID)
	require.Contains(t, dead[1].LastError, "exceeds the 100000-byte limit")
	var sent int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM keiro_outbox WHERE status = 'sent'").Scan(&sent))
	require.Equal(t, 28, sent)
	recs := kc.ConsumeRecords(t, 28, 30*time.Second, "orders")
	distinct, dups := checkOrder(t, recs)
	require.Equal(t, 28, distinct)
	require.Zero(t, dups)
}

// TestRowsGoDeadAfterMaxAttemptsAndFreeTheirKey: while every produce fails with a transient
// error, the heads of two keys use their three attempts and go dead (the rows behind them are
// held back without using theirs); once the broker recovers, the rest of the key flows in
// order: a dead row never blocks its key.
func TestRowsGoDeadAfterMaxAttemptsAndFreeTheirKey(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	f := injectFaults(kc)
	f.set(func(f *faults) { f.all, f.code = true, kerr.UnknownServerError.Code })
	res := enqueue(t, db.Pool, st,
		event("a-1", "orders", ptr("A"), `{"i":1}`), event("a-2", "orders", ptr("A"), `{"i":2}`),
		event("a-3", "orders", ptr("A"), `{"i":3}`), event("b-1", "orders", ptr("B"), `{"i":1}`))
	var dead atomic.Int64
	p := new(testenv.Progress)
	// One batch at a time, so the broker recovers before anything is claimed after the heads died.
	r, _ := startRelay(t, db, kc, outbox.RelayConfig{MaxAttempts: 3, MaxInFlightBatches: 1, ClaimConcurrency: 1,
		Backoff: keiro.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}, PollInterval: 10 * time.Millisecond,
		Logger: testLogger(t), OnBatch: func(b outbox.BatchResult) {
			if dead.Add(int64(b.Dead)) == 2 {
				f.set(func(f *faults) { f.all = false })
			}
			p.Add(settledRows(b))
		}})
	p.Wait(t, 4, 30*time.Second, nil)

	ctx := context.Background()
	// The heads retry with jittered backoffs, so they may die in different batches: a-2, the
	// head of A once a-1 is dead, then shares b-1's last failing batch and uses one attempt.
	// Rows behind a live head use none.
	var a2Attempts int
	for i, want := range []struct {
		status   outbox.Status
		attempts []int
	}{{"dead", []int{3}}, {"sent", []int{1, 2}}, {"sent", []int{1}}, {"dead", []int{3}}} {
		row, err := outbox.AdminOf(st).Lookup(ctx, db.Pool, res[i].OutboxID)
		require.NoError(t, err)
		require.Equal(t, want.status, row.Status, row.Event.MessageID)
		require.Contains(t, want.attempts, row.Attempts, row.Event.MessageID)
		if want.status == "dead" {
			require.Contains(t, row.LastError, "UNKNOWN_SERVER_ERROR")
		}
		if i == 1 {
			a2Attempts = row.Attempts
		}
	}
	distinct, dups := checkOrder(t, kc.ConsumeRecords(t, 2, 30*time.Second, "orders"))
	require.Equal(t, 2, distinct)
	require.Zero(t, dups)
	s := r.Stats()
	require.Equal(t, int64(2), s.Dead)
	require.Equal(t, int64(4+a2Attempts-1), s.Retried,
		"two failed attempts of each head before the third killed it, and a-2's failed one if it had one")
	require.Positive(t, s.Skipped)
}

// TestSlowBatchKeepsItsLease: the broker holds a batch's first produce request for three
// leases. The relay renews the batch's lease meanwhile, so a second relay on the table takes
// none of its rows over: every row reaches Kafka once, with one attempt used.
func TestSlowBatchKeepsItsLease(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	release := make(chan struct{})
	var held atomic.Bool
	kc.Cluster.ControlKey(int16(kmsgProduce), func(kmsgReq) (kmsgResp, error, bool) {
		kc.Cluster.KeepControl()
		if held.CompareAndSwap(false, true) {
			<-release // a broker that does not answer
		}
		return nil, nil, false
	})
	enqueue(t, db.Pool, st, keyedEvents("orders", 20, 4)...)
	p := new(testenv.Progress)
	cfg := outbox.RelayConfig{Lease: time.Second, PollInterval: 50 * time.Millisecond, OnBatch: onSettled(p), Logger: testLogger(t)}
	a, _ := startRelay(t, db, kc, cfg)
	deadline := time.Now().Add(10 * time.Second)
	for !held.Load() {
		require.True(t, time.Now().Before(deadline), "the relay never produced")
		time.Sleep(5 * time.Millisecond)
	}
	b, _ := startRelay(t, db, kc, cfg)
	time.Sleep(3 * cfg.Lease) // the outage: three leases long
	close(release)
	p.Wait(t, 20, 30*time.Second, nil)

	distinct, dups := checkOrder(t, kc.ConsumeRecords(t, 20, 30*time.Second, "orders"))
	require.Equal(t, 20, distinct)
	require.Zero(t, dups, "rows taken over while their relay still published them")
	require.Zero(t, a.Stats().Reclaimed+b.Stats().Reclaimed)
	require.Positive(t, a.Stats().LeaseRenewals)
	var maxAttempts int
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT max(attempt_count) FROM keiro_outbox").Scan(&maxAttempts))
	require.Equal(t, 1, maxAttempts)
}

// TestPoisonBystanderKeepsItsKeyOrder: the broker refuses a request because of one oversized
// record, so every record in it fails; the bystanders are retried alone, not rejected. A later
// record of a bystander's key must not overtake it, even when it goes out in a later flush of
// the same batch (here the batch is split by the first record for a new topic, flushed alone).
func TestPoisonBystanderKeepsItsKeyOrder(t *testing.T) {
	t.Parallel()
	db, kc, st := poisonRig(t, "orders", "audit")
	p := new(testenv.Progress)
	r, _ := startRelay(t, db, kc, outbox.RelayConfig{OnBatch: onSettled(p), MaxRecordBytes: 100_000,
		Backoff: keiro.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}, PollInterval: 10 * time.Millisecond,
		Logger: testLogger(t)})
	enqueue(t, db.Pool, st, event("m-0", "orders", ptr("k0"), `{"i":0}`))
	p.Wait(t, 1, 30*time.Second, nil) // the client has published to "orders": its rows share flushes

	big := make([]byte, 30_000) // incompressible, so compression cannot hide the size
	_, _ = rand.Read(big)
	enqueue(t, db.Pool, st,
		event("m-1", "orders", ptr("k1"), `{"i":1}`+string(big)), // refused, with its bystander
		event("m-2", "orders", ptr("k2"), `{"i":2}`),             // the bystander
		event("m-3", "audit", ptr("a"), `{"i":3}`),               // first for "audit": flushed alone
		event("m-4", "orders", ptr("k2"), `{"i":4}`),             // must land after m-2
		event("m-5", "orders", ptr("k1"), `{"i":5}`),
	)
	p.Wait(t, 6, 30*time.Second, nil)

	recs := kc.ConsumeRecords(t, 4, 30*time.Second, "orders")
	distinct, _ := checkOrder(t, recs)
	require.Equal(t, 4, distinct)
	require.Zero(t, r.Stats().OrderBroken)
	dead, err := outbox.AdminOf(st).ListDead(context.Background(), db.Pool, outbox.ListDeadOptions{})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, "m-1", dead[0].MessageID)
	require.Equal(t, "message_too_large", dead[0].RejectionCode)
}

// sleepingRelayPID returns the pid of the session holding the schema's sleep lock, or 0.
func sleepingRelayPID(t *testing.T, db *testenv.DB) int {
	t.Helper()
	var pid int
	err := db.Pool.QueryRow(context.Background(), `
        SELECT coalesce(max(pid), 0) FROM pg_locks
        WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' AND granted AND objsubid = 2
          AND classid::int = hashtext('keiro.outbox.sleep') AND objid::int = hashtext($1)`, db.Schema).Scan(&pid)
	require.NoError(t, err)
	return pid
}

// TestRelayRecoversFromAKilledSleepSession: the session holding the sleep lock dies while the
// relay sleeps (an administrator, idle_session_timeout). Producers stop notifying, so the next
// row waits for the poll; then the relay takes the lock on a new session and notifications
// wake it again.
func TestRelayRecoversFromAKilledSleepSession(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	p := new(testenv.Progress)
	startRelay(t, db, kc, outbox.RelayConfig{PollInterval: 2 * time.Second, OnBatch: onSettled(p), Logger: testLogger(t)})
	testenv.WaitFor(t, 10*time.Second, "the relay to sleep under the lock", func() bool { return sleepingRelayPID(t, db) != 0 })
	first := sleepingRelayPID(t, db)
	var ok bool
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, first).Scan(&ok))
	require.True(t, ok)
	testenv.WaitFor(t, 10*time.Second, "the killed session to go", func() bool { return sleepingRelayPID(t, db) != first })

	evs := keyedEvents("orders", 2, 1)
	enqueue(t, db.Pool, st, evs[0]) // nobody holds the lock: no notification, the poll finds it
	p.Wait(t, 1, 6*time.Second, nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to sleep under the lock again", func() bool {
		pid := sleepingRelayPID(t, db)
		return pid != 0 && pid != first
	})
	notifications := listen(t, context.Background(), db, st)
	enqueue(t, db.Pool, st, evs[1]) // notifies
	require.NotEmpty(t, notifications(), "the producer notified the relay sleeping under its new session")
	p.Wait(t, 2, 10*time.Second, nil)
}

// TestPollOnlyRelayNeverTakesTheSleepLock: a poll-only relay hears no notification, so it never
// takes the sleep lock and its producers never notify; it finds rows by polling.
func TestPollOnlyRelayNeverTakesTheSleepLock(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	notifications := listen(t, context.Background(), db, st)
	p := new(testenv.Progress)
	startRelay(t, db, kc, outbox.RelayConfig{PollOnly: true, PollInterval: 50 * time.Millisecond, OnBatch: onSettled(p), Logger: testLogger(t)})
	evs := keyedEvents("orders", 20, 2)
	for i := range evs {
		enqueue(t, db.Pool, st, evs[i])
		time.Sleep(10 * time.Millisecond)
		require.Zero(t, sleepingRelayPID(t, db))
	}
	p.Wait(t, int64(len(evs)), 10*time.Second, nil)
	require.Empty(t, notifications())
}

// TestRelayClaimsNewRowsWhileABatchIsSlow: a batch in flight wakes the relay when it is marked,
// so while it is fast the relay need not be notified; a batch held up by the broker must not
// hold back other keys' new rows: after a short wait the relay sleeps under the sleep lock
// anyway, producers notify, and the new row is claimed (ready for the next produce) while the
// first batch is still held. The poll is an hour.
func TestRelayClaimsNewRowsWhileABatchIsSlow(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	dumpOutboxOnFailure(t, db)
	release := make(chan struct{})
	held := make(chan struct{}, 1)
	var once sync.Once
	kc.Cluster.ControlKey(int16(kmsgProduce), func(kmsgReq) (kmsgResp, error, bool) {
		once.Do(func() { // only the first produce is slow
			held <- struct{}{}
			kc.Cluster.SleepControl(func() { <-release })
		})
		return nil, nil, false
	})
	p := new(testenv.Progress)
	startRelay(t, db, kc, outbox.RelayConfig{PollInterval: time.Hour, OnBatch: onSettled(p), Logger: testLogger(t)})
	evs := keyedEvents("orders", 2, 2)
	enqueue(t, db.Pool, st, evs[0])
	<-held
	enqueue(t, db.Pool, st, evs[1])
	deadline := time.Now().Add(5 * time.Second)
	for {
		var status string
		require.NoError(t, db.Pool.QueryRow(context.Background(),
			`SELECT status FROM keiro_outbox WHERE message_id = $1`, evs[1].MessageID).Scan(&status))
		if status == "publishing" {
			break
		}
		require.True(t, time.Now().Before(deadline), "the new row was not claimed while the first batch was held")
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	p.Wait(t, 2, 10*time.Second, nil)
}

// TestIdleRelaysDoNotSpinOnTheSleepLock: of several idle relays on one table only one can hold
// the sleep lock; the others see it held exclusively (another relay sleeps, producers notify)
// and wait for notifications and the poll like it, rather than retrying the lock and claiming
// every few milliseconds. All of them still publish what is enqueued.
func TestIdleRelaysDoNotSpinOnTheSleepLock(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	p := new(testenv.Progress)
	var relays []*outbox.Relay
	for range 3 {
		r, _ := startRelay(t, db, kc, outbox.RelayConfig{PollInterval: time.Second, OnBatch: onSettled(p), Logger: testLogger(t)})
		relays = append(relays, r)
	}
	claims := func() (n int64) {
		for _, r := range relays {
			n += r.Stats().Claims
		}
		return n
	}
	time.Sleep(500 * time.Millisecond) // settle: one relay asleep under the lock
	before := claims()
	time.Sleep(2 * time.Second)
	idle := claims() - before
	// Each relay claims at most on its polls (2 in 2 s) and a few times around them; retrying
	// the lock every 50 ms would be ~80 claims.
	require.LessOrEqual(t, idle, int64(15), "idle relays claimed %d times in 2 s", idle)

	evs := keyedEvents("orders", 30, 3)
	for _, e := range evs {
		enqueue(t, db.Pool, st, e)
	}
	p.Wait(t, int64(len(evs)), 10*time.Second, nil)
	recs := kc.ConsumeRecords(t, len(evs), 10*time.Second, "orders")
	distinct, dups := checkOrder(t, recs)
	require.Equal(t, len(evs), distinct)
	require.Zero(t, dups)
}

// TestRelaysWithDestinationFiltersHearTheirRows: two relays each restricted to one topic. Only
// one can sleep under the filtered sleep lock; the other must not count on it: a row of its
// topic committed while the sleeper is awake (here right after a row of the sleeper's topic
// woke it) sends no notification. It keeps trying the lock instead, so rows of both topics
// arrive without waiting for the poll (an hour).
func TestRelaysWithDestinationFiltersHearTheirRows(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	dumpOutboxOnFailure(t, db)
	kc.CreateTopic(t, "billing", 1)
	p := new(testenv.Progress)
	for _, topic := range []string{"orders", "billing"} {
		startRelay(t, db, kc, outbox.RelayConfig{Destinations: []string{topic}, PollInterval: time.Hour,
			OnBatch: onSettled(p), Logger: testLogger(t)})
	}
	time.Sleep(200 * time.Millisecond) // both idle: one asleep under the lock, one trying
	const rounds = 20
	k := "k"
	for i := range rounds {
		// Either topic's row first: whichever relay sleeps is woken by one, and the other
		// row commits while it is awake.
		first, second := "orders", "billing"
		if i%2 == 1 {
			first, second = second, first
		}
		enqueue(t, db.Pool, st, event(fmt.Sprintf("a-%d", i), first, &k, fmt.Sprintf(`{"i":%d}`, 2*i)))
		time.Sleep(time.Duration(i%4) * time.Millisecond)
		enqueue(t, db.Pool, st, event(fmt.Sprintf("b-%d", i), second, &k, fmt.Sprintf(`{"i":%d}`, 2*i+1)))
		p.Wait(t, int64(2*(i+1)), 5*time.Second, nil)
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRelayRetriesWhenTheBackoffEnds: a row that failed is due again after its backoff; the
// relay that marked it wakes then, rather than at its next poll (an hour here).
func TestRelayRetriesWhenTheBackoffEnds(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	dumpOutboxOnFailure(t, db)
	f := injectFaults(kc)
	f.set(func(f *faults) { f.all, f.code = true, kerr.UnknownServerError.Code })
	p := new(testenv.Progress)
	startRelayOpts(t, db, kc, outboxOpts(), outbox.RelayConfig{PollInterval: time.Hour,
		Backoff: keiro.Backoff{Initial: 200 * time.Millisecond, Max: time.Second, Multiplier: 2},
		OnBatch: onSettled(p), Logger: testLogger(t)})
	enqueue(t, db.Pool, st, keyedEvents("orders", 3, 1)...)
	deadline := time.Now().Add(10 * time.Second)
	for f.failed.Load() == 0 {
		require.True(t, time.Now().Before(deadline), "no produce failed")
		time.Sleep(5 * time.Millisecond)
	}
	f.set(func(f *faults) { f.all = false })
	p.Wait(t, 3, 10*time.Second, nil) // the poll is an hour: only the backoff's end wakes the relay
	recs := kc.ConsumeRecords(t, 3, 10*time.Second, "orders")
	distinct, _ := checkOrder(t, recs)
	require.Equal(t, 3, distinct)
}

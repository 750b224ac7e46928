package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// settledRows is how many of b's rows reached a terminal state: published, dead or rejected.
func settledRows(b outbox.BatchResult) int64 {
	return int64(b.Published + b.Dead + b.Rejected)
}

// onSettled is a relay's OnBatch hook that counts in p the rows that reached a terminal state,
// so that a test waits for them (p.Wait) across relays.
func onSettled(p *testenv.Progress) func(outbox.BatchResult) {
	return func(b outbox.BatchResult) { p.Add(settledRows(b)) }
}

// dumpOutboxOnFailure logs, if the test fails, the outbox's rows per status with when the
// earliest becomes due, its lease and error: enough to tell a lost wake-up (rows due, none in
// flight) from a retry in backoff or a stuck batch.
func dumpOutboxOnFailure(t testing.TB, db *testenv.DB) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		rows, err := db.Pool.Query(context.Background(), `
            SELECT status, count(*), coalesce(min(next_attempt_at - now())::text, ''),
                coalesce(min(lease_until - now())::text, ''), max(attempt_count), coalesce(min(last_error), '')
            FROM keiro_outbox GROUP BY status ORDER BY status`)
		if err != nil {
			t.Logf("outbox dump: %v", err)
			return
		}
		defer rows.Close()
		for rows.Next() {
			var status, due, lease, lastErr string
			var n, attempts int
			if err := rows.Scan(&status, &n, &due, &lease, &attempts, &lastErr); err != nil {
				t.Logf("outbox dump: %v", err)
				return
			}
			t.Logf("outbox: %d %s (earliest due in %s, lease %s, max attempts %d, error %q)", n, status, due, lease, attempts, lastErr)
		}
	})
}

// startRelay runs a relay until the test ends, and checks Run's result then.
func startRelay(t testing.TB, db *testenv.DB, kc *testenv.Kafka, cfg outbox.RelayConfig) (*outbox.Relay, context.CancelFunc) {
	t.Helper()
	return startRelayOpts(t, db, kc, outbox.ProducerOpts(), cfg)
}

// startRelayOpts is startRelay with the client's options.
func startRelayOpts(t testing.TB, db *testenv.DB, kc *testenv.Kafka, kopts []kgo.Opt, cfg outbox.RelayConfig) (*outbox.Relay, context.CancelFunc) {
	t.Helper()
	r, cancel, _ := runRelay(t, db, kc.NewClient(t, kopts...), cfg)
	return r, cancel
}

// runRelay runs a relay with client in db's schema until the test ends or cancel is called,
// and checks Run's result then (ErrHalted is a result too). stopped receives Run's result as
// soon as it returns, for a wait that must fail when the relay stops early.
func runRelay(t testing.TB, db *testenv.DB, client *kgo.Client, cfg outbox.RelayConfig) (r *outbox.Relay, cancel context.CancelFunc, stopped <-chan error) {
	t.Helper()
	cfg.Schema = db.Schema
	r, err := outbox.NewRelay(db.Pool, client, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	early, finished := make(chan error, 1), make(chan struct{})
	var runErr error
	go func() {
		runErr = r.Run(ctx)
		early <- runErr
		close(finished)
	}()
	t.Cleanup(func() {
		cancel()
		<-finished
		if runErr != nil && !errors.Is(runErr, outbox.ErrHalted) {
			t.Errorf("relay Run: %v", runErr)
		}
	})
	return r, cancel, early
}

// checkOrder decodes records, drops duplicates by message id (keeping the first), and checks
// that every key's payload indexes are strictly increasing. It returns the distinct count and
// the number of duplicates.
func checkOrder(t testing.TB, recs []*kgo.Record) (distinct, dups int) {
	return checkRecords(t, recs, true)
}

// checkRecords is checkOrder with the order check optional (BestEffort promises none).
func checkRecords(t testing.TB, recs []*kgo.Record, ordered bool) (distinct, dups int) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{}
	lastRec := map[string]*kgo.Record{}
	for _, r := range recs {
		hs := make([]envelope.Header, len(r.Headers))
		for i, h := range r.Headers {
			hs[i] = envelope.Header{Key: h.Key, Value: h.Value}
		}
		e, err := envelope.Decode(envelope.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
			Key: r.Key, Value: r.Value, Headers: hs, Timestamp: r.Timestamp})
		require.NoError(t, err)
		if seen[e.MessageID] {
			dups++
			continue
		}
		seen[e.MessageID] = true
		var i int
		_, err = fmt.Sscanf(string(r.Value), `{"i":%d}`, &i)
		require.NoError(t, err, "payload %q", r.Value)
		k := string(r.Key)
		if prev, ok := last[k]; ok && ordered && i <= prev {
			p := lastRec[k]
			t.Fatalf("key %s: message %d after %d (this record: partition %d offset %d producer %d/%d; "+
				"previous: partition %d offset %d producer %d/%d)\n%s", k, i, prev,
				r.Partition, r.Offset, r.ProducerID, r.ProducerEpoch,
				p.Partition, p.Offset, p.ProducerID, p.ProducerEpoch, keyHistory(recs, k))
		}
		last[k] = i
		lastRec[k] = r
	}
	return len(seen), dups
}

// keyHistory lists every record of key k (duplicates included), for a failure message.
func keyHistory(recs []*kgo.Record, k string) string {
	var b strings.Builder
	for _, r := range recs {
		if string(r.Key) == k {
			fmt.Fprintf(&b, "  p%d@%d pid %d/%d %s\n", r.Partition, r.Offset, r.ProducerID, r.ProducerEpoch, r.Value)
		}
	}
	return b.String()
}

func TestRelayPublishesInOrder(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 4)
	const n = 2000
	evs := keyedEvents("orders", n, 37)
	for i := 0; i < n; i += 500 {
		enqueue(t, db.Pool, st, evs[i:i+500]...)
	}
	p := new(testenv.Progress)
	r, _ := startRelay(t, db, kc, outbox.RelayConfig{BatchSize: 128, OnBatch: onSettled(p), Logger: testLogger(t)})
	t0 := time.Now()
	p.Wait(t, int64(n), 60*time.Second, nil)
	t.Logf("drained in %s", time.Since(t0))

	recs := kc.ConsumeRecords(t, n, 30*time.Second, "orders")
	require.Len(t, recs, n)
	distinct, dups := checkOrder(t, recs)
	require.Equal(t, n, distinct)
	require.Zero(t, dups)
	s := r.Stats()
	require.Equal(t, int64(n), s.Published)
	require.Zero(t, s.Retried+s.Dead+s.Rejected)

	// Every row is sent with its partition and offset.
	var sent int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM keiro_outbox WHERE status = 'sent' AND kafka_offset IS NOT NULL AND published_at IS NOT NULL").Scan(&sent))
	require.Equal(t, n, sent)
	// Headers: the event round-trips through the envelope codec.
	hs := make([]envelope.Header, len(recs[0].Headers))
	for i, h := range recs[0].Headers {
		hs[i] = envelope.Header{Key: h.Key, Value: h.Value}
	}
	e, err := envelope.Decode(envelope.Record{Topic: "orders", Key: recs[0].Key, Value: recs[0].Value, Headers: hs})
	require.NoError(t, err)
	require.Equal(t, "ordering", e.Source)
	require.Equal(t, "OrderPlaced", e.EventType)
	_ = strconv.Itoa
	_ = atomic.Int64{}
}

func testLogger(t testing.TB) *slog.Logger {
	lvl := slog.LevelWarn
	if os.Getenv("KEIRO_TEST_DEBUG") != "" {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: lvl}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestRelayNeverWaitsForThePollWhileWorkRemains: with the poll an hour away, a backlog over a
// few hot keys (every claim but the first of a round comes back empty while the keys are in
// flight) drains on wake-ups alone. A wake-up lost between two claimers — one given to a claimer
// that is about to sleep — would leave the relay idle for the hour.
func TestRelayNeverWaitsForThePollWhileWorkRemains(t *testing.T) {
	t.Parallel()
	kc := newKafka(t)
	kc.CreateTopic(t, "orders", 3)
	const n = 3000
	evs := keyedEvents("orders", n, 3)
	for _, claimers := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("claimers=%d", claimers), func(t *testing.T) {
			db := testenv.NewDB(t)
			dumpOutboxOnFailure(t, db)
			st, err := outbox.NewStore(db.Schema)
			require.NoError(t, err)
			for i := 0; i < n; i += 1000 {
				enqueue(t, db.Pool, st, evs[i:i+1000]...)
			}
			p := new(testenv.Progress)
			startRelay(t, db, kc, outbox.RelayConfig{BatchSize: 100, MaxInFlightBatches: 4, ClaimConcurrency: claimers,
				PollInterval: time.Hour, OnBatch: onSettled(p), Logger: testLogger(t)})
			p.Wait(t, int64(n), 60*time.Second, nil)
		})
	}
}

// TestRelayHearsProducersThatDidNotNotify: producers notify only while a relay sleeps, so a
// row committed by a producer that saw the relay awake must still be claimed without waiting
// for the poll (an hour here). First a transaction open before the relay starts (the relay
// cannot fall asleep until it ends, then claims its row); then 8 producers committing small
// transactions at random moments around the relay's claims and sleeps, with 3 relays on the
// table (only one can hold the sleep lock at a time).
func TestRelayHearsProducersThatDidNotNotify(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 3)
	dumpOutboxOnFailure(t, db)
	ctx := context.Background()
	notifications := listen(t, ctx, db, st)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = st.EnqueueTx(ctx, tx, event("early", "orders", ptr("k"), `{"i":0}`))
	require.NoError(t, err)
	p := new(testenv.Progress)
	for range 3 {
		startRelay(t, db, kc, outbox.RelayConfig{PollInterval: time.Hour, OnBatch: onSettled(p), Logger: testLogger(t)})
	}
	time.Sleep(300 * time.Millisecond) // the relays claimed nothing and cannot fall asleep
	require.NoError(t, tx.Commit(ctx))
	p.Wait(t, 1, 5*time.Second, nil)
	require.Empty(t, notifications(), "the early producer saw no sleeping relay")

	const producers, each = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for w := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range each {
				time.Sleep(time.Duration(rng.IntN(4000)) * time.Microsecond)
				k := fmt.Sprintf("w%d", w)
				e := event(fmt.Sprintf("w%d-%d", w, i), "orders", &k, fmt.Sprintf(`{"i":%d}`, i))
				if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					if _, err := st.EnqueueTx(ctx, tx, e); err != nil {
						return err
					}
					time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond) // other work
					return nil
				}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	p.Wait(t, int64(1+producers*each), 20*time.Second, nil)
	recs := kc.ConsumeRecords(t, 1+producers*each, 10*time.Second, "orders")
	distinct, dups := checkOrder(t, recs)
	require.Equal(t, 1+producers*each, distinct)
	require.Zero(t, dups)
}

// TestRelayWokenByStoreNotify: rows of a producer built with DisableNotify reach a relay that
// polls once an hour when the producer calls Store.Notify after its commit.
func TestRelayWokenByStoreNotify(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	kc := newKafka(t)
	kc.CreateTopic(t, "orders", 1)
	st, err := outbox.NewStore(db.Schema, outbox.StoreOptions{DisableNotify: true})
	require.NoError(t, err)
	p := new(testenv.Progress)
	startRelay(t, db, kc, outbox.RelayConfig{PollInterval: time.Hour, OnBatch: onSettled(p), Logger: testLogger(t)})
	for i, batch := range [][]envelope.Event{keyedEvents("orders", 10, 2)[:5], keyedEvents("orders", 10, 2)[5:]} {
		enqueue(t, db.Pool, st, batch...)
		require.NoError(t, st.Notify(context.Background(), db.Pool))
		p.Wait(t, int64(5*(i+1)), 20*time.Second, nil)
	}
	recs := kc.ConsumeRecords(t, 10, 10*time.Second, "orders")
	distinct, dups := checkOrder(t, recs)
	require.Equal(t, 10, distinct)
	require.Zero(t, dups)
}

// TestRelayClaimsPastABlockedFront: claims look only a few batches deep into the backlog, so a
// front blocked by a key in backoff (here 30 rows, ten times the bounded scan of 3 rows) must
// not starve a key behind it: the relay scans the whole backlog once per poll interval.
func TestRelayClaimsPastABlockedFront(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	ctx := context.Background()
	front := keyedEvents("orders", 30, 1) // key k0
	enqueue(t, db.Pool, st, front...)
	_, err := db.Pool.Exec(ctx, `UPDATE keiro_outbox SET status = 'failed', next_attempt_at = now() + interval '1 hour'
        WHERE message_id = $1`, front[0].MessageID)
	require.NoError(t, err)
	p := new(testenv.Progress)
	startRelay(t, db, kc, outbox.RelayConfig{BatchSize: 3, MaxInFlightBatches: 1, PollInterval: 300 * time.Millisecond,
		OnBatch: onSettled(p), Logger: testLogger(t)})
	time.Sleep(400 * time.Millisecond) // the relay's first claims (of the whole backlog) found nothing
	behind := keyedEvents("orders", 2, 1)
	for i := range behind {
		k := "behind"
		behind[i].Key = &k
		behind[i].MessageID = fmt.Sprintf("behind-%d", i)
	}
	enqueue(t, db.Pool, st, behind...)
	p.Wait(t, 2, 10*time.Second, nil)
	var pending int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM keiro_outbox WHERE status <> 'sent'").Scan(&pending))
	require.Equal(t, 30, pending, "the blocked key stays blocked")

	// While full-backlog scans come back full, the relay keeps scanning past the blocked
	// front: 90 rows behind it take 30 claims of 3, well under one poll interval each.
	more := keyedEvents("orders", 90, 3)
	for i := range more {
		k := fmt.Sprintf("more-%d", i%3) // not k0, the blocked key
		more[i].Key, more[i].MessageID = &k, fmt.Sprintf("more-%d", i)
	}
	enqueue(t, db.Pool, st, more...)
	start := time.Now()
	p.Wait(t, 92, 20*time.Second, nil)
	require.Less(t, time.Since(start), 5*time.Second, "30 claims paced by the poll interval would take 9 s")
}

package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/claimsql"
	"github.com/keiro-go/keiro/outbox/internal/exactlyonce"
)

// eosEvents are n events over keys keys of topic t1, the i-th of its key carrying {"i":i}.
func eosEvents(n, keys int) []envelope.Event {
	evs := make([]envelope.Event, n)
	for i := range evs {
		key := fmt.Sprintf("key-%d", i%keys)
		evs[i] = ev(fmt.Sprintf("m-%03d", i), k(key))
		evs[i].Payload = fmt.Appendf(nil, `{"i":%d}`, i/keys)
	}
	return evs
}

// eosRelay is an exactly-once relay of db's schema; tweak adjusts its configuration.
func eosRelay(t *testing.T, db *testenv.DB, kc *testenv.Kafka, tweak func(*RelayConfig)) *Relay {
	t.Helper()
	cfg := RelayConfig{Schema: db.Schema, ExactlyOnce: true, PollInterval: 50 * time.Millisecond,
		OffsetsTopic: kc.Topic(exactlyonce.DefaultOffsetsTopic),
		Logger:       testLogger()}
	if tweak != nil {
		tweak(&cfg)
	}
	r, err := NewRelay(db.Pool, kc.NewClient(t, ProducerOpts()...), cfg)
	require.NoError(t, err)
	return r
}

// waitSent waits until every row of db's outbox is sent.
func waitSent(t *testing.T, db *testenv.DB, n int) {
	t.Helper()
	testenv.WaitFor(t, time.Minute, "every row sent", func() bool {
		var sent int
		require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM keiro_outbox WHERE status = 'sent'").Scan(&sent))
		return sent == n
	})
}

// waitRecovered waits until r's recovery of lost claims counted n rows settled (marked sent or
// released), and returns r's exactly-once state. The recovery counts the rows after the
// statement that settled them committed: a test that saw the rows move (waitSent) has not seen
// the counters move yet.
func waitRecovered(t *testing.T, r *Relay, n int) ExactlyOnceStatus {
	t.Helper()
	testenv.WaitFor(t, time.Minute, fmt.Sprintf("the recovery to count %d rows settled", n), func() bool {
		st, _ := r.ExactlyOnce()
		return st.RecoveredSent+st.RecoveredReleased >= int64(n)
	})
	st, _ := r.ExactlyOnce()
	return st
}

// waitPublished waits until r counted n rows published: it counts a batch's rows after its
// marks committed.
func waitPublished(t *testing.T, r *Relay, n int) {
	t.Helper()
	testenv.WaitFor(t, time.Minute, fmt.Sprintf("the relay to count %d rows published", n), func() bool {
		return r.Stats().Published >= int64(n)
	})
}

// readCommitted reads topic as a read_committed reader, from the start up to its end offsets:
// the records of committed transactions only, by partition and offset.
func readCommitted(t *testing.T, kc *testenv.Kafka, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := testenv.ReadCommitted(ctx, kc, topic)
	require.NoError(t, err)
	return c.Records
}

// requireExactlyOnce checks that recs hold each of evs once, each key's in order.
func requireExactlyOnce(t *testing.T, recs []*kgo.Record, evs []envelope.Event) {
	t.Helper()
	seen := map[string]int{}
	next := map[string]int{} // key → the next i expected
	for _, rec := range recs {
		var id string
		for _, h := range rec.Headers {
			if h.Key == "keiro-message-id" {
				id = string(h.Value)
			}
		}
		seen[id]++
		key := string(rec.Key)
		require.Equal(t, fmt.Sprintf(`{"i":%d}`, next[key]), string(rec.Value), "key %s out of order", key)
		next[key]++
	}
	for _, e := range evs {
		require.Equal(t, 1, seen[e.MessageID], "message %s seen %d times", e.MessageID, seen[e.MessageID])
	}
	require.Len(t, recs, len(evs))
}

// An exactly-once relay publishes every event once, in key order, for a read_committed reader,
// in transactions that also write its claims record to the offsets topic.
func TestExactlyOnceClaimPublishesEachOnce(t *testing.T) {
	t.Parallel()
	evs := eosEvents(60, 6)
	db, _ := setup(t, evs...)
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "t1", 3)
	r := eosRelay(t, db, kc, func(c *RelayConfig) { c.BatchSize = 7; c.MaxInFlightBatches = 3 })
	runRelay(t, r)
	waitSent(t, db, len(evs))
	requireExactlyOnce(t, readCommitted(t, kc, "t1"), evs)

	st, ok := r.ExactlyOnce()
	require.True(t, ok)
	require.Contains(t, st.TransactionalID, "keiro-relay-claim."+db.Schema+".")
	require.Positive(t, st.Committed)
	require.Zero(t, st.Fenced)
	c, err := exactlyonce.ReadClaims(context.Background(), kc.Client.Opts(), exactlyonce.DefaultOffsetsTopic, st.TransactionalID)
	require.NoError(t, err, "the offsets topic holds the relay's claims record")
	require.False(t, c.At.IsZero())
	var withTxn int
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM keiro_outbox WHERE claim_txn = $1", st.TransactionalID).Scan(&withTxn))
	require.Equal(t, len(evs), withTxn, "the claims name the relay's transactional id")
}

// A relay that dies after its transaction committed and before its marks landed: once the
// lease expired, a second relay fences its transactional id, reads its claims record, and marks
// the rows sent without publishing them again.
func TestExactlyOnceLostClaimAfterCommitIsMarkedSent(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{}, func(t *testing.T, kc *testenv.Kafka) {
		topic := kc.Topic("t1")
		evs := eosEvents(20, 4)
		for i := range evs {
			evs[i].Destination = topic
		}
		db, _ := setup(t, evs...)
		kc.CreateTopic(t, topic, 3)
		const lease = 2 * time.Second
		a := eosRelay(t, db, kc, func(c *RelayConfig) { c.Lease = lease; c.MaxInFlightBatches = 1 })
		committed, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		a.afterCommit = func() {
			once.Do(func() {
				a.frozen.Store(true) // dead: no more renewals, no marks
				close(committed)
				<-release
			})
		}
		runRelay(t, a)
		t.Cleanup(func() { close(release) }) // before a's own cleanup stops it
		<-committed

		b := eosRelay(t, db, kc, func(c *RelayConfig) { c.Lease = lease })
		runRelay(t, b)
		waitSent(t, db, len(evs))
		st := waitRecovered(t, b, len(evs))
		require.Equal(t, int64(len(evs)), st.RecoveredSent, "the committed rows are marked sent from the claims record")
		require.Zero(t, b.Stats().Published, "nothing is published again")
		requireExactlyOnce(t, readCommitted(t, kc, topic), evs)
	})
}

// A relay frozen between its produce and its commit, past its lease: a second relay fences it
// (its open transaction is aborted), releases its rows and publishes them. When the zombie
// resumes, its commit is refused: it publishes nothing visible. Each event is on the topic
// once for a read_committed reader.
func TestExactlyOnceZombieIsFenced(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{}, func(t *testing.T, kc *testenv.Kafka) {
		topic := kc.Topic("t1")
		evs := eosEvents(20, 4)
		for i := range evs {
			evs[i].Destination = topic
		}
		db, _ := setup(t, evs...)
		kc.CreateTopic(t, topic, 3)
		const lease = 2 * time.Second
		var marked testenv.Progress // the zombie's batches marked
		a := eosRelay(t, db, kc, func(c *RelayConfig) {
			c.Lease, c.MaxInFlightBatches = lease, 1
			c.OnBatch = func(BatchResult) { marked.Add(1) }
		})
		frozen, resume := make(chan struct{}), make(chan struct{})
		var once sync.Once
		a.beforeCommit = func() {
			once.Do(func() {
				a.frozen.Store(true)
				close(frozen)
				<-resume
				a.frozen.Store(false)
			})
		}
		runRelay(t, a)
		var resumeOnce sync.Once
		t.Cleanup(func() { resumeOnce.Do(func() { close(resume) }) })
		<-frozen

		b := eosRelay(t, db, kc, func(c *RelayConfig) { c.Lease = lease })
		runRelay(t, b)
		waitSent(t, db, len(evs))
		st := waitRecovered(t, b, len(evs))
		require.Equal(t, int64(len(evs)), st.RecoveredReleased, "the uncommitted rows are released")
		waitPublished(t, b, len(evs))
		require.Equal(t, int64(len(evs)), b.Stats().Published, "and published by the successor")

		resumeOnce.Do(func() { close(resume) })
		testenv.WaitFor(t, time.Minute, "the zombie's commit refused: it is fenced", func() bool {
			ast, _ := a.ExactlyOnce()
			return ast.Fenced > 0
		})
		marked.Wait(t, 1, time.Minute, nil) // its batch, read back as not committed, is marked
		ast, _ := a.ExactlyOnce()
		require.Zero(t, ast.Committed, "the zombie committed nothing")
		require.Zero(t, a.Stats().Published, "the zombie marked nothing sent")
		requireExactlyOnce(t, readCommitted(t, kc, topic), evs)
	})
}

// A record that fails in a transaction aborts it: the transaction's other rows are released,
// the failed row retried; every event ends up on the topic once, in key order.
func TestExactlyOnceRecordFailureAbortsTheTransaction(t *testing.T) {
	t.Parallel()
	evs := eosEvents(20, 4)
	db, _ := setup(t, evs...)
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "t1", 3)
	outage := kc.FailProduces(t, testenv.ProduceFailure{Topics: []string{"t1"}, Err: kerr.UnknownServerError, Requests: 1})
	r := eosRelay(t, db, kc, func(c *RelayConfig) {
		c.Backoff.Initial, c.Backoff.Max = 10*time.Millisecond, 20*time.Millisecond
	})
	runRelay(t, r)
	<-outage.Hit()
	waitSent(t, db, len(evs))
	st, _ := r.ExactlyOnce()
	require.Positive(t, st.Aborted, "the transaction with the failed record was aborted")
	requireExactlyOnce(t, readCommitted(t, kc, "t1"), evs)
}

func testLogger() *slog.Logger {
	if os.Getenv("KEIRO_TEST_EOS_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// A relay restarted with the same InstanceID fences its previous run at once, reads the claims
// that run committed, and marks their rows sent once their lease expired, publishing nothing
// twice.
func TestExactlyOnceStableInstanceRecoversItsPreviousRun(t *testing.T) {
	t.Parallel()
	evs := eosEvents(20, 4)
	db, _ := setup(t, evs...)
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "t1", 3)
	const lease = 2 * time.Second
	stable := func(c *RelayConfig) { c.Lease = lease; c.MaxInFlightBatches = 1; c.InstanceID = "relay-0" }
	a := eosRelay(t, db, kc, stable)
	committed, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	a.afterCommit = func() {
		once.Do(func() {
			a.frozen.Store(true)
			close(committed)
			<-release
		})
	}
	runRelay(t, a)
	t.Cleanup(func() { close(release) })
	<-committed

	a2 := eosRelay(t, db, kc, stable)
	runRelay(t, a2)
	waitSent(t, db, len(evs))
	st := waitRecovered(t, a2, len(evs))
	require.Equal(t, exactlyonce.ClaimTransactionalID(db.Schema, "relay-0"), st.TransactionalID)
	require.Equal(t, int64(len(evs)), st.RecoveredSent, "the previous run's committed rows are marked sent")
	require.Zero(t, a2.Stats().Published)
	requireExactlyOnce(t, readCommitted(t, kc, "t1"), evs)
}

// A commit whose outcome is unknown (the broker's answer to EndTxn is lost) is resolved from
// the claims record, read back after a new producer fenced the old one: here it did not
// commit, so its rows are released and published again, once.
func TestExactlyOnceUnknownCommitOutcomeIsReadBack(t *testing.T) {
	t.Parallel()
	evs := eosEvents(20, 4)
	db, _ := setup(t, evs...)
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "t1", 3)
	hit := make(chan struct{})
	kc.Cluster.ControlKey(int16(kmsg.EndTxn), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.EndTxnRequest)
		if !req.Commit {
			return nil, nil, false
		}
		close(hit)
		resp := req.ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = kerr.UnknownServerError.Code
		return resp, nil, true
	})
	r := eosRelay(t, db, kc, nil)
	runRelay(t, r)
	<-hit
	waitSent(t, db, len(evs))
	requireExactlyOnce(t, readCommitted(t, kc, "t1"), evs)
	st, _ := r.ExactlyOnce()
	require.Positive(t, st.Committed)
}

// The claim of an exactly-once relay writes its transactional id to claim_txn and does not
// re-claim the rows of another exactly-once claim whose lease expired (they block their key,
// every policy and claim statement alike), which RecoverTxn then settles: the rows listed as
// committed go sent, the others pending with their attempt refunded. A relay without
// ExactlyOnce re-claims such rows as always.
func TestExactlyOnceClaimSkipsLostClaimsUntilRecovered(t *testing.T) {
	t.Parallel()
	db, st := setup(t, ev("a1", k("A")), ev("a2", k("A")), ev("b1", k("B")), ev("n1", nil))
	ctx := context.Background()
	lost := &claimsql.Store{Q: st.q, Txn: "keiro-relay-claim.x.lost"}
	tok, rows, err := lost.Claim(ctx, db.Pool, PerKeyHeadOfLine, 2, time.Minute, 10, nil, 100) // in seq order
	require.NoError(t, err)
	require.Equal(t, []string{"a1", "a2"}, ids(rows))
	var txn string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT claim_txn FROM keiro_outbox WHERE message_id = 'a1'").Scan(&txn))
	require.Equal(t, lost.Txn, txn)
	_, err = db.Pool.Exec(ctx, "UPDATE keiro_outbox SET lease_until = now() - interval '1 second' WHERE status = 'publishing'")
	require.NoError(t, err)

	eos := &claimsql.Store{Q: st.q, Txn: "keiro-relay-claim.x.successor"}
	for _, tc := range []struct {
		p    Policy
		want []string
	}{
		{PerKeyHeadOfLine, []string{"b1", "n1"}},
		{PerSourceStream, []string{}}, // one source: a1 holds it
		{BestEffort, []string{"b1", "n1"}},
	} {
		for _, budget := range []int{0, 100} {
			_, got, err := eos.Claim(ctx, db.Pool, tc.p, 10, time.Minute, 10, nil, budget)
			require.NoError(t, err)
			require.Equal(t, tc.want, ids(got), "policy %s, budget %d", tc.p, budget)
			_, err = db.Pool.Exec(ctx, `UPDATE keiro_outbox SET status = 'pending', claim_token = NULL, lease_until = NULL,
			    attempt_count = 0, claim_txn = NULL WHERE message_id IN ('b1', 'n1')`) // for the next claim
			require.NoError(t, err)
		}
	}
	txns, err := eos.RecoverableTxns(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []string{lost.Txn}, txns)

	// a1's record committed, a2's did not.
	rec, err := eos.RecoverTxn(ctx, db.Pool, lost.Txn, map[envelope.UUID][]int64{tok: {rows[0].Seq}}, nil)
	require.NoError(t, err)
	require.Equal(t, claimsql.Recovered{Sent: 1, Released: 1}, rec)
	s, attempts := status(t, db, "a1")
	require.Equal(t, "sent", s)
	require.Equal(t, 1, attempts)
	s, attempts = status(t, db, "a2")
	require.Equal(t, "pending", s)
	require.Zero(t, attempts, "a released row's attempt is refunded")
	txns, err = eos.RecoverableTxns(ctx, db.Pool)
	require.NoError(t, err)
	require.Empty(t, txns)
}

// A relay without ExactlyOnce re-claims the expired rows of an exactly-once claim (mixing the
// two on one schema is at least once), and its claim clears claim_txn.
func TestAtLeastOnceClaimReclaimsExactlyOnceRows(t *testing.T) {
	t.Parallel()
	db, st := setup(t, ev("a1", k("A")))
	ctx := context.Background()
	lost := &claimsql.Store{Q: st.q, Txn: "keiro-relay-claim.x.lost"}
	_, _, err := lost.Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, nil, 0)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "UPDATE keiro_outbox SET lease_until = now() - interval '1 second'")
	require.NoError(t, err)
	_, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, nil, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"a1"}, ids(rows))
	require.True(t, rows[0].Reclaimed)
	var txn *string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT claim_txn FROM keiro_outbox").Scan(&txn))
	require.Nil(t, txn)
}

// The recovery's probe and settlement walk the open rows through the claim index, never the
// retained sent rows: an exactly-once relay runs the probe every half lease.
func TestExactlyOnceRecoveryUsesTheClaimIndex(t *testing.T) {
	t.Parallel()
	db, st := setup(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, fmt.Sprintf(`
INSERT INTO %s.keiro_outbox (outbox_id, message_id, source, destination, message_key, event_type,
    schema_version, content_type, payload_bytes, occurred_at, status, published_at, claim_txn)
SELECT gen_random_uuid(), 'm' || g, 'ordering', 't1', 'k' || (g %% 1000), 'E', 1, 'application/json',
    '\x00', now(), 'sent', now(), 'keiro-relay-claim.x.old'
FROM generate_series(1, 100000) g`, db.Schema))
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := st.EnqueueTx(ctx, tx, ev("p1", k("k1")), ev("p2", nil))
		return err
	}))
	_, err = db.Pool.Exec(ctx, "ANALYZE "+db.Schema+".keiro_outbox")
	require.NoError(t, err)
	for name, q := range map[string][]any{
		st.q.RecoverableTxns: nil,
		st.q.RecoverTxn:      {"keiro-relay-claim.x.old", [][16]byte{envelope.NewUUIDv7()}, []int64{1}, nil},
	} {
		rows, err := db.Pool.Query(ctx, "EXPLAIN "+name, q...)
		require.NoError(t, err)
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		text := strings.Join(plan, "\n")
		require.NotContains(t, text, "Seq Scan on keiro_outbox", text)
		require.Contains(t, text, "keiro_outbox_claim_idx", text)
	}
}

// An exactly-once relay refuses more rows in flight than its claims record can list.
func TestExactlyOnceBoundsTheRowsInFlight(t *testing.T) {
	t.Parallel()
	cfg := RelayConfig{ExactlyOnce: true, BatchSize: 10_000, MaxInFlightBatches: 8}
	cfg.setDefaults()
	err := cfg.validate()
	require.ErrorContains(t, err, "BatchSize × MaxInFlightBatches (80000) must be at most 65536 with ExactlyOnce")
	cfg.ExactlyOnce = false
	require.NoError(t, cfg.validate())
}

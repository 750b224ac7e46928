package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/failure"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/claimsql"
	"github.com/keiro-go/keiro/outbox/internal/markplan"
)

func ev(id string, key *string) envelope.Event {
	return envelope.Event{MessageID: id, Source: "ordering", Destination: "t1", Key: key,
		EventType: "E", ContentType: envelope.ContentTypeJSON, Payload: []byte("{}"),
		OccurredAt: time.Unix(0, 0).UTC()}
}

func k(s string) *string { return &s }

// runRelay runs r until the test or benchmark ends, then stops it and checks Run's result.
func runRelay(tb testing.TB, r *Relay) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		require.NoError(tb, <-done)
	})
}

func setup(t *testing.T, events ...envelope.Event) (*testenv.DB, *Store) {
	t.Helper()
	db := testenv.NewDB(t)
	st, err := NewStore(db.Schema)
	require.NoError(t, err)
	if len(events) > 0 {
		require.NoError(t, pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
			_, err := st.EnqueueTx(context.Background(), tx, events...)
			return err
		}))
	}
	return db, st
}

func ids(rows []claimsql.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.Event.MessageID
	}
	return out
}

func status(t *testing.T, db *testenv.DB, id string) (st string, attempts int) {
	t.Helper()
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT status, attempt_count FROM keiro_outbox WHERE message_id = $1", id).Scan(&st, &attempts))
	return st, attempts
}

func TestClaimPerKeyRunsAndNullKeys(t *testing.T) {
	t.Parallel()
	db, st := setup(t, ev("a1", k("A")), ev("n1", nil), ev("a2", k("A")), ev("b1", k("B")), ev("n2", nil), ev("a3", k("A")))
	ctx := context.Background()
	_, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, nil, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"a1", "n1", "a2", "b1", "n2", "a3"}, ids(rows))
	for _, r := range rows {
		require.Equal(t, 1, r.Attempt)
	}
	// All publishing: nothing more to claim (no tail while the head is publishing).
	_, rows, err = claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, nil, 0)
	require.NoError(t, err)
	require.Empty(t, rows)
}

func TestClaimBackoffHeadDoesNotStarveOtherKeys(t *testing.T) {
	t.Parallel()
	db, st := setup(t, ev("a1", k("A")), ev("a2", k("A")), ev("b1", k("B")), ev("b2", k("B")))
	ctx := context.Background()
	tok, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 1, time.Minute, 10, nil, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"a1"}, ids(rows))
	tr, err := claimsOf(st).MarkBatch(ctx, db.Pool, tok, []claimsql.Mark{{ID: rows[0].ID, Outcome: outcomeFailed, Err: "boom", Delay: time.Hour}}, 10)
	require.NoError(t, err)
	require.Equal(t, 1, tr.Failed)
	_, rows, err = claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, nil, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"b1", "b2"}, ids(rows))
	s, _ := status(t, db, "a2")
	require.Equal(t, "pending", s)
}

func TestClaimPolicies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy Policy
		want   []string
	}{
		// a1 is in backoff: per-key holds a2 only; per-source holds everything after a1;
		// best-effort claims everything due.
		{PerKeyHeadOfLine, []string{"b1", "n1", "b2"}},
		{StopTheLine, []string{"b1", "n1", "b2"}},
		{PerSourceStream, nil},
		{BestEffort, []string{"a2", "b1", "n1", "b2"}},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			t.Parallel()
			db, st := setup(t, ev("a1", k("A")), ev("a2", k("A")), ev("b1", k("B")), ev("n1", nil), ev("b2", k("B")))
			ctx := context.Background()
			tok, rows, err := claimsOf(st).Claim(ctx, db.Pool, tc.policy, 1, time.Minute, 10, nil, 0)
			require.NoError(t, err)
			require.Equal(t, []string{"a1"}, ids(rows))
			_, err = claimsOf(st).MarkBatch(ctx, db.Pool, tok, []claimsql.Mark{{ID: rows[0].ID, Outcome: outcomeFailed, Err: "x", Delay: time.Hour}}, 10)
			require.NoError(t, err)
			_, rows, err = claimsOf(st).Claim(ctx, db.Pool, tc.policy, 10, time.Minute, 10, nil, 0)
			require.NoError(t, err)
			require.Equal(t, tc.want, nilIfEmpty(ids(rows)))
		})
	}
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// A head locked by another, uncommitted claimer must not be jumped by its tail.
func TestClaimTailNeverJumpsLockedHead(t *testing.T) {
	t.Parallel()
	db, st := setup(t, ev("a1", k("A")), ev("a2", k("A")), ev("a3", k("A")), ev("b1", k("B")))
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SELECT 1 FROM keiro_outbox WHERE message_id = 'a1' FOR UPDATE")
	require.NoError(t, err)
	for _, p := range []Policy{PerKeyHeadOfLine, PerSourceStream} {
		_, rows, err := claimsOf(st).Claim(ctx, db.Pool, p, 10, time.Minute, 10, nil, 0)
		require.NoError(t, err)
		if p == PerKeyHeadOfLine {
			require.Equal(t, []string{"b1"}, ids(rows), p.String())
		} else {
			require.Empty(t, rows, p.String())
		}
	}
}

func TestMarkFencingAndTransitions(t *testing.T) {
	t.Parallel()
	db, st := setup(t, ev("s", k("S")), ev("f", k("F")), ev("f2", k("F")), ev("r", k("R")), ev("d", k("D")))
	ctx := context.Background()
	tok, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, nil, 0)
	require.NoError(t, err)
	require.Len(t, rows, 5)
	byID := map[string]envelope.UUID{}
	for _, r := range rows {
		byID[r.Event.MessageID] = r.ID
	}
	// A stale token changes nothing.
	tr, err := claimsOf(st).MarkBatch(ctx, db.Pool, envelope.NewUUIDv7(), []claimsql.Mark{{ID: byID["s"], Outcome: outcomeSent}}, 10)
	require.NoError(t, err)
	require.Zero(t, tr.Total())
	s, _ := status(t, db, "s")
	require.Equal(t, "publishing", s)

	tr, err = claimsOf(st).MarkBatch(ctx, db.Pool, tok, []claimsql.Mark{
		{ID: byID["s"], Outcome: outcomeSent, Partition: 2, Offset: 7},
		{ID: byID["f"], Outcome: outcomeFailed, Err: "broker unreachable", Delay: time.Hour},
		{ID: byID["f2"], Outcome: outcomeSkipped, Err: markplan.SkippedError},
		{ID: byID["r"], Outcome: outcomeRejected, Err: "too large", Code: "message_too_large"},
		{ID: byID["d"], Outcome: outcomeFailed, Err: "x"},
	}, 1)
	require.NoError(t, err)
	// maxAttempts 1: both failures are dead.
	require.Equal(t, map[string]*claimsql.DestCounts{"": {Sent: 1, Dead: 2, Retried: 1, Rejected: 1}}, tr.ByDest)
	require.Len(t, tr.Rows, 5, "every moved row, for the transition log")
	for _, mr := range tr.Rows {
		if mr.ID == byID["d"] {
			require.Equal(t, claimsql.MarkedRow{ID: byID["d"], Outcome: "failed", Status: string(StatusDead)}, mr)
		}
	}
	tr.ByDest, tr.Rows = nil, nil
	require.Equal(t, claimsql.Transitions{Sent: 1, Dead: 2, Skipped: 1, Rejected: 1}, tr)
	var part int32
	var off int64
	var pub *time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT kafka_partition, kafka_offset, published_at FROM keiro_outbox WHERE message_id='s'").Scan(&part, &off, &pub))
	require.Equal(t, int32(2), part)
	require.Equal(t, int64(7), off)
	require.NotNil(t, pub)
	s, a := status(t, db, "f2")
	require.Equal(t, "failed", s)
	require.Equal(t, 0, a)
	var code string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT rejection_code FROM keiro_outbox WHERE message_id='r'").Scan(&code))
	require.Equal(t, "message_too_large", code)

	// A late mark of the same claim after the marks: no transition.
	tr, err = claimsOf(st).MarkBatch(ctx, db.Pool, tok, []claimsql.Mark{{ID: byID["s"], Outcome: outcomeFailed, Err: "late"}}, 10)
	require.NoError(t, err)
	require.Zero(t, tr.Total())
	s, _ = status(t, db, "s")
	require.Equal(t, "sent", s)
}

func TestExpiredLeaseIsReclaimedAndFenced(t *testing.T) {
	t.Parallel()
	db, st := setup(t, ev("a1", k("A")), ev("a2", k("A")))
	ctx := context.Background()
	tok1, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 1, time.Minute, 3, nil, 0)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	// A live lease: nothing claimable (a2 blocked by the publishing head).
	_, rows, err = claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 3, nil, 0)
	require.NoError(t, err)
	require.Empty(t, rows)
	_, err = db.Pool.Exec(ctx, "UPDATE keiro_outbox SET lease_until = now() - interval '1 second' WHERE message_id = 'a1'")
	require.NoError(t, err)
	tok2, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 3, nil, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"a1", "a2"}, ids(rows))
	require.True(t, rows[0].Reclaimed)
	require.False(t, rows[1].Reclaimed)
	require.Equal(t, 2, rows[0].Attempt)
	// The first claimer's late mark is fenced out.
	tr, err := claimsOf(st).MarkBatch(ctx, db.Pool, tok1, []claimsql.Mark{{ID: rows[0].ID, Outcome: outcomeSent}}, 3)
	require.NoError(t, err)
	require.Zero(t, tr.Total())
	tr, err = claimsOf(st).MarkBatch(ctx, db.Pool, tok2, []claimsql.Mark{{ID: rows[0].ID, Outcome: outcomeSent}, {ID: rows[1].ID, Outcome: outcomeSent}}, 3)
	require.NoError(t, err)
	require.Equal(t, 2, tr.Sent)
}

// TestLeaseExpiredAfterFinalAttemptGoesDead: a row whose lease expires on its last attempt after
// its produce started goes dead in the next claim (its outcome is unknown) and frees its key.
func TestLeaseExpiredAfterFinalAttemptGoesDead(t *testing.T) {
	t.Parallel()
	db, st := setup(t, ev("a1", k("A")), ev("a2", k("A")))
	ctx := context.Background()
	tok, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 1, time.Minute, 1, nil, 0)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	moved, err := claimsOf(st).StartProduce(ctx, db.Pool, tok, [][16]byte{rows[0].ID})
	require.NoError(t, err)
	require.True(t, moved[rows[0].ID])
	_, err = db.Pool.Exec(ctx, "UPDATE keiro_outbox SET lease_until = now() - interval '1 second' WHERE message_id = 'a1'")
	require.NoError(t, err)
	_, rows, err = claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 1, nil, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"a1", "a2"}, ids(rows))
	require.True(t, rows[0].Dead)
	require.False(t, rows[1].Dead)
	var s, le string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT status, last_error FROM keiro_outbox WHERE message_id='a1'").Scan(&s, &le))
	require.Equal(t, "dead", s)
	require.Equal(t, "lease expired after final attempt", le)

	// The error of the attempt before is kept beside the reason (keiro §1.3.3 keeps only it).
	_, err = db.Pool.Exec(ctx, `UPDATE keiro_outbox SET status = 'publishing', lease_until = now() - interval '1 second',
        last_error = 'broker timeout', claim_token = $1, produce_started = true WHERE message_id = 'a2'`, [16]byte(envelope.NewUUIDv7()))
	require.NoError(t, err)
	_, rows, err = claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 1, nil, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"a2"}, ids(rows))
	require.True(t, rows[0].Dead)
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT last_error FROM keiro_outbox WHERE message_id='a2'").Scan(&le))
	require.Equal(t, "lease expired after final attempt (last error: broker timeout)", le)
}

// TestLeaseExpiryOfALastAttemptThatNeverRan: a claim whose reply was lost after it committed
// (or a relay stopped before its produce, or a mark abandoned at shutdown) leaves its rows
// publishing with an attempt counted. On the last attempt, the lease expiry must not make the
// row dead (the attempt never ran): the next claim takes it for that attempt again, without
// counting another, and its key stays blocked behind it.
func TestLeaseExpiryOfALastAttemptThatNeverRan(t *testing.T) {
	t.Parallel()
	db, st := setup(t, ev("a1", k("A")), ev("a2", k("A")))
	ctx := context.Background()
	_, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 1, time.Minute, 1, nil, 0) // reply "lost"
	require.NoError(t, err)
	require.Len(t, rows, 1)
	_, err = db.Pool.Exec(ctx, "UPDATE keiro_outbox SET lease_until = now() - interval '1 second' WHERE message_id = 'a1'")
	require.NoError(t, err)
	tok, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 1, nil, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"a1", "a2"}, ids(rows))
	require.False(t, rows[0].Dead, "a row went dead on an attempt that never ran")
	require.True(t, rows[0].Reclaimed)
	require.Equal(t, 1, rows[0].Attempt, "the attempt that never ran was counted again")
	var s string
	var attempts int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT status, attempt_count FROM keiro_outbox WHERE message_id='a1'").Scan(&s, &attempts))
	require.Equal(t, "publishing", s)
	require.Equal(t, 1, attempts)
	// The re-claimed row is published and marked normally.
	tr, err := claimsOf(st).MarkBatch(ctx, db.Pool, tok, []claimsql.Mark{{ID: rows[0].ID, Outcome: outcomeSent}, {ID: rows[1].ID, Outcome: outcomeSent}}, 1)
	require.NoError(t, err)
	require.Equal(t, 2, tr.Sent)
}

// TestProduceStartKeepsTheClaimToken: recording the produce start of a last attempt sets the
// row's produce_started under the claim token and leaves the token alone, so the batch's
// renewals and marks still reach its rows; a relay that lost them records nothing. The mark
// clears the record with the token.
func TestProduceStartKeepsTheClaimToken(t *testing.T) {
	t.Parallel()
	db, st := setup(t, ev("a1", k("A")), ev("b1", k("B")))
	ctx := context.Background()
	tok, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 1, nil, 0)
	require.NoError(t, err)
	require.Len(t, rows, 2)
	moved, err := claimsOf(st).StartProduce(ctx, db.Pool, tok, [][16]byte{rows[0].ID})
	require.NoError(t, err)
	require.Len(t, moved, 1)
	var started bool
	var held [16]byte
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT produce_started, claim_token FROM keiro_outbox WHERE message_id = 'a1'").Scan(&started, &held))
	require.True(t, started)
	require.Equal(t, [16]byte(tok), held, "the produce start changed the claim token")
	moved, err = claimsOf(st).StartProduce(ctx, db.Pool, envelope.NewUUIDv7(), [][16]byte{rows[1].ID})
	require.NoError(t, err)
	require.Empty(t, moved, "another token recorded a produce start")
	n, err := claimsOf(st).RenewLease(ctx, db.Pool, tok, [][16]byte{rows[0].ID, rows[1].ID}, time.Minute)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	tr, err := claimsOf(st).MarkBatch(ctx, db.Pool, tok, []claimsql.Mark{{ID: rows[0].ID, Outcome: outcomeSent}, {ID: rows[1].ID, Outcome: outcomeSent}}, 1)
	require.NoError(t, err)
	require.Equal(t, 2, tr.Sent)
	var stillStarted int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM keiro_outbox WHERE produce_started").Scan(&stillStarted))
	require.Zero(t, stillStarted, "the mark kept a produce start")
}

func TestClaimDestinationsFilter(t *testing.T) {
	t.Parallel()
	e2 := ev("x", nil)
	e2.Destination = "t2"
	db, st := setup(t, ev("a", nil), e2)
	_, rows, err := claimsOf(st).Claim(context.Background(), db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, []string{"t2"}, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"x"}, ids(rows))
}

// TestClaimScanBudget: a claim with a scan budget considers only the first open rows in seq
// order (in flight or not); with fewer open rows than the budget, all of them.
func TestClaimScanBudget(t *testing.T) {
	t.Parallel()
	db, st := setup(t, ev("a1", k("A")), ev("a2", k("A")), ev("a3", k("A")), ev("a4", k("A")), ev("a5", k("A")),
		ev("b1", k("B")), ev("c1", k("C")))
	ctx := context.Background()
	claim := func(budget int) []string {
		t.Helper()
		_, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, nil, budget)
		require.NoError(t, err)
		return ids(rows)
	}
	_, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 1, time.Minute, 10, nil, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"a1"}, ids(rows)) // key A in flight
	require.Empty(t, claim(5), "the first five open rows are key A's")
	require.Equal(t, []string{"b1"}, claim(6))
	require.Empty(t, claim(6), "b1 is in flight now")
	require.Equal(t, []string{"c1"}, claim(100), "fewer open rows than the budget: all of them")
}

// TestClaimExplainUsesIndex checks the claim plan with many retained sent rows: it must reach
// rows through the partial claim index, never a sequential scan of the table.
func TestClaimExplainUsesIndex(t *testing.T) {
	t.Parallel()
	db, st := setup(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, fmt.Sprintf(`
INSERT INTO %s.keiro_outbox (outbox_id, message_id, source, destination, message_key, event_type,
    schema_version, content_type, payload_bytes, occurred_at, status, published_at)
SELECT gen_random_uuid(), 'm' || g, 'ordering', 't1', 'k' || (g %% 1000), 'E', 1, 'application/json',
    '\x00', now(), 'sent', now()
FROM generate_series(1, 100000) g`, db.Schema))
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := st.EnqueueTx(ctx, tx, ev("p1", k("k1")), ev("p2", nil))
		return err
	}))
	_, err = db.Pool.Exec(ctx, "ANALYZE "+db.Schema+".keiro_outbox")
	require.NoError(t, err)
	for _, p := range []Policy{PerKeyHeadOfLine, StopTheLine, PerSourceStream, BestEffort} {
		q := claimsOf(st).ClaimSQL(p)
		for _, budget := range []any{nil, int64(2048)} {
			// Unrestricted, and restricted to half of the claim shares (internal/shares).
			shares := any(nil)
			if budget != nil {
				shares = int64(0x5555_5555_5555_5555)
			}
			rows, err := db.Pool.Query(ctx, "EXPLAIN "+q, [16]byte(envelope.NewUUIDv7()), 10, int64(60e6), 512, nil, budget, shares)
			require.NoError(t, err)
			var plan string
			for rows.Next() {
				var line string
				require.NoError(t, rows.Scan(&line))
				plan += line + "\n"
			}
			require.NoError(t, rows.Err())
			require.NotContains(t, plan, "Seq Scan on keiro_outbox", "policy %s, budget %v, plan:\n%s", p, budget, plan)
			require.Contains(t, plan, "keiro_outbox_claim_idx", "policy %s, budget %v, plan:\n%s", p, budget, plan)
		}
	}
}

// TestMarkOutcomeCountsOrderBroken: when Kafka acknowledges a row after an earlier row of its
// key failed in the same flush, the relay marks the truth (the acked row is sent, the failed one
// retried) and reports the broken order; a failure followed by a success of another key, a
// rejected row, or a keyless row is not a break.
func TestMarkOutcomeCountsOrderBroken(t *testing.T) {
	t.Parallel()
	db, st := setup(t, ev("a1", k("A")), ev("b1", k("B")), ev("a2", k("A")), ev("c1", k("C")), ev("c2", k("C")), ev("n1", nil), ev("n2", nil))
	kc := testenv.NewKafka(t)
	r, err := NewRelay(db.Pool, kc.NewClient(t, ProducerOpts()...), RelayConfig{Schema: db.Schema, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ctx := context.Background()
	token, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, nil, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"a1", "b1", "a2", "c1", "c2", "n1", "n2"}, ids(rows))
	fail := produceResult{done: true, err: kerr.UnknownServerError}
	ok := produceResult{done: true, partition: 0, offset: 7}
	tooLarge := produceResult{done: true, err: kerr.MessageTooLarge}
	b := &claimedBatch{token: token, rows: rows, results: []produceResult{fail, ok, ok, tooLarge, ok, fail, ok}}
	res := r.markOutcome(ctx, b)
	require.Equal(t, 1, res.OrderBroken, "a2 acked after a1 failed")
	require.EqualValues(t, 1, r.Stats().OrderBroken)
	for id, want := range map[string]string{"a1": "failed", "a2": "sent", "b1": "sent", "c1": "rejected", "c2": "sent", "n1": "failed", "n2": "sent"} {
		got, _ := status(t, db, id)
		require.Equal(t, want, got, id)
	}
}

// TestRelayClaimsOnceMoreAfterTakingTheSleepLock: a producer that saw the relay awake does not
// notify. If it commits after the relay's last claim and before the relay takes the sleep lock
// (forced here from the hook), only the claim the relay makes with the lock held can find its
// row: without it the row would wait for the poll, an hour.
func TestRelayClaimsOnceMoreAfterTakingTheSleepLock(t *testing.T) {
	t.Parallel()
	db, st := setup(t)
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "t1", 1)
	published := make(chan struct{}, 10)
	r, err := NewRelay(db.Pool, kc.NewClient(t, ProducerOpts()...), RelayConfig{Schema: db.Schema, PollInterval: time.Hour,
		Logger: slog.New(slog.DiscardHandler), OnBatch: func(b BatchResult) {
			for range b.Published {
				published <- struct{}{}
			}
		}})
	require.NoError(t, err)
	ctx := context.Background()
	var once sync.Once
	hookErr := make(chan error, 1)
	r.sleepHook = func() {
		once.Do(func() {
			hookErr <- pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := st.EnqueueTx(ctx, tx, ev("in-the-window", k("k")))
				return err
			})
		})
	}
	runRelay(t, r)
	require.NoError(t, <-hookErr)
	select {
	case <-published:
	case <-time.After(5 * time.Second):
		t.Fatal("the row committed just before the relay fell asleep was not published")
	}
}

// TestSleepLockTry: a try of either sleep lock takes it when it is free, answers "producers"
// while a producer that did not notify is in its transaction (and leaves it to them), and
// "relay" while another relay holds it; the two keys are independent.
func TestSleepLockTry(t *testing.T) {
	t.Parallel()
	db, st := setup(t)
	ctx := context.Background()
	conns := make([]*pgx.Conn, 2)
	for i := range conns {
		c, err := pgx.Connect(ctx, db.ConnString)
		require.NoError(t, err)
		defer c.Close(ctx)
		conns[i] = c
	}
	try := func(c *pgx.Conn, q string) string {
		t.Helper()
		var got string
		require.NoError(t, c.QueryRow(ctx, q).Scan(&got))
		return got
	}
	for _, c := range []struct{ name, lock, unlock, other string }{
		{"all", st.q.SleepLock, st.q.SleepUnlock, st.q.SleepLockFiltered},
		{"filtered", st.q.SleepLockFiltered, st.q.SleepUnlockFiltered, st.q.SleepLock},
	} {
		t.Run(c.name, func(t *testing.T) {
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			_, err = st.EnqueueTx(ctx, tx, ev("p-"+c.name, k("k")))
			require.NoError(t, err)
			require.Equal(t, "producers", try(conns[0], c.lock))
			require.Equal(t, "producers", try(conns[0], c.lock), "the probe leaves the lock to the producer")
			require.NoError(t, tx.Commit(ctx))
			require.Equal(t, "taken", try(conns[0], c.lock))
			require.Equal(t, "relay", try(conns[1], c.lock))
			require.Equal(t, "taken", try(conns[1], c.other), "the other key is independent")
			_, err = conns[1].Exec(ctx, `SELECT pg_advisory_unlock_all()`)
			require.NoError(t, err)
			var ok bool
			require.NoError(t, conns[0].QueryRow(ctx, c.unlock).Scan(&ok))
			require.True(t, ok)
			require.Equal(t, "taken", try(conns[1], c.lock))
			_, err = conns[1].Exec(ctx, `SELECT pg_advisory_unlock_all()`)
			require.NoError(t, err)
		})
	}
}

// TestMarkKeepsAttemptHistory: each failed or rejected produce appends its attempt, number,
// time, error and code to the row's history, which a sent row never gets.
func TestMarkKeepsAttemptHistory(t *testing.T) {
	t.Parallel()
	db, st := setup(t, ev("f", k("F")), ev("r", k("R")), ev("s", k("S")))
	ctx := context.Background()
	byID := map[string]envelope.UUID{}
	tok, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, nil, 0)
	require.NoError(t, err)
	for _, r := range rows {
		byID[r.Event.MessageID] = r.ID
	}
	_, err = claimsOf(st).MarkBatch(ctx, db.Pool, tok, []claimsql.Mark{
		{ID: byID["f"], Outcome: outcomeFailed, Err: "broker unreachable"},
		{ID: byID["r"], Outcome: outcomeRejected, Err: "too large", Code: "message_too_large"},
		{ID: byID["s"], Outcome: outcomeSent},
	}, 5)
	require.NoError(t, err)
	tok, rows, err = claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, nil, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"f"}, ids(rows))
	_, err = claimsOf(st).MarkBatch(ctx, db.Pool, tok, []claimsql.Mark{{ID: byID["f"], Outcome: outcomeFailed, Err: "request timed out"}}, 5)
	require.NoError(t, err)

	h, err := AdminOf(st).AttemptHistory(ctx, db.Pool, byID["f"])
	require.NoError(t, err)
	require.Len(t, h, 2)
	require.Equal(t, 1, h[0].Attempt)
	require.Equal(t, "broker unreachable", h[0].Error)
	require.Equal(t, 2, h[1].Attempt)
	require.Equal(t, "request timed out", h[1].Error)
	require.False(t, h[1].At.Before(h[0].At))
	h, err = AdminOf(st).AttemptHistory(ctx, db.Pool, byID["r"])
	require.NoError(t, err)
	require.Equal(t, []failure.Attempt{{Attempt: 1, At: h[0].At, Error: "too large", Code: "message_too_large"}}, h)
	h, err = AdminOf(st).AttemptHistory(ctx, db.Pool, byID["s"])
	require.NoError(t, err)
	require.Empty(t, h)
	_, err = AdminOf(st).AttemptHistory(ctx, db.Pool, envelope.NewUUIDv7())
	require.ErrorIs(t, err, ErrNotFound)
}

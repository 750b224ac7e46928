package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// TestAdmin_RejectWithADetail is keiro's caller-side PublishRejected (post-0.2 outbox, keiro-spec
// §1.4 item 2): a caller rejects open rows with a code and a detail. The rows end 'rejected'
// with both, listed as dead letters; in flight, sent and unknown rows are left alone; a bad
// rejection changes nothing; a rejection in a rolled-back transaction does not happen; the
// rejected head does not block its key; and Requeue brings it back to be published.
func TestAdmin_RejectWithADetail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, kc, st := rig(t, 1)
	admin, err := outbox.NewAdmin(db.Schema)
	require.NoError(t, err)
	k1, k2 := "k1", "k2"
	res := enqueue(t, db.Pool, st,
		event("a", "orders", &k1, `{"card":"4111"}`), event("b", "orders", &k1, `{}`),
		event("c", "orders", &k1, `{}`), event("d", "orders", &k2, `{}`), event("e", "orders", &k2, `{}`))
	a, b, e := res[0].OutboxID, res[1].OutboxID, res[4].OutboxID
	pii := outbox.Rejection{Code: "policy.pii", Detail: "a card number in the payload"}

	// Bad rejections are refused whole, naming each problem, before anything is written.
	_, err = admin.Reject(ctx, db.Pool, []envelope.UUID{a}, outbox.Rejection{Code: "Policy PII", Detail: strings.Repeat("x", outbox.MaxRejectionDetail+1)})
	require.ErrorIs(t, err, outbox.ErrInvalidRejection)
	require.ErrorContains(t, err, "Code")
	require.ErrorContains(t, err, "Detail: 1025 bytes")
	_, err = admin.Reject(ctx, db.Pool, []envelope.UUID{a}, outbox.Rejection{Code: "policy", Detail: "nul\x00"})
	require.ErrorIs(t, err, outbox.ErrInvalidRejection)

	// In the caller's transaction: rolled back, nothing happened.
	changed := errors.New("changed our mind")
	require.ErrorIs(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		got, err := admin.Reject(ctx, tx, []envelope.UUID{a}, pii)
		require.NoError(t, err)
		require.Equal(t, []envelope.UUID{a}, got)
		return changed
	}), changed)
	row, err := admin.Lookup(ctx, db.Pool, a)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, row.Status)

	// A row in flight (claimed by a relay) is not rejected; an unknown id is skipped.
	_, err = db.Pool.Exec(ctx, `UPDATE keiro_outbox SET status = 'publishing', claim_token = gen_random_uuid(),
		lease_until = now() + interval '1 minute', attempt_count = 1 WHERE outbox_id = $1`, e)
	require.NoError(t, err)
	got, err := admin.Reject(ctx, db.Pool, []envelope.UUID{a, e, envelope.NewUUIDv7()}, pii)
	require.NoError(t, err)
	require.Equal(t, []envelope.UUID{a}, got)
	_, err = db.Pool.Exec(ctx, `UPDATE keiro_outbox SET status = 'pending', claim_token = NULL, lease_until = NULL, attempt_count = 0 WHERE outbox_id = $1`, e)
	require.NoError(t, err)

	row, err = admin.Lookup(ctx, db.Pool, a)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusRejected, row.Status)
	require.Equal(t, "policy.pii", row.RejectionCode)
	require.Equal(t, "a card number in the payload", row.LastError)
	dead, err := admin.ListDead(ctx, db.Pool, outbox.ListDeadOptions{})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, a, dead[0].OutboxID)
	got, err = admin.Reject(ctx, db.Pool, []envelope.UUID{a}, pii)
	require.NoError(t, err)
	require.Empty(t, got, "already rejected")

	// The rejected head does not block k1: b and c publish after it, in order, with k2's rows.
	p := new(testenv.Progress)
	startRelay(t, db, kc, outbox.RelayConfig{OnBatch: onSettled(p), Logger: testLogger(t)})
	p.Wait(t, 4, 30*time.Second, nil)
	recs := kc.ConsumeRecords(t, 4, 30*time.Second, "orders")
	var k1IDs []string
	for _, r := range recs {
		if string(r.Key) == k1 {
			for _, h := range r.Headers {
				if h.Key == "keiro-message-id" {
					k1IDs = append(k1IDs, string(h.Value))
				}
			}
		}
	}
	require.Equal(t, []string{"b", "c"}, k1IDs)

	// A sent row cannot be rejected; Requeue brings the rejected one back and it is published.
	got, err = admin.Reject(ctx, db.Pool, []envelope.UUID{b}, pii)
	require.NoError(t, err)
	require.Empty(t, got)
	n, err := admin.Requeue(ctx, db.Pool, outbox.RequeueFilter{IDs: []envelope.UUID{a}})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	p.Wait(t, 5, 30*time.Second, nil)
	row, err = admin.Lookup(ctx, db.Pool, a)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusSent, row.Status)
	require.Empty(t, row.RejectionCode)
}

// TestAdmin_RejectRacesAClaim: a rejection that meets a row a relay is claiming waits for the
// claim's transaction on the row's lock, then sees the row in flight and leaves it alone: a row
// is never both published and rejected.
func TestAdmin_RejectRacesAClaim(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, _, st := rig(t, 1)
	admin, err := outbox.NewAdmin(db.Schema)
	require.NoError(t, err)
	k := "k"
	x := enqueue(t, db.Pool, st, event("x", "orders", &k, `{}`))[0].OutboxID

	claim, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = claim.Rollback(ctx) }()
	_, err = claim.Exec(ctx, `UPDATE keiro_outbox SET status = 'publishing', claim_token = gen_random_uuid(),
		lease_until = now() + interval '1 minute', attempt_count = 1 WHERE outbox_id = $1`, x)
	require.NoError(t, err)

	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var pid int32
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	type result struct {
		ids []envelope.UUID
		err error
	}
	done := make(chan result, 1)
	go func() {
		ids, err := admin.Reject(ctx, conn.Conn(), []envelope.UUID{x}, outbox.Rejection{Code: "policy.pii"})
		done <- result{ids, err}
	}()
	for {
		var waiting bool
		require.NoError(t, db.Pool.QueryRow(ctx,
			`SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting))
		if waiting {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the rejection did not wait for the claim: %v, %v", r.ids, r.err)
		default:
		}
	}
	require.NoError(t, claim.Commit(ctx))
	r := <-done
	require.NoError(t, r.err)
	require.Empty(t, r.ids, "the claimed row is not rejected")
	row, err := admin.Lookup(ctx, db.Pool, x)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPublishing, row.Status)
	require.Empty(t, row.RejectionCode)
}

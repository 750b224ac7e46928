package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/claimsql"
	"github.com/keiro-go/keiro/outbox/internal/shares"
)

// TestDeepClaimCostDoesNotFollowTheBacklog: every key's head is in flight except one key's, at
// the very end of the backlog; the claim past the front must find that head (and the null-key
// row) at a cost that follows the keys, not the rows behind the heads: 40 times the tails
// cost it less than twice the buffers. (The walk in seq order read every row: 1,445 and
// 62,105 buffers.) The statistics are those of a freshly written table: none.
func TestDeepClaimCostDoesNotFollowTheBacklog(t *testing.T) {
	t.Parallel()
	const keys = 50
	blocks := map[int]int64{}
	for _, depth := range []int{10, 400} {
		db := testenv.NewDB(t)
		st, err := NewStore(db.Schema)
		require.NoError(t, err)
		ctx := context.Background()
		_, err = db.Pool.Exec(ctx, fmt.Sprintf(`
INSERT INTO keiro_outbox (outbox_id, message_id, source, destination, message_key, event_type,
    schema_version, content_type, payload_bytes, occurred_at)
SELECT gen_random_uuid(), 'm' || g, 'ordering', 't1', CASE WHEN g %% 997 = 0 THEN NULL ELSE 'k' || (g %% %d) END,
    'E', 1, 'application/json', convert_to(repeat('x', 256), 'UTF8'), now()
FROM generate_series(1, %d) g`, keys, keys*depth))
		require.NoError(t, err)
		// Every head in flight under a live lease, the null-key rows too.
		_, err = db.Pool.Exec(ctx, `
UPDATE keiro_outbox SET status = 'publishing', claim_token = gen_random_uuid(), lease_until = now() + interval '1 hour'
WHERE message_key IS NULL OR seq IN (SELECT min(seq) FROM keiro_outbox GROUP BY message_key)`)
		require.NoError(t, err)
		// One key whose head is claimable, written last, and one null-key row.
		_, err = db.Pool.Exec(ctx, `
INSERT INTO keiro_outbox (outbox_id, message_id, source, destination, message_key, event_type,
    schema_version, content_type, payload_bytes, occurred_at)
VALUES (gen_random_uuid(), 'z1', 'ordering', 't1', 'a', 'E', 1, 'application/json', '\x00', now()),
       (gen_random_uuid(), 'z2', 'ordering', 't1', 'a', 'E', 1, 'application/json', '\x00', now()),
       (gen_random_uuid(), 'n1', 'ordering', 't1', NULL, 'E', 1, 'application/json', '\x00', now())`)
		require.NoError(t, err)
		blocks[depth] = claimBlocks(t, db, st.q.ClaimKeys, []string{"z1", "z2", "n1"},
			[16]byte(envelope.NewUUIDv7()), 10, int64(60e6), 512, nil, nil, "", "")
	}
	t.Logf("buffers touched by the claim: %v", blocks)
	require.Less(t, blocks[400], 2*blocks[10], "the claim's cost grew with the rows behind the heads")
}

// claimBlocks runs claim under EXPLAIN (ANALYZE, BUFFERS) in a transaction it rolls back, with
// the claim's planner settings, checks the ids it claims, and returns the buffers it touched.
// KEIRO_TEST_PLAN=1 logs the plan.
func claimBlocks(t *testing.T, db *testenv.DB, claim string, want []string, args ...any) int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	for _, set := range []string{"SET LOCAL enable_bitmapscan = off", "SET LOCAL enable_seqscan = off"} {
		_, err := tx.Exec(ctx, set)
		require.NoError(t, err)
	}
	if os.Getenv("KEIRO_TEST_PLAN") != "" { // log the plan (the claim runs in a savepoint rolled back)
		_, err := tx.Exec(ctx, "SAVEPOINT plan")
		require.NoError(t, err)
		lines, err := pgx.CollectRows(mustQuery(t, tx, "EXPLAIN (ANALYZE, COSTS OFF) "+claim, args...), pgx.RowTo[string])
		require.NoError(t, err)
		t.Log("\n" + strings.Join(lines, "\n"))
		_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT plan")
		require.NoError(t, err)
	}
	var plan []byte
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+claim, args...).Scan(&plan))
	var p []struct {
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		}
	}
	require.NoError(t, json.Unmarshal(plan, &p))
	got, err := pgx.CollectRows(mustQuery(t, tx, "SELECT message_id FROM keiro_outbox WHERE status = 'publishing' AND message_id IN ('z1', 'z2', 'n1') ORDER BY seq"), pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, want, got, "the claim took the heads that were claimable")
	return p[0].Plan.Hit + p[0].Plan.Read
}

func mustQuery(t *testing.T, tx pgx.Tx, sql string, args ...any) pgx.Rows {
	t.Helper()
	rows, err := tx.Query(context.Background(), sql, args...)
	require.NoError(t, err)
	return rows
}

// TestDeepClaimResumesAfterItsCursor: the claim past the front looks only at the keys after its
// cursor (and at null-key rows), so a relay's next such claim does not walk again the keys in
// flight; lastKey is the cursor after a batch's keys, and the zero cursor starts at the first.
func TestDeepClaimResumesAfterItsCursor(t *testing.T) {
	t.Parallel()
	db, st := setup(t, ev("a1", k("a")), ev("b1", k("b")), ev("c1", k("c")), ev("c2", k("c")), ev("d1", k("d")), ev("n1", nil))
	ctx := context.Background()
	_, rows, err := claimsOf(st).ClaimIn(ctx, db.Pool, PerKeyHeadOfLine, 2, time.Minute, 10, nil, 0, shares.All, claimsql.KeyCursor{})
	require.NoError(t, err)
	require.Equal(t, []string{"a1", "b1"}, ids(rows))
	from := claimsql.LastKey(rows)
	require.Equal(t, claimsql.KeyCursor{Source: "ordering", Key: "b"}, from)
	_, rows, err = claimsOf(st).ClaimIn(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, nil, 0, shares.All, from)
	require.NoError(t, err)
	require.Equal(t, []string{"c1", "c2", "d1", "n1"}, ids(rows))
	require.Equal(t, claimsql.KeyCursor{Source: "ordering", Key: "d"}, claimsql.LastKey(rows))
	_, err = db.Pool.Exec(ctx, "UPDATE keiro_outbox SET status = 'pending', claim_token = NULL, lease_until = NULL WHERE message_id IN ('a1', 'c1', 'c2')")
	require.NoError(t, err)
	_, rows, err = claimsOf(st).ClaimIn(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, nil, 0, shares.All, claimsql.KeyCursor{Source: "ordering", Key: "d"})
	require.NoError(t, err)
	require.Empty(t, rows, "no key after d")
	_, rows, err = claimsOf(st).ClaimIn(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, nil, 0, shares.All, claimsql.KeyCursor{})
	require.NoError(t, err)
	require.Equal(t, []string{"a1", "c1", "c2"}, ids(rows))
}

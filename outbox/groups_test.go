package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// The failure groups put dead and rejected rows whose errors differ only by ids, long hex runs
// and numbers in one group per class (dead, or rejected and its code), largest first; an
// archived row, a row in another status and a different message stay out of a group.
func TestFailureGroupsNormaliseErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	res := enqueue(t, db.Pool, st,
		event("d1", "orders", ptr("a"), "{}"), event("d2", "payments", ptr("b"), "{}"),
		event("d3", "orders", ptr("c"), "{}"), event("r1", "orders", ptr("d"), "{}"),
		event("r2", "orders", ptr("e"), "{}"), event("f1", "orders", ptr("f"), "{}"))
	_, err = db.Pool.Exec(ctx, `
UPDATE keiro_outbox SET status = 'dead', updated_at = now() - interval '2 minutes',
    last_error = 'kafka: NOT_ENOUGH_REPLICAS for 0191a2b3-c4d5-7e6f-8a9b-0c1d2e3f4a5b at offset 12 (batch deadbeefdeadbeef00)' WHERE message_id = 'd1';
UPDATE keiro_outbox SET status = 'dead', updated_at = now() - interval '1 minute',
    last_error = 'kafka: NOT_ENOUGH_REPLICAS for 0191a2b3-c4d5-7e6f-8a9b-ffffffffffff at offset 9000 (batch 0123456789abcdef01)' WHERE message_id = 'd2';
UPDATE keiro_outbox SET status = 'dead', last_error = 'kafka: NOT_ENOUGH_REPLICAS for 0191a2b3-c4d5-7e6f-8a9b-000000000000 at offset 1 (batch 00000000000000000a)' WHERE message_id = 'd3';
UPDATE keiro_outbox SET status = 'rejected', rejection_code = 'message_too_large', rejected_at = now(),
    last_error = 'record of about 4435 bytes exceeds the 1024-byte limit' WHERE message_id IN ('r1', 'r2');
UPDATE keiro_outbox SET status = 'failed', last_error = 'kafka: NOT_ENOUGH_REPLICAS for 0191a2b3-c4d5-7e6f-8a9b-000000000001 at offset 2 (batch 00000000000000000b)' WHERE message_id = 'f1';`)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		got, err := outbox.AdminOf(st).ArchiveTx(ctx, tx, []envelope.UUID{res[2].OutboxID})
		require.Len(t, got, 1)
		return err
	}))

	groups, err := outbox.AdminOf(st).FailureGroups(ctx, db.Pool, 10)
	require.NoError(t, err)
	require.Len(t, groups, 2)
	dead, rejected := groups[0], groups[1]
	if dead.Class != "dead" {
		dead, rejected = rejected, dead
	}
	require.Equal(t, "dead", dead.Class)
	require.Equal(t, "kafka: NOT_ENOUGH_REPLICAS for <id> at offset <n> (batch <hex>)", dead.Message)
	require.EqualValues(t, 2, dead.Count, "the archived and the failed row are not in it")
	require.Equal(t, []string{"orders", "payments"}, dead.Where)
	require.True(t, dead.First.Before(dead.Last))
	require.Contains(t, dead.Example, "kafka: NOT_ENOUGH_REPLICAS for 0191a2b3-")
	require.Equal(t, "rejected: message_too_large", rejected.Class)
	require.Equal(t, "record of about <n> bytes exceeds the <n>-byte limit", rejected.Message)
	require.EqualValues(t, 2, rejected.Count)

	ids, err := outbox.AdminOf(st).FailureGroupIDs(ctx, db.Pool, dead.Class, dead.Message, 10)
	require.NoError(t, err)
	require.Equal(t, []envelope.UUID{res[1].OutboxID, res[0].OutboxID}, ids, "newest first")
	ids, err = outbox.AdminOf(st).FailureGroupIDs(ctx, db.Pool, dead.Class, dead.Message, 1)
	require.NoError(t, err)
	require.Equal(t, []envelope.UUID{res[1].OutboxID}, ids)
	ids, err = outbox.AdminOf(st).FailureGroupIDs(ctx, db.Pool, "rejected: message_too_large", dead.Message, 10)
	require.NoError(t, err)
	require.Empty(t, ids, "the class is part of the group")

	top, err := outbox.AdminOf(st).FailureGroups(ctx, db.Pool, 1)
	require.NoError(t, err)
	require.Len(t, top, 1)
	_, err = outbox.AdminOf(st).FailureGroups(ctx, db.Pool, 0)
	require.Error(t, err)
	_, err = outbox.AdminOf(st).FailureGroupIDs(ctx, db.Pool, dead.Class, dead.Message, 0)
	require.Error(t, err)
}

package workflow_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/workflow"
)

// keiro Sleep "prefixes the journal step name with the reserved sleep prefix", Child "derives the
// child spawn and result step names", Awakeable "derives a deterministic AwakeableId, stable across
// calls and label-sensitive": the journal names of the operations, and user steps may not take
// their prefixes.
func TestReservedStepNames(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var ids []envelope.UUID
	_, err := workflow.Register(b.e, "kid", func(c *workflow.Context, _ struct{}) (int, error) { return 1, nil })
	require.NoError(t, err)
	w, err := workflow.Register(b.e, "names", func(c *workflow.Context, _ struct{}) (int, error) {
		for _, reserved := range []string{"sleep:x", "awk:x", "child:x", "patch:x", "", " "} {
			if _, err := workflow.Step(c, reserved, func(context.Context, pgx.Tx) (int, error) { return 0, nil }); err == nil {
				return 0, errors.New("reserved name accepted: " + reserved)
			}
		}
		if err := workflow.Sleep(c, "nap", 0); err != nil {
			return 0, err
		}
		for _, label := range []string{"a", "b"} {
			id, err := workflow.NewAwakeable(c, label)
			if err != nil {
				return 0, err
			}
			ids = append(ids, id)
		}
		if err := workflow.StartChild(c, "kid", "k", struct{}{}); err != nil {
			return 0, err
		}
		return workflow.AwaitChild[int](c, "kid", "k")
	})
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	for range 3 {
		_, err := b.worker(t, "w").RunOnce(ctx)
		require.NoError(t, err)
		b.clock.Advance(time.Millisecond)
	}
	require.Len(t, ids, 4, "two runs")
	require.Equal(t, ids[:2], ids[2:], "a replay returns the journaled ids")
	require.NotEqual(t, ids[0], ids[1], "one id per label")
	require.ElementsMatch(t, []string{"sleep:nap", "sleep:nap:done", "awk:new:a", "awk:new:b", "child:spawn:kid/k", "child:kid/k"},
		b.steps(t, "names", "1"))
	require.Equal(t, workflow.StatusCompleted, b.instance(t, "names", "1").Status)
}

// keiro Awakeable "re-appends a missing journal entry when re-signalled (crash-safe)", "repairs a
// completed awakeable row from the await arm without a second signal", Child "repairs a completed
// child row from awaitChild", "repairs a cancelled child row when cancelChild is retried after the
// row flip", "heals a cancelled-but-unmarked child": here a resolution's row flip and its journal
// entry share one transaction, so no half-resolved state exists to repair: a resolution whose
// transaction rolls back leaves nothing, and the next one applies whole.
func TestResolutionsAreAtomic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ids := make(chan envelope.UUID, 4)
	w, err := workflow.Register(b.e, "approve", awaiter(ids))
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	_, err = w.Run(ctx, "1")
	require.NoError(t, err)
	id := <-ids
	errCrash := errors.New("crash before commit")
	err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		ok, err := b.e.CompleteAwakeableTx(ctx, tx, id, "first")
		require.True(t, ok)
		require.NoError(t, err)
		return errCrash
	})
	require.ErrorIs(t, err, errCrash)
	var status string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT status FROM keiro_workflow_awakeables WHERE awakeable_id = $1`, [16]byte(id)).Scan(&status))
	require.Equal(t, "pending", status)
	require.Nil(t, b.instance(t, "approve", "1").WakeAfter, "the rolled-back signal woke nothing")

	parent, _ := family(t, b, newCounters())
	start(t, b, parent, "p", struct{}{})
	_, err = parent.Run(ctx, "p")
	require.NoError(t, err)
	err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		_, err := b.e.CancelTx(ctx, tx, "child", "p-c")
		require.NoError(t, err)
		return errCrash
	})
	require.ErrorIs(t, err, errCrash)
	require.Equal(t, workflow.StatusPending, b.instance(t, "child", "p-c").Status)

	b.tx(t, func(tx pgx.Tx) error {
		ok, err := b.e.CompleteAwakeableTx(ctx, tx, id, "second")
		require.True(t, ok)
		return err
	})
	_, err = w.Run(ctx, "1")
	require.NoError(t, err)
	got, _, _, err := w.Result(ctx, b.db.Pool, "1")
	require.NoError(t, err)
	require.Equal(t, "second", got)
}

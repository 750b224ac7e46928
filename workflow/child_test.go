package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/workflow"
)

// family registers a child that awaits "gate" and returns input+gate (failing on a negative
// gate), and a parent that spawns child <id>-c with input 10 and returns what AwaitChild gave.
func family(t *testing.T, b *bundle, cs *counters) (*workflow.Workflow[struct{}, string], *workflow.Workflow[int, int]) {
	t.Helper()
	child, err := workflow.Register(b.e, "child", func(c *workflow.Context, in int) (int, error) {
		cs.inc("child-run")
		g, err := workflow.Await[int](c, "gate")
		if err != nil {
			return 0, err
		}
		if g < 0 {
			return 0, errors.New("negative gate")
		}
		return in + g, nil
	})
	require.NoError(t, err)
	parent, err := workflow.Register(b.e, "parent", func(c *workflow.Context, _ struct{}) (string, error) {
		kid := c.WorkflowID() + "-c"
		if err := workflow.StartChild(c, "child", kid, 10); err != nil {
			return "", err
		}
		cs.inc("parent-after-spawn")
		v, err := workflow.AwaitChild[int](c, "child", kid)
		var failed *workflow.ChildFailedError
		switch {
		case errors.Is(err, workflow.ErrChildCancelled):
			return "cancelled", nil
		case errors.As(err, &failed):
			return "failed: " + failed.Reason, nil
		case err != nil:
			return "", err
		}
		return fmt.Sprint(v), nil
	})
	require.NoError(t, err)
	return parent, child
}

func (b *bundle) gate(t *testing.T, name, id string, v int) {
	t.Helper()
	b.tx(t, func(tx pgx.Tx) error {
		_, err := b.e.CompleteStepTx(context.Background(), tx, name, id, "gate", v)
		return err
	})
}

// keiro Child: "spawns a child, drives it, propagates its result, and resumes the parent to
// Completed", "does not re-spawn the child when the parent is re-invoked", "drives a parent and
// its child to completion through the resume worker"; instance table: "creates child instance rows
// at spawn time"
func TestChildResultPropagates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cs := newCounters()
	parent, _ := family(t, b, cs)
	start(t, b, parent, "p", struct{}{})
	wk := b.worker(t, "w")
	p, err := wk.RunOnce(ctx) // parent spawns and suspends; the child is runnable
	require.NoError(t, err)
	require.Equal(t, 1, p.Suspended)
	kid := b.instance(t, "child", "p-c")
	require.Equal(t, "parent", *kid.ParentName)
	require.Equal(t, "p", *kid.ParentID)
	out, err := parent.Run(ctx, "p") // re-invoked: no second spawn
	require.NoError(t, err)
	require.Equal(t, workflow.Suspended, out)
	p, err = wk.RunOnce(ctx) // the child suspends on its gate
	require.NoError(t, err)
	require.Equal(t, 1, p.Suspended)
	b.gate(t, "child", "p-c", 5)
	p, err = wk.RunOnce(ctx) // the child completes and wakes the parent
	require.NoError(t, err)
	require.Equal(t, 1, p.Completed)
	p, err = wk.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Completed)
	got, _, ok, err := parent.Result(ctx, b.db.Pool, "p")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "15", got)
	var spawns int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM keiro_workflows WHERE parent_id = 'p'`).Scan(&spawns))
	require.Equal(t, 1, spawns)
}

// keiro Child: "cancels a child: the child stops and the parent's awaitChild throws"; instance
// table: "creates child instance rows at spawn time and flips them to cancelled"
func TestCancelChildWakesParent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cs := newCounters()
	parent, _ := family(t, b, cs)
	start(t, b, parent, "p", struct{}{})
	_, err := parent.Run(ctx, "p")
	require.NoError(t, err)
	b.tx(t, func(tx pgx.Tx) error {
		ok, err := b.e.CancelTx(ctx, tx, "child", "p-c")
		require.True(t, ok)
		return err
	})
	b.tx(t, func(tx pgx.Tx) error {
		ok, err := b.e.CancelTx(ctx, tx, "child", "p-c")
		require.False(t, ok, "cancelling twice is a no-op")
		return err
	})
	require.Equal(t, workflow.StatusCancelled, b.instance(t, "child", "p-c").Status)
	p, err := b.worker(t, "w").RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Completed)
	got, _, _, err := parent.Result(ctx, b.db.Pool, "p")
	require.NoError(t, err)
	require.Equal(t, "cancelled", got)
	require.Zero(t, cs.get("child-run"), "a cancelled child never runs")
}

// Cancelling a parent cancels its live descendants.
func TestCancelParentCancelsChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	parent, _ := family(t, b, newCounters())
	start(t, b, parent, "p", struct{}{})
	_, err := parent.Run(ctx, "p")
	require.NoError(t, err)
	b.tx(t, func(tx pgx.Tx) error {
		ok, err := b.e.CancelTx(ctx, tx, "parent", "p")
		require.True(t, ok)
		return err
	})
	require.Equal(t, workflow.StatusCancelled, b.instance(t, "parent", "p").Status)
	require.Equal(t, workflow.StatusCancelled, b.instance(t, "child", "p-c").Status)
	out, err := parent.Run(ctx, "p")
	require.NoError(t, err)
	require.Equal(t, workflow.Cancelled, out)
}

// keiro Child: "wakes a parent with WorkflowChildFailed when a child reaches the failure ceiling"
func TestChildFailureWakesParent(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *workflow.Config) { c.MaxAttempts = 1 })
	ctx := context.Background()
	parent, child := family(t, b, newCounters())
	start(t, b, parent, "p", struct{}{})
	_, err := parent.Run(ctx, "p")
	require.NoError(t, err)
	b.gate(t, "child", "p-c", -1)
	out, err := child.Run(ctx, "p-c")
	require.NoError(t, err)
	require.Equal(t, workflow.Failed, out)
	out, err = parent.Run(ctx, "p")
	require.NoError(t, err)
	require.Equal(t, workflow.Completed, out)
	got, _, _, err := parent.Result(ctx, b.db.Pool, "p")
	require.NoError(t, err)
	require.Equal(t, "failed: negative gate", got)
}

// keiro Child: "delivers an honest child result equal to the old cancellation sentinel"
func TestChildResultEqualToSentinelDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := workflow.Register(b.e, "kid", func(c *workflow.Context, _ struct{}) (map[string]string, error) {
		return map[string]string{"kind": "cancelled"}, nil
	})
	require.NoError(t, err)
	parent, err := workflow.Register(b.e, "mom", func(c *workflow.Context, _ struct{}) (map[string]string, error) {
		if err := workflow.StartChild(c, "kid", "k", struct{}{}); err != nil {
			return nil, err
		}
		return workflow.AwaitChild[map[string]string](c, "kid", "k")
	})
	require.NoError(t, err)
	start(t, b, parent, "m", struct{}{})
	for range 3 {
		_, err := b.worker(t, "w").RunOnce(ctx)
		require.NoError(t, err)
	}
	got, _, ok, err := parent.Result(ctx, b.db.Pool, "m")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, map[string]string{"kind": "cancelled"}, got)
}

// keiro Child: "throws WorkflowStepDecodeError when an enveloped child result has the wrong type"
func TestChildResultWrongType(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *workflow.Config) { c.MaxAttempts = 1 })
	ctx := context.Background()
	_, err := workflow.Register(b.e, "kid", func(c *workflow.Context, _ struct{}) (string, error) { return "text", nil })
	require.NoError(t, err)
	var seen error
	parent, err := workflow.Register(b.e, "mom", func(c *workflow.Context, _ struct{}) (int, error) {
		if err := workflow.StartChild(c, "kid", "k", struct{}{}); err != nil {
			return 0, err
		}
		v, err := workflow.AwaitChild[int](c, "kid", "k")
		seen = err
		return v, err
	})
	require.NoError(t, err)
	start(t, b, parent, "m", struct{}{})
	for range 3 {
		_, err := b.worker(t, "w").RunOnce(ctx)
		require.NoError(t, err)
	}
	var de *workflow.StepDecodeError
	require.ErrorAs(t, seen, &de)
	require.Equal(t, workflow.StatusFailed, b.instance(t, "mom", "m").Status)
}

// keiro Child: "stops at the next step boundary when a workflow is cancelled mid-run": the step in
// flight rolls back, and nothing after it runs.
func TestCancelledMidRunStopsAtNextStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cs := newCounters()
	w, err := workflow.Register(b.e, "long", func(c *workflow.Context, _ struct{}) (int, error) {
		_, err := workflow.Step(c, "cancel-me", func(ctx context.Context, tx pgx.Tx) (int, error) {
			cs.inc("cancel-me")
			require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(other pgx.Tx) error {
				_, err := b.e.CancelTx(ctx, other, "long", c.WorkflowID())
				return err
			}))
			return 1, nil
		})
		if err != nil {
			return 0, err
		}
		return counterStep(c, cs, "after", 2)
	})
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	out, err := w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Cancelled, out)
	require.Zero(t, cs.get("after"))
	require.Empty(t, b.steps(t, "long", "1"), "the step in flight rolled back")
	require.Equal(t, workflow.StatusCancelled, b.instance(t, "long", "1").Status)
}

// keiro Child: "attaches to a completed child after continueAsNew": a parent generation that
// spawns a child that already finished gets its result at once.
func TestAttachToFinishedChild(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cs := newCounters()
	_, err := workflow.Register(b.e, "kid", func(c *workflow.Context, _ struct{}) (int, error) {
		cs.inc("kid")
		return 7, nil
	})
	require.NoError(t, err)
	parent, err := workflow.Register(b.e, "mom", func(c *workflow.Context, round int) (int, error) {
		if err := workflow.StartChild(c, "kid", "shared", struct{}{}); err != nil {
			return 0, err
		}
		v, err := workflow.AwaitChild[int](c, "kid", "shared")
		if err != nil {
			return 0, err
		}
		if round == 0 {
			return 0, workflow.ContinueAsNew(c, 1)
		}
		return v * 10, nil
	})
	require.NoError(t, err)
	start(t, b, parent, "m", 0)
	b.clock.Advance(time.Millisecond)
	for range 5 {
		_, err := b.worker(t, "w").RunOnce(ctx)
		require.NoError(t, err)
	}
	got, inst, ok, err := parent.Result(ctx, b.db.Pool, "m")
	require.NoError(t, err)
	require.True(t, ok, "%+v", inst)
	require.Equal(t, 70, got)
	require.Equal(t, 1, inst.Generation)
	require.Equal(t, 1, cs.get("kid"))
}

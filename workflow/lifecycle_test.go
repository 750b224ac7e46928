package workflow_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/workflow"
)

type tally struct{ From, Total int }

// summer adds 1..n in chunks of 3 steps per generation, carrying the running total.
func summer(cs *counters, n int) func(c *workflow.Context, in tally) (int, error) {
	return func(c *workflow.Context, in tally) (int, error) {
		total := in.Total
		for i := in.From; i <= n; i++ {
			if i-in.From == 3 {
				return 0, workflow.ContinueAsNew(c, tally{From: i, Total: total})
			}
			v, err := workflow.Step(c, fmt.Sprint("add-", i), func(context.Context, pgx.Tx) (int, error) {
				cs.inc("add")
				return i, nil
			})
			if err != nil {
				return 0, err
			}
			total += v
		}
		return total, nil
	}
}

// keiro continue-as-new: "rotates a long workflow, bounds each generation, and returns the correct
// total", "rediscovers and resumes a rotated workflow on its current generation"; instance table:
// "bumps the instance generation when continueAsNew rotates"
func TestContinueAsNewBoundsGenerations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cs := newCounters()
	w, err := workflow.Register(b.e, "sum", summer(cs, 10))
	require.NoError(t, err)
	start(t, b, w, "1", tally{From: 1})
	wk := b.worker(t, "w")
	rotations := 0
	for range 10 {
		p, err := wk.RunOnce(ctx)
		require.NoError(t, err)
		rotations += p.ContinuedAsNew
		j, err := b.e.Journal(ctx, b.db.Pool, "sum", "1")
		require.NoError(t, err)
		require.LessOrEqual(t, len(j), 3, "each generation's journal is bounded")
		if p.Completed == 1 {
			break
		}
	}
	require.Equal(t, 3, rotations)
	got, inst, ok, err := w.Result(ctx, b.db.Pool, "1")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 55, got)
	require.Equal(t, 3, inst.Generation)
	require.Equal(t, 10, cs.get("add"), "each step ran once across generations")
}

// keiro patch API: "an in-flight instance observes the OLD branch; a fresh instance the NEW branch;
// the decision is journaled once and stable", "a fresh instance suspended before its patch call still
// takes the NEW branch", "an in-flight instance with only wake-source completions stays on the OLD
// branch", "records the active patch set again for a fresh rotated generation"
func TestPatched(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	body := func(c *workflow.Context, round int) (string, error) {
		if _, err := workflow.Await[int](c, "gate"); err != nil {
			return "", err
		}
		patched, err := workflow.Patched(c, "v2")
		if err != nil {
			return "", err
		}
		branch := map[bool]string{false: "old", true: "new"}[patched]
		if round == 0 && c.WorkflowID() == "rotating" {
			return "", workflow.ContinueAsNew(c, 1)
		}
		return branch, nil
	}
	// Deploy 1: no patches. "inflight" parks before its patch call; "woken" has only a wake-source
	// completion recorded.
	old, err := workflow.Register(b.e, "flow", body)
	require.NoError(t, err)
	start(t, b, old, "inflight", 0)
	_, err = old.Run(ctx, "inflight")
	require.NoError(t, err)
	start(t, b, old, "woken", 0)
	b.gate(t, "flow", "woken", 1)

	// Deploy 2: v2 is active.
	e2, err := workflow.New(b.db.Pool, workflow.Config{Schema: b.db.Schema, Now: b.clock.Now})
	require.NoError(t, err)
	fresh, err := workflow.Register(e2, "flow", body, "v2")
	require.NoError(t, err)
	start(t, b, fresh, "fresh", 0)
	_, err = fresh.Run(ctx, "fresh") // parks before its patch call
	require.NoError(t, err)
	start(t, b, fresh, "rotating", 0)
	_, err = fresh.Run(ctx, "rotating")
	require.NoError(t, err)
	for _, id := range []string{"inflight", "fresh", "rotating"} {
		b.gate(t, "flow", id, 1)
	}
	for _, id := range []string{"inflight", "woken", "fresh", "rotating", "rotating"} {
		_, err := fresh.Run(ctx, id)
		require.NoError(t, err)
	}
	b.gate(t, "flow", "rotating", 1) // the second generation's gate
	_, err = fresh.Run(ctx, "rotating")
	require.NoError(t, err)
	for id, want := range map[string]string{"inflight": "old", "woken": "old", "fresh": "new", "rotating": "new"} {
		got, inst, ok, err := fresh.Result(ctx, b.db.Pool, id)
		require.NoError(t, err)
		require.True(t, ok, "%s: %+v", id, inst)
		require.Equal(t, want, got, id)
	}
	j, err := b.e.Journal(ctx, b.db.Pool, "flow", "rotating")
	require.NoError(t, err)
	var names []string
	for _, s := range j {
		names = append(names, s.Step)
	}
	require.Contains(t, names, "patch:set", "the rotated generation records the patch set again")
}

// keiro Gc: "deletes terminal workflow data after retention" and "keeps completed children while a
// parent is live and converges after partial cleanup"
func TestGC(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	parent, _ := family(t, b, newCounters())
	start(t, b, parent, "p", struct{}{})
	_, err := parent.Run(ctx, "p")
	require.NoError(t, err)
	b.gate(t, "child", "p-c", 1)
	_, err = b.e.RunInstance(ctx, "child", "p-c")
	require.NoError(t, err)
	require.Equal(t, workflow.StatusCompleted, b.instance(t, "child", "p-c").Status)
	b.clock.Advance(2 * time.Hour)
	// Wall-clock completed_at: the GC cut-off must be past it.
	n, err := b.e.GC(ctx, b.db.Pool, 0, 100)
	require.NoError(t, err)
	require.Zero(t, n, "a finished child is kept while its parent is live")
	_, err = parent.Run(ctx, "p")
	require.NoError(t, err)
	n, err = b.e.GC(ctx, b.db.Pool, time.Hour, 100)
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	_, err = b.e.Instance(ctx, b.db.Pool, "parent", "p")
	require.ErrorIs(t, err, workflow.ErrNotFound)
	var steps int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM keiro_workflow_steps`).Scan(&steps))
	require.Zero(t, steps)
	_, err = b.e.GC(ctx, b.db.Pool, time.Hour, 0)
	require.Error(t, err)
}

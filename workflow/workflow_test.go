package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/workflow"
)

type pair struct{ A, B int }

// demo is keiro's demoWorkflow: two counted steps.
func demo(cs *counters) func(c *workflow.Context, _ struct{}) (pair, error) {
	return func(c *workflow.Context, _ struct{}) (pair, error) {
		a, err := counterStep(c, cs, "a", 1)
		if err != nil {
			return pair{}, err
		}
		b, err := counterStep(c, cs, "b", 2)
		return pair{a, b}, err
	}
}

// stepThenAwait runs step "a" and then awaits "gate".
func stepThenAwait(cs *counters) func(c *workflow.Context, _ struct{}) (int, error) {
	return func(c *workflow.Context, _ struct{}) (int, error) {
		a, err := counterStep(c, cs, "a", 1)
		if err != nil {
			return 0, err
		}
		g, err := workflow.Await[int](c, "gate")
		if err != nil {
			return 0, err
		}
		return a + g, nil
	}
}

// keiro: "journals each step once, returns Completed, and runs each side effect once"
func TestJournalsEachStepOnceAndCompletes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cs := newCounters()
	w, err := workflow.Register(b.e, "demo", demo(cs))
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	out, err := w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Completed, out)
	got, inst, ok, err := w.Result(ctx, b.db.Pool, "1")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, pair{1, 2}, got)
	require.Equal(t, workflow.StatusCompleted, inst.Status)
	require.Equal(t, 1, cs.get("a"))
	require.Equal(t, 1, cs.get("b"))
	require.ElementsMatch(t, []string{"a", "b"}, b.steps(t, "demo", "1"))
	// A second run of a completed instance runs nothing.
	out, err = w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Completed, out)
	require.Equal(t, 1, cs.get("a"))
}

// keiro: "replays recorded steps without re-running their side effects"
func TestReplayDoesNotRerunSideEffects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cs := newCounters()
	w, err := workflow.Register(b.e, "gated", stepThenAwait(cs))
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	for range 3 {
		out, err := w.Run(ctx, "1")
		require.NoError(t, err)
		require.Equal(t, workflow.Suspended, out)
	}
	require.Equal(t, 1, cs.get("a"), "replays must not re-run step a")
	b.tx(t, func(tx pgx.Tx) error {
		_, err := b.e.CompleteStepTx(ctx, tx, "gated", "1", "gate", 41)
		return err
	})
	out, err := w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Completed, out)
	got, _, _, err := w.Result(ctx, b.db.Pool, "1")
	require.NoError(t, err)
	require.Equal(t, 42, got)
	require.Equal(t, 1, cs.get("a"))
}

// keiro: "reuses the recorded result for a repeated step name in one run"
func TestRepeatedStepNameReusesResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cs := newCounters()
	w, err := workflow.Register(b.e, "repeat", func(c *workflow.Context, _ struct{}) (pair, error) {
		x, err := counterStep(c, cs, "same", 7)
		if err != nil {
			return pair{}, err
		}
		y, err := counterStep(c, cs, "same", 8)
		return pair{x, y}, err
	})
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	_, err = w.Run(ctx, "1")
	require.NoError(t, err)
	got, _, _, err := w.Result(ctx, b.db.Pool, "1")
	require.NoError(t, err)
	require.Equal(t, pair{7, 7}, got)
	require.Equal(t, 1, cs.get("same"))
}

// keiro: "suspends on an unresolved awaitStep, journaling no completion" and
// "records suspended status for workflows that park before journaling"
func TestAwaitSuspendsWithoutCompletion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w, err := workflow.Register(b.e, "park", func(c *workflow.Context, _ struct{}) (int, error) {
		return workflow.Await[int](c, "gate")
	})
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	out, err := w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Suspended, out)
	inst := b.instance(t, "park", "1")
	require.Equal(t, workflow.StatusSuspended, inst.Status)
	require.Nil(t, inst.WakeAfter, "an await parks until a wake source")
	require.Nil(t, inst.LeaseOwner)
	require.Empty(t, b.steps(t, "park", "1"))
	// A worker does not re-run a parked instance.
	p, err := b.worker(t, "w").RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, p.Claimed)
}

// keiro: "resumes and completes once an awaited step is externally completed"; Keiro.Workflow.Resume
// "resumes a suspended workflow once its awaited step is journaled"
func TestAwaitResumesAfterExternalCompletion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cs := newCounters()
	w, err := workflow.Register(b.e, "gated", stepThenAwait(cs))
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	wk := b.worker(t, "w")
	p, err := wk.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Suspended)
	b.tx(t, func(tx pgx.Tx) error {
		ok, err := b.e.CompleteStepTx(ctx, tx, "gated", "1", "gate", 9)
		require.True(t, ok)
		return err
	})
	p, err = wk.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Completed)
	got, _, _, err := w.Result(ctx, b.db.Pool, "1")
	require.NoError(t, err)
	require.Equal(t, 10, got)
}

// keiro: "treats a duplicate external journal append as idempotent"
func TestDuplicateExternalCompletionIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w, err := workflow.Register(b.e, "park", func(c *workflow.Context, _ struct{}) (int, error) {
		return workflow.Await[int](c, "gate")
	})
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	for i, want := range []bool{true, false} {
		b.tx(t, func(tx pgx.Tx) error {
			ok, err := b.e.CompleteStepTx(ctx, tx, "park", "1", "gate", 5+i)
			require.Equal(t, want, ok)
			return err
		})
	}
	_, err = w.Run(ctx, "1")
	require.NoError(t, err)
	got, _, _, err := w.Result(ctx, b.db.Pool, "1")
	require.NoError(t, err)
	require.Equal(t, 5, got, "the first completion's value stands")
	// Bad input: an unknown instance, a reserved step name.
	b.tx(t, func(tx pgx.Tx) error {
		_, err := b.e.CompleteStepTx(ctx, tx, "park", "nope", "gate", 1)
		require.ErrorIs(t, err, workflow.ErrNotFound)
		_, err = b.e.CompleteStepTx(ctx, tx, "park", "1", "sleep:x", 1)
		require.Error(t, err)
		return nil
	})
}

// keiro: "returns the journaled value when another writer records the same step mid-flight"
func TestConcurrentWriterOfStepWins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w, err := workflow.Register(b.e, "race", func(c *workflow.Context, _ struct{}) (int, error) {
		return workflow.Step(c, "s", func(ctx context.Context, tx pgx.Tx) (int, error) {
			// Another writer records the same step and commits while this one runs.
			require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(other pgx.Tx) error {
				_, err := b.e.CompleteStepTx(ctx, other, "race", "1", "s", 99)
				return err
			}))
			_, err := tx.Exec(ctx, `CREATE TABLE side_effect (x int)`) // rolled back: the other writer won
			return 1, err
		})
	})
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	out, err := w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Completed, out)
	got, _, _, err := w.Result(ctx, b.db.Pool, "1")
	require.NoError(t, err)
	require.Equal(t, 99, got)
	var exists bool
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT to_regclass('side_effect') IS NOT NULL`).Scan(&exists))
	require.False(t, exists, "the losing writer's effects roll back")
}

// Two runs of one instance at once (a crashed run's successor racing it) agree on each step.
func TestConcurrentRunsAgree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cs := newCounters()
	var n sync.Mutex
	next := 0
	w, err := workflow.Register(b.e, "twice", func(c *workflow.Context, _ struct{}) (int, error) {
		return workflow.Step(c, "draw", func(context.Context, pgx.Tx) (int, error) {
			n.Lock()
			defer n.Unlock()
			next++
			cs.inc("draw")
			return next, nil
		})
	})
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	// Two engines over one schema run the same instance directly, as two owners whose leases
	// both look expired; the journal keeps one result.
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = w.Run(ctx, "1")
		}()
	}
	wg.Wait()
	got, _, ok, err := w.Result(ctx, b.db.Pool, "1")
	require.NoError(t, err)
	require.True(t, ok)
	j, err := b.e.Journal(ctx, b.db.Pool, "twice", "1")
	require.NoError(t, err)
	require.Len(t, j, 1)
	var rec int
	require.NoError(t, json.Unmarshal(j[0].Result, &rec))
	require.Equal(t, rec, got)
}

// keiro: "returns the JSON round-trip of a fresh step result"
func TestFreshStepResultIsJSONRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	type rec struct {
		At   time.Time
		Tags map[string]int
	}
	var fresh, replayed rec
	at := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.FixedZone("x", 3600))
	w, err := workflow.Register(b.e, "json", func(c *workflow.Context, _ struct{}) (bool, error) {
		r, err := workflow.Step(c, "r", func(context.Context, pgx.Tx) (rec, error) { return rec{At: at, Tags: map[string]int{}}, nil })
		if err != nil {
			return false, err
		}
		if fresh.At.IsZero() {
			fresh = r
		} else {
			replayed = r
		}
		_, err = workflow.Await[int](c, "gate")
		return true, err
	})
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	_, err = w.Run(ctx, "1")
	require.NoError(t, err)
	_, err = w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, replayed, fresh, "a fresh result equals its replay")
	require.True(t, fresh.At.Equal(at))
}

// keiro: "throws WorkflowStepDecodeError on the first run when the recorded result cannot decode"
func TestStepDecodeError(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *workflow.Config) { c.MaxAttempts = 1 })
	ctx := context.Background()
	var seen error
	w, err := workflow.Register(b.e, "decode", func(c *workflow.Context, _ struct{}) (int, error) {
		v, err := workflow.Await[int](c, "gate")
		seen = err
		return v, err
	})
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	b.tx(t, func(tx pgx.Tx) error {
		_, err := b.e.CompleteStepTx(ctx, tx, "decode", "1", "gate", "not a number")
		return err
	})
	out, err := w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Failed, out)
	var de *workflow.StepDecodeError
	require.ErrorAs(t, seen, &de)
	require.Equal(t, "gate", de.Step)
	require.Contains(t, b.instance(t, "decode", "1").LastError, "decode recorded result of step gate")
}

// keiro: "discovers unfinished workflows via the step index", "discovers unfinished workflows from
// the instance table", "discovers nothing for an already-completed workflow and is stable"
func TestWorkerDiscoversUnfinished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cs := newCounters()
	w, err := workflow.Register(b.e, "demo", demo(cs))
	require.NoError(t, err)
	for i := range 3 {
		start(t, b, w, fmt.Sprint(i), struct{}{})
	}
	wk := b.worker(t, "w")
	p, err := wk.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, p.Claimed)
	require.Equal(t, 3, p.Completed)
	for range 2 {
		p, err = wk.RunOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, p.Claimed)
	}
	require.Equal(t, 3, cs.get("a"))
}

// keiro: "creates and completes a workflow instance row transactionally with the journal"
func TestStartTxRollsBackWithCaller(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w, err := workflow.Register(b.e, "demo", demo(newCounters()))
	require.NoError(t, err)
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	ok, err := w.StartTx(ctx, tx, "1", struct{}{})
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, tx.Rollback(ctx))
	_, err = b.e.Instance(ctx, b.db.Pool, "demo", "1")
	require.ErrorIs(t, err, workflow.ErrNotFound)
	start(t, b, w, "1", struct{}{})
	b.tx(t, func(tx pgx.Tx) error {
		ok, err := w.StartTx(ctx, tx, "1", struct{}{})
		require.False(t, ok, "a second start is a no-op")
		return err
	})
	inst := b.instance(t, "demo", "1")
	require.Equal(t, workflow.StatusPending, inst.Status)
	_, err = w.Run(ctx, "1")
	require.NoError(t, err)
	inst = b.instance(t, "demo", "1")
	require.Equal(t, workflow.StatusCompleted, inst.Status)
	require.NotNil(t, inst.CompletedAt)
	require.JSONEq(t, `{"A":1,"B":2}`, string(inst.Result))
	// Bad input.
	b.tx(t, func(tx pgx.Tx) error {
		_, err := w.StartTx(ctx, tx, "", struct{}{})
		require.Error(t, err)
		_, err = w.StartTx(ctx, tx, "a\x00b", struct{}{})
		require.Error(t, err)
		return nil
	})
	_, err = workflow.Register(b.e, "demo", demo(newCounters()))
	require.Error(t, err, "a name registers once")
	_, err = workflow.Register(b.e, "", demo(newCounters()))
	require.Error(t, err)
	_, err = workflow.New(nil, workflow.Config{Schema: "Bad-Schema", MaxAttempts: -1})
	require.ErrorContains(t, err, "db is nil")
	require.ErrorContains(t, err, "Schema")
	require.ErrorContains(t, err, "MaxAttempts")
}

// keiro: "does not let a late append resurrect a terminal instance row"
func TestLateCompletionDoesNotResurrectTerminal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w, err := workflow.Register(b.e, "demo", demo(newCounters()))
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	_, err = w.Run(ctx, "1")
	require.NoError(t, err)
	b.tx(t, func(tx pgx.Tx) error {
		_, err := b.e.CompleteStepTx(ctx, tx, "demo", "1", "late", 1)
		return err
	})
	inst := b.instance(t, "demo", "1")
	require.Equal(t, workflow.StatusCompleted, inst.Status)
	require.Nil(t, inst.WakeAfter)
	p, err := b.worker(t, "w").RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, p.Claimed)
}

// keiro Resume: "resumes a crashed mid-run workflow, running only the un-journaled tail" and
// "lets an expired workflow lease be taken and resets attempts on progressed release"
func TestCrashedRunResumesOnlyTail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cs := newCounters()
	crash := make(chan struct{})
	inC := make(chan struct{}, 1)
	w, err := workflow.Register(b.e, "crashy", func(c *workflow.Context, _ struct{}) (string, error) {
		for _, s := range []string{"a", "b"} {
			if _, err := counterStep(c, cs, s, s); err != nil {
				return "", err
			}
		}
		_, err := workflow.Step(c, "c", func(ctx context.Context, _ pgx.Tx) (string, error) {
			cs.inc("c-attempt")
			select {
			case inC <- struct{}{}:
			default:
			}
			if cs.get("c-attempt") == 1 {
				<-crash // the process dies here
				return "", ctx.Err()
			}
			cs.inc("c")
			return "c", nil
		})
		if err != nil {
			return "", err
		}
		return counterStep(c, cs, "d", "done")
	})
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	ctx, cancel := context.WithCancel(context.Background())
	dead := b.worker(t, "dead")
	done := make(chan error, 1)
	go func() {
		_, err := dead.RunOnce(ctx)
		done <- err
	}()
	select {
	case <-inC:
	case err := <-done:
		t.Fatalf("the run ended before its crash: %v", err)
	}
	cancel()
	close(crash)
	require.ErrorIs(t, <-done, context.Canceled)
	inst := b.instance(t, "crashy", "1")
	require.Equal(t, workflow.StatusRunning, inst.Status)
	require.Equal(t, "dead", *inst.LeaseOwner)
	require.Equal(t, 0, inst.Attempts, "progress reset the attempts")

	live := b.worker(t, "live")
	p, err := live.RunOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, p.Claimed, "a live lease is not taken")
	require.Equal(t, 1, p.LeaseSkipped)

	b.clock.Advance(31 * time.Second) // past the lease
	p, err = live.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, p.Completed)
	for _, s := range []string{"a", "b", "c", "d"} {
		require.Equal(t, 1, cs.get(s), s)
	}
	require.Equal(t, 2, cs.get("c-attempt"))
	inst = b.instance(t, "crashy", "1")
	require.Equal(t, workflow.StatusCompleted, inst.Status)
	require.Nil(t, inst.LeaseOwner)
}

// keiro Resume: "skips and counts a workflow whose name is absent from the registry"
func TestWorkerSkipsUnknownName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	other, err := workflow.New(b.db.Pool, workflow.Config{Schema: b.db.Schema, Now: b.clock.Now})
	require.NoError(t, err)
	ghost, err := workflow.Register(other, "ghost", demo(newCounters()))
	require.NoError(t, err)
	_, err = workflow.Register(b.e, "demo", demo(newCounters()))
	require.NoError(t, err)
	start(t, b, ghost, "1", struct{}{})
	p, err := b.worker(t, "w").RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, p.Claimed)
	require.Equal(t, 1, p.UnknownName)
	require.Equal(t, workflow.StatusPending, b.instance(t, "ghost", "1").Status)
	_, err = b.e.RunInstance(ctx, "ghost", "1")
	require.ErrorIs(t, err, workflow.ErrUnknownWorkflow)
}

// keiro Resume: "isolates a poison workflow so a healthy workflow still completes" and "keeps the
// fixed-poll loop alive when one pass contains a poison workflow"
func TestPoisonWorkflowIsolated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	poison, err := workflow.Register(b.e, "poison", func(c *workflow.Context, _ struct{}) (int, error) {
		panic("boom")
	})
	require.NoError(t, err)
	healthy, err := workflow.Register(b.e, "demo", demo(newCounters()))
	require.NoError(t, err)
	start(t, b, poison, "1", struct{}{})
	start(t, b, healthy, "1", struct{}{})
	p, err := b.worker(t, "w").RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, p.Claimed)
	require.Equal(t, 1, p.Completed)
	require.Equal(t, 1, p.Retrying)
	inst := b.instance(t, "poison", "1")
	require.Equal(t, workflow.StatusRunning, inst.Status)
	require.Contains(t, inst.LastError, "panicked: boom")
	require.True(t, inst.WakeAfter.After(b.clock.Now()), "the retry waits for its backoff")
}

// keiro Resume: "marks a crashing workflow failed and short-circuits later direct runs"
func TestCrashingWorkflowFailsAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *workflow.Config) { c.MaxAttempts = 2 })
	ctx := context.Background()
	runs := 0
	w, err := workflow.Register(b.e, "bad", func(c *workflow.Context, _ struct{}) (int, error) {
		runs++
		return 0, errors.New("always")
	})
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	out, err := w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Retrying, out)
	out, err = w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Failed, out)
	out, err = w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Failed, out)
	require.Equal(t, 2, runs, "a failed instance never runs again")
	inst := b.instance(t, "bad", "1")
	require.Equal(t, workflow.StatusFailed, inst.Status)
	require.Equal(t, "always", inst.LastError)
	n, _ := b.sum(t, "keiro.workflow.failed")
	require.Equal(t, int64(1), n)
}

// keiro Resume: "claims one workflow instance for a single live owner and releases it"
func TestOneLiveOwnerAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	release := make(chan struct{})
	entered := make(chan struct{})
	w, err := workflow.Register(b.e, "hold", func(c *workflow.Context, _ struct{}) (int, error) {
		return workflow.Step(c, "s", func(context.Context, pgx.Tx) (int, error) {
			close(entered)
			<-release
			return 1, nil
		})
	})
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	done := make(chan workflow.Pass, 1)
	a := b.worker(t, "a")
	go func() {
		p, err := a.RunOnce(ctx)
		if err != nil {
			t.Errorf("worker a: %v", err)
		}
		done <- p
	}()
	select {
	case <-entered:
	case p := <-done:
		t.Fatalf("worker a ended before its step: %+v", p)
	}
	p, err := b.worker(t, "b").RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, p.Claimed)
	out, err := w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Skipped, out, "a direct run does not take a live lease")
	close(release)
	require.Equal(t, 1, (<-done).Completed)
	require.Nil(t, b.instance(t, "hold", "1").LeaseOwner, "the lease is released")
}

// keiro Resume: "classifies thrown store errors as transient without consuming attempts": a run
// that meets a serialisation failure or a broken connection is retried without using an
// attempt, where an error of the workflow's own uses one.
func TestTransientDatabaseErrorUsesNoAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *workflow.Config) { c.MaxAttempts = 1 })
	ctx := context.Background()
	runs := 0
	w, err := workflow.Register(b.e, "flaky", func(c *workflow.Context, _ struct{}) (int, error) {
		runs++
		return workflow.Step(c, "s", func(ctx context.Context, tx pgx.Tx) (int, error) {
			switch runs {
			case 1:
				_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$`)
				return 0, err
			case 2:
				_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
				return 0, err
			}
			return 7, nil
		})
	})
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	for range 2 {
		out, err := w.Run(ctx, "1")
		require.NoError(t, err)
		require.Equal(t, workflow.Retrying, out, "a transient failure with MaxAttempts 1 is retried")
		inst := b.instance(t, "flaky", "1")
		require.Equal(t, 0, inst.Attempts)
		require.Equal(t, workflow.StatusRunning, inst.Status)
	}
	out, err := w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Completed, out)
	n, _ := b.sum(t, "keiro.workflow.resume.errors")
	require.Equal(t, int64(2), n)
}

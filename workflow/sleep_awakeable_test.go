package workflow_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/workflow"
)

func sleeper(cs *counters, d time.Duration) func(c *workflow.Context, _ struct{}) (int, error) {
	return func(c *workflow.Context, _ struct{}) (int, error) {
		if _, err := counterStep(c, cs, "before", 1); err != nil {
			return 0, err
		}
		if err := workflow.Sleep(c, "nap", d); err != nil {
			return 0, err
		}
		return counterStep(c, cs, "after", 2)
	}
}

func (b *bundle) timerWorker(t *testing.T) *events.TimerWorker {
	t.Helper()
	store, err := events.NewStore(events.StoreConfig{Schema: b.db.Schema})
	require.NoError(t, err)
	tw, err := events.NewTimerWorker(store, b.db.Pool, events.TimerWorkerConfig{Fire: b.e.FireTimer, Now: b.clock.Now})
	require.NoError(t, err)
	return tw
}

// keiro Sleep: "arms a timer and suspends, then a fired timer resumes the workflow" and
// "respects a positive delay: not due before fire_at, fires after"
func TestSleepArmsTimerAndFiredTimerResumes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cs := newCounters()
	w, err := workflow.Register(b.e, "sleepy", sleeper(cs, time.Hour))
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	out, err := w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Suspended, out)
	inst := b.instance(t, "sleepy", "1")
	require.Equal(t, workflow.StatusSuspended, inst.Status)
	require.WithinDuration(t, b.clock.Now().Add(time.Hour), *inst.WakeAfter, time.Millisecond)
	tw := b.timerWorker(t)
	store, err := events.NewStore(events.StoreConfig{Schema: b.db.Schema})
	require.NoError(t, err)
	timer, err := store.GetTimer(ctx, b.db.Pool, workflow.SleepTimerID("sleepy", "1", 0, "nap"))
	require.NoError(t, err)
	require.Equal(t, events.TimerScheduled, timer.Status)
	require.True(t, workflow.IsSleepTimer(timer))

	o, _, err := tw.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerIdle, o, "not due before fire_at")
	b.clock.Advance(time.Hour)
	o, _, err = tw.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerFiredNow, o)
	p, err := b.worker(t, "w").RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Completed)
	require.Equal(t, 1, cs.get("before"))
	require.Equal(t, 1, cs.get("after"))
}

// keiro Sleep: "does not postpone fire_at when a resume pass re-arms the sleep", "skips a sleeping
// workflow until wake_after expires", "does not re-invoke a parked sleeper before wake_after" and
// "fires a sleep longer than the resume cadence under an active resume worker" (the worker alone
// resumes it at its due time, without a timer worker).
func TestSleepDueTimeIsJournaled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cs := newCounters()
	w, err := workflow.Register(b.e, "sleepy", sleeper(cs, 10*time.Minute))
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	wk := b.worker(t, "w")
	p, err := wk.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Suspended)
	due := *b.instance(t, "sleepy", "1").WakeAfter
	b.clock.Advance(5 * time.Minute)
	p, err = wk.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, p.Claimed, "a sleeper is not run before its due time")
	out, err := w.Run(ctx, "1") // a direct re-run re-arms the sleep
	require.NoError(t, err)
	require.Equal(t, workflow.Suspended, out)
	require.True(t, due.Equal(*b.instance(t, "sleepy", "1").WakeAfter), "re-arming keeps the first due time")
	b.clock.Advance(5 * time.Minute)
	p, err = wk.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Completed)
	require.Equal(t, 1, cs.get("after"))
}

// keiro Sleep: "derives a deterministic, distinct timer id" and "uses generation-namespaced timer
// ids after continueAsNew"
func TestSleepTimerID(t *testing.T) {
	t.Parallel()
	a := workflow.SleepTimerID("w", "1", 0, "nap")
	require.Equal(t, a, workflow.SleepTimerID("w", "1", 0, "nap"))
	for _, other := range []envelope.UUID{
		workflow.SleepTimerID("w", "1", 1, "nap"), workflow.SleepTimerID("w", "2", 0, "nap"),
		workflow.SleepTimerID("w", "1", 0, "nap2"), workflow.SleepTimerID("w2", "1", 0, "nap"),
		workflow.SleepTimerID("w", "1/0", 0, "nap"),
	} {
		require.NotEqual(t, a, other)
	}
}

// FireTimer refuses timers that are not workflow sleeps, and bad payloads. keiro Sleep: "treats a
// missing instance row during sleep arm as a no-op wake hint update".
func TestFireTimerRefusesForeignTimers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tx(t, func(tx pgx.Tx) error {
		_, err := b.e.FireTimer(ctx, tx, events.Timer{ProcessManager: "payments"})
		require.ErrorContains(t, err, "not a workflow sleep")
		_, err = b.e.FireTimer(ctx, tx, events.Timer{ProcessManager: "keiro.workflow", Payload: []byte(`[1]`)})
		require.ErrorContains(t, err, "decode payload")
		_, err = b.e.FireTimer(ctx, tx, events.Timer{ProcessManager: "keiro.workflow", Payload: []byte(`{"workflow":"x","id":"y","step":"sleep:a:done"}`)})
		require.NoError(t, err, "a sleep of an instance that is gone fires as a no-op")
		var n int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM keiro_workflow_steps`).Scan(&n))
		require.Zero(t, n, "and records nothing")
		return nil
	})
}

// awaiter allocates an awakeable, publishes its id through a step, and awaits it.
func awaiter(ids chan<- envelope.UUID) func(c *workflow.Context, _ struct{}) (string, error) {
	return func(c *workflow.Context, _ struct{}) (string, error) {
		id, err := workflow.NewAwakeable(c, "approval")
		if err != nil {
			return "", err
		}
		select {
		case ids <- id:
		default:
		}
		v, err := workflow.AwaitAwakeable[string](c, id)
		var failed *workflow.AwakeableFailedError
		switch {
		case errors.As(err, &failed):
			return "failed: " + failed.Reason, nil
		case errors.Is(err, workflow.ErrAwakeableCancelled):
			return "cancelled", nil
		}
		return v, err
	}
}

// keiro Awakeable: "suspends on an unsignalled awakeable, recording a pending row and no
// completion", "resumes with the signalled payload after signalAwakeable", "is idempotent: a
// second signal returns False and does not change the value"
func TestAwakeableCompletedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ids := make(chan envelope.UUID, 4)
	w, err := workflow.Register(b.e, "approve", awaiter(ids))
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	out, err := w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Suspended, out)
	id := <-ids
	var pending int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM keiro_workflow_awakeables WHERE status = 'pending'`).Scan(&pending))
	require.Equal(t, 1, pending)
	out, err = w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Suspended, out)
	require.Equal(t, id, <-ids, "a replay hands out the same id")
	for i, want := range []bool{true, false} {
		b.tx(t, func(tx pgx.Tx) error {
			ok, err := b.e.CompleteAwakeableTx(ctx, tx, id, []string{"yes", "no"}[i])
			require.Equal(t, want, ok)
			return err
		})
	}
	b.tx(t, func(tx pgx.Tx) error {
		ok, err := b.e.FailAwakeableTx(ctx, tx, id, "late")
		require.False(t, ok, "a resolved awakeable stays resolved")
		return err
	})
	p, err := b.worker(t, "w").RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Completed)
	got, _, _, err := w.Result(ctx, b.db.Pool, "1")
	require.NoError(t, err)
	require.Equal(t, "yes", got)
}

// keiro Awakeable: "throws WorkflowAwakeableCancelled after cancelAwakeable"; failing an awakeable.
func TestAwakeableFailedOrCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ids := make(chan envelope.UUID, 4)
	w, err := workflow.Register(b.e, "approve", awaiter(ids))
	require.NoError(t, err)
	for _, tc := range []struct {
		id, want string
		resolve  func(tx pgx.Tx, id envelope.UUID) (bool, error)
	}{
		{"f", "failed: denied", func(tx pgx.Tx, id envelope.UUID) (bool, error) { return b.e.FailAwakeableTx(ctx, tx, id, "denied") }},
		{"c", "cancelled", func(tx pgx.Tx, id envelope.UUID) (bool, error) { return b.e.CancelAwakeableTx(ctx, tx, id) }},
	} {
		start(t, b, w, tc.id, struct{}{})
		_, err := w.Run(ctx, tc.id)
		require.NoError(t, err)
		id := <-ids
		b.tx(t, func(tx pgx.Tx) error {
			ok, err := tc.resolve(tx, id)
			require.True(t, ok)
			return err
		})
		out, err := w.Run(ctx, tc.id)
		require.NoError(t, err)
		require.Equal(t, workflow.Completed, out)
		got, _, _, err := w.Result(ctx, b.db.Pool, tc.id)
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
		<-ids // the resumed run's
	}
}

// keiro Awakeable: "refuses a forged coordinate-derived id for a fresh awakeable": ids are random,
// and an id that was never handed out is refused.
func TestAwakeableUnknownIDRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tx(t, func(tx pgx.Tx) error {
		_, err := b.e.CompleteAwakeableTx(ctx, tx, envelope.NewUUIDv7(), 1)
		require.ErrorIs(t, err, workflow.ErrNotFound)
		_, err = b.e.FailAwakeableTx(ctx, tx, envelope.UUID{}, "x")
		require.ErrorIs(t, err, workflow.ErrNotFound)
		return nil
	})
}

// keiro Awakeable: "allocates a fresh awakeable for the same label after continueAsNew"
func TestAwakeableFreshAfterContinueAsNew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ids := make(chan envelope.UUID, 4)
	w, err := workflow.Register(b.e, "loop", func(c *workflow.Context, round int) (int, error) {
		id, err := workflow.NewAwakeable(c, "tick")
		if err != nil {
			return 0, err
		}
		ids <- id
		if _, err := workflow.AwaitAwakeable[int](c, id); err != nil {
			return 0, err
		}
		if round == 0 {
			return 0, workflow.ContinueAsNew(c, round+1)
		}
		return round, nil
	})
	require.NoError(t, err)
	start(t, b, w, "1", 0)
	_, err = w.Run(ctx, "1")
	require.NoError(t, err)
	first := <-ids
	b.tx(t, func(tx pgx.Tx) error { _, err := b.e.CompleteAwakeableTx(ctx, tx, first, 1); return err })
	out, err := w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.ContinuedAsNew, out)
	<-ids // the replay of generation 0
	out, err = w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Suspended, out)
	second := <-ids
	require.NotEqual(t, first, second)
	b.tx(t, func(tx pgx.Tx) error { _, err := b.e.CompleteAwakeableTx(ctx, tx, second, 1); return err })
	out, err = w.Run(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, workflow.Completed, out)
}

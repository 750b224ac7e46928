package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/workflow"
)

// runWorker runs w until the test ends.
func runWorker(t *testing.T, w *workflow.Worker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	})
}

// keiro EP-50: "resumes a gated workflow sub-second after the gate append (10s fallback)". The
// fallback poll is an hour: only the push path can resume the instance within the test.
func TestWorkerWokenByNotify(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *workflow.Config) { c.Now = time.Now })
	ctx := context.Background()
	cs := newCounters()
	w, err := workflow.Register(b.e, "gated", stepThenAwait(cs))
	require.NoError(t, err)
	wk, err := workflow.NewWorker(b.e, workflow.WorkerConfig{PollInterval: time.Hour})
	require.NoError(t, err)
	runWorker(t, wk)
	start(t, b, w, "1", struct{}{})
	testenv.WaitFor(t, 30*time.Second, "the started instance suspends", func() bool {
		return b.instance(t, "gated", "1").Status == workflow.StatusSuspended
	})
	b.tx(t, func(tx pgx.Tx) error {
		_, err := b.e.CompleteStepTx(ctx, tx, "gated", "1", "gate", 1)
		return err
	})
	testenv.WaitFor(t, 30*time.Second, "the gated instance completes", func() bool {
		return b.instance(t, "gated", "1").Status == workflow.StatusCompleted
	})
}

// keiro EP-50: "still drains on the fallback timeout when no notification is delivered".
func TestWorkerDrainsOnPollWithoutNotify(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *workflow.Config) { c.Now = time.Now; c.DisableNotify = true })
	w, err := workflow.Register(b.e, "demo", demo(newCounters()))
	require.NoError(t, err)
	wk, err := workflow.NewWorker(b.e, workflow.WorkerConfig{PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	runWorker(t, wk)
	start(t, b, w, "1", struct{}{})
	testenv.WaitFor(t, 30*time.Second, "the instance completes by polling", func() bool {
		return b.instance(t, "demo", "1").Status == workflow.StatusCompleted
	})
}

// keiro EP-50: "logs a failed push pass and keeps draining after the store recovers": a pass
// that fails on the database (the tables are gone) is retried, and the worker drains once
// they are back.
func TestWorkerKeepsDrainingAfterFailedPass(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *workflow.Config) { c.Now = time.Now })
	ctx := context.Background()
	w, err := workflow.Register(b.e, "demo", demo(newCounters()))
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `ALTER TABLE `+b.db.Schema+`.keiro_workflows RENAME TO keiro_workflows_away`)
	require.NoError(t, err)
	wk, err := workflow.NewWorker(b.e, workflow.WorkerConfig{PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	runWorker(t, wk)
	testenv.WaitFor(t, 30*time.Second, "a failed pass is counted", func() bool {
		n, _ := b.sum(t, "keiro.workflow.resume.errors")
		return n >= 2
	})
	_, err = b.db.Pool.Exec(ctx, `ALTER TABLE `+b.db.Schema+`.keiro_workflows_away RENAME TO keiro_workflows`)
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	testenv.WaitFor(t, 30*time.Second, "the instance completes after recovery", func() bool {
		return b.instance(t, "demo", "1").Status == workflow.StatusCompleted
	})
}

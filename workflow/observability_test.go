package workflow_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/workflow"
)

// keiro observability: "records workflow instruments through an SDK meter"
func TestMetricsExecutedReplayedActiveJournal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cs := newCounters()
	w, err := workflow.Register(b.e, "gated", func(c *workflow.Context, _ struct{}) (pair, error) {
		a, err := counterStep(c, cs, "a", 1)
		if err != nil {
			return pair{}, err
		}
		g, err := workflow.Await[int](c, "gate")
		if err != nil {
			return pair{}, err
		}
		x, err := counterStep(c, cs, "b", 2)
		return pair{a + g, x}, err
	})
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	_, err = w.Run(ctx, "1") // a executed; suspends
	require.NoError(t, err)
	b.gate(t, "gated", "1", 0)
	_, err = w.Run(ctx, "1") // a replayed, gate replayed, b executed
	require.NoError(t, err)
	for name, want := range map[string]int64{
		"keiro.workflow.steps.executed": 2, "keiro.workflow.steps.replayed": 2,
		"keiro.workflow.journal.length": 1, "keiro.workflow.active": 0, "keiro.workflow.started": 1,
	} {
		got, ok := b.sum(t, name)
		require.True(t, ok, name)
		require.Equal(t, want, got, name)
	}
	require.Equal(t, 1, cs.get("a"))
}

// keiro observability: "records a resume and the pending-awakeable count when the worker re-invokes"
func TestMetricsResumedAndPendingAwakeables(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w, err := workflow.Register(b.e, "approve", awaiter(make(chan envelope.UUID, 4)))
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	p, err := b.worker(t, "w").RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Suspended)
	_, err = b.worker(t, "w").RunOnce(ctx) // samples the gauge after the awakeable exists
	require.NoError(t, err)
	n, ok := b.sum(t, "keiro.workflow.resumed")
	require.True(t, ok)
	require.Equal(t, int64(1), n)
	n, ok = b.sum(t, "keiro.workflow.awakeables.pending")
	require.True(t, ok)
	require.Equal(t, int64(1), n)
}

// One span per run and one per executed step, with keiro's attributes.
func TestSpansPerRunAndStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w, err := workflow.Register(b.e, "demo", demo(newCounters()))
	require.NoError(t, err)
	start(t, b, w, "1", struct{}{})
	_, err = w.Run(ctx, "1")
	require.NoError(t, err)
	var run, steps int
	for _, s := range b.spans.Ended() {
		attrs := attribute.NewSet(s.Attributes()...)
		v, _ := attrs.Value("keiro.workflow.id")
		require.Equal(t, "1", v.AsString())
		switch s.Name() {
		case "workflow demo":
			run++
			o, _ := attrs.Value("keiro.workflow.outcome")
			require.Equal(t, "completed", o.AsString())
		case "workflow demo step":
			steps++
			require.Equal(t, s.Parent().SpanID(), b.spans.Ended()[len(b.spans.Ended())-1].SpanContext().SpanID())
		}
	}
	require.Equal(t, 1, run)
	require.Equal(t, 2, steps)
}

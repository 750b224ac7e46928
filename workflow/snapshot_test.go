package workflow_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/keiro-go/keiro/workflow"
)

// sixSteps is keiro's countingSixSteps: steps s1..s6 returning 1..6, each counted. With a
// gate, it awaits step "gate" after step gateAfter (0: never) and adds nothing for it.
func sixSteps(cs *counters, gateAfter int) func(c *workflow.Context, _ struct{}) ([]int, error) {
	return func(c *workflow.Context, _ struct{}) ([]int, error) {
		var out []int
		for i := 1; i <= 6; i++ {
			v, err := counterStep(c, cs, fmt.Sprintf("s%d", i), i)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
			if i == gateAfter {
				if _, err := workflow.Await[bool](c, "gate"); err != nil {
					return nil, err
				}
			}
		}
		return out, nil
	}
}

// every2 is the snapshot policy of keiro's snapshot tests.
func every2(cfg *workflow.Config) { cfg.Snapshot = workflow.SnapshotEvery(2) }

// openGate completes step "gate" of instance name/id.
func (b *bundle) openGate(t *testing.T, name, id string) {
	t.Helper()
	b.tx(t, func(tx pgx.Tx) error {
		ok, err := b.e.CompleteStepTx(context.Background(), tx, name, id, "gate", true)
		require.True(t, ok)
		return err
	})
}

// runTo runs instance id of w and requires outcome want.
func runTo[In, Out any](t *testing.T, w *workflow.Workflow[In, Out], id string, want workflow.Outcome) {
	t.Helper()
	out, err := w.Run(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, want, out)
}

// result requires instance id of w completed and returns its result.
func result[In, Out any](t *testing.T, b *bundle, w *workflow.Workflow[In, Out], id string) Out {
	t.Helper()
	got, _, ok, err := w.Result(context.Background(), b.db.Pool, id)
	require.NoError(t, err)
	require.True(t, ok)
	return got
}

// snapshot reads instance name/id's usable snapshot, if any.
func (b *bundle) snapshot(t *testing.T, name, id string) (workflow.Snapshot, bool) {
	t.Helper()
	s, ok, err := b.e.Snapshot(context.Background(), b.db.Pool, name, id)
	require.NoError(t, err)
	return s, ok
}

// journalMap is an instance's journal as a step map, and its highest version.
func (b *bundle) journalMap(t *testing.T, name, id string) (map[string]json.RawMessage, int64) {
	t.Helper()
	j, err := b.e.Journal(context.Background(), b.db.Pool, name, id)
	require.NoError(t, err)
	m := map[string]json.RawMessage{}
	var v int64
	for _, e := range j {
		m[e.Step] = e.Result
		v = max(v, e.Version)
	}
	return m, v
}

// histSum returns the sum of a histogram's recorded values.
func (b *bundle) histSum(t *testing.T, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, b.metrics.Collect(context.Background(), &rm))
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[int64]); ok && m.Name == name {
				for _, p := range h.DataPoints {
					n += p.Sum
				}
			}
		}
	}
	return n
}

func stepNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("s%d", i+1)
	}
	return out
}

// keiro: "does not fail committed workflow steps when snapshot writes fail"
func TestSnapshotWriteFailureDoesNotFailSteps(t *testing.T) {
	t.Parallel()
	b := setup(t, every2)
	ctx := context.Background()
	cs := newCounters()
	failing, err := workflow.Register(b.e, "snap-write-failure", sixSteps(cs, 0))
	require.NoError(t, err)
	recovery, err := workflow.Register(b.e, "snap-write-recovery", sixSteps(newCounters(), 0))
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `ALTER TABLE keiro_workflow_snapshots ADD CONSTRAINT keiro_snapshots_no_writes CHECK (false) NOT VALID`)
	require.NoError(t, err)

	start(t, b, failing, "wf1", struct{}{})
	runTo(t, failing, "wf1", workflow.Completed)
	require.Equal(t, []int{1, 2, 3, 4, 5, 6}, result(t, b, failing, "wf1"))
	require.Equal(t, stepNames(6), b.steps(t, "snap-write-failure", "wf1"))
	for _, s := range stepNames(6) {
		require.Equal(t, 1, cs.get(s), s)
	}
	_, ok := b.snapshot(t, "snap-write-failure", "wf1")
	require.False(t, ok)
	failures, _ := b.sum(t, "keiro.snapshot.write.failures")
	require.Equal(t, int64(3), failures, "Every 2 fired at versions 2, 4 and 6")

	_, err = b.db.Pool.Exec(ctx, `ALTER TABLE keiro_workflow_snapshots DROP CONSTRAINT keiro_snapshots_no_writes`)
	require.NoError(t, err)
	start(t, b, recovery, "wf2", struct{}{})
	runTo(t, recovery, "wf2", workflow.Completed)
	require.Equal(t, []int{1, 2, 3, 4, 5, 6}, result(t, b, recovery, "wf2"))
	s, ok := b.snapshot(t, "snap-write-recovery", "wf2")
	require.True(t, ok)
	require.Equal(t, int64(6), s.JournalVersion)
	failures, _ = b.sum(t, "keiro.snapshot.write.failures")
	require.Equal(t, int64(3), failures)
}

// keiro: "writes a snapshot of the accumulated step map after Every 2 fires"
func TestSnapshotEveryTwoHoldsAccumulatedStepMap(t *testing.T) {
	t.Parallel()
	b := setup(t, every2)
	cs := newCounters()
	w, err := workflow.Register(b.e, "snap", sixSteps(cs, 3))
	require.NoError(t, err)
	start(t, b, w, "w1", struct{}{})

	// s1..s3 take versions 1..3 and the run parks on the gate: Every 2 fired at 2 only.
	runTo(t, w, "w1", workflow.Suspended)
	s, ok := b.snapshot(t, "snap", "w1")
	require.True(t, ok)
	require.Equal(t, int64(2), s.JournalVersion)
	require.Equal(t, 0, s.Generation)
	require.Equal(t, map[string]json.RawMessage{"s1": json.RawMessage("1"), "s2": json.RawMessage("2")}, s.Steps)

	// The gate takes version 4; s4..s6 take 5..7: Every 2 fires at 6, with every step below.
	b.openGate(t, "snap", "w1")
	runTo(t, w, "w1", workflow.Completed)
	require.Equal(t, []int{1, 2, 3, 4, 5, 6}, result(t, b, w, "w1"))
	s, ok = b.snapshot(t, "snap", "w1")
	require.True(t, ok)
	require.Equal(t, int64(6), s.JournalVersion)
	full, last := b.journalMap(t, "snap", "w1")
	require.Equal(t, int64(7), last)
	delete(full, "s6") // version 7, above the snapshot
	require.Equal(t, full, s.Steps)
	require.Len(t, s.Steps, 6)
}

// keiro: "writes a terminal snapshot under OnTerminal at the completion version"
func TestSnapshotOnTerminalAtCompletionVersion(t *testing.T) {
	t.Parallel()
	b := setup(t, func(cfg *workflow.Config) { cfg.Snapshot = workflow.SnapshotOnTerminal() })
	cs := newCounters()
	w, err := workflow.Register(b.e, "term", sixSteps(cs, 3))
	require.NoError(t, err)
	start(t, b, w, "tm1", struct{}{})
	runTo(t, w, "tm1", workflow.Suspended)
	_, ok := b.snapshot(t, "term", "tm1")
	require.False(t, ok, "no snapshot before the instance ends")

	b.openGate(t, "term", "tm1")
	runTo(t, w, "tm1", workflow.Completed)
	s, ok := b.snapshot(t, "term", "tm1")
	require.True(t, ok)
	full, last := b.journalMap(t, "term", "tm1")
	require.Equal(t, int64(7), last, "six steps and the gate")
	require.Equal(t, last, s.JournalVersion)
	require.Equal(t, full, s.Steps)
}

// keiro: "reads only the tail after the snapshot version on re-hydration"
func TestSnapshotHydrationReadsOnlyTail(t *testing.T) {
	t.Parallel()
	b := setup(t, every2)
	cs := newCounters()
	w, err := workflow.Register(b.e, "tail", sixSteps(cs, 6))
	require.NoError(t, err)
	start(t, b, w, "t1", struct{}{})
	runTo(t, w, "t1", workflow.Suspended)
	s, ok := b.snapshot(t, "tail", "t1")
	require.True(t, ok)
	require.Equal(t, int64(6), s.JournalVersion)
	require.Len(t, s.Steps, 6)
	require.Equal(t, int64(0), b.histSum(t, "keiro.workflow.journal.read"), "the first run found an empty journal")

	// A full read would return seven rows; the run reads the snapshot and the gate only.
	b.openGate(t, "tail", "t1")
	_, last := b.journalMap(t, "tail", "t1")
	require.Equal(t, int64(7), last)
	runTo(t, w, "t1", workflow.Completed)
	require.Equal(t, []int{1, 2, 3, 4, 5, 6}, result(t, b, w, "t1"))
	require.Equal(t, int64(1), b.histSum(t, "keiro.workflow.journal.read"))
	hits, _ := b.sum(t, "keiro.snapshot.read.hits")
	require.Equal(t, int64(1), hits)
	for _, name := range stepNames(6) {
		require.Equal(t, 1, cs.get(name), "journaled steps are not run again: %s", name)
	}
	replayed, _ := b.sum(t, "keiro.workflow.steps.replayed")
	require.Equal(t, int64(7), replayed, "six steps from the snapshot and the gate from the tail")
}

// keiro: "produces identical results and journals under Never and Every 2"
func TestSnapshotNeverAndEveryTwoAgree(t *testing.T) {
	t.Parallel()
	b := setup(t, func(cfg *workflow.Config) { cfg.Snapshot = workflow.SnapshotNever() })
	every, err := workflow.New(b.db.Pool, workflow.Config{Schema: b.db.Schema, Now: b.clock.Now, Snapshot: workflow.SnapshotEvery(2)})
	require.NoError(t, err)
	csN, csE := newCounters(), newCounters()
	never, err := workflow.Register(b.e, "corr", sixSteps(csN, 3))
	require.NoError(t, err)
	snap, err := workflow.Register(every, "corr-every", sixSteps(csE, 3))
	require.NoError(t, err)
	start(t, b, never, "c1", struct{}{})
	start(t, b, snap, "c1", struct{}{})
	for _, w := range []*workflow.Workflow[struct{}, []int]{never, snap} {
		runTo(t, w, "c1", workflow.Suspended)
		b.openGate(t, w.Name(), "c1")
		runTo(t, w, "c1", workflow.Completed) // the Every 2 run hydrates from its snapshot
	}
	require.Equal(t, result(t, b, never, "c1"), result(t, b, snap, "c1"))
	require.Equal(t, []int{1, 2, 3, 4, 5, 6}, result(t, b, snap, "c1"))
	jn, err := b.e.Journal(context.Background(), b.db.Pool, "corr", "c1")
	require.NoError(t, err)
	je, err := b.e.Journal(context.Background(), b.db.Pool, "corr-every", "c1")
	require.NoError(t, err)
	require.Len(t, je, len(jn))
	for i := range jn {
		require.Equal(t, jn[i].Step, je[i].Step)
		require.JSONEq(t, string(jn[i].Result), string(je[i].Result))
		require.Equal(t, jn[i].Version, je[i].Version)
	}
	for _, name := range stepNames(6) {
		require.Equal(t, csN.get(name), csE.get(name), name)
	}
	// No snapshot under Never; under Every 2 the snapshot equals the journal up to its version.
	_, ok := b.snapshot(t, "corr", "c1")
	require.False(t, ok)
	s, ok := b.snapshot(t, "corr-every", "c1")
	require.True(t, ok)
	want := map[string]json.RawMessage{}
	for _, e := range je {
		if e.Version <= s.JournalVersion {
			want[e.Step] = e.Result
		}
	}
	require.Equal(t, want, s.Steps)
}

// keiro: "hydrates via full replay when the snapshot discriminant mismatches"
func TestSnapshotShapeMismatchReadsWholeJournal(t *testing.T) {
	t.Parallel()
	b := setup(t, every2)
	cs := newCounters()
	w, err := workflow.Register(b.e, "dmiss", sixSteps(cs, 6))
	require.NoError(t, err)
	start(t, b, w, "d1", struct{}{})
	runTo(t, w, "d1", workflow.Suspended)
	_, err = b.db.Pool.Exec(context.Background(), `UPDATE keiro_workflow_snapshots SET shape_hash = 'stale-shape'`)
	require.NoError(t, err)
	_, ok := b.snapshot(t, "dmiss", "d1")
	require.False(t, ok)

	b.openGate(t, "dmiss", "d1")
	runTo(t, w, "d1", workflow.Completed)
	require.Equal(t, []int{1, 2, 3, 4, 5, 6}, result(t, b, w, "d1"))
	require.Equal(t, int64(7), b.histSum(t, "keiro.workflow.journal.read"), "the whole journal")
	misses, _ := b.sum(t, "keiro.snapshot.read.misses")
	require.Equal(t, int64(2), misses)
	hits, _ := b.sum(t, "keiro.snapshot.read.hits")
	require.Zero(t, hits)
	decodeFailures, _ := b.sum(t, "keiro.snapshot.decode.failures")
	require.Zero(t, decodeFailures)
	for _, name := range stepNames(6) {
		require.Equal(t, 1, cs.get(name), name)
	}
}

// keiro: "hydrates via full replay when the snapshot JSON is corrupt"
func TestSnapshotCorruptStateReadsWholeJournal(t *testing.T) {
	t.Parallel()
	b := setup(t, every2)
	cs := newCounters()
	w, err := workflow.Register(b.e, "cjson", sixSteps(cs, 6))
	require.NoError(t, err)
	start(t, b, w, "d2", struct{}{})
	runTo(t, w, "d2", workflow.Suspended)
	_, err = b.db.Pool.Exec(context.Background(), `UPDATE keiro_workflow_snapshots SET state = '"bad"'`)
	require.NoError(t, err)
	_, ok := b.snapshot(t, "cjson", "d2")
	require.False(t, ok)

	b.openGate(t, "cjson", "d2")
	runTo(t, w, "d2", workflow.Completed)
	require.Equal(t, []int{1, 2, 3, 4, 5, 6}, result(t, b, w, "d2"))
	decodeFailures, _ := b.sum(t, "keiro.snapshot.decode.failures")
	require.Equal(t, int64(1), decodeFailures)
	misses, _ := b.sum(t, "keiro.snapshot.read.misses")
	require.Equal(t, int64(2), misses)
	require.Equal(t, int64(7), b.histSum(t, "keiro.workflow.journal.read"), "the whole journal")
	for _, name := range stepNames(6) {
		require.Equal(t, 1, cs.get(name), name)
	}
}

// keiro: Keiro.Workflow.Snapshot codec "round-trips a non-trivial accumulated step map and
// carries the sentinel shape hash"
func TestSnapshotCodecRoundTrip(t *testing.T) {
	t.Parallel()
	m := map[string]json.RawMessage{
		"first":     json.RawMessage(`1`),
		"second":    json.RawMessage(`["a","b"]`),
		"sleep:42":  json.RawMessage(`null`),
		"awk:new:x": json.RawMessage(`{"kind":"ok","value":{"nested":[1,2.5,"\u00e9"]}}`),
	}
	b, err := workflow.EncodeStepMap(m)
	require.NoError(t, err)
	got, err := workflow.DecodeStepMap(b)
	require.NoError(t, err)
	require.Len(t, got, len(m))
	for k, v := range m {
		require.JSONEq(t, string(v), string(got[k]), k)
	}
	require.Equal(t, "keiro.workflow.stepmap.v1", workflow.SnapshotShapeHash)
	require.Equal(t, 1, workflow.SnapshotStateVersion)
	for _, bad := range []string{`"bad"`, `null`, `[1]`, `{"a":`} {
		_, err := workflow.DecodeStepMap([]byte(bad))
		require.Error(t, err, bad)
	}
}

// A step recorded by a wake source while a run's step ran takes a version below the run's
// step: the snapshot at the run's step reads it, so it equals the journal at its version.
func TestSnapshotIncludesStepsRecordedMeanwhile(t *testing.T) {
	t.Parallel()
	b := setup(t, every2)
	ctx := context.Background()
	w, err := workflow.Register(b.e, "meanwhile", func(c *workflow.Context, _ struct{}) (int, error) {
		if _, err := workflow.Step(c, "s1", func(context.Context, pgx.Tx) (int, error) { return 1, nil }); err != nil {
			return 0, err
		}
		return workflow.Step(c, "s2", func(context.Context, pgx.Tx) (int, error) {
			// An outside completion of another step, committed before s2 records.
			err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				_, err := b.e.CompleteStepTx(ctx, tx, "meanwhile", "m1", "outside", "x")
				return err
			})
			return 2, err
		})
	})
	require.NoError(t, err)
	start(t, b, w, "m1", struct{}{})
	runTo(t, w, "m1", workflow.Completed)
	full, last := b.journalMap(t, "meanwhile", "m1")
	require.Equal(t, int64(3), last)
	s, ok := b.snapshot(t, "meanwhile", "m1")
	require.True(t, ok)
	require.Equal(t, int64(3), s.JournalVersion, "s2 took version 3 and crossed 2")
	require.Equal(t, full, s.Steps)
}

// SnapshotEvery needs a positive n.
func TestSnapshotPolicyValidated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := workflow.New(b.db.Pool, workflow.Config{Schema: b.db.Schema, Snapshot: workflow.SnapshotEvery(0)})
	require.ErrorContains(t, err, "Snapshot: SnapshotEvery(0): n must be positive")
	for p, want := range map[workflow.SnapshotPolicy]string{
		workflow.SnapshotNever(): "never", workflow.SnapshotEvery(100): "every 100", workflow.SnapshotOnTerminal(): "on-terminal",
	} {
		require.Equal(t, want, p.String())
	}
}

// A rotation drops the finished generation's snapshot with its journal; the next generation's
// snapshot holds its own steps only; GC deletes it with the instance.
func TestSnapshotFollowsGenerationsAndGC(t *testing.T) {
	t.Parallel()
	b := setup(t, every2)
	ctx := context.Background()
	w, err := workflow.Register(b.e, "rot", func(c *workflow.Context, gen int) (int, error) {
		for _, s := range []string{"a", "b"} {
			if _, err := workflow.Step(c, s, func(context.Context, pgx.Tx) (int, error) { return 10*gen + len(s), nil }); err != nil {
				return 0, err
			}
		}
		if gen == 0 {
			// Every 2 fired at version 2: generation 0's snapshot exists until the rotation.
			s, ok, err := b.e.Snapshot(ctx, b.db.Pool, "rot", "1")
			if err != nil || !ok || s.Generation != 0 || s.JournalVersion != 2 {
				return 0, fmt.Errorf("generation 0's snapshot: %+v %v %v", s, ok, err)
			}
			return 0, workflow.ContinueAsNew(c, 1)
		}
		return gen, nil
	})
	require.NoError(t, err)
	start(t, b, w, "1", 0)
	runTo(t, w, "1", workflow.ContinuedAsNew)
	_, ok := b.snapshot(t, "rot", "1")
	require.False(t, ok, "the rotation dropped generation 0's snapshot")

	runTo(t, w, "1", workflow.Completed)
	s, ok := b.snapshot(t, "rot", "1")
	require.True(t, ok)
	require.Equal(t, 1, s.Generation)
	require.Equal(t, int64(4), s.JournalVersion, "versions go on increasing across generations")
	full, last := b.journalMap(t, "rot", "1")
	require.Equal(t, int64(4), last)
	require.Equal(t, full, s.Steps)
	require.JSONEq(t, "11", string(s.Steps["a"]))

	b.clock.Advance(time.Hour) // past the database's completed_at
	n, err := b.e.GC(ctx, b.db.Pool, 0, 10)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	var rows int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM keiro_workflow_snapshots`).Scan(&rows))
	require.Zero(t, rows)
}

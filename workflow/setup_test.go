package workflow_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/workflow"
)

// clock is a settable engine clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// bundle is one test's database, engine, clock and telemetry.
type bundle struct {
	db      *testenv.DB
	e       *workflow.Engine
	clock   *clock
	metrics *metric.ManualReader
	spans   *tracetest.SpanRecorder
}

// setup opens a fresh schema and an engine over it; mutate adjusts the engine's Config.
func setup(t *testing.T, mutate ...func(*workflow.Config)) *bundle {
	t.Helper()
	db := testenv.NewDB(t)
	b := &bundle{db: db, clock: &clock{now: time.Now().UTC()}, metrics: metric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	cfg := workflow.Config{
		Schema: db.Schema, Now: b.clock.Now, LeaseTTL: 30 * time.Second, MaxAttempts: 3,
		MeterProvider:  metric.NewMeterProvider(metric.WithReader(b.metrics)),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b.spans)),
	}
	for _, m := range mutate {
		m(&cfg)
	}
	e, err := workflow.New(db.Pool, cfg)
	require.NoError(t, err)
	b.e = e
	return b
}

// start starts instance id of w in its own transaction.
func start[In, Out any](t *testing.T, b *bundle, w *workflow.Workflow[In, Out], id string, in In) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		ok, err := w.StartTx(ctx, tx, id, in)
		require.True(t, ok)
		return err
	}))
}

// tx runs fn in a transaction of its own.
func (b *bundle) tx(t *testing.T, fn func(tx pgx.Tx) error) {
	t.Helper()
	require.NoError(t, pgx.BeginFunc(context.Background(), b.db.Pool, fn))
}

func (b *bundle) instance(t *testing.T, name, id string) workflow.Instance {
	t.Helper()
	in, err := b.e.Instance(context.Background(), b.db.Pool, name, id)
	require.NoError(t, err)
	return in
}

func (b *bundle) steps(t *testing.T, name, id string) []string {
	t.Helper()
	j, err := b.e.Journal(context.Background(), b.db.Pool, name, id)
	require.NoError(t, err)
	out := make([]string, len(j))
	for i, s := range j {
		out[i] = s.Step
	}
	return out
}

func (b *bundle) worker(t *testing.T, owner string) *workflow.Worker {
	t.Helper()
	w, err := workflow.NewWorker(b.e, workflow.WorkerConfig{Owner: owner, PollInterval: time.Second})
	require.NoError(t, err)
	return w
}

// counters counts side effects by name.
type counters struct {
	mu sync.Mutex
	n  map[string]int
}

func newCounters() *counters { return &counters{n: map[string]int{}} }

func (c *counters) inc(name string) {
	c.mu.Lock()
	c.n[name]++
	c.mu.Unlock()
}

func (c *counters) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

// counterStep is a step that counts its executions and returns v.
func counterStep[V any](c *workflow.Context, cs *counters, name string, v V) (V, error) {
	return workflow.Step(c, name, func(context.Context, pgx.Tx) (V, error) {
		cs.inc(name)
		return v, nil
	})
}

// sums reads a counter's (or up-down counter's) total and a histogram's count by name.
func (b *bundle) sum(t *testing.T, name string) (int64, bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, b.metrics.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				var n int64
				for _, p := range d.DataPoints {
					n += p.Value
				}
				return n, true
			case metricdata.Gauge[int64]:
				var n int64
				for _, p := range d.DataPoints {
					n += p.Value
				}
				return n, true
			case metricdata.Histogram[int64]:
				var n uint64
				for _, p := range d.DataPoints {
					n += p.Count
				}
				return int64(n), true
			}
		}
	}
	return 0, false
}

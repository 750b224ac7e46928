package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/workflow"
)

// Added is the bare command's event.
type Added struct{ N int }

// bareRunner is the event store's command runner on a one-event counter: the baseline a step
// is compared with.
func bareRunner(b *testing.B, db *testenv.DB) *events.Runner[int, int, Added] {
	b.Helper()
	s, err := events.NewStore(events.StoreConfig{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	codec := events.NewJSONCodec[Added]()
	if err := events.RegisterJSON[Added](codec, "Added", 1); err != nil {
		b.Fatal(err)
	}
	r, err := events.NewRunner(s, events.Decider[int, int, Added]{
		Decide: func(_ int, n int) ([]Added, error) { return []Added{{n}}, nil },
		Evolve: func(s int, e Added) int { return s + e.N },
	}, codec, events.RunnerConfig[int]{})
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// parallel runs n operations over writers goroutines and returns the elapsed time.
func parallel(writers, n int, op func(i int) error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	start := time.Now()
	for range writers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := op(i); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	err, _ := failed.Load().(error)
	return time.Since(start), err
}

// BenchmarkWorkflow measures workflow starts, steps, and whole one-step workflows (start, then
// a worker's run) next to the bare command runner (one event appended to a fresh stream, one
// commit), in alternating rounds of 50 operations per writer so that load from elsewhere hits
// both alike. "ratio" is workflow/bare throughput; "step-cost" its inverse for steps.
func BenchmarkWorkflow(b *testing.B) {
	for _, writers := range []int{1, 4} {
		for _, what := range []string{"start", "step", "start+run"} {
			b.Run(fmt.Sprintf("%s/writers=%d", what, writers), func(b *testing.B) { benchmarkWorkflow(b, what, writers) })
		}
	}
}

func benchmarkWorkflow(b *testing.B, what string, writers int) {
	db := testenv.NewDB(b)
	ctx := context.Background()
	r := bareRunner(b, db)
	e, err := workflow.New(db.Pool, workflow.Config{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	// "steps" runs one step per operation, each in the long-lived instance of its writer: the
	// instance awaits "next" forever, and each operation is one more step of its run.
	type op struct {
		i    int
		done chan error
	}
	feeds := make([]chan op, writers)
	oneStep, err := workflow.Register(e, "one", func(c *workflow.Context, _ int) (int, error) {
		return workflow.Step(c, "s", func(context.Context, pgx.Tx) (int, error) { return 1, nil })
	})
	if err != nil {
		b.Fatal(err)
	}
	long, err := workflow.Register(e, "long", func(c *workflow.Context, w int) (int, error) {
		for o := range feeds[w] {
			_, err := workflow.Step(c, fmt.Sprint("s", o.i), func(context.Context, pgx.Tx) (int, error) { return o.i, nil })
			o.done <- err
		}
		return 0, nil
	})
	if err != nil {
		b.Fatal(err)
	}
	var runs sync.WaitGroup
	if what == "step" {
		for w := range writers {
			feeds[w] = make(chan op)
			id := fmt.Sprint("w", w)
			if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { _, err := long.StartTx(ctx, tx, id, w); return err }); err != nil {
				b.Fatal(err)
			}
			runs.Go(func() {
				if _, err := long.Run(ctx, id); err != nil {
					b.Error(err)
				}
			})
		}
	}
	run := time.Now().UnixNano()
	workflowOp := func(i int) error {
		id := fmt.Sprintf("%d.%d", run, i)
		switch what {
		case "start":
			return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { _, err := oneStep.StartTx(ctx, tx, id, i); return err })
		case "start+run":
			if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { _, err := oneStep.StartTx(ctx, tx, id, i); return err }); err != nil {
				return err
			}
			out, err := oneStep.Run(ctx, id)
			if err == nil && out != workflow.Completed {
				err = fmt.Errorf("outcome %s", out)
			}
			return err
		}
		// Writers share the instances' feeds; each instance runs its steps one at a time.
		done := make(chan error, 1)
		feeds[i%writers] <- op{i: i, done: done}
		return <-done
	}
	bare := func(i int) error {
		_, err := r.Run(ctx, db.Pool, fmt.Sprintf("counter-%d.%d", run, i), 1)
		return err
	}
	var tWf, tBare time.Duration
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(50*writers, b.N-done)
		d, err := parallel(writers, n, func(i int) error { return workflowOp(done + i) })
		if err != nil {
			b.Fatal(err)
		}
		tWf += d
		if d, err = parallel(writers, n, func(i int) error { return bare(done + i) }); err != nil {
			b.Fatal(err)
		}
		tBare += d
		done += n
	}
	b.StopTimer()
	for _, f := range feeds {
		if f != nil {
			close(f)
		}
	}
	runs.Wait()
	wf, br := float64(b.N)/tWf.Seconds(), float64(b.N)/tBare.Seconds()
	b.ReportMetric(wf, what+"/s")
	b.ReportMetric(br, "bare-cmds/s")
	b.ReportMetric(wf/br, "ratio")
}

// BenchmarkWorkflowWake measures the push path: one-step workflows started at a steady rate
// (KEIRO_BENCH_WAKE_RATE, default 100/s) with one worker running whose fallback poll is 10 s, and
// the latency from each StartTx's commit to its run's first statement; p50 and p99 per round.
func BenchmarkWorkflowWake(b *testing.B) {
	db := testenv.NewDB(b)
	ctx := context.Background()
	e, err := workflow.New(db.Pool, workflow.Config{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	committed, ran := map[string]time.Time{}, map[string]time.Time{}
	w, err := workflow.Register(e, "ping", func(c *workflow.Context, _ int) (int, error) {
		now := time.Now()
		mu.Lock()
		if _, ok := ran[c.WorkflowID()]; !ok {
			ran[c.WorkflowID()] = now
		}
		mu.Unlock()
		return 1, nil
	})
	if err != nil {
		b.Fatal(err)
	}
	wk, err := workflow.NewWorker(e, workflow.WorkerConfig{PollInterval: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- wk.Run(wctx) }()
	rate := 100
	every := time.Second / time.Duration(rate)
	b.ResetTimer()
	tick := time.NewTicker(every)
	for i := range b.N {
		<-tick.C
		id := fmt.Sprint(i)
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { _, err := w.StartTx(ctx, tx, id, i); return err }); err != nil {
			b.Fatal(err)
		}
		mu.Lock()
		committed[id] = time.Now()
		mu.Unlock()
	}
	tick.Stop()
	b.StopTimer()
	stop := func() {
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			b.Error(err)
		}
	}
	defer stop()
	testenv.WaitFor(b, time.Minute, "every started workflow ran", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ran) == b.N
	})
	var lat []time.Duration
	for id, t := range ran {
		lat = append(lat, t.Sub(committed[id]))
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	}
	b.ReportMetric(float64(rate), "starts/s-offered")
}

// BenchmarkWorkflowCrashResume measures resume latency after a crash: a run dies mid-step (its
// context ends, its lease stays), and a second worker (LeaseTTL 1 s, poll 100 ms) completes the
// instance; the time from the crash to the completion, against the bound lease + one poll.
func BenchmarkWorkflowCrashResume(b *testing.B) {
	db := testenv.NewDB(b)
	ctx := context.Background()
	const lease, poll = time.Second, 100 * time.Millisecond
	e, err := workflow.New(db.Pool, workflow.Config{Schema: db.Schema, LeaseTTL: lease})
	if err != nil {
		b.Fatal(err)
	}
	var crashing atomic.Bool
	inStep := make(chan struct{}, 1)
	completed := make(chan time.Time, 1)
	w, err := workflow.Register(e, "crash", func(c *workflow.Context, _ int) (int, error) {
		if _, err := workflow.Step(c, "a", func(context.Context, pgx.Tx) (int, error) { return 1, nil }); err != nil {
			return 0, err
		}
		_, err := workflow.Step(c, "b", func(ctx context.Context, _ pgx.Tx) (int, error) {
			if crashing.Load() {
				inStep <- struct{}{}
				<-ctx.Done()
				return 0, ctx.Err()
			}
			return 2, nil
		})
		if err == nil {
			completed <- time.Now()
		}
		return 0, err
	})
	if err != nil {
		b.Fatal(err)
	}
	live, err := workflow.NewWorker(e, workflow.WorkerConfig{PollInterval: poll})
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	worst := time.Duration(0)
	b.ResetTimer()
	for i := range b.N {
		id := fmt.Sprint(i)
		crashing.Store(true)
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { _, err := w.StartTx(ctx, tx, id, i); return err }); err != nil {
			b.Fatal(err)
		}
		cctx, crash := context.WithCancel(ctx)
		ran := make(chan struct{})
		go func() { _, _ = w.Run(cctx, id); close(ran) }()
		<-inStep
		crashing.Store(false)
		crash()
		<-ran
		crashedAt := time.Now()
		lctx, stop := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- live.Run(lctx) }()
		at := <-completed
		stop()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			b.Fatal(err)
		}
		d := at.Sub(crashedAt)
		total += d
		worst = max(worst, d)
	}
	b.StopTimer()
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "resume-ms")
	b.ReportMetric(float64(worst.Milliseconds()), "worst-ms")
	b.ReportMetric(float64((lease + poll).Milliseconds()), "bound-ms")
}

// BenchmarkWorkflowHydrate measures a run of an instance with a long journal
// (KEIRO_BENCH_HYDRATE_STEPS, default 1 050 steps) parked on an await that never resolves:
// each operation claims the instance, hydrates its journal, replays every step and parks
// again. It compares SnapshotNever (the whole journal read) with SnapshotEvery(100) (the
// snapshot at version 1 000 and the 50 steps after it), in alternating rounds so that load from
// elsewhere hits both alike; rows/op are the journal rows each run read
// (keiro.workflow.journal.read).
func BenchmarkWorkflowHydrate(b *testing.B) {
	steps := 1050
	if s := os.Getenv("KEIRO_BENCH_HYDRATE_STEPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			b.Fatalf("KEIRO_BENCH_HYDRATE_STEPS=%q: not a positive number", s)
		}
		steps = n
	}
	db := testenv.NewDB(b)
	ctx := context.Background()
	long := func(c *workflow.Context, _ int) (int, error) {
		for i := range steps {
			if _, err := workflow.Step(c, fmt.Sprint("s", i), func(context.Context, pgx.Tx) (int, error) { return i, nil }); err != nil {
				return 0, err
			}
		}
		return workflow.Await[int](c, "never")
	}
	type arm struct {
		name    string
		w       *workflow.Workflow[int, int]
		reader  *sdkmetric.ManualReader
		elapsed time.Duration
	}
	var arms []*arm
	for _, p := range []struct {
		name   string
		policy workflow.SnapshotPolicy
	}{{"never", workflow.SnapshotNever()}, {"every100", workflow.SnapshotEvery(100)}} {
		a := &arm{name: p.name, reader: sdkmetric.NewManualReader()}
		e, err := workflow.New(db.Pool, workflow.Config{Schema: db.Schema, Snapshot: p.policy,
			MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(a.reader))})
		if err != nil {
			b.Fatal(err)
		}
		if a.w, err = workflow.Register(e, "long-"+p.name, long); err != nil {
			b.Fatal(err)
		}
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { _, err := a.w.StartTx(ctx, tx, "1", 0); return err }); err != nil {
			b.Fatal(err)
		}
		if out, err := a.w.Run(ctx, "1"); err != nil || out != workflow.Suspended {
			b.Fatalf("build the journal of %s: %s, %v", p.name, out, err)
		}
		arms = append(arms, a)
	}
	rowsRead := func(a *arm) int64 {
		var rm metricdata.ResourceMetrics
		if err := a.reader.Collect(ctx, &rm); err != nil {
			b.Fatal(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if h, ok := m.Data.(metricdata.Histogram[int64]); ok && m.Name == "keiro.workflow.journal.read" {
					var n int64
					for _, p := range h.DataPoints {
						n += p.Sum
					}
					return n
				}
			}
		}
		return 0
	}
	before := make([]int64, len(arms))
	for i, a := range arms {
		before[i] = rowsRead(a)
	}
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(10, b.N-done)
		for _, a := range arms {
			t0 := time.Now()
			for range n {
				if out, err := a.w.Run(ctx, "1"); err != nil || out != workflow.Suspended {
					b.Fatalf("%s: %s, %v", a.name, out, err)
				}
			}
			a.elapsed += time.Since(t0)
		}
		done += n
	}
	b.StopTimer()
	for i, a := range arms {
		b.ReportMetric(float64(a.elapsed.Microseconds())/float64(b.N), a.name+"-µs/op")
		b.ReportMetric(float64(rowsRead(a)-before[i])/float64(b.N), a.name+"-rows/op")
	}
	b.ReportMetric(arms[1].elapsed.Seconds()/arms[0].elapsed.Seconds(), "every100/never")
}

package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// BenchmarkRoutedFromInbox measures integration events routed to one command each, through the
// inbox (Store.Process with Router.InboxHandler: the inbox row, the id pre-check, a savepoint
// and the command in one transaction), next to the same inbox transaction running the bare
// command runner. The two alternate in rounds of 100 operations per writer; "ratio" is
// routed/bare throughput.
func BenchmarkRoutedFromInbox(b *testing.B) {
	for _, writers := range []int{1, 8} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			db := testenv.NewDB(b)
			s, runner := newCounterRunnerNotify(b, db, true)
			ctx := context.Background()
			st, err := inbox.NewStore(inbox.StoreConfig{Schema: db.Schema, Consumer: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			r, err := events.NewRouter(s, events.RouterConfig[string, counterCmd]{
				Name: "bench", Key: func(order string) string { return order },
				Resolve: func(_ context.Context, order string) ([]events.Command[counterCmd], error) {
					return []events.Command[counterCmd]{{Stream: "routed-" + order, Command: counterCmd{N: 1}}}, nil
				},
				Target: runner,
			})
			if err != nil {
				b.Fatal(err)
			}
			routed, err := r.InboxHandler(func(ev envelope.Event) (string, error) { return *ev.Key, nil }, events.DispatchPolicy{})
			if err != nil {
				b.Fatal(err)
			}
			bare := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
				_, err := runner.Run(ctx, tx, "bare-"+*ev.Key, counterCmd{N: 1})
				return err
			}
			run := time.Now().UnixNano()
			process := func(kind string, h inbox.Handler) func(i int) error {
				return func(i int) error {
					key := fmt.Sprintf("%d.%d", run, i)
					ev := envelope.Event{MessageID: kind + "-" + key, Source: "ordering", Destination: "ordering.orders.v1",
						Key: &key, EventType: "OrderPlaced", SchemaVersion: 1, ContentType: "application/json",
						Payload: []byte(`{}`), OccurredAt: time.Now().UTC()}
					res, err := st.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, h)
					if err == nil && res.Outcome != inbox.Processed {
						err = fmt.Errorf("%s %d: %s: %v", kind, i, res.Outcome, res.Err)
					}
					return err
				}
			}
			routedOp, bareOp := process("routed", routed), process("bare", bare)
			var tRouted, tBare time.Duration
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(100*writers, b.N-done)
				d, err := runParallel(writers, n, func(i int) error { return routedOp(done + i) })
				if err != nil {
					b.Fatal(err)
				}
				tRouted += d
				if d, err = runParallel(writers, n, func(i int) error { return bareOp(done + i) }); err != nil {
					b.Fatal(err)
				}
				tBare += d
				done += n
			}
			b.StopTimer()
			routedRate, bareRate := float64(b.N)/tRouted.Seconds(), float64(b.N)/tBare.Seconds()
			b.ReportMetric(routedRate, "routed/s")
			b.ReportMetric(bareRate, "bare/s")
			b.ReportMetric(routedRate/bareRate, "ratio")
		})
	}
}

// BenchmarkTimersFired measures b.N due timers fired by two TimerWorkers, each fire a command
// with the timer's id in the fire's transaction, next to the bare command runner running the
// same commands with two writers. "ratio" is timers/commands throughput.
func BenchmarkTimersFired(b *testing.B) {
	db := testenv.NewDB(b)
	s, runner := newCounterRunnerNotify(b, db, true)
	ctx := context.Background()
	now := time.Now()
	reqs := make([]events.TimerRequest, b.N)
	for i := range reqs {
		reqs[i] = events.TimerRequest{ID: envelope.NewUUIDv7(), ProcessManager: "bench", CorrelationID: fmt.Sprintf("timed-%d", i),
			FireAt: now.Add(-time.Duration(b.N-i) * time.Millisecond), Payload: json.RawMessage(`{}`)}
	}
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		for _, r := range reqs {
			if _, err := s.ScheduleTimerTx(ctx, tx, r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	fire := func(ctx context.Context, tx pgx.Tx, t events.Timer) (envelope.UUID, error) {
		_, err := runner.Run(ctx, tx, t.CorrelationID, counterCmd{N: 1}, events.RunOptions{EventIDs: []envelope.UUID{t.ID}})
		return t.ID, err
	}
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		w, err := events.NewTimerWorker(s, db.Pool, events.TimerWorkerConfig{Fire: fire})
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			for {
				out, _, err := w.RunOnce(ctx)
				if err != nil || out == events.TimerIdle {
					errs <- err
					return
				}
				if out != events.TimerFiredNow {
					errs <- fmt.Errorf("timer %s", out)
					return
				}
			}
		})
	}
	wg.Wait()
	timers := time.Since(start)
	close(errs)
	for err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	d, err := runParallel(2, b.N, func(i int) error {
		_, err := runner.Run(ctx, db.Pool, fmt.Sprintf("bare-%d", i), counterCmd{N: 1}, events.RunOptions{EventIDs: []envelope.UUID{envelope.NewUUIDv7()}})
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	c, err := s.CountTimers(ctx, db.Pool, time.Now())
	if err != nil || c.Due != 0 || c.Firing != 0 {
		b.Fatalf("timers left: %+v, %v", c, err)
	}
	timerRate, cmdRate := float64(b.N)/timers.Seconds(), float64(b.N)/d.Seconds()
	b.ReportMetric(timerRate, "timers/s")
	b.ReportMetric(cmdRate, "cmds/s")
	b.ReportMetric(timerRate/cmdRate, "ratio")
}

// BenchmarkTimerFireLag offers due timers at a steady rate (KEIRO_BENCH_TIMER_RATE per second,
// default 1 000, for KEIRO_BENCH_TIMER_SECONDS, default 3) to two running TimerWorkers with a
// 10 ms poll interval, each fire a command, and reports the fire lag (fire_at to the start of
// the fire) at p50, p99 and max. b.N is ignored: run it with -benchtime 1x.
func BenchmarkTimerFireLag(b *testing.B) {
	rate, seconds := envInt(b, "KEIRO_BENCH_TIMER_RATE", 1000), envInt(b, "KEIRO_BENCH_TIMER_SECONDS", 3)
	db := testenv.NewDB(b)
	s, runner := newCounterRunnerNotify(b, db, true)
	ctx := context.Background()
	n := rate * seconds
	start := time.Now().Add(time.Second).Truncate(time.Millisecond)
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		for i := range n {
			at := start.Add(time.Duration(i) * time.Second / time.Duration(rate))
			if _, err := s.ScheduleTimerTx(ctx, tx, events.TimerRequest{ID: envelope.NewUUIDv7(), ProcessManager: "bench",
				CorrelationID: fmt.Sprintf("lag-%d", i), FireAt: at}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	lags := make([]time.Duration, 0, n)
	done := make(chan struct{})
	fire := func(ctx context.Context, tx pgx.Tx, t events.Timer) (envelope.UUID, error) {
		lag := time.Since(t.FireAt)
		_, err := runner.Run(ctx, tx, t.CorrelationID, counterCmd{N: 1}, events.RunOptions{EventIDs: []envelope.UUID{t.ID}})
		if err == nil {
			mu.Lock()
			lags = append(lags, lag)
			if len(lags) == n {
				close(done)
			}
			mu.Unlock()
		}
		return t.ID, err
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 2 {
		w, err := events.NewTimerWorker(s, db.Pool, events.TimerWorkerConfig{Fire: fire, PollInterval: 10 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() { _ = w.Run(wctx) })
	}
	b.ResetTimer()
	select {
	case <-done:
	case <-time.After(time.Duration(seconds)*time.Second + 2*time.Minute):
		b.Errorf("timed out with %d of %d fired", len(lags), n)
	}
	cancel()
	wg.Wait()
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(lags)
	q := func(p float64) float64 {
		return float64(lags[min(len(lags)-1, int(p*float64(len(lags))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(float64(rate), "offered/s")
	b.ReportMetric(q(0.5), "lag-p50-ms")
	b.ReportMetric(q(0.99), "lag-p99-ms")
	b.ReportMetric(float64(lags[len(lags)-1])/float64(time.Millisecond), "lag-max-ms")
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

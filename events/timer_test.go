package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// clock is a settable worker clock.
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

func (tm *telemetry) histogram(t testing.TB, name string) (count uint64, sum float64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, tm.metrics.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					count, sum = count+p.Count, sum+p.Sum
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					count, sum = count+p.Count, sum+float64(p.Sum)
				}
			}
		}
	}
	return count, sum
}

// timerRig is a store, a counter runner and a fire function that adds 1 to the timer's
// correlation stream with the timer id as the event id: the effect of a fire.
type timerRig struct {
	db     *testenv.DB
	store  *events.Store
	runner *events.Runner[counterState, counterCmd, counterEvent]
	clock  *clock
	tm     *telemetry
	fires  atomic.Int64
	fail   atomic.Pointer[error]
}

func newTimerRig(t *testing.T) *timerRig {
	t.Helper()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	s, r := newCounterRunner(t, db, tm, events.RunnerConfig[counterState]{})
	return &timerRig{db: db, store: s, runner: r, tm: tm, clock: &clock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}}
}

func (r *timerRig) fire(ctx context.Context, tx pgx.Tx, tm events.Timer) (envelope.UUID, error) {
	r.fires.Add(1)
	if err := r.fail.Load(); err != nil {
		return envelope.UUID{}, *err
	}
	res, err := r.runner.Run(ctx, tx, tm.CorrelationID, counterCmd{N: 1}, events.RunOptions{EventIDs: []envelope.UUID{tm.ID}})
	if err != nil {
		return envelope.UUID{}, err
	}
	return res.Events[0].ID, nil
}

func (r *timerRig) worker(t *testing.T, cfg events.TimerWorkerConfig) *events.TimerWorker {
	t.Helper()
	if cfg.Fire == nil {
		cfg.Fire = r.fire
	}
	cfg.Now, cfg.MeterProvider = r.clock.Now, r.tm.mp
	w, err := events.NewTimerWorker(r.store, r.db.Pool, cfg)
	require.NoError(t, err)
	return w
}

func (r *timerRig) schedule(t *testing.T, stream string, fireIn time.Duration) envelope.UUID {
	t.Helper()
	id := envelope.NewUUIDv7()
	ok, err := r.store.ScheduleTimerTx(context.Background(), r.db.Pool, events.TimerRequest{ID: id, ProcessManager: "counter-pm",
		CorrelationID: stream, FireAt: r.clock.Now().Add(fireIn), Payload: json.RawMessage(`{"why":"timeout"}`)})
	require.NoError(t, err)
	require.True(t, ok)
	return id
}

func (r *timerRig) timer(t *testing.T, id envelope.UUID) events.Timer {
	t.Helper()
	tm, err := r.store.GetTimer(context.Background(), r.db.Pool, id)
	require.NoError(t, err)
	return tm
}

func TestTimerScheduleRearmOnceCancel(t *testing.T) {
	t.Parallel()
	r := newTimerRig(t)
	ctx := context.Background()
	id := r.schedule(t, "counter-1", time.Minute)
	req := events.TimerRequest{ID: id, ProcessManager: "counter-pm", CorrelationID: "counter-1", FireAt: r.clock.Now().Add(time.Hour)}

	// Re-arm while scheduled: the new fire time wins.
	ok, err := r.store.ScheduleTimerTx(ctx, r.db.Pool, req)
	require.NoError(t, err)
	require.True(t, ok)
	got := r.timer(t, id)
	require.True(t, got.FireAt.Equal(req.FireAt), "%s", got.FireAt)
	require.Equal(t, events.TimerScheduled, got.Status)
	require.JSONEq(t, "null", string(got.Payload))

	// Schedule-once: the first arm wins.
	once := req
	once.ID, once.FireAt = envelope.NewUUIDv7(), r.clock.Now().Add(-time.Second)
	ok, err = r.store.ScheduleTimerOnceTx(ctx, r.db.Pool, once)
	require.NoError(t, err)
	require.True(t, ok)
	once.FireAt = r.clock.Now().Add(time.Hour)
	ok, err = r.store.ScheduleTimerOnceTx(ctx, r.db.Pool, once)
	require.NoError(t, err)
	require.False(t, ok)
	require.True(t, r.timer(t, once.ID).FireAt.Before(r.clock.Now()))

	// Not due yet: the worker fires the once timer only.
	w := r.worker(t, events.TimerWorkerConfig{})
	out, fired, err := w.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerFiredNow, out)
	require.Equal(t, once.ID, fired.ID)
	out, _, err = w.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerIdle, out)
	// A fired timer is never re-armed or cancelled.
	once.FireAt = r.clock.Now().Add(-time.Hour)
	ok, err = r.store.ScheduleTimerTx(ctx, r.db.Pool, once)
	require.NoError(t, err)
	require.False(t, ok)
	ok, err = r.store.CancelTimer(ctx, r.db.Pool, once.ID)
	require.NoError(t, err)
	require.False(t, ok)
	require.Equal(t, events.TimerFired, r.timer(t, once.ID).Status)

	// Cancel: not claimable once due; a second cancel reports false.
	ok, err = r.store.CancelTimer(ctx, r.db.Pool, id)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = r.store.CancelTimer(ctx, r.db.Pool, id)
	require.NoError(t, err)
	require.False(t, ok)
	r.clock.Advance(2 * time.Hour)
	out, _, err = w.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerIdle, out)
	require.Equal(t, events.TimerCancelled, r.timer(t, id).Status)
	require.Equal(t, int64(1), r.fires.Load())

	_, err = r.store.ScheduleTimerTx(ctx, r.db.Pool, events.TimerRequest{Payload: json.RawMessage("{")})
	for _, want := range []string{"ID: required", "ProcessManager: required", "CorrelationID: required", "FireAt: required", "Payload: not valid JSON"} {
		require.ErrorContains(t, err, want)
	}
	_, err = r.store.GetTimer(ctx, r.db.Pool, envelope.NewUUIDv7())
	require.ErrorIs(t, err, events.ErrTimerNotFound)
}

// TestTimerFiresOnceAcrossWorkers: the claim, the fire and the mark happen once; the second
// worker finds nothing; the fired event id is the effect's; the instruments report it.
func TestTimerFiresOnceAcrossWorkers(t *testing.T) {
	t.Parallel()
	r := newTimerRig(t)
	ctx := context.Background()
	id := r.schedule(t, "counter-1", 0)
	a, b := r.worker(t, events.TimerWorkerConfig{}), r.worker(t, events.TimerWorkerConfig{})
	out, tm, err := a.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerFiredNow, out)
	require.Equal(t, int64(1), tm.Attempts)
	out, _, err = b.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerIdle, out)
	got := r.timer(t, id)
	require.Equal(t, events.TimerFired, got.Status)
	require.Equal(t, id, *got.FiredEventID)
	require.Equal(t, 1, streamLen(t, r.store, r.db, "counter-1"))

	n, lag := r.tm.histogram(t, "keiro.timer.fire.lag")
	require.Equal(t, uint64(1), n)
	require.Equal(t, 0.0, lag) // the worker's clock is the fire time
	n, attempts := r.tm.histogram(t, "keiro.timer.attempts")
	require.Equal(t, uint64(1), n)
	require.Equal(t, 1.0, attempts)
	// a's pass recorded backlog 1 before its claim, b's recorded 0; both saw nothing stuck.
	require.Equal(t, int64(0), r.tm.counter(t, "keiro.timer.stuck"))
}

// TestTimerStaleFiringIsRequeued: a fire that fails (a worker that died mid-fire) leaves the
// timer firing; a fresh firing timer is not requeued; once it is older than
// RequeueStuckAfter a pass requeues it and it fires, once.
func TestTimerStaleFiringIsRequeued(t *testing.T) {
	t.Parallel()
	r := newTimerRig(t)
	ctx := context.Background()
	id := r.schedule(t, "counter-1", 0)
	w := r.worker(t, events.TimerWorkerConfig{RequeueStuckAfter: time.Minute})
	crash := errors.New("worker crashed mid-fire")
	r.fail.Store(&crash)
	out, _, err := w.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerFireFailed, out)
	got := r.timer(t, id)
	require.Equal(t, events.TimerFiring, got.Status)
	require.Equal(t, crash.Error(), got.LastError)
	require.Equal(t, 0, streamLen(t, r.store, r.db, "counter-1"))
	r.fail.Store(nil)

	// Fresh: not requeued. Stuck listings see it.
	out, _, err = w.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerIdle, out)
	c, err := r.store.CountTimers(ctx, r.db.Pool, r.clock.Now())
	require.NoError(t, err)
	require.Equal(t, events.TimerCounts{Due: 0, Firing: 1}, c)
	stuck, err := r.store.FindStuckTimers(ctx, r.db.Pool, r.clock.Now(), events.StuckTimerFilter{})
	require.NoError(t, err)
	require.Len(t, stuck, 1)
	require.Equal(t, id, stuck[0].ID)
	stuck, err = r.store.FindStuckTimers(ctx, r.db.Pool, r.clock.Now(), events.StuckTimerFilter{MinAttempts: 5})
	require.NoError(t, err)
	require.Empty(t, stuck)
	_, err = r.store.FindStuckTimers(ctx, r.db.Pool, r.clock.Now(), events.StuckTimerFilter{Limit: -1})
	require.ErrorContains(t, err, "must not be negative")

	// Without a requeue age it stays firing however old.
	r.clock.Advance(2 * time.Minute)
	never := r.worker(t, events.TimerWorkerConfig{RequeueStuckAfter: -1})
	out, _, err = never.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerIdle, out)

	// Stale: requeued (fire_at kept) and fired.
	out, tm, err := w.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerFiredNow, out)
	require.Equal(t, int64(2), tm.Attempts)
	require.Equal(t, int64(1), r.tm.counter(t, "keiro.timer.requeued"))
	require.Equal(t, events.TimerFired, r.timer(t, id).Status)
	require.Equal(t, 1, streamLen(t, r.store, r.db, "counter-1"))
	_, lag := r.tm.histogram(t, "keiro.timer.fire.lag")
	require.Equal(t, (2 * time.Minute).Seconds(), lag)

	// The operator's requeue: true for a firing timer, false otherwise.
	ok, err := r.store.RequeueStuckTimer(ctx, r.db.Pool, id)
	require.NoError(t, err)
	require.False(t, ok)
}

// TestTimerAttemptCeiling: past MaxAttempts the claim makes the timer dead and Fire is not
// called; a dead timer is never fired or re-armed.
func TestTimerAttemptCeiling(t *testing.T) {
	t.Parallel()
	r := newTimerRig(t)
	ctx := context.Background()
	id := r.schedule(t, "counter-1", 0)
	w := r.worker(t, events.TimerWorkerConfig{MaxAttempts: 1})
	boom := errors.New("target unavailable")
	r.fail.Store(&boom)
	out, _, err := w.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerFireFailed, out)
	ok, err := r.store.RequeueStuckTimer(ctx, r.db.Pool, id)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = r.store.RequeueStuckTimer(ctx, r.db.Pool, id)
	require.NoError(t, err)
	require.False(t, ok)
	r.fail.Store(nil)

	out, tm, err := w.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerDeadNow, out)
	require.Equal(t, int64(2), tm.Attempts)
	got := r.timer(t, id)
	require.Equal(t, events.TimerDead, got.Status)
	require.Equal(t, "timer exceeded attempt ceiling of 1", got.LastError)
	require.Equal(t, int64(1), r.fires.Load())
	ok, err = r.store.ScheduleTimerTx(ctx, r.db.Pool, events.TimerRequest{ID: id, ProcessManager: "counter-pm", CorrelationID: "counter-1", FireAt: r.clock.Now()})
	require.NoError(t, err)
	require.False(t, ok)
	out, _, err = w.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerIdle, out)

	_, err = events.NewTimerWorker(nil, nil, events.TimerWorkerConfig{MaxAttempts: -1, PollInterval: -1})
	for _, want := range []string{"store is nil", "db is nil", "Fire: required", "MaxAttempts: -1 is negative", "PollInterval"} {
		require.ErrorContains(t, err, want)
	}
}

// TestTimerLostClaimRollsBackTheEffect: a timer cancelled while it fires cannot be marked
// fired, so the fire's effect rolls back.
func TestTimerLostClaimRollsBackTheEffect(t *testing.T) {
	t.Parallel()
	r := newTimerRig(t)
	ctx := context.Background()
	id := r.schedule(t, "counter-1", 0)
	w := r.worker(t, events.TimerWorkerConfig{Fire: func(ctx context.Context, tx pgx.Tx, tm events.Timer) (envelope.UUID, error) {
		eid, err := r.fire(ctx, tx, tm)
		if err != nil {
			return eid, err
		}
		ok, err := r.store.CancelTimer(ctx, r.db.Pool, tm.ID) // another transaction
		require.NoError(t, err)
		require.True(t, ok)
		return eid, nil
	}})
	out, _, err := w.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerLost, out)
	require.Equal(t, events.TimerCancelled, r.timer(t, id).Status)
	require.Equal(t, 0, streamLen(t, r.store, r.db, "counter-1"))
}

// TestTimerTwoWorkersFireEachOnce: two workers draining one backlog concurrently fire every
// timer exactly once (claims never overlap) and apply each effect once.
func TestTimerTwoWorkersFireEachOnce(t *testing.T) {
	t.Parallel()
	r := newTimerRig(t)
	ctx := context.Background()
	const n = 40
	for i := range n {
		r.schedule(t, fmt.Sprintf("counter-%d", i), -time.Duration(i)*time.Second)
	}
	var wg sync.WaitGroup
	perWorker := make([]int, 2)
	errs := make(chan error, 2)
	for k := range 2 {
		w := r.worker(t, events.TimerWorkerConfig{})
		wg.Go(func() {
			for {
				out, _, err := w.RunOnce(ctx)
				if err != nil {
					errs <- err
					return
				}
				if out == events.TimerIdle {
					return
				}
				if out != events.TimerFiredNow {
					errs <- fmt.Errorf("worker %d: %s", k, out)
					return
				}
				perWorker[k]++
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, n, perWorker[0]+perWorker[1])
	require.Equal(t, int64(n), r.fires.Load())
	for i := range n {
		require.Equal(t, 1, streamLen(t, r.store, r.db, fmt.Sprintf("counter-%d", i)))
	}
	c, err := r.store.CountTimers(ctx, r.db.Pool, r.clock.Now())
	require.NoError(t, err)
	require.Equal(t, events.TimerCounts{}, c)
}

// TestTimerReleaseGivesBackClaimedTimers: a worker claims a batch and fires one; Release gives
// the others back (scheduled, attempt refunded) and another worker fires them.
func TestTimerReleaseGivesBackClaimedTimers(t *testing.T) {
	t.Parallel()
	r := newTimerRig(t)
	ctx := context.Background()
	ids := []envelope.UUID{r.schedule(t, "counter-1", -3*time.Second), r.schedule(t, "counter-2", -2*time.Second), r.schedule(t, "counter-3", -time.Second)}
	a := r.worker(t, events.TimerWorkerConfig{BatchSize: 5})
	out, first, err := a.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerFiredNow, out)
	require.Equal(t, ids[0], first.ID) // earliest first
	for _, id := range ids[1:] {
		require.Equal(t, events.TimerFiring, r.timer(t, id).Status)
	}
	require.NoError(t, a.Release(ctx))
	require.NoError(t, a.Release(ctx)) // nothing left: a no-op
	for _, id := range ids[1:] {
		got := r.timer(t, id)
		require.Equal(t, events.TimerScheduled, got.Status)
		require.Equal(t, int64(0), got.Attempts)
	}
	b := r.worker(t, events.TimerWorkerConfig{BatchSize: 1})
	for _, id := range ids[1:] {
		out, tm, err := b.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, events.TimerFiredNow, out)
		require.Equal(t, id, tm.ID)
		require.Equal(t, int64(1), tm.Attempts)
	}
	out, _, err = a.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerIdle, out)
	_, err = events.NewTimerWorker(r.store, r.db.Pool, events.TimerWorkerConfig{Fire: r.fire, BatchSize: -1})
	require.ErrorContains(t, err, "BatchSize: -1 is negative")
}

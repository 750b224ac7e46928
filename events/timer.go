package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/backoff"
	"github.com/keiro-go/keiro/internal/pgtext"
)

// Timer statuses (keiro's timer states).
const (
	// TimerScheduled is a timer waiting for its fire time (or requeued after a stale fire).
	TimerScheduled = "scheduled"
	// TimerFiring is a timer a worker claimed and is firing.
	TimerFiring = "firing"
	// TimerFired is a timer whose effect committed. Terminal.
	TimerFired = "fired"
	// TimerCancelled is a timer cancelled before it fired. Terminal.
	TimerCancelled = "cancelled"
	// TimerDead is a timer that went past its worker's attempt ceiling. Terminal.
	TimerDead = "dead"
)

// Timer worker defaults.
const (
	// DefaultTimerRequeueStuckAfter is how long a timer may stay firing before a worker puts it
	// back to scheduled (its worker crashed, or its fire failed).
	DefaultTimerRequeueStuckAfter = 300 * time.Second
	// DefaultTimerPollInterval is how long an idle TimerWorker.Run waits before looking for due
	// timers again.
	DefaultTimerPollInterval = time.Second
	// DefaultTimerBatchSize is how many due timers a TimerWorker claims at once.
	DefaultTimerBatchSize = 10
)

// TimerRequest asks for a durable timer (keiro's TimerRequest).
type TimerRequest struct {
	// ID identifies the timer. Choose it deterministically (from the process manager, the
	// correlation id and what the timer is for) so that scheduling twice is idempotent.
	// Required.
	ID envelope.UUID
	// ProcessManager names the process manager the timer belongs to. Required.
	ProcessManager string
	// CorrelationID is the process manager instance's correlation id. Required.
	CorrelationID string
	// FireAt is when the timer is due. Required.
	FireAt time.Time
	// Payload is JSON handed back when the timer fires. Defaults to null.
	Payload json.RawMessage
}

// TimerID is a deterministic timer id: the UUIDv5 (URL namespace) of the length-prefixed fields
// "keiro", "timer", the process manager, the correlation id and the timer's name ("payment
// timeout"). A process manager that arms the same timer on a redelivery then re-arms one row
// instead of adding another.
func TimerID(processManager, correlation, name string) envelope.UUID {
	return uuidV5(uuidNamespaceURL, lengthPrefixed("keiro", "timer", processManager, correlation, name))
}

func (r TimerRequest) validate() error {
	var errs []error
	if r.ID.IsZero() {
		errs = append(errs, errors.New("ID: required"))
	}
	if strings.TrimSpace(r.ProcessManager) == "" {
		errs = append(errs, errors.New("ProcessManager: required"))
	}
	if r.CorrelationID == "" {
		errs = append(errs, errors.New("CorrelationID: required"))
	}
	if r.FireAt.IsZero() {
		errs = append(errs, errors.New("FireAt: required"))
	}
	if len(r.Payload) > 0 && !json.Valid(r.Payload) {
		errs = append(errs, errors.New("Payload: not valid JSON"))
	}
	return errors.Join(errs...)
}

// Timer is a stored timer.
type Timer struct {
	// ID, ProcessManager, CorrelationID, FireAt and Payload are the request's.
	ID             envelope.UUID   `json:"id"`
	ProcessManager string          `json:"process_manager"`
	CorrelationID  string          `json:"correlation_id"`
	FireAt         time.Time       `json:"fire_at"`
	Payload        json.RawMessage `json:"payload"`
	// Status is TimerScheduled, TimerFiring, TimerFired, TimerCancelled or TimerDead.
	Status string `json:"status"`
	// Attempts is the number of times a worker claimed the timer.
	Attempts int64 `json:"attempts"`
	// FiredEventID is the event the fire reported, once fired (nil before, or when the fire
	// reported none).
	FiredEventID *envelope.UUID `json:"fired_event_id,omitempty"`
	// LastError is the last failed fire's error, or why the timer is dead.
	LastError string `json:"last_error,omitempty"`
	// CreatedAt and UpdatedAt are when the row was written first and last.
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

func scanTimer(row pgx.Row) (Timer, error) {
	var t Timer
	var id [16]byte
	var fired *[16]byte
	err := row.Scan(&id, &t.ProcessManager, &t.CorrelationID, &t.FireAt, &t.Payload, &t.Status, &t.Attempts,
		&fired, &t.LastError, &t.CreatedAt, &t.UpdatedAt)
	t.ID, t.FiredEventID = envelope.UUID(id), uuidFrom(fired)
	return t, err
}

// ScheduleTimerTx arms a timer in q (the transaction of the process manager's event, so they
// commit together), or re-arms it with the request's fire time and payload while it is still
// scheduled. A timer that is firing or terminal (fired, cancelled, dead) is left alone. It
// reports whether a row was written.
func (s *Store) ScheduleTimerTx(ctx context.Context, q keiro.DB, r TimerRequest) (bool, error) {
	return s.schedule(ctx, q, r, s.q.timerSchedule)
}

// ScheduleTimerOnceTx arms a timer unless one with its id exists, whatever its state: the
// first arm wins (workflow sleeps). It reports whether the timer was armed now.
func (s *Store) ScheduleTimerOnceTx(ctx context.Context, q keiro.DB, r TimerRequest) (bool, error) {
	return s.schedule(ctx, q, r, s.q.timerScheduleOnce)
}

func (s *Store) schedule(ctx context.Context, q keiro.DB, r TimerRequest, sql string) (bool, error) {
	if err := r.validate(); err != nil {
		return false, fmt.Errorf("schedule timer: %w", err)
	}
	payload := r.Payload
	if len(payload) == 0 {
		payload = json.RawMessage("null")
	}
	var id [16]byte
	err := q.QueryRow(ctx, sql, [16]byte(r.ID), r.ProcessManager, r.CorrelationID, r.FireAt, payload).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("schedule timer %s: %w", r.ID, err)
	}
	return true, nil
}

// CancelTimer cancels a scheduled or firing timer (a firing timer's effect then rolls back,
// as its fire can no longer mark it fired). It reports whether the timer was cancelled now:
// false for an unknown or terminal timer.
func (s *Store) CancelTimer(ctx context.Context, q keiro.DB, id envelope.UUID) (bool, error) {
	tag, err := q.Exec(ctx, s.q.timerCancel, [16]byte(id))
	if err != nil {
		return false, fmt.Errorf("cancel timer %s: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// ErrTimerNotFound reports a timer id with no stored timer.
var ErrTimerNotFound = errors.New("timer not found")

// GetTimer returns the stored timer id, or ErrTimerNotFound.
func (s *Store) GetTimer(ctx context.Context, q keiro.DB, id envelope.UUID) (Timer, error) {
	t, err := scanTimer(q.QueryRow(ctx, s.q.timerGet, [16]byte(id)))
	if errors.Is(err, pgx.ErrNoRows) {
		return Timer{}, fmt.Errorf("get timer %s: %w", id, ErrTimerNotFound)
	}
	if err != nil {
		return Timer{}, fmt.Errorf("get timer %s: %w", id, err)
	}
	return t, nil
}

// StuckTimerFilter selects firing timers for FindStuckTimers.
type StuckTimerFilter struct {
	// MinAge keeps timers claimed at least MinAge before now. Defaults to 0 (all).
	MinAge time.Duration
	// MinAttempts keeps timers claimed at least MinAttempts times. Defaults to 0 (all).
	MinAttempts int64
	// Limit caps the number of timers. Defaults to 100.
	Limit int
}

// FindStuckTimers lists firing timers, oldest claim first: timers whose worker crashed or whose
// fire failed, until a worker requeues them.
func (s *Store) FindStuckTimers(ctx context.Context, q keiro.DB, now time.Time, f StuckTimerFilter) ([]Timer, error) {
	if f.Limit == 0 {
		f.Limit = 100
	}
	if f.Limit < 0 || f.MinAge < 0 || f.MinAttempts < 0 {
		return nil, fmt.Errorf("find stuck timers: Limit, MinAge and MinAttempts must not be negative (%d, %s, %d)", f.Limit, f.MinAge, f.MinAttempts)
	}
	rows, err := q.Query(ctx, s.q.timerStuck, now.Add(-f.MinAge), f.MinAttempts, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("find stuck timers: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Timer, error) { return scanTimer(r) })
	if err != nil {
		return nil, fmt.Errorf("find stuck timers: %w", err)
	}
	return out, nil
}

// TimerCounts are the timer gauges.
type TimerCounts struct {
	// Due is the number of scheduled timers due at the time asked (keiro.timer.backlog).
	Due int64
	// Firing is the number of firing timers (keiro.timer.stuck).
	Firing int64
}

// CountTimers counts the scheduled timers due at now and the firing ones.
func (s *Store) CountTimers(ctx context.Context, q keiro.DB, now time.Time) (TimerCounts, error) {
	var c TimerCounts
	if err := q.QueryRow(ctx, s.q.timerGauges, now).Scan(&c.Due, &c.Firing); err != nil {
		return TimerCounts{}, fmt.Errorf("count timers: %w", err)
	}
	return c, nil
}

// RequeueStuckTimer puts a firing timer back to scheduled at once (an operator's fix for a
// timer whose worker is known to be gone). It reports whether it did: false when the timer is
// not firing.
func (s *Store) RequeueStuckTimer(ctx context.Context, q keiro.DB, id envelope.UUID) (bool, error) {
	tag, err := q.Exec(ctx, s.q.timerRequeue, [16]byte(id))
	if err != nil {
		return false, fmt.Errorf("requeue timer %s: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// FireFunc fires a claimed timer in tx: it applies the timer's effect (typically a command
// delivered to the timer's process manager) and returns the id of the event that records it
// (zero when there is none). tx commits only if the timer is still this claim's: when it was
// requeued and claimed again, or cancelled, meanwhile, the effect rolls back. An error rolls
// the effect back and leaves the timer firing, with the error recorded, until it is requeued.
type FireFunc func(ctx context.Context, tx pgx.Tx, t Timer) (envelope.UUID, error)

// TimerWorkerConfig configures a TimerWorker.
type TimerWorkerConfig struct {
	// Fire fires each claimed timer. Required.
	Fire FireFunc
	// MaxAttempts is the attempt ceiling: a timer claimed for the n-th time with n >
	// MaxAttempts becomes dead ("timer exceeded attempt ceiling of <MaxAttempts>") and is not
	// fired. Zero means no ceiling (keiro's Nothing); negative is an error. keiro's Just 0, a
	// ceiling that kills every timer on its first claim without firing it, has no equivalent:
	// the smallest ceiling is 1, one fire attempt. Defaults to 0.
	MaxAttempts int64
	// RequeueStuckAfter is how long a timer may stay firing before a worker's pass puts it
	// back to scheduled; negative disables the requeue (FindStuckTimers and
	// RequeueStuckTimer remain). Defaults to DefaultTimerRequeueStuckAfter.
	RequeueStuckAfter time.Duration
	// BatchSize is how many due timers one claim takes (one statement, one commit); the
	// worker then fires them one by one, earliest first. A worker that crashes leaves up to
	// BatchSize timers firing until a pass requeues them. Defaults to DefaultTimerBatchSize.
	BatchSize int
	// PollInterval is how long an idle Run waits before the next pass, and the least time
	// (never under a second) between two stale requeues or gauge recordings of one worker.
	// Defaults to DefaultTimerPollInterval.
	PollInterval time.Duration
	// Backoff spaces Run's passes after failed ones (the database is unreachable): the wait
	// after the n-th failure in a row is min(Max, Initial·Multiplier^(n−1)) with equal
	// jitter. Defaults to {DefaultTimerPollInterval/10, 30s, 2}.
	Backoff keiro.Backoff
	// Now is the worker's clock. Defaults to time.Now.
	Now func() time.Time
	// MeterProvider provides keiro's timer instruments. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Logger receives fire failures and dead timers. Defaults to slog.Default().
	Logger *slog.Logger
}

// TimerWorker fires due timers (keiro's timer worker). Several workers, in one process or
// many, may run over one store: each claim takes the earliest due timers that no other claim
// holds (FOR UPDATE SKIP LOCKED, BatchSize at a time) and commits at once, so a timer is fired
// by one worker at a time. A timer fires at least once: a worker that crashes mid-fire leaves it firing until
// another worker's pass requeues it (RequeueStuckAfter). Its effect happens once: the fire
// commits with the timer's move to fired, fenced by the claim's attempt, so a fire that lost
// its claim rolls back.
//
// Instruments (scope keiro): keiro.timer.backlog (due scheduled timers) and keiro.timer.stuck
// (firing timers), gauges recorded at most once per PollInterval (and per second); keiro.timer.fire.lag (seconds
// from fire_at to claim; keiro records milliseconds, keiro-go's durations are all in seconds) and keiro.timer.attempts (the claim's attempt), histograms;
// keiro.timer.requeued, a counter of stale timers put back. A TimerWorker is safe for
// concurrent use: concurrent RunOnce calls behave as several workers.
type TimerWorker struct {
	store   *Store
	pool    keiro.DB
	cfg     TimerWorkerConfig
	backlog metric.Int64Gauge
	stuck   metric.Int64Gauge
	lag     metric.Float64Histogram
	tries   metric.Int64Histogram
	requeue metric.Int64Counter

	gauged, requeued atomic.Int64 // unix nanoseconds of the last gauge recording and requeue

	mu      sync.Mutex
	claimed []Timer // claimed and not fired yet, earliest first
}

// NewTimerWorker returns a TimerWorker over db (a pool: the worker opens its own
// transactions), reporting every configuration problem at once.
func NewTimerWorker(store *Store, db keiro.DB, cfg TimerWorkerConfig) (*TimerWorker, error) {
	var errs []error
	if store == nil {
		errs = append(errs, errors.New("store is nil"))
	}
	if db == nil {
		errs = append(errs, errors.New("db is nil"))
	}
	if cfg.Fire == nil {
		errs = append(errs, errors.New("Fire: required"))
	}
	if cfg.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("MaxAttempts: %d is negative; 0 means no ceiling", cfg.MaxAttempts))
	}
	if cfg.RequeueStuckAfter == 0 {
		cfg.RequeueStuckAfter = DefaultTimerRequeueStuckAfter
	}
	if cfg.BatchSize < 0 {
		errs = append(errs, fmt.Errorf("BatchSize: %d is negative", cfg.BatchSize))
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultTimerBatchSize
	}
	if cfg.PollInterval < 0 {
		errs = append(errs, fmt.Errorf("PollInterval: %s is negative", cfg.PollInterval))
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultTimerPollInterval
	}
	cfg.Backoff = cfg.Backoff.WithDefaults(keiro.Backoff{Initial: DefaultTimerPollInterval / 10, Max: 30 * time.Second, Multiplier: keiro.DefaultMultiplier})
	if err := cfg.Backoff.Validate("Backoff"); err != nil {
		errs = append(errs, err)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	w := &TimerWorker{store: store, pool: db, cfg: cfg}
	m := cfg.MeterProvider.Meter(instrumentationScope)
	var err error
	if w.backlog, err = m.Int64Gauge("keiro.timer.backlog", metric.WithDescription("Scheduled timers that are due."), metric.WithUnit("{timer}")); err != nil {
		errs = append(errs, err)
	}
	if w.stuck, err = m.Int64Gauge("keiro.timer.stuck", metric.WithDescription("Timers a worker claimed and has not finished (firing)."), metric.WithUnit("{timer}")); err != nil {
		errs = append(errs, err)
	}
	if w.lag, err = m.Float64Histogram("keiro.timer.fire.lag", metric.WithDescription("Time from a timer's fire_at to its claim."), metric.WithUnit("s")); err != nil {
		errs = append(errs, err)
	}
	if w.tries, err = m.Int64Histogram("keiro.timer.attempts", metric.WithDescription("The attempt number of each timer claim."), metric.WithUnit("{attempt}")); err != nil {
		errs = append(errs, err)
	}
	if w.requeue, err = m.Int64Counter("keiro.timer.requeued", metric.WithDescription("Stale firing timers put back to scheduled."), metric.WithUnit("{timer}")); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new timer worker: %w", err)
	}
	return w, nil
}

// TimerOutcome is what one pass of a TimerWorker did.
type TimerOutcome uint8

const (
	// TimerIdle means no timer was due.
	TimerIdle TimerOutcome = iota
	// TimerFiredNow means a timer fired and its effect committed.
	TimerFiredNow
	// TimerFireFailed means the fire returned an error; the timer stays firing until it is
	// requeued.
	TimerFireFailed
	// TimerLost means the fire ran but the timer was no longer this claim's (cancelled, or
	// requeued and claimed again): its effect rolled back.
	TimerLost
	// TimerDeadNow means the claim went past MaxAttempts: the timer is dead and was not fired.
	TimerDeadNow
)

// String returns "idle", "fired", "failed", "lost" or "dead".
func (o TimerOutcome) String() string {
	switch o {
	case TimerIdle:
		return "idle"
	case TimerFiredNow:
		return "fired"
	case TimerFireFailed:
		return "failed"
	case TimerLost:
		return "lost"
	case TimerDeadNow:
		return "dead"
	}
	return fmt.Sprintf("TimerOutcome(%d)", uint8(o))
}

// RunOnce is one pass (keiro's runTimerWorker): it requeues stale firing timers and records
// the gauges (each at most once per PollInterval, and per second), takes the earliest due timer this worker
// claimed (claiming the next BatchSize due timers when it holds none) and fires it. It returns
// what became of that timer and the timer as claimed (zero when idle). An error is a database
// failure of the pass itself; a failed fire is TimerFireFailed, not an error.
func (w *TimerWorker) RunOnce(ctx context.Context) (TimerOutcome, Timer, error) {
	now := w.cfg.Now()
	if err := w.maintain(ctx, now); err != nil {
		return TimerIdle, Timer{}, err
	}
	t, ok, err := w.next(ctx, now)
	if err != nil || !ok {
		return TimerIdle, Timer{}, err
	}
	if w.cfg.MaxAttempts > 0 && t.Attempts > w.cfg.MaxAttempts {
		reason := fmt.Sprintf("timer exceeded attempt ceiling of %d", w.cfg.MaxAttempts)
		if _, err := w.pool.Exec(ctx, w.store.q.timerDead, [16]byte(t.ID), reason); err != nil {
			return TimerIdle, t, fmt.Errorf("timer worker: mark timer %s dead: %w", t.ID, err)
		}
		w.cfg.Logger.ErrorContext(ctx, "keiro: timer is dead", "timer_id", t.ID.String(), "process_manager", t.ProcessManager,
			"correlation_id", t.CorrelationID, "attempts", t.Attempts, "reason", reason)
		return TimerDeadNow, t, nil
	}
	return w.fire(ctx, t)
}

// maintain requeues stale firing timers and records the gauges, each at most once per
// maintenanceInterval of the worker's clock.
func (w *TimerWorker) maintain(ctx context.Context, now time.Time) error {
	every := w.maintenanceInterval()
	if last := w.requeued.Load(); w.cfg.RequeueStuckAfter > 0 && now.Sub(time.Unix(0, last)) >= every &&
		w.requeued.CompareAndSwap(last, now.UnixNano()) {
		tag, err := w.pool.Exec(ctx, w.store.q.timerRequeueStale, now.Add(-w.cfg.RequeueStuckAfter))
		if err != nil {
			return fmt.Errorf("timer worker: requeue stale timers: %w", err)
		}
		if n := tag.RowsAffected(); n > 0 {
			w.requeue.Add(ctx, n)
			w.cfg.Logger.WarnContext(ctx, "keiro: requeued stale firing timers", "count", n, "older_than", w.cfg.RequeueStuckAfter)
		}
	}
	if last := w.gauged.Load(); now.Sub(time.Unix(0, last)) >= every && w.gauged.CompareAndSwap(last, now.UnixNano()) {
		c, err := w.store.CountTimers(ctx, w.pool, now)
		if err != nil {
			return fmt.Errorf("timer worker: %w", err)
		}
		w.backlog.Record(ctx, c.Due)
		w.stuck.Record(ctx, c.Firing)
	}
	return nil
}

// maintenanceInterval is the least time between two stale requeues, or two gauge recordings,
// of one worker: PollInterval, and at least a second (a short PollInterval is for fire lag, not
// for counting the backlog).
func (w *TimerWorker) maintenanceInterval() time.Duration {
	return max(w.cfg.PollInterval, time.Second)
}

// next returns the earliest of the timers this worker claimed, claiming the next BatchSize
// due timers first when it holds none.
func (w *TimerWorker) next(ctx context.Context, now time.Time) (Timer, bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.claimed) == 0 {
		rows, err := w.pool.Query(ctx, w.store.q.timerClaim, now, w.cfg.BatchSize)
		if err != nil {
			return Timer{}, false, fmt.Errorf("timer worker: claim due timers: %w", err)
		}
		claimed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Timer, error) { return scanTimer(r) })
		if err != nil {
			return Timer{}, false, fmt.Errorf("timer worker: claim due timers: %w", err)
		}
		slices.SortFunc(claimed, func(a, b Timer) int {
			if c := a.FireAt.Compare(b.FireAt); c != 0 {
				return c
			}
			return bytes.Compare(a.ID[:], b.ID[:])
		})
		for _, t := range claimed {
			w.lag.Record(ctx, now.Sub(t.FireAt).Seconds())
			w.tries.Record(ctx, t.Attempts)
		}
		w.claimed = claimed
	}
	if len(w.claimed) == 0 {
		return Timer{}, false, nil
	}
	t := w.claimed[0]
	w.claimed = w.claimed[1:]
	return t, true, nil
}

// Release gives back the timers this worker claimed and has not fired yet: they are scheduled
// again at once, their attempt refunded, for any worker to claim. Run calls it when it ends;
// a worker stopped otherwise (a crash) leaves them firing until a pass requeues them.
func (w *TimerWorker) Release(ctx context.Context) error {
	w.mu.Lock()
	claimed := w.claimed
	w.claimed = nil
	w.mu.Unlock()
	if len(claimed) == 0 {
		return nil
	}
	ids, attempts := make([][16]byte, len(claimed)), make([]int64, len(claimed))
	for i, t := range claimed {
		ids[i], attempts[i] = t.ID, t.Attempts
	}
	if _, err := w.pool.Exec(ctx, w.store.q.timerRelease, ids, attempts); err != nil {
		return fmt.Errorf("timer worker: release %d claimed timers: %w", len(claimed), err)
	}
	return nil
}

// fire runs Fire and the move to fired in one transaction.
func (w *TimerWorker) fire(ctx context.Context, t Timer) (TimerOutcome, Timer, error) {
	outcome := TimerFiredNow
	var ferr error
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		id, err := w.cfg.Fire(ctx, tx, t)
		if err != nil {
			ferr = err
			return err
		}
		var fired *[16]byte
		if !id.IsZero() {
			fired = (*[16]byte)(&id)
		}
		tag, err := tx.Exec(ctx, w.store.q.timerFired, [16]byte(t.ID), t.Attempts, fired)
		if err != nil {
			return fmt.Errorf("timer worker: mark timer %s fired: %w", t.ID, err)
		}
		if tag.RowsAffected() == 0 {
			outcome = TimerLost
			return errTimerLost
		}
		t.Status, t.FiredEventID = TimerFired, uuidFrom(fired)
		return nil
	})
	switch {
	case err == nil:
		return TimerFiredNow, t, nil
	case errors.Is(err, errTimerLost):
		w.cfg.Logger.WarnContext(ctx, "keiro: timer was cancelled or claimed again while it fired; its effect rolled back",
			"timer_id", t.ID.String(), "attempt", t.Attempts)
		return outcome, t, nil
	case ferr != nil && ctx.Err() == nil:
		text := pgtext.Storable(ferr.Error(), maxErrorText)
		if _, err := w.pool.Exec(ctx, w.store.q.timerFailed, [16]byte(t.ID), t.Attempts, text); err != nil {
			return TimerFireFailed, t, fmt.Errorf("timer worker: record failed fire of timer %s: %w", t.ID, err)
		}
		t.LastError = text
		w.cfg.Logger.WarnContext(ctx, "keiro: timer fire failed; it stays firing until it is requeued",
			"timer_id", t.ID.String(), "attempt", t.Attempts, "requeue_after", w.cfg.RequeueStuckAfter, "error", ferr)
		return TimerFireFailed, t, nil
	}
	return TimerFireFailed, t, fmt.Errorf("timer worker: fire timer %s: %w", t.ID, err)
}

// errTimerLost rolls back a fire whose claim is gone.
var errTimerLost = errors.New("timer claim lost")

// Run fires due timers until ctx ends, waiting PollInterval whenever none is due, gives back
// the timers it claimed and did not fire (Release), and returns ctx's error. A failing pass (the database is unreachable) is logged and retried after
// Backoff's delay.
func (w *TimerWorker) Run(ctx context.Context) error {
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if err := w.Release(rctx); err != nil {
			w.cfg.Logger.WarnContext(ctx, "keiro: timer worker could not give back its claimed timers; they are requeued once stale", "error", err)
		}
		cancel()
	}()
	failures := 0
	for {
		outcome, _, err := w.RunOnce(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := time.Duration(0)
		switch {
		case err != nil:
			failures++
			wait = w.cfg.Backoff.Delay(failures)
			w.cfg.Logger.WarnContext(ctx, "keiro: timer worker pass failed", "failures", failures, "retry_in", wait, "error", err)
		case outcome == TimerIdle:
			failures, wait = 0, w.cfg.PollInterval
		default:
			failures = 0
		}
		if err := backoff.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

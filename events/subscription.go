package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/keiro-go/keiro/tracing"
)

// Subscription defaults.
const (
	// DefaultBatchSize is the number of events a subscription handles per transaction.
	DefaultBatchSize = 256
	// DefaultPollInterval is how often a subscription looks for events without a notification.
	DefaultPollInterval = time.Second
	// maxFences bounds the fences kept while a long append to the store is still open.
	maxFences = 256
	// minFenceRetry is the first delay before re-checking pending fences.
	minFenceRetry = time.Millisecond
)

// Handler applies one event inside the subscription's transaction tx; the checkpoint advances
// in the same transaction. An error rolls the batch back; the event is then delivered again, on
// its own, under SubscriptionConfig.Retry (wrap the error with Permanent to skip the remaining
// deliveries), and finally dead-lettered or halts the subscription.
type Handler func(ctx context.Context, tx pgx.Tx, e RecordedEvent) error

// BatchHandler applies a batch of consecutive events (in global-position order) inside tx. An
// error rolls the batch back and its events are delivered again one per transaction (batches of
// one), to find the event that fails; that one is then treated as a Handler's failing event.
type BatchHandler func(ctx context.Context, tx pgx.Tx, batch []RecordedEvent) error

// ResetFunc clears a projection's read model inside the Rebuild transaction.
type ResetFunc func(ctx context.Context, tx pgx.Tx) error

// SubscriptionConfig configures a Subscription.
type SubscriptionConfig struct {
	// Name identifies the subscription and its checkpoint. Required.
	Name string
	// Category restricts the subscription to one category's streams ("order"). Defaults to ""
	// (the whole log).
	Category string
	// BatchSize is the number of events handled per transaction. Defaults to DefaultBatchSize.
	BatchSize int
	// PollInterval is how often the log is checked when no notification arrives (and the only
	// way new events are found when DisableListen is set). Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// DisableListen turns LISTEN/NOTIFY off (where notifications do not reach the session):
	// the subscription polls only. Defaults to false. A subscription holds a session advisory
	// lock for its whole run, so it needs a direct connection or session pooling even then:
	// behind PgBouncer in transaction mode the lock would stay on a server connection that
	// PgBouncer hands to others.
	DisableListen bool
	// Retry bounds the deliveries of an event the handler fails on, and says what happens
	// then: dead-letter it and go on (the default) or halt. Defaults to DefaultMaxDeliveries
	// deliveries, DefaultDeliveryBackoff doubling up to DefaultMaxDeliveryBackoff, and
	// PoisonDeadLetter.
	Retry RetryPolicy
	// AfterCommit, if set, is called after every committed transaction of the subscription
	// (batches, dead-lettering, replays of dead letters) with the checkpoint. It must not block
	// for long. Defaults to nil.
	AfterCommit func(position int64)
	// MeterProvider provides the meter for keiro.projection.lag. Defaults to
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Logger receives lifecycle messages. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c *SubscriptionConfig) applyDefaults() {
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Retry.applyDefaults()
}

func (c *SubscriptionConfig) validate() error {
	var errs []error
	if c.Name == "" {
		errs = append(errs, errors.New("Name: required"))
	}
	if c.Category != "" {
		if err := ValidateCategory(c.Category); err != nil {
			errs = append(errs, fmt.Errorf("Category: %w", err))
		}
	}
	if c.BatchSize < 1 {
		errs = append(errs, fmt.Errorf("BatchSize: %d is not positive", c.BatchSize))
	}
	if c.PollInterval < 0 {
		errs = append(errs, fmt.Errorf("PollInterval: %v is negative", c.PollInterval))
	}
	errs = append(errs, c.Retry.validate())
	return errors.Join(errs...)
}

// Subscription follows the log (or one category) in global-position order and hands every
// event, exactly once per committed checkpoint, to a handler inside the transaction that
// advances the checkpoint. Only one Run per subscription name is active across all processes
// (a PostgreSQL advisory lock); others wait as hot standbys. See the package documentation for
// why no event is ever skipped.
type Subscription struct {
	store *Store
	pool  *pgxpool.Pool
	cfg   SubscriptionConfig
	apply BatchHandler

	running  atomic.Bool
	position atomic.Int64 // last checkpoint, for the lag gauge
	head     atomic.Int64 // newest position seen, for the lag gauge
	lag      metric.Int64ObservableGauge

	deadLettered, retried, replayed metric.Int64Counter
	nameAttr                        metric.MeasurementOption
}

// NewSubscription returns a Subscription that applies h to each event.
func NewSubscription(store *Store, pool *pgxpool.Pool, cfg SubscriptionConfig, h Handler) (*Subscription, error) {
	if h == nil {
		return nil, errors.New("new subscription: handler is nil")
	}
	return NewBatchSubscription(store, pool, cfg, func(ctx context.Context, tx pgx.Tx, batch []RecordedEvent) error {
		for _, e := range batch {
			if err := h(ctx, tx, e); err != nil {
				return &eventError{position: e.GlobalPosition, err: fmt.Errorf("event %s (%s@%d, position %d): %w",
					e.ID, e.StreamName, e.StreamVersion, e.GlobalPosition, err)}
			}
		}
		return nil
	})
}

// eventError tells the worker which event of a batch a Handler failed on.
type eventError struct {
	position int64
	err      error
}

func (e *eventError) Error() string { return e.err.Error() }
func (e *eventError) Unwrap() error { return e.err }

// NewBatchSubscription returns a Subscription that applies h to each batch.
func NewBatchSubscription(store *Store, pool *pgxpool.Pool, cfg SubscriptionConfig, h BatchHandler) (*Subscription, error) {
	cfg.applyDefaults()
	errs := []error{cfg.validate()}
	if store == nil {
		errs = append(errs, errors.New("store is nil"))
	}
	if pool == nil {
		errs = append(errs, errors.New("pool is nil"))
	}
	if h == nil {
		errs = append(errs, errors.New("handler is nil"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new subscription %q: %w", cfg.Name, err)
	}
	s := &Subscription{store: store, pool: pool, cfg: cfg, apply: h}
	lag, err := cfg.MeterProvider.Meter(instrumentationScope).Int64ObservableGauge("keiro.projection.lag",
		metric.WithDescription("Events between the log's head and the subscription's checkpoint."), metric.WithUnit("{event}"))
	if err != nil {
		return nil, fmt.Errorf("new subscription %q: create keiro.projection.lag: %w", cfg.Name, err)
	}
	s.lag = lag
	meter := cfg.MeterProvider.Meter(instrumentationScope)
	var cerrs []error
	counter := func(name, desc, unit string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		if err != nil {
			cerrs = append(cerrs, fmt.Errorf("create %s: %w", name, err))
		}
		return c
	}
	s.deadLettered = counter("keiro.subscription.deadlettered", "Events a subscription gave up on and recorded as dead letters.", "{event}")
	s.retried = counter("keiro.subscription.retried", "Deliveries of an event repeated after its handler failed.", "{delivery}")
	s.replayed = counter("keiro.subscription.replayed", "Dead letters delivered again on request, by outcome.", "{event}")
	if err := errors.Join(cerrs...); err != nil {
		return nil, fmt.Errorf("new subscription %q: %w", cfg.Name, err)
	}
	s.nameAttr = metric.WithAttributes(tracing.SubscriptionNameKey.String(cfg.Name))
	return s, nil
}

// Name returns the subscription's name.
func (s *Subscription) Name() string { return s.cfg.Name }

// Position returns the subscription's committed checkpoint (0 before the first batch).
func (s *Subscription) Position(ctx context.Context) (int64, error) {
	var p int64
	err := s.pool.QueryRow(ctx, s.store.q.subPosition, s.cfg.Name).Scan(&p)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read checkpoint of subscription %s: %w", s.cfg.Name, err)
	}
	return p, nil
}

// Rebuild resets the checkpoint to 0 and runs reset (typically a TRUNCATE of the read model)
// in one transaction, so the projection is rebuilt from the start of the log by the active Run
// (in this process or another). A batch in flight either commits before the reset or notices it
// and starts over; both take the checkpoint row lock first, so they cannot deadlock.
func (s *Subscription) Rebuild(ctx context.Context, reset ResetFunc) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.store.q.subReset, s.cfg.Name, int64(0)); err != nil {
			return fmt.Errorf("reset checkpoint: %w", err)
		}
		if reset != nil {
			if err := reset(ctx, tx); err != nil {
				return fmt.Errorf("reset read model: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("rebuild subscription %s: %w", s.cfg.Name, err)
	}
	return nil
}

// Run follows the log until ctx is done (then it returns nil) or a handler or the database
// fails (then it returns the error; the failed batch is rolled back and will be retried by the
// next Run). It first waits for the subscription's advisory lock, so a second Run of the same
// name, in any process, waits as a standby. Run must not be called twice at once on one
// Subscription.
func (s *Subscription) Run(ctx context.Context) (err error) {
	if !s.running.CompareAndSwap(false, true) {
		return fmt.Errorf("run subscription %s: already running", s.cfg.Name)
	}
	defer s.running.Store(false)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return s.exit(ctx, fmt.Errorf("run subscription %s: acquire connection: %w", s.cfg.Name, err))
	}
	clean := false
	defer func() {
		if !clean {
			// The session may still hold the lock or LISTEN: never return it to the pool.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = conn.Conn().Close(cctx)
			cancel()
		}
		conn.Release()
	}()
	if _, err := conn.Exec(ctx, s.store.q.subEnsure, s.cfg.Name); err != nil {
		return s.exit(ctx, fmt.Errorf("run subscription %s: create checkpoint: %w", s.cfg.Name, err))
	}
	if _, err := conn.Exec(ctx, s.store.q.subAdvisoryLock, s.cfg.Name); err != nil {
		return s.exit(ctx, fmt.Errorf("run subscription %s: wait for the subscription lock: %w", s.cfg.Name, err))
	}
	if !s.cfg.DisableListen {
		if _, err := conn.Exec(ctx, `LISTEN "`+s.store.channel+`"`); err != nil {
			return s.exit(ctx, fmt.Errorf("run subscription %s: listen: %w", s.cfg.Name, err))
		}
	}
	reg, err := s.store.metricsMeter(s.cfg.MeterProvider).RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(s.lag, max(0, s.head.Load()-s.position.Load()), metric.WithAttributes(tracing.SubscriptionNameKey.String(s.cfg.Name)))
		return nil
	}, s.lag)
	if err != nil {
		return s.exit(ctx, fmt.Errorf("run subscription %s: register lag gauge: %w", s.cfg.Name, err))
	}
	defer func() { _ = reg.Unregister() }()

	w := newWorker(s, conn.Conn())
	if err := w.loadPosition(ctx); err != nil {
		return s.exit(ctx, err)
	}
	s.cfg.Logger.DebugContext(ctx, "keiro: subscription active", "subscription", s.cfg.Name, "position", w.cp)
	for {
		if err := w.catchUp(ctx); err != nil {
			return s.exit(ctx, err)
		}
		if err := w.wait(ctx); err != nil {
			return s.exit(ctx, err)
		}
		if ctx.Err() != nil {
			break
		}
	}
	// Leave the session clean so the connection can go back to the pool; on an unresponsive
	// connection give up after a few seconds (the connection is then destroyed, which ends the
	// session and its lock).
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(bg, `UNLISTEN *`); err == nil {
		if _, err := conn.Exec(bg, s.store.q.subAdvisoryUnlock, s.cfg.Name); err == nil {
			clean = true
		}
	}
	return nil
}

// exit maps an error caused by ctx's cancellation to nil.
func (s *Subscription) exit(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (s *Store) metricsMeter(mp metric.MeterProvider) metric.Meter {
	return mp.Meter(instrumentationScope)
}

// worker is one Run's state: the locked session, the subscription's checkpoint (its one lane)
// and the late-commit guard.
type worker struct {
	lane
	guard
	// replay reports that the last horizon saw dead letters waiting to be replayed.
	replay bool
}

func newWorker(s *Subscription, conn *pgx.Conn) *worker {
	w := &worker{lane: lane{s: s, conn: conn, row: subscriptionRow{s}}}
	w.after = func(next int64) {
		s.position.Store(next)
		s.store.progressed()
		if s.cfg.AfterCommit != nil {
			s.cfg.AfterCommit(next)
		}
	}
	return w
}

// subscriptionRow is the checkpoint of an unsharded subscription: its row in
// keiro_subscriptions, held by the Run that holds the advisory lock.
type subscriptionRow struct{ s *Subscription }

func (r subscriptionRow) lock(ctx context.Context, tx pgx.Tx) (int64, error) {
	var stored int64
	if err := tx.QueryRow(ctx, r.s.store.q.subLock, r.s.cfg.Name).Scan(&stored); err != nil {
		return 0, fmt.Errorf("lock checkpoint: %w", err)
	}
	return stored, nil
}

func (r subscriptionRow) save(ctx context.Context, tx pgx.Tx, next int64) error {
	if _, err := tx.Exec(ctx, r.s.store.q.subSave, r.s.cfg.Name, next); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	return nil
}

func (w *worker) loadPosition(ctx context.Context) error {
	if err := w.conn.QueryRow(ctx, w.s.store.q.subPosition, w.s.cfg.Name).Scan(&w.cp); err != nil {
		return fmt.Errorf("run subscription %s: read checkpoint: %w", w.s.cfg.Name, err)
	}
	w.s.position.Store(w.cp)
	return nil
}

// safePosition returns the highest position known final (-1 if none yet), taking a new fence
// when the log has grown past the newest one.
func (w *worker) safePosition(ctx context.Context) (int64, error) {
	var (
		stored *int64
		still  []string
		head   int64
	)
	if err := w.conn.QueryRow(ctx, w.s.store.q.horizon, w.s.cfg.Name, w.pending()).Scan(&still, &head, &stored, &w.replay); err != nil {
		return 0, fmt.Errorf("run subscription %s: read horizon: %w", w.s.cfg.Name, err)
	}
	w.s.head.Store(head)
	if stored != nil && *stored != w.cp {
		w.moved(ctx, *stored)
	}
	safe, err := w.advance(ctx, w.conn, w.s.store.q.fence, still, head, w.cp)
	if err != nil {
		return 0, fmt.Errorf("run subscription %s: %w", w.s.cfg.Name, err)
	}
	return safe, nil
}

// catchUp handles every event up to the newest final position, batch by batch, repeating until
// no further position is final.
func (w *worker) catchUp(ctx context.Context) error {
	for ctx.Err() == nil {
		safe, err := w.safePosition(ctx)
		if err != nil {
			return err
		}
		if w.replay {
			if err := w.replayDeadLetters(ctx); err != nil {
				return err
			}
			w.replay = false
		}
		if safe <= w.cp {
			return nil
		}
		for w.cp < safe && ctx.Err() == nil {
			if err := w.batch(ctx, safe); err != nil {
				return err
			}
		}
	}
	return nil
}

// batch handles the next batch of positions in (cp, safe] in one transaction with the
// checkpoint. A short batch means the range is exhausted, so the checkpoint moves to safe
// (past holes and other categories' events).
func (w *worker) batch(ctx context.Context, safe int64) error {
	s := w.s
	batch := make([]RecordedEvent, 0, s.cfg.BatchSize)
	for e, err := range s.store.readLogPage(ctx, w.conn, w.cp, safe, s.cfg.Category, s.cfg.BatchSize) {
		if err != nil {
			return fmt.Errorf("run subscription %s: %w", s.cfg.Name, err)
		}
		batch = append(batch, e)
	}
	next := safe
	if len(batch) == s.cfg.BatchSize {
		next = batch[len(batch)-1].GlobalPosition
	}
	return w.handle(ctx, batch, next)
}

// wait blocks until a notification, the poll interval, or ctx's end.
func (w *worker) wait(ctx context.Context) error {
	_, err := waitNotification(ctx, w.conn, w.guard.wait(w.s.cfg.PollInterval), !w.s.cfg.DisableListen)
	if err != nil {
		return fmt.Errorf("run subscription %s: %w", w.s.cfg.Name, err)
	}
	return nil
}

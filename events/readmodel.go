package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/tracing"
)

// Read-model wait defaults (keiro's defaultStrongWaitOptions).
const (
	// DefaultWaitTimeout is how long a consistency wait lasts before it fails with
	// *ReadModelWaitTimeoutError.
	DefaultWaitTimeout = 5 * time.Second
	// DefaultWaitPoll is how often a consistency wait reads the subscription's progress when no
	// checkpoint commit in this process wakes it first.
	DefaultWaitPoll = 10 * time.Millisecond
	// maxQueryAttempts bounds the re-runs of a query whose registry row changed while it ran.
	maxQueryAttempts = 3
)

// ReadModelStatus is a read model's lifecycle status in the registry.
type ReadModelStatus string

// The statuses keiro-go writes. A registry row may hold any other text (written by hand or by
// a newer version): it is read back as is, is not live, and Known reports false.
const (
	// StatusLive: current and queryable; asynchronous appliers write.
	StatusLive ReadModelStatus = "live"
	// StatusRebuilding: being repopulated; queries are refused and live appliers are fenced.
	StatusRebuilding ReadModelStatus = "rebuilding"
	// StatusPaused: temporarily not served.
	StatusPaused ReadModelStatus = "paused"
	// StatusAbandoned: a rebuild given up on; queries stay refused until a new rebuild.
	StatusAbandoned ReadModelStatus = "abandoned"
)

// Known reports whether s is one of the statuses above.
func (s ReadModelStatus) Known() bool {
	switch s {
	case StatusLive, StatusRebuilding, StatusPaused, StatusAbandoned:
		return true
	}
	return false
}

// ReadModel describes a queryable projection: its registry identity, where its data lives
// and which subscription feeds it. It is a plain value; declare it once per model.
type ReadModel struct {
	// Name identifies the model in the registry (keiro_read_models). Required.
	Name string
	// Schema is the PostgreSQL schema of the model's data table, the application's own
	// (separate from the store's schema, which holds only the registry). Defaults to "" (the
	// table is addressed unqualified, through search_path).
	Schema string
	// Table is the model's data table, emptied by StartRebuild. Required for rebuilds.
	Table string
	// Subscription is the name of the subscription (plain or sharded) that applies the log to
	// the model; consistency waits read its progress, StartRebuild rewinds it. Defaults to "":
	// an inline-only model, whose rows commit with the events, so every wait is satisfied at once.
	Subscription string
	// Category is the category the subscription follows. Strong waits for that category's
	// newest event (keiro's CategoryHead scope) instead of the whole log's. Defaults to "" (the
	// whole log).
	Category string
	// Version and ShapeHash are the model's schema identity: a query whose definition differs
	// from the registered row is refused with *ReadModelStaleSchemaError.
	Version   int64
	ShapeHash string
	// Consistency is used by Query when it is given nil. Defaults to nil (Eventual).
	Consistency Consistency
}

// QualifiedTable returns the model's table as a quoted SQL identifier, "schema"."table" (or
// "table" without a Schema), for the application's projection and query SQL.
func (m ReadModel) QualifiedTable() string {
	if m.Schema == "" {
		return pgx.Identifier{m.Table}.Sanitize()
	}
	return pgx.Identifier{m.Schema, m.Table}.Sanitize()
}

// EnsureProjectionSchema creates the PostgreSQL schema name (quoted) if it does not exist: an
// opt-in helper for development, tests and examples, where the application rather than a
// migration tool owns its read models' schema. Nothing calls it implicitly.
func EnsureProjectionSchema(ctx context.Context, q keiro.DB, name string) error {
	if name == "" {
		return errors.New("ensure projection schema: name is empty")
	}
	if _, err := q.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("ensure projection schema %s: %w", name, err)
	}
	return nil
}

// ReadModelInfo is a model's registry row.
type ReadModelInfo struct {
	// Name is the model's name.
	Name string
	// Version and ShapeHash are the registered schema identity.
	Version   int64
	ShapeHash string
	// Status is the lifecycle status, as stored.
	Status ReadModelStatus
	// LastBuiltAt is when the model last went live (registration or promotion), if ever.
	LastBuiltAt *time.Time
	// UpdatedAt is the row's last write.
	UpdatedAt time.Time

	xmin string // the row version, to notice a change while a query runs
}

// Consistency says how fresh a query's read must be. The implementations are Eventual,
// Strong, CategoryHead and PositionWait.
type Consistency interface {
	// plan returns the position to wait for (0: no wait), the category whose events count, and
	// the wait's timeout and poll interval.
	plan(ctx context.Context, r *ReadModels, m ReadModel) (waitPlan, error)
}

type waitPlan struct {
	target        int64
	category      string
	timeout, poll time.Duration
}

func (p waitPlan) withDefaults(timeout, poll time.Duration) waitPlan {
	p.timeout, p.poll = timeout, poll
	if p.timeout <= 0 {
		p.timeout = DefaultWaitTimeout
	}
	if p.poll <= 0 {
		p.poll = DefaultWaitPoll
	}
	return p
}

// Eventual queries at once: the model is as fresh as its subscription happens to be.
type Eventual struct{}

func (Eventual) plan(context.Context, *ReadModels, ReadModel) (waitPlan, error) {
	return waitPlan{}, nil
}

// Strong waits until the model's subscription has applied everything committed before the
// query started: the head of the log (or of ReadModel.Category) is read at the query's start,
// and the query runs once the subscription's progress reaches it. An empty log, or a
// subscription already at the head, does not wait.
type Strong struct {
	// Timeout bounds the wait. Defaults to DefaultWaitTimeout.
	Timeout time.Duration
	// Poll is how often progress is read without a wake-up. Defaults to DefaultWaitPoll.
	Poll time.Duration
}

func (c Strong) plan(ctx context.Context, r *ReadModels, m ReadModel) (waitPlan, error) {
	h, err := r.head(ctx, m.Category)
	if err != nil {
		return waitPlan{}, err
	}
	return waitPlan{target: h, category: m.Category}.withDefaults(c.Timeout, c.Poll), nil
}

// CategoryHead is Strong scoped to one category: it waits for the newest event of Category
// committed before the query started, so events of other categories, which the model's
// subscription may never see, do not hold the query back.
type CategoryHead struct {
	// Category is the category whose head is waited for. Required.
	Category string
	// Timeout bounds the wait. Defaults to DefaultWaitTimeout.
	Timeout time.Duration
	// Poll is how often progress is read without a wake-up. Defaults to DefaultWaitPoll.
	Poll time.Duration
}

func (c CategoryHead) plan(ctx context.Context, r *ReadModels, _ ReadModel) (waitPlan, error) {
	if c.Category == "" {
		return waitPlan{}, errors.New("CategoryHead: Category is required")
	}
	h, err := r.head(ctx, c.Category)
	if err != nil {
		return waitPlan{}, err
	}
	return waitPlan{target: h, category: c.Category}.withDefaults(c.Timeout, c.Poll), nil
}

// PositionWait waits until the model's subscription has applied the log up to Target,
// typically Result.GlobalPosition of the command the caller just ran (read your writes).
type PositionWait struct {
	// Target is the global position to reach. 0 means no wait.
	Target int64
	// Timeout bounds the wait. Defaults to DefaultWaitTimeout.
	Timeout time.Duration
	// Poll is how often progress is read without a wake-up. Defaults to DefaultWaitPoll.
	Poll time.Duration
}

func (c PositionWait) plan(_ context.Context, _ *ReadModels, m ReadModel) (waitPlan, error) {
	return waitPlan{target: c.Target, category: m.Category}.withDefaults(c.Timeout, c.Poll), nil
}

// ReadModelsConfig configures ReadModels.
type ReadModelsConfig struct {
	// MeterProvider provides the meter for keiro.projection.wait.timeouts. Defaults to
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Logger receives rebuild lifecycle messages. Defaults to slog.Default().
	Logger *slog.Logger
}

// ReadModels is the read-model registry of a Store's schema and the entry point of queries,
// asynchronous projection applications and rebuilds. It is safe for concurrent use.
type ReadModels struct {
	store    *Store
	pool     *pgxpool.Pool
	cfg      ReadModelsConfig
	timeouts metric.Int64Counter
}

// NewReadModels returns the registry of store's schema, queried through pool.
func NewReadModels(store *Store, pool *pgxpool.Pool, cfg ReadModelsConfig) (*ReadModels, error) {
	var errs []error
	if store == nil {
		errs = append(errs, errors.New("store is nil"))
	}
	if pool == nil {
		errs = append(errs, errors.New("pool is nil"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new read models: %w", err)
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c, err := cfg.MeterProvider.Meter(instrumentationScope).Int64Counter("keiro.projection.wait.timeouts",
		metric.WithDescription("Read-model consistency waits that timed out before the subscription reached the target."),
		metric.WithUnit("{wait}"))
	if err != nil {
		return nil, fmt.Errorf("new read models: create keiro.projection.wait.timeouts: %w", err)
	}
	return &ReadModels{store: store, pool: pool, cfg: cfg, timeouts: c}, nil
}

// checkName refuses a name that PostgreSQL cannot store as text, with what is wrong with it:
// empty, not UTF-8, or holding a NUL byte. field names the name in the error.
func checkName(field, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%s is required", field)
	case !utf8.ValidString(name):
		return fmt.Errorf("%s %q is not valid UTF-8", field, name)
	case strings.ContainsRune(name, 0):
		return fmt.Errorf("%s %q contains a NUL byte", field, name)
	}
	return nil
}

// Register registers m at startup: it inserts a live row with m's version and shape hash if
// the model has none, and otherwise returns the existing row unchanged (never overwritten, so
// a changed definition is detected by the next query as a stale schema). Concurrent
// registrations of one model all succeed. Queries never register.
func (r *ReadModels) Register(ctx context.Context, m ReadModel) (ReadModelInfo, error) {
	if err := checkName("Name", m.Name); err != nil {
		return ReadModelInfo{}, fmt.Errorf("register read model: %w", err)
	}
	for {
		info, err := scanReadModel(r.pool.QueryRow(ctx, r.store.q.rmRegister, m.Name, m.Version, m.ShapeHash))
		if err == nil {
			return info, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return ReadModelInfo{}, fmt.Errorf("register read model %s: %w", m.Name, err)
		}
		// The row exists; a concurrent registration may have committed after the statement's
		// snapshot, so read it with a new one.
		info, ok, err := r.Lookup(ctx, m.Name)
		if err != nil {
			return ReadModelInfo{}, fmt.Errorf("register read model %s: %w", m.Name, err)
		}
		if ok {
			return info, nil
		}
		if err := ctx.Err(); err != nil {
			return ReadModelInfo{}, fmt.Errorf("register read model %s: %w", m.Name, err)
		}
	}
}

// Lookup reads a model's registry row; ok is false if it has none. It writes nothing.
func (r *ReadModels) Lookup(ctx context.Context, name string) (info ReadModelInfo, ok bool, err error) {
	return r.lookup(ctx, r.pool, name)
}

func (r *ReadModels) lookup(ctx context.Context, q keiro.DB, name string) (ReadModelInfo, bool, error) {
	if err := checkName("read model name", name); err != nil {
		return ReadModelInfo{}, false, fmt.Errorf("look up read model: %w", err)
	}
	info, err := scanReadModel(q.QueryRow(ctx, r.store.q.rmLookup, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return ReadModelInfo{}, false, nil
	}
	if err != nil {
		return ReadModelInfo{}, false, fmt.Errorf("look up read model %s: %w", name, err)
	}
	return info, true, nil
}

func scanReadModel(row pgx.Row) (ReadModelInfo, error) {
	var (
		info   ReadModelInfo
		status string
	)
	if err := row.Scan(&info.Name, &info.Version, &info.ShapeHash, &status, &info.LastBuiltAt, &info.UpdatedAt, &info.xmin); err != nil {
		return ReadModelInfo{}, err
	}
	info.Status = ReadModelStatus(status)
	return info, nil
}

// check refuses a query of m by info in keiro's order: unregistered, stale schema, not live.
func check(m ReadModel, info ReadModelInfo, ok bool) error {
	switch {
	case !ok:
		return &ReadModelUnregisteredError{Name: m.Name}
	case info.Version != m.Version || info.ShapeHash != m.ShapeHash:
		return &ReadModelStaleSchemaError{Name: m.Name, ExpectedVersion: m.Version, FoundVersion: info.Version,
			ExpectedShapeHash: m.ShapeHash, FoundShapeHash: info.ShapeHash}
	case info.Status != StatusLive:
		return &ReadModelNotLiveError{Name: m.Name, Status: info.Status}
	}
	return nil
}

// Query runs fn in a read-only transaction once m may be read with consistency c (nil: m's
// Consistency, else Eventual). It first checks m against the registry, in this order: no row
// (*ReadModelUnregisteredError), another version or shape hash (*ReadModelStaleSchemaError),
// a status other than live (*ReadModelNotLiveError); then it waits as c says
// (*ReadModelWaitTimeoutError when the wait times out); then it runs fn and reads the registry
// row again in fn's transaction. If the row changed since it was checked (a rebuild started),
// fn's result is not trusted: the checks run again on the new row, and fn with them. A rebuild
// empties the table in the transaction that changes the row, and a reader of the table holds
// off that TRUNCATE until it ends, so fn never returns what it read from an emptied table as a
// live model's. Query never writes the registry row.
func (r *ReadModels) Query(ctx context.Context, m ReadModel, c Consistency, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if fn == nil {
		return fmt.Errorf("query read model %s: fn is nil", m.Name)
	}
	info, ok, err := r.Lookup(ctx, m.Name)
	if err != nil {
		return fmt.Errorf("query read model %s: %w", m.Name, err)
	}
	if err := check(m, info, ok); err != nil {
		return err
	}
	if err := r.Wait(ctx, m, c); err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		var after ReadModelInfo
		var found bool
		err := pgx.BeginTxFunc(ctx, r.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			if err := fn(ctx, tx); err != nil {
				return err
			}
			var err error
			after, found, err = r.lookup(ctx, tx, m.Name)
			return err
		})
		if err != nil {
			return err
		}
		if found && after.xmin == info.xmin {
			return nil // the row the checks passed on was there, unchanged, after fn ran
		}
		// The row changed since it was checked (a rebuild started, and perhaps ended): check
		// the new row, and run fn again if it passes.
		if err := check(m, after, found); err != nil {
			return err
		}
		if attempt == maxQueryAttempts {
			return fmt.Errorf("query read model %s: its registry row changed during each of %d attempts", m.Name, attempt)
		}
		info = after
	}
}

// Wait blocks until m may be read with consistency c (nil: m's Consistency, else Eventual),
// without checking the registry. It returns a *ReadModelWaitTimeoutError (and counts
// keiro.projection.wait.timeouts) when the wait times out, or ctx's error.
//
// The wait reads the subscription's progress (Progress) when it starts, whenever a subscription
// of the same Store commits a checkpoint in this process, and every poll interval, which is how
// it sees progress made in other processes.
func (r *ReadModels) Wait(ctx context.Context, m ReadModel, c Consistency) error {
	if c == nil {
		c = m.Consistency
	}
	if c == nil || m.Subscription == "" {
		return nil
	}
	p, err := c.plan(ctx, r, m)
	if err != nil {
		return fmt.Errorf("wait for read model %s: %w", m.Name, err)
	}
	if p.target <= 0 {
		return nil
	}
	deadline := time.Now().Add(p.timeout)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		wake := r.store.progressSignal()
		observed, done, err := r.progress(ctx, m.Subscription, p.target, p.category)
		if err != nil {
			return fmt.Errorf("wait for read model %s: %w", m.Name, err)
		}
		if done {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			r.timeouts.Add(ctx, 1, metric.WithAttributes(tracing.SubscriptionNameKey.String(m.Subscription)))
			return &ReadModelWaitTimeoutError{Name: m.Name, Target: p.target, LastObserved: observed}
		}
		d := min(p.poll, left)
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-wake:
			timer.Stop() // Go 1.23+: no stale fire is delivered after Stop, so Reset needs no drain
		case <-timer.C:
		case <-ctx.Done():
			return fmt.Errorf("wait for read model %s: %w", m.Name, ctx.Err())
		}
	}
}

// Progress returns how far subscription has applied the log: its checkpoint, or for a sharded
// subscription the minimum of its buckets' checkpoints; 0 before it has one.
func (r *ReadModels) Progress(ctx context.Context, subscription string) (int64, error) {
	p, _, err := r.progress(ctx, subscription, 0, "")
	return p, err
}

// progress returns the subscription's progress and whether it has applied everything up to
// target (of category, "" for all): its progress reaches target or, sharded, no bucket has an
// event of its own left at or below target.
func (r *ReadModels) progress(ctx context.Context, subscription string, target int64, category string) (int64, bool, error) {
	var (
		p       int64
		sharded bool
		behind  int64
	)
	if err := r.pool.QueryRow(ctx, r.store.q.subProgress, subscription, target, category).Scan(&p, &sharded, &behind); err != nil {
		return 0, false, fmt.Errorf("read progress of subscription %s: %w", subscription, err)
	}
	return p, p >= target || (sharded && behind == 0), nil
}

// head returns the newest global position of the log, or of category.
func (r *ReadModels) head(ctx context.Context, category string) (int64, error) {
	var h int64
	var err error
	if category == "" {
		err = r.pool.QueryRow(ctx, r.store.q.head).Scan(&h)
	} else {
		err = r.pool.QueryRow(ctx, r.store.q.categoryHead, category).Scan(&h)
	}
	if err != nil {
		return 0, fmt.Errorf("read the head of the log: %w", err)
	}
	return h, nil
}

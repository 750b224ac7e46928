package workflow

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/internal/schemaname"
	"github.com/keiro-go/keiro/workflow/internal/wfsql"
)

// Engine defaults.
const (
	// DefaultMaxAttempts is how many failed runs in a row an instance gets before it fails.
	DefaultMaxAttempts = 5
	// DefaultLeaseTTL is how long a run holds its instance's lease; a crashed run's instance is
	// taken over once it expires. Every journaled step extends it.
	DefaultLeaseTTL = time.Minute
)

// Config configures an Engine.
type Config struct {
	// Schema is the PostgreSQL schema holding keiro's tables (migrations 016_workflows.sql and
	// 018_workflow_snapshots.sql, and the timers of 010_timers.sql). Defaults to "keiro".
	Schema string
	// MaxAttempts is how many failed runs in a row (a returned error or a panic; progress
	// resets the count) an instance gets before it ends failed. Defaults to DefaultMaxAttempts.
	MaxAttempts int
	// Backoff spaces the runs of a failing instance: the n-th failure in a row waits
	// min(Max, Initial·Multiplier^(n−1)) with jitter. Defaults to {1s, 5m, 2}.
	Backoff keiro.Backoff
	// LeaseTTL is how long a run holds its instance. Defaults to DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Snapshot decides when runs write advisory snapshots of their instances' journals
	// (SnapshotEvery, SnapshotOnTerminal); a run then hydrates from the snapshot and reads only
	// the steps recorded after it. A snapshot is written after the commit that it follows, and
	// its failures never fail that commit: they are counted (keiro.snapshot.write.failures)
	// and logged. A snapshot of another codec or shape, or one that does not decode, is
	// ignored (keiro.snapshot.read.misses, keiro.snapshot.decode.failures) and the journal is
	// read in full. Defaults to SnapshotNever.
	Snapshot SnapshotPolicy
	// DisableNotify stops starts and wake sources from sending a NOTIFY; workers then find
	// runnable instances by polling only. Defaults to false (notify).
	DisableNotify bool
	// Now is the engine's clock (wake times, leases, sleeps). Defaults to time.Now.
	Now func() time.Time
	// TracerProvider provides the run and step spans. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider provides the keiro.workflow.* instruments. Defaults to
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Logger receives failed runs. Defaults to slog.Default().
	Logger *slog.Logger
}

// Engine runs durable workflows over one schema: it holds the registered workflow functions,
// starts instances in callers' transactions, runs them, and resolves what they await. An
// Engine is safe for concurrent use.
type Engine struct {
	db      keiro.DB
	cfg     Config
	q       wfsql.Queries
	timers  *events.Store
	channel string
	tracer  trace.Tracer
	tel     *telemetry

	mu   sync.RWMutex
	defs map[string]*definition
}

type definition struct {
	name    string
	patches []string
	run     func(c *Context, input json.RawMessage) (json.RawMessage, error)
}

// New returns an Engine over db (a pool: runs open their own transactions), reporting every
// configuration problem at once.
func New(db keiro.DB, cfg Config) (*Engine, error) {
	var errs []error
	if db == nil {
		errs = append(errs, errors.New("db is nil"))
	}
	if cfg.Schema == "" {
		cfg.Schema = schemaname.Default
	}
	if err := schemaname.Validate(cfg.Schema); err != nil {
		errs = append(errs, fmt.Errorf("Schema: %w", err))
	}
	if cfg.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("MaxAttempts: %d is negative", cfg.MaxAttempts))
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	cfg.Backoff = cfg.Backoff.WithDefaults(keiro.Backoff{Initial: time.Second, Max: 5 * time.Minute, Multiplier: keiro.DefaultMultiplier})
	if err := cfg.Backoff.Validate("Backoff"); err != nil {
		errs = append(errs, err)
	}
	if err := cfg.Snapshot.validate(); err != nil {
		errs = append(errs, fmt.Errorf("Snapshot: %w", err))
	}
	if cfg.LeaseTTL < 0 {
		errs = append(errs, fmt.Errorf("LeaseTTL: %s is negative", cfg.LeaseTTL))
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new workflow engine: %w", err)
	}
	timers, err := events.NewStore(events.StoreConfig{Schema: cfg.Schema, TracerProvider: cfg.TracerProvider, MeterProvider: cfg.MeterProvider})
	if err != nil {
		return nil, fmt.Errorf("new workflow engine: %w", err)
	}
	tel, err := newTelemetry(cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("new workflow engine: %w", err)
	}
	return &Engine{
		db: db, cfg: cfg, q: wfsql.New(cfg.Schema), timers: timers, channel: notifyChannel(cfg.Schema),
		tracer: cfg.TracerProvider.Tracer(instrumentationScope), tel: tel, defs: map[string]*definition{},
	}, nil
}

// notifyChannel is "<schema>_keiro_workflows", or a hashed form beyond 63 bytes.
func notifyChannel(schema string) string {
	ch := schema + "_keiro_workflows"
	if len(ch) <= 63 {
		return ch
	}
	sum := sha256.Sum256([]byte(schema))
	return "keiro_workflows_" + hex.EncodeToString(sum[:16])
}

// NotifyChannel returns the LISTEN/NOTIFY channel starts and wake sources notify at commit.
func (e *Engine) NotifyChannel() string { return e.channel }

// Workflow is a registered workflow function with its input and result types: the typed handle
// to start instances and read their results.
type Workflow[In, Out any] struct {
	e    *Engine
	name string
}

// Name returns the workflow's registered name.
func (w *Workflow[In, Out]) Name() string { return w.name }

// Register registers fn under name (stable across deploys: it is part of every stored
// instance). patches are the patch ids active for generations that start from now on (see
// Patched). Registering a name twice is an error.
func Register[In, Out any](e *Engine, name string, fn func(c *Context, input In) (Out, error), patches ...string) (*Workflow[In, Out], error) {
	if err := validateName("workflow name", name); err != nil {
		return nil, fmt.Errorf("register workflow: %w", err)
	}
	if fn == nil {
		return nil, fmt.Errorf("register workflow %s: fn is nil", name)
	}
	def := &definition{name: name, patches: append([]string(nil), patches...), run: func(c *Context, raw json.RawMessage) (json.RawMessage, error) {
		var in In
		if err := json.Unmarshal(raw, &in); err != nil {
			return nil, fmt.Errorf("decode input of workflow %s: %w", name, err)
		}
		out, err := fn(c, in)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(out)
		if err != nil {
			return nil, fmt.Errorf("encode result of workflow %s: %w", name, err)
		}
		return b, nil
	}}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.defs[name]; ok {
		return nil, fmt.Errorf("register workflow %s: already registered", name)
	}
	e.defs[name] = def
	return &Workflow[In, Out]{e: e, name: name}, nil
}

func (e *Engine) definition(name string) (*definition, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	d, ok := e.defs[name]
	return d, ok
}

func (e *Engine) names() []string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	out := make([]string, 0, len(e.defs))
	for n := range e.defs {
		out = append(out, n)
	}
	return out
}

// validateName refuses empty names and names with control characters.
func validateName(what, s string) error {
	if strings.TrimSpace(s) == "" {
		return fmt.Errorf("%s is empty", what)
	}
	if strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fmt.Errorf("%s %q contains a control character", what, s)
	}
	return nil
}

// StartTx starts instance id of the workflow with input in tx: the instance becomes visible,
// and runnable by any worker, only when tx commits, and vanishes if it rolls back. Starting
// an existing id (whatever its state) is a no-op that reports false.
func (w *Workflow[In, Out]) StartTx(ctx context.Context, tx keiro.DB, id string, input In) (bool, error) {
	return w.e.startTx(ctx, tx, w.name, id, input, "", "")
}

func (e *Engine) startTx(ctx context.Context, tx keiro.DB, name, id string, input any, parentName, parentID string) (bool, error) {
	if err := validateName("workflow id", id); err != nil {
		return false, fmt.Errorf("start workflow %s: %w", name, err)
	}
	b, err := encodeJSON(input)
	if err != nil {
		return false, fmt.Errorf("start workflow %s/%s: input: %w", name, id, err)
	}
	var pn, pi *string
	if parentID != "" {
		pn, pi = &parentName, &parentID
	}
	var got string
	err = tx.QueryRow(ctx, e.q.Start, name, id, b, pn, pi, e.cfg.Now()).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("start workflow %s/%s: %w", name, id, err)
	}
	e.tel.started.Add(ctx, 1)
	return true, e.notify(ctx, tx)
}

func (e *Engine) notify(ctx context.Context, tx keiro.DB) error {
	if e.cfg.DisableNotify {
		return nil
	}
	if _, err := tx.Exec(ctx, e.q.Notify, e.channel); err != nil {
		return fmt.Errorf("notify workflow workers: %w", err)
	}
	return nil
}

// Run runs instance id now in this process (keiro's runWorkflow), whatever its wake time,
// unless another live owner holds it; see Engine.RunInstance.
func (w *Workflow[In, Out]) Run(ctx context.Context, id string) (Outcome, error) {
	return w.e.RunInstance(ctx, w.name, id)
}

// Result returns a completed instance's result and the instance; ok is false while the
// instance has not completed (see Instance.Status for why).
func (w *Workflow[In, Out]) Result(ctx context.Context, q keiro.DB, id string) (out Out, inst Instance, ok bool, err error) {
	inst, err = w.e.Instance(ctx, q, w.name, id)
	if err != nil || inst.Status != StatusCompleted {
		return out, inst, false, err
	}
	if err := json.Unmarshal(inst.Result, &out); err != nil {
		return out, inst, false, fmt.Errorf("decode result of workflow %s/%s: %w", w.name, id, err)
	}
	return out, inst, true, nil
}

// Status is an instance's state.
type Status string

// Instance statuses (see docs/workflows.md for the state machine).
const (
	// StatusPending is an instance started and never run.
	StatusPending Status = "pending"
	// StatusRunning is an instance a run holds (or held and crashed: its lease expires), or one
	// waiting for its next attempt after a failed run.
	StatusRunning Status = "running"
	// StatusSuspended is an instance parked on an await, a sleep, an awakeable or a child.
	StatusSuspended Status = "suspended"
	// StatusCompleted is an instance whose function returned its result. Terminal.
	StatusCompleted Status = "completed"
	// StatusFailed is an instance whose attempts ran out. Terminal.
	StatusFailed Status = "failed"
	// StatusCancelled is an instance cancelled by CancelTx (or with its parent). Terminal.
	StatusCancelled Status = "cancelled"
)

// Terminal reports whether s is completed, failed or cancelled.
func (s Status) Terminal() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCancelled
}

// Instance is a stored workflow instance (a row of keiro_workflows).
type Instance struct {
	// Name and ID identify the instance.
	Name, ID string
	// Generation is bumped by each ContinueAsNew; the journal is per generation.
	Generation int
	// Status is the instance's state.
	Status Status
	// Input is the current generation's input; Result the completed instance's result.
	Input, Result json.RawMessage
	// LastError is the last failed run's error.
	LastError string
	// Attempts counts the runs since the last progress.
	Attempts int
	// WakeAfter is when the instance is next runnable (nil: when a wake source resolves what
	// it awaits).
	WakeAfter *time.Time
	// LeaseOwner and LeaseUntil are the run holding the instance, if any.
	LeaseOwner *string
	LeaseUntil *time.Time
	// ParentName and ParentID are the parent of a child instance.
	ParentName, ParentID *string
	// CreatedAt, UpdatedAt and CompletedAt are when the instance started, last changed and
	// ended.
	CreatedAt, UpdatedAt time.Time
	CompletedAt          *time.Time
}

// Instance reads instance name/id, or returns ErrNotFound.
func (e *Engine) Instance(ctx context.Context, q keiro.DB, name, id string) (Instance, error) {
	var in Instance
	err := q.QueryRow(ctx, e.q.Instance, name, id).Scan(&in.Name, &in.ID, &in.Generation, &in.Status, &in.Input, &in.Result,
		&in.LastError, &in.Attempts, &in.WakeAfter, &in.LeaseOwner, &in.LeaseUntil, &in.ParentName, &in.ParentID,
		&in.CreatedAt, &in.UpdatedAt, &in.CompletedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Instance{}, fmt.Errorf("read workflow %s/%s: %w", name, id, ErrNotFound)
	}
	if err != nil {
		return Instance{}, fmt.Errorf("read workflow %s/%s: %w", name, id, err)
	}
	return in, nil
}

// JournalEntry is one recorded step.
type JournalEntry struct {
	// Generation is the generation the step belongs to.
	Generation int
	// Step is the step's name (reserved prefixes: sleep:, awk:, child:, patch:).
	Step string
	// Result is the step's JSON result.
	Result json.RawMessage
	// RecordedAt is when it was recorded.
	RecordedAt time.Time
	// Version is its journal version: the instance's steps take increasing versions in
	// commit order (a version taken by a resolution that found its step recorded is skipped).
	Version int64
}

// Journal lists instance name/id's recorded steps, every retained generation, in journal
// order.
func (e *Engine) Journal(ctx context.Context, q keiro.DB, name, id string) ([]JournalEntry, error) {
	rows, err := q.Query(ctx, e.q.StepsOf, name, id)
	if err != nil {
		return nil, fmt.Errorf("read journal of workflow %s/%s: %w", name, id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (JournalEntry, error) {
		var j JournalEntry
		err := r.Scan(&j.Generation, &j.Step, &j.Result, &j.RecordedAt, &j.Version)
		return j, err
	})
	if err != nil {
		return nil, fmt.Errorf("read journal of workflow %s/%s: %w", name, id, err)
	}
	return out, nil
}

package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/backoff"
	"github.com/keiro-go/keiro/tracing"
)

// Runner defaults.
const (
	// DefaultRetryLimit is the number of retries after a version conflict (4 attempts in all).
	DefaultRetryLimit = 3
	// DefaultRetryBackoff is the first wait after a version conflict (RunnerConfig.Backoff's
	// Initial); it doubles per retry.
	DefaultRetryBackoff = 5 * time.Millisecond
	// DefaultMaxRetryBackoff caps the wait between attempts (RunnerConfig.Backoff's Max).
	DefaultMaxRetryBackoff = 100 * time.Millisecond
	// DefaultSnapshotVersion is the state version written with snapshots.
	DefaultSnapshotVersion = 1
)

// Decider is an aggregate: the state a stream's events fold into, and the decision a command
// takes on that state. Decide and Evolve must be pure (no I/O, no clock reads through side
// channels the runner cannot replay) and must not modify their state argument in place: the
// runner reuses Initial for every hydration and may re-run Decide after a conflict.
type Decider[S, C, E any] struct {
	// Initial is the state of a stream with no events.
	Initial S
	// Decide returns the events cmd produces in state, or an error that rejects cmd. No events
	// means a no-op: nothing is appended.
	Decide func(state S, cmd C) ([]E, error)
	// Evolve returns the state after event.
	Evolve func(state S, event E) S
}

// Hook runs inside the append transaction, after the events are written and before commit:
// inline projections and outbox.Store.EnqueueTx belong here. An error rolls the whole command
// back (nothing appended) and is returned by Run.
type Hook func(ctx context.Context, tx pgx.Tx, res Result) error

// Result reports a command run.
type Result struct {
	// StreamVersion is the stream's version after the command (unchanged for a no-op).
	StreamVersion int64
	// GlobalPosition is the global position of the last appended event; 0 when nothing was
	// appended (positions start at 1).
	GlobalPosition int64
	// Events are the appended events, in order (empty for a no-op).
	Events []RecordedEvent
	// Attempts is the number of attempts the command took (1 without conflicts).
	Attempts int
	// Duplicate reports that the command's event ids (RunOptions.EventIDs) were already stored
	// with the same content: nothing was appended and hooks did not run again.
	Duplicate bool
}

// RunnerConfig configures a Runner.
type RunnerConfig[S any] struct {
	// RetryLimit is the number of retries after a version conflict; negative disables retries.
	// Defaults to DefaultRetryLimit.
	RetryLimit int
	// Backoff spaces the retries after a version conflict: retry n waits
	// min(Max, Initial·Multiplier^(n−1)) with equal jitter (drawn from its upper half). A
	// negative Backoff.Initial retries at once. Defaults to {DefaultRetryBackoff,
	// DefaultMaxRetryBackoff, 2}.
	Backoff keiro.Backoff
	// Hooks run, in order, inside every append transaction, before RunOptions.Hook. Defaults to
	// none.
	Hooks []Hook
	// Snapshot decides after each committed append whether to write an advisory snapshot of
	// the state (SnapshotEvery, SnapshotOnTerminal, or any SnapshotPolicy); hydration then
	// replays only the tail. Snapshot failures never fail a committed command: they are counted
	// (keiro.snapshot.encode.failures, keiro.snapshot.write.failures) and logged. Before a
	// snapshot is written the appended events are replayed through the codec; a batch that does
	// not replay to the decided state is counted (keiro.snapshot.apply.divergence) and not
	// snapshotted. Defaults to SnapshotEvery(n) when SnapshotEvery is n > 0, else nil (no
	// snapshots).
	Snapshot SnapshotPolicy[S]
	// SnapshotEvery writes an advisory snapshot of the state after commit whenever an append
	// crosses a multiple of SnapshotEvery versions; hydration then replays only the tail. Zero
	// disables snapshots (unless Snapshot is set). Snapshot failures never fail a committed command: they are counted
	// (keiro.snapshot.write.failures) and logged. Defaults to 0.
	SnapshotEvery int64
	// SnapshotVersion identifies the state's encoding: snapshots of another version are ignored
	// (and replaced). Bump it when S changes shape. Defaults to DefaultSnapshotVersion.
	SnapshotVersion int32
	// EncodeSnapshot encodes the state for a snapshot. It must be deterministic (one state, one
	// encoding): the replay check compares encodings. Defaults to json.Marshal.
	EncodeSnapshot func(S) ([]byte, error)
	// DecodeSnapshot decodes a snapshot. Defaults to json.Unmarshal into a zero S.
	DecodeSnapshot func([]byte) (S, error)
	// TracerProvider provides the tracer for command spans. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Logger receives snapshot failures. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c *RunnerConfig[S]) applyDefaults() {
	if c.RetryLimit == 0 {
		c.RetryLimit = DefaultRetryLimit
	}
	c.Backoff = c.Backoff.WithDefaults(keiro.Backoff{Initial: DefaultRetryBackoff, Max: DefaultMaxRetryBackoff, Multiplier: keiro.DefaultMultiplier})
	if c.Snapshot == nil && c.SnapshotEvery > 0 {
		c.Snapshot = SnapshotEvery[S](c.SnapshotEvery)
	}
	if c.SnapshotVersion == 0 {
		c.SnapshotVersion = DefaultSnapshotVersion
	}
	if c.EncodeSnapshot == nil {
		c.EncodeSnapshot = func(s S) ([]byte, error) { return json.Marshal(s) }
	}
	if c.DecodeSnapshot == nil {
		c.DecodeSnapshot = func(b []byte) (S, error) {
			var s S
			err := json.Unmarshal(b, &s)
			return s, err
		}
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func (c *RunnerConfig[S]) validate() error {
	var errs []error
	if err := c.Backoff.Validate("Backoff"); err != nil {
		errs = append(errs, err)
	}
	if c.SnapshotEvery < 0 {
		errs = append(errs, fmt.Errorf("SnapshotEvery: %d is negative", c.SnapshotEvery))
	}
	for i, h := range c.Hooks {
		if h == nil {
			errs = append(errs, fmt.Errorf("Hooks[%d]: nil", i))
		}
	}
	return errors.Join(errs...)
}

// Runner runs commands against one kind of aggregate: hydrate, decide, append at the expected
// version, retry on conflict. A Runner is safe for concurrent use.
type Runner[S, C, E any] struct {
	store   *Store
	decider Decider[S, C, E]
	codec   Codec[E]
	cfg     RunnerConfig[S]
	tracer  trace.Tracer

	beforeAppend func(ctx context.Context, stream string, attempt int) // test seam
}

// NewRunner returns a Runner, reporting every configuration problem at once.
func NewRunner[S, C, E any](store *Store, d Decider[S, C, E], codec Codec[E], cfg RunnerConfig[S]) (*Runner[S, C, E], error) {
	var errs []error
	if cfg.Snapshot != nil && cfg.SnapshotEvery != 0 {
		errs = append(errs, errors.New("Snapshot and SnapshotEvery: set one (SnapshotEvery(n) is a Snapshot policy)"))
	}
	cfg.applyDefaults()
	errs = append(errs, cfg.validate())
	if store == nil {
		errs = append(errs, errors.New("store is nil"))
	}
	if d.Decide == nil || d.Evolve == nil {
		errs = append(errs, errors.New("Decider needs Decide and Evolve"))
	}
	if codec == nil {
		errs = append(errs, errors.New("codec is nil"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new command runner: %w", err)
	}
	return &Runner[S, C, E]{store: store, decider: d, codec: codec, cfg: cfg,
		tracer: cfg.TracerProvider.Tracer(instrumentationScope)}, nil
}

// RunOptions are per-command options.
type RunOptions struct {
	// EventIDs are assigned in order to the emitted events (surplus events get fresh UUIDv7s).
	// Deriving them from a command id makes a command idempotent: re-running it after an
	// unknown outcome reports Duplicate instead of appending twice.
	EventIDs []envelope.UUID
	// Metadata is stamped on every emitted event: correlation and causation ids, trace context
	// (default: the span in ctx) and Extra JSON.
	Metadata Metadata
	// Hook runs in the append transaction after RunnerConfig.Hooks.
	Hook Hook
	// AssumeNew skips the first hydration and decides on Decider.Initial, appending with
	// NoStream: one round trip less for commands that create their stream (PlaceOrder). If
	// the stream exists after all, the append conflicts and the runner hydrates and decides
	// again at once (no backoff, no retry consumed).
	AssumeNew bool
}

// Run executes cmd on stream. It hydrates the state (from a snapshot when one is usable), calls
// Decide, and appends the events at the hydrated version in one transaction on db together with
// the hooks. A version conflict rehydrates and decides again after a jittered backoff, up to
// RetryLimit times, then fails with a *RetryExhaustedError. A rejected command (Decide's error)
// is returned as a *RejectedError (errors.Is ErrCommandRejected) wrapping it, never retried. Zero events is a no-op that opens no transaction.
func (r *Runner[S, C, E]) Run(ctx context.Context, db keiro.DB, stream string, cmd C, opts ...RunOptions) (res Result, err error) {
	var o RunOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	ctx, span := r.tracer.Start(ctx, stream, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(tracing.StreamNameKey.String(stream)))
	var class string
	defer func() {
		span.SetAttributes(tracing.DBSystemNameKey.String("postgresql"), tracing.RetryAttemptKey.Int64(int64(res.Attempts)))
		if err != nil {
			span.SetAttributes(tracing.ErrorTypeKey.String(class))
			span.SetStatus(codes.Error, truncate(err.Error(), 256))
		} else {
			span.SetAttributes(tracing.EventsAppendedKey.Int64(int64(len(res.Events))))
		}
		span.End()
	}()
	if err := ValidateStreamName(stream); err != nil {
		class = "invalid_stream"
		return res, fmt.Errorf("run command: %w", err)
	}
	guessNew := o.AssumeNew
	// The first hydration is pipelined with a speculative creation of the stream (see
	// hydrateOrCreate) unless snapshots or caller-chosen ids make other round trips necessary.
	_, canBatch := db.(batcher)
	pipeline := canBatch && !o.AssumeNew && r.cfg.Snapshot == nil && len(o.EventIDs) == 0
	var open pgx.Tx // a transaction hydrateOrCreate left open for the append
	defer func() {
		if open != nil {
			_ = open.Rollback(context.WithoutCancel(ctx))
		}
	}()
	for attempt := 1; ; attempt++ {
		res.Attempts = attempt
		state, version := r.decider.Initial, int64(0)
		switch {
		case pipeline:
			pipeline = false
			var created *Result
			created, state, version, open, err = r.hydrateOrCreate(ctx, db, stream, cmd, o)
			if err != nil {
				class = "store_failed"
				if !errors.As(err, new(*hookError)) {
					class = "hydration_failed"
				} else {
					class = "hook_failed"
				}
				return res, err
			}
			if created != nil {
				created.Attempts = attempt
				return *created, nil
			}
		case !guessNew:
			if state, version, err = r.Load(ctx, db, stream); err != nil {
				class = "hydration_failed"
				return res, err
			}
		}
		res.StreamVersion = version
		emitted, err := r.decider.Decide(state, cmd)
		if guessNew && (err != nil || len(emitted) == 0) {
			// A rejection or no-op decided on a guessed state proves nothing: look for real.
			guessNew = false
			attempt--
			continue
		}
		if err != nil {
			class = "command_rejected"
			return res, &RejectedError{Stream: stream, Err: err}
		}
		if len(emitted) == 0 {
			return res, nil
		}
		data, err := r.encode(stream, emitted, o)
		if err != nil {
			class = "encode_failed"
			return res, err
		}
		if r.beforeAppend != nil {
			r.beforeAppend(ctx, stream, attempt)
		}
		out, err := r.appendTx(ctx, db, open, stream, Exact(version), data, o.Hook)
		open = nil
		var herr *hookError
		switch {
		case errors.As(err, &herr):
			// A hook's error is the hook's, whatever it wraps: a hook that met a version
			// conflict elsewhere must not make the runner retry this command.
			class = "hook_failed"
			return res, fmt.Errorf("command on %s: %w", stream, err)
		case err == nil:
			out.Attempts = attempt
			if !out.Duplicate {
				r.maybeSnapshot(ctx, db, stream, version, state, emitted, out.Events)
			}
			return out, nil
		case errors.Is(err, ErrWrongExpectedVersion) && guessNew:
			// The stream exists: hydrate and decide for real, without counting a retry.
			guessNew = false
			attempt--
		case errors.Is(err, ErrWrongExpectedVersion):
			r.store.metrics.conflicts.Add(ctx, 1)
			if attempt > r.cfg.RetryLimit {
				class = "retry_exhausted"
				return res, &RetryExhaustedError{Stream: stream, Attempts: attempt, Last: err}
			}
			if err := r.backoff(ctx, attempt); err != nil {
				class = "cancelled"
				return res, fmt.Errorf("command on %s: wait to retry: %w", stream, err)
			}
			r.store.metrics.retries.Add(ctx, 1)
		case errors.Is(err, ErrEventIDConflict):
			r.store.metrics.duplicates.Add(ctx, 1)
			class = "duplicate_event"
			return res, fmt.Errorf("command on %s: %w", stream, err)
		default:
			class = "store_failed"
			return res, fmt.Errorf("command on %s: %w", stream, err)
		}
	}
}

// encode encodes the emitted events with the run's ids and metadata.
func (r *Runner[S, C, E]) encode(stream string, emitted []E, o RunOptions) ([]EventData, error) {
	data := make([]EventData, len(emitted))
	for i, e := range emitted {
		var err error
		if data[i], err = r.codec.Encode(e); err != nil {
			return nil, fmt.Errorf("command on %s: %w", stream, err)
		}
		if i < len(o.EventIDs) {
			data[i].ID = o.EventIDs[i]
		}
		data[i].Metadata = o.Metadata
	}
	return data, nil
}

// hookError is a Hook's failure: never a conflict of the command's own append.
type hookError struct{ err error }

func (e *hookError) Error() string { return "hook: " + e.err.Error() }
func (e *hookError) Unwrap() error { return e.err }

// runHooks runs the configured hooks, then the run's, in tx.
func (r *Runner[S, C, E]) runHooks(ctx context.Context, tx pgx.Tx, out Result, hook Hook) error {
	for _, h := range r.cfg.Hooks {
		if err := h(ctx, tx, out); err != nil {
			return &hookError{err}
		}
	}
	if hook != nil {
		if err := hook(ctx, tx, out); err != nil {
			return &hookError{err}
		}
	}
	return nil
}

// appendTx appends and runs the hooks in one transaction: open when it is not nil (it is then
// committed or rolled back here), else a new one. Without hooks the append is a single
// statement, run in autocommit: one round trip instead of three.
func (r *Runner[S, C, E]) appendTx(ctx context.Context, db keiro.DB, open pgx.Tx, stream string, expected ExpectedVersion, data []EventData, hook Hook) (Result, error) {
	var out Result
	var err error
	body := func(tx pgx.Tx) error {
		ar, err := r.store.appendTx(ctx, tx, stream, expected, false, data)
		if err != nil {
			return err
		}
		out = Result{StreamVersion: ar.StreamVersion, GlobalPosition: ar.GlobalPosition, Events: ar.Events, Duplicate: ar.Duplicate}
		if ar.Duplicate {
			return nil
		}
		return r.runHooks(ctx, tx, out, hook)
	}
	// Notify after commit, not inside the transaction: PostgreSQL would otherwise hold its
	// global notify lock through this transaction's WAL flush, serialising all writers.
	if open != nil {
		if err = body(open); err == nil {
			err = open.Commit(ctx)
		}
		if err != nil {
			_ = open.Rollback(context.WithoutCancel(ctx))
		}
	} else if len(r.cfg.Hooks) == 0 && hook == nil {
		var ar AppendResult
		ar, err = r.store.appendTx(ctx, db, stream, expected, false, data)
		out = Result{StreamVersion: ar.StreamVersion, GlobalPosition: ar.GlobalPosition, Events: ar.Events, Duplicate: ar.Duplicate}
	} else {
		err = pgx.BeginFunc(ctx, db, body)
	}
	if err == nil && !out.Duplicate && !r.store.cfg.DisableNotify {
		// Off the command's path; subscriptions would still find the events at their next poll.
		r.store.notifyAsync(db)
	}
	return out, err
}

// backoff waits before retry attempt+1: Backoff's delay for retry attempt.
func (r *Runner[S, C, E]) backoff(ctx context.Context, attempt int) error {
	return backoff.Sleep(ctx, r.cfg.Backoff.Delay(attempt))
}

// Load hydrates stream: the state its events fold into and its version (0: no events). It
// starts from a snapshot when snapshots are enabled and a compatible one exists, and replays
// the rest page by page. Stored versions must be contiguous (ErrHydrationGap otherwise).
func (r *Runner[S, C, E]) Load(ctx context.Context, q keiro.DB, stream string) (S, int64, error) {
	state, version := r.decider.Initial, int64(0)
	if r.cfg.Snapshot != nil {
		if s, v, ok := r.readSnapshot(ctx, q, stream); ok {
			state, version = s, v
		}
	}
	return r.foldFrom(ctx, q, stream, state, version)
}

// foldFrom folds the stream's events after version into state.
func (r *Runner[S, C, E]) foldFrom(ctx context.Context, q keiro.DB, stream string, state S, version int64) (S, int64, error) {
	for e, err := range r.store.ReadStream(ctx, q, stream, Forward, version) {
		if err != nil {
			return r.decider.Initial, 0, fmt.Errorf("hydrate %s: %w", stream, err)
		}
		if state, version, err = r.evolve(stream, state, version, e); err != nil {
			return r.decider.Initial, 0, err
		}
	}
	return state, version, nil
}

// evolve applies one stored event, which must be the next version.
func (r *Runner[S, C, E]) evolve(stream string, state S, version int64, e RecordedEvent) (S, int64, error) {
	if e.StreamVersion != version+1 {
		return state, version, fmt.Errorf("hydrate %s: %w: expected version %d, found %d", stream, ErrHydrationGap, version+1, e.StreamVersion)
	}
	de, err := r.codec.Decode(e)
	if err != nil {
		return state, version, fmt.Errorf("hydrate %s: %w", stream, err)
	}
	return r.decider.Evolve(state, de), e.StreamVersion, nil
}

func (r *Runner[S, C, E]) readSnapshot(ctx context.Context, q keiro.DB, stream string) (S, int64, bool) {
	var (
		version      int64
		stateVersion int32
		raw          []byte
	)
	err := q.QueryRow(ctx, r.store.q.snapshotRead, stream).Scan(&version, &stateVersion, &raw)
	if err != nil || stateVersion != r.cfg.SnapshotVersion {
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			r.cfg.Logger.WarnContext(ctx, "keiro: read snapshot failed; replaying the whole stream", "stream", stream, "error", err)
		}
		r.store.metrics.snapshotMisses.Add(ctx, 1)
		return r.decider.Initial, 0, false
	}
	s, err := r.cfg.DecodeSnapshot(raw)
	if err != nil {
		r.cfg.Logger.WarnContext(ctx, "keiro: undecodable snapshot; replaying the whole stream", "stream", stream, "error", err)
		r.store.metrics.snapshotDecodeFailures.Add(ctx, 1)
		r.store.metrics.snapshotMisses.Add(ctx, 1)
		return r.decider.Initial, 0, false
	}
	r.store.metrics.snapshotHits.Add(ctx, 1)
	return s, version, true
}

// SnapshotPolicy decides, after a committed append took a stream from version pre to version
// post, with state the state at post, whether to write an advisory snapshot (keiro's
// SnapshotPolicy: Every n, OnTerminal, Custom). It must be cheap and pure.
type SnapshotPolicy[S any] func(pre, post int64, state S) bool

// SnapshotEvery snapshots whenever an append crosses a multiple of n versions (a multi-event
// append that crosses one snapshots at its last version). n must be positive.
func SnapshotEvery[S any](n int64) SnapshotPolicy[S] {
	return func(pre, post int64, _ S) bool { return n > 0 && post/n > pre/n }
}

// SnapshotOnTerminal snapshots when an append leaves the aggregate in a terminal state
// (terminal(state) is true: an order shipped or cancelled), so that reading a finished
// stream replays nothing.
func SnapshotOnTerminal[S any](terminal func(S) bool) SnapshotPolicy[S] {
	return func(_, _ int64, state S) bool { return terminal(state) }
}

// maybeSnapshot writes a snapshot after commit when the Snapshot policy asks for one on the
// append (pre, post], post being the last recorded event's version. Before it writes, it
// replays the recorded events as the next hydration will read them (replayDivergence): a batch
// that does not replay to the state evolved in memory is counted
// (keiro.snapshot.apply.divergence), described on the command span (keiro.replay.divergence)
// and not snapshotted, since the snapshot would hide from hydration what the log holds.
// Failures are counted and logged, never returned.
func (r *Runner[S, C, E]) maybeSnapshot(ctx context.Context, db keiro.DB, stream string, pre int64, state S, emitted []E, recorded []RecordedEvent) {
	policy := r.cfg.Snapshot
	if policy == nil || len(recorded) == 0 {
		return
	}
	post := recorded[len(recorded)-1].StreamVersion
	before := state
	for _, e := range emitted {
		state = r.decider.Evolve(state, e)
	}
	if !policy(pre, post, state) {
		return
	}
	raw, err := r.cfg.EncodeSnapshot(state)
	if err != nil {
		r.store.metrics.snapshotEncodeFailures.Add(ctx, 1)
		r.cfg.Logger.WarnContext(ctx, "keiro: snapshot encode failed; the command is committed", "stream", stream, "version", post, "error", err)
		return
	}
	if why := r.replayDivergence(stream, before, pre, recorded, raw); why != "" {
		r.store.metrics.snapshotApplyDivergence.Add(ctx, 1)
		trace.SpanFromContext(ctx).SetAttributes(tracing.ReplayDivergenceKey.String(truncate(why, 256)))
		r.cfg.Logger.WarnContext(ctx, "keiro: the appended events do not replay to the decided state; no snapshot written, and the next hydration will see the difference",
			"stream", stream, "version", post, "divergence", why)
		return
	}
	if _, err := db.Exec(context.WithoutCancel(ctx), r.store.q.snapshotWrite, stream, post, r.cfg.SnapshotVersion, raw); err != nil {
		r.store.metrics.snapshotWriteFailures.Add(ctx, 1)
		r.cfg.Logger.WarnContext(ctx, "keiro: snapshot write failed; the command is committed", "stream", stream, "version", post, "error", err)
	}
}

// replayDivergence folds recorded, the just-appended events as stored, through the codec into
// before, the state at version pre, as hydration would, and compares the result with the state
// evolved in memory from the emitted events, by their snapshot encodings (decided is the
// latter's). It returns "" when they agree, else keiro's description of the divergence:
// "event_index=<i>;reason=<why>", why being unknown_event_type, version_gap, decode_failed
// (event i could not be folded) or state_mismatch (every event folded, to another state: the
// codec loses or changes something).
func (r *Runner[S, C, E]) replayDivergence(stream string, before S, pre int64, recorded []RecordedEvent, decided []byte) string {
	state, version := before, pre
	for i, e := range recorded {
		var err error
		if state, version, err = r.evolve(stream, state, version, e); err != nil {
			why := "decode_failed"
			switch {
			case errors.Is(err, ErrUnknownEventType):
				why = "unknown_event_type"
			case errors.Is(err, ErrHydrationGap):
				why = "version_gap"
			}
			return fmt.Sprintf("event_index=%d;reason=%s", i, why)
		}
	}
	if replayed, err := r.cfg.EncodeSnapshot(state); err != nil || !bytes.Equal(replayed, decided) {
		return fmt.Sprintf("event_index=%d;reason=state_mismatch", len(recorded)-1)
	}
	return ""
}

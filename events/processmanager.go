package events

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
)

// Reaction is what a process manager does about one input: the events it records on its own
// stream (its state), the commands it sends to target streams and the timers it arms.
type Reaction[E, C any] struct {
	// Events are appended to the manager's stream; none is a no-op for the state (the
	// commands and timers still go out).
	Events []E
	// Commands are dispatched to their target streams, in order, after the manager's events
	// commit.
	Commands []Command[C]
	// Timers are armed (ScheduleTimerTx) in the transaction of the manager's events.
	// ProcessManager and CorrelationID default to the manager's name and the input's
	// correlation id.
	Timers []TimerRequest
}

// ProcessManagerConfig defines a ProcessManager.
type ProcessManagerConfig[S, I, E, C any] struct {
	// Name identifies the process manager; it is part of every write's id and of the default
	// manager stream. Required; a valid category once prefixed with "pm:" (no '-').
	Name string
	// Correlate returns the id of the process instance an input belongs to (an order id).
	// Required.
	Correlate func(input I) string
	// Initial is the state of an instance with no events.
	Initial S
	// Handle decides the reaction to input in state. It must be pure: a redelivered input is
	// handled again on the state before the reaction's events, and its commands are recognised
	// by their position. An error rejects the input (ErrCommandRejected, see RejectedPolicy).
	// Required.
	Handle func(state S, input I) (Reaction[E, C], error)
	// Evolve folds one of the manager's events into its state. Required.
	Evolve func(state S, event E) S
	// Codec encodes and decodes the manager's events. Required.
	Codec Codec[E]
	// Target runs the commands (a *Runner). Required.
	Target Target[C]
	// StreamFor returns an instance's manager stream. Defaults to "pm:<Name>-<correlation>".
	StreamFor func(correlation string) string
	// Runner configures the command runner of the manager's stream: retries, snapshots of the
	// state (Snapshot, SnapshotEvery), tracing.
	Runner RunnerConfig[S]
}

// ProcessManager is a long-running process (keiro's process manager, a saga): each input is
// correlated to an instance whose state lives in its own stream; Handle decides, from the state
// and the input, the events that record the step, the commands to send and the timers to arm.
// The manager's events and its timers commit in one transaction; each command then runs
// through the target's runner in its own transaction (a savepoint when the input's source
// gave a transaction), with id ProcessManagerCommandID(name, correlation, source, position).
// A crash between the manager's commit and a target's is healed by redelivering the input:
// the manager's event is recognised (its id is ProcessManagerCommandID(…, -1)), the reaction
// is recomputed on the state before it, and only the commands that did not commit run. Inputs
// from different streams that correlate to one instance come in no guaranteed order, so Handle
// must not depend on it. A ProcessManager is safe for concurrent use.
type ProcessManager[S, I, E, C any] struct {
	store  *Store
	cfg    ProcessManagerConfig[S, I, E, C]
	runner *Runner[S, pmInput[I, E, C], E]
}

// pmInput is the manager runner's command: the input, and where Decide leaves the reaction
// it decided (the last decision of the run, which is the one appended).
type pmInput[I, E, C any] struct {
	input I
	out   *Reaction[E, C]
}

// NewProcessManager returns a ProcessManager, reporting every configuration problem at once.
func NewProcessManager[S, I, E, C any](store *Store, cfg ProcessManagerConfig[S, I, E, C]) (*ProcessManager[S, I, E, C], error) {
	var errs []error
	if store == nil {
		errs = append(errs, errors.New("store is nil"))
	}
	switch {
	case strings.TrimSpace(cfg.Name) == "":
		errs = append(errs, errors.New("Name: required"))
	case cfg.StreamFor == nil:
		if err := ValidateCategory("pm:" + cfg.Name); err != nil {
			errs = append(errs, fmt.Errorf("Name: %w", err))
		}
	}
	if cfg.Correlate == nil {
		errs = append(errs, errors.New("Correlate: required"))
	}
	if cfg.Handle == nil {
		errs = append(errs, errors.New("Handle: required"))
	}
	if cfg.Evolve == nil {
		errs = append(errs, errors.New("Evolve: required"))
	}
	if cfg.Codec == nil {
		errs = append(errs, errors.New("Codec: required"))
	}
	if cfg.Target == nil {
		errs = append(errs, errors.New("Target: required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new process manager: %w", err)
	}
	if cfg.StreamFor == nil {
		name := cfg.Name
		cfg.StreamFor = func(correlation string) string { return "pm:" + name + "-" + correlation }
	}
	handle := cfg.Handle
	d := Decider[S, pmInput[I, E, C], E]{
		Initial: cfg.Initial,
		Decide: func(state S, in pmInput[I, E, C]) ([]E, error) {
			r, err := handle(state, in.input)
			if err != nil {
				return nil, err
			}
			*in.out = r
			return r.Events, nil
		},
		Evolve: cfg.Evolve,
	}
	runner, err := NewRunner(store, d, cfg.Codec, cfg.Runner)
	if err != nil {
		return nil, fmt.Errorf("new process manager: %w", err)
	}
	return &ProcessManager[S, I, E, C]{store: store, cfg: cfg, runner: runner}, nil
}

// Name returns the process manager's name.
func (pm *ProcessManager[S, I, E, C]) Name() string { return pm.cfg.Name }

// Stream returns the manager stream of the instance correlation.
func (pm *ProcessManager[S, I, E, C]) Stream(correlation string) string {
	return pm.cfg.StreamFor(correlation)
}

// Load returns an instance's state and its stream's version.
func (pm *ProcessManager[S, I, E, C]) Load(ctx context.Context, q keiro.DB, correlation string) (S, int64, error) {
	return pm.runner.Load(ctx, q, pm.Stream(correlation))
}

// ProcessManagerResult reports one input handled by a ProcessManager.
type ProcessManagerResult struct {
	// Correlation is the input's correlation id.
	Correlation string
	// Manager reports the manager's own write: CommandAppended (also for a reaction without
	// events), CommandDuplicate (an earlier delivery recorded it) or CommandFailed (then no
	// command was dispatched and no timer armed).
	Manager CommandResult
	// Commands reports each command of the reaction, in order.
	Commands []CommandResult
	// TimersScheduled is the number of timers armed (0 for a duplicate: they committed with
	// the manager's event).
	TimersScheduled int
}

// Err returns the failures' errors joined, or nil when nothing failed.
func (r ProcessManagerResult) Err() error {
	errs := []error{}
	if r.Manager.Outcome == CommandFailed {
		errs = append(errs, r.Manager.Err)
	}
	for _, c := range r.Commands {
		if c.Outcome == CommandFailed {
			errs = append(errs, c.Err)
		}
	}
	return errors.Join(errs...)
}

// Dispatch handles input on db (a pool, or a transaction whose savepoints then hold each
// write). source is the id of the event or message the input came from; it must be the same on
// every delivery. Dispatch returns an error only when source is the zero UUID or the
// manager stream is invalid; other failures are in the result. It applies no DispatchPolicy:
// EventHandler, InboxHandler and TimerFire do.
func (pm *ProcessManager[S, I, E, C]) Dispatch(ctx context.Context, db keiro.DB, source envelope.UUID, input I) (ProcessManagerResult, error) {
	return pm.run(ctx, db, DispatchSource{EventID: source}, input)
}

func (pm *ProcessManager[S, I, E, C]) run(ctx context.Context, db keiro.DB, src DispatchSource, input I) (ProcessManagerResult, error) {
	name := pm.cfg.Name
	if src.EventID.IsZero() {
		return ProcessManagerResult{}, fmt.Errorf("process manager %s: the source event id is the zero UUID; pass the id of the event or message the input came from", name)
	}
	corr := pm.cfg.Correlate(input)
	res := ProcessManagerResult{Correlation: corr}
	stream := pm.Stream(corr)
	if err := ValidateStreamName(stream); err != nil {
		return res, fmt.Errorf("process manager %s: manager stream of %q: %w", name, corr, err)
	}
	managerID := ProcessManagerCommandID(name, corr, src.EventID, -1)
	res.Manager = CommandResult{Stream: stream, CommandID: managerID}
	var reaction Reaction[E, C]
	dup, err := pm.lookUpStep(ctx, db, stream, managerID)
	if err == nil && !dup {
		var r Result
		r, err = pm.appendManager(ctx, db, stream, corr, src, input, &reaction)
		switch {
		case err == nil && !r.Duplicate:
			res.Manager.Outcome, res.Manager.Result = CommandAppended, r
			res.TimersScheduled = len(reaction.Timers)
		case err == nil || pm.store.benignDuplicate(ctx, db, stream, managerID, err):
			dup, err = true, nil
		}
	}
	if err == nil && dup {
		// An earlier delivery recorded the step: recompute its reaction on the state before it.
		res.Manager.Outcome = CommandDuplicate
		pm.store.metrics.dispatchDuplicates.Add(ctx, 1)
		var state S
		if state, err = pm.stateBefore(ctx, db, stream, managerID); err == nil {
			if reaction, err = pm.cfg.Handle(state, input); err != nil {
				err = fmt.Errorf("process manager %s: handle %s again on the state before its recorded step: %w", name, corr, err)
			}
		}
	}
	if err != nil {
		res.Manager.Outcome, res.Manager.Err = CommandFailed, fmt.Errorf("process manager %s: %s: %w", name, corr, err)
		return res, nil
	}
	md := causedBy(src.EventID)
	for i, cmd := range reaction.Commands {
		id := ProcessManagerCommandID(name, corr, src.EventID, i)
		res.Commands = append(res.Commands, dispatchCommand(ctx, pm.store, db, pm.cfg.Target, cmd, id, md))
	}
	return res, nil
}

// The savepoint that holds a manager's step when the dispatch runs in a transaction.
const (
	sqlManagerSavepoint = `SAVEPOINT keiro_manager`
	sqlManagerRollback  = `ROLLBACK TO SAVEPOINT keiro_manager`
)

// lookUpStep reports whether the step id is in the manager stream. On a transaction the lookup
// travels with the savepoint appendManager rolls back to (one round trip); the savepoint is
// not released (what follows nests in it; ROLLBACK TO names the newest).
func (pm *ProcessManager[S, I, E, C]) lookUpStep(ctx context.Context, db keiro.DB, stream string, id envelope.UUID) (bool, error) {
	tx, ok := db.(pgx.Tx)
	if !ok {
		return pm.store.EventIn(ctx, db, stream, id)
	}
	var in bool
	b := &pgx.Batch{}
	b.Queue(pm.store.q.eventIn, id, stream).QueryRow(func(row pgx.Row) error { return row.Scan(&in) })
	b.Queue(sqlManagerSavepoint)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return false, fmt.Errorf("look up event %s in %s: %w", id, stream, err)
	}
	return in, nil
}

// appendManager runs the manager's step: its events and timers in one transaction. In the
// caller's transaction db, after the savepoint lookUpStep set (rolled back to on failure);
// on a pool, in a transaction of the runner's, or the timers alone in one of their own when
// the step has no events.
func (pm *ProcessManager[S, I, E, C]) appendManager(ctx context.Context, db keiro.DB, stream, corr string, src DispatchSource, input I, reaction *Reaction[E, C]) (Result, error) {
	arm := func(ctx context.Context, q keiro.DB) error {
		for _, t := range reaction.Timers {
			if t.ProcessManager == "" {
				t.ProcessManager = pm.cfg.Name
			}
			if t.CorrelationID == "" {
				t.CorrelationID = corr
			}
			if _, err := pm.store.ScheduleTimerTx(ctx, q, t); err != nil {
				return err
			}
		}
		return nil
	}
	id := ProcessManagerCommandID(pm.cfg.Name, corr, src.EventID, -1)
	cmd := pmInput[I, E, C]{input: input, out: reaction}
	opts := RunOptions{EventIDs: []envelope.UUID{id}, Metadata: causedBy(src.EventID)}
	if tx, ok := db.(pgx.Tx); ok {
		r, err := pm.runner.Run(ctx, tx, stream, cmd, opts)
		if err == nil && !r.Duplicate {
			err = arm(ctx, tx)
		}
		if err != nil {
			if _, rerr := tx.Exec(context.WithoutCancel(ctx), sqlManagerRollback); rerr != nil {
				err = errors.Join(err, fmt.Errorf("roll back to savepoint: %w", rerr))
			}
		}
		return r, err
	}
	opts.Hook = func(ctx context.Context, tx pgx.Tx, _ Result) error { return arm(ctx, tx) }
	r, err := pm.runner.Run(ctx, db, stream, cmd, opts)
	if err == nil && len(r.Events) == 0 && !r.Duplicate && len(reaction.Timers) > 0 {
		// A step without events still arms its timers, in a transaction of their own.
		err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return arm(ctx, tx) })
	}
	return r, err
}

// stateBefore folds the manager stream up to, not including, the event id.
func (pm *ProcessManager[S, I, E, C]) stateBefore(ctx context.Context, db keiro.DB, stream string, id envelope.UUID) (S, error) {
	state := pm.cfg.Initial
	for e, err := range pm.store.ReadStream(ctx, db, stream, Forward, 0) {
		if err != nil {
			return state, fmt.Errorf("read %s: %w", stream, err)
		}
		if e.ID == id {
			return state, nil
		}
		de, err := pm.cfg.Codec.Decode(e)
		if err != nil {
			return state, fmt.Errorf("read %s: %w", stream, err)
		}
		state = pm.cfg.Evolve(state, de)
	}
	return state, fmt.Errorf("read %s: event %s is not in the stream", stream, id)
}

// dispatch is run for the source adapters: the manager's failure is the write at index -1.
func (pm *ProcessManager[S, I, E, C]) dispatch(ctx context.Context, db keiro.DB, src DispatchSource, input I) (string, []emitted, error) {
	res, err := pm.run(ctx, db, src, input)
	if err != nil {
		return res.Correlation, nil, err
	}
	out := make([]emitted, 0, len(res.Commands)+1)
	out = append(out, emitted{index: -1, result: res.Manager})
	for i, c := range res.Commands {
		out = append(out, emitted{index: i, result: c})
	}
	return res.Correlation, out, nil
}

// EventHandler returns a subscription Handler that decodes each event into an input and
// handles it in the subscription's transaction (see Router.EventHandler): the manager's
// events, its timers and its commands commit with the checkpoint.
func (pm *ProcessManager[S, I, E, C]) EventHandler(decode func(RecordedEvent) (I, error), p DispatchPolicy) (Handler, error) {
	if decode == nil {
		return nil, fmt.Errorf("process manager %s: event handler: decode is nil", pm.cfg.Name)
	}
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("process manager %s: event handler: %w", pm.cfg.Name, err)
	}
	return func(ctx context.Context, tx pgx.Tx, e RecordedEvent) error {
		src := DispatchSource{EventID: e.ID, GlobalPosition: e.GlobalPosition}
		return handleInput(ctx, pm.store, tx, DispatcherProcessManager, pm.cfg.Name, src, p,
			func() (I, error) { return decode(e) }, pm.dispatch)
	}, nil
}

// InboxHandler returns an inbox handler (see Router.InboxHandler) that handles each integration
// event inside the inbox transaction: the inbox row, the manager's events, its timers and its
// commands commit together.
func (pm *ProcessManager[S, I, E, C]) InboxHandler(decode func(envelope.Event) (I, error), p DispatchPolicy) (func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error, error) {
	if decode == nil {
		return nil, fmt.Errorf("process manager %s: inbox handler: decode is nil", pm.cfg.Name)
	}
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("process manager %s: inbox handler: %w", pm.cfg.Name, err)
	}
	return func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		src := DispatchSource{EventID: InboxSourceID(ev)}
		return forInbox(handleInput(ctx, pm.store, tx, DispatcherProcessManager, pm.cfg.Name, src, p,
			func() (I, error) { return decode(ev) }, pm.dispatch))
	}, nil
}

// TimerFire returns a TimerWorkerConfig.Fire that delivers this manager's timers to it as
// inputs (decode builds the input from the timer, typically from its payload), in the fire's
// transaction, with the timer's id as the source id: the step, its commands and the timer's
// move to fired commit together. Failures follow p; a failure that is not set aside fails the
// fire, so the timer is retried once requeued. The fired event id is the manager's event for
// the timer when it recorded one. Timers of other process managers fail.
func (pm *ProcessManager[S, I, E, C]) TimerFire(decode func(Timer) (I, error), p DispatchPolicy) (FireFunc, error) {
	if decode == nil {
		return nil, fmt.Errorf("process manager %s: timer fire: decode is nil", pm.cfg.Name)
	}
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("process manager %s: timer fire: %w", pm.cfg.Name, err)
	}
	return func(ctx context.Context, tx pgx.Tx, t Timer) (envelope.UUID, error) {
		if t.ProcessManager != pm.cfg.Name {
			return envelope.UUID{}, fmt.Errorf("process manager %s: timer %s belongs to process manager %q", pm.cfg.Name, t.ID, t.ProcessManager)
		}
		src := DispatchSource{EventID: t.ID}
		if err := handleInput(ctx, pm.store, tx, DispatcherProcessManager, pm.cfg.Name, src, p,
			func() (I, error) { return decode(t) }, pm.dispatch); err != nil {
			return envelope.UUID{}, err
		}
		id := ProcessManagerCommandID(pm.cfg.Name, t.CorrelationID, t.ID, -1)
		in, err := pm.store.EventIn(ctx, tx, pm.Stream(t.CorrelationID), id)
		if err != nil || !in {
			return envelope.UUID{}, err
		}
		return id, nil
	}, nil
}

package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
)

// Reserved step-name prefixes: user step names must not start with them.
const (
	sleepPrefix  = "sleep:"
	awkPrefix    = "awk:"
	childPrefix  = "child:"
	patchPrefix  = "patch:"
	patchSetStep = "patch:set"
)

// Context is a run's context: the context.Context of the run (cancelled when the worker stops)
// and the instance's journal. A workflow function passes it to Step, Await, Sleep and the
// other operations, and must not use it after it returns. It is not safe for concurrent use:
// a workflow's operations run one after the other, in a deterministic order.
type Context struct {
	context.Context
	e       *Engine
	def     *definition
	id      string
	gen     int
	owner   string
	wakes   int64
	journal map[string]json.RawMessage
	version int64 // the journal holds every step of the generation at or below this version

	stopped error      // ErrSuspended, ErrCancelled or errContinueAsNew once the run must end
	wakeAt  *time.Time // when a suspended run is runnable again (nil: on a wake source)
	rotate  json.RawMessage
}

// WorkflowName returns the running workflow's name.
func (c *Context) WorkflowName() string { return c.def.name }

// WorkflowID returns the running instance's id.
func (c *Context) WorkflowID() string { return c.id }

// Generation returns the running generation (0 until the first ContinueAsNew).
func (c *Context) Generation() int { return c.gen }

func (c *Context) stop(err error) error {
	if c.stopped == nil {
		c.stopped = err
	}
	return c.stopped
}

func checkStepName(name string) error {
	if err := validateName("step name", name); err != nil {
		return err
	}
	for _, p := range []string{sleepPrefix, awkPrefix, childPrefix, patchPrefix} {
		if strings.HasPrefix(name, p) {
			return fmt.Errorf("step name %q uses the reserved prefix %q", name, p)
		}
	}
	return nil
}

// Step runs fn once for this instance and journals its result under name (keiro's step). fn
// runs in a transaction that also records the step: what fn writes through tx (rows, an outbox
// event, a started workflow) commits together with the journal entry, exactly once. A replay
// returns the recorded result without running fn; a step name repeated in one run returns the
// first result; two writers of one step (a crashed run's successor racing it) agree on the
// first one's result. The result is returned as its JSON round trip, the same on the first run
// as on a replay. An error of fn rolls its transaction back and is returned: the workflow
// function returns it to fail this run (it is retried with backoff up to MaxAttempts). Effects
// outside tx (a call to another service) are at least once: a crash after them and before
// the commit runs them again.
func Step[V any](c *Context, name string, fn func(ctx context.Context, tx pgx.Tx) (V, error)) (V, error) {
	if err := checkStepName(name); err != nil {
		var zero V
		return zero, err
	}
	return step(c, name, fn)
}

func step[V any](c *Context, key string, fn func(ctx context.Context, tx pgx.Tx) (V, error)) (V, error) {
	var zero V
	if c.stopped != nil {
		return zero, c.stopped
	}
	if raw, ok := c.journal[key]; ok {
		c.e.tel.replayed.Add(c, 1)
		return decode[V](key, raw)
	}
	ctx, span := c.e.tracer.Start(c, "workflow "+c.def.name+" step", trace.WithAttributes(
		attribute.String(attrName, c.def.name), attribute.String(attrID, c.id), attribute.String(attrStep, key)))
	defer span.End()
	var raw json.RawMessage
	var version int64
	fresh := false
	err := pgx.BeginFunc(ctx, c.e.db, func(tx pgx.Tx) error {
		// The lock and the lookup share a round trip; the lookup, a statement of its own, sees
		// what the lock's previous holder committed.
		batch := &pgx.Batch{}
		batch.Queue(c.e.q.LockStep, c.def.name, c.id, c.gen, key)
		batch.Queue(c.e.q.LookupStep, c.def.name, c.id, c.gen, key)
		br := tx.SendBatch(ctx, batch)
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return fmt.Errorf("lock step: %w", err)
		}
		err := br.QueryRow().Scan(&raw)
		if cerr := br.Close(); err == nil || errors.Is(err, pgx.ErrNoRows) {
			if cerr != nil {
				return fmt.Errorf("look up step: %w", cerr)
			}
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("look up step: %w", err)
		}
		v, err := fn(ctx, tx)
		if err != nil {
			return err
		}
		b, err := encodeJSON(v)
		if err != nil {
			return fmt.Errorf("step result: %w", err)
		}
		var inserted, live bool
		if err := tx.QueryRow(ctx, c.e.q.RecordStep, c.def.name, c.id, c.gen, key, b, c.owner,
			c.e.cfg.Now().Add(c.e.cfg.LeaseTTL)).Scan(&inserted, &live, &version); err != nil {
			return fmt.Errorf("record step: %w", err)
		}
		switch {
		case !live:
			return ErrCancelled
		case !inserted:
			// A wake source recorded the step while fn ran: its result stands, fn's writes
			// roll back.
			return errRecordedMeanwhile
		}
		raw, fresh = b, true
		return nil
	})
	if errors.Is(err, errRecordedMeanwhile) {
		err = c.e.db.QueryRow(ctx, c.e.q.LookupStep, c.def.name, c.id, c.gen, key).Scan(&raw)
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		if errors.Is(err, ErrCancelled) {
			return zero, c.stop(ErrCancelled)
		}
		return zero, fmt.Errorf("workflow %s/%s step %s: %w", c.def.name, c.id, key, err)
	}
	c.journal[key] = raw
	if fresh {
		c.e.tel.executed.Add(c, 1)
		c.recorded(version)
	} else {
		c.e.tel.replayed.Add(c, 1)
	}
	return decode[V](key, raw)
}

// errRecordedMeanwhile rolls back a step whose name another writer recorded first.
var errRecordedMeanwhile = errors.New("step recorded meanwhile")

func decode[V any](key string, raw json.RawMessage) (V, error) {
	var v V
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, &StepDecodeError{Step: key, Err: err}
	}
	return v, nil
}

// Await returns the result of step name once something outside the run recorded it
// (Engine.CompleteStepTx, keiro's awaitStep); until then it suspends the run (ErrSuspended),
// journaling nothing, and the completion wakes the instance.
func Await[V any](c *Context, name string) (V, error) {
	if err := checkStepName(name); err != nil {
		var zero V
		return zero, err
	}
	return await[V](c, name, nil)
}

// await returns the recorded step key, or suspends the run until a wake source or wakeAt.
func await[V any](c *Context, key string, wakeAt *time.Time) (V, error) {
	var zero V
	if c.stopped != nil {
		return zero, c.stopped
	}
	raw, ok, err := c.lookup(key)
	if err != nil {
		return zero, err
	}
	if !ok {
		c.wakeAt = wakeAt
		return zero, c.stop(ErrSuspended)
	}
	c.e.tel.replayed.Add(c, 1)
	return decode[V](key, raw)
}

// lookup reads step key from the journal, then from the database (a wake source may have
// recorded it since the journal was loaded).
func (c *Context) lookup(key string) (json.RawMessage, bool, error) {
	if raw, ok := c.journal[key]; ok {
		return raw, true, nil
	}
	var raw json.RawMessage
	err := c.e.db.QueryRow(c, c.e.q.LookupStep, c.def.name, c.id, c.gen, key).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("workflow %s/%s: look up step %s: %w", c.def.name, c.id, key, err)
	}
	c.journal[key] = raw
	return raw, true, nil
}

// timerProcessManager is the ProcessManager of every workflow sleep's durable timer.
const timerProcessManager = "keiro.workflow"

// sleepTimer is the payload of a sleep's durable timer: the step its firing records.
type sleepTimer struct {
	Workflow   string    `json:"workflow"`
	ID         string    `json:"id"`
	Generation int       `json:"generation"`
	Step       string    `json:"step"`
	FireAt     time.Time `json:"fire_at"`
}

// Sleep suspends the run until d after the first time this sleep (name) ran: the due time is
// journaled, so a replay never postpones it. It arms a durable timer in the same transaction
// (events.TimerWorker with Engine.FireTimer fires it) and parks the instance until the due
// time, so a worker also resumes it then without a timer worker.
func Sleep(c *Context, name string, d time.Duration) error {
	if err := validateName("sleep name", name); err != nil {
		return err
	}
	key := sleepPrefix + name
	done := key + ":done"
	fireAt, err := step(c, key, func(ctx context.Context, tx pgx.Tx) (time.Time, error) {
		at := c.e.cfg.Now().Add(d).UTC()
		payload, err := json.Marshal(sleepTimer{Workflow: c.def.name, ID: c.id, Generation: c.gen, Step: done, FireAt: at})
		if err != nil {
			return at, err
		}
		_, err = c.e.timers.ScheduleTimerOnceTx(ctx, tx, events.TimerRequest{
			ID: SleepTimerID(c.def.name, c.id, c.gen, name), ProcessManager: timerProcessManager,
			CorrelationID: c.def.name + "/" + c.id, FireAt: at, Payload: payload,
		})
		return at, err
	})
	if err != nil {
		return err
	}
	if _, ok, err := c.lookup(done); err != nil || ok {
		return err
	}
	if c.e.cfg.Now().Before(fireAt) {
		_, err := await[time.Time](c, done, &fireAt)
		return err
	}
	_, err = step(c, done, func(context.Context, pgx.Tx) (time.Time, error) { return fireAt, nil })
	return err
}

// SleepTimerID is the durable timer id of sleep name of generation gen of instance
// workflow/id: deterministic, so a re-armed sleep re-arms one timer, and distinct per
// generation.
func SleepTimerID(workflow, id string, gen int, name string) envelope.UUID {
	return events.TimerID(timerProcessManager, workflow+"/"+id, fmt.Sprintf("%d/%s", gen, name))
}

// resolution is how a wake source resolves an awakeable or a child: a value, a failure or a
// cancellation.
type resolution struct {
	Kind   string          `json:"kind"` // "ok", "failed" or "cancelled"
	Value  json.RawMessage `json:"value,omitempty"`
	Reason string          `json:"reason,omitempty"`
}

// NewAwakeable allocates an awakeable (keiro's awakeable): an id to hand to the outside world
// (in a step's outbox event, say), which completes it once with a value (CompleteAwakeableTx)
// or fails it (FailAwakeableTx). The id is random and journaled under label, so a replay
// returns the same id, and a new generation allocates a new one.
func NewAwakeable(c *Context, label string) (envelope.UUID, error) {
	if err := validateName("awakeable label", label); err != nil {
		return envelope.UUID{}, err
	}
	return step(c, awkPrefix+"new:"+label, func(ctx context.Context, tx pgx.Tx) (envelope.UUID, error) {
		id := envelope.NewUUIDv7()
		_, err := tx.Exec(ctx, c.e.q.InsertAwakeable, [16]byte(id), c.def.name, c.id, c.gen, awkPrefix+id.String())
		return id, err
	})
}

// AwaitAwakeable returns the value awakeable id was completed with, suspending the run until
// it is resolved. A failed awakeable returns *AwakeableFailedError, a cancelled one
// ErrAwakeableCancelled.
func AwaitAwakeable[V any](c *Context, id envelope.UUID) (V, error) {
	var zero V
	r, err := await[resolution](c, awkPrefix+id.String(), nil)
	if err != nil {
		return zero, err
	}
	switch r.Kind {
	case "failed":
		return zero, &AwakeableFailedError{Reason: r.Reason}
	case "cancelled":
		return zero, ErrAwakeableCancelled
	}
	return decode[V](awkPrefix+id.String(), r.Value)
}

// StartChild starts child workflow name/id with input, once (the spawn is a journaled step in
// whose transaction the child's row is inserted). A child that already exists is attached to;
// if it already finished its outcome is delivered at once. Cancelling the parent cancels its
// live children.
func StartChild(c *Context, name, id string, input any) error {
	_, err := step(c, childPrefix+"spawn:"+name+"/"+id, func(ctx context.Context, tx pgx.Tx) (bool, error) {
		started, err := c.e.startTx(ctx, tx, name, id, input, c.def.name, c.id)
		if err != nil || started {
			return started, err
		}
		inst, err := c.e.Instance(ctx, tx, name, id)
		if err != nil {
			return false, err
		}
		if inst.Status.Terminal() {
			if _, err := c.e.deliverTx(ctx, tx, c.def.name, c.id, childStep(name, id), resolutionOf(inst)); err != nil {
				return false, err
			}
		}
		return false, nil
	})
	return err
}

func childStep(name, id string) string { return childPrefix + name + "/" + id }

func resolutionOf(inst Instance) resolution {
	switch inst.Status {
	case StatusCompleted:
		return resolution{Kind: "ok", Value: inst.Result}
	case StatusFailed:
		return resolution{Kind: "failed", Reason: inst.LastError}
	}
	return resolution{Kind: "cancelled"}
}

// AwaitChild returns the result of child name/id (started with StartChild), suspending the run
// until the child ends. A failed child returns *ChildFailedError, a cancelled one
// ErrChildCancelled.
func AwaitChild[Out any](c *Context, name, id string) (Out, error) {
	var zero Out
	r, err := await[resolution](c, childStep(name, id), nil)
	if err != nil {
		return zero, err
	}
	switch r.Kind {
	case "failed":
		return zero, &ChildFailedError{Name: name, ID: id, Reason: r.Reason}
	case "cancelled":
		return zero, ErrChildCancelled
	}
	return decode[Out](childStep(name, id), r.Value)
}

// ContinueAsNew ends this generation and starts the next one with input (keiro's
// continueAsNew): the instance keeps its name and id, its generation is bumped, the finished
// generation's journal is dropped, and the function runs again from the start. The workflow
// function returns the error it returns.
func ContinueAsNew(c *Context, input any) error {
	if c.stopped != nil {
		return c.stopped
	}
	b, err := json.Marshal(input)
	if err != nil {
		return fmt.Errorf("continue workflow %s/%s as new: encode input: %w", c.def.name, c.id, err)
	}
	c.rotate = b
	return c.stop(errContinueAsNew)
}

// Patched reports whether patch id was active when this generation started (keiro's patch
// API): true for instances started after a deploy that registers it, false for instances in
// flight from before. The decision is journaled, so it never changes for an instance.
func Patched(c *Context, id string) (bool, error) {
	if err := validateName("patch id", id); err != nil {
		return false, err
	}
	return step(c, patchPrefix+id, func(context.Context, pgx.Tx) (bool, error) {
		raw, ok := c.journal[patchSetStep]
		if !ok {
			return false, nil
		}
		var set []string
		if err := json.Unmarshal(raw, &set); err != nil {
			return false, &StepDecodeError{Step: patchSetStep, Err: err}
		}
		for _, p := range set {
			if p == id {
				return true, nil
			}
		}
		return false, nil
	})
}

package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/internal/pgerr"
	"github.com/keiro-go/keiro/internal/pgtext"
)

// encodeJSON encodes v for a jsonb column, refusing what jsonb cannot store (a NUL character)
// with an error that says so rather than the database's.
func encodeJSON(v any) (json.RawMessage, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	if pgtext.JSONHasNUL(b) {
		return nil, errors.New("encode: the value holds a NUL character (\\u0000), which PostgreSQL jsonb cannot store; remove it or encode the bytes (base64)")
	}
	return b, nil
}

// maxErrorText bounds a stored error.
const maxErrorText = 4096

// Outcome is what a run did.
type Outcome uint8

const (
	// Skipped means nothing ran: the instance is leased by another live owner.
	Skipped Outcome = iota
	// Completed means the instance completed (now, or before: a direct run of a completed
	// instance runs nothing).
	Completed
	// Suspended means the run parked on something unresolved.
	Suspended
	// Retrying means the run failed and the instance waits for its next attempt.
	Retrying
	// Failed means the instance failed (its attempts ran out), now or before.
	Failed
	// Cancelled means the instance was cancelled, now or before.
	Cancelled
	// ContinuedAsNew means the run rotated the instance onto its next generation.
	ContinuedAsNew
	// Interrupted means the run's context ended mid-run: nothing was recorded beyond the
	// journaled steps, and the instance is resumed once its lease expires, as after a crash.
	Interrupted
)

// String returns the outcome's lower-case name.
func (o Outcome) String() string {
	switch o {
	case Skipped:
		return "skipped"
	case Completed:
		return "completed"
	case Suspended:
		return "suspended"
	case Retrying:
		return "retrying"
	case Failed:
		return "failed"
	case Cancelled:
		return "cancelled"
	case ContinuedAsNew:
		return "continued-as-new"
	case Interrupted:
		return "interrupted"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// claim is a leased instance.
type claim struct {
	name, id string
	gen      int
	input    json.RawMessage
	attempts int
	wakes    int64
	version  int64 // the instance's journal version at the claim
}

func scanClaim(r pgx.Row) (claim, error) {
	var c claim
	err := r.Scan(&c.name, &c.id, &c.gen, &c.input, &c.attempts, &c.wakes, &c.version)
	return c, err
}

// directOwner is the lease owner of RunInstance.
const directOwner = "direct"

// RunInstance runs instance name/id now in this process, whatever its wake time (keiro's
// runWorkflow on a known id): a completed, failed or cancelled instance runs nothing and
// reports its state; an instance leased by another live owner reports Skipped.
func (e *Engine) RunInstance(ctx context.Context, name, id string) (Outcome, error) {
	def, ok := e.definition(name)
	if !ok {
		return Skipped, fmt.Errorf("run workflow %s/%s: %w", name, id, ErrUnknownWorkflow)
	}
	now := e.cfg.Now()
	cl, err := scanClaim(e.db.QueryRow(ctx, e.q.ClaimOne, directOwner, now, name, id, now.Add(e.cfg.LeaseTTL)))
	if errors.Is(err, pgx.ErrNoRows) {
		inst, err := e.Instance(ctx, e.db, name, id)
		if err != nil {
			return Skipped, err
		}
		switch inst.Status {
		case StatusCompleted:
			return Completed, nil
		case StatusFailed:
			return Failed, nil
		case StatusCancelled:
			return Cancelled, nil
		}
		return Skipped, nil
	}
	if err != nil {
		return Skipped, fmt.Errorf("run workflow %s/%s: claim: %w", name, id, err)
	}
	return e.advance(ctx, def, cl, directOwner)
}

// advance runs a claimed instance and records what became of it.
func (e *Engine) advance(ctx context.Context, def *definition, cl claim, owner string) (out Outcome, err error) {
	ctx, span := e.tracer.Start(ctx, "workflow "+def.name, trace.WithAttributes(
		attribute.String(attrName, def.name), attribute.String(attrID, cl.id), attribute.Int("keiro.workflow.generation", cl.gen)))
	defer func() {
		span.SetAttributes(attribute.String("keiro.workflow.outcome", out.String()))
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	e.tel.active.Add(ctx, 1)
	defer e.tel.active.Add(ctx, -1)
	journal, version, err := e.hydrate(ctx, def.name, cl.id, cl.gen, cl.version)
	if err != nil {
		return Interrupted, err
	}
	c := &Context{Context: ctx, e: e, def: def, id: cl.id, gen: cl.gen, owner: owner, wakes: cl.wakes, journal: journal, version: version}
	var result json.RawMessage
	var runErr error
	if len(journal) == 0 && len(def.patches) > 0 {
		_, runErr = step(c, patchSetStep, func(context.Context, pgx.Tx) ([]string, error) { return def.patches, nil })
	}
	if runErr == nil {
		result, runErr = call(def, c, cl.input)
	}
	switch {
	case ctx.Err() != nil:
		return Interrupted, ctx.Err()
	case errors.Is(c.stopped, ErrCancelled):
		return Cancelled, nil
	case errors.Is(c.stopped, errContinueAsNew):
		return e.finish(ctx, ContinuedAsNew, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, e.q.Rotate, def.name, cl.id, cl.gen, c.rotate, e.cfg.Now()); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, e.q.DeleteGeneration, def.name, cl.id, cl.gen); err != nil {
				return err
			}
			return e.notify(ctx, tx)
		})
	case errors.Is(c.stopped, ErrSuspended):
		var at *time.Time
		if c.wakeAt != nil {
			at = c.wakeAt
		}
		return e.finish(ctx, Suspended, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, e.q.Suspend, def.name, cl.id, cl.gen, owner, cl.wakes, at)
			return err
		})
	case runErr != nil:
		reason := pgtext.Storable(runErr.Error(), maxErrorText)
		span.RecordError(runErr)
		if pgerr.Transient(runErr) {
			// The database failed the run, not the workflow: retry without using an attempt.
			e.tel.resumeErrors.Add(ctx, 1)
			at := e.cfg.Now().Add(e.cfg.Backoff.Delay(1))
			e.cfg.Logger.WarnContext(ctx, "keiro: workflow run met a transient database failure; it is retried", "workflow", def.name,
				"id", cl.id, "retry_at", at, "error", runErr)
			return e.finish(ctx, Retrying, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, e.q.Retry, def.name, cl.id, cl.gen, reason, at, 1)
				return err
			})
		}
		if cl.attempts >= e.cfg.MaxAttempts {
			e.tel.failed.Add(ctx, 1)
			e.cfg.Logger.ErrorContext(ctx, "keiro: workflow failed", "workflow", def.name, "id", cl.id, "attempts", cl.attempts, "error", runErr)
			return e.end(c, Failed, func(tx pgx.Tx) (int64, error) {
				return e.endTx(ctx, tx, e.q.Fail, def.name, cl.id, resolution{Kind: "failed", Reason: reason}, def.name, cl.id, cl.gen, reason)
			})
		}
		at := e.cfg.Now().Add(e.cfg.Backoff.Delay(cl.attempts))
		e.cfg.Logger.WarnContext(ctx, "keiro: workflow run failed; it is retried", "workflow", def.name, "id", cl.id,
			"attempt", cl.attempts, "retry_at", at, "error", runErr)
		return e.finish(ctx, Retrying, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, e.q.Retry, def.name, cl.id, cl.gen, reason, at, 0)
			return err
		})
	}
	e.tel.journal.Record(ctx, int64(len(c.journal)))
	return e.end(c, Completed, func(tx pgx.Tx) (int64, error) {
		return e.endTx(ctx, tx, e.q.Complete, def.name, cl.id, resolution{Kind: "ok", Value: result}, def.name, cl.id, cl.gen, string(StatusCompleted), result, nil)
	})
}

// end records a run's terminal outcome with fn, which returns the journal version the
// instance ended at (0: it had ended before), then writes the OnTerminal snapshot.
func (e *Engine) end(c *Context, out Outcome, fn func(tx pgx.Tx) (int64, error)) (Outcome, error) {
	var v int64
	out, err := e.finish(c, out, func(tx pgx.Tx) (err error) {
		v, err = fn(tx)
		return err
	})
	if err == nil && v > 0 && e.cfg.Snapshot.kind == snapshotTerminal {
		c.writeSnapshot(c, v)
	}
	return out, err
}

// call runs the workflow function, turning a panic into an error.
func call(def *definition, c *Context, input json.RawMessage) (out json.RawMessage, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("workflow %s/%s panicked: %v", def.name, c.id, r)
		}
	}()
	return def.run(c, input)
}

// finish records a run's end in one transaction.
func (e *Engine) finish(ctx context.Context, out Outcome, fn func(tx pgx.Tx) error) (Outcome, error) {
	if err := pgx.BeginFunc(ctx, e.db, fn); err != nil {
		return Interrupted, fmt.Errorf("record workflow outcome %s: %w", out, err)
	}
	return out, nil
}

// endTx ends an instance with sql (returning its parent and its journal version) and delivers
// res to the parent. It returns the journal version (0: the instance had ended meanwhile).
func (e *Engine) endTx(ctx context.Context, tx pgx.Tx, sql, name, id string, res resolution, args ...any) (int64, error) {
	var pn, pi *string
	var v int64
	err := tx.QueryRow(ctx, sql, args...).Scan(&pn, &pi, &v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil // cancelled meanwhile: a terminal row is never resurrected
	}
	if err != nil {
		return 0, err
	}
	if pn == nil || pi == nil {
		return v, nil
	}
	_, err = e.deliverTx(ctx, tx, *pn, *pi, childStep(name, id), res)
	return v, err
}

// deliverTx records step on the current generation of instance name/id and wakes it. It
// reports whether it recorded the step now (false: it was recorded before).
func (e *Engine) deliverTx(ctx context.Context, tx keiro.DB, name, id, step string, v any) (bool, error) {
	var gen int
	var st Status
	err := tx.QueryRow(ctx, e.q.Generation, name, id).Scan(&gen, &st)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("resolve step %s of workflow %s/%s: %w", step, name, id, ErrNotFound)
	}
	if err != nil {
		return false, fmt.Errorf("resolve step %s of workflow %s/%s: %w", step, name, id, err)
	}
	return e.recordTx(ctx, tx, name, id, gen, step, v)
}

// recordTx records step on generation gen and wakes the instance.
func (e *Engine) recordTx(ctx context.Context, tx keiro.DB, name, id string, gen int, step string, v any) (bool, error) {
	b, err := encodeJSON(v)
	if err != nil {
		return false, fmt.Errorf("resolve step %s of workflow %s/%s: %w", step, name, id, err)
	}
	rows, err := tx.Query(ctx, e.q.InsertStep, name, id, gen, step, b)
	if err != nil {
		return false, fmt.Errorf("resolve step %s of workflow %s/%s: %w", step, name, id, err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("resolve step %s of workflow %s/%s: %w", step, name, id, err)
	}
	if rows.CommandTag().RowsAffected() == 0 {
		return false, nil
	}
	if _, err := tx.Exec(ctx, e.q.Wake, name, id, e.cfg.Now()); err != nil {
		return false, fmt.Errorf("wake workflow %s/%s: %w", name, id, err)
	}
	return true, e.notify(ctx, tx)
}

// CompleteStepTx records value as the result of step of instance name/id in tx (keiro's
// external journal append), which resumes a run that awaits it (Await) once tx commits. It
// reports whether it recorded the step now: a second completion is a no-op that reports false
// and keeps the first value. An unknown instance is ErrNotFound.
func (e *Engine) CompleteStepTx(ctx context.Context, tx keiro.DB, name, id, step string, value any) (bool, error) {
	if err := checkStepName(step); err != nil {
		return false, fmt.Errorf("complete step of workflow %s/%s: %w", name, id, err)
	}
	return e.deliverTx(ctx, tx, name, id, step, value)
}

// CompleteAwakeableTx completes awakeable id with value in tx, exactly once: it reports false,
// and changes nothing, when the awakeable was already resolved; an unknown id is
// ErrNotFound. The awaiting run resumes once tx commits.
func (e *Engine) CompleteAwakeableTx(ctx context.Context, tx keiro.DB, id envelope.UUID, value any) (bool, error) {
	b, err := json.Marshal(value)
	if err != nil {
		return false, fmt.Errorf("complete awakeable %s: encode: %w", id, err)
	}
	return e.resolveAwakeable(ctx, tx, id, "completed", resolution{Kind: "ok", Value: b})
}

// FailAwakeableTx fails awakeable id with reason in tx, exactly once (see
// CompleteAwakeableTx): the awaiting run's AwaitAwakeable returns *AwakeableFailedError.
func (e *Engine) FailAwakeableTx(ctx context.Context, tx keiro.DB, id envelope.UUID, reason string) (bool, error) {
	return e.resolveAwakeable(ctx, tx, id, "failed", resolution{Kind: "failed", Reason: reason})
}

// CancelAwakeableTx cancels awakeable id in tx, exactly once (see CompleteAwakeableTx): the
// awaiting run's AwaitAwakeable returns ErrAwakeableCancelled.
func (e *Engine) CancelAwakeableTx(ctx context.Context, tx keiro.DB, id envelope.UUID) (bool, error) {
	return e.resolveAwakeable(ctx, tx, id, "cancelled", resolution{Kind: "cancelled"})
}

func (e *Engine) resolveAwakeable(ctx context.Context, tx keiro.DB, id envelope.UUID, status string, res resolution) (bool, error) {
	var name, wid, step string
	var gen int
	err := tx.QueryRow(ctx, e.q.ResolveAwakeable, [16]byte(id), status).Scan(&name, &wid, &gen, &step)
	if errors.Is(err, pgx.ErrNoRows) {
		var st string
		err := tx.QueryRow(ctx, e.q.AwakeableGet, [16]byte(id)).Scan(&name, &wid, &gen, &step, &st)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, fmt.Errorf("resolve awakeable %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return false, fmt.Errorf("resolve awakeable %s: %w", id, err)
		}
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("resolve awakeable %s: %w", id, err)
	}
	if _, err := e.recordTx(ctx, tx, name, wid, gen, step, res); err != nil {
		return false, err
	}
	return true, nil
}

// CancelTx cancels instance name/id and its live descendants in tx. A run in flight stops at
// its next step (which rolls back); pending awakeables are cancelled; a parent awaiting the
// instance gets ErrChildCancelled. It reports whether the instance was live.
func (e *Engine) CancelTx(ctx context.Context, tx keiro.DB, name, id string) (bool, error) {
	rows, err := tx.Query(ctx, e.q.Cancel, name, id)
	if err != nil {
		return false, fmt.Errorf("cancel workflow %s/%s: %w", name, id, err)
	}
	type row struct {
		name, id string
		pn, pi   *string
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.name, &x.id, &x.pn, &x.pi)
	})
	if err != nil {
		return false, fmt.Errorf("cancel workflow %s/%s: %w", name, id, err)
	}
	root := false
	for _, x := range got {
		if _, err := tx.Exec(ctx, e.q.CancelAwakeables, x.name, x.id); err != nil {
			return false, fmt.Errorf("cancel awakeables of workflow %s/%s: %w", x.name, x.id, err)
		}
		if x.name == name && x.id == id {
			root = true
			if x.pn != nil && x.pi != nil {
				if _, err := e.deliverTx(ctx, tx, *x.pn, *x.pi, childStep(name, id), resolution{Kind: "cancelled"}); err != nil && !errors.Is(err, ErrNotFound) {
					return false, err
				}
			}
		}
	}
	return root, nil
}

// IsSleepTimer reports whether t is a workflow sleep's timer (for a timer worker's Fire that
// serves process managers as well).
func IsSleepTimer(t events.Timer) bool { return t.ProcessManager == timerProcessManager }

// FireTimer is the events.FireFunc of workflow sleeps: it records the sleep as done in tx and
// wakes the instance; for an instance that is gone, ended or on another generation it does
// nothing (the sleep has no one left to wake). Timers of other process managers are an error; route them with
// IsSleepTimer.
func (e *Engine) FireTimer(ctx context.Context, tx pgx.Tx, t events.Timer) (envelope.UUID, error) {
	if !IsSleepTimer(t) {
		return envelope.UUID{}, fmt.Errorf("fire timer %s: process manager %q is not a workflow sleep", t.ID, t.ProcessManager)
	}
	var p sleepTimer
	if err := json.Unmarshal(t.Payload, &p); err != nil {
		return envelope.UUID{}, fmt.Errorf("fire timer %s: decode payload: %w", t.ID, err)
	}
	var gen int
	var st Status
	err := tx.QueryRow(ctx, e.q.Generation, p.Workflow, p.ID).Scan(&gen, &st)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && (gen != p.Generation || st.Terminal())) {
		return envelope.UUID{}, nil // nothing left to wake: the instance was collected, rotated or ended
	}
	if err != nil {
		return envelope.UUID{}, fmt.Errorf("fire timer %s: %w", t.ID, err)
	}
	if _, err := e.recordTx(ctx, tx, p.Workflow, p.ID, p.Generation, p.Step, p.FireAt); err != nil {
		return envelope.UUID{}, err
	}
	return envelope.UUID{}, nil
}

// GC deletes up to limit instances that ended before olderThan ago, with their journals and
// awakeables (keiro's workflow GC). A finished child is kept while its parent is live. It
// returns how many instances it deleted; call it until it returns less than limit.
func (e *Engine) GC(ctx context.Context, q keiro.DB, olderThan time.Duration, limit int) (int64, error) {
	if limit <= 0 || olderThan < 0 {
		return 0, fmt.Errorf("workflow gc: limit %d must be positive and olderThan %s not negative", limit, olderThan)
	}
	tag, err := q.Exec(ctx, e.q.GC, e.cfg.Now().Add(-olderThan), limit)
	if err != nil {
		return 0, fmt.Errorf("workflow gc: %w", err)
	}
	return tag.RowsAffected(), nil
}

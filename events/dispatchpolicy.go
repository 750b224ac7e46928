package events

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/internal/pgerr"
	"github.com/keiro-go/keiro/internal/pgtext"
)

// ErrDispatchHalted reports an input a router or process manager must not move past: a command
// failed for a reason a redelivery cannot cure (a rejected command under RejectedHalt, an
// undecodable input under InputHalt, a systemic failure such as an event id stored in another
// stream). Nothing of the input committed. From a subscription it stops Run at once, whatever
// its RetryPolicy; from the inbox it is marked inbox.Outage, so the consumer retries the
// message in place with backoff without counting attempts: its partition waits until the
// cause is fixed, and nothing is poisoned.
var ErrDispatchHalted = errors.New("dispatch halted")

// InputPolicy says what a router's or process manager's source adapter does with an input it
// cannot decode (keiro's PoisonPolicy).
type InputPolicy uint8

const (
	// InputHalt halts on the input (see ErrDispatchHalted). It is the default.
	InputHalt InputPolicy = iota
	// InputSkip calls DispatchPolicy.OnSkip and acknowledges the input: it is consumed and
	// nothing is dispatched.
	InputSkip
	// InputDeadLetter calls DispatchPolicy.OnSkip and hands the input to its source's dead
	// letters: the error is marked Permanent, so a subscription records a DeadLetter and moves
	// past it (under its PoisonDeadLetter) and the inbox poisons the message at once (the
	// consumer sends it to the dead-letter topic).
	InputDeadLetter
)

// String returns "halt", "skip" or "dead-letter".
func (p InputPolicy) String() string {
	switch p {
	case InputHalt:
		return "halt"
	case InputSkip:
		return "skip"
	case InputDeadLetter:
		return "dead-letter"
	}
	return "InputPolicy(" + strconv.Itoa(int(p)) + ")"
}

// RejectedPolicy says what a router or process manager does when a target refuses a command
// (ErrCommandRejected): running it again on the same state would give the same answer.
type RejectedPolicy uint8

const (
	// RejectedHalt halts on the input (ErrDispatchHalted): nothing of it commits. It is the
	// default.
	RejectedHalt RejectedPolicy = iota
	// RejectedDeadLetter records each rejected command as a DispatchDeadLetter in the
	// input's transaction (once, whatever the redeliveries) and acknowledges the input: the
	// other commands commit.
	RejectedDeadLetter
	// RejectedSkip acknowledges the input without recording the rejected commands (they are
	// counted in keiro.dispatch.deadlettered, as keiro does).
	RejectedSkip
)

// String returns "halt", "dead-letter" or "skip".
func (p RejectedPolicy) String() string {
	switch p {
	case RejectedHalt:
		return "halt"
	case RejectedDeadLetter:
		return "dead-letter"
	case RejectedSkip:
		return "skip"
	}
	return "RejectedPolicy(" + strconv.Itoa(int(p)) + ")"
}

// DispatchPolicy says how a router's or process manager's source adapters (EventHandler,
// InboxHandler) treat failures. A transient failure (a version conflict that outlived the
// runner's retries, a lost connection, a serialisation failure or deadlock, a pool or server
// out of resources) is returned for the source to deliver the input again with its own
// backoff: a subscription under its RetryPolicy (dead-lettering past MaxDeliveries), the
// inbox consumer as an inbox.Outage (no attempt counted). Any other failure that is not a rejection (systemic:
// the same input would fail the same way) halts.
type DispatchPolicy struct {
	// OnPoison applies to an input whose decoding failed. Defaults to InputHalt.
	OnPoison InputPolicy
	// OnSkip is called for an input InputSkip or InputDeadLetter sets aside, with the
	// source's id and the decode error, before the source acknowledges it (to log it or count
	// it; it runs again if the source's transaction then fails and the input comes back).
	// Defaults to none.
	OnSkip func(ctx context.Context, source DispatchSource, err error)
	// OnRejected applies when a target rejects a command. Defaults to RejectedHalt.
	OnRejected RejectedPolicy
}

func (p DispatchPolicy) validate() error {
	var errs []error
	if p.OnPoison > InputDeadLetter {
		errs = append(errs, fmt.Errorf("OnPoison: unknown policy %d; use InputHalt, InputSkip or InputDeadLetter", p.OnPoison))
	}
	if p.OnRejected > RejectedSkip {
		errs = append(errs, fmt.Errorf("OnRejected: unknown policy %d; use RejectedHalt, RejectedDeadLetter or RejectedSkip", p.OnRejected))
	}
	return errors.Join(errs...)
}

// DispatchSource identifies the input a dispatch came from.
type DispatchSource struct {
	// EventID is the id of the source event (RecordedEvent.ID), or of the integration message
	// (InboxSourceID). It is part of every deterministic command id, so it must be the same on
	// every delivery.
	EventID envelope.UUID
	// GlobalPosition is the source event's global position when it came from the event
	// store; 0 otherwise.
	GlobalPosition int64
}

// InboxSourceID is the source id of an integration event: its message id when that is a
// UUID, else the UUIDv5 (URL namespace) of the length-prefixed fields "keiro", "message",
// the source context and the message id. Message ids are stable across publish retries, so
// every delivery of a message dispatches under the same id.
func InboxSourceID(ev envelope.Event) envelope.UUID {
	if u, err := envelope.ParseUUID(ev.MessageID); err == nil && !u.IsZero() {
		return u
	}
	return uuidV5(uuidNamespaceURL, lengthPrefixed("keiro", "message", ev.Source, ev.MessageID))
}

// lengthPrefixed concatenates fields as "<byte length>:<bytes>" each, keiro's unambiguous
// encoding of an id's name.
func lengthPrefixed(fields ...string) []byte {
	var name []byte
	for _, f := range fields {
		name = strconv.AppendInt(name, int64(len(f)), 10)
		name = append(name, ':')
		name = append(name, f...)
	}
	return name
}

// Dispatcher kinds, stored in DispatchDeadLetter.Kind.
const (
	// DispatcherRouter is a Router's dead letter.
	DispatcherRouter = "router"
	// DispatcherProcessManager is a process manager's dead letter.
	DispatcherProcessManager = "process-manager"
)

// Dispatch error classes (keiro's commandErrorClass), stored in DispatchDeadLetter.ErrorClass.
const (
	// ErrorClassCommandRejected: the target's Decide refused the command.
	ErrorClassCommandRejected = "command_rejected"
)

// DispatchDeadLetter is a command a router or process manager parked under
// RejectedDeadLetter.
type DispatchDeadLetter struct {
	// ID identifies the dead letter.
	ID int64 `json:"id"`
	// Kind is DispatcherRouter or DispatcherProcessManager.
	Kind string `json:"kind"`
	// Dispatcher is the router's or process manager's name.
	Dispatcher string `json:"dispatcher"`
	// CorrelationID is the router's key or the process manager's correlation id.
	CorrelationID string `json:"correlation_id"`
	// SourceEventID and SourceGlobalPosition (0: not from the event store) identify the input.
	SourceEventID        envelope.UUID `json:"source_event_id"`
	SourceGlobalPosition int64         `json:"source_global_position,omitempty"`
	// EmitIndex is the command's position in the dispatch (-1: a process manager's own event).
	EmitIndex int `json:"emit_index"`
	// TargetStream is the stream the command addressed, and CommandID its deterministic id.
	TargetStream string        `json:"target_stream"`
	CommandID    envelope.UUID `json:"command_id"`
	// ErrorClass is ErrorClassCommandRejected; Error is the rejection's text (at most 1024
	// bytes).
	ErrorClass string `json:"error_class"`
	Error      string `json:"error"`
	// CreatedAt is when the dead letter was recorded.
	CreatedAt time.Time `json:"created_at"`
}

// ListDispatchDeadLetters lists the dispatch dead letters of dispatcher (all dispatchers when
// it is ""), newest first, at most limit rows (100 when limit is 0).
func (s *Store) ListDispatchDeadLetters(ctx context.Context, q keiro.DB, dispatcher string, limit int) ([]DispatchDeadLetter, error) {
	if limit == 0 {
		limit = 100
	}
	if limit < 0 {
		return nil, fmt.Errorf("list dispatch dead letters: limit %d is negative", limit)
	}
	rows, err := q.Query(ctx, s.q.dispatchDeadList, dispatcher, limit)
	if err != nil {
		return nil, fmt.Errorf("list dispatch dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DispatchDeadLetter, error) {
		var d DispatchDeadLetter
		var src, cmd [16]byte
		var pos *int64
		err := r.Scan(&d.ID, &d.Kind, &d.Dispatcher, &d.CorrelationID, &src, &pos, &d.EmitIndex,
			&d.TargetStream, &cmd, &d.ErrorClass, &d.Error, &d.CreatedAt)
		d.SourceEventID, d.CommandID = envelope.UUID(src), envelope.UUID(cmd)
		if pos != nil {
			d.SourceGlobalPosition = *pos
		}
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("list dispatch dead letters: %w", err)
	}
	return out, nil
}

// failureKind classifies a dispatch failure.
type failureKind uint8

const (
	failureSystemic failureKind = iota
	failureTransient
	failureRejected
)

// classify sorts err into keiro's three classes: rejections (the target refused the command),
// transient failures (worth delivering the input again) and the rest (systemic).
func classify(err error) failureKind {
	switch {
	case errors.Is(err, ErrCommandRejected):
		return failureRejected
	case isTransient(err):
		return failureTransient
	}
	return failureSystemic
}

// isTransient reports whether err may pass if the input is delivered again: a version
// conflict (also after the runner's retries), a connection that broke or could not be made,
// a cancelled or timed-out context, or a PostgreSQL error of the connection, resource,
// serialisation, deadlock or operator-intervention classes.
func isTransient(err error) bool {
	return errors.Is(err, ErrWrongExpectedVersion) || pgerr.Transient(err)
}

// emitted is one dispatched command and its position in the dispatch.
type emitted struct {
	index  int
	result CommandResult
}

// settle is keiro's decideForFailures for one input's results, in the input's transaction db:
// a systemic failure halts; else a transient one is returned for a redelivery; else the
// rejections follow p.OnRejected. It returns nil when the input may be acknowledged.
func (s *Store) settle(ctx context.Context, db keiro.DB, kind, name, correlation string, src DispatchSource, res []emitted, p DispatchPolicy) error {
	var transient, rejected []emitted
	for _, e := range res {
		if e.result.Outcome != CommandFailed {
			continue
		}
		s.metrics.dispatchFailed.Add(ctx, 1)
		switch classify(e.result.Err) {
		case failureSystemic:
			return halt(kind, name, correlation, src, e.result.Err)
		case failureTransient:
			transient = append(transient, e)
		case failureRejected:
			rejected = append(rejected, e)
		}
	}
	if len(transient) > 0 {
		errs := make([]error, len(transient))
		for i, e := range transient {
			errs[i] = e.result.Err
		}
		return fmt.Errorf("%s %s: input %s (%s): deliver it again: %w", kind, name, src.EventID, correlation, errors.Join(errs...))
	}
	if len(rejected) == 0 {
		return nil
	}
	switch p.OnRejected {
	case RejectedDeadLetter:
		var pos *int64
		if src.GlobalPosition > 0 {
			pos = &src.GlobalPosition
		}
		for _, e := range rejected {
			_, err := db.Exec(ctx, s.q.dispatchDeadInsert, kind, name, correlation, [16]byte(src.EventID), pos, e.index,
				e.result.Stream, [16]byte(e.result.CommandID), ErrorClassCommandRejected, pgtext.Storable(e.result.Err.Error(), maxErrorText))
			if err != nil {
				return fmt.Errorf("%s %s: record dead letter of command %s to %s: %w", kind, name, e.result.CommandID, e.result.Stream, err)
			}
		}
	case RejectedSkip:
	default:
		return halt(kind, name, correlation, src, rejected[0].result.Err)
	}
	s.metrics.dispatchDeadLettered.Add(ctx, int64(len(rejected)))
	return nil
}

// halt is the error that stops a source on an input.
func halt(kind, name, correlation string, src DispatchSource, err error) error {
	return &haltError{fmt.Errorf("%s %s: %w on input %s (%s): %w", kind, name, ErrDispatchHalted, src.EventID, correlation, err)}
}

// handleInput decodes an input and dispatches it in tx, applying p to the failures. decode
// errors follow p.OnPoison; dispatch's own error (a Resolve that failed) is transient or halts.
func handleInput[I any](ctx context.Context, s *Store, tx pgx.Tx, kind, name string, src DispatchSource, p DispatchPolicy,
	decode func() (I, error), dispatch func(ctx context.Context, db keiro.DB, src DispatchSource, in I) (string, []emitted, error)) error {
	in, err := decode()
	if err != nil {
		s.metrics.dispatchPoison.Add(ctx, 1)
		err = fmt.Errorf("%s %s: decode input %s: %w", kind, name, src.EventID, err)
		switch p.OnPoison {
		case InputSkip, InputDeadLetter:
			if p.OnSkip != nil {
				p.OnSkip(ctx, src, err)
			}
			if p.OnPoison == InputDeadLetter {
				return Permanent(err)
			}
			return nil
		default:
			return &haltError{fmt.Errorf("%w: %w", ErrDispatchHalted, err)}
		}
	}
	correlation, res, err := dispatch(ctx, tx, src, in)
	if err != nil {
		s.metrics.dispatchFailed.Add(ctx, 1)
		if classify(err) == failureTransient {
			return err
		}
		return halt(kind, name, correlation, src, err)
	}
	return s.settle(ctx, tx, kind, name, correlation, src, res, p)
}

// forInbox translates a dispatch's verdict for the inbox: a halt or a transient failure is an
// outage (retried in place, no attempt counted); a permanent error poisons the message.
func forInbox(err error) error {
	if err == nil || IsPermanent(err) {
		return err
	}
	return inbox.Outage(err)
}

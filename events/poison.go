package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"

	"github.com/keiro-go/keiro/internal/backoff"
	"github.com/keiro-go/keiro/internal/pgtext"
	"github.com/keiro-go/keiro/tracing"
)

// errMoved reports that the checkpoint moved under the worker (Rebuild): the worker drops what
// it was doing and continues from the stored checkpoint.
var errMoved = errors.New("checkpoint moved")

// isolate handles a batch whose handler failed with err: it delivers the batch's events again
// one transaction each, so the events before the failing one commit; the failing one is
// delivered up to RetryPolicy.MaxDeliveries times with backoff, then dead-lettered (the
// checkpoint moves past it and the rest of the batch follows) or, under PoisonHalt, returned as
// Run's error. A failed delivery of a Handler's event, or of a one-event batch, counts as
// that event's first delivery; a failed batch of several events counts for none of them.
func (l *lane) isolate(ctx context.Context, batch []RecordedEvent, err error) error {
	s := l.s
	failed := int64(-1)
	var ee *eventError
	if errors.As(err, &ee) {
		failed = ee.position
	} else if len(batch) == 1 {
		failed = batch[0].GlobalPosition
	}
	for _, e := range batch {
		if e.GlobalPosition <= l.cp {
			continue
		}
		deliveries, last := 0, err
		var heldSince, heldLogged time.Time
		if e.GlobalPosition == failed && !errors.Is(err, ErrReadModelFenced) {
			deliveries = 1
		}
		for {
			if deliveries > 0 && isHalt(last) {
				return fmt.Errorf("run subscription %s: halted on event %s (%s@%d, position %d): %w",
					s.cfg.Name, e.ID, e.StreamName, e.StreamVersion, e.GlobalPosition, last)
			}
			if deliveries > 0 {
				if IsPermanent(last) || deliveries >= s.cfg.Retry.MaxDeliveries {
					if err := l.poison(ctx, e, last, deliveries); err != nil {
						if errors.Is(err, errMoved) {
							return nil
						}
						return err
					}
					break
				}
				s.retried.Add(ctx, 1, s.nameAttr)
				s.cfg.Logger.WarnContext(ctx, "keiro: subscription handler failed; delivering the event again",
					"subscription", s.cfg.Name, "position", e.GlobalPosition, "event_id", e.ID.String(),
					"delivery", deliveries, "max_deliveries", s.cfg.Retry.MaxDeliveries, "error", last)
				if err := backoff.Sleep(ctx, s.cfg.Retry.delay(deliveries)); err != nil {
					return err
				}
			}
			herr, err := l.deliver(ctx, e)
			if errors.Is(err, errMoved) {
				return nil
			}
			if err != nil {
				return err
			}
			if herr == nil {
				break
			}
			if errors.Is(herr, ErrReadModelFenced) {
				// The read model is being rebuilt (or is not registered at all): hold the event,
				// uncounted, until it is live. Said at once, then again every heldLogEvery while
				// it lasts, since a model that is never registered holds the subscription for good.
				now := time.Now()
				if heldSince.IsZero() {
					heldSince = now
				}
				if heldLogged.IsZero() || now.Sub(heldLogged) >= heldLogEvery {
					heldLogged = now
					s.cfg.Logger.WarnContext(ctx, "keiro: subscription holds an event until its read model is live "+
						"(a rebuild under way, or a read model that is not registered)",
						"subscription", s.cfg.Name, "position", e.GlobalPosition, "held_for", now.Sub(heldSince).Round(time.Second),
						"error", herr)
				}
				if err := backoff.Sleep(ctx, s.cfg.PollInterval); err != nil {
					return err
				}
				continue
			}
			deliveries, last = deliveries+1, herr
		}
	}
	return nil
}

// heldLogEvery is how often a subscription held by a fenced read model says so again.
const heldLogEvery = time.Minute

// deliver applies one event in its own transaction with the checkpoint. herr is the handler's
// error (the transaction rolled back); err is any other failure.
func (l *lane) deliver(ctx context.Context, e RecordedEvent) (herr, err error) {
	s := l.s
	err = l.inCheckpointTx(ctx, e.GlobalPosition, func(tx pgx.Tx) error {
		if err := s.apply(ctx, tx, []RecordedEvent{e}); err != nil {
			herr = err
			return err
		}
		return nil
	})
	if herr != nil && ctx.Err() == nil {
		return herr, nil
	}
	return nil, err
}

// poison applies RetryPolicy.OnPoison to e after deliveries failed deliveries ending in last.
func (l *lane) poison(ctx context.Context, e RecordedEvent, last error, deliveries int) error {
	s := l.s
	class := ErrorClassMaxDeliveries
	if IsPermanent(last) {
		class = ErrorClassPermanent
	}
	if s.cfg.Retry.OnPoison == PoisonHalt {
		return fmt.Errorf("run subscription %s: halted on event %s (%s@%d, position %d) after %d deliveries (%s; "+
			"Retry.OnPoison is halt): fix the handler and run again, the event will be delivered first: %w",
			s.cfg.Name, e.ID, e.StreamName, e.StreamVersion, e.GlobalPosition, deliveries, class, last)
	}
	text := errorText(last)
	err := l.inCheckpointTx(ctx, e.GlobalPosition, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, s.store.q.deadInsert, s.cfg.Name, e.GlobalPosition, [16]byte(e.ID), e.StreamName,
			e.StreamVersion, e.Type, class, text, deliveries)
		if err != nil {
			return fmt.Errorf("run subscription %s: record dead letter for position %d: %w", s.cfg.Name, e.GlobalPosition, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.deadLettered.Add(ctx, 1, s.nameAttr)
	s.cfg.Logger.ErrorContext(ctx, "keiro: subscription dead-lettered an event and moved past it",
		"subscription", s.cfg.Name, "position", e.GlobalPosition, "event_id", e.ID.String(), "stream", e.StreamName,
		"deliveries", deliveries, "class", class, "error", text)
	return nil
}

// inCheckpointTx runs fn in a transaction that locks the checkpoint, then saves it at next and
// commits. It returns errMoved if the checkpoint is not where the lane left it.
func (l *lane) inCheckpointTx(ctx context.Context, next int64, fn func(tx pgx.Tx) error) error {
	tx, err := l.lockCheckpoint(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	return l.commitCheckpoint(ctx, tx, next)
}

// replayDeadLetters delivers every dead letter an operator asked to replay (Store.RequestReplay),
// one transaction each: success marks the row replayed in the handler's transaction; a failure
// rolls back and puts the row back to dead with the new error and one more attempt. The
// checkpoint does not move.
func (l *lane) replayDeadLetters(ctx context.Context) error {
	for ctx.Err() == nil {
		more, err := l.replayOne(ctx)
		if err != nil || !more {
			return err
		}
	}
	return nil
}

func (l *lane) replayOne(ctx context.Context) (more bool, err error) {
	s := l.s
	tx, err := l.conn.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("run subscription %s: begin replay: %w", s.cfg.Name, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var id, pos int64
	if err := tx.QueryRow(ctx, s.store.q.deadNextReplay, s.cfg.Name).Scan(&id, &pos); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return false, fmt.Errorf("run subscription %s: find dead letters to replay: %w", s.cfg.Name, err)
	}
	var e *RecordedEvent
	for ev, err := range s.store.readLogPage(ctx, tx, pos-1, pos, "", 1) {
		if err != nil {
			return false, fmt.Errorf("run subscription %s: read dead-lettered event at %d: %w", s.cfg.Name, pos, err)
		}
		e = &ev
	}
	var herr error
	if e == nil {
		herr = fmt.Errorf("the event at global position %d no longer exists", pos)
	} else if herr = s.apply(context.WithValue(ctx, deadLetterReplayKey{}, true), tx, []RecordedEvent{*e}); herr == nil {
		if _, err := tx.Exec(ctx, s.store.q.deadReplayed, id); err != nil {
			return false, fmt.Errorf("run subscription %s: mark dead letter %d replayed: %w", s.cfg.Name, id, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return false, fmt.Errorf("run subscription %s: commit replay of dead letter %d: %w", s.cfg.Name, id, err)
		}
		s.replayed.Add(ctx, 1, metric.WithAttributes(tracing.SubscriptionNameKey.String(s.cfg.Name), tracing.OutcomeKey.String("replayed")))
		s.cfg.Logger.InfoContext(ctx, "keiro: dead letter replayed", "subscription", s.cfg.Name, "dead_letter_id", id, "position", pos)
		l.after(l.cp)
		return true, nil
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	_ = tx.Rollback(context.WithoutCancel(ctx))
	class := ErrorClassMaxDeliveries
	if IsPermanent(herr) {
		class = ErrorClassPermanent
	}
	if _, err := l.conn.Exec(ctx, s.store.q.deadReplayFailed, id, class, errorText(herr)); err != nil {
		return false, fmt.Errorf("run subscription %s: record failed replay of dead letter %d: %w", s.cfg.Name, id, err)
	}
	s.replayed.Add(ctx, 1, metric.WithAttributes(tracing.SubscriptionNameKey.String(s.cfg.Name), tracing.OutcomeKey.String("failed")))
	s.cfg.Logger.WarnContext(ctx, "keiro: dead letter replay failed; it stays dead", "subscription", s.cfg.Name,
		"dead_letter_id", id, "position", pos, "error", herr)
	l.after(l.cp)
	return true, nil
}

// errorText is err's message as a dead letter stores it: NUL bytes and invalid UTF-8 (which a
// text column refuses, so the dead letter could never be recorded) become U+FFFD, and the text
// is cut to maxErrorText bytes on a character boundary.
func errorText(err error) string {
	return pgtext.Storable(err.Error(), maxErrorText)
}

// haltError marks a handler error that must stop the subscription at once, whatever the
// policy (the producer's identity conflict: a changed mapper meets all of history, which must
// not be dead-lettered event by event).
type haltError struct{ err error }

func (e *haltError) Error() string { return e.err.Error() }
func (e *haltError) Unwrap() error { return e.err }

func isHalt(err error) bool {
	var h *haltError
	return errors.As(err, &h)
}

// deadLetterReplayKey marks the context of a dead letter's replay delivery.
type deadLetterReplayKey struct{}

// IsDeadLetterReplay reports whether ctx is the context of a handler call that replays a dead
// letter (Store.RequestReplay) rather than a delivery in log order.
func IsDeadLetterReplay(ctx context.Context) bool {
	v, _ := ctx.Value(deadLetterReplayKey{}).(bool)
	return v
}

package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/permanent"
)

// Subscription retry defaults (keiro's kiroku RetryPolicy: five deliveries).
const (
	// DefaultMaxDeliveries is the number of times a subscription hands an event to its handler
	// before it gives up on it.
	DefaultMaxDeliveries = 5
	// DefaultDeliveryBackoff is the wait before an event's second delivery; it doubles for every
	// further one, up to DefaultMaxDeliveryBackoff.
	DefaultDeliveryBackoff = 100 * time.Millisecond
	// DefaultMaxDeliveryBackoff caps the wait between deliveries.
	DefaultMaxDeliveryBackoff = 5 * time.Second
)

// PoisonPolicy says what a subscription does with an event its handler failed on
// RetryPolicy.MaxDeliveries times.
type PoisonPolicy uint8

const (
	// PoisonDeadLetter records the event in the subscription's dead letters (with the error's
	// class and text and the number of deliveries) in the transaction that moves the checkpoint
	// past it, and goes on with the next event. It is the default.
	PoisonDeadLetter PoisonPolicy = iota
	// PoisonHalt stops the subscription: Run returns the handler's error and the checkpoint
	// stays before the event, which the next Run delivers again. For consumers that need strict
	// order more than progress.
	PoisonHalt
)

// String returns "dead-letter" or "halt".
func (p PoisonPolicy) String() string {
	switch p {
	case PoisonDeadLetter:
		return "dead-letter"
	case PoisonHalt:
		return "halt"
	}
	return fmt.Sprintf("PoisonPolicy(%d)", uint8(p))
}

// RetryPolicy bounds the deliveries of an event whose handler fails.
type RetryPolicy struct {
	// MaxDeliveries is how many times an event is handed to the handler, in its own
	// transaction, before OnPoison applies. Defaults to DefaultMaxDeliveries.
	MaxDeliveries int
	// Backoff spaces the deliveries: the wait before delivery n+1 is
	// min(Max, Initial·Multiplier^(n−1)) with equal jitter (drawn from its upper half). A
	// negative Backoff.Initial means no wait. Defaults to {DefaultDeliveryBackoff,
	// DefaultMaxDeliveryBackoff, 2}.
	Backoff keiro.Backoff
	// OnPoison says what happens after the last failed delivery. Defaults to PoisonDeadLetter.
	OnPoison PoisonPolicy
}

func (p *RetryPolicy) applyDefaults() {
	if p.MaxDeliveries == 0 {
		p.MaxDeliveries = DefaultMaxDeliveries
	}
	p.Backoff = p.Backoff.WithDefaults(keiro.Backoff{Initial: DefaultDeliveryBackoff, Max: DefaultMaxDeliveryBackoff, Multiplier: keiro.DefaultMultiplier})
}

func (p *RetryPolicy) validate() error {
	var errs []error
	if p.MaxDeliveries < 1 {
		errs = append(errs, fmt.Errorf("Retry.MaxDeliveries: %d is not positive", p.MaxDeliveries))
	}
	if err := p.Backoff.Validate("Retry.Backoff"); err != nil {
		errs = append(errs, err)
	}
	if p.OnPoison != PoisonDeadLetter && p.OnPoison != PoisonHalt {
		errs = append(errs, fmt.Errorf("Retry.OnPoison: unknown policy %d; use PoisonDeadLetter or PoisonHalt", p.OnPoison))
	}
	return errors.Join(errs...)
}

// delay returns the wait before delivery n+1 (n ≥ 1 deliveries made).
func (p *RetryPolicy) delay(n int) time.Duration { return p.Backoff.Delay(n) }

// Permanent wraps a handler error to say that delivering the event again cannot succeed (an
// event the handler can never apply): the subscription applies RetryPolicy.OnPoison at once,
// without the remaining deliveries. Permanent(nil) is nil. It is the same marker as
// inbox.Permanent: the error's text is "permanent: " and err's.
func Permanent(err error) error { return permanent.Wrap(err) }

// IsPermanent reports whether err's chain holds an error marked permanent: wrapped by
// Permanent here or by inbox.Permanent, or any error with a Permanent() bool method that
// returns true (one marker serves a handler used by both a subscription and a consumer).
func IsPermanent(err error) bool { return permanent.Is(err) }

// Dead-letter error classes, stored in DeadLetter.ErrorClass.
const (
	// ErrorClassMaxDeliveries: the handler failed on every one of RetryPolicy.MaxDeliveries
	// deliveries.
	ErrorClassMaxDeliveries = "max_deliveries_exceeded"
	// ErrorClassPermanent: the handler returned an error wrapped by Permanent.
	ErrorClassPermanent = "permanent"
)

// maxErrorText bounds the stored error text (keiro stores 1024 characters of detail).
const maxErrorText = 1024

// DeadLetter statuses.
const (
	// DeadLetterDead is a parked event.
	DeadLetterDead = "dead"
	// DeadLetterReplay is an event an operator asked the running subscription to deliver again.
	DeadLetterReplay = "replay"
	// DeadLetterReplayed is an event a replay delivered successfully.
	DeadLetterReplayed = "replayed"
)

// DeadLetter is an event a subscription gave up on and moved past.
type DeadLetter struct {
	// ID identifies the dead letter (increasing in the order events were dead-lettered).
	ID int64 `json:"id"`
	// Subscription is the subscription's name.
	Subscription string `json:"subscription"`
	// GlobalPosition, EventID, StreamName, StreamVersion and EventType identify the event.
	GlobalPosition int64         `json:"global_position"`
	EventID        envelope.UUID `json:"event_id"`
	StreamName     string        `json:"stream_name"`
	StreamVersion  int64         `json:"stream_version"`
	EventType      string        `json:"event_type"`
	// ErrorClass is ErrorClassMaxDeliveries or ErrorClassPermanent.
	ErrorClass string `json:"error_class"`
	// Error is the handler's last error text (at most 1024 bytes).
	Error string `json:"error"`
	// Attempts is the number of deliveries made, replays included.
	Attempts int `json:"attempts"`
	// Status is DeadLetterDead, DeadLetterReplay or DeadLetterReplayed.
	Status string `json:"status"`
	// DeadLetteredAt is when the subscription moved past the event.
	DeadLetteredAt time.Time `json:"dead_lettered_at"`
	// ReplayedAt is when a replay delivered the event successfully, if it did.
	ReplayedAt *time.Time `json:"replayed_at,omitempty"`
}

// DeadLetterFilter selects dead letters for ListDeadLetters.
type DeadLetterFilter struct {
	// Subscription restricts the list to one subscription. Defaults to "" (all).
	Subscription string
	// Status restricts the list to one status (DeadLetterDead, DeadLetterReplay,
	// DeadLetterReplayed). Defaults to "" (all).
	Status string
	// AfterID lists only dead letters with a larger ID (paging). Defaults to 0.
	AfterID int64
	// Limit caps the number of rows. Defaults to 100.
	Limit int
}

// ListDeadLetters lists dead letters in ID order (oldest first), filtered by f.
func (s *Store) ListDeadLetters(ctx context.Context, q keiro.DB, f DeadLetterFilter) ([]DeadLetter, error) {
	if f.Limit == 0 {
		f.Limit = 100
	}
	if f.Limit < 0 {
		return nil, fmt.Errorf("list dead letters: Limit %d is negative", f.Limit)
	}
	switch f.Status {
	case "", DeadLetterDead, DeadLetterReplay, DeadLetterReplayed:
	default:
		return nil, fmt.Errorf("list dead letters: unknown status %q; use dead, replay or replayed", f.Status)
	}
	rows, err := q.Query(ctx, s.q.deadList, f.Subscription, f.Status, f.AfterID, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		var id [16]byte
		err := r.Scan(&d.ID, &d.Subscription, &d.GlobalPosition, &id, &d.StreamName, &d.StreamVersion,
			&d.EventType, &d.ErrorClass, &d.Error, &d.Attempts, &d.Status, &d.DeadLetteredAt, &d.ReplayedAt)
		d.EventID = envelope.UUID(id)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// RequestReplay asks the running instance of subscription to deliver its dead letters ids
// again (all of its dead letters in status dead when ids is empty), and wakes it. The handler
// runs in the subscription's process, in a transaction that marks the row replayed on success;
// a failing replay puts the row back to dead with the new error and one more attempt. Replays
// are delivered out of log order, one transaction each. It returns the number of rows
// requested; rows not in status dead are left alone.
func (s *Store) RequestReplay(ctx context.Context, q keiro.DB, subscription string, ids ...int64) (int64, error) {
	if subscription == "" {
		return 0, errors.New("request dead-letter replay: subscription name is required")
	}
	if ids == nil {
		ids = []int64{}
	}
	var n, notified int64
	if err := q.QueryRow(ctx, s.q.deadRequest, subscription, ids, len(ids) == 0).Scan(&n, &notified); err != nil {
		return 0, fmt.Errorf("request dead-letter replay of %s: %w", subscription, err)
	}
	return n, nil
}

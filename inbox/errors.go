package inbox

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keiro-go/keiro/internal/permanent"
)

// ErrDedupePolicyUnsatisfied reports a delivery from which the configured [DedupePolicy] cannot
// compute a key (for example SourceEventIdentity on an event with neither a source event id nor
// a global position). It is returned as an error, not as a [Result]; errors.As to
// *[DedupePolicyError] for the policy's name.
var ErrDedupePolicyUnsatisfied = errors.New("inbox: dedupe policy unsatisfied")

// DedupePolicyError is the typed form of [ErrDedupePolicyUnsatisfied]: it names the policy and
// what was missing.
type DedupePolicyError struct {
	// Policy is the name of the policy that could not be satisfied.
	Policy string
	// Reason says what the delivery lacked.
	Reason string
}

// Error implements error.
func (e *DedupePolicyError) Error() string {
	return fmt.Sprintf("inbox: dedupe policy %s unsatisfied: %s", e.Policy, e.Reason)
}

// Is makes errors.Is(err, ErrDedupePolicyUnsatisfied) hold.
func (e *DedupePolicyError) Is(target error) bool { return target == ErrDedupePolicyUnsatisfied }

// ErrTxAborted is a handler failure: the handler returned nil, but an SQL error inside it had
// already aborted the transaction, so nothing it did (nor the inbox row) was committed. keiro
// reported such a delivery as processed; this package records a failed attempt instead.
var ErrTxAborted = errors.New("inbox: handler returned nil but its transaction was aborted by an SQL error; its effects were discarded")

// ErrHandlerRolledBack is a handler failure: the handler rolled back the inbox transaction
// itself (keiro's "condemn"). Its effects were discarded and a failed attempt is recorded.
var ErrHandlerRolledBack = errors.New("inbox: handler rolled back the inbox transaction; its effects were discarded")

// ErrTxOwned is returned to a handler that calls Commit on the transaction it was given: the
// inbox owns that transaction and commits it, together with the dedupe row, after the handler
// returns. Nested transactions (tx.Begin, savepoints) may be committed freely.
var ErrTxOwned = errors.New("inbox: the handler's transaction is committed by the inbox, not by the handler")

// ErrNotFound reports that no inbox row matches the given consumer, source and dedupe key.
var ErrNotFound = errors.New("inbox: row not found")

// PanicError is a handler failure caused by a panic inside the handler. The panic is recovered,
// the transaction rolled back, and the failure recorded like any other handler error.
type PanicError struct {
	// Value is the value passed to panic.
	Value any
	// Stack is the goroutine's stack at the point of the panic.
	Stack []byte
}

// Error implements error.
func (e *PanicError) Error() string { return fmt.Sprintf("inbox: handler panicked: %v", e.Value) }

// Unwrap returns the panic value when it is an error.
func (e *PanicError) Unwrap() error {
	if err, ok := e.Value.(error); ok {
		return err
	}
	return nil
}

// Permanent marks err as permanent: a handler that returns it is not retried; its delivery is
// poisoned at once (the consumer runner dead-letters it). Permanent(nil) is nil. A schema
// decoder hook may use it as well to say the payload itself is bad.
//
// It is the same marker as events.Permanent: the error's text is "permanent: " and err's.
func Permanent(err error) error { return permanent.Wrap(err) }

// IsPermanent reports whether err, or any error it wraps, is marked permanent: with
// [Permanent], with events.Permanent, or by a Permanent() bool method that returns true (one
// marker serves a handler used by both a consumer and a subscription).
func IsPermanent(err error) bool { return permanent.Is(err) }

// OutageError is a handler failure caused by something other than the message: a dependency
// of the handler is down or overloaded (an HTTP target refusing connections or answering 503,
// a database function being replaced). Create it with [Outage] or [OutageRetryAfter]. The
// message is not at fault, so no attempt is used: [Store.Process] rolls back and reports
// [Deferred], and the consumer runner waits with backoff (at least RetryAfter) and retries the
// message, for as long as the outage lasts.
type OutageError struct {
	// Err is the failure.
	Err error
	// RetryAfter, when positive, is the least time to wait before retrying, as the dependency
	// asked (an HTTP Retry-After).
	RetryAfter time.Duration
}

// Error implements error.
func (e *OutageError) Error() string { return "outage: " + e.Err.Error() }

// Unwrap returns the failure.
func (e *OutageError) Unwrap() error { return e.Err }

// Outage marks err as an outage of a dependency of the handler (see [OutageError]). Outage(nil)
// is nil. [Permanent] wins over it: Permanent(Outage(err)) poisons the message.
func Outage(err error) error {
	if err == nil {
		return nil
	}
	return &OutageError{Err: err}
}

// OutageRetryAfter is [Outage] with the least delay before a retry (a negative or zero after
// means none). OutageRetryAfter(nil, …) is nil.
func OutageRetryAfter(err error, after time.Duration) error {
	if err == nil {
		return nil
	}
	return &OutageError{Err: err, RetryAfter: max(after, 0)}
}

// IsOutage reports whether err, or any error it wraps, was marked with [Outage] and not with
// [Permanent].
func IsOutage(err error) bool {
	var o *OutageError
	return errors.As(err, &o) && !IsPermanent(err)
}

// IsContention reports a PostgreSQL error caused by concurrent transactions rather than by the
// message: SQLSTATE class 40 (serialization failure, deadlock) or 55P03 (lock not available,
// such as a lock_timeout), unless err was marked with [Permanent]. Such a handler failure uses
// no attempt ([Deferred]) until the consumer runner's ConsumerConfig.MaxContentionRetries are
// spent; after that it counts as an ordinary failure.
func IsContention(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "40") || pe.Code == "55P03") && !IsPermanent(err)
}

// deferral classifies a handler failure that uses no attempt: contention or an outage (with
// the delay the dependency asked for). It returns deferNone for every other failure.
func deferral(err error) (deferKind, time.Duration) {
	if err == nil || IsPermanent(err) {
		return deferNone, 0
	}
	var o *OutageError
	if errors.As(err, &o) {
		return deferOutage, o.RetryAfter
	}
	if IsContention(err) {
		return deferContention, 0
	}
	return deferNone, 0
}

type deferKind int

const (
	deferNone deferKind = iota
	deferContention
	deferOutage
)

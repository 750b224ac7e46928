package events

import (
	"errors"
	"fmt"
)

// ErrWrongExpectedVersion reports an append whose expected version did not match the stream.
// The concrete error is *WrongExpectedVersionError. The command runner retries on it.
var ErrWrongExpectedVersion = errors.New("wrong expected version")

// ErrEventIDConflict reports an append that reuses event ids already stored with different
// content (another stream, type, schema version or data), or a batch only part of which is
// stored. Nothing is appended.
var ErrEventIDConflict = errors.New("event id already stored with different content")

// ErrRetryExhausted reports a command that met a version conflict on every attempt. The
// concrete error is *RetryExhaustedError, which unwraps to the last conflict.
var ErrRetryExhausted = errors.New("command retries exhausted")

// ErrCommandRejected reports a command its aggregate refused (Decider.Decide returned an
// error): running it again on the same state gives the same answer. The concrete error is
// *RejectedError, which unwraps to Decide's error.
var ErrCommandRejected = errors.New("command rejected")

// ErrUnknownEventType reports a stored event whose type no codec case knows.
var ErrUnknownEventType = errors.New("unknown event type")

// ErrHydrationGap reports a stream whose stored versions are not contiguous.
var ErrHydrationGap = errors.New("gap in stream versions")

// WrongExpectedVersionError is the error of an append whose expected version did not hold.
type WrongExpectedVersionError struct {
	// Stream is the stream appended to.
	Stream string
	// Expected is the expectation that failed.
	Expected ExpectedVersion
	// Actual is the stream's version when the append ran (0: the stream does not exist).
	Actual int64
}

// Error implements error.
func (e *WrongExpectedVersionError) Error() string {
	return fmt.Sprintf("append to %s: expected %s, stream is at version %d", e.Stream, e.Expected, e.Actual)
}

// Is reports whether target is ErrWrongExpectedVersion.
func (e *WrongExpectedVersionError) Is(target error) bool { return target == ErrWrongExpectedVersion }

// RetryExhaustedError is the error of a command that conflicted on every attempt.
type RetryExhaustedError struct {
	// Stream is the command's stream.
	Stream string
	// Attempts is the number of attempts made (RetryLimit + 1).
	Attempts int
	// Last is the last conflict.
	Last error
}

// Error implements error.
func (e *RetryExhaustedError) Error() string {
	return fmt.Sprintf("command on %s: %d attempts all conflicted: %v", e.Stream, e.Attempts, e.Last)
}

// Is reports whether target is ErrRetryExhausted.
func (e *RetryExhaustedError) Is(target error) bool { return target == ErrRetryExhausted }

// Unwrap returns the last conflict.
func (e *RetryExhaustedError) Unwrap() error { return e.Last }

// RejectedError is the error of a command its aggregate refused.
type RejectedError struct {
	// Stream is the command's stream.
	Stream string
	// Err is Decide's error.
	Err error
}

// Error implements error.
func (e *RejectedError) Error() string {
	return fmt.Sprintf("command on %s rejected: %v", e.Stream, e.Err)
}

// Is reports whether target is ErrCommandRejected.
func (e *RejectedError) Is(target error) bool { return target == ErrCommandRejected }

// Unwrap returns Decide's error.
func (e *RejectedError) Unwrap() error { return e.Err }

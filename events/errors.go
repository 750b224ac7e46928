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

// ErrReadModelUnregistered reports a query of a read model that has no registry row: register
// it at startup with ReadModels.Register (queries never register). The concrete error is
// *ReadModelUnregisteredError.
var ErrReadModelUnregistered = errors.New("read model not registered")

// ErrReadModelStaleSchema reports a query whose read model definition (version or shape hash)
// differs from the registered one: rebuild the model (ReadModels.StartRebuild) to move the
// registry to the new definition. The concrete error is *ReadModelStaleSchemaError.
var ErrReadModelStaleSchema = errors.New("read model schema is stale")

// ErrReadModelNotLive reports a query of a read model whose status is not live (rebuilding,
// paused, abandoned or a status this version does not know). The concrete error is
// *ReadModelNotLiveError.
var ErrReadModelNotLive = errors.New("read model not live")

// ErrReadModelWaitTimeout reports a query whose consistency wait ended before the read
// model's subscription reached the target. The concrete error is *ReadModelWaitTimeoutError.
var ErrReadModelWaitTimeout = errors.New("read model wait timed out")

// ErrRebuildProducedNoApplies reports a FinishRebuild refused because the replay applied no
// event although the log holds events after the replay position: the model stays offline
// rather than going live empty. The concrete error is *RebuildProducedNoAppliesError.
var ErrRebuildProducedNoApplies = errors.New("rebuild applied no events")

// ErrReadModelFenced is the error of a ReadModels.Handler delivery whose read model is not
// live (a rebuild is in progress): nothing was written and the checkpoint did not move. A
// subscription holds the event and delivers it again, without counting the delivery, until
// the model is live.
var ErrReadModelFenced = errors.New("read model fenced: not live")

// ReadModelUnregisteredError is the error of a query of an unregistered read model.
type ReadModelUnregisteredError struct {
	// Name is the read model's name.
	Name string
}

// Error implements error.
func (e *ReadModelUnregisteredError) Error() string {
	return fmt.Sprintf("read model %s is not registered: call ReadModels.Register at startup", e.Name)
}

// Is reports whether target is ErrReadModelUnregistered.
func (e *ReadModelUnregisteredError) Is(target error) bool { return target == ErrReadModelUnregistered }

// ReadModelStaleSchemaError is the error of a query whose definition differs from the
// registered schema identity.
type ReadModelStaleSchemaError struct {
	// Name is the read model's name.
	Name string
	// ExpectedVersion and FoundVersion are the definition's and the registry's versions.
	ExpectedVersion, FoundVersion int64
	// ExpectedShapeHash and FoundShapeHash are the definition's and the registry's shape hashes.
	ExpectedShapeHash, FoundShapeHash string
}

// Error implements error.
func (e *ReadModelStaleSchemaError) Error() string {
	return fmt.Sprintf("read model %s: definition is version %d, shape %q; registry has version %d, shape %q: rebuild the model",
		e.Name, e.ExpectedVersion, e.ExpectedShapeHash, e.FoundVersion, e.FoundShapeHash)
}

// Is reports whether target is ErrReadModelStaleSchema.
func (e *ReadModelStaleSchemaError) Is(target error) bool { return target == ErrReadModelStaleSchema }

// ReadModelNotLiveError is the error of a query of a read model that is not live.
type ReadModelNotLiveError struct {
	// Name is the read model's name.
	Name string
	// Status is the registry's status, as stored (an unknown status keeps its raw text).
	Status ReadModelStatus
}

// Error implements error.
func (e *ReadModelNotLiveError) Error() string {
	if !e.Status.Known() {
		return fmt.Sprintf("read model %s is not live: unknown status %q", e.Name, string(e.Status))
	}
	return fmt.Sprintf("read model %s is not live: %s", e.Name, e.Status)
}

// Is reports whether target is ErrReadModelNotLive.
func (e *ReadModelNotLiveError) Is(target error) bool { return target == ErrReadModelNotLive }

// ReadModelWaitTimeoutError is the error of a consistency wait that timed out.
type ReadModelWaitTimeoutError struct {
	// Name is the read model's name.
	Name string
	// Target is the global position waited for.
	Target int64
	// LastObserved is the subscription's progress when the wait gave up.
	LastObserved int64
}

// Error implements error.
func (e *ReadModelWaitTimeoutError) Error() string {
	return fmt.Sprintf("read model %s: subscription did not reach position %d in time (last observed %d)",
		e.Name, e.Target, e.LastObserved)
}

// Is reports whether target is ErrReadModelWaitTimeout.
func (e *ReadModelWaitTimeoutError) Is(target error) bool { return target == ErrReadModelWaitTimeout }

// RebuildProducedNoAppliesError is the error of a FinishRebuild refused by the zero-apply
// guard.
type RebuildProducedNoAppliesError struct {
	// Name is the read model's name.
	Name string
	// Head is the log's head when the guard ran.
	Head int64
}

// Error implements error.
func (e *RebuildProducedNoAppliesError) Error() string {
	return fmt.Sprintf("rebuild of read model %s applied no events although the log reaches position %d: "+
		"the model stays rebuilding; replay with ApplyUnfencedTx, or AbandonRebuild", e.Name, e.Head)
}

// Is reports whether target is ErrRebuildProducedNoApplies.
func (e *RebuildProducedNoAppliesError) Is(target error) bool {
	return target == ErrRebuildProducedNoApplies
}

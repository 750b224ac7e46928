package workflow

import (
	"errors"
	"fmt"
)

// ErrSuspended is returned by Await, Sleep, AwaitAwakeable and AwaitChild when what they wait
// for is not resolved yet: the run parks, journaling no completion, and resumes when a wake
// source resolves it. A workflow function returns it (or an error wrapping it) as it is; the
// engine suspends the run even if the function drops it, and every later call of the run
// returns it again.
var ErrSuspended = errors.New("workflow suspended")

// ErrCancelled is returned by the run's next step once its instance was cancelled (CancelTx):
// the step's transaction rolls back, nothing more runs.
var ErrCancelled = errors.New("workflow cancelled")

// ErrNotFound reports a workflow instance or awakeable that does not exist.
var ErrNotFound = errors.New("workflow not found")

// ErrUnknownWorkflow reports a workflow name with no registered function.
var ErrUnknownWorkflow = errors.New("workflow name not registered")

// ErrChildCancelled is returned by AwaitChild when the child was cancelled.
var ErrChildCancelled = errors.New("child workflow cancelled")

// ErrAwakeableCancelled is returned by AwaitAwakeable when the awakeable was cancelled.
var ErrAwakeableCancelled = errors.New("awakeable cancelled")

// errContinueAsNew ends a run that called ContinueAsNew.
var errContinueAsNew = errors.New("workflow continues as new")

// StepDecodeError reports a recorded step result that does not decode into the type the step
// expects now (the step's result type changed incompatibly: a programmer error).
type StepDecodeError struct {
	// Step is the step's name.
	Step string
	// Err is the decoder's error.
	Err error
}

// Error returns "decode recorded result of step <step>: <err>".
func (e *StepDecodeError) Error() string {
	return fmt.Sprintf("decode recorded result of step %s: %v", e.Step, e.Err)
}

// Unwrap returns Err.
func (e *StepDecodeError) Unwrap() error { return e.Err }

// AwakeableFailedError is returned by AwaitAwakeable when the outside world failed the
// awakeable (FailAwakeableTx).
type AwakeableFailedError struct {
	// Reason is the failure's reason, as given.
	Reason string
}

// Error returns "awakeable failed: <reason>".
func (e *AwakeableFailedError) Error() string { return "awakeable failed: " + e.Reason }

// ChildFailedError is returned by AwaitChild when the child failed (its attempts ran out).
type ChildFailedError struct {
	// Name and ID identify the child.
	Name, ID string
	// Reason is the child's last error.
	Reason string
}

// Error returns "child workflow <name>/<id> failed: <reason>".
func (e *ChildFailedError) Error() string {
	return fmt.Sprintf("child workflow %s/%s failed: %s", e.Name, e.ID, e.Reason)
}

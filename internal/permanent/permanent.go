// Package permanent is keiro's one marker of a failure that retrying cannot fix. inbox.Permanent
// and events.Permanent wrap with it, and inbox.IsPermanent and events.IsPermanent recognise it
// (and any error with a Permanent() bool method), so one marker serves a handler used by both a
// consumer and a subscription.
package permanent

import "errors"

// Error marks its error permanent.
type Error struct{ err error }

// Error returns "permanent: " followed by the wrapped error's text.
func (e *Error) Error() string { return "permanent: " + e.err.Error() }

// Unwrap returns the wrapped error.
func (e *Error) Unwrap() error { return e.err }

// Permanent reports true: the marker that Is looks for.
func (e *Error) Permanent() bool { return true }

// Wrap marks err permanent. Wrap(nil) is nil.
func Wrap(err error) error {
	if err == nil {
		return nil
	}
	return &Error{err: err}
}

// Is reports whether err's chain holds an error whose Permanent() bool method returns true:
// one made by Wrap or a caller's own type.
func Is(err error) bool {
	var p interface{ Permanent() bool }
	return errors.As(err, &p) && p.Permanent()
}

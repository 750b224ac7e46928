package pgconfig

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// ConnectError shortens a failed connection's error to one line. pgx tries every address of
// the host, and with the default sslmode=prefer each of them twice (TLS, then plaintext), and
// reports every attempt on a line of its own; the last attempt says what went wrong. The result
// names the user and database, the last attempt's address (host:port) and its cause, and still
// unwraps to the *pgconn.ConnectError. Errors of other kinds are returned as they are.
func ConnectError(err error) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return err
	}
	inner, prefix := ce.Unwrap(), ""
	if _, ok := inner.(interface{ Unwrap() []error }); !ok {
		// "hostname resolving error: " wraps the joined lookups.
		if w := errors.Unwrap(inner); w != nil {
			if _, ok := w.(interface{ Unwrap() []error }); ok {
				prefix, inner = strings.TrimSuffix(inner.Error(), w.Error()), w
			}
		}
	}
	attempts := []error{inner}
	if j, ok := inner.(interface{ Unwrap() []error }); ok && len(j.Unwrap()) > 0 {
		attempts = j.Unwrap()
	}
	last := oneLine(attempts[len(attempts)-1].Error())
	msg := fmt.Sprintf("failed to connect to `user=%s database=%s`: %s%s", ce.Config.User, ce.Config.Database, prefix, last)
	if n := len(attempts); n > 1 {
		msg += fmt.Sprintf(" (the last of %d attempts)", n)
	}
	return &connectError{msg: msg, err: err}
}

// oneLine joins the lines of a message (a resolver error may still hold several).
func oneLine(s string) string {
	s = strings.ReplaceAll(strings.TrimSpace(s), "\n\t", "; ")
	return strings.ReplaceAll(s, "\n", "; ")
}

type connectError struct {
	msg string
	err error
}

func (e *connectError) Error() string { return e.msg }
func (e *connectError) Unwrap() error { return e.err }

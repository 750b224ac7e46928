// Package pgerr classifies database errors for the retry decisions of keiro's loops.
package pgerr

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// Transient reports whether err may pass if the work is tried again: a connection that broke or
// could not be made, a cancelled or timed-out context, or a PostgreSQL error of the connection,
// resource, serialisation, deadlock or operator-intervention classes.
func Transient(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || pgconn.SafeToRetry(err) {
		return true
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && len(pe.Code) == 5 {
		switch pe.Code[:2] {
		case "08", "53", "57": // connection exception, insufficient resources, operator intervention
			return true
		case "40": // serialization_failure, deadlock_detected
			return pe.Code == "40001" || pe.Code == "40P01"
		}
	}
	return false
}

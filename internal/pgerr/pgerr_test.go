package pgerr_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keiro-go/keiro/internal/pgerr"
)

func TestTransient(t *testing.T) {
	for err, want := range map[error]bool{
		context.Canceled:                                true,
		fmt.Errorf("x: %w", io.ErrUnexpectedEOF):        true,
		&pgconn.PgError{Code: "40001"}:                  true,
		&pgconn.PgError{Code: "40P01"}:                  true,
		&pgconn.PgError{Code: "08006"}:                  true,
		&pgconn.PgError{Code: "57P01"}:                  true,
		&pgconn.PgError{Code: "53300"}:                  true,
		&pgconn.PgError{Code: "40002"}:                  false,
		&pgconn.PgError{Code: "42P01"}:                  false,
		&pgconn.PgError{Code: "23505"}:                  false,
		errors.New("handler said no"):                   false,
		fmt.Errorf("w: %w", &pgconn.PgError{Code: "4"}): false,
	} {
		if got := pgerr.Transient(err); got != want {
			t.Errorf("Transient(%v) = %v, want %v", err, got, want)
		}
	}
}

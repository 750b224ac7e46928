// Package pgdb names the one database handle that keiro's packages take. The public names
// outbox.Querier, inbox.DB and events.DB are aliases of [DB], so one handle serves every
// package.
package pgdb

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB runs statements and begins transactions: a *pgxpool.Pool, a *pgx.Conn and a pgx.Tx (whose
// Begin opens a savepoint) satisfy it. Functions with the Tx suffix run in the caller's
// transaction when given a pgx.Tx; the others begin their own when they need one.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

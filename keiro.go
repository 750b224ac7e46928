// Package keiro holds the two types every keiro package shares: [DB], the database handle
// that outbox, inbox and events take, and [Backoff], the retry delay of each of their loops.
//
// The packages that do the work are [github.com/keiro-go/keiro/outbox] (a producer's
// transactional outbox and the relay that publishes it to Kafka),
// [github.com/keiro-go/keiro/inbox] (a consumer's deduplicating inbox) and
// [github.com/keiro-go/keiro/events] (the in-transaction layer: event store, commands,
// projections, routers, process managers and timers); [github.com/keiro-go/keiro/workflow]
// runs durable workflows on the same tables and transactions.
package keiro

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

// Package retention runs the consumer's retention of completed inbox rows: small batches, each
// in its own transaction under a transaction-scoped advisory lock per (schema, consumer), so
// that one consumer instance at a time deletes and no session keeps a lock between statements
// (retention is safe behind PgBouncer in transaction mode: a session lock would stay on
// whichever server connection took it, and retention would never run again).
package retention

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/internal/advisorylock"
)

// MaxBatchesPerPass bounds one pass, so a large backlog of old completed rows is worked down
// over several maintenance intervals instead of one long pass.
const MaxBatchesPerPass = 100

// sqlLock tries the retention lock of consumer $2 in schema $1 (advisorylock.InboxRetention).
var sqlLock = `SELECT pg_try_advisory_xact_lock(` + advisorylock.InboxRetention(`$1`, `$2`) + `)`

// Pass deletes completed rows of consumer in schema through del, which deletes at most batch
// rows in tx and returns how many it deleted. Each batch runs in its own transaction that
// first tries the retention lock; the pass stops when another instance holds it, when a batch
// deletes fewer than batch rows, or after MaxBatchesPerPass batches. It returns the rows
// deleted.
func Pass(ctx context.Context, db keiro.DB, schema, consumer string, batch int,
	del func(ctx context.Context, tx pgx.Tx, batch int) (int64, error)) (int64, error) {
	var total int64
	for range MaxBatchesPerPass {
		var n int64
		locked := false
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, sqlLock, schema, consumer).Scan(&locked); err != nil {
				return fmt.Errorf("take retention lock: %w", err)
			}
			if !locked {
				return nil // another instance is on it
			}
			var err error
			n, err = del(ctx, tx, batch)
			return err
		})
		total += n
		if err != nil || !locked || n < int64(batch) {
			return total, err
		}
	}
	return total, nil
}

package events

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// errLeaseLost reports that a sharded subscription's worker no longer holds the lease of the
// bucket it was handling (it expired, and another worker may have taken the bucket): the
// transaction was rolled back, and the worker stops handling the bucket.
var errLeaseLost = errors.New("bucket lease lost")

// checkpointRow is where a lane's checkpoint is stored. lock takes the row's lock in tx and
// returns the stored checkpoint (errLeaseLost if the caller may no longer write it); save
// writes next in tx (errLeaseLost if the write affected nothing).
type checkpointRow interface {
	lock(ctx context.Context, tx pgx.Tx) (int64, error)
	save(ctx context.Context, tx pgx.Tx, next int64) error
}

// lane is one checkpoint a worker advances through the log, and the one place a subscription's
// transaction begins and ends: a batch, a redelivery and a dead-lettering each lock the
// checkpoint's row, apply, save the checkpoint and commit. An unsharded subscription has one
// lane; a sharded subscription's worker has one per bucket it holds. Both share the retry and
// dead-letter logic (poison.go) through it.
type lane struct {
	s     *Subscription
	conn  *pgx.Conn
	cp    int64
	row   checkpointRow
	after func(next int64) // after every committed transaction, with the checkpoint
	// bucket is the lane's bucket of a sharded subscription (-1 otherwise), for logs.
	bucket int
}

// handle applies batch (positions after cp, in order; possibly empty) in one transaction that
// moves the checkpoint to next. If the handler fails, the batch is delivered again event by
// event under the subscription's RetryPolicy (isolate).
func (l *lane) handle(ctx context.Context, batch []RecordedEvent, next int64) error {
	tx, err := l.lockCheckpoint(ctx)
	if errors.Is(err, errMoved) {
		return nil // Rebuild reset the checkpoint (or an operator moved it): continue from there
	}
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if len(batch) > 0 {
		if err := l.s.apply(ctx, tx, batch); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return l.isolate(ctx, batch, err)
		}
	}
	return l.commitCheckpoint(ctx, tx, next)
}

// lockCheckpoint begins the transaction of a subscription step: it holds the checkpoint's row
// lock, so that no other worker and no Rebuild moves the checkpoint meanwhile. If the
// checkpoint is no longer where the lane left it, the transaction is rolled back, the lane
// follows the checkpoint (moved) and the error is errMoved.
func (l *lane) lockCheckpoint(ctx context.Context) (pgx.Tx, error) {
	tx, err := l.conn.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("run subscription %s: begin: %w", l.s.cfg.Name, err)
	}
	stored, err := l.row.lock(ctx, tx)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("run subscription %s: %w", l.s.cfg.Name, err)
	}
	if stored != l.cp {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		l.moved(ctx, stored)
		return nil, errMoved
	}
	return tx, nil
}

// commitCheckpoint saves next as the checkpoint in tx, commits it, and advances the lane (and
// AfterCommit) past it: the one way a subscription's transaction ends in success.
func (l *lane) commitCheckpoint(ctx context.Context, tx pgx.Tx, next int64) error {
	if err := l.row.save(ctx, tx, next); err != nil {
		return fmt.Errorf("run subscription %s: %w", l.s.cfg.Name, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("run subscription %s: commit: %w", l.s.cfg.Name, err)
	}
	l.cp = next
	l.after(next)
	return nil
}

// moved adopts a checkpoint that Rebuild (or an operator) changed under the running instance.
func (l *lane) moved(ctx context.Context, stored int64) {
	args := []any{"subscription", l.s.cfg.Name, "from", l.cp, "to", stored}
	if l.bucket >= 0 {
		args = append(args, "bucket", l.bucket)
	}
	l.s.cfg.Logger.InfoContext(ctx, "keiro: subscription checkpoint moved; continuing from it", args...)
	l.cp = stored
	if l.bucket < 0 {
		l.s.position.Store(stored)
	}
}

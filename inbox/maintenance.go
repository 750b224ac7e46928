package inbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/inbox/internal/retention"
)

// maintain samples the backlog gauge and runs retention every MaintenanceInterval.
func (c *Consumer) maintain(ctx context.Context) {
	t := time.NewTicker(c.cfg.MaintenanceInterval)
	defer t.Stop()
	attrs := c.in.consumerAttrs(c.cfg.Store.Consumer)
	for {
		c.measureLag(ctx)
		if n, err := c.store.CountFailed(ctx, c.pool); err == nil {
			c.in.backlog.Record(ctx, n, attrs)
		} else if ctx.Err() == nil {
			c.log.WarnContext(ctx, "sample inbox backlog", "error", err)
		}
		if c.cfg.Retention > 0 {
			if err := c.retain(ctx); err != nil && ctx.Err() == nil {
				c.log.WarnContext(ctx, "inbox retention", "error", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// retain deletes completed rows past the retention (inbox/internal/retention), one small
// batch per transaction under the retention lock.
func (c *Consumer) retain(ctx context.Context) error {
	total, err := retention.Pass(ctx, c.pool, c.store.cfg.Schema, c.store.cfg.Consumer, DefaultDeleteBatch,
		func(ctx context.Context, tx pgx.Tx, batch int) (int64, error) {
			return c.store.deleteCompletedBatch(ctx, tx, c.cfg.Retention, batch)
		})
	if total > 0 {
		c.log.InfoContext(ctx, "inbox retention deleted completed rows", "rows", total, "older_than", c.cfg.Retention)
	}
	return err
}

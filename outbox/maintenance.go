package outbox

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"
)

// maxRetentionBatchesPerPass bounds one maintenance pass, so a huge backlog of old sent rows
// is worked down over several passes instead of one long one.
const maxRetentionBatchesPerPass = 100

// maintain runs a maintenance pass every MaintenanceInterval (and once at start).
func (r *Relay) maintain(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := r.MaintenancePass(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("outbox maintenance failed", "err", err)
		}
		t.Reset(r.cfg.MaintenanceInterval)
	}
}

// MaintenanceResult reports one maintenance pass.
type MaintenanceResult struct {
	// Ran is false when another relay held the maintenance lock (nothing was done).
	Ran bool
	// Deleted is the number of sent rows removed by retention.
	Deleted int64
	// Backlog, OldestPendingAge and Dead are the sampled gauges.
	Backlog          int64
	OldestPendingAge time.Duration
	Dead             int64
}

// maintenanceLockKey is the session advisory lock that makes one relay per schema at a time
// run maintenance.
func (r *Relay) maintenanceLockKey() int64 {
	h := fnv.New64a()
	h.Write([]byte("keiro.outbox.maintenance." + r.cfg.Schema))
	return int64(h.Sum64())
}

// MaintenancePass runs one maintenance pass now if no other relay is running one: it deletes
// sent rows older than Retention (RetentionBatch per statement) and samples the backlog,
// oldest-pending-age and dead gauges. Run calls it every MaintenanceInterval; it is exported
// for tests and operators.
func (r *Relay) MaintenancePass(ctx context.Context) (MaintenanceResult, error) {
	var res MaintenanceResult
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return res, fmt.Errorf("outbox maintenance: acquire connection: %w", err)
	}
	defer conn.Release()
	key := r.maintenanceLockKey()
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&got); err != nil {
		return res, fmt.Errorf("outbox maintenance: take lock: %w", err)
	}
	if !got {
		return res, nil
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", key); err != nil {
			conn.Conn().Close(context.WithoutCancel(ctx)) // closing the session drops the lock
		}
	}()
	res.Ran = true
	if r.cfg.Retention >= 0 {
		for range maxRetentionBatchesPerPass {
			tag, err := conn.Exec(ctx, r.store.q.retention, r.cfg.Retention.Microseconds(), r.cfg.RetentionBatch)
			if err != nil {
				return res, fmt.Errorf("outbox maintenance: delete sent rows past retention: %w", err)
			}
			res.Deleted += tag.RowsAffected()
			if tag.RowsAffected() < int64(r.cfg.RetentionBatch) {
				break
			}
		}
	}
	var age float64
	if err := conn.QueryRow(ctx, r.store.q.gauges).Scan(&res.Backlog, &age, &res.Dead); err != nil {
		return res, fmt.Errorf("outbox maintenance: sample gauges: %w", err)
	}
	res.OldestPendingAge = time.Duration(age * float64(time.Second))
	r.inst.backlog.Record(ctx, res.Backlog)
	r.inst.oldestAge.Record(ctx, age)
	r.inst.dead.Record(ctx, res.Dead)
	return res, nil
}

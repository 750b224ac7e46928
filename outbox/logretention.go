package outbox

import (
	"context"
	"fmt"
)

// logRetention is log mode's part of a maintenance pass: it records retention's mark (the time
// and the WAL position, once a minute) and deletes the rows of keiro_outbox_log older than
// Retention that every log-mode slot of the schema has confirmed (the lowest confirmed position
// of Store.LogSlots, the relay's own slot among them: with per-destination relays, the slowest
// slot holds the rows back), RetentionBatch per statement (sqlq's sqlLogRetention says what
// confirmed means), and only rows of destinations some slot publishes (coveredDestinations).
// got is false when another relay held the maintenance lock key.
func (r *Relay) logRetention(ctx context.Context, key int64) (deleted int64, got bool, err error) {
	var n int64
	if err := r.pool.QueryRow(ctx, r.store.q.LogMark, key).Scan(&got, &n); err != nil {
		return 0, false, fmt.Errorf("outbox maintenance: record the log retention mark: %w", err)
	}
	if !got {
		return 0, false, nil
	}
	covered, err := r.coveredDestinations(ctx)
	if err != nil {
		return 0, false, err
	}
	for range maxRetentionBatchesPerPass {
		if err := r.pool.QueryRow(ctx, r.store.q.LogRetention, r.cfg.Retention.Microseconds(),
			r.cfg.RetentionBatch, key, r.cfg.LogSlot, covered).Scan(&got, &n); err != nil {
			return deleted, false, fmt.Errorf("outbox maintenance: delete keiro_outbox_log rows past retention: %w", err)
		}
		if !got {
			return deleted, false, nil
		}
		deleted += n
		if n < int64(r.cfg.RetentionBatch) {
			break
		}
	}
	return deleted, true, nil
}

// coveredDestinations are the destinations some existing log-mode slot of the schema
// publishes: nil when one publishes them all. With per-destination slots only, the rows of
// any other destination were published by no slot, and retention keeps them (a group that
// names the destination later republishes them with Store.RecoverLogFor).
func (r *Relay) coveredDestinations(ctx context.Context) ([]string, error) {
	slots, err := r.store.LogSlots(ctx, r.pool)
	if err != nil {
		return nil, fmt.Errorf("outbox maintenance: %w", err)
	}
	covered := []string{}
	for _, s := range slots {
		if !s.Exists {
			continue
		}
		if len(s.Destinations) == 0 {
			return nil, nil
		}
		covered = append(covered, s.Destinations...)
	}
	return covered, nil
}

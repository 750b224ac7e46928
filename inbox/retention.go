package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/keiro-go/keiro"
)

// Defaults of retention.
const (
	// DefaultRetention is the dedupe window: completed rows older than this are deleted by
	// the consumer's maintenance. A redelivery after the window runs the handler again.
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultDeleteBatch is how many rows one retention statement deletes.
	DefaultDeleteBatch = 1000
)

// DeleteCompleted deletes the consumer's completed rows that completed more than olderThan
// ago, batch rows per statement (each its own short transaction, to keep locks and WAL bursts
// small), and returns how many it deleted. Failed rows are kept for operators.
//
// The retention defines the dedupe window: a message redelivered after its row was deleted is
// processed again. Keep olderThan well above the longest redelivery delay you expect (topic
// retention when offsets can be rewound, replays of dead-letter topics).
func (s *Store) DeleteCompleted(ctx context.Context, db keiro.DB, olderThan time.Duration, batch int) (int64, error) {
	if batch <= 0 {
		batch = DefaultDeleteBatch
	}
	var total int64
	for {
		n, err := s.deleteCompletedBatch(ctx, db, olderThan, batch)
		total += n
		if err != nil || n < int64(batch) {
			return total, err
		}
	}
}

// deleteCompletedBatch deletes at most batch of the consumer's completed rows older than
// olderThan, and returns how many it deleted.
func (s *Store) deleteCompletedBatch(ctx context.Context, db keiro.DB, olderThan time.Duration, batch int) (int64, error) {
	tag, err := db.Exec(ctx, s.sql.deleteCompleted, s.cfg.Consumer, intervalText(olderThan), batch)
	if err != nil {
		return 0, fmt.Errorf("delete completed inbox rows: %w", err)
	}
	return tag.RowsAffected(), nil
}

// CountFailed returns the number of failed rows of the consumer (the keiro.inbox.backlog gauge).
func (s *Store) CountFailed(ctx context.Context, db keiro.DB) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, s.sql.countFailed, s.cfg.Consumer).Scan(&n); err != nil {
		return 0, fmt.Errorf("count failed inbox rows: %w", err)
	}
	return n, nil
}

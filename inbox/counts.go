package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Counts are one inbox consumer's rows, as CountByConsumer reads them.
type Counts struct {
	// Consumer is the inbox consumer name.
	Consumer string
	// Completed counts processed rows still retained (the dedupe window).
	Completed int64
	// Retrying counts failed rows that a redelivery runs again.
	Retrying int64
	// Poisoned counts failed rows past their attempt ceiling or failed permanently (a
	// redelivery skips them until RetryFailed resets them).
	Poisoned int64
	// Archived counts failed rows an operator set aside (Archive): they are in neither
	// Retrying nor Poisoned, and not in OldestFailure.
	Archived int64
	// OldestFailure is the last failure of the consumer's oldest failed row that is not
	// archived; nil when none.
	OldestFailure *time.Time
}

// CountByConsumer returns the row counts of every consumer with rows in the store's inbox
// table (not only the store's own consumer), sorted by consumer name. It scans the table:
// meant for status commands and the operator console, not for a hot path.
func (s *Store) CountByConsumer(ctx context.Context, db DB) ([]Counts, error) {
	var archive bool
	if err := db.QueryRow(ctx, s.sql.hasArchive).Scan(&archive); err != nil {
		return nil, fmt.Errorf("count inbox rows: %w", err)
	}
	query := s.sql.countByConsumerUnarchived
	if archive {
		query = s.sql.countByConsumer
	}
	rows, err := db.Query(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("count inbox rows: %w", err)
	}
	var out []Counts
	var c Counts
	if _, err := pgx.ForEachRow(rows, []any{&c.Consumer, &c.Completed, &c.Retrying, &c.Poisoned, &c.Archived, &c.OldestFailure}, func() error {
		out = append(out, c)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("count inbox rows: %w", err)
	}
	return out, nil
}

// Minute counts the store consumer's rows of one minute, as Activity reads them.
type Minute struct {
	// Start is the minute's start.
	Start time.Time
	// Completed counts rows that completed in the minute.
	Completed int64
	// Failed counts failed rows whose last failure fell in the minute.
	Failed int64
}

// Activity returns n minutes of the store consumer's rows from the minute starting at from:
// rows completed and failed rows by their last failure, one Minute per minute (zero counts
// included), oldest first. A row counts in the minute of its latest state only, so a minute
// that completed 10 rows later deleted by retention counts none.
func (s *Store) Activity(ctx context.Context, db DB, from time.Time, n int) ([]Minute, error) {
	if n < 1 {
		return nil, fmt.Errorf("inbox activity: n must be at least 1, got %d", n)
	}
	out := make([]Minute, n)
	for i := range out {
		out[i].Start = from.Add(time.Duration(i) * time.Minute).UTC()
	}
	rows, err := db.Query(ctx, s.sql.activity, s.cfg.Consumer, from, from.Add(time.Duration(n)*time.Minute))
	if err != nil {
		return nil, fmt.Errorf("read inbox activity: %w", err)
	}
	var completed bool
	var at time.Time
	var count int64
	if _, err := pgx.ForEachRow(rows, []any{&completed, &at, &count}, func() error {
		i := int(at.Sub(from) / time.Minute)
		if i < 0 || i >= n {
			return nil
		}
		if completed {
			out[i].Completed += count
		} else {
			out[i].Failed += count
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read inbox activity: %w", err)
	}
	return out, nil
}

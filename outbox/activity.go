package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Minute counts the outbox's rows of one minute, as Activity reads them.
type Minute struct {
	// Start is the minute's start.
	Start time.Time
	// Sent counts rows published in the minute.
	Sent int64
	// Failed counts rows that went dead or rejected in the minute.
	Failed int64
}

// Activity returns n minutes of the outbox's rows from the minute starting at from: rows
// published, and rows gone dead or rejected, one Minute per minute (zero counts included),
// oldest first. It reads retained rows only: sent rows deleted by retention count in no minute,
// and a requeued row no longer counts as failed.
func (s *Store) Activity(ctx context.Context, q Querier, from time.Time, n int) ([]Minute, error) {
	if n < 1 {
		return nil, fmt.Errorf("outbox activity: n must be at least 1, got %d", n)
	}
	out := make([]Minute, n)
	for i := range out {
		out[i].Start = from.Add(time.Duration(i) * time.Minute).UTC()
	}
	rows, err := q.Query(ctx, s.q.Activity, from, from.Add(time.Duration(n)*time.Minute))
	if err != nil {
		return nil, fmt.Errorf("read outbox activity: %w", err)
	}
	var sent bool
	var at time.Time
	var count int64
	if _, err := pgx.ForEachRow(rows, []any{&sent, &at, &count}, func() error {
		i := int(at.Sub(from) / time.Minute)
		if i < 0 || i >= n {
			return nil
		}
		if sent {
			out[i].Sent += count
		} else {
			out[i].Failed += count
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read outbox activity: %w", err)
	}
	return out, nil
}

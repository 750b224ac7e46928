package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/envelope"
)

// FailureGroup is the dead and rejected rows (archived ones aside) that share an error class
// and a normalised last error: UUIDs, runs of 16 or more hex digits and numbers replaced by
// <id>, <hex> and <n>, so that "order 41 …" and "order 42 …" fall in one group.
type FailureGroup struct {
	// Class is "dead", or "rejected: " and the rejection code.
	Class string
	// Message is the normalised last error (at most 500 characters).
	Message string
	// Count is the number of rows in the group.
	Count int64
	// First and Last are the oldest and newest failure (updated_at) of the group.
	First, Last time.Time
	// Example is one row's last error as it was written.
	Example string
	// Destinations and EventTypes list up to 5 destinations and event types of the rows.
	Destinations, EventTypes []string
}

// FailureGroups lists at most limit groups of the dead and rejected rows, largest first. It
// scans those rows: an operator's view, not a hot path.
func (s *Store) FailureGroups(ctx context.Context, q Querier, limit int) ([]FailureGroup, error) {
	if limit < 1 {
		return nil, errors.New("list outbox failure groups: limit must be at least 1")
	}
	rows, err := q.Query(ctx, s.q.FailureGroups, limit)
	if err != nil {
		return nil, fmt.Errorf("list outbox failure groups: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (FailureGroup, error) {
		var g FailureGroup
		return g, r.Scan(&g.Class, &g.Message, &g.Count, &g.First, &g.Last, &g.Example, &g.Destinations, &g.EventTypes)
	})
	if err != nil {
		return nil, fmt.Errorf("list outbox failure groups: %w", err)
	}
	return out, nil
}

// FailureGroupIDs lists the ids of at most limit rows of the group of class and message (as
// FailureGroups lists them), newest first.
func (s *Store) FailureGroupIDs(ctx context.Context, q Querier, class, message string, limit int) ([]envelope.UUID, error) {
	if limit < 1 {
		return nil, errors.New("list the rows of an outbox failure group: limit must be at least 1")
	}
	rows, err := q.Query(ctx, s.q.FailureGroupIDs, class, message, limit)
	if err != nil {
		return nil, fmt.Errorf("list the rows of an outbox failure group: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
	if err != nil {
		return nil, fmt.Errorf("list the rows of an outbox failure group: %w", err)
	}
	out := make([]envelope.UUID, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out, nil
}

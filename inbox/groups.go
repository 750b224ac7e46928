package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// FailureGroup is the store consumer's failed rows (archived ones aside) that share an error
// class and a normalised last error: UUIDs, runs of 16 or more hex digits and numbers replaced
// by <id>, <hex> and <n>, so that "order 41 …" and "order 42 …" fall in one group.
type FailureGroup struct {
	// Class is "poisoned" (past the attempt ceiling or failed permanently) or "retrying".
	Class string
	// Message is the normalised last error (at most 500 characters).
	Message string
	// Count is the number of rows in the group.
	Count int64
	// First and Last are the oldest and newest last failure (failed_at) of the group.
	First, Last time.Time
	// Example is one row's last error as it was written.
	Example string
	// Sources and EventTypes list up to 5 sources and event types of the rows.
	Sources, EventTypes []string
}

// FailureGroups lists at most limit groups of the store consumer's failed rows, largest
// first. It scans those rows: an operator's view, not a hot path.
func (s *Store) FailureGroups(ctx context.Context, db DB, limit int) ([]FailureGroup, error) {
	if limit < 1 {
		return nil, errors.New("list inbox failure groups: limit must be at least 1")
	}
	rows, err := db.Query(ctx, s.sql.failureGroups, s.cfg.Consumer, limit)
	if err != nil {
		return nil, fmt.Errorf("list inbox failure groups: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (FailureGroup, error) {
		var g FailureGroup
		return g, r.Scan(&g.Class, &g.Message, &g.Count, &g.First, &g.Last, &g.Example, &g.Sources, &g.EventTypes)
	})
	if err != nil {
		return nil, fmt.Errorf("list inbox failure groups: %w", err)
	}
	return out, nil
}

// FailureGroupKeys lists the keys of at most limit rows of the group of class and message (as
// FailureGroups lists them), oldest failure first.
func (s *Store) FailureGroupKeys(ctx context.Context, db DB, class, message string, limit int) ([]Key, error) {
	if limit < 1 {
		return nil, errors.New("list the messages of an inbox failure group: limit must be at least 1")
	}
	rows, err := db.Query(ctx, s.sql.failureGroupKeys, s.cfg.Consumer, class, message, limit)
	if err != nil {
		return nil, fmt.Errorf("list the messages of an inbox failure group: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Key, error) {
		var k Key
		return k, r.Scan(&k.Source, &k.DedupeKey)
	})
	if err != nil {
		return nil, fmt.Errorf("list the messages of an inbox failure group: %w", err)
	}
	return out, nil
}

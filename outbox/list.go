package outbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultListLimit is the number of rows a listing returns when no limit is given.
const DefaultListLimit = 100

// statusNames are the row statuses a listing may filter on.
var statusNames = []string{statusPending, statusPublishing, statusSent, statusFailed, statusDead, statusRejected}

// ListOptions filters and pages ListOutbox (keiro's listOutbox).
type ListOptions struct {
	// Status lists only rows in this status (pending, publishing, sent, failed, dead,
	// rejected). Defaults to "" (all).
	Status string
	// Source, Destination and Key list only rows with these values. Default to "" (any).
	Source, Destination, Key string
	// After continues a listing: pass the previous page's last Row.Seq. Defaults to 0.
	After int64
	// Limit is the most rows returned. Defaults to DefaultListLimit.
	Limit int
}

// ListOutbox lists outbox rows in seq order (the relay's order), filtered and paged by opts.
// An operator command: without a Status it scans the table, retained sent rows included.
func (s *Store) ListOutbox(ctx context.Context, q Querier, opts ListOptions) ([]Row, error) {
	if opts.Status != "" && !slices.Contains(statusNames, opts.Status) {
		return nil, fmt.Errorf("list outbox rows: unknown status %q; use one of %s", opts.Status, strings.Join(statusNames, ", "))
	}
	limit, err := listLimit(opts.Limit)
	if err != nil {
		return nil, fmt.Errorf("list outbox rows: %w", err)
	}
	return s.listRows(ctx, q, "list outbox rows", sqlListOutbox, opts.After, nullString(opts.Status),
		nullString(opts.Source), nullString(opts.Destination), nullString(opts.Key), limit)
}

// ListStuckOutbox lists rows in publishing whose claim is older than olderThan, oldest claim
// first (keiro's listStuckOutbox): a relay claimed them and has not marked them since. A claim
// outliving RelayConfig.LeaseDuration is reclaimed by the next relay; rows listed here long
// after that point to a relay stalled mid-publish or a lease set too long. limit 0 means
// DefaultListLimit.
func (s *Store) ListStuckOutbox(ctx context.Context, q Querier, olderThan time.Duration, limit int) ([]Row, error) {
	if olderThan < 0 {
		return nil, fmt.Errorf("list stuck outbox rows: olderThan %v is negative", olderThan)
	}
	limit, err := listLimit(limit)
	if err != nil {
		return nil, fmt.Errorf("list stuck outbox rows: %w", err)
	}
	return s.listRows(ctx, q, "list stuck outbox rows", sqlListStuckOutbox, olderThan.Microseconds(), limit)
}

// ListSentGcCandidates lists sent rows published more than retention ago, oldest first
// (keiro's listSentOutboxGcCandidates): the rows a retention pass with that Retention deletes
// next. limit 0 means DefaultListLimit.
func (s *Store) ListSentGcCandidates(ctx context.Context, q Querier, retention time.Duration, limit int) ([]Row, error) {
	if retention < 0 {
		return nil, fmt.Errorf("list sent outbox rows past retention: retention %v is negative", retention)
	}
	limit, err := listLimit(limit)
	if err != nil {
		return nil, fmt.Errorf("list sent outbox rows past retention: %w", err)
	}
	return s.listRows(ctx, q, "list sent outbox rows past retention", sqlListSentGcCandidates, retention.Microseconds(), limit)
}

func (s *Store) listRows(ctx context.Context, q Querier, what, sql string, args ...any) ([]Row, error) {
	rows, err := q.Query(ctx, s.bind(sql), args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) { return scanRow(r) })
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

func listLimit(n int) (int, error) {
	switch {
	case n == 0:
		return DefaultListLimit, nil
	case n < 0:
		return 0, fmt.Errorf("limit %d is negative", n)
	}
	return n, nil
}

// bind addresses sql's tables in the Store's schema (validated by NewStore).
func (s *Store) bind(sql string) string { return strings.ReplaceAll(sql, "{{schema}}", s.schema) }

package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/internal/pgtext"
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
	// Statuses lists only rows in any of these statuses, as Status does for one; set at most
	// one of Status and Statuses. Defaults to nil (all).
	Statuses []string
	// Source, Destination and Key list only rows with these values. Default to "" (any).
	Source, Destination, Key string
	// After continues a listing: pass the previous page's last Row.Seq. Defaults to 0.
	After int64
	// NewestFirst lists rows in reverse seq order (newest first), as the console does;
	// continue such a listing with Before, not After. Defaults to false (seq order).
	NewestFirst bool
	// Before continues a NewestFirst listing: pass the previous page's last Row.Seq.
	// Defaults to 0 (from the newest row).
	Before int64
	// Limit is the most rows returned. Defaults to DefaultListLimit.
	Limit int
	// Archived lists only archived rows (dead or rejected rows an operator set aside with
	// ArchiveTx). Defaults to false: only rows not archived, the working list.
	Archived bool
	// PayloadBytes, when positive, reads at most this many bytes of each row's payload
	// (Row.PayloadSize has its whole size): a listing of rows whose payloads are megabytes
	// (rows Kafka rejected as too large) reads only what it shows. NoPayload reads none.
	// Defaults to 0 (whole payloads).
	PayloadBytes int
}

// NoPayload, as ListOptions.PayloadBytes or SearchOptions.PayloadBytes, lists rows without
// their payloads (Row.PayloadSize still has each payload's size).
const NoPayload = pgtext.PrefixNone

// SearchOptions is a search of SearchOutbox.
type SearchOptions struct {
	// Term is the message id, key, event type or source searched for, exactly. Required.
	Term string
	// Limit is the most rows returned. Defaults to DefaultListLimit.
	Limit int
	// PayloadBytes, when positive, reads at most this many bytes of each row's payload, as
	// ListOptions.PayloadBytes does; NoPayload reads none. Defaults to 0 (whole payloads).
	PayloadBytes int
}

// ListOutbox lists outbox rows in seq order (the relay's order), or newest first, filtered
// and paged by opts. An operator command: without a status it scans the table, retained sent
// rows included; with statuses it reads only their phases' rows (their partial indexes).
func (s *Store) ListOutbox(ctx context.Context, q Querier, opts ListOptions) ([]Row, error) {
	statuses, phases, err := listStatuses(opts)
	if err != nil {
		return nil, fmt.Errorf("list outbox rows: %w", err)
	}
	limit, err := listLimit(opts.Limit)
	if err != nil {
		return nil, fmt.Errorf("list outbox rows: %w", err)
	}
	sql, from := s.q.ListOutbox, opts.After
	switch {
	case opts.NewestFirst && opts.After != 0:
		return nil, errors.New("list outbox rows: After continues a listing in seq order; continue a NewestFirst listing with Before")
	case !opts.NewestFirst && opts.Before != 0:
		return nil, errors.New("list outbox rows: Before continues a NewestFirst listing; set NewestFirst, or continue with After")
	case opts.After < 0 || opts.Before < 0:
		return nil, fmt.Errorf("list outbox rows: a seq to continue from is positive, got After %d, Before %d", opts.After, opts.Before)
	case opts.PayloadBytes < NoPayload:
		return nil, fmt.Errorf("list outbox rows: PayloadBytes %d is negative; NoPayload (-1) lists no payloads", opts.PayloadBytes)
	case opts.NewestFirst:
		sql, from = s.q.ListOutboxNewest, opts.Before
	}
	return s.listRows(ctx, q, "list outbox rows", sql, from, statuses,
		nullString(opts.Source), nullString(opts.Destination), nullString(opts.Key), limit, phases, opts.Archived,
		opts.PayloadBytes)
}

// SearchOutbox lists the rows, in any status, whose message id, key, event type or source is
// exactly opts.Term, newest first: how an operator finds a message by what a log line or a
// customer's report names. It scans the table, retained sent rows included; an empty term is
// an error.
func (s *Store) SearchOutbox(ctx context.Context, q Querier, opts SearchOptions) ([]Row, error) {
	if opts.Term == "" {
		return nil, errors.New("search outbox rows: the search term is empty")
	}
	limit, err := listLimit(opts.Limit)
	if err != nil {
		return nil, fmt.Errorf("search outbox rows: %w", err)
	}
	if opts.PayloadBytes < NoPayload {
		return nil, fmt.Errorf("search outbox rows: PayloadBytes %d is negative; NoPayload (-1) lists no payloads", opts.PayloadBytes)
	}
	return s.listRows(ctx, q, "search outbox rows", s.q.SearchOutbox, opts.Term, limit, opts.PayloadBytes)
}

// listStatuses checks opts' statuses and returns them with their phases (nil, nil: any).
func listStatuses(opts ListOptions) ([]string, []int16, error) {
	statuses := opts.Statuses
	switch {
	case opts.Status != "" && len(statuses) > 0:
		return nil, nil, errors.New("set at most one of Status and Statuses")
	case opts.Status != "":
		statuses = []string{opts.Status}
	case len(statuses) == 0:
		return nil, nil, nil
	}
	var phases []int16
	for _, st := range statuses {
		if !slices.Contains(statusNames, st) {
			return nil, nil, fmt.Errorf("unknown status %q; use one of %s", st, strings.Join(statusNames, ", "))
		}
		if ph := statusPhase(st); !slices.Contains(phases, ph) {
			phases = append(phases, ph)
		}
	}
	return statuses, phases, nil
}

// statusPhase is a status's phase column: 0 open (pending, publishing, failed), 1 sent,
// 2 dead or rejected.
func statusPhase(status string) int16 {
	switch status {
	case statusSent:
		return 1
	case statusDead, statusRejected:
		return 2
	}
	return 0
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
	return s.listRows(ctx, q, "list stuck outbox rows", s.q.ListStuckOutbox, olderThan.Microseconds(), limit)
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
	return s.listRows(ctx, q, "list sent outbox rows past retention", s.q.ListSentGcCandidates, retention.Microseconds(), limit)
}

func (s *Store) listRows(ctx context.Context, q Querier, what, sql string, args ...any) ([]Row, error) {
	rows, err := q.Query(ctx, sql, args...)
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

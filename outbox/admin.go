package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/envelope"
)

// Status is an overview of the outbox, for `relay status`.
type Status struct {
	// Counts lists the number of rows per status and destination.
	Counts []StatusCount
	// Backlog is the number of rows pending, failed or publishing.
	Backlog int64
	// OldestPendingAge is the age of the oldest pending or failed row (0 if none).
	OldestPendingAge time.Duration
	// OldestPendingCreatedAt is, per destination, the creation time of its oldest pending or
	// failed row; destinations without such rows are absent.
	OldestPendingCreatedAt map[string]time.Time
	// Dead is the number of dead and rejected rows waiting for an operator, archived ones aside.
	Dead int64
	// Archived is the number of dead and rejected rows an operator set aside (ArchiveTx); they
	// are in neither Counts nor Dead. Always 0 on a schema before migration 011, which has no
	// archive.
	Archived int64
}

// StatusCount is the number of rows with one status and destination, archived rows aside.
type StatusCount struct {
	Status, Destination string
	Count               int64
}

// Status counts the outbox's rows per status and destination, archived rows apart. It scans
// the whole table (including retained sent rows): an operator command, not a hot path. It works
// on a schema migrated up to 010 too (before the archive).
func (s *Store) Status(ctx context.Context, q Querier) (Status, error) {
	st := Status{OldestPendingCreatedAt: map[string]time.Time{}}
	var archive bool
	if err := q.QueryRow(ctx, s.q.HasArchive).Scan(&archive); err != nil {
		return st, fmt.Errorf("outbox status: %w", err)
	}
	query := s.q.StatusUnarchived
	if archive {
		query = s.q.Status
	}
	rows, err := q.Query(ctx, query)
	if err != nil {
		return st, fmt.Errorf("outbox status: %w", err)
	}
	var oldest time.Time
	for rows.Next() {
		var c StatusCount
		var archived bool
		var first time.Time
		if err := rows.Scan(&c.Status, &c.Destination, &archived, &c.Count, &first); err != nil {
			rows.Close()
			return st, fmt.Errorf("outbox status: %w", err)
		}
		if archived {
			st.Archived += c.Count
			continue
		}
		st.Counts = append(st.Counts, c)
		switch c.Status {
		case statusPending, statusFailed, statusPublishing:
			st.Backlog += c.Count
			if c.Status == statusPublishing {
				break
			}
			if oldest.IsZero() || first.Before(oldest) {
				oldest = first
			}
			if o, ok := st.OldestPendingCreatedAt[c.Destination]; !ok || first.Before(o) {
				st.OldestPendingCreatedAt[c.Destination] = first
			}
		case statusDead, statusRejected:
			st.Dead += c.Count
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("outbox status: %w", err)
	}
	if !oldest.IsZero() {
		var now time.Time
		if err := q.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
			return st, fmt.Errorf("outbox status: %w", err)
		}
		st.OldestPendingAge = now.Sub(oldest)
	}
	return st, nil
}

// ListDeadOptions filters ListDead.
type ListDeadOptions struct {
	// Source, if set, lists only rows of this source.
	Source string
	// Destination, if set, lists only rows for this topic.
	Destination string
	// Limit is the most rows returned. Defaults to 100.
	Limit int
	// After continues a listing: pass the previous page's last DeadRow.Seq. Defaults to 0.
	After int64
}

// DeadRow is a dead or rejected outbox row.
type DeadRow struct {
	// Seq orders rows; pass the last one as ListDeadOptions.After for the next page.
	Seq int64
	// OutboxID is the row's id.
	OutboxID envelope.UUID
	// MessageID, Source, Destination and Key identify the message.
	MessageID, Source, Destination string
	Key                            *string
	// Status is "dead" or "rejected".
	Status string
	// Attempts is the number of publish attempts made.
	Attempts int
	// LastError is the last failure's text.
	LastError string
	// RejectionCode is the Kafka error name of a rejection ("message_too_large"), else "".
	RejectionCode string
	// UpdatedAt is when the row reached its status.
	UpdatedAt time.Time
}

// ListDead lists dead and rejected rows in seq order.
func (s *Store) ListDead(ctx context.Context, q Querier, opts ListDeadOptions) ([]DeadRow, error) {
	if opts.Limit <= 0 {
		opts.Limit = 100
	}
	rows, err := q.Query(ctx, s.q.ListDead, opts.After, nullString(opts.Source), nullString(opts.Destination), opts.Limit)
	if err != nil {
		return nil, fmt.Errorf("list dead outbox rows: %w", err)
	}
	defer rows.Close()
	var out []DeadRow
	for rows.Next() {
		var d DeadRow
		var id [16]byte
		var lastErr, code *string
		if err := rows.Scan(&d.Seq, &id, &d.MessageID, &d.Source, &d.Destination, &d.Key, &d.Status,
			&d.Attempts, &lastErr, &code, &d.UpdatedAt); err != nil {
			return nil, fmt.Errorf("list dead outbox rows: %w", err)
		}
		d.OutboxID = id
		if lastErr != nil {
			d.LastError = *lastErr
		}
		if code != nil {
			d.RejectionCode = *code
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list dead outbox rows: %w", err)
	}
	return out, nil
}

// CountDead counts the dead and rejected rows of source and destination ("": any), archived
// rows aside: the rows a
// Requeue with that RequeueFilter's Source and Destination moves (both "": every such row, as
// RequeueFilter.All). It reads the dead rows' partial index: cheap with few dead rows.
func (s *Store) CountDead(ctx context.Context, q Querier, source, destination string) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, s.q.CountDead, nullString(source), nullString(destination)).Scan(&n); err != nil {
		return 0, fmt.Errorf("count dead outbox rows: %w", err)
	}
	return n, nil
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// RequeueFilter selects the dead and rejected rows to requeue. At least one field must be set.
// Source, Destination and All leave archived rows (ArchiveTx) where they are; a row named in
// IDs is requeued archived or not, and is no longer archived.
type RequeueFilter struct {
	// IDs requeues these rows.
	IDs []envelope.UUID
	// Source requeues every dead or rejected row of this source (of Destination too, if set).
	Source string
	// Destination requeues every dead or rejected row for this destination (of Source too, if
	// set): after a topic's outage or ACL mistake is fixed, its rejected rows go back together.
	Destination string
	// All requeues every dead or rejected row.
	All bool
}

// Attempt is one failed attempt of a row, as its history keeps it.
type Attempt struct {
	// Attempt is the attempt's number (1 for the first).
	Attempt int `json:"attempt"`
	// At is when the attempt failed.
	At time.Time `json:"at"`
	// Error is the attempt's error (at most 1024 bytes).
	Error string `json:"error"`
	// Code is the rejection code of an attempt Kafka refused for good; empty otherwise.
	Code string `json:"code,omitempty"`
}

// AttemptHistory returns row id's failed or rejected produce attempts, oldest first (the last
// 20; a requeue keeps them), or [ErrNotFound]. A row that never failed has none.
func (s *Store) AttemptHistory(ctx context.Context, q Querier, id envelope.UUID) ([]Attempt, error) {
	var raw []byte
	if err := q.QueryRow(ctx, s.q.AttemptErrors, [16]byte(id)).Scan(&raw); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("outbox row %s: %w", id, ErrNotFound)
		}
		return nil, fmt.Errorf("read the attempts of outbox row %s: %w", id, err)
	}
	out := []Attempt{}
	if raw != nil {
		if err := json.Unmarshal(raw, &out); err != nil {
			return nil, fmt.Errorf("read the attempts of outbox row %s: %w", id, err)
		}
	}
	return out, nil
}

// ArchiveTx sets aside, in tx, the dead and rejected rows among ids that are not archived yet,
// and returns them in seq order: an operator's "nothing to do about these". Archived rows leave
// the working lists (ListDead, ListOutbox without Archived, CountDead, a filter's or All's
// requeue) and stay in the table: ListOutbox with Archived lists them, SearchOutbox finds them,
// and a requeue that names one brings it back. A row in another status, archived already or
// missing is not in the answer.
func (s *Store) ArchiveTx(ctx context.Context, tx pgx.Tx, ids []envelope.UUID) ([]envelope.UUID, error) {
	if len(ids) == 0 {
		return nil, errors.New("archive outbox rows: no ids")
	}
	raw := make([][16]byte, len(ids))
	for i, id := range ids {
		raw[i] = id
	}
	rows, err := tx.Query(ctx, s.q.Archive, raw)
	if err != nil {
		return nil, fmt.Errorf("archive outbox rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (envelope.UUID, error) {
		var id [16]byte
		err := r.Scan(&id)
		return id, err
	})
	if err != nil {
		return nil, fmt.Errorf("archive outbox rows: %w", err)
	}
	return out, nil
}

// Requeue moves the selected dead and rejected rows back to pending with a fresh attempt budget,
// due now, and returns how many moved. Only dead and rejected rows are affected. A requeued row
// keeps its seq: if later rows of its key were published while it was dead, it now arrives
// after them (its key's order is broken for that message, which is why it was dead).
func (s *Store) Requeue(ctx context.Context, q Querier, f RequeueFilter) (int64, error) {
	ids, err := s.RequeueRows(ctx, q, f)
	return int64(len(ids)), err
}

// RequeueRows is Requeue returning the ids of the rows it moved, in seq order.
func (s *Store) RequeueRows(ctx context.Context, q Querier, f RequeueFilter) ([]envelope.UUID, error) {
	if len(f.IDs) == 0 && f.Source == "" && f.Destination == "" && !f.All {
		return nil, errors.New("requeue outbox rows: empty filter (set IDs, Source, Destination or All)")
	}
	ids := make([][16]byte, len(f.IDs))
	for i, id := range f.IDs {
		ids[i] = id
	}
	rows, err := q.Query(ctx, s.q.Requeue, ids, nullString(f.Source), f.All, nullString(f.Destination))
	if err != nil {
		return nil, fmt.Errorf("requeue outbox rows: %w", err)
	}
	moved, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (envelope.UUID, error) {
		var id [16]byte
		err := r.Scan(&id)
		return id, err
	})
	if err != nil {
		return nil, fmt.Errorf("requeue outbox rows: %w", err)
	}
	return moved, nil
}

// Row is an outbox row as stored, for inspection.
type Row struct {
	// Seq is the row's position in the outbox's order.
	Seq int64
	// OutboxID is the row's id.
	OutboxID envelope.UUID
	// Event is the enqueued event. Its Payload is a prefix of the stored payload when the
	// listing asked for one (ListOptions.PayloadBytes, SearchOptions.PayloadBytes); PayloadSize
	// is the whole payload's size.
	Event envelope.Event
	// PayloadSize is the stored payload's size in bytes.
	PayloadSize int
	// Status is pending, publishing, sent, failed, dead or rejected.
	Status string
	// Attempts is the number of publish attempts counted.
	Attempts int
	// NextAttemptAt is when a pending or failed row becomes due.
	NextAttemptAt time.Time
	// LastError is the last failure's text, if any.
	LastError string
	// RejectionCode is set on rejected rows.
	RejectionCode string
	// PublishedAt, Partition and Offset are set on sent rows.
	PublishedAt *time.Time
	Partition   *int32
	Offset      *int64
	// CreatedAt and UpdatedAt are the row's timestamps.
	CreatedAt, UpdatedAt time.Time
}

// ErrNotFound reports a lookup of an outbox id that is not in the outbox.
var ErrNotFound = errors.New("outbox row not found")

// Lookup reads one row by outbox id, or returns an error wrapping ErrNotFound.
func (s *Store) Lookup(ctx context.Context, q Querier, id envelope.UUID) (Row, error) {
	r, err := scanRow(q.QueryRow(ctx, s.q.LookupRow, [16]byte(id)))
	if err != nil {
		if errors.Is(err, errNoRows) {
			return r, fmt.Errorf("lookup outbox row %s: %w", id, ErrNotFound)
		}
		return r, fmt.Errorf("lookup outbox row %s: %w", id, err)
	}
	return r, nil
}

// RequeueSkip is a row named by id that RequeueTx did not requeue, and why.
type RequeueSkip struct {
	// ID is the outbox id as given.
	ID envelope.UUID
	// Reason is "no such row" or the row's status (only dead and rejected rows are requeued).
	Reason string
}

// RequeueResult is what RequeueTx did.
type RequeueResult struct {
	// Requeued lists the rows moved back to pending, in seq order.
	Requeued []envelope.UUID
	// Skipped lists the ids of f.IDs that were not requeued: missing, or not dead or rejected.
	Skipped []RequeueSkip
}

// RequeueWarning states the ordering caveat of every requeue; operator tools show it before
// and after requeueing.
const RequeueWarning = `A requeued row keeps its place (seq) in the outbox, but rows of the same key enqueued after ` +
	`it may already be on Kafka: consumers can receive the requeued event AFTER later events of its key. ` +
	`Requeue only events whose consumers tolerate that (idempotent, or ordered by version).`

// RequeueTx is the operator's requeue (`relay dead requeue`, the console and its API): in tx,
// it checks each id of f.IDs (a missing row or one that is not dead or rejected is skipped and
// reported), requeues the remaining selection with [Store.RequeueRows], and notifies listening
// relays when a row moved. The rows become visible to relays when tx commits; nothing moves if
// tx rolls back. When every id is skipped nothing is requeued (an ids-only filter never widens).
func (s *Store) RequeueTx(ctx context.Context, tx pgx.Tx, f RequeueFilter) (RequeueResult, error) {
	var res RequeueResult
	named := f.IDs
	f.IDs = nil
	for _, id := range named {
		row, err := s.Lookup(ctx, tx, id)
		switch {
		case errors.Is(err, ErrNotFound):
			res.Skipped = append(res.Skipped, RequeueSkip{ID: id, Reason: "no such row"})
			continue
		case err != nil:
			return res, err
		case row.Status != statusDead && row.Status != statusRejected:
			res.Skipped = append(res.Skipped, RequeueSkip{ID: id, Reason: row.Status})
			continue
		}
		f.IDs = append(f.IDs, id)
	}
	if len(named) > 0 && len(f.IDs) == 0 {
		return res, nil // nothing to requeue; an empty filter would be refused
	}
	moved, err := s.RequeueRows(ctx, tx, f)
	if err != nil {
		return res, err
	}
	res.Requeued = moved
	if len(moved) > 0 {
		if _, err := tx.Exec(ctx, "SELECT pg_notify($1, '')", s.NotifyChannel()); err != nil {
			return res, fmt.Errorf("notify relays of requeued rows: %w", err)
		}
	}
	return res, nil
}

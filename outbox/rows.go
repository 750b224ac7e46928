package outbox

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/pgtext"
	"github.com/keiro-go/keiro/outbox/internal/claimsql"
)

// Status is an outbox row's status, its place in the outbox's state machine
// (docs/architecture.md): pending → publishing → sent, with failed (retried after a backoff),
// dead (attempts exhausted) and rejected (refused by Kafka for good) on the way.
type Status string

// The statuses of an outbox row (the values of its status column).
const (
	// StatusPending: enqueued, waiting for a relay (also a row released or requeued).
	StatusPending Status = "pending"
	// StatusPublishing: claimed by a relay, under its lease.
	StatusPublishing Status = "publishing"
	// StatusSent: acknowledged by Kafka.
	StatusSent Status = "sent"
	// StatusFailed: a publish attempt failed; the row is retried after its backoff.
	StatusFailed Status = "failed"
	// StatusDead: the attempts ran out; an operator requeues it.
	StatusDead Status = "dead"
	// StatusRejected: Kafka refused the record for good (too large, invalid topic, ...).
	StatusRejected Status = "rejected"
)

// statuses are every Status, in the order of the state machine.
var statuses = []Status{StatusPending, StatusPublishing, StatusSent, StatusFailed, StatusDead, StatusRejected}

// Statuses returns every Status, in the order of the outbox's state machine.
func Statuses() []Status { return slices.Clone(statuses) }

// Valid reports whether s is one of [Statuses].
func (s Status) Valid() bool { return slices.Contains(statuses, s) }

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
	// Status is the row's place in the outbox's state machine.
	Status Status
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

// DefaultListLimit is the number of rows a listing returns when no limit is given.
const DefaultListLimit = 100

// ListOptions filters and pages ListOutbox (keiro's listOutbox).
type ListOptions struct {
	// Status lists only rows in this status (one of [Statuses]). Defaults to "" (all).
	Status Status
	// Statuses lists only rows in any of these statuses, as Status does for one; set at most
	// one of Status and Statuses. Defaults to nil (all).
	Statuses []Status
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

// listStatuses checks opts' statuses and returns their names with their phases (nil, nil: any).
func listStatuses(opts ListOptions) ([]string, []int16, error) {
	statuses := opts.Statuses
	switch {
	case opts.Status != "" && len(statuses) > 0:
		return nil, nil, errors.New("set at most one of Status and Statuses")
	case opts.Status != "":
		statuses = []Status{opts.Status}
	case len(statuses) == 0:
		return nil, nil, nil
	}
	var phases []int16
	names := make([]string, len(statuses))
	for i, st := range statuses {
		if !st.Valid() {
			return nil, nil, fmt.Errorf("unknown status %q; use one of %s", st, statusList())
		}
		if ph := st.phase(); !slices.Contains(phases, ph) {
			phases = append(phases, ph)
		}
		names[i] = string(st)
	}
	return names, phases, nil
}

// phase is the status's phase column: 0 open (pending, publishing, failed), 1 sent, 2 dead or
// rejected.
func (s Status) phase() int16 {
	switch s {
	case StatusSent:
		return 1
	case StatusDead, StatusRejected:
		return 2
	}
	return 0
}

// statusList is [Statuses] as "pending, publishing, ...".
func statusList() string {
	names := make([]string, len(statuses))
	for i, st := range statuses {
		names[i] = string(st)
	}
	return strings.Join(names, ", ")
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

// The outbox row codec: the one function that maps the one column list every statement
// reading whole rows selects (sqlq.RowColumns: inspection listings, Lookup, the enqueue's
// read-back of existing rows) to a Row. The claim reads its own columns (internal/claimsql,
// internal/sqlq) and shares claimsql.FillEvent only.

// scanRow reads one row of sqlq.RowColumns.
func scanRow(row pgx.Row) (Row, error) {
	var (
		r                              Row
		rid                            [16]byte
		lastErr, code                  *string
		key, registry, subject, fp     *string
		versionRef, schemaID, position *int64
		sourceEventID, causation, corr *[16]byte
		traceparent, tracestate, attrs *string
	)
	e := &r.Event
	err := row.Scan(&r.Seq, &r.Status, &r.Attempts, &r.NextAttemptAt,
		&lastErr, &r.PublishedAt, &r.Partition, &r.Offset, &code, &r.CreatedAt, &r.UpdatedAt,
		&rid, &e.Source, &e.MessageID, &e.Destination, &key, &e.EventType,
		&e.SchemaVersion, &e.ContentType, &registry, &subject, &versionRef, &schemaID, &fp,
		&sourceEventID, &position, &causation, &corr, &traceparent, &tracestate, &e.Payload, &r.PayloadSize, &attrs, &e.OccurredAt)
	if err != nil {
		return r, err
	}
	r.OutboxID = rid
	if lastErr != nil {
		r.LastError = *lastErr
	}
	if code != nil {
		r.RejectionCode = *code
	}
	claimsql.FillEvent(e, key, registry, subject, fp, versionRef, schemaID, position, sourceEventID, causation, corr, traceparent, tracestate, attrs)
	return r, nil
}

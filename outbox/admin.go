package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/failure"
	"github.com/keiro-go/keiro/internal/adminq"
	"github.com/keiro-go/keiro/internal/schemaname"
	"github.com/keiro-go/keiro/outbox/internal/sqlq"
)

// Admin is the operator's surface of one schema's outbox, apart from the producer's [Store]:
// the overview, listings and lookups, dead rows, requeue, archive, attempt history, failure
// groups, activity, per-source order declarations, and the schema's mode and log slots. Like
// a Store it holds no connection: every method takes the transaction or keiro.DB to run on. An
// Admin is safe for concurrent use.
type Admin struct {
	schema string
	q      *sqlq.Queries
	// slotWait, if set (tests), runs each time a slot preparation finds the slot another
	// session is creating not yet consistent.
	slotWait func()
}

// NewAdmin returns the Admin of the outbox in schema, which must be a valid schema name
// (lowercase letters, digits and underscores).
func NewAdmin(schema string) (*Admin, error) {
	if err := schemaname.Validate(schema); err != nil {
		return nil, fmt.Errorf("new outbox admin: %w", err)
	}
	return &Admin{schema: schema, q: sqlq.New(schema)}, nil
}

// adminOf is the Admin of s's schema, for the relay's reading and changing of the mode and
// slots; it shares the Store's statements and test hooks.
func adminOf(s *Store) *Admin { return &Admin{schema: s.schema, q: s.q, slotWait: s.slotWait} }

// Schema returns the schema the Admin addresses.
func (a *Admin) Schema() string { return a.schema }

// notifyChannel is the channel relays listen on ([Store.NotifyChannel]).
func (a *Admin) notifyChannel() string { return notifyChannel(a.schema) }

// Overview is an overview of the outbox, for `relay status` and the console's summary.
type Overview struct {
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
	Status      Status
	Destination string
	Count       int64
}

// Overview counts the outbox's rows per status and destination, archived rows apart. It scans
// the whole table (including retained sent rows): an operator command, not a hot path. It works
// on a schema migrated up to 010 too (before the archive).
func (a *Admin) Overview(ctx context.Context, q keiro.DB) (Overview, error) {
	st := Overview{OldestPendingCreatedAt: map[string]time.Time{}}
	var archive bool
	if err := q.QueryRow(ctx, a.q.HasArchive).Scan(&archive); err != nil {
		return st, fmt.Errorf("outbox status: %w", err)
	}
	query := a.q.StatusUnarchived
	if archive {
		query = a.q.Status
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
		case StatusPending, StatusFailed, StatusPublishing:
			st.Backlog += c.Count
			if c.Status == StatusPublishing {
				break
			}
			if oldest.IsZero() || first.Before(oldest) {
				oldest = first
			}
			if o, ok := st.OldestPendingCreatedAt[c.Destination]; !ok || first.Before(o) {
				st.OldestPendingCreatedAt[c.Destination] = first
			}
		case StatusDead, StatusRejected:
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

// Lookup reads one row by outbox id, or returns an error wrapping ErrNotFound.
func (a *Admin) Lookup(ctx context.Context, q keiro.DB, id envelope.UUID) (Row, error) {
	r, err := scanRow(q.QueryRow(ctx, a.q.LookupRow, [16]byte(id)))
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return r, fmt.Errorf("lookup outbox row %s: %w", id, ErrNotFound)
		}
		return r, fmt.Errorf("lookup outbox row %s: %w", id, err)
	}
	return r, nil
}

// ListOutbox lists outbox rows in seq order (the relay's order), or newest first, filtered
// and paged by opts. An operator command: without a status it scans the table, retained sent
// rows included; with statuses it reads only their phases' rows (their partial indexes).
func (a *Admin) ListOutbox(ctx context.Context, q keiro.DB, opts ListOptions) ([]Row, error) {
	statuses, phases, err := listStatuses(opts)
	if err != nil {
		return nil, fmt.Errorf("list outbox rows: %w", err)
	}
	limit, err := listLimit(opts.Limit)
	if err != nil {
		return nil, fmt.Errorf("list outbox rows: %w", err)
	}
	sql, from := a.q.ListOutbox, opts.After
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
		sql, from = a.q.ListOutboxNewest, opts.Before
	}
	return a.listRows(ctx, q, "list outbox rows", sql, from, statuses,
		nullString(opts.Source), nullString(opts.Destination), nullString(opts.Key), limit, phases, opts.Archived,
		opts.PayloadBytes)
}

// SearchOutbox lists the rows, in any status, whose message id, key, event type or source is
// exactly opts.Term, newest first: how an operator finds a message by what a log line or a
// customer's report names. It scans the table, retained sent rows included; an empty term is
// an error.
func (a *Admin) SearchOutbox(ctx context.Context, q keiro.DB, opts SearchOptions) ([]Row, error) {
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
	return a.listRows(ctx, q, "search outbox rows", a.q.SearchOutbox, opts.Term, limit, opts.PayloadBytes)
}

// ListStuckOutbox lists rows in publishing whose claim is older than olderThan, oldest claim
// first (keiro's listStuckOutbox): a relay claimed them and has not marked them since. A claim
// outliving RelayConfig.LeaseDuration is reclaimed by the next relay; rows listed here long
// after that point to a relay stalled mid-publish or a lease set too long. limit 0 means
// DefaultListLimit.
func (a *Admin) ListStuckOutbox(ctx context.Context, q keiro.DB, olderThan time.Duration, limit int) ([]Row, error) {
	if olderThan < 0 {
		return nil, fmt.Errorf("list stuck outbox rows: olderThan %v is negative", olderThan)
	}
	limit, err := listLimit(limit)
	if err != nil {
		return nil, fmt.Errorf("list stuck outbox rows: %w", err)
	}
	return a.listRows(ctx, q, "list stuck outbox rows", a.q.ListStuckOutbox, olderThan.Microseconds(), limit)
}

// ListSentGcCandidates lists sent rows published more than retention ago, oldest first
// (keiro's listSentOutboxGcCandidates): the rows a retention pass with that Retention deletes
// next. limit 0 means DefaultListLimit.
func (a *Admin) ListSentGcCandidates(ctx context.Context, q keiro.DB, retention time.Duration, limit int) ([]Row, error) {
	if retention < 0 {
		return nil, fmt.Errorf("list sent outbox rows past retention: retention %v is negative", retention)
	}
	limit, err := listLimit(limit)
	if err != nil {
		return nil, fmt.Errorf("list sent outbox rows past retention: %w", err)
	}
	return a.listRows(ctx, q, "list sent outbox rows past retention", a.q.ListSentGcCandidates, retention.Microseconds(), limit)
}

func (a *Admin) listRows(ctx context.Context, q keiro.DB, what, sql string, args ...any) ([]Row, error) {
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
	// Status is StatusDead or StatusRejected.
	Status Status
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
func (a *Admin) ListDead(ctx context.Context, q keiro.DB, opts ListDeadOptions) ([]DeadRow, error) {
	if opts.Limit <= 0 {
		opts.Limit = 100
	}
	rows, err := q.Query(ctx, a.q.ListDead, opts.After, nullString(opts.Source), nullString(opts.Destination), opts.Limit)
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
func (a *Admin) CountDead(ctx context.Context, q keiro.DB, source, destination string) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, a.q.CountDead, nullString(source), nullString(destination)).Scan(&n); err != nil {
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

// AttemptHistory returns row id's failed or rejected produce attempts, oldest first (the last
// 20; a requeue keeps them), or [ErrNotFound]. A row that never failed has none.
func (a *Admin) AttemptHistory(ctx context.Context, q keiro.DB, id envelope.UUID) ([]failure.Attempt, error) {
	return adminq.Attempts(ctx, q, fmt.Sprintf("outbox row %s", id), ErrNotFound, a.q.AttemptErrors, [16]byte(id))
}

// ArchiveTx sets aside, in tx, the dead and rejected rows among ids that are not archived yet,
// and returns them in seq order: an operator's "nothing to do about these". Archived rows leave
// the working lists (ListDead, ListOutbox without Archived, CountDead, a filter's or All's
// requeue) and stay in the table: ListOutbox with Archived lists them, SearchOutbox finds them,
// and a requeue that names one brings it back. A row in another status, archived already or
// missing is not in the answer.
func (a *Admin) ArchiveTx(ctx context.Context, tx pgx.Tx, ids []envelope.UUID) ([]envelope.UUID, error) {
	if len(ids) == 0 {
		return nil, errors.New("archive outbox rows: no ids")
	}
	raw := make([][16]byte, len(ids))
	for i, id := range ids {
		raw[i] = id
	}
	rows, err := tx.Query(ctx, a.q.Archive, raw)
	if err != nil {
		return nil, fmt.Errorf("archive outbox rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanID)
	if err != nil {
		return nil, fmt.Errorf("archive outbox rows: %w", err)
	}
	return out, nil
}

// Requeue moves the selected dead and rejected rows back to pending with a fresh attempt budget,
// due now, and returns how many moved. Only dead and rejected rows are affected. A requeued row
// keeps its seq: if later rows of its key were published while it was dead, it now arrives
// after them (its key's order is broken for that message, which is why it was dead).
func (a *Admin) Requeue(ctx context.Context, q keiro.DB, f RequeueFilter) (int64, error) {
	ids, err := a.RequeueRows(ctx, q, f)
	return int64(len(ids)), err
}

// RequeueRows is Requeue returning the ids of the rows it moved, in seq order.
func (a *Admin) RequeueRows(ctx context.Context, q keiro.DB, f RequeueFilter) ([]envelope.UUID, error) {
	if len(f.IDs) == 0 && f.Source == "" && f.Destination == "" && !f.All {
		return nil, errors.New("requeue outbox rows: empty filter (set IDs, Source, Destination or All)")
	}
	ids := make([][16]byte, len(f.IDs))
	for i, id := range f.IDs {
		ids[i] = id
	}
	rows, err := q.Query(ctx, a.q.Requeue, ids, nullString(f.Source), f.All, nullString(f.Destination))
	if err != nil {
		return nil, fmt.Errorf("requeue outbox rows: %w", err)
	}
	moved, err := pgx.CollectRows(rows, scanID)
	if err != nil {
		return nil, fmt.Errorf("requeue outbox rows: %w", err)
	}
	return moved, nil
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
// reported), requeues the remaining selection with [Admin.RequeueRows], and notifies listening
// relays when a row moved. The rows become visible to relays when tx commits; nothing moves if
// tx rolls back. When every id is skipped nothing is requeued (an ids-only filter never widens).
func (a *Admin) RequeueTx(ctx context.Context, tx pgx.Tx, f RequeueFilter) (RequeueResult, error) {
	var res RequeueResult
	named := f.IDs
	f.IDs = nil
	for _, id := range named {
		row, err := a.Lookup(ctx, tx, id)
		switch {
		case errors.Is(err, ErrNotFound):
			res.Skipped = append(res.Skipped, RequeueSkip{ID: id, Reason: "no such row"})
			continue
		case err != nil:
			return res, err
		case row.Status != StatusDead && row.Status != StatusRejected:
			res.Skipped = append(res.Skipped, RequeueSkip{ID: id, Reason: string(row.Status)})
			continue
		}
		f.IDs = append(f.IDs, id)
	}
	if len(named) > 0 && len(f.IDs) == 0 {
		return res, nil // nothing to requeue; an empty filter would be refused
	}
	moved, err := a.RequeueRows(ctx, tx, f)
	if err != nil {
		return res, err
	}
	res.Requeued = moved
	if len(moved) > 0 {
		if _, err := tx.Exec(ctx, "SELECT pg_notify($1, '')", a.notifyChannel()); err != nil {
			return res, fmt.Errorf("notify relays of requeued rows: %w", err)
		}
	}
	return res, nil
}

// FailureGroups lists at most limit groups of the dead and rejected rows (archived ones aside),
// largest first; a group's Where lists destinations. It scans those rows: an operator's view,
// not a hot path.
func (a *Admin) FailureGroups(ctx context.Context, q keiro.DB, limit int) ([]failure.Group, error) {
	return adminq.Groups(ctx, q, "list outbox failure groups", a.q.FailureGroups, limit)
}

// FailureGroupIDs lists the ids of at most limit rows of the group of class and message (as
// FailureGroups lists them), newest first.
func (a *Admin) FailureGroupIDs(ctx context.Context, q keiro.DB, class, message string, limit int) ([]envelope.UUID, error) {
	return adminq.Keys(ctx, q, "list the rows of an outbox failure group", a.q.FailureGroupIDs,
		scanID, class, message, limit)
}

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
func (a *Admin) Activity(ctx context.Context, q keiro.DB, from time.Time, n int) ([]Minute, error) {
	if n < 1 {
		return nil, fmt.Errorf("outbox activity: n must be at least 1, got %d", n)
	}
	ms, err := adminq.Activity(ctx, q, "read outbox activity", a.q.Activity, from, n)
	if err != nil {
		return nil, err
	}
	out := make([]Minute, n)
	for i, m := range ms {
		out[i] = Minute{Start: m.Start, Sent: m.Done, Failed: m.Failed}
	}
	return out, nil
}

// DeclarePerSourceOrder declares sources as ordered streams, on q (a pool, a connection or a
// transaction; in a transaction the declaration takes effect when it commits). From then on
// every row of such a source, whatever its key (null keys included) and whoever writes it
// (EnqueueTx, <schema>.enqueue or a plain INSERT), takes one transaction lock per source before
// it draws its seq, so the source's producers serialise and its seq order is its commit order:
// the order a relay with the PerSourceStream policy publishes. Without a declaration
// PerSourceStream claims in seq order but a transaction that commits late is published after
// later rows of its source. Producers of a declared source commit one at a time.
//
// A declaration waits for every transaction writing the outbox to end and holds new writers
// back until it commits (see docs/architecture.md, "Order at enqueue"), so declare a source
// before its producers start. Declaring a declared source does nothing and does not wait.
func (a *Admin) DeclarePerSourceOrder(ctx context.Context, q keiro.DB, sources ...string) error {
	if err := validSources(sources); err != nil {
		return fmt.Errorf("declare per-source order: %w", err)
	}
	declared, err := a.PerSourceOrdered(ctx, q)
	if err != nil {
		return fmt.Errorf("declare per-source order: %w", err)
	}
	var missing []string
	for _, src := range sources {
		if !slices.Contains(declared, src) && !slices.Contains(missing, src) {
			missing = append(missing, src)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if _, err := q.Exec(ctx, a.q.DeclareSource, missing); err != nil {
		return fmt.Errorf("declare per-source order of %q: %w", missing, err)
	}
	return nil
}

// RevokePerSourceOrder removes the per-source declaration of sources, on q: their rows are then
// ordered per (source, key) again, and rows without a key are unordered. Like a declaration,
// it waits for the outbox's running writers. Revoking an undeclared source does nothing.
func (a *Admin) RevokePerSourceOrder(ctx context.Context, q keiro.DB, sources ...string) error {
	if err := validSources(sources); err != nil {
		return fmt.Errorf("revoke per-source order: %w", err)
	}
	if _, err := q.Exec(ctx, a.q.RevokeSource, sources); err != nil {
		return fmt.Errorf("revoke per-source order of %q: %w", sources, err)
	}
	return nil
}

// PerSourceOrdered lists the sources declared with [Admin.DeclarePerSourceOrder], sorted.
func (a *Admin) PerSourceOrdered(ctx context.Context, q keiro.DB) ([]string, error) {
	rows, err := q.Query(ctx, a.q.ListSources)
	if err != nil {
		return nil, fmt.Errorf("list per-source ordered sources: %w (is the schema migrated? run `relay migrate`)", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var src string
		if err := rows.Scan(&src); err != nil {
			return nil, fmt.Errorf("list per-source ordered sources: %w", err)
		}
		out = append(out, src)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list per-source ordered sources: %w", err)
	}
	return out, nil
}

func validSources(sources []string) error {
	if len(sources) == 0 {
		return errors.New("no source given")
	}
	for i, src := range sources {
		if src == "" {
			return fmt.Errorf("source %d is empty", i)
		}
	}
	return nil
}

// scanID reads a row of one outbox id.
func scanID(r pgx.CollectableRow) (envelope.UUID, error) {
	var id [16]byte
	err := r.Scan(&id)
	return id, err
}

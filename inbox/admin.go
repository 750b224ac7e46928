package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/failure"
	"github.com/keiro-go/keiro/internal/adminq"
	"github.com/keiro-go/keiro/internal/pgtext"
)

// Admin is the operator's surface of one consumer's inbox, apart from what a consumer runs
// ([Store.Process]): lookup, listings and search, attempt history, archive, retry and
// reprocess, failure groups, counts and activity. It works through the consumer's Store (its
// schema, its consumer name and, for Reprocess, its processing), as franz-go's kadm works
// through a kgo client. Like a Store it holds no connection: every method takes the keiro.DB to run
// on. An Admin is safe for concurrent use.
type Admin struct {
	s *Store
}

// NewAdmin returns the Admin of s's consumer.
func NewAdmin(s *Store) *Admin { return &Admin{s: s} }

// Status is an inbox row's status (the values of keiro_inbox.status).
type Status string

// The statuses of an inbox row.
const (
	// StatusCompleted: the handler's transaction committed; the row dedupes redeliveries until
	// retention deletes it.
	StatusCompleted Status = "completed"
	// StatusFailed: the last attempt failed; Entry.Poisoned tells whether a redelivery still
	// runs it.
	StatusFailed Status = "failed"
)

// Entry is one stored inbox row.
type Entry struct {
	// Source is the producing bounded context (the event's Source).
	Source string
	// DedupeKey is the key the message was deduplicated under.
	DedupeKey string
	// Delivery is the stored envelope and Kafka coordinates. For completed rows written in
	// DedupeOnly mode the payload is empty and attributes, trace and schema fields are unset.
	// Its payload is a prefix of the stored one when the listing asked for one
	// (ListOptions.PayloadBytes, SearchOptions.PayloadBytes).
	Delivery Delivery
	// PayloadSize is the stored payload's size in bytes.
	PayloadSize int
	// Status is StatusCompleted or StatusFailed.
	Status Status
	// Attempts is the number of failed attempts.
	Attempts int
	// Poisoned reports a failed row that redeliveries no longer run (see Outcome
	// PreviouslyFailed); RetryFailed clears it.
	Poisoned bool
	// LastError is the last handler error of a failed row.
	LastError string
	// ReceivedAt is when the row was first written.
	ReceivedAt time.Time
	// CompletedAt is when the row completed, if it did.
	CompletedAt *time.Time
	// FailedAt is when the last attempt failed, if one did.
	FailedAt *time.Time
}

// Key identifies an inbox row of a Store's consumer.
type Key struct {
	// Source is the event's Source.
	Source string
	// DedupeKey is the row's dedupe key.
	DedupeKey string
}

// Lookup returns the row of (source, dedupeKey), or [ErrNotFound].
func (a *Admin) Lookup(ctx context.Context, db keiro.DB, k Key) (Entry, error) {
	e, err := scanEntry(db.QueryRow(ctx, a.s.sql.lookup, a.s.cfg.Consumer, k.Source, k.DedupeKey))
	if errors.Is(err, pgx.ErrNoRows) {
		return Entry{}, fmt.Errorf("look up inbox row %s/%s: %w", k.Source, k.DedupeKey, ErrNotFound)
	}
	if err != nil {
		return Entry{}, fmt.Errorf("look up inbox row %s/%s: %w", k.Source, k.DedupeKey, err)
	}
	return e, nil
}

// Defaults of ListOptions.
const (
	// DefaultListLimit is the page size of ListFailed.
	DefaultListLimit = 100
)

// ListOptions selects a page of failed rows.
type ListOptions struct {
	// Source keeps only rows of this source. Defaults to "" (all sources).
	Source string
	// Limit is the page size. Defaults to DefaultListLimit.
	Limit int
	// After continues after this entry (pass the last entry of the previous page). Defaults to
	// nil (the first page).
	After *Entry
	// Archived lists only archived rows (failed rows an operator set aside with Archive).
	// Defaults to false: only rows not archived, the working list.
	Archived bool
	// PayloadBytes, when positive, reads at most this many bytes of each row's payload
	// (Entry.PayloadSize has its whole size), so a page of large messages reads only what it
	// shows; NoPayload reads none. Defaults to 0 (whole payloads).
	PayloadBytes int
}

// SearchOptions is a search of Search.
type SearchOptions struct {
	// Term is the source, dedupe key, message id, key or event type searched for, exactly.
	// Required.
	Term string
	// Limit is the most rows returned. Defaults to DefaultListLimit.
	Limit int
	// PayloadBytes, when positive, reads at most this many bytes of each row's payload, as
	// ListOptions.PayloadBytes does; NoPayload reads none. Defaults to 0 (whole payloads).
	PayloadBytes int
}

// NoPayload, as ListOptions.PayloadBytes or SearchOptions.PayloadBytes, lists rows without
// their payloads (Entry.PayloadSize still has each payload's size).
const NoPayload = pgtext.PrefixNone

// ListFailed returns failed rows of the store's consumer, oldest failure first, for the
// `consumer inbox failed list` command.
func (a *Admin) ListFailed(ctx context.Context, db keiro.DB, opts ListOptions) ([]Entry, error) {
	if opts.Limit <= 0 {
		opts.Limit = DefaultListLimit
	}
	if opts.PayloadBytes < NoPayload {
		return nil, fmt.Errorf("list failed inbox rows: PayloadBytes %d is negative; NoPayload (-1) lists no payloads", opts.PayloadBytes)
	}
	afterAt, afterSrc, afterKey := time.Time{}, "", ""
	if opts.After != nil && opts.After.FailedAt != nil {
		afterAt, afterSrc, afterKey = *opts.After.FailedAt, opts.After.Source, opts.After.DedupeKey
	}
	return listEntries(ctx, db, "list failed inbox rows", a.s.sql.listFailed,
		a.s.cfg.Consumer, opts.Source, afterAt, afterSrc, afterKey, opts.Limit, opts.Archived, opts.PayloadBytes)
}

// Search returns the store's consumer's rows, completed or failed, whose source, dedupe key,
// message id, key or event type is exactly opts.Term, newest received first: how an operator
// finds a message by what a log line names. It reads every row of the consumer; an empty term
// is an error.
func (a *Admin) Search(ctx context.Context, db keiro.DB, opts SearchOptions) ([]Entry, error) {
	if opts.Term == "" {
		return nil, errors.New("search inbox rows: the search term is empty")
	}
	if opts.Limit <= 0 {
		opts.Limit = DefaultListLimit
	}
	if opts.PayloadBytes < NoPayload {
		return nil, fmt.Errorf("search inbox rows: PayloadBytes %d is negative; NoPayload (-1) lists no payloads", opts.PayloadBytes)
	}
	return listEntries(ctx, db, "search inbox rows", a.s.sql.search, a.s.cfg.Consumer, opts.Term, opts.Limit, opts.PayloadBytes)
}

// listEntries runs a listing statement and scans its rows.
func listEntries(ctx context.Context, db keiro.DB, what, sql string, args ...any) ([]Entry, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Entry, error) { return scanEntry(r) })
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// AttemptHistory returns row k's failed attempts, oldest first (the last 20; deliveries and
// Reprocess alike), or [ErrNotFound]. A row that never failed has none.
func (a *Admin) AttemptHistory(ctx context.Context, db keiro.DB, k Key) ([]failure.Attempt, error) {
	return adminq.Attempts(ctx, db, fmt.Sprintf("inbox row %s/%s", k.Source, k.DedupeKey), ErrNotFound,
		a.s.sql.attemptErrors, a.s.cfg.Consumer, k.Source, k.DedupeKey)
}

// Archive sets aside the store consumer's failed rows among keys that are not archived yet, and
// returns them: an operator's "nothing to do about these". Archived rows leave the working list
// (ListFailed without Archived, and so `consumer inbox failed list` and retry --all) and stay in
// the table: ListFailed with Archived lists them, Search and Lookup find them, and Reprocess
// runs them. A completed, missing or already archived row is not in the answer.
func (a *Admin) Archive(ctx context.Context, db keiro.DB, keys []Key) ([]Key, error) {
	if len(keys) == 0 {
		return nil, errors.New("archive inbox rows: no keys")
	}
	srcs, dks := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		srcs[i], dks[i] = k.Source, k.DedupeKey
	}
	rows, err := db.Query(ctx, a.s.sql.archive, a.s.cfg.Consumer, srcs, dks)
	if err != nil {
		return nil, fmt.Errorf("archive inbox rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Key, error) {
		var k Key
		return k, r.Scan(&k.Source, &k.DedupeKey)
	})
	if err != nil {
		return nil, fmt.Errorf("archive inbox rows: %w", err)
	}
	return out, nil
}

// RetryFilter selects the failed rows RetryFailed resets.
type RetryFilter struct {
	// Keys lists the rows to reset.
	Keys []Key
	// All resets every failed row of the consumer; Keys is then ignored.
	All bool
}

// RetryFailed resets failed rows (attempt count 0, not poisoned) so that the next delivery of
// each runs the handler again, with a fresh attempt budget. It returns how many rows it reset.
//
// A reset alone does not run anything: the consumer runner already committed the offset of a
// poisoned message (after dead-lettering it), so Kafka will not redeliver it unless the
// dead-letter topic is replayed or offsets are rewound. To re-run a failed message now, from
// its stored envelope, use [Admin.Reprocess] (the `consumer inbox failed retry` command does).
func (a *Admin) RetryFailed(ctx context.Context, db keiro.DB, f RetryFilter) (int64, error) {
	var (
		tag interface{ RowsAffected() int64 }
		err error
	)
	switch {
	case f.All:
		tag, err = db.Exec(ctx, a.s.sql.retryAll, a.s.cfg.Consumer)
	case len(f.Keys) > 0:
		srcs, keys := make([]string, len(f.Keys)), make([]string, len(f.Keys))
		for i, k := range f.Keys {
			srcs[i], keys[i] = k.Source, k.DedupeKey
		}
		tag, err = db.Exec(ctx, a.s.sql.retryKeys, a.s.cfg.Consumer, srcs, keys)
	default:
		return 0, errors.New("retry failed inbox rows: name the rows (Keys) or set All")
	}
	if err != nil {
		return 0, fmt.Errorf("retry failed inbox rows: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Reprocess re-runs h for the failed row k from its stored full envelope, inside an inbox
// transaction, whatever its attempt count: success marks it completed (Processed); failure
// records one more attempt (HandlerFailed or Poisoned). A completed row is a Duplicate and h
// does not run. A missing row returns [ErrNotFound].
func (a *Admin) Reprocess(ctx context.Context, db keiro.DB, k Key, h Handler) (Result, error) {
	var e Entry
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		e, err = a.Lookup(ctx, tx, k)
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("reprocess inbox row: %w", err)
	}
	if e.Status == StatusCompleted {
		return Result{Outcome: Duplicate, DedupeKey: k.DedupeKey, Attempts: e.Attempts}, nil
	}
	e.Delivery.Event.Source = k.Source
	return a.s.process(ctx, db, e.Delivery, k.DedupeKey, h, true)
}

// FailureGroups lists at most limit groups of the store consumer's failed rows (archived ones
// aside), largest first; a group's Where lists sources. It scans those rows: an operator's
// view, not a hot path.
func (a *Admin) FailureGroups(ctx context.Context, db keiro.DB, limit int) ([]failure.Group, error) {
	return adminq.Groups(ctx, db, "list inbox failure groups", a.s.sql.failureGroups, limit, a.s.cfg.Consumer)
}

// FailureGroupKeys lists the keys of at most limit rows of the group of class and message (as
// FailureGroups lists them), oldest failure first.
func (a *Admin) FailureGroupKeys(ctx context.Context, db keiro.DB, class, message string, limit int) ([]Key, error) {
	return adminq.Keys(ctx, db, "list the messages of an inbox failure group", a.s.sql.failureGroupKeys,
		func(r pgx.CollectableRow) (Key, error) {
			var k Key
			return k, r.Scan(&k.Source, &k.DedupeKey)
		}, class, message, limit, a.s.cfg.Consumer)
}

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
func (a *Admin) CountByConsumer(ctx context.Context, db keiro.DB) ([]Counts, error) {
	var archive bool
	if err := db.QueryRow(ctx, a.s.sql.hasArchive).Scan(&archive); err != nil {
		return nil, fmt.Errorf("count inbox rows: %w", err)
	}
	query := a.s.sql.countByConsumerUnarchived
	if archive {
		query = a.s.sql.countByConsumer
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
func (a *Admin) Activity(ctx context.Context, db keiro.DB, from time.Time, n int) ([]Minute, error) {
	if n < 1 {
		return nil, fmt.Errorf("inbox activity: n must be at least 1, got %d", n)
	}
	ms, err := adminq.Activity(ctx, db, "read inbox activity", a.s.sql.activity, from, n, a.s.cfg.Consumer)
	if err != nil {
		return nil, err
	}
	out := make([]Minute, n)
	for i, m := range ms {
		out[i] = Minute{Start: m.Start, Completed: m.Done, Failed: m.Failed}
	}
	return out, nil
}

package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/failure"
	"github.com/keiro-go/keiro/internal/failgroup"
	"github.com/keiro-go/keiro/internal/pgtext"
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
	// Status is "completed" or "failed".
	Status string
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
func (s *Store) Lookup(ctx context.Context, db DB, k Key) (Entry, error) {
	e, err := scanEntry(db.QueryRow(ctx, s.sql.lookup, s.cfg.Consumer, k.Source, k.DedupeKey))
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
func (s *Store) ListFailed(ctx context.Context, db DB, opts ListOptions) ([]Entry, error) {
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
	return listEntries(ctx, db, "list failed inbox rows", s.sql.listFailed,
		s.cfg.Consumer, opts.Source, afterAt, afterSrc, afterKey, opts.Limit, opts.Archived, opts.PayloadBytes)
}

// Search returns the store's consumer's rows, completed or failed, whose source, dedupe key,
// message id, key or event type is exactly opts.Term, newest received first: how an operator
// finds a message by what a log line names. It reads every row of the consumer; an empty term
// is an error.
func (s *Store) Search(ctx context.Context, db DB, opts SearchOptions) ([]Entry, error) {
	if opts.Term == "" {
		return nil, errors.New("search inbox rows: the search term is empty")
	}
	if opts.Limit <= 0 {
		opts.Limit = DefaultListLimit
	}
	if opts.PayloadBytes < NoPayload {
		return nil, fmt.Errorf("search inbox rows: PayloadBytes %d is negative; NoPayload (-1) lists no payloads", opts.PayloadBytes)
	}
	return listEntries(ctx, db, "search inbox rows", s.sql.search, s.cfg.Consumer, opts.Term, opts.Limit, opts.PayloadBytes)
}

// listEntries runs a listing statement and scans its rows.
func listEntries(ctx context.Context, db DB, what, sql string, args ...any) ([]Entry, error) {
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
func (s *Store) AttemptHistory(ctx context.Context, db DB, k Key) ([]failure.Attempt, error) {
	return failgroup.Attempts(ctx, db, fmt.Sprintf("inbox row %s/%s", k.Source, k.DedupeKey), ErrNotFound,
		s.sql.attemptErrors, s.cfg.Consumer, k.Source, k.DedupeKey)
}

// Archive sets aside the store consumer's failed rows among keys that are not archived yet, and
// returns them: an operator's "nothing to do about these". Archived rows leave the working list
// (ListFailed without Archived, and so `consumer inbox failed list` and retry --all) and stay in
// the table: ListFailed with Archived lists them, Search and Lookup find them, and Reprocess
// runs them. A completed, missing or already archived row is not in the answer.
func (s *Store) Archive(ctx context.Context, db DB, keys []Key) ([]Key, error) {
	if len(keys) == 0 {
		return nil, errors.New("archive inbox rows: no keys")
	}
	srcs, dks := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		srcs[i], dks[i] = k.Source, k.DedupeKey
	}
	rows, err := db.Query(ctx, s.sql.archive, s.cfg.Consumer, srcs, dks)
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
// its stored envelope, use [Store.Reprocess] (the `consumer inbox failed retry` command does).
func (s *Store) RetryFailed(ctx context.Context, db DB, f RetryFilter) (int64, error) {
	var (
		tag interface{ RowsAffected() int64 }
		err error
	)
	switch {
	case f.All:
		tag, err = db.Exec(ctx, s.sql.retryAll, s.cfg.Consumer)
	case len(f.Keys) > 0:
		srcs, keys := make([]string, len(f.Keys)), make([]string, len(f.Keys))
		for i, k := range f.Keys {
			srcs[i], keys[i] = k.Source, k.DedupeKey
		}
		tag, err = db.Exec(ctx, s.sql.retryKeys, s.cfg.Consumer, srcs, keys)
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
func (s *Store) Reprocess(ctx context.Context, db DB, k Key, h Handler) (Result, error) {
	var e Entry
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		e, err = s.Lookup(ctx, tx, k)
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("reprocess inbox row: %w", err)
	}
	if e.Status == "completed" {
		return Result{Outcome: Duplicate, DedupeKey: k.DedupeKey, Attempts: e.Attempts}, nil
	}
	e.Delivery.Event.Source = k.Source
	return s.process(ctx, db, e.Delivery, k.DedupeKey, h, true)
}

// Defaults of retention.
const (
	// DefaultRetention is the dedupe window: completed rows older than this are deleted by
	// the consumer's maintenance. A redelivery after the window runs the handler again.
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultDeleteBatch is how many rows one retention statement deletes.
	DefaultDeleteBatch = 1000
)

// DeleteCompleted deletes the consumer's completed rows that completed more than olderThan
// ago, batch rows per statement (each its own short transaction, to keep locks and WAL bursts
// small), and returns how many it deleted. Failed rows are kept for operators.
//
// The retention defines the dedupe window: a message redelivered after its row was deleted is
// processed again. Keep olderThan well above the longest redelivery delay you expect (topic
// retention when offsets can be rewound, replays of dead-letter topics).
func (s *Store) DeleteCompleted(ctx context.Context, db DB, olderThan time.Duration, batch int) (int64, error) {
	if batch <= 0 {
		batch = DefaultDeleteBatch
	}
	var total int64
	for {
		n, err := s.deleteCompletedBatch(ctx, db, olderThan, batch)
		total += n
		if err != nil || n < int64(batch) {
			return total, err
		}
	}
}

// deleteCompletedBatch deletes at most batch of the consumer's completed rows older than
// olderThan, and returns how many it deleted.
func (s *Store) deleteCompletedBatch(ctx context.Context, db DB, olderThan time.Duration, batch int) (int64, error) {
	tag, err := db.Exec(ctx, s.sql.deleteCompleted, s.cfg.Consumer, intervalText(olderThan), batch)
	if err != nil {
		return 0, fmt.Errorf("delete completed inbox rows: %w", err)
	}
	return tag.RowsAffected(), nil
}

// CountFailed returns the number of failed rows of the consumer (the keiro.inbox.backlog gauge).
func (s *Store) CountFailed(ctx context.Context, db DB) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, s.sql.countFailed, s.cfg.Consumer).Scan(&n); err != nil {
		return 0, fmt.Errorf("count failed inbox rows: %w", err)
	}
	return n, nil
}

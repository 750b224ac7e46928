package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro/envelope"
)

// ProcessBatch processes ds in one transaction, in input order, and returns one Result per
// delivery:
//
//   - a repeat of an earlier delivery's (source, dedupe key) in the same batch is a Duplicate
//     without touching the database;
//   - all dedupe rows are inserted by one statement, then each handler runs in the shared
//     transaction, which commits once;
//   - if any handler fails (or leaves the transaction unusable), everything is rolled back and
//     the unique deliveries go through [Store.Process] one at a time, so a poison message never
//     discards its batch mates and each failure is accounted for individually.
//
// If any delivery's dedupe key cannot be computed, ProcessBatch returns a *[DedupePolicyError]
// (naming the delivery's index) before touching the database; call [Store.DedupeKey] first to
// filter such deliveries. A database error returns (nil, err): some deliveries may have
// committed (in the one-at-a-time fallback); retrying the batch classifies those as Duplicate.
func (s *Store) ProcessBatch(ctx context.Context, db TxBeginner, ds []Delivery, h Handler) ([]Result, error) {
	return s.processBatch(ctx, db, ds, h, nil, false)
}

// BatchHandler applies the effects of several events at once through tx, the inbox
// transaction (for example one multi-row INSERT), which is much faster than one statement per
// event when the database round trip dominates. The same rules as for [Handler] apply; an
// error rolls back the whole batch.
type BatchHandler func(ctx context.Context, tx pgx.Tx, evs []envelope.Event) error

// Handler adapts bh to a [Handler] that passes a one-event slice.
func (bh BatchHandler) Handler() Handler {
	return func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		return bh(ctx, tx, []envelope.Event{ev})
	}
}

// ProcessBatchWith is [Store.ProcessBatch] with a [BatchHandler]: bh runs once, in the batch
// transaction, with the events that are neither duplicates nor poisoned, in input order. If
// it fails, the batch rolls back and each of those deliveries goes through [Store.Process]
// with bh given a one-event slice, so a poison message never discards its batch mates.
func (s *Store) ProcessBatchWith(ctx context.Context, db TxBeginner, ds []Delivery, bh BatchHandler) ([]Result, error) {
	return s.processBatch(ctx, db, ds, bh.Handler(), bh, false)
}

// processBatch implements ProcessBatch and ProcessBatchWith. stopAtFailure makes the
// one-at-a-time fallback stop at the first HandlerFailed or Deferred result, leaving the later unique
// deliveries unattempted (Outcome 0), so that the consumer can retry the failed one first and
// keep per-key order.
func (s *Store) processBatch(ctx context.Context, db TxBeginner, ds []Delivery, h Handler, bh BatchHandler, stopAtFailure bool) ([]Result, error) {
	results := make([]Result, len(ds))
	seen := make(map[[2]string]bool, len(ds))
	unique := make([]int, 0, len(ds))
	for i := range ds {
		key, err := s.cfg.DedupePolicy.Key(ds[i])
		if err != nil {
			return nil, fmt.Errorf("delivery %d of the batch: %w", i, err)
		}
		results[i].DedupeKey = key
		k := [2]string{ds[i].Event.Source, key}
		if seen[k] {
			results[i].Outcome = Duplicate
			continue
		}
		seen[k] = true
		unique = append(unique, i)
	}
	if len(unique) == 0 {
		s.countBatch(ctx, ds, results)
		return results, nil
	}
	committed, err := s.tryBatch(ctx, db, ds, unique, h, bh, results)
	if err != nil {
		return nil, err
	}
	if committed {
		s.countBatch(ctx, ds, results)
		return results, nil
	}
	for _, i := range unique {
		r, err := s.process(ctx, db, ds[i], results[i].DedupeKey, h, false)
		if err != nil {
			return nil, err
		}
		results[i] = r
		if stopAtFailure && (r.Outcome == HandlerFailed || r.Outcome == Deferred) {
			break
		}
	}
	s.countInBatchDuplicates(ctx, ds, unique, results)
	return results, nil
}

func (s *Store) countBatch(ctx context.Context, ds []Delivery, results []Result) {
	for i := range ds {
		s.in.count(ctx, s.cfg.Consumer, s.topic(&ds[i]), results[i])
	}
}

func (s *Store) countInBatchDuplicates(ctx context.Context, ds []Delivery, unique []int, results []Result) {
	u := 0
	for i := range ds {
		if u < len(unique) && unique[u] == i {
			u++
			continue
		}
		s.in.count(ctx, s.cfg.Consumer, s.topic(&ds[i]), results[i])
	}
}

// tryBatch runs the unique deliveries in one transaction. committed=false (with a nil error)
// means it rolled back and the caller must fall back to one at a time.
func (s *Store) tryBatch(ctx context.Context, db TxBeginner, ds []Delivery, unique []int, h Handler, bh BatchHandler, results []Result) (committed bool, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("begin inbox batch transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	full := s.cfg.Persistence == FullEnvelope
	cols := newRowColumns(len(unique))
	for _, i := range unique {
		cols.add(ds[i].Event.Source, results[i].DedupeKey, &ds[i], full)
	}
	inserted, err := s.insertCompleted(ctx, tx, cols)
	if err != nil {
		return false, err
	}
	toRun := make([]int, 0, len(unique))
	rerun := map[int]bool{}
	if len(inserted) < len(unique) {
		var srcs, keys []string
		for _, i := range unique {
			if !inserted[[2]string{ds[i].Event.Source, results[i].DedupeKey}] {
				srcs = append(srcs, ds[i].Event.Source)
				keys = append(keys, results[i].DedupeKey)
			}
		}
		type existing struct {
			status   string
			attempts int32
			poisoned bool
			dead     bool
		}
		found := map[[2]string]existing{}
		read := func(q string, srcs, keys []string) error {
			rows, err := tx.Query(ctx, q, s.cfg.Consumer, srcs, keys)
			if err != nil {
				return fmt.Errorf("read existing inbox rows: %w", err)
			}
			var src, key string
			var e existing
			if _, err := pgx.ForEachRow(rows, []any{&src, &key, &e.status, &e.attempts, &e.poisoned, &e.dead}, func() error {
				found[[2]string{src, key}] = e
				return nil
			}); err != nil {
				return fmt.Errorf("read existing inbox rows: %w", err)
			}
			return nil
		}
		if err := read(s.sql.readExistingAll, srcs, keys); err != nil {
			return false, err
		}
		// Failed rows may be rerun: lock them (completed rows are terminal and stay unlocked).
		var failedSrcs, failedKeys []string
		for k, e := range found {
			if e.status == "failed" {
				failedSrcs, failedKeys = append(failedSrcs, k[0]), append(failedKeys, k[1])
			}
		}
		if len(failedSrcs) > 0 {
			for i := range failedSrcs {
				delete(found, [2]string{failedSrcs[i], failedKeys[i]})
			}
			if err := read(s.sql.lockExistingAll, failedSrcs, failedKeys); err != nil {
				return false, err
			}
		}
		if len(found) != len(srcs) {
			return false, nil // rows vanished under retention: let the single path sort it out
		}
		for _, i := range unique {
			k := [2]string{ds[i].Event.Source, results[i].DedupeKey}
			e, ok := found[k]
			if !ok {
				continue
			}
			results[i].Attempts = int(e.attempts)
			switch {
			case e.status == "completed":
				results[i].Outcome = Duplicate
			case e.poisoned || int(e.attempts) >= s.cfg.MaxAttempts:
				results[i].Outcome, results[i].DeadLettered = PreviouslyFailed, e.dead
				results[i].Err = fmt.Errorf("inbox: message previously failed %d times", e.attempts)
			default:
				rerun[i] = true
			}
		}
	}
	for _, i := range unique {
		if results[i].Outcome == 0 {
			toRun = append(toRun, i)
		}
	}

	spans := make([]trace.Span, 0, len(toRun))
	endSpans := func(note string) {
		for _, sp := range spans {
			sp.AddEvent(note)
			sp.End()
		}
	}
	if bh != nil && len(toRun) > 0 {
		evs := make([]envelope.Event, len(toRun))
		for n, i := range toRun {
			_, span := s.in.startProcessSpan(ctx, s.group, &ds[i])
			spans = append(spans, span)
			evs[n] = ds[i].Event
		}
		if herr := s.runBatchHandler(ctx, tx, evs, bh); herr != nil {
			endSpans("batch rolled back after a handler failure; retried one at a time")
			return false, nil
		}
	}
	for _, i := range toRun {
		if bh == nil {
			hctx, span := s.in.startProcessSpan(ctx, s.group, &ds[i])
			spans = append(spans, span)
			if herr := s.runHandler(hctx, tx, ds[i].Event, h); herr != nil {
				endSpans("batch rolled back after a handler failure; retried one at a time")
				return false, nil
			}
		}
		if rerun[i] {
			q := s.sql.markCompleted
			if !full {
				q = s.sql.markCompletedDO
			}
			if _, err := tx.Exec(ctx, q, s.cfg.Consumer, ds[i].Event.Source, results[i].DedupeKey); err != nil {
				endSpans("batch rolled back; retried one at a time")
				if isTxAborted(err) {
					return false, nil
				}
				return false, fmt.Errorf("mark inbox row completed: %w", err)
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		endSpans("batch commit failed")
		if errors.Is(err, pgx.ErrTxCommitRollback) {
			return false, nil
		}
		return false, fmt.Errorf("commit inbox batch transaction: %w", err)
	}
	for n, i := range toRun {
		results[i].Outcome = Processed
		endProcessSpan(spans[n], results[i], nil)
	}
	return true, nil
}

package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

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
//   - if a handler fails, everything is rolled back; the deliveries before the failing one
//     commit together in a new transaction, the failing one goes through [Store.Process] alone
//     (so a poison message never discards its batch mates and each failure is accounted for
//     individually), and the ones after it form the next batch. If the transaction breaks in a
//     way that names no delivery, the rest go through [Store.Process] one at a time.
//
// If any delivery's dedupe key cannot be computed, ProcessBatch returns a *[DedupePolicyError]
// (naming the delivery's index) before touching the database; call [Store.DedupeKey] first to
// filter such deliveries. A database error returns (nil, err): some deliveries may have
// committed (in the one-at-a-time fallback); retrying the batch classifies those as Duplicate.
func (s *Store) ProcessBatch(ctx context.Context, db DB, ds []Delivery, h Handler) ([]Result, error) {
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
// it fails, the batch rolls back and is run again with bh given one-event slices, which finds
// the failing event; from there on it proceeds as [Store.ProcessBatch] does, so a poison
// message never discards its batch mates.
func (s *Store) ProcessBatchWith(ctx context.Context, db DB, ds []Delivery, bh BatchHandler) ([]Result, error) {
	return s.processBatch(ctx, db, ds, bh.Handler(), bh, false)
}

// processBatch implements ProcessBatch and ProcessBatchWith. stopAtFailure makes it stop at
// the first HandlerFailed or Deferred result, leaving the later unique deliveries unattempted
// (Outcome 0), so that the consumer can retry the failed one first and keep per-key order.
//
// After a failed batch, the deliveries before the failing one (known when each handler runs
// on its own; a BatchHandler's batch is re-run that way once to find it) commit together in a
// new batch transaction, the failing one goes through process alone, and the rest form the
// next batch. When the failing delivery cannot be told (the commit itself failed), the rest go
// one at a time.
func (s *Store) processBatch(ctx context.Context, db DB, ds []Delivery, h Handler, bh BatchHandler, stopAtFailure bool) (_ []Result, rerr error) {
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
	defer func() {
		if rerr == nil {
			s.countInBatchDuplicates(ctx, ds, unique, results)
		}
	}()
	failed := func(r Result) bool { return r.Outcome == HandlerFailed || r.Outcome == Deferred }
	// oneAtATime runs pending through process; false means it stopped at a failure.
	oneAtATime := func(pending []int) (bool, error) {
		for _, i := range pending {
			r, err := s.process(ctx, db, ds[i], results[i].DedupeKey, h, false)
			if err != nil {
				return false, err
			}
			results[i] = r
			if stopAtFailure && failed(r) {
				return false, nil
			}
		}
		return true, nil
	}
	pending := unique
	for len(pending) > 0 {
		committed, failedAt, err := s.tryBatch(ctx, db, ds, pending, h, bh, results)
		if err != nil {
			return nil, err
		}
		if !committed && failedAt < 0 && bh != nil {
			// Which event failed the batch handler? Each handler alone, in one transaction.
			committed, failedAt, err = s.tryBatch(ctx, db, ds, pending, h, nil, results)
			if err != nil {
				return nil, err
			}
		}
		if committed {
			s.countBatch(ctx, ds, results, pending)
			return results, nil
		}
		if failedAt < 0 {
			if _, err := oneAtATime(pending); err != nil {
				return nil, err
			}
			return results, nil
		}
		if prefix := pending[:failedAt]; len(prefix) > 0 {
			// They ran before the failure: commit them together again.
			ok, _, err := s.tryBatch(ctx, db, ds, prefix, h, bh, results)
			if err != nil {
				return nil, err
			}
			if ok {
				s.countBatch(ctx, ds, results, prefix)
			} else if all, err := oneAtATime(prefix); err != nil || !all {
				return results, err
			}
		}
		if all, err := oneAtATime(pending[failedAt : failedAt+1]); err != nil || !all {
			return results, err
		}
		pending = pending[failedAt+1:]
	}
	return results, nil
}

// countBatch counts the results of a committed batch; deliveries whose handler did not run
// (duplicates, poisoned) get their `process` span here, as in Process.
func (s *Store) countBatch(ctx context.Context, ds []Delivery, results []Result, idx []int) {
	// Consecutive deliveries of one topic with one outcome are counted in one Add.
	var (
		run      int64
		runTopic string
		runRes   Result
	)
	for _, i := range idx {
		topic, res := s.topic(&ds[i]), results[i]
		if run > 0 && (topic != runTopic || res.Outcome != runRes.Outcome || res.DeadLettered != runRes.DeadLettered) {
			s.in.count(ctx, s.cfg.Consumer, runTopic, runRes, run)
			run = 0
		}
		run, runTopic, runRes = run+1, topic, res
		if res.Outcome != Processed {
			s.skippedSpan(ctx, &ds[i], res)
		}
	}
	if run > 0 {
		s.in.count(ctx, s.cfg.Consumer, runTopic, runRes, run)
	}
}

// skippedSpan records the `process` span of a delivery of a batch whose handler did not run.
func (s *Store) skippedSpan(ctx context.Context, d *Delivery, res Result) {
	_, span := s.in.startProcessSpan(ctx, s.group, d)
	endProcessSpan(span, res, nil)
}

func (s *Store) countInBatchDuplicates(ctx context.Context, ds []Delivery, unique []int, results []Result) {
	u := 0
	for i := range ds {
		if u < len(unique) && unique[u] == i {
			u++
			continue
		}
		s.in.count(ctx, s.cfg.Consumer, s.topic(&ds[i]), results[i], 1)
		s.skippedSpan(ctx, &ds[i], results[i])
	}
}

// tryBatch runs the unique deliveries in one transaction. committed=false (with a nil error)
// means it rolled back; failedAt is then the position in unique of the delivery whose handler
// failed, or -1 when that is unknown (a BatchHandler failed, the transaction broke elsewhere).
func (s *Store) tryBatch(ctx context.Context, db DB, ds []Delivery, unique []int, h Handler, bh BatchHandler, results []Result) (committed bool, failedAt int, err error) {
	committed, failedAt, err = s.runBatchTx(ctx, db, ds, unique, h, bh, results)
	if committed || err != nil {
		failedAt = -1
	}
	return committed, failedAt, err
}

func (s *Store) runBatchTx(ctx context.Context, db DB, ds []Delivery, unique []int, h Handler, bh BatchHandler, results []Result) (committed bool, failedAt int, err error) {
	failedAt = -1
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, -1, fmt.Errorf("begin inbox batch transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	full := s.cfg.Persistence == FullEnvelope
	cols := newRowColumns(len(unique))
	for _, i := range unique {
		cols.add(ds[i].Event.Source, results[i].DedupeKey, &ds[i], full)
	}
	inserted, err := s.insertCompleted(ctx, tx, cols)
	if err != nil {
		return false, -1, err
	}
	toRun := make([]int, 0, len(unique))
	rerun := map[int]bool{}
	if len(inserted) < len(unique) {
		var keys []rowKey
		for _, i := range unique {
			if k := (rowKey{ds[i].Event.Source, results[i].DedupeKey}); !inserted[k] {
				keys = append(keys, k)
			}
		}
		found, err := s.readExisting(ctx, tx, keys)
		if err != nil {
			return false, -1, err
		}
		if len(found) != len(keys) {
			return false, -1, nil // rows vanished under retention: let the single path sort it out
		}
		for _, i := range unique {
			if e, ok := found[rowKey{ds[i].Event.Source, results[i].DedupeKey}]; ok && s.settleExisting(e, false, &results[i]) {
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
			endSpans("batch rolled back after a handler failure; retried event by event")
			return false, -1, nil
		}
	}
	for _, i := range toRun {
		if bh == nil {
			hctx, span := s.in.startProcessSpan(ctx, s.group, &ds[i])
			spans = append(spans, span)
			if herr := s.runHandler(hctx, tx, ds[i].Event, h); herr != nil {
				endSpans("batch rolled back after a handler failure; the records before it commit in a new batch, the failing one is retried alone")
				return false, slices.Index(unique, i), nil
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
					return false, -1, nil
				}
				return false, -1, fmt.Errorf("mark inbox row completed: %w", err)
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		endSpans("batch commit failed")
		if errors.Is(err, pgx.ErrTxCommitRollback) {
			return false, -1, nil
		}
		return false, -1, fmt.Errorf("commit inbox batch transaction: %w", err)
	}
	for n, i := range toRun {
		results[i].Outcome = Processed
		endProcessSpan(spans[n], results[i], nil)
	}
	return true, -1, nil
}

package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro"
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
func (s *Store) ProcessBatch(ctx context.Context, db keiro.DB, ds []Delivery, h Handler) ([]Result, error) {
	keys, err := s.dedupeKeys(ds)
	if err != nil {
		return nil, err
	}
	return s.processBatch(ctx, db, ds, keys, h, nil, false)
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
func (s *Store) ProcessBatchWith(ctx context.Context, db keiro.DB, ds []Delivery, bh BatchHandler) ([]Result, error) {
	keys, err := s.dedupeKeys(ds)
	if err != nil {
		return nil, err
	}
	return s.processBatch(ctx, db, ds, keys, bh.Handler(), bh, false)
}

// dedupeKeys computes the dedupe key of each of ds, or returns a *[DedupePolicyError] naming the
// first delivery whose key cannot be computed.
func (s *Store) dedupeKeys(ds []Delivery) ([]string, error) {
	keys := make([]string, len(ds))
	for i := range ds {
		key, err := s.cfg.DedupePolicy.Key(ds[i])
		if err != nil {
			return nil, fmt.Errorf("delivery %d of the batch: %w", i, err)
		}
		keys[i] = key
	}
	return keys, nil
}

// processBatch implements ProcessBatch and ProcessBatchWith, with keys the deliveries' dedupe
// keys. stopAtFailure makes it stop at the first HandlerFailed or Deferred result, leaving the later unique deliveries unattempted
// (Outcome 0), so that the consumer can retry the failed one first and keep per-key order.
//
// After a failed batch, the deliveries before the failing one (known when each handler runs
// on its own; a BatchHandler's batch is re-run that way once to find it) commit together in a
// new batch transaction, the failing one goes through process alone, and the rest form the
// next batch. When the failing delivery cannot be told (the commit itself failed), the rest go
// one at a time.
func (s *Store) processBatch(ctx context.Context, db keiro.DB, ds []Delivery, keys []string, h Handler, bh BatchHandler, stopAtFailure bool) ([]Result, error) {
	b := s.newBatchRun(db, ds, keys, h, bh, stopAtFailure)
	if err := b.run(ctx); err != nil {
		return nil, err
	}
	s.countInBatchDuplicates(ctx, ds, b.unique, b.results)
	return b.results, nil
}

// batchRun is one call of processBatch: its deliveries, how to run them, and their results so
// far.
type batchRun struct {
	s             *Store
	db            keiro.DB
	ds            []Delivery
	h             Handler
	bh            BatchHandler
	stopAtFailure bool
	results       []Result
	// unique are the indexes in ds of the deliveries that are not repeats of an earlier one
	// in the batch (the repeats are Duplicates without touching the database).
	unique []int
}

// newBatchRun sets each delivery's dedupe key (keys) in its result and sets the in-batch
// repeats apart.
func (s *Store) newBatchRun(db keiro.DB, ds []Delivery, keys []string, h Handler, bh BatchHandler, stopAtFailure bool) *batchRun {
	b := &batchRun{s: s, db: db, ds: ds, h: h, bh: bh, stopAtFailure: stopAtFailure,
		results: make([]Result, len(ds)), unique: make([]int, 0, len(ds))}
	seen := make(map[rowKey]bool, len(ds))
	for i, key := range keys {
		b.results[i].DedupeKey = key
		k := rowKey{ds[i].Event.Source, key}
		if seen[k] {
			b.results[i].Outcome = Duplicate
			continue
		}
		seen[k] = true
		b.unique = append(b.unique, i)
	}
	return b
}

// run runs the unique deliveries in batch transactions until each has a result, or, with
// stopAtFailure, until the first failure.
func (b *batchRun) run(ctx context.Context) error {
	pending := b.unique
	for len(pending) > 0 {
		committed, failedAt, err := b.commit(ctx, pending)
		switch {
		case err != nil || committed:
			return err
		case failedAt < 0:
			_, err := b.oneAtATime(ctx, pending)
			return err
		}
		if all, err := b.commitPrefix(ctx, pending[:failedAt]); err != nil || !all {
			return err
		}
		if all, err := b.oneAtATime(ctx, pending[failedAt:failedAt+1]); err != nil || !all {
			return err
		}
		pending = pending[failedAt+1:]
	}
	return nil
}

// commit runs pending in one transaction and counts them if it commits. failedAt is the
// position in pending of the delivery whose handler failed, or -1 when that is unknown: when the
// batch handler failed, each handler is run alone, in one transaction, to find it.
func (b *batchRun) commit(ctx context.Context, pending []int) (committed bool, failedAt int, err error) {
	committed, failedAt, err = b.try(ctx, pending, b.bh)
	if err == nil && !committed && failedAt < 0 && b.bh != nil {
		committed, failedAt, err = b.try(ctx, pending, nil)
	}
	if committed {
		b.s.countBatch(ctx, b.ds, b.results, pending)
	}
	return committed, failedAt, err
}

// commitPrefix commits again, together, the deliveries that ran before a failure, or one at a
// time if that fails; false means it stopped at a failure.
func (b *batchRun) commitPrefix(ctx context.Context, prefix []int) (all bool, err error) {
	if len(prefix) == 0 {
		return true, nil
	}
	ok, _, err := b.try(ctx, prefix, b.bh)
	switch {
	case err != nil:
		return false, err
	case ok:
		b.s.countBatch(ctx, b.ds, b.results, prefix)
		return true, nil
	}
	return b.oneAtATime(ctx, prefix)
}

// oneAtATime runs pending through process; false means it stopped at a failure.
func (b *batchRun) oneAtATime(ctx context.Context, pending []int) (all bool, err error) {
	for _, i := range pending {
		r, err := b.s.process(ctx, b.db, b.ds[i], b.results[i].DedupeKey, b.h, false)
		if err != nil {
			return false, err
		}
		b.results[i] = r
		if b.stopAtFailure && (r.Outcome == HandlerFailed || r.Outcome == Deferred) {
			return false, nil
		}
	}
	return true, nil
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

// try runs the unique deliveries in one transaction, with bh (nil: each handler alone, h).
// committed=false (with a nil error) means it rolled back; failedAt is then the position in
// unique of the delivery whose handler failed, or -1 when that is unknown (a BatchHandler
// failed, the transaction broke elsewhere).
func (b *batchRun) try(ctx context.Context, unique []int, bh BatchHandler) (committed bool, failedAt int, err error) {
	tx, err := b.db.Begin(ctx)
	if err != nil {
		return false, -1, fmt.Errorf("begin inbox batch transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	rows, ok, err := b.insertRows(ctx, tx, unique)
	if err != nil || !ok {
		return false, -1, err
	}
	spans, rb := b.runHandlers(ctx, tx, unique, rows, bh)
	if rb == nil {
		rb = commitBatchTx(ctx, tx)
	}
	if rb != nil {
		for _, sp := range spans {
			sp.AddEvent(rb.note)
			sp.End()
		}
		return false, rb.failedAt, rb.err
	}
	for n, i := range rows.toRun {
		b.results[i].Outcome = Processed
		endProcessSpan(spans[n], b.results[i], nil)
	}
	return true, -1, nil
}

// batchRows is what a batch transaction's dedupe rows say of its deliveries: toRun run their
// handler (in order), and those in rerun also mark a failed row completed.
type batchRows struct {
	toRun []int
	rerun map[int]bool
}

// rollback is why a batch transaction did not commit: the note its spans get, the position of
// the delivery whose handler failed (-1 when unknown), and the error to return (nil when the
// deliveries should be retried another way).
type rollback struct {
	note     string
	failedAt int
	err      error
}

// insertRows inserts the completed dedupe rows of unique in tx and settles, from the rows
// earlier deliveries recorded, the deliveries whose row was in the way. ok=false means such a
// row vanished under retention: the single path sorts it out.
func (b *batchRun) insertRows(ctx context.Context, tx pgx.Tx, unique []int) (rows batchRows, ok bool, err error) {
	full := b.s.cfg.Persistence == FullEnvelope
	cols := newRowColumns(len(unique))
	for _, i := range unique {
		cols.add(b.ds[i].Event.Source, b.results[i].DedupeKey, &b.ds[i], full)
	}
	inserted, err := b.s.insertCompleted(ctx, tx, cols)
	if err != nil {
		return rows, false, err
	}
	rows.rerun = map[int]bool{}
	if len(inserted) < len(unique) {
		if ok, err := b.settleExisting(ctx, tx, unique, inserted, rows.rerun); !ok || err != nil {
			return rows, false, err
		}
	}
	rows.toRun = make([]int, 0, len(unique))
	for _, i := range unique {
		if b.results[i].Outcome == 0 {
			rows.toRun = append(rows.toRun, i)
		}
	}
	return rows, true, nil
}

// settleExisting reads, in tx, the rows of the batch's unique deliveries that the insert found
// in its way (those not in inserted) and settles their results from them; rerun gets the
// deliveries whose failed row runs its handler again. false means a row vanished under
// retention after the insert saw it.
func (b *batchRun) settleExisting(ctx context.Context, tx pgx.Tx, unique []int, inserted map[[2]string]bool, rerun map[int]bool) (bool, error) {
	var keys []rowKey
	for _, i := range unique {
		if k := (rowKey{b.ds[i].Event.Source, b.results[i].DedupeKey}); !inserted[k] {
			keys = append(keys, k)
		}
	}
	found, err := b.s.readExisting(ctx, tx, keys)
	if err != nil || len(found) != len(keys) {
		return false, err
	}
	for _, i := range unique {
		if e, ok := found[rowKey{b.ds[i].Event.Source, b.results[i].DedupeKey}]; ok && b.s.settleExisting(e, false, &b.results[i]) {
			rerun[i] = true
		}
	}
	return true, nil
}

// runHandlers runs the handlers of rows.toRun in tx (bh once for all of them, else h for each)
// and marks the rerun rows completed. It returns the deliveries' process spans, and a non-nil
// rollback when the transaction must not commit.
func (b *batchRun) runHandlers(ctx context.Context, tx pgx.Tx, unique []int, rows batchRows, bh BatchHandler) ([]trace.Span, *rollback) {
	spans := make([]trace.Span, 0, len(rows.toRun))
	if bh != nil && len(rows.toRun) > 0 {
		evs := make([]envelope.Event, len(rows.toRun))
		for n, i := range rows.toRun {
			_, span := b.s.in.startProcessSpan(ctx, b.s.group, &b.ds[i])
			spans = append(spans, span)
			evs[n] = b.ds[i].Event
		}
		if herr := b.s.runBatchHandler(ctx, tx, evs, bh); herr != nil {
			return spans, &rollback{note: "batch rolled back after a handler failure; retried event by event", failedAt: -1}
		}
	}
	for _, i := range rows.toRun {
		row := &handledRow{s: b.s, source: b.ds[i].Event.Source, key: b.results[i].DedupeKey}
		if bh == nil {
			hctx, span := b.s.in.startProcessSpan(ctx, b.s.group, &b.ds[i])
			spans = append(spans, span)
			if herr := b.s.runHandler(hctx, tx, b.ds[i].Event, b.h, row); herr != nil {
				return spans, &rollback{note: "batch rolled back after a handler failure; the records before it commit in a new batch, the failing one is retried alone",
					failedAt: slices.Index(unique, i)}
			}
		}
		if rows.rerun[i] && !row.failed {
			if rb := b.markCompleted(ctx, tx, i); rb != nil {
				return spans, rb
			}
		}
	}
	return spans, nil
}

// markCompleted marks the failed row of delivery i completed, in tx.
func (b *batchRun) markCompleted(ctx context.Context, tx pgx.Tx, i int) *rollback {
	q := b.s.sql.markCompleted
	if b.s.cfg.Persistence != FullEnvelope {
		q = b.s.sql.markCompletedDO
	}
	_, err := tx.Exec(ctx, q, b.s.cfg.Consumer, b.ds[i].Event.Source, b.results[i].DedupeKey)
	switch {
	case err == nil:
		return nil
	case isTxAborted(err):
		return &rollback{note: "batch rolled back; retried one at a time", failedAt: -1}
	}
	return &rollback{note: "batch rolled back; retried one at a time", failedAt: -1, err: fmt.Errorf("mark inbox row completed: %w", err)}
}

// commitBatchTx commits tx; a commit the server turned into a rollback returns a rollback
// without an error, so that the deliveries are retried one at a time.
func commitBatchTx(ctx context.Context, tx pgx.Tx) *rollback {
	err := tx.Commit(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return &rollback{note: "batch commit failed", failedAt: -1}
	}
	return &rollback{note: "batch commit failed", failedAt: -1, err: fmt.Errorf("commit inbox batch transaction: %w", err)}
}

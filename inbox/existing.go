package inbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// rowKey identifies an inbox row of the Store's consumer: (source, dedupe key).
type rowKey [2]string

// existingRow is what an earlier delivery recorded in the row an insert-first INSERT found in
// its way.
type existingRow struct {
	status       string
	attempts     int32
	poisoned     bool
	lastErr      string
	deadLettered bool
}

// readExisting reads the rows of keys that an earlier delivery recorded, in tx: it is the one
// reading of existing rows that Process and ProcessBatch share. Completed rows are terminal,
// so they are read without a lock (a duplicate-heavy stream writes nothing); failed rows may be
// rerun, so they are read again FOR UPDATE, which serialises two deliveries of one failed
// message. A key missing from the result vanished under concurrent retention after the INSERT
// saw it.
func (s *Store) readExisting(ctx context.Context, tx pgx.Tx, keys []rowKey) (map[rowKey]existingRow, error) {
	found := make(map[rowKey]existingRow, len(keys))
	if err := s.scanExisting(ctx, tx, s.sql.readExisting, keys, found); err != nil {
		return nil, err
	}
	var failed []rowKey
	for k, e := range found {
		if e.status == "failed" {
			failed = append(failed, k)
			delete(found, k)
		}
	}
	if len(failed) > 0 {
		if err := s.scanExisting(ctx, tx, s.sql.lockExisting, failed, found); err != nil {
			return nil, err
		}
	}
	return found, nil
}

// scanExisting runs q (readExisting or lockExisting) for keys and adds the rows to found.
func (s *Store) scanExisting(ctx context.Context, tx pgx.Tx, q string, keys []rowKey, found map[rowKey]existingRow) error {
	srcs, dkeys := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		srcs[i], dkeys[i] = k[0], k[1]
	}
	rows, err := tx.Query(ctx, q, s.cfg.Consumer, srcs, dkeys)
	if err != nil {
		return fmt.Errorf("read existing inbox rows: %w", err)
	}
	var k rowKey
	var e existingRow
	if _, err := pgx.ForEachRow(rows, []any{&k[0], &k[1], &e.status, &e.attempts, &e.poisoned, &e.lastErr, &e.deadLettered}, func() error {
		found[k] = e
		return nil
	}); err != nil {
		return fmt.Errorf("read existing inbox rows: %w", err)
	}
	return nil
}

// settleExisting sets res from an existing row and reports whether the delivery must run its
// handler again (a failed row below the ceiling, or any failed row when force is set): a
// completed row is a Duplicate, a poisoned or exhausted one PreviouslyFailed.
func (s *Store) settleExisting(e existingRow, force bool, res *Result) (rerun bool) {
	res.Attempts = int(e.attempts)
	switch {
	case e.status == "completed":
		res.Outcome = Duplicate
		return false
	case !force && (e.poisoned || int(e.attempts) >= s.cfg.MaxAttempts):
		res.Outcome, res.DeadLettered = PreviouslyFailed, e.deadLettered
		res.Err = fmt.Errorf("inbox: message previously failed %d times: %s", e.attempts, e.lastErr)
		return false
	}
	return true
}

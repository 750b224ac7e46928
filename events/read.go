package events

import (
	"context"
	"fmt"
	"iter"
	"math"

	"github.com/keiro-go/keiro"
)

// Direction is the order of a stream read.
type Direction uint8

const (
	// Forward reads from old to new.
	Forward Direction = iota
	// Backward reads from new to old.
	Backward
)

// ReadStream returns an iterator over stream's events, one page (StoreConfig.PageSize) per
// round trip on q. Forward reads versions after from (0: from the start); Backward reads versions
// before from (0: from the end). The iteration stops at the first error, which it yields.
func (s *Store) ReadStream(ctx context.Context, q keiro.DB, stream string, dir Direction, from int64) iter.Seq2[RecordedEvent, error] {
	return func(yield func(RecordedEvent, error) bool) {
		cursor := from
		sql := s.q.readStreamForward
		if dir == Backward {
			sql = s.q.readStreamBackward
			if cursor <= 0 {
				cursor = math.MaxInt64
			}
		}
		for {
			n, ok := s.page(ctx, q, yield, fmt.Sprintf("read stream %s", stream), func(e RecordedEvent) { cursor = e.StreamVersion },
				sql, stream, cursor, s.cfg.PageSize)
			if !ok || n < s.cfg.PageSize {
				return
			}
		}
	}
}

// ReadAll returns an iterator over the whole log after position after, in global-position order,
// one page per round trip on q. It reads what is committed now: an event whose transaction
// commits later with a lower position than one already read is not returned by this iteration.
// Use a Subscription to follow the log without missing such events.
func (s *Store) ReadAll(ctx context.Context, q keiro.DB, after int64) iter.Seq2[RecordedEvent, error] {
	return s.readLog(ctx, q, after, math.MaxInt64, "")
}

// ReadCategory is ReadAll restricted to the streams of one category ("order" for "order-42").
func (s *Store) ReadCategory(ctx context.Context, q keiro.DB, category string, after int64) iter.Seq2[RecordedEvent, error] {
	return s.readLog(ctx, q, after, math.MaxInt64, category)
}

// readLog pages through positions in (after, upTo], of one category when category is not "".
func (s *Store) readLog(ctx context.Context, q keiro.DB, after, upTo int64, category string) iter.Seq2[RecordedEvent, error] {
	return func(yield func(RecordedEvent, error) bool) {
		cursor := after
		for {
			var n int
			var ok bool
			set := func(e RecordedEvent) { cursor = e.GlobalPosition }
			if category == "" {
				n, ok = s.page(ctx, q, yield, "read all", set, s.q.readAll, cursor, upTo, s.cfg.PageSize)
			} else {
				n, ok = s.page(ctx, q, yield, "read category "+category, set, s.q.readCategory, cursor, upTo, s.cfg.PageSize, category)
			}
			if !ok || n < s.cfg.PageSize {
				return
			}
		}
	}
}

// readLogPage reads one page of positions in (after, upTo], of one category when category is
// not "".
func (s *Store) readLogPage(ctx context.Context, q keiro.DB, after, upTo int64, category string, limit int) iter.Seq2[RecordedEvent, error] {
	return func(yield func(RecordedEvent, error) bool) {
		nop := func(RecordedEvent) {}
		if category == "" {
			s.pageN(ctx, q, yield, "read all", nop, limit, s.q.readAll, after, upTo, limit)
		} else {
			s.pageN(ctx, q, yield, "read category "+category, nop, limit, s.q.readCategory, after, upTo, limit, category)
		}
	}
}

// page runs one page query, yields its rows and reports how many there were and whether to go on.
func (s *Store) page(ctx context.Context, q keiro.DB, yield func(RecordedEvent, error) bool, what string,
	advance func(RecordedEvent), sql string, args ...any) (int, bool) {
	return s.pageN(ctx, q, yield, what, advance, s.cfg.PageSize, sql, args...)
}

func (s *Store) pageN(ctx context.Context, q keiro.DB, yield func(RecordedEvent, error) bool, what string,
	advance func(RecordedEvent), size int, sql string, args ...any) (int, bool) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		yield(RecordedEvent{}, fmt.Errorf("%s: %w", what, err))
		return 0, false
	}
	// Buffer the page so that the consumer may use q (for example the same transaction)
	// while iterating.
	buf := make([]RecordedEvent, 0, size)
	for rows.Next() {
		e, err := scanRecorded(rows)
		if err != nil {
			rows.Close()
			yield(RecordedEvent{}, fmt.Errorf("%s: %w", what, err))
			return 0, false
		}
		buf = append(buf, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		yield(RecordedEvent{}, fmt.Errorf("%s: %w", what, err))
		return 0, false
	}
	for _, e := range buf {
		advance(e)
		if !yield(e, nil) {
			return len(buf), false
		}
	}
	return len(buf), true
}

// Head returns the newest global position committed now (0 for an empty log).
func (s *Store) Head(ctx context.Context, q keiro.DB) (int64, error) {
	var h int64
	if err := q.QueryRow(ctx, s.q.head).Scan(&h); err != nil {
		return 0, fmt.Errorf("read event store head: %w", err)
	}
	return h, nil
}

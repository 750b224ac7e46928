// Package adminq is the machinery the outbox's and the inbox's Admin share: grouping failed
// rows by error ([failure.Group], one SQL template for both tables), reading a row's attempt
// history, and counting a table's activity per minute.
package adminq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/failure"
	"github.com/keiro-go/keiro/internal/pgtext"
)

// Table describes one table's failed rows for grouping. Every field is SQL text written by
// the package that owns the table, never outside input.
type Table struct {
	// Rows is the FROM item and condition of the failed rows that are not archived, e.g.
	// "keiro.keiro_outbox WHERE phase = 2 AND archived_at IS NULL". It may use the parameters
	// $1 to $Params; the statements' own parameters follow them.
	Rows   string
	Params int
	// Class is a row's error class (failure.Group.Class).
	Class string
	// At is the column of a row's last failure (failure.Group.First and Last).
	At string
	// Where is the column listed in failure.Group.Where.
	Where string
	// Key is the column list that identifies a row of a group (KeysSQL); Order orders them,
	// and may name the failure time as "at".
	Key, Order string
}

// sqlGroups lists at most {{limit}} groups, largest first: class, message, count, first and
// last failure, one row's last error as written, up to 5 of Where and 5 event types.
const sqlGroups = `
SELECT class, message, count(*), min(at), max(at), min(last_error),
       (array_agg(DISTINCT place ORDER BY place))[1:5],
       (array_agg(DISTINCT event_type ORDER BY event_type))[1:5]
  FROM (SELECT {{class}} AS class, {{norm}} AS message, {{at}} AS at, coalesce(last_error, '') AS last_error,
               {{where}} AS place, coalesce(event_type, '') AS event_type
          FROM {{rows}}) g
 GROUP BY class, message
 ORDER BY count(*) DESC, class, message
 LIMIT {{limit}}`

// sqlKeys lists the keys of the group of class {{class_param}} and message
// {{message_param}}, in the table's order, at most {{limit}}.
const sqlKeys = `
SELECT {{key}} FROM (SELECT {{key}}, {{at}} AS at, {{class}} AS class, {{norm}} AS message
                       FROM {{rows}}) g
 WHERE class = {{class_param}} AND message = {{message_param}}
 ORDER BY {{order}}
 LIMIT {{limit}}`

// param is the placeholder of the table's i-th own parameter after its Rows' parameters.
func (t Table) param(i int) string { return "$" + strconv.Itoa(t.Params+i) }

// fill fills the template's own placeholders (pgtext.Partial), leaving the table's (its
// schema) to the package's statements.
func (t Table) fill(q, limit string) string {
	return pgtext.Partial(q, "class", t.Class, "norm", pgtext.NormalisedErrorSQL("last_error"),
		"at", t.At, "where", t.Where, "rows", t.Rows, "key", t.Key, "order", t.Order,
		"class_param", t.param(1), "message_param", t.param(2), "limit", limit)
}

// GroupsSQL is the statement of Groups: after the Rows' parameters, the most groups listed.
func (t Table) GroupsSQL() string { return t.fill(sqlGroups, t.param(1)) }

// KeysSQL is the statement of Keys: after the Rows' parameters, the group's class and message
// and the most keys listed.
func (t Table) KeysSQL() string { return t.fill(sqlKeys, t.param(3)) }

// Groups runs GroupsSQL on q with args (the Rows' parameters, then the limit, at least 1).
// what names the listing in errors ("list outbox failure groups").
func Groups(ctx context.Context, q keiro.DB, what, query string, limit int, args ...any) ([]failure.Group, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%s: limit must be at least 1", what)
	}
	rows, err := q.Query(ctx, query, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (failure.Group, error) {
		var g failure.Group
		return g, r.Scan(&g.Class, &g.Message, &g.Count, &g.First, &g.Last, &g.Example, &g.Where, &g.EventTypes)
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// Keys runs KeysSQL on q with args (the Rows' parameters), class, message and limit (at least
// 1), and scans each row with scan.
func Keys[K any](ctx context.Context, q keiro.DB, what, query string, scan pgx.RowToFunc[K],
	class, message string, limit int, args ...any) ([]K, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%s: limit must be at least 1", what)
	}
	rows, err := q.Query(ctx, query, append(args, class, message, limit)...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// Attempts reads a row's attempt history (its attempt_errors column) with query and args, one
// row of one jsonb column; notFound is returned, wrapped, when the row does not exist. what
// names the row in errors ("outbox row …").
func Attempts(ctx context.Context, q keiro.DB, what string, notFound error, query string, args ...any) ([]failure.Attempt, error) {
	var raw []byte
	if err := q.QueryRow(ctx, query, args...).Scan(&raw); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("%s: %w", what, notFound)
		}
		return nil, fmt.Errorf("read the attempts of %s: %w", what, err)
	}
	out := []failure.Attempt{}
	if raw != nil {
		if err := json.Unmarshal(raw, &out); err != nil {
			return nil, fmt.Errorf("read the attempts of %s: %w", what, err)
		}
	}
	return out, nil
}

// Minute counts one minute of a table's rows: Done (published, completed) and Failed.
type Minute struct {
	Start        time.Time
	Done, Failed int64
}

// Activity returns n minutes from the minute starting at from, zero counts included, oldest
// first, counted from query's rows (done bool, minute timestamptz, count bigint), which it
// runs with args, then from and the end of the n minutes. what names the reading in errors.
func Activity(ctx context.Context, q keiro.DB, what, query string, from time.Time, n int, args ...any) ([]Minute, error) {
	out := make([]Minute, n)
	for i := range out {
		out[i].Start = from.Add(time.Duration(i) * time.Minute).UTC()
	}
	rows, err := q.Query(ctx, query, append(args, from, from.Add(time.Duration(n)*time.Minute))...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	var done bool
	var at time.Time
	var count int64
	if _, err := pgx.ForEachRow(rows, []any{&done, &at, &count}, func() error {
		i := int(at.Sub(from) / time.Minute)
		if i < 0 || i >= n {
			return nil
		}
		if done {
			out[i].Done += count
		} else {
			out[i].Failed += count
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

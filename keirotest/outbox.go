package keirotest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/migrations"
	"github.com/keiro-go/keiro/outbox"
)

// checkStatus reports a status that is not one of outbox.Statuses; the empty status (any) is
// valid. RequireEnqueued and RequireNotEnqueued fail the test on any other value, so a misspelt
// status cannot make a RequireNotEnqueued pass without testing anything.
func checkStatus(s outbox.Status) error {
	if s == "" || s.Valid() {
		return nil
	}
	return fmt.Errorf("unknown Enqueued.Status %q: use outbox.StatusPending, StatusPublishing, StatusSent, StatusFailed, "+
		"StatusDead or StatusRejected", string(s))
}

// Enqueued describes the outbox rows a test expects (RequireEnqueued) or forbids
// (RequireNotEnqueued). Empty fields match anything.
type Enqueued struct {
	// Schema is the schema of the outbox. Defaults to the outbox the package-level
	// outbox.EnqueueTx writes to through the same connection (outbox.ResolveSchema): the
	// keiro_outbox table on its search_path (a NewDB pool's schema), else schema "keiro".
	Schema string
	// MessageID is the event's message id. Defaults to any.
	MessageID string
	// Source is the producing bounded context. Defaults to any.
	Source string
	// Destination is the topic. Defaults to any.
	Destination string
	// Key is the Kafka key. Defaults to any (keyed or not).
	Key string
	// NoKey requires an event without a key. Defaults to false.
	NoKey bool
	// EventType is the event type. Defaults to any.
	EventType string
	// Payload checks the payload (JSONSubset, JSONEqual, PayloadFunc, JSONFunc). Defaults to
	// any.
	Payload PayloadMatcher
	// Where is a last check of the whole event; its error says what differs. Defaults to none.
	Where func(envelope.Event) error
	// Status is the row's status, one of outbox.Statuses (outbox.StatusPending,
	// outbox.StatusSent, ...); any other value fails the test. Defaults to any.
	Status outbox.Status
	// Count is the exact number of matching rows RequireEnqueued wants. Defaults to 0: at
	// least one.
	Count int
}

func (e Enqueued) criteria() criteria {
	return criteria{messageID: e.MessageID, source: e.Source, destination: e.Destination, key: e.Key,
		noKey: e.NoKey, eventType: e.EventType, payload: e.Payload, where: e.Where, status: string(e.Status)}
}

// RequireEnqueued fails t unless the outbox holds a row matching want (exactly want.Count of
// them when it is set), and returns the matching rows in outbox order. q is where to look:
// the transaction that enqueued (rows are visible there before commit) or a pool after
// commit. The failure message lists every row the outbox holds and how each differs from
// want.
func RequireEnqueued(t testing.TB, q keiro.DB, want Enqueued) []outbox.Row {
	t.Helper()
	if want.Count < 0 {
		t.Fatalf("keirotest.RequireEnqueued: Enqueued.Count must not be negative, got %d", want.Count)
	}
	if err := checkStatus(want.Status); err != nil {
		t.Fatalf("keirotest.RequireEnqueued: %v", err)
	}
	schema, rows := outboxRows(t, "keirotest.RequireEnqueued", q, want.Schema)
	c := want.criteria()
	diffs := make([][]string, len(rows))
	var matched []outbox.Row
	for i, r := range rows {
		diffs[i] = c.mismatches(r.Event, string(r.Status))
		if len(diffs[i]) == 0 {
			matched = append(matched, r)
		}
	}
	if (want.Count == 0 && len(matched) > 0) || (want.Count > 0 && len(matched) == want.Count) {
		return matched
	}
	var found string
	switch {
	case len(rows) == 0:
		found = fmt.Sprintf("  found: the outbox of schema %q is empty (did the enqueuing transaction roll back, "+
			"or does it write to another schema?)", schema)
	default:
		found = fmt.Sprintf("  found %s in the outbox of schema %q:%s", plural(len(rows), "row"), schema,
			listing(len(rows), func(i int) string { return rowLine(rows[i]) }, func(i int) []string { return diffs[i] }))
	}
	head := "no outbox row matches"
	if want.Count > 0 {
		head = fmt.Sprintf("want exactly %s matching, found %d", plural(want.Count, "outbox row"), len(matched))
	}
	t.Fatalf("keirotest.RequireEnqueued: %s\n  want: %s\n%s", head, c.describe(), found)
	return nil
}

// RequireNotEnqueued fails t if the outbox holds a row matching unwanted (its Count is
// ignored), listing the rows that match. q is the transaction or a pool, as for
// RequireEnqueued.
func RequireNotEnqueued(t testing.TB, q keiro.DB, unwanted Enqueued) {
	t.Helper()
	if err := checkStatus(unwanted.Status); err != nil {
		t.Fatalf("keirotest.RequireNotEnqueued: %v", err)
	}
	schema, rows := outboxRows(t, "keirotest.RequireNotEnqueued", q, unwanted.Schema)
	c := unwanted.criteria()
	var matched []outbox.Row
	for _, r := range rows {
		if len(c.mismatches(r.Event, string(r.Status))) == 0 {
			matched = append(matched, r)
		}
	}
	if len(matched) == 0 {
		return
	}
	t.Fatalf("keirotest.RequireNotEnqueued: %s in the outbox of schema %q %s what the test forbids\n"+
		"  forbidden: %s\n  matching:%s", plural(len(matched), "row"), schema, verb(len(matched), "matches", "match"),
		c.describe(), listing(len(matched), func(i int) string { return rowLine(matched[i]) }, nil))
}

// OutboxRows returns every row of the outbox in schema (empty: as for Enqueued.Schema), in
// outbox order, read through q.
func OutboxRows(t testing.TB, q keiro.DB, schema string) []outbox.Row {
	t.Helper()
	_, rows := outboxRows(t, "keirotest.OutboxRows", q, schema)
	return rows
}

// outboxRows resolves the schema and reads its rows, failing t with who asked.
func outboxRows(t testing.TB, who string, q keiro.DB, schema string) (string, []outbox.Row) {
	t.Helper()
	if q == nil {
		t.Fatalf("%s: the querier is nil; pass the enqueuing transaction or a pool", who)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema, err := resolveSchema(ctx, q, schema)
	if err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	rows, err := readRows(ctx, q, schema, fmt.Sprintf(sqlOutboxIDs, schema))
	if err != nil {
		t.Fatalf("%s: read the outbox of schema %q: %v", who, schema, err)
	}
	return schema, rows
}

// resolveSchema returns schema if set (after checking it holds an outbox), else the schema
// whose outbox the package-level outbox.EnqueueTx writes to through q (outbox.ResolveSchema:
// the keiro_outbox table on q's search_path, else schema "keiro"), so that the kit looks where
// EnqueueTx writes.
func resolveSchema(ctx context.Context, q keiro.DB, schema string) (string, error) {
	if schema == "" {
		found, err := outbox.ResolveSchema(ctx, q)
		if errors.Is(err, outbox.ErrNoOutbox) {
			return "", fmt.Errorf("%w (or name the schema your outbox.Store uses in the Schema option)", err)
		}
		return found, err
	}
	if err := migrations.ValidateSchema(schema); err != nil {
		return "", fmt.Errorf("schema %q: %w", schema, err)
	}
	var exists bool
	if err := q.QueryRow(ctx, sqlTableExists, schema+".keiro_outbox").Scan(&exists); err != nil {
		return "", fmt.Errorf("find the outbox table: %w", err)
	}
	if !exists {
		return "", fmt.Errorf("there is no table %s.keiro_outbox: migrate the schema (keirotest.NewDB and "+
			"NewSchema do), or name the schema your outbox.Store uses in the Schema option", schema)
	}
	return schema, nil
}

// readRows looks up, with the outbox package itself, every row whose id query returns.
func readRows(ctx context.Context, q keiro.DB, schema, query string, args ...any) ([]outbox.Row, error) {
	r, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(r, pgx.RowTo[[16]byte])
	if err != nil {
		return nil, err
	}
	st, err := outbox.NewAdmin(schema)
	if err != nil {
		return nil, err
	}
	rows := make([]outbox.Row, 0, len(ids))
	for _, id := range ids {
		row, err := st.Lookup(ctx, q, envelope.UUID(id))
		if errors.Is(err, outbox.ErrNotFound) {
			continue // deleted meanwhile (retention)
		}
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// rowLine renders an outbox row for a failure message.
func rowLine(r outbox.Row) string {
	s := fmt.Sprintf("[%s] %s", r.Status, summary(r.Event))
	if r.LastError != "" {
		s += fmt.Sprintf(" — attempts %d, last error: %s", r.Attempts, clip(r.LastError, 200))
	}
	return s
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func verb(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/internal/cli"
	"github.com/keiro-go/keiro/migrations"
)

// connect opens one connection for an operator command.
func (f *dbFlags) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, f.DatabaseURL.Reveal())
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", f.DatabaseURL, redactErr(err, f.DatabaseURL))
	}
	return conn, nil
}

// redactErr removes the connection string's password from err's message (pgx may quote the
// connection string in parse errors).
func redactErr(err error, dsn cli.DSN) error {
	if err == nil || dsn == "" {
		return err
	}
	msg := err.Error()
	if red := dsn.String(); red != dsn.Reveal() && strings.Contains(msg, dsn.Reveal()) {
		return errors.New(strings.ReplaceAll(msg, dsn.Reveal(), red))
	}
	return err
}

// sql puts the schema into a statement.
func (f *dbFlags) sql(stmt string) string { return fmt.Sprintf(stmt, f.Schema) }

// Run applies the migrations and prints their status.
func (c *migrateCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	conn, err := g.DB.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := migrations.Migrate(ctx, conn, g.DB.Schema); err != nil {
		return err
	}
	st, err := migrations.GetStatus(ctx, conn, g.DB.Schema)
	if err != nil {
		return err
	}
	printMigrations(env.Stdout, st)
	return nil
}

func printMigrations(w io.Writer, st migrations.Status) {
	fmt.Fprintf(w, "schema %s at version %d of %d\n", st.Schema, st.Current, st.Latest)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tMIGRATION\tAPPLIED")
	for _, m := range st.Migrations {
		fmt.Fprintf(tw, "%d\t%s\t%v\n", m.Version, m.Name, m.Applied)
	}
	_ = tw.Flush()
}

// statuses are the outbox row states, in the order status prints them.
var statuses = []string{"pending", "publishing", "failed", "sent", "dead", "rejected"}

// outboxStatus is what `relay status` reports.
type outboxStatus struct {
	Schema        string `json:"schema"`
	SchemaVersion int32  `json:"schema_version"`
	LatestVersion int32  `json:"latest_version"`
	// Destinations maps each destination to its row count per status.
	Destinations map[string]map[string]int64 `json:"destinations"`
	// Totals is the row count per status over every destination.
	Totals map[string]int64 `json:"totals"`
	// Backlog counts rows still to publish: pending + failed + publishing.
	Backlog int64 `json:"backlog"`
	// Dead counts dead and rejected rows (for `relay dead list`).
	Dead int64 `json:"dead"`
	// OldestPendingAgeSeconds is the age of the oldest row still to publish; null when none.
	OldestPendingAgeSeconds *float64 `json:"oldest_pending_age_seconds"`
}

// Run prints the outbox's state.
func (c *statusCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	conn, err := g.DB.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	st, err := readStatus(ctx, conn, &g.DB)
	if err != nil {
		return err
	}
	if c.JSON {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	printStatus(env.Stdout, st)
	return nil
}

func readStatus(ctx context.Context, conn *pgx.Conn, db *dbFlags) (outboxStatus, error) {
	mst, err := migrations.GetStatus(ctx, conn, db.Schema)
	if err != nil {
		return outboxStatus{}, err
	}
	st := outboxStatus{
		Schema: db.Schema, SchemaVersion: mst.Current, LatestVersion: mst.Latest,
		Destinations: map[string]map[string]int64{}, Totals: map[string]int64{},
	}
	if mst.Current == 0 {
		return st, fmt.Errorf("schema %s has no outbox table: run `relay migrate` (or `relay run --migrate`)", db.Schema)
	}
	rows, err := conn.Query(ctx, db.sql(sqlStatusCounts))
	if err != nil {
		return st, fmt.Errorf("count outbox rows: %w", err)
	}
	var dest, status string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&dest, &status, &n}, func() error {
		if st.Destinations[dest] == nil {
			st.Destinations[dest] = map[string]int64{}
		}
		st.Destinations[dest][status] = n
		st.Totals[status] += n
		switch status {
		case "pending", "failed", "publishing":
			st.Backlog += n
		case "dead", "rejected":
			st.Dead += n
		}
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("count outbox rows: %w", err)
	}
	if err := conn.QueryRow(ctx, db.sql(sqlOldestPending)).Scan(&st.OldestPendingAgeSeconds); err != nil {
		return st, fmt.Errorf("read oldest pending age: %w", err)
	}
	return st, nil
}

func printStatus(w io.Writer, st outboxStatus) {
	fmt.Fprintf(w, "schema %s (migrations %d of %d applied)\n\n", st.Schema, st.SchemaVersion, st.LatestVersion)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "DESTINATION\t")
	for _, s := range statuses {
		fmt.Fprintf(tw, "%s\t", strings.ToUpper(s))
	}
	fmt.Fprintln(tw)
	dests := make([]string, 0, len(st.Destinations))
	for d := range st.Destinations {
		dests = append(dests, d)
	}
	sort.Strings(dests)
	row := func(name string, counts map[string]int64) {
		fmt.Fprintf(tw, "%s\t", name)
		for _, s := range statuses {
			fmt.Fprintf(tw, "%d\t", counts[s])
		}
		fmt.Fprintln(tw)
	}
	for _, d := range dests {
		row(d, st.Destinations[d])
	}
	row("TOTAL", st.Totals)
	_ = tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintf(w, "backlog (pending+failed+publishing): %d\n", st.Backlog)
	if st.OldestPendingAgeSeconds != nil {
		age := time.Duration(*st.OldestPendingAgeSeconds * float64(time.Second)).Round(time.Second)
		fmt.Fprintf(w, "oldest pending: %s\n", age)
	} else {
		fmt.Fprintln(w, "oldest pending: none")
	}
	fmt.Fprintf(w, "dead or rejected: %d", st.Dead)
	if st.Dead > 0 {
		fmt.Fprint(w, " (see `relay dead list`)")
	}
	fmt.Fprintln(w)
}

// deadRow is one row of `relay dead list`.
type deadRow struct {
	OutboxID     string    `json:"outbox_id"`
	Seq          int64     `json:"seq"`
	Source       string    `json:"source"`
	Destination  string    `json:"destination"`
	MessageID    string    `json:"message_id"`
	Key          *string   `json:"key"`
	EventType    string    `json:"event_type"`
	Status       string    `json:"status"`
	Attempts     int32     `json:"attempts"`
	LastError    string    `json:"last_error,omitempty"`
	RejectedCode string    `json:"rejection_code,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// Run lists dead and rejected rows.
func (c *deadListCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	conn, err := g.DB.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := listDead(ctx, conn, &g.DB, c.Source, c.Destination, c.Limit)
	if err != nil {
		return err
	}
	if c.JSON {
		enc := json.NewEncoder(env.Stdout)
		for _, r := range rows {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "OUTBOX ID\tSTATUS\tSOURCE\tDESTINATION\tKEY\tTYPE\tATTEMPTS\tUPDATED\tERROR")
	for _, r := range rows {
		key := "-"
		if r.Key != nil {
			key = *r.Key
		}
		reason := r.LastError
		if r.RejectedCode != "" {
			reason = r.RejectedCode + ": " + reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.OutboxID, r.Status, r.Source, r.Destination,
			key, r.EventType, r.Attempts, r.UpdatedAt.UTC().Format(time.RFC3339), oneLine(reason, 120))
	}
	_ = tw.Flush()
	if len(rows) == c.Limit {
		fmt.Fprintf(env.Stderr, "relay: listed the first %d rows; raise --limit to see more\n", c.Limit)
	}
	return nil
}

func listDead(ctx context.Context, conn *pgx.Conn, db *dbFlags, source, destination string, limit int) ([]deadRow, error) {
	rows, err := conn.Query(ctx, db.sql(sqlDeadList), nullable(source), nullable(destination), limit)
	if err != nil {
		return nil, fmt.Errorf("list dead outbox rows: %w", err)
	}
	var out []deadRow
	var r deadRow
	_, err = pgx.ForEachRow(rows, []any{&r.OutboxID, &r.Seq, &r.Source, &r.Destination, &r.MessageID, &r.Key,
		&r.EventType, &r.Status, &r.Attempts, &r.LastError, &r.RejectedCode, &r.CreatedAt, &r.UpdatedAt}, func() error {
		out = append(out, r)
		r = deadRow{}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list dead outbox rows: %w", err)
	}
	return out, nil
}

// requeueWarning is printed by every requeue: the ordering guarantee does not reach back in
// time.
const requeueWarning = `warning: a requeued row keeps its place (seq) in the outbox, but rows of the same key enqueued
after it may already be on Kafka: consumers can receive the requeued event AFTER later events of
its key. Requeue only events whose consumers tolerate that (idempotent, or ordered by version).`

// Run requeues the selected rows.
func (c *deadRequeueCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	conn, err := g.DB.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	fmt.Fprintln(env.Stderr, requeueWarning)
	var ids []string
	if len(c.IDs) > 0 {
		ids = c.IDs
	}
	requeued, err := requeue(ctx, conn, &g.DB, ids, c.Source, c.Destination)
	if err != nil {
		return err
	}
	for _, id := range requeued {
		fmt.Fprintln(env.Stdout, id)
	}
	fmt.Fprintf(env.Stderr, "relay: requeued %d row(s)\n", len(requeued))
	if len(ids) > 0 && len(requeued) < len(ids) {
		done := map[string]bool{}
		for _, id := range requeued {
			done[id] = true
		}
		var missing []string
		for _, id := range ids {
			if !done[strings.ToLower(id)] {
				missing = append(missing, id)
			}
		}
		return &cli.ExitError{Code: cli.ExitFailure, Err: fmt.Errorf(
			"not requeued (no such row, or not dead/rejected): %s", strings.Join(missing, ", "))}
	}
	return nil
}

func requeue(ctx context.Context, conn *pgx.Conn, db *dbFlags, ids []string, source, destination string) ([]string, error) {
	var out []string
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var idArg any
		if ids != nil {
			idArg = ids
		}
		rows, err := tx.Query(ctx, db.sql(sqlRequeue), idArg, nullable(source), nullable(destination))
		if err != nil {
			return err
		}
		var id string
		if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { out = append(out, id); return nil }); err != nil {
			return err
		}
		if len(out) > 0 {
			_, err = tx.Exec(ctx, sqlNotify, db.Schema+".keiro_outbox")
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("requeue dead outbox rows: %w", err)
	}
	return out, nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		s = s[:max-1] + "…"
	}
	return s
}

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

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/migrations"
	"github.com/keiro-go/keiro/outbox"
)

// Run applies the migrations and prints their status.
func (c *migrateCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	st, err := g.DB.Migrate(ctx, "relay migrate")
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
	// Dead counts dead and rejected rows (for `relay dead list`), archived ones aside.
	Dead int64 `json:"dead"`
	// Archived counts the dead and rejected rows an operator set aside (in neither Destinations,
	// Totals nor Dead); 0 before migration 011.
	Archived int64 `json:"archived"`
	// OldestPendingAgeSeconds is the age of the oldest pending or failed row; null when none.
	OldestPendingAgeSeconds *float64 `json:"oldest_pending_age_seconds"`
	// Mode is the schema's mode, claim or log (empty before migration 009).
	Mode string `json:"mode,omitempty"`
	// LogSlot is the default log-mode slot's state (outbox.DefaultLogSlot); null when the slot
	// does not exist.
	LogSlot *outbox.SlotStatus `json:"log_slot,omitempty"`
	// LogSlots are every log-mode slot of the schema (one per publication of keiro_outbox_log,
	// with the destinations it gives its slot; several with per-destination relays).
	LogSlots []outbox.SlotStatus `json:"log_slots,omitempty"`
}

// Run prints the outbox's state.
func (c *statusCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	conn, err := g.DB.Connect(ctx)
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
	if st.Mode != "" {
		fmt.Fprintf(env.Stdout, "mode: %s\n", st.Mode)
	}
	for _, ss := range st.LogSlots {
		printSlot(env, ss)
	}
	return nil
}

// logModeMigration is the migration that adds log mode (009_outbox_log.sql).
const logModeMigration = 9

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
	admin, err := outbox.NewAdmin(db.Schema)
	if err != nil {
		return st, err
	}
	ost, err := admin.Overview(ctx, conn)
	if err != nil {
		return st, err
	}
	waiting := false
	for _, c := range ost.Counts {
		if st.Destinations[c.Destination] == nil {
			st.Destinations[c.Destination] = map[string]int64{}
		}
		st.Destinations[c.Destination][string(c.Status)] = c.Count
		st.Totals[string(c.Status)] += c.Count
		waiting = waiting || c.Status == outbox.StatusPending || c.Status == outbox.StatusFailed
	}
	st.Backlog, st.Dead, st.Archived = ost.Backlog, ost.Dead, ost.Archived
	if mst.Current >= logModeMigration {
		mode, err := admin.Mode(ctx, conn)
		if err != nil {
			return st, err
		}
		st.Mode = string(mode)
		ss, err := admin.LogSlotStatus(ctx, conn, "") // the default slot
		if err != nil {
			return st, err
		}
		if ss.Exists {
			st.LogSlot = &ss
		}
		if st.LogSlots, err = admin.LogSlots(ctx, conn); err != nil {
			return st, err
		}
	}
	if waiting {
		age := ost.OldestPendingAge.Seconds()
		st.OldestPendingAgeSeconds = &age
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
		fmt.Fprintf(w, "oldest pending or failed: %s\n", age)
	} else {
		fmt.Fprintln(w, "oldest pending or failed: none")
	}
	fmt.Fprintf(w, "dead or rejected: %d", st.Dead)
	if st.Dead > 0 {
		fmt.Fprint(w, " (see `relay dead list`)")
	}
	fmt.Fprintln(w)
	if st.Archived > 0 {
		fmt.Fprintf(w, "archived (dead or rejected, set aside): %d\n", st.Archived)
	}
}

// deadRow is one row of `relay dead list`.
type deadRow struct {
	OutboxID      string    `json:"outbox_id"`
	Seq           int64     `json:"seq"`
	Source        string    `json:"source"`
	Destination   string    `json:"destination"`
	MessageID     string    `json:"message_id"`
	Key           *string   `json:"key"`
	Status        string    `json:"status"`
	Attempts      int       `json:"attempts"`
	LastError     string    `json:"last_error,omitempty"`
	RejectionCode string    `json:"rejection_code,omitempty"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// Run lists dead and rejected rows.
func (c *deadListCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	conn, admin, err := g.DB.outboxAdmin(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	dead, err := admin.ListDead(ctx, conn, outbox.ListDeadOptions{Source: c.Source, Destination: c.Destination, Limit: c.Limit})
	if err != nil {
		return err
	}
	rows := make([]deadRow, len(dead))
	for i, d := range dead {
		rows[i] = deadRow{OutboxID: d.OutboxID.String(), Seq: d.Seq, Source: d.Source, Destination: d.Destination,
			MessageID: d.MessageID, Key: d.Key, Status: string(d.Status), Attempts: d.Attempts, LastError: d.LastError,
			RejectionCode: d.RejectionCode, UpdatedAt: d.UpdatedAt}
	}
	if c.JSON {
		enc := json.NewEncoder(env.Stdout)
		for _, r := range rows {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
	} else {
		tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "OUTBOX ID\tSTATUS\tSOURCE\tDESTINATION\tKEY\tMESSAGE ID\tATTEMPTS\tUPDATED\tERROR")
		for _, r := range rows {
			key := "-"
			if r.Key != nil {
				key = *r.Key
			}
			reason := r.LastError
			if r.RejectionCode != "" {
				reason = r.RejectionCode + ": " + reason
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.OutboxID, r.Status, r.Source, r.Destination,
				key, r.MessageID, r.Attempts, r.UpdatedAt.UTC().Format(time.RFC3339), oneLine(reason, 120))
		}
		_ = tw.Flush()
	}
	if len(rows) == c.Limit {
		fmt.Fprintf(env.Stderr, "relay: listed the first %d rows; raise --limit to see more\n", c.Limit)
	}
	return nil
}

// requeueWarning is printed by every requeue: the ordering guarantee does not reach back in
// time.
var requeueWarning = "warning: " + outbox.RequeueWarning

// errDryRun rolls back the requeue transaction of --dry-run.
var errDryRun = errors.New("dry run")

// Run requeues the selected rows in one transaction and wakes listening relays
// (outbox.Admin.RequeueTx, as the console's requeue); --dry-run rolls the transaction back.
func (c *deadRequeueCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	conn, admin, err := g.DB.outboxAdmin(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if !c.DryRun {
		fmt.Fprintln(env.Stderr, requeueWarning)
	}
	filter := outbox.RequeueFilter{Source: c.Source, Destination: c.Destination, All: c.All}
	for _, s := range c.IDs {
		id, _ := envelope.ParseUUID(s) // validated
		filter.IDs = append(filter.IDs, id)
	}
	var res outbox.RequeueResult
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var err error
		if res, err = admin.RequeueTx(ctx, tx, filter); err != nil {
			return err
		}
		if c.DryRun {
			return errDryRun // roll back: the rows stay as they are
		}
		return nil
	})
	if err != nil && !errors.Is(err, errDryRun) {
		return err
	}
	for _, id := range res.Requeued {
		fmt.Fprintln(env.Stdout, id)
	}
	if c.DryRun {
		fmt.Fprintf(env.Stderr, "relay: would requeue %d row(s) (--dry-run: nothing changed)\n", len(res.Requeued))
	} else {
		fmt.Fprintf(env.Stderr, "relay: requeued %d row(s)\n", len(res.Requeued))
	}
	if len(res.Skipped) > 0 {
		skipped := make([]string, len(res.Skipped))
		for i, s := range res.Skipped {
			skipped[i] = s.ID.String() + " (" + s.Reason + ")"
		}
		return &cli.ExitError{Code: cli.ExitFailure, Err: fmt.Errorf(
			"not requeued (only dead and rejected rows are): %s", strings.Join(skipped, ", "))}
	}
	return nil
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		s = s[:max-1] + "…"
	}
	return s
}

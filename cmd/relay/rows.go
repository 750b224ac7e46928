package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/outbox"
)

// rowsCmd groups the outbox listings.
type rowsCmd struct {
	List  rowsListCmd  `cmd:"" help:"List outbox rows in publish order, filtered and paged."`
	Stuck rowsStuckCmd `cmd:"" help:"List rows claimed (publishing) longer ago than --older-than, oldest claim first."`
}

// rowsListCmd lists rows.
type rowsListCmd struct {
	Status      string `help:"Only rows in this status." enum:",pending,publishing,sent,failed,dead,rejected" default:""`
	Source      string `help:"Only rows of this source." placeholder:"SOURCE"`
	Destination string `help:"Only rows for this destination (topic)." placeholder:"TOPIC"`
	Key         string `help:"Only rows with this message key." placeholder:"KEY"`
	After       int64  `help:"Only rows after this seq (paging: the last seq of the previous page)." placeholder:"SEQ"`
	ListFlags   `embed:""`
}

// Run lists the rows.
func (c *rowsListCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	return listRows(ctx, g, env, c.JSON, c.Limit, true, func(ctx context.Context, st *outbox.Admin, q keiro.DB) ([]outbox.Row, error) {
		return st.ListOutbox(ctx, q, outbox.ListOptions{Status: outbox.Status(c.Status), Source: c.Source, Destination: c.Destination,
			Key: c.Key, After: c.After, Limit: c.Limit})
	})
}

// rowsStuckCmd lists stuck rows.
type rowsStuckCmd struct {
	OlderThan time.Duration `help:"Claims older than this are listed." default:"5m"`
	ListFlags `embed:""`
}

// ValidateFlags reports a bad threshold (ListFlags reports a bad limit).
func (c *rowsStuckCmd) ValidateFlags() error {
	var p cli.Problems
	if c.OlderThan < 0 {
		p.Add("older-than", "must not be negative, got %v", c.OlderThan)
	}
	return p.Err()
}

// Run lists the stuck rows.
func (c *rowsStuckCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	return listRows(ctx, g, env, c.JSON, c.Limit, false, func(ctx context.Context, st *outbox.Admin, q keiro.DB) ([]outbox.Row, error) {
		return st.ListStuckOutbox(ctx, q, c.OlderThan, c.Limit)
	})
}

// listedRow is one row of `relay rows list|stuck --json`.
type listedRow struct {
	OutboxID    string     `json:"outbox_id"`
	Seq         int64      `json:"seq"`
	Status      string     `json:"status"`
	Source      string     `json:"source"`
	Destination string     `json:"destination"`
	Key         *string    `json:"key"`
	MessageID   string     `json:"message_id"`
	EventType   string     `json:"event_type"`
	Attempts    int        `json:"attempts"`
	LastError   string     `json:"last_error,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	PublishedAt *time.Time `json:"published_at,omitempty"`
}

func listRows(ctx context.Context, g *grammar, env *cli.Env, asJSON bool, limit int, paged bool,
	list func(context.Context, *outbox.Admin, keiro.DB) ([]outbox.Row, error)) error {
	conn, st, err := g.DB.outboxAdmin(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := list(ctx, st, conn)
	if err != nil {
		return err
	}
	out := make([]listedRow, len(rows))
	for i, r := range rows {
		out[i] = listedRow{OutboxID: r.OutboxID.String(), Seq: r.Seq, Status: string(r.Status), Source: r.Event.Source,
			Destination: r.Event.Destination, Key: r.Event.Key, MessageID: r.Event.MessageID, EventType: r.Event.EventType,
			Attempts: r.Attempts, LastError: r.LastError, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, PublishedAt: r.PublishedAt}
	}
	if asJSON {
		enc := json.NewEncoder(env.Stdout)
		for _, r := range out {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
	} else {
		tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SEQ\tOUTBOX ID\tSTATUS\tSOURCE\tDESTINATION\tKEY\tMESSAGE ID\tATTEMPTS\tUPDATED\tERROR")
		for _, r := range out {
			key := "-"
			if r.Key != nil {
				key = *r.Key
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Seq, r.OutboxID, r.Status, r.Source, r.Destination,
				key, r.MessageID, r.Attempts, r.UpdatedAt.UTC().Format(time.RFC3339), oneLine(r.LastError, 120))
		}
		_ = tw.Flush()
	}
	switch {
	case len(out) == limit && paged:
		fmt.Fprintf(env.Stderr, "relay: listed the first %d rows; page on with --after=%d\n", limit, out[len(out)-1].Seq)
	case len(out) == limit:
		fmt.Fprintf(env.Stderr, "relay: listed the first %d rows; raise --limit to see more\n", limit)
	}
	return nil
}

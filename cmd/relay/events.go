package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/internal/cli"
)

// eventsCmd groups the event store's operator commands.
type eventsCmd struct {
	Dead eventsDeadCmd `cmd:"" help:"List and replay events that subscriptions dead-lettered."`
}

// eventsDeadCmd lists and replays subscription dead letters.
type eventsDeadCmd struct {
	List   eventsDeadListCmd   `cmd:"" help:"List subscription dead letters, oldest first."`
	Replay eventsDeadReplayCmd `cmd:"" help:"Ask a running subscription to deliver its dead letters again."`
}

// eventsDeadListCmd lists dead letters.
type eventsDeadListCmd struct {
	Subscription string `help:"Only dead letters of this subscription." placeholder:"NAME"`
	Status       string `help:"Only dead letters in this status: dead, replay or replayed." enum:",dead,replay,replayed" default:""`
	After        int64  `help:"Only dead letters with a larger id (paging)." placeholder:"ID"`
	Limit        int    `help:"Most rows listed." default:"100"`
	JSON         bool   `name:"json" help:"Print JSON lines instead of a table."`
}

// ValidateFlags reports a bad limit.
func (c *eventsDeadListCmd) ValidateFlags() error {
	var p cli.Problems
	if c.Limit < 1 {
		p.Add("limit", "must be at least 1, got %d", c.Limit)
	}
	return p.Err()
}

// Run lists the dead letters.
func (c *eventsDeadListCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	conn, store, err := g.DB.eventStore(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	dead, err := store.ListDeadLetters(ctx, conn, events.DeadLetterFilter{Subscription: c.Subscription,
		Status: c.Status, AfterID: c.After, Limit: c.Limit})
	if err != nil {
		return err
	}
	if c.JSON {
		enc := json.NewEncoder(env.Stdout)
		for _, d := range dead {
			if err := enc.Encode(d); err != nil {
				return err
			}
		}
	} else {
		tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSUBSCRIPTION\tSTATUS\tPOSITION\tSTREAM\tTYPE\tATTEMPTS\tDEAD-LETTERED\tCLASS\tERROR")
		for _, d := range dead {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s@%d\t%s\t%d\t%s\t%s\t%s\n", d.ID, d.Subscription, d.Status,
				d.GlobalPosition, d.StreamName, d.StreamVersion, d.EventType, d.Attempts,
				d.DeadLetteredAt.UTC().Format(time.RFC3339), d.ErrorClass, oneLine(d.Error, 120))
		}
		_ = tw.Flush()
	}
	if len(dead) == c.Limit {
		fmt.Fprintf(env.Stderr, "relay: listed the first %d rows; page on with --after=%d\n", c.Limit, dead[len(dead)-1].ID)
	}
	return nil
}

// eventsDeadReplayCmd requests replays.
type eventsDeadReplayCmd struct {
	Subscription string  `required:"" help:"The subscription whose dead letters to replay." placeholder:"NAME"`
	IDs          []int64 `arg:"" optional:"" name:"id" help:"Dead letter ids to replay."`
	All          bool    `help:"Replay every dead letter of the subscription in status dead."`
}

// ValidateFlags requires ids or --all, not both.
func (c *eventsDeadReplayCmd) ValidateFlags() error {
	var p cli.Problems
	if len(c.IDs) == 0 && !c.All {
		p.Add("all", "give dead letter ids or --all")
	}
	if len(c.IDs) > 0 && c.All {
		p.Add("all", "give dead letter ids or --all, not both")
	}
	return p.Err()
}

// Run marks the dead letters for replay and wakes the subscription.
func (c *eventsDeadReplayCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	conn, store, err := g.DB.eventStore(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	n, err := store.RequestReplay(ctx, conn, c.Subscription, c.IDs...)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%d dead letters of %s requested for replay\n", n, c.Subscription)
	if n < int64(len(c.IDs)) {
		return fmt.Errorf("%d of the %d ids are not dead letters of %s in status dead (see `relay events dead list --subscription=%s`)",
			int64(len(c.IDs))-n, len(c.IDs), c.Subscription, c.Subscription)
	}
	fmt.Fprintln(env.Stderr, "the running subscription delivers them at its next poll; check with `relay events dead list --status=replayed`")
	return nil
}

// eventStore connects to the database and returns the event store of its schema.
func (f *dbFlags) eventStore(ctx context.Context) (*pgx.Conn, *events.Store, error) {
	store, err := events.NewStore(events.StoreConfig{Schema: f.Schema})
	if err != nil {
		return nil, nil, err
	}
	conn, err := f.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	return conn, store, nil
}

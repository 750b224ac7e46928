package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/outbox"
)

// eventsCmd groups the event store's operator commands.
type eventsCmd struct {
	Dead     eventsDeadCmd     `cmd:"" help:"List and replay events that subscriptions dead-lettered."`
	Dispatch eventsDispatchCmd `cmd:"" help:"List commands that routers and process managers dead-lettered."`
	Timers   eventsTimersCmd   `cmd:"" help:"Inspect, requeue and cancel durable timers."`
}

// eventsDispatchCmd lists dispatch dead letters.
type eventsDispatchCmd struct {
	List eventsDispatchListCmd `cmd:"" help:"List dispatch dead letters, newest first."`
}

// eventsDispatchListCmd lists the commands routers and process managers set aside under
// RejectedDeadLetter.
type eventsDispatchListCmd struct {
	Dispatcher string `help:"Only dead letters of this router or process manager." placeholder:"NAME"`
	ListFlags  `embed:""`
}

// Run lists the dispatch dead letters.
func (c *eventsDispatchListCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	conn, store, err := g.DB.eventStore(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	dead, err := store.ListDispatchDeadLetters(ctx, conn, c.Dispatcher, c.Limit)
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
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tDISPATCHER\tCORRELATION\tSOURCE\tEMIT\tTARGET\tCREATED\tCLASS\tERROR")
	for _, d := range dead {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", d.ID, d.Kind, d.Dispatcher, d.CorrelationID,
			d.SourceEventID, d.EmitIndex, d.TargetStream, d.CreatedAt.UTC().Format(time.RFC3339), d.ErrorClass, oneLine(d.Error, 120))
	}
	return tw.Flush()
}

// eventsTimersCmd groups the durable timers' operator commands.
type eventsTimersCmd struct {
	Stuck   eventsTimersStuckCmd   `cmd:"" help:"Count due and firing timers and list the firing ones, oldest claim first."`
	Requeue eventsTimersRequeueCmd `cmd:"" help:"Put firing timers back to scheduled (their worker is gone)."`
	Cancel  eventsTimersCancelCmd  `cmd:"" help:"Cancel scheduled or firing timers."`
}

// eventsTimersStuckCmd lists firing timers.
type eventsTimersStuckCmd struct {
	OlderThan   time.Duration `help:"Only timers claimed at least this long ago." default:"0s"`
	MinAttempts int64         `help:"Only timers claimed at least this many times." default:"0"`
	ListFlags   `embed:""`
}

// ValidateFlags reports negative bounds (ListFlags reports a bad limit).
func (c *eventsTimersStuckCmd) ValidateFlags() error {
	var p cli.Problems
	if c.OlderThan < 0 {
		p.Add("older-than", "must not be negative, got %s", c.OlderThan)
	}
	if c.MinAttempts < 0 {
		p.Add("min-attempts", "must not be negative, got %d", c.MinAttempts)
	}
	return p.Err()
}

// Run prints the counts and the firing timers.
func (c *eventsTimersStuckCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	conn, store, err := g.DB.eventStore(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	now := time.Now()
	counts, err := store.CountTimers(ctx, conn, now)
	if err != nil {
		return err
	}
	stuck, err := store.FindStuckTimers(ctx, conn, now, events.StuckTimerFilter{MinAge: c.OlderThan, MinAttempts: c.MinAttempts, Limit: c.Limit})
	if err != nil {
		return err
	}
	if c.JSON {
		enc := json.NewEncoder(env.Stdout)
		for _, t := range stuck {
			if err := enc.Encode(t); err != nil {
				return err
			}
		}
		return nil
	}
	fmt.Fprintf(env.Stdout, "%d timers due, %d firing\n", counts.Due, counts.Firing)
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIMER\tPROCESS-MANAGER\tCORRELATION\tFIRE-AT\tCLAIMED\tATTEMPTS\tLAST-ERROR")
	for _, t := range stuck {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", t.ID, t.ProcessManager, t.CorrelationID,
			t.FireAt.UTC().Format(time.RFC3339), t.UpdatedAt.UTC().Format(time.RFC3339), t.Attempts, oneLine(t.LastError, 120))
	}
	return tw.Flush()
}

// eventsTimersRequeueCmd requeues firing timers.
type eventsTimersRequeueCmd struct {
	IDs []string `arg:"" name:"timer-id" help:"Ids of firing timers."`
}

// Run requeues each timer.
func (c *eventsTimersRequeueCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	return timersEach(ctx, g, env, c.IDs, "requeued", "not firing", func(ctx context.Context, s *events.Store, conn *pgx.Conn, id envelope.UUID) (bool, error) {
		return s.RequeueStuckTimer(ctx, conn, id)
	})
}

// eventsTimersCancelCmd cancels timers.
type eventsTimersCancelCmd struct {
	IDs []string `arg:"" name:"timer-id" help:"Ids of scheduled or firing timers."`
}

// Run cancels each timer.
func (c *eventsTimersCancelCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	return timersEach(ctx, g, env, c.IDs, "cancelled", "not scheduled or firing", func(ctx context.Context, s *events.Store, conn *pgx.Conn, id envelope.UUID) (bool, error) {
		return s.CancelTimer(ctx, conn, id)
	})
}

// timersEach applies op to each timer id, printing what happened, and fails when an id is not
// a UUID or op left a timer alone.
func timersEach(ctx context.Context, g *grammar, env *cli.Env, raw []string, done, skipped string,
	op func(context.Context, *events.Store, *pgx.Conn, envelope.UUID) (bool, error)) error {
	ids := make([]envelope.UUID, len(raw))
	for i, r := range raw {
		id, err := envelope.ParseUUID(r)
		if err != nil {
			return fmt.Errorf("timer id %q: %w", r, err)
		}
		ids[i] = id
	}
	conn, store, err := g.DB.eventStore(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	left := 0
	for _, id := range ids {
		ok, err := op(ctx, store, conn, id)
		if err != nil {
			return err
		}
		if ok {
			fmt.Fprintf(env.Stdout, "%s %s\n", id, done)
		} else {
			left++
			fmt.Fprintf(env.Stdout, "%s left alone: unknown or %s\n", id, skipped)
		}
	}
	if left > 0 {
		return fmt.Errorf("%d of %d timers were left alone (see `relay events timers stuck`)", left, len(ids))
	}
	return nil
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
	ListFlags    `embed:""`
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

// outboxAdmin connects to the database and returns the outbox Admin of the flags' schema.
func (f *dbFlags) outboxAdmin(ctx context.Context) (*pgx.Conn, *outbox.Admin, error) {
	admin, err := outbox.NewAdmin(f.Schema)
	if err != nil {
		return nil, nil, err
	}
	conn, err := f.Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	return conn, admin, nil
}

// eventStore connects to the database and returns the event store of its schema.
func (f *dbFlags) eventStore(ctx context.Context) (*pgx.Conn, *events.Store, error) {
	store, err := events.NewStore(events.StoreConfig{Schema: f.Schema})
	if err != nil {
		return nil, nil, err
	}
	conn, err := f.Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	return conn, store, nil
}

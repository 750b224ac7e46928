package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/outbox"
)

// outboxMode opens the outbox Admin as outboxAdmin does and reads the schema's mode; the
// caller closes conn.
func (f *dbFlags) outboxMode(ctx context.Context) (*pgx.Conn, *outbox.Admin, outbox.Mode, error) {
	conn, admin, err := f.outboxAdmin(ctx)
	if err != nil {
		return nil, nil, "", err
	}
	mode, err := admin.Mode(ctx, conn)
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, nil, "", fmt.Errorf("%w (apply the migrations: relay migrate)", err)
	}
	return conn, admin, mode, nil
}

// Run prints the schema's mode and, when its slot exists, the slot's state.
func (c *modeShowCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	conn, admin, mode, err := g.DB.outboxMode(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	fmt.Fprintf(env.Stdout, "schema %s: mode %s\n", g.DB.Schema, mode)
	slots, err := admin.LogSlots(ctx, conn)
	if err != nil {
		return err
	}
	for _, ss := range slots {
		printSlot(env, ss)
	}
	return nil
}

// Run creates a destination group's slot and publication.
func (c *modePrepareCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	conn, admin, mode, err := g.DB.outboxMode(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	p, err := admin.PrepareLog(ctx, conn, c.LogSlot, c.Destinations)
	if err != nil {
		return err
	}
	slot, created := p.Slot, p.SlotCreated
	verb := "exists"
	if created {
		verb = "created"
	}
	dests := "every destination"
	if len(c.Destinations) > 0 {
		dests = strings.Join(c.Destinations, ", ")
	}
	fmt.Fprintf(env.Stdout, "schema %s: log slot %s %s for %s\n", g.DB.Schema, slot, verb, dests)
	if p.PublicationRepaired {
		fmt.Fprintf(env.Stdout, "repaired the publication %s, which published no table (keiro_outbox_log was dropped after its creation)\n", slot)
	}
	if p.PublicationRepaired && mode == outbox.ModeLog {
		fmt.Fprintf(env.Stdout, "the schema is in log mode: the slot did not decode the events written while the publication had no table; republish them with `relay mode recover --since=<when the table was created again>%s`, then start the relay\n", destFlag(c.Destinations))
	}
	if created && mode == outbox.ModeLog {
		fmt.Fprintf(env.Stdout, "the schema is already in log mode: the slot holds the events written from now on; republish the earlier ones of its destinations with `relay mode recover --since=<the switch's time> --destinations=%s`\n", strings.Join(c.Destinations, ","))
	}
	return nil
}

// Run switches the schema's mode.
func (c *modeSetCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	mode, err := outbox.ParseMode(c.Mode)
	if err != nil {
		return err
	}
	if len(c.Destinations) > 0 && mode != outbox.ModeLog {
		return usagef("--destinations names the slot of log mode (got %s)", mode)
	}
	conn, admin, err := g.DB.outboxAdmin(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ch, err := admin.SetModeFor(ctx, conn, mode, c.LogSlot, c.Destinations)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "schema %s: mode %s (was %s) from WAL position %s\n", g.DB.Schema, ch.To, ch.From, ch.LSN)
	if ch.SlotCreated && ch.From == outbox.ModeLog {
		fmt.Fprintf(env.Stdout, "created the log slot %s while the schema was already in log mode: it holds the events written from now on; republish the earlier ones of its destinations with `relay mode recover --since=<the switch's time>`\n", ch.Slot)
	}
	switch {
	case ch.To == outbox.ModeLog && ch.From != outbox.ModeLog:
		fmt.Fprintln(env.Stdout, "producers now write keiro_outbox_log; run the relays with --mode=log (they publish the rows still open in keiro_outbox first)")
	case ch.To == outbox.ModeClaim && ch.From != outbox.ModeClaim:
		fmt.Fprintf(env.Stdout, "producers now write keiro_outbox; keep the log-mode relays running until `relay status` shows each slot's confirmed position at or past %s, then run the relays with --mode=claim and drop the slots\n", ch.LSN)
	}
	return nil
}

// Run copies keiro_outbox_log's events of the range into keiro_outbox to be published again.
func (c *modeRecoverCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	now := time.Now()
	since, err := parseSince("--since", c.Since, now)
	if err != nil {
		return err
	}
	until := now
	if c.Until != "" {
		if until, err = parseSince("--until", c.Until, now); err != nil {
			return err
		}
	}
	if !until.After(since) {
		return usagef("--until (%s) must be after --since (%s)", until.Format(time.RFC3339), since.Format(time.RFC3339))
	}
	conn, admin, err := g.DB.outboxAdmin(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	r, err := admin.RecoverLogFor(ctx, conn, since, until, c.Destinations)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "keiro_outbox_log from %s to %s: %d events, %d copied into keiro_outbox to be published again, %d already there\n",
		since.Format(time.RFC3339), until.Format(time.RFC3339), r.Found, r.Copied, r.Found-r.Copied)
	if r.Copied > 0 {
		fmt.Fprintln(env.Stdout, "a relay publishes them (in log mode, its claim loop beside the slot); the inbox dedupes those that had reached Kafka")
	}
	return nil
}

// destFlag is the --destinations flag of dests, or "" for none.
func destFlag(dests []string) string {
	if len(dests) == 0 {
		return ""
	}
	return " --destinations=" + strings.Join(dests, ",")
}

// parseSince reads an RFC 3339 time, or a duration before now.
func parseSince(flag, s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, usagef("%s %q: want an RFC 3339 time (2026-12-01T10:00:00Z) or a duration before now (2h)", flag, s)
	}
	return now.Add(-d), nil
}

// usagef is a usage error (exit 2).
func usagef(format string, args ...any) error {
	return &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf(format, args...)}
}

// printSlot prints a log-mode slot's state (relay status, relay mode show).
func printSlot(env *cli.Env, ss outbox.SlotStatus) {
	active := "none (no relay reads it)"
	if ss.ActivePID != 0 {
		active = fmt.Sprintf("pid %d", ss.ActivePID)
	}
	safe := "unlimited (max_slot_wal_keep_size = -1)"
	if ss.SafeWALSize != nil {
		safe = fmt.Sprintf("%d B", *ss.SafeWALSize)
	}
	if !ss.Exists {
		fmt.Fprintf(env.Stdout, "log slot %s: missing (its publication exists, the slot does not)\n", ss.Slot)
		return
	}
	dests := ""
	if len(ss.Destinations) > 0 {
		dests = " (destinations " + strings.Join(ss.Destinations, ", ") + ")"
	}
	fmt.Fprintf(env.Stdout, "log slot %s%s: reader %s, confirmed %s, retained WAL %d B, wal_status %s, safe_wal_size %s\n",
		ss.Slot, dests, active, ss.ConfirmedFlushLSN, ss.RetainedBytes, ss.WALStatus, safe)
	if ss.TransactionalID != "" {
		fmt.Fprintf(env.Stdout, "  transactional id with --exactly-once: %s\n", ss.TransactionalID)
	}
	if ss.WALStatus == "lost" {
		fmt.Fprintln(env.Stdout, "the slot is invalidated: PostgreSQL removed WAL it had not confirmed; drop it and recover the unconfirmed events from keiro_outbox_log (docs/architecture.md, \"Log mode\")")
	}
}

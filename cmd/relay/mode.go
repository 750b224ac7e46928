package main

import (
	"context"
	"fmt"

	"github.com/keiro-go/keiro/internal/cli"
	"github.com/keiro-go/keiro/outbox"
)

// Run prints the schema's mode and, when its slot exists, the slot's state.
func (c *modeShowCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	conn, store, err := g.DB.outboxStore(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	mode, err := store.Mode(ctx, conn)
	if err != nil {
		return fmt.Errorf("%w (apply the migrations: relay migrate)", err)
	}
	fmt.Fprintf(env.Stdout, "schema %s: mode %s\n", g.DB.Schema, mode)
	ss, err := store.LogSlotStatus(ctx, conn, "")
	if err != nil {
		return err
	}
	if ss.Exists {
		printSlot(env, ss)
	}
	return nil
}

// Run switches the schema's mode.
func (c *modeSetCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	mode, err := outbox.ParseMode(c.Mode)
	if err != nil {
		return err
	}
	conn, store, err := g.DB.outboxStore(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ch, err := store.SetMode(ctx, conn, mode, c.LogSlot)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "schema %s: mode %s (was %s) from WAL position %s\n", g.DB.Schema, ch.To, ch.From, ch.LSN)
	switch {
	case ch.To == outbox.ModeLog && ch.From != outbox.ModeLog:
		fmt.Fprintln(env.Stdout, "producers now write keiro_outbox_log; run the relays with --mode=log (they publish the rows still open in keiro_outbox first)")
	case ch.To == outbox.ModeClaim && ch.From != outbox.ModeClaim:
		fmt.Fprintf(env.Stdout, "producers now write keiro_outbox; keep the log-mode relay running until `relay status` shows the slot's confirmed position at or past %s, then run the relays with --mode=claim and drop the slot\n", ch.LSN)
	}
	return nil
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
	fmt.Fprintf(env.Stdout, "log slot %s: reader %s, confirmed %s, retained WAL %d B, wal_status %s, safe_wal_size %s\n",
		ss.Slot, active, ss.ConfirmedFlushLSN, ss.RetainedBytes, ss.WALStatus, safe)
	if ss.WALStatus == "lost" {
		fmt.Fprintln(env.Stdout, "the slot is invalidated: PostgreSQL removed WAL it had not confirmed; drop it and recover the unconfirmed events from keiro_outbox_log (docs/architecture.md, \"Log mode\")")
	}
}

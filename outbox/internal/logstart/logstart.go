// Package logstart is the start of a relay's log source beside its claim loop: the switch to
// log mode (or the check of the relay's slot), the wait for keiro_outbox's open rows, the
// gap another relay's switch left, the slot's gauges, and the run of the log engine until the
// schema is switched back.
package logstart

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/outbox/internal/logsource"
	"github.com/keiro-go/keiro/outbox/internal/modes"
	"github.com/keiro-go/keiro/tracing"
)

// Config is what a relay's log source starts with.
type Config struct {
	// DB runs the statements; Outbox is the schema's outbox (its name, statements and slots).
	DB     keiro.DB
	Outbox modes.Schema
	// Slot is the relay's slot and Destinations the destinations it publishes (nil: all).
	Slot         string
	Destinations []string
	// Engine follows the slot.
	Engine logsource.Engine
	// PollInterval is how often the source looks at keiro_outbox's open rows and the mode.
	PollInterval time.Duration
	// MeterProvider receives the slot's gauges (the global provider when nil).
	MeterProvider metric.MeterProvider
	Logger        *slog.Logger
	// AfterModeRead, if set (tests), runs between the read of the schema's mode and the
	// preparation of the slot.
	AfterModeRead func()
}

// Starter starts and follows a relay's log source.
type Starter struct{ cfg Config }

// New returns the starter of cfg.
func New(cfg Config) *Starter { return &Starter{cfg: cfg} }

// never is PrepareLog's repairLost for a relay's start in log mode: a publication that lost
// its table is refused.
func never() (bool, error) { return false, nil }

// Enter switches the schema to log mode, or checks the relay's slot when it is in log
// mode already, and publishes the gap left when another relay switched before this relay's
// slot existed.
func (r *Starter) Enter(ctx context.Context) error {
	mode, err := r.cfg.Outbox.Mode(ctx, r.cfg.DB)
	if err != nil {
		return err
	}
	// Prepare (or check) the slot even when the schema is in log mode: the overlap with the
	// schema's other slots, and the publication's destinations, are checked at every start.
	if r.cfg.AfterModeRead != nil {
		r.cfg.AfterModeRead()
	}
	var ch modes.Change
	if mode != modes.Log {
		ch, err = r.cfg.Outbox.SetMode(ctx, r.cfg.DB, modes.Log, r.cfg.Slot, r.cfg.Destinations)
	} else {
		ch.From, ch.To = modes.Log, modes.Log
		// The schema is in log mode: a publication that lost its table is refused, not
		// repaired, since the slot did not decode the events written meanwhile.
		var p modes.Prepared
		p, err = r.cfg.Outbox.PrepareLog(ctx, r.cfg.DB, r.cfg.Slot, r.cfg.Destinations, never)
		ch.Slot, ch.SlotCreated = p.Slot, p.SlotCreated
	}
	if err != nil {
		return err
	}
	switch {
	case ch.From != modes.Log:
		r.cfg.Logger.InfoContext(ctx, "switched the outbox to log mode", "from", ch.From, "lsn", ch.LSN, "slot", ch.Slot)
	case mode != modes.Log && ch.SlotCreated:
		// Another relay switched the schema between this relay's read of the mode and the
		// creation of its slot. One of this slot's relays switched only once the slot was
		// consistent (Store.SetModeFor waits for it), so nothing is missing from it; another
		// destination group's relay, started at the same time, may have switched before.
		others, err := r.otherLogSlots(ctx, ch.Slot)
		if err != nil || !others {
			return err
		}
		return r.recoverSwitchGap(ctx, ch)
	case ch.SlotCreated:
		// The slot decodes what commits from now on; the events of its destinations written
		// since the switch to log mode (while no slot had them) are in keiro_outbox_log only.
		r.cfg.Logger.ErrorContext(ctx, "log mode: created the relay's slot while the schema was already in log mode: it publishes the events of its destinations written from now on; republish those written since the switch with `relay mode recover --since=<the switch's time>` (Store.RecoverLog), or prepare every destination group's slot before the switch (relay mode prepare)",
			"slot", ch.Slot, "destinations", r.cfg.Destinations)
	}
	return nil
}

// Follow runs the log engine beside the claim loop (claimDone reports its end) until ctx
// ends or either fails. Once the schema is switched back to claim mode, new events land in
// keiro_outbox, and the slot may still hold older events of their keys: the claim loop stops
// (the claim relays publish keiro_outbox from then on) and the engine goes on with the slot.
func (r *Starter) Follow(ctx context.Context, stopClaim context.CancelFunc, claimDone <-chan error) error {
	ectx, stopEngine := context.WithCancel(ctx)
	defer stopEngine()
	engineDone := make(chan error, 1)
	go func() { engineDone <- r.cfg.Engine.Run(ectx) }()
	claiming := claimDone
	tick := time.NewTicker(r.cfg.PollInterval)
	defer tick.Stop()
	for {
		select {
		case err := <-engineDone:
			stopClaim()
			if claiming != nil {
				if cerr := <-claiming; err == nil {
					err = cerr
				}
			}
			return err
		case err := <-claiming:
			// The claim loop ended first: halted (StopTheLine) or ctx ended.
			stopEngine()
			if eerr := <-engineDone; err == nil {
				err = eerr
			}
			return err
		case <-tick.C:
			if claiming == nil {
				continue
			}
			if m, err := r.cfg.Outbox.Mode(ctx, r.cfg.DB); err == nil && m != modes.Log {
				r.cfg.Logger.InfoContext(ctx, "log mode: the schema is in claim mode; the claim loop stops, the slot is still followed")
				stopClaim()
				if err := <-claiming; err != nil {
					stopEngine()
					return errors.Join(err, <-engineDone)
				}
				claiming = nil
			}
		}
	}
}

// otherLogSlots reports whether the schema has a log-mode slot other than slot: another
// destination group's, which a switch to log mode may have been made with.
func (r *Starter) otherLogSlots(ctx context.Context, slot string) (bool, error) {
	slots, err := r.cfg.Outbox.Slots(ctx, r.cfg.DB)
	if err != nil {
		return false, err
	}
	for _, o := range slots {
		if o.Slot != slot && o.Exists {
			return true, nil
		}
	}
	return false, nil
}

// recoverSwitchGap publishes the events of the relay's destinations that were written between
// another relay's switch to log mode (ch.Changed) and the creation of this relay's slot: no
// slot has them (the other slots do not publish these destinations). They are copied into
// keiro_outbox (Store.RecoverLogFor), from an hour before the switch (a transaction that
// started before the switch may write after it) to now, and the claim loop publishes them
// before the relay follows its slot, in the order they were written. An event also decoded by
// the slot (its transaction committed after the slot's creation) is published twice, with the
// same message id.
func (r *Starter) recoverSwitchGap(ctx context.Context, ch modes.Change) error {
	var until time.Time
	if err := r.cfg.DB.QueryRow(ctx, r.cfg.Outbox.Q.Clock).Scan(&until); err != nil {
		return fmt.Errorf("read the database's clock: %w", err)
	}
	since := ch.Changed.Add(-time.Hour)
	rec, err := r.cfg.Outbox.Recover(ctx, r.cfg.DB, since, until, r.cfg.Destinations)
	if err != nil {
		return err
	}
	r.cfg.Logger.WarnContext(ctx, "log mode: another relay switched the schema before this relay's slot existed; the events of its destinations written meanwhile are published from keiro_outbox first",
		"slot", ch.Slot, "switched_at", ch.Changed, "since", since, "until", until, "found", rec.Found, "copied", rec.Copied)
	return nil
}

// The log-mode slot's gauges (the WAL guard), with the slot's name as attribute
// keiro.outbox.slot: MetricLogSlotRetained is the WAL the slot retains, MetricLogSlotSafeWAL
// the WAL that can still be written before it is in danger of invalidation (absent when
// max_slot_wal_keep_size is unlimited), MetricLogSlotActive 1 while a relay reads it, and
// MetricLogSlotLost 1 once PostgreSQL invalidated it (wal_status lost).
const (
	MetricLogSlotRetained = "keiro.outbox.log.slot.retained"
	MetricLogSlotSafeWAL  = "keiro.outbox.log.slot.safe_wal_size"
	MetricLogSlotActive   = "keiro.outbox.log.slot.active"
	MetricLogSlotLost     = "keiro.outbox.log.slot.lost"
)

// SlotGauges registers the slot's gauges on the relay's meter; each collection reads the
// slot's row (one query, bounded by a second).
func (r *Starter) SlotGauges() (metric.Registration, error) {
	mp := r.cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(tracing.ScopeName)
	retained, err1 := m.Int64ObservableGauge(MetricLogSlotRetained, metric.WithUnit("By"),
		metric.WithDescription("WAL retained by the log-mode replication slot (from its restart_lsn to the current WAL position)."))
	safe, err2 := m.Int64ObservableGauge(MetricLogSlotSafeWAL, metric.WithUnit("By"),
		metric.WithDescription("WAL that can still be written before the slot is in danger of invalidation (max_slot_wal_keep_size)."))
	active, err3 := m.Int64ObservableGauge(MetricLogSlotActive, metric.WithUnit("{slot}"),
		metric.WithDescription("1 while a relay reads the log-mode slot."))
	lost, err4 := m.Int64ObservableGauge(MetricLogSlotLost, metric.WithUnit("{slot}"),
		metric.WithDescription("1 once PostgreSQL invalidated the slot (wal_status lost): events must be recovered from keiro_outbox_log."))
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, fmt.Errorf("create slot gauges: %w", err)
	}
	attrs := metric.WithAttributes(tracing.OutboxSlotKey.String(r.cfg.Slot))
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		st, err := r.cfg.Outbox.SlotStatus(qctx, r.cfg.DB, r.cfg.Slot)
		if err != nil || !st.Exists {
			return err
		}
		o.ObserveInt64(retained, st.RetainedBytes, attrs)
		if st.SafeWALSize != nil {
			o.ObserveInt64(safe, *st.SafeWALSize, attrs)
		}
		o.ObserveInt64(active, b2i(st.ActivePID != 0), attrs)
		o.ObserveInt64(lost, b2i(st.WALStatus == "lost"), attrs)
		return nil
	}, retained, safe, active, lost)
}

// b2i is 1 for true.
func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// DrainClaimed waits until keiro_outbox has no open row (pending, failed or publishing) of the
// relay's destinations,
// checking every PollInterval, while the claim loop (claimDone reports its end) publishes
// them. It returns the claim loop's error if the loop ends first.
func (r *Starter) DrainClaimed(ctx context.Context, claimDone <-chan error) error {
	open := func() (bool, error) {
		var n bool
		err := r.cfg.DB.QueryRow(ctx, r.cfg.Outbox.Q.AnyOpen, r.cfg.Destinations).Scan(&n)
		return n, err
	}
	n, err := open()
	if err != nil {
		if ctx.Err() == nil {
			return fmt.Errorf("outbox relay: look for open rows of keiro_outbox: %w", err)
		}
		return nil
	}
	if !n {
		return nil
	}
	r.cfg.Logger.InfoContext(ctx, "log mode: publishing the rows still open in keiro_outbox first")
	t := time.NewTicker(r.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-claimDone:
			if err == nil {
				err = errors.New("outbox relay: the claim loop ended before keiro_outbox was drained")
			}
			return err
		case <-t.C:
			if n, err := open(); err == nil && !n {
				return nil
			}
		}
	}
}

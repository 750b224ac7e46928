package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/logsource"
	"github.com/keiro-go/keiro/outbox/internal/publish"
	"github.com/keiro-go/keiro/tracing"
)

// newLogEngine builds the ModeLog engine of r with cfg.LogEngine: it reads the slot through
// a replication connection to the pool's database and publishes through r's publisher.
func (r *engine) newLogEngine() (logsource.Engine, error) {
	conn := r.pool.Config().ConnString()
	if conn == "" {
		return nil, errors.New("Mode log: the pool has no connection string to open a replication connection with; build it with pgxpool.New or pgxpool.ParseConfig")
	}
	inFlight := logsource.DefaultMaxInFlightRecords
	if n := r.pub.MaxBufferedRecords(); n > 0 && n < inFlight {
		inFlight = n
	}
	return r.cfg.LogEngine(conn, r.pub, logsource.Config{
		Schema:              r.cfg.Schema,
		Slot:                r.cfg.LogSlot,
		Destinations:        r.cfg.Destinations,
		MaxInFlightRecords:  inFlight,
		ShutdownTimeout:     r.cfg.ShutdownTimeout,
		UnknownTopicRetries: r.cfg.LogUnknownTopicRetries,
		Logger:              r.log,
	})
}

// deadLetterTimeout bounds one dead-letter write; past it the write counts as failed.
const deadLetterTimeout = 15 * time.Second

// deadLetter is the log-mode engine's dead-letter sink: it writes the rejected event as a
// 'rejected' row of keiro_outbox, where ListDead, Requeue, the console and the dead gauge
// read dead letters. The engine confirms the event's transaction only once it returned nil;
// an error ends the engine's session, and the next one replays the transaction and calls it
// again (the write is idempotent: a second one writes nothing).
func (r *engine) deadLetter(rej publish.Rejection) error {
	if rej.Event == nil {
		return fmt.Errorf("dead letter of message %s: no event", rej.MessageID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadLetterTimeout)
	defer cancel()
	errText := ""
	if rej.Err != nil {
		errText = rej.Err.Error()
	}
	wrote, err := r.store.writeDeadLetter(ctx, r.pool, rej.Event, rej.Code, errText)
	if err != nil {
		return err
	}
	if wrote {
		r.stats.rejected.Add(1)
		r.inst.Rejected.Add(ctx, 1, publish.DestinationAttr(rej.Destination))
	}
	r.log.Error("log mode: Kafka refused an event for good; it is a dead letter of keiro_outbox (relay dead list), and the stream moves on",
		"message_id", rej.MessageID, "source", rej.Source, "destination", rej.Destination,
		"code", rej.Code, "err", rej.Err, "written", wrote)
	return nil
}

// writeDeadLetter writes ev, which Kafka refused for good with code (the Kafka error's name in
// lower case, as the claim relay's rejection_code) and errText, as a 'rejected' row of
// keiro_outbox with the outbox id of its keiro_outbox_log row, its first attempt counted. It
// reports whether it wrote the row: false when the event is already there (a replayed
// transaction's second rejection, or an event also enqueued in claim mode).
func (s *Store) writeDeadLetter(ctx context.Context, q keiro.DB, ev *envelope.Event, code, errText string) (bool, error) {
	a := newEnqueueArgs(1, len(ev.Payload))
	a.add(envelope.NewUUIDv7(), ev, ev.TraceContext)
	args := append(a.scalarArgs(false)[:enqueueColumns], code, errText)
	rows, err := q.Query(ctx, s.q.DeadLetter, args...)
	if err != nil {
		return false, fmt.Errorf("write the dead letter of message %s: %w", ev.MessageID, err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("write the dead letter of message %s: %w", ev.MessageID, err)
	}
	return n > 0, nil
}

// enterLogMode switches the schema to log mode, or checks the relay's slot when it is in log
// mode already, and publishes the gap left when another relay switched before this relay's
// slot existed.
func (r *engine) enterLogMode(ctx context.Context) error {
	mode, err := r.store.Mode(ctx, r.pool)
	if err != nil {
		return err
	}
	// Prepare (or check) the slot even when the schema is in log mode: the overlap with the
	// schema's other slots, and the publication's destinations, are checked at every start.
	if r.afterModeRead != nil {
		r.afterModeRead()
	}
	var ch ModeChange
	if mode != ModeLog {
		ch, err = r.store.SetModeFor(ctx, r.pool, ModeLog, r.cfg.LogSlot, r.cfg.Destinations)
	} else {
		ch.From, ch.To = ModeLog, ModeLog
		// The schema is in log mode: a publication that lost its table is refused, not
		// repaired, since the slot did not decode the events written meanwhile.
		var p LogPrepared
		p, err = r.store.prepareLog(ctx, r.pool, r.cfg.LogSlot, r.cfg.Destinations, never)
		ch.Slot, ch.SlotCreated = p.Slot, p.SlotCreated
	}
	if err != nil {
		return err
	}
	switch {
	case ch.From != ModeLog:
		r.log.InfoContext(ctx, "switched the outbox to log mode", "from", ch.From, "lsn", ch.LSN, "slot", ch.Slot)
	case mode != ModeLog && ch.SlotCreated:
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
		r.log.ErrorContext(ctx, "log mode: created the relay's slot while the schema was already in log mode: it publishes the events of its destinations written from now on; republish those written since the switch with `relay mode recover --since=<the switch's time>` (Store.RecoverLog), or prepare every destination group's slot before the switch (relay mode prepare)",
			"slot", ch.Slot, "destinations", r.cfg.Destinations)
	}
	return nil
}

// followSlot runs the log engine beside the claim loop (claimDone reports its end) until ctx
// ends or either fails. Once the schema is switched back to claim mode, new events land in
// keiro_outbox, and the slot may still hold older events of their keys: the claim loop stops
// (the claim relays publish keiro_outbox from then on) and the engine goes on with the slot.
func (r *engine) followSlot(ctx context.Context, stopClaim context.CancelFunc, claimDone <-chan error) error {
	ectx, stopEngine := context.WithCancel(ctx)
	defer stopEngine()
	engineDone := make(chan error, 1)
	go func() { engineDone <- r.logEngine.Run(ectx) }()
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
			if m, err := r.store.Mode(ctx, r.pool); err == nil && m != ModeLog {
				r.log.InfoContext(ctx, "log mode: the schema is in claim mode; the claim loop stops, the slot is still followed")
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
func (r *engine) otherLogSlots(ctx context.Context, slot string) (bool, error) {
	slots, err := r.store.LogSlots(ctx, r.pool)
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
func (r *engine) recoverSwitchGap(ctx context.Context, ch ModeChange) error {
	var until time.Time
	if err := r.pool.QueryRow(ctx, r.store.q.Clock).Scan(&until); err != nil {
		return fmt.Errorf("read the database's clock: %w", err)
	}
	since := ch.Changed.Add(-time.Hour)
	rec, err := r.store.RecoverLogFor(ctx, r.pool, since, until, r.cfg.Destinations)
	if err != nil {
		return err
	}
	r.log.WarnContext(ctx, "log mode: another relay switched the schema before this relay's slot existed; the events of its destinations written meanwhile are published from keiro_outbox first",
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

// slotGauges registers the slot's gauges on the relay's meter; each collection reads the
// slot's row (one query, bounded by a second).
func (r *engine) slotGauges() (metric.Registration, error) {
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
	attrs := metric.WithAttributes(attribute.String("keiro.outbox.slot", r.cfg.LogSlot))
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		st, err := r.store.LogSlotStatus(qctx, r.pool, r.cfg.LogSlot)
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

// drainClaimed waits until keiro_outbox has no open row (pending, failed or publishing) of the
// relay's destinations,
// checking every PollInterval, while the claim loop (claimDone reports its end) publishes
// them. It returns the claim loop's error if the loop ends first.
func (r *engine) drainClaimed(ctx context.Context, claimDone <-chan error) error {
	open := func() (bool, error) {
		var n bool
		err := r.pool.QueryRow(ctx, r.store.q.AnyOpen, r.cfg.Destinations).Scan(&n)
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
	r.log.InfoContext(ctx, "log mode: publishing the rows still open in keiro_outbox first")
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

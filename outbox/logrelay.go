package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/logreg"
	"github.com/keiro-go/keiro/tracing"
)

// newLogEngine builds the ModeLog engine of r: it reads the slot through a replication
// connection to the pool's database and produces with r's client.
func (r *Relay) newLogEngine() (logreg.Engine, error) {
	if logreg.New == nil {
		return nil, errors.New(`Mode log: import _ "github.com/keiro-go/keiro/outbox/logrelay" to link the log-mode engine`)
	}
	conn := r.pool.Config().ConnString()
	if conn == "" {
		return nil, errors.New("Mode log: the pool has no connection string to open a replication connection with; build it with pgxpool.New or pgxpool.ParseConfig")
	}
	inFlight := 16384 // the engine's default
	if n, ok := r.client.OptValue(kgo.MaxBufferedRecords).(int64); ok && n < int64(inFlight) {
		inFlight = int(n)
	}
	return logreg.New(logreg.Config{
		ConnString:              conn,
		Client:                  r.client,
		Schema:                  r.cfg.Schema,
		Slot:                    r.cfg.LogSlot,
		MaxInFlightRecords:      inFlight,
		MaxRecordBytes:          r.cfg.MaxRecordBytes,
		ShutdownTimeout:         r.cfg.ShutdownTimeout,
		CloudEvents:             r.cfg.CloudEvents,
		CloudEventsDestinations: r.cfg.CloudEventsDestinations,
		Logger:                  r.log,
		OnSend:                  r.logSend,
		OnRejected: func(rej logreg.Rejection) {
			r.stats.rejected.Add(1)
			r.inst.rejected.Add(context.Background(), 1, destinationAttr(rej.Destination))
			r.log.Error("log mode: Kafka refused an event for good; the stream moves on",
				"message_id", rej.MessageID, "source", rej.Source, "destination", rej.Destination,
				"code", rej.Code, "err", rej.Err)
		},
	})
}

// runLog is Run in ModeLog: switch the schema to log mode (so producers stop writing
// keiro_outbox), publish what is still open in keiro_outbox with the claim loop (the rows
// enqueued before the switch come first, which keeps each key's order across it), then
// follow the slot. The slot exists from the switch on and holds the rows written since.
func (r *Relay) runLog(ctx context.Context) error {
	mode, err := r.store.Mode(ctx, r.pool)
	if err != nil {
		return fmt.Errorf("outbox relay: %w", err)
	}
	if mode != ModeLog {
		ch, err := r.store.SetMode(ctx, r.pool, ModeLog, r.cfg.LogSlot)
		if err != nil {
			return fmt.Errorf("outbox relay: %w", err)
		}
		r.log.InfoContext(ctx, "switched the outbox to log mode", "from", ch.From, "lsn", ch.LSN)
	}
	if err := r.drainClaimed(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	unregister, err := r.slotGauges()
	if err != nil {
		return fmt.Errorf("outbox relay: %w", err)
	}
	defer func() { _ = unregister.Unregister() }()
	return r.logEngine.Run(ctx)
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
func (r *Relay) slotGauges() (metric.Registration, error) {
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

// drainClaimed runs the claim loop until keiro_outbox has no open row (pending, failed or
// publishing), checking every PollInterval.
func (r *Relay) drainClaimed(ctx context.Context) error {
	open := func() (bool, error) {
		var n bool
		err := r.pool.QueryRow(ctx, r.store.q.AnyOpen).Scan(&n)
		return n, err
	}
	if n, err := open(); err != nil || !n {
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("outbox relay: look for open rows of keiro_outbox: %w", err)
		}
		return nil
	}
	r.log.InfoContext(ctx, "log mode: publishing the rows still open in keiro_outbox first")
	dctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.runClaim(dctx) }()
	t := time.NewTicker(r.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			stop()
			if ctx.Err() != nil {
				return nil
			}
			return err
		case <-t.C:
			n, err := open()
			if err == nil && !n {
				stop()
				return <-done
			}
		}
	}
}

// logSend is log mode's OnSend: the claim relay's send span, child of the row's traceparent,
// and its instruments: sent messages and send duration per record, published and publish
// latency (from the transaction's commit, the log table having no creation time) per
// acknowledged one.
func (r *Relay) logSend(ev *envelope.Event, committed time.Time) (*envelope.TraceContext, func(*kgo.Record, error)) {
	span, tc := r.startSend(ev)
	start := time.Now()
	return tc, func(rec *kgo.Record, err error) {
		if rec == nil { // rejected before it was sent
			span.SetAttributes(attribute.String("keiro.outbox.rejection_code", "message_too_large"))
			span.End()
			return
		}
		r.inst.recordSend(rec, err, start)
		if err == nil {
			ctx := context.Background()
			r.inst.published.Add(ctx, 1, destinationAttr(rec.Topic))
			r.inst.latency.Record(ctx, time.Since(committed).Seconds())
		}
		endSend(span, rec, err)
	}
}

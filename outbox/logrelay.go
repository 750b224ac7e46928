package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/outbox/internal/logreg"
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
		OnRejected: func(rej logreg.Rejection) {
			r.stats.rejected.Add(1)
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
	return r.logEngine.Run(ctx)
}

// drainClaimed runs the claim loop until keiro_outbox has no open row (pending, failed or
// publishing), checking every PollInterval.
func (r *Relay) drainClaimed(ctx context.Context) error {
	open := func() (bool, error) {
		var n bool
		err := r.pool.QueryRow(ctx, r.store.bind(sqlAnyOpen)).Scan(&n)
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

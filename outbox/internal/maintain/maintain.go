// Package maintain is a relay's maintenance pass: retention of sent rows (and in log mode of
// keiro_outbox_log) and the sample of the outbox-wide gauges, one relay at a time under the
// maintenance lock.
package maintain

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/internal/advisorylock"
	"github.com/keiro-go/keiro/outbox/internal/metrics"
	"github.com/keiro-go/keiro/outbox/internal/modes"
)

// maxRetentionBatchesPerPass bounds one maintenance pass, so a huge backlog of old sent rows
// is worked down over several passes instead of one long one.
const maxRetentionBatchesPerPass = 100

// GaugeFreshness is how many maintenance intervals a relay's gauge sample stays exported when
// no pass replaces or withdraws it.
const GaugeFreshness = 3

// Config is what a relay's maintenance works with.
type Config struct {
	// DB runs the statements; Outbox is the schema's outbox (its name and statements).
	DB     keiro.DB
	Outbox modes.Schema
	// Log is set for a relay in log mode, whose pass also deletes from keiro_outbox_log what
	// the schema's slots confirmed; LogSlot is its slot.
	Log     bool
	LogSlot string
	// Retention, RetentionBatch and Interval are the relay's (RelayConfig).
	Retention      time.Duration
	RetentionBatch int
	Interval       time.Duration
	// Inst receives the gauge samples; Logger the failed passes.
	Inst   *metrics.Instruments
	Logger *slog.Logger
}

// Maintainer runs a relay's maintenance passes.
type Maintainer struct{ cfg Config }

// New returns the maintainer of cfg.
func New(cfg Config) *Maintainer { return &Maintainer{cfg: cfg} }

// Run runs a maintenance pass every Interval (and once at start) until ctx ends.
func (m *Maintainer) Run(ctx context.Context) {
	r := m
	t := time.NewTimer(0)
	defer t.Stop()
	defer r.cfg.Inst.ForgetGauges() // a stopped relay exports no outbox-wide gauge
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := r.Pass(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.WarnContext(ctx, "outbox maintenance failed", "err", err)
		}
		t.Reset(r.cfg.Interval)
	}
}

// Result reports one maintenance pass.
type Result struct {
	// Ran is false when another relay held the maintenance lock (nothing was done).
	Ran bool
	// Deleted is the number of sent rows removed by retention.
	Deleted int64
	// LogDeleted is the number of keiro_outbox_log rows removed by retention (ModeLog).
	LogDeleted int64
	// Backlog, OldestPendingAge and Dead are the sampled gauges.
	Backlog          int64
	OldestPendingAge time.Duration
	Dead             int64
}

// Pass runs one maintenance pass now if no other relay is running one (Relay.MaintenancePass).
func (m *Maintainer) Pass(ctx context.Context) (res Result, err error) {
	r := m
	sampled := false
	defer func() {
		if !sampled {
			r.cfg.Inst.ForgetGauges()
		}
	}()
	// Each statement takes the maintenance lock for its own transaction only: no session holds it
	// between statements, so maintenance is safe behind PgBouncer in transaction mode (a session
	// lock would stay on whichever server connection took it).
	key := advisorylock.OutboxMaintenance(r.cfg.Outbox.Name)
	if r.cfg.Retention >= 0 {
		for range maxRetentionBatchesPerPass {
			var got bool
			var n int64
			if err := r.cfg.DB.QueryRow(ctx, r.cfg.Outbox.Q.Retention, r.cfg.Retention.Microseconds(), r.cfg.RetentionBatch, key).Scan(&got, &n); err != nil {
				return res, fmt.Errorf("outbox maintenance: delete sent rows past retention: %w", err)
			}
			if !got {
				return res, nil
			}
			res.Ran = true
			res.Deleted += n
			if n < int64(r.cfg.RetentionBatch) {
				break
			}
		}
	}
	if r.cfg.Log && r.cfg.Retention >= 0 {
		n, got, err := r.logRetention(ctx, key)
		res.LogDeleted = n
		if err != nil || !got {
			return res, err
		}
		res.Ran = true
	}
	gauges, got, err := r.sampleGauges(ctx, key)
	switch {
	case err != nil:
		return res, fmt.Errorf("outbox maintenance: sample gauges: %w", err)
	case !got:
		return res, nil // another relay's turn
	}
	res.Ran = true
	for _, g := range gauges {
		res.Backlog += g.Backlog
		res.Dead += g.Dead
		res.OldestPendingAge = max(res.OldestPendingAge, time.Duration(g.OldestAge*float64(time.Second)))
	}
	r.cfg.Inst.RecordGauges(gauges)
	sampled = true
	return res, nil
}

// sampleGauges reads the per-destination gauges if it gets the maintenance lock key.
func (r *Maintainer) sampleGauges(ctx context.Context, key int64) ([]metrics.DestGauges, bool, error) {
	rows, err := r.cfg.DB.Query(ctx, r.cfg.Outbox.Q.Gauges, key)
	if err != nil {
		return nil, false, err
	}
	var out []metrics.DestGauges
	got := false
	for rows.Next() {
		var dest *string
		var g metrics.DestGauges
		if err := rows.Scan(&got, &dest, &g.Backlog, &g.OldestAge, &g.Dead); err != nil {
			rows.Close()
			return nil, false, err
		}
		if dest != nil {
			g.Destination = *dest
			out = append(out, g)
		}
	}
	return out, got, rows.Err()
}

// logRetention is log mode's part of a maintenance pass: it records retention's mark (the time
// and the WAL position, once a minute) and deletes the rows of keiro_outbox_log older than
// Retention that every log-mode slot of the schema has confirmed (the lowest confirmed position
// of Store.LogSlots, the relay's own slot among them: with per-destination relays, the slowest
// slot holds the rows back), RetentionBatch per statement (sqlq's sqlLogRetention says what
// confirmed means), and only rows of destinations some slot publishes (coveredDestinations).
// got is false when another relay held the maintenance lock key.
func (r *Maintainer) logRetention(ctx context.Context, key int64) (deleted int64, got bool, err error) {
	var n int64
	if err := r.cfg.DB.QueryRow(ctx, r.cfg.Outbox.Q.LogMark, key).Scan(&got, &n); err != nil {
		return 0, false, fmt.Errorf("outbox maintenance: record the log retention mark: %w", err)
	}
	if !got {
		return 0, false, nil
	}
	covered, err := r.coveredDestinations(ctx)
	if err != nil {
		return 0, false, err
	}
	for range maxRetentionBatchesPerPass {
		if err := modes.ReadPublications(r.cfg.DB, func() error {
			return r.cfg.DB.QueryRow(ctx, r.cfg.Outbox.Q.LogRetention, r.cfg.Retention.Microseconds(),
				r.cfg.RetentionBatch, key, r.cfg.LogSlot, covered).Scan(&got, &n)
		}); err != nil {
			return deleted, false, fmt.Errorf("outbox maintenance: delete keiro_outbox_log rows past retention: %w", err)
		}
		if !got {
			return deleted, false, nil
		}
		deleted += n
		if n < int64(r.cfg.RetentionBatch) {
			break
		}
	}
	return deleted, true, nil
}

// coveredDestinations are the destinations some existing log-mode slot of the schema
// publishes: nil when one publishes them all. With per-destination slots only, the rows of
// any other destination were published by no slot, and retention keeps them (a group that
// names the destination later republishes them with Store.RecoverLogFor).
func (r *Maintainer) coveredDestinations(ctx context.Context) ([]string, error) {
	slots, err := r.cfg.Outbox.Slots(ctx, r.cfg.DB)
	if err != nil {
		return nil, fmt.Errorf("outbox maintenance: %w", err)
	}
	covered := []string{}
	for _, s := range slots {
		if !s.Exists {
			continue
		}
		if len(s.Destinations) == 0 {
			return nil, nil
		}
		covered = append(covered, s.Destinations...)
	}
	return covered, nil
}

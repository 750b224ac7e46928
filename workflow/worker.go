package workflow

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/backoff"
	"github.com/keiro-go/keiro/workflow/internal/wake"
)

// Worker defaults.
const (
	// DefaultPollInterval is the fallback wait of an idle worker: how late it finds runnable
	// instances when no notification reaches it.
	DefaultPollInterval = time.Second
	// DefaultBatchSize is how many runnable instances one pass claims.
	DefaultBatchSize = 10
)

// WorkerConfig configures a Worker.
type WorkerConfig struct {
	// Owner names the worker in leases; unique per worker. Defaults to a fresh UUIDv7.
	Owner string
	// PollInterval is how long an idle Run waits for a notification before it looks again.
	// Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// BatchSize is how many runnable instances one pass claims (they run one after the
	// other). Defaults to DefaultBatchSize.
	BatchSize int
	// DisableListen makes Run poll only (where notifications do not reach the session, as
	// through a transaction-mode pooler). Defaults to false.
	DisableListen bool
	// Backoff spaces Run's passes after failed ones (the database is unreachable). Defaults
	// to {PollInterval/10, 30s, 2}.
	Backoff keiro.Backoff
}

// Worker resumes runnable workflow instances (keiro's resume worker): started ones, ones
// whose awaited step, awakeable, child or sleep was resolved, ones due for a retry, and ones
// whose run crashed (once its lease expires). It claims each under a lease, so several
// workers, in one process or many, never run one instance at once while their leases live;
// a live lease held by another owner skips the instance. Run wakes on a NOTIFY from StartTx
// and the wake sources, and polls every PollInterval in case a notification is lost.
type Worker struct {
	e      *Engine
	cfg    WorkerConfig
	gauged atomic.Int64 // the engine clock's unix nanoseconds at the last gauge reading
}

// gaugeInterval is the least time, by the engine's clock, between two gauge readings of a
// worker (they count rows; a busy worker's passes come much more often).
const gaugeInterval = time.Second

// NewWorker returns a Worker over e, reporting every configuration problem at once.
func NewWorker(e *Engine, cfg WorkerConfig) (*Worker, error) {
	var errs []error
	if e == nil {
		return nil, errors.New("new workflow worker: engine is nil")
	}
	if cfg.Owner == "" {
		cfg.Owner = envelope.NewUUIDv7().String()
	}
	if cfg.PollInterval < 0 {
		errs = append(errs, fmt.Errorf("PollInterval: %s is negative", cfg.PollInterval))
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.BatchSize < 0 {
		errs = append(errs, fmt.Errorf("BatchSize: %d is negative", cfg.BatchSize))
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	cfg.Backoff = cfg.Backoff.WithDefaults(keiro.Backoff{Initial: cfg.PollInterval / 10, Max: 30 * time.Second, Multiplier: keiro.DefaultMultiplier})
	if err := cfg.Backoff.Validate("Backoff"); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new workflow worker: %w", err)
	}
	return &Worker{e: e, cfg: cfg}, nil
}

// Owner returns the worker's lease owner name.
func (w *Worker) Owner() string { return w.cfg.Owner }

// Pass is what one RunOnce did.
type Pass struct {
	// Claimed is the number of instances claimed and run; the others count their outcomes.
	Claimed, Completed, Suspended, Retrying, Failed, Cancelled, ContinuedAsNew int
	// LeaseSkipped is the number of runnable instances held by another live owner, counted
	// when the pass read the gauges.
	LeaseSkipped int
	// UnknownName is the number of runnable instances whose name has no registered function
	// in this engine (left for a worker that has it), counted when the pass read the gauges.
	UnknownName int
}

// RunOnce is one pass: it records the gauges (at most once a second by the engine's clock:
// keiro.workflow.awakeables.pending and keiro.workflow.lease.skipped, and Pass.LeaseSkipped and
// Pass.UnknownName; zero in the passes between), claims up to BatchSize runnable instances and
// runs them one after the other. An error is a database failure of the pass itself (a run
// that fails is Retrying or Failed, not an error).
func (w *Worker) RunOnce(ctx context.Context) (Pass, error) {
	var p Pass
	e := w.e
	now := e.cfg.Now()
	names := e.names()
	if last := w.gauged.Load(); now.Sub(time.Unix(0, last)) >= gaugeInterval && w.gauged.CompareAndSwap(last, now.UnixNano()) {
		var pending, leased, unknown int64
		if err := e.db.QueryRow(ctx, e.q.Gauges, now, names).Scan(&pending, &leased, &unknown); err != nil {
			e.tel.resumeErrors.Add(ctx, 1)
			return p, fmt.Errorf("workflow worker: read gauges: %w", err)
		}
		e.tel.pending.Record(ctx, pending)
		e.tel.leaseSkipped.Add(ctx, leased)
		p.LeaseSkipped, p.UnknownName = int(leased), int(unknown)
	}
	rows, err := e.db.Query(ctx, e.q.Claim, w.cfg.Owner, now, w.cfg.BatchSize, names, now.Add(e.cfg.LeaseTTL))
	if err != nil {
		e.tel.resumeErrors.Add(ctx, 1)
		return p, fmt.Errorf("workflow worker: claim: %w", err)
	}
	claims, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claim, error) { return scanClaim(r) })
	if err != nil {
		e.tel.resumeErrors.Add(ctx, 1)
		return p, fmt.Errorf("workflow worker: claim: %w", err)
	}
	for i, cl := range claims {
		def, _ := e.definition(cl.name)
		if ctx.Err() != nil {
			w.release(ctx, claims[i:])
			return p, ctx.Err()
		}
		p.Claimed++
		e.tel.resumed.Add(ctx, 1)
		out, err := e.advance(ctx, def, cl, w.cfg.Owner)
		if err != nil {
			if ctx.Err() != nil {
				w.release(ctx, claims[i+1:])
				return p, ctx.Err()
			}
			e.tel.resumeErrors.Add(ctx, 1)
			e.cfg.Logger.WarnContext(ctx, "keiro: workflow run could not record its outcome; it is resumed when its lease expires",
				"workflow", cl.name, "id", cl.id, "error", err)
			continue
		}
		switch out {
		case Completed:
			p.Completed++
		case Suspended:
			p.Suspended++
		case Retrying:
			p.Retrying++
		case Failed:
			p.Failed++
		case Cancelled:
			p.Cancelled++
		case ContinuedAsNew:
			p.ContinuedAsNew++
		}
	}
	return p, nil
}

// release gives back the leases of claimed instances that did not run.
func (w *Worker) release(ctx context.Context, claims []claim) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, cl := range claims {
		if _, err := w.e.db.Exec(rctx, w.e.q.Release, cl.name, cl.id, w.cfg.Owner); err != nil {
			w.e.cfg.Logger.WarnContext(ctx, "keiro: workflow worker could not give back a lease; it expires", "workflow", cl.name, "id", cl.id, "error", err)
		}
	}
}

// Run runs passes until ctx ends and returns ctx's error. After a pass that found less than a
// batch it waits for a notification on the engine's channel (when the engine's db is a pool
// and DisableListen is false) or PollInterval, whichever is first. A failing pass is logged
// and retried after Backoff's delay. A run in flight when ctx ends is left as a crash leaves
// it: its journaled steps stay and it is resumed once its lease expires.
func (w *Worker) Run(ctx context.Context) error {
	var l *wake.Listener
	defer func() {
		if l != nil {
			l.Close()
		}
	}()
	pool, canListen := w.e.db.(*pgxpool.Pool)
	failures := 0
	for {
		if l == nil && canListen && !w.cfg.DisableListen {
			var err error
			if l, err = wake.Listen(ctx, pool, w.e.channel); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				w.e.cfg.Logger.WarnContext(ctx, "keiro: workflow worker cannot listen; it polls", "error", err)
				l = nil
			}
		}
		p, err := w.RunOnce(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			failures++
			wait := w.cfg.Backoff.Delay(failures)
			w.e.cfg.Logger.WarnContext(ctx, "keiro: workflow worker pass failed", "failures", failures, "retry_in", wait, "error", err)
			if err := backoff.Sleep(ctx, wait); err != nil {
				return err
			}
			continue
		}
		failures = 0
		if p.Claimed >= w.cfg.BatchSize {
			continue
		}
		if l == nil {
			if err := backoff.Sleep(ctx, w.cfg.PollInterval); err != nil {
				return err
			}
			continue
		}
		if _, err := l.Wait(ctx, w.cfg.PollInterval); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			w.e.cfg.Logger.WarnContext(ctx, "keiro: workflow worker lost its listening session; it listens again", "error", err)
			l.Close()
			l = nil
		}
	}
}

package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"

	"github.com/keiro-go/keiro/outbox/internal/claimsql"
	"github.com/keiro-go/keiro/outbox/internal/logsource"
	"github.com/keiro-go/keiro/outbox/internal/logstart"
	"github.com/keiro-go/keiro/outbox/internal/maintain"
	"github.com/keiro-go/keiro/outbox/internal/metrics"
	"github.com/keiro-go/keiro/outbox/internal/publish"
	"github.com/keiro-go/keiro/outbox/internal/service"
	"github.com/keiro-go/keiro/outbox/internal/shares"
	"github.com/keiro-go/keiro/outbox/internal/vacuum"
	"github.com/keiro-go/keiro/tracing"
)

// ErrHalted is wrapped by the error Run returns when a StopTheLine relay halted on a failed row.
var ErrHalted = errors.New("outbox relay halted (stop-the-line)")

// Relay publishes outbox rows to Kafka: it claims batches, produces them with its franz-go
// client, and marks every row with its outcome. Any number of relays (in any number of
// processes) may drain one table. Create one with NewRelay and start it with Run.
type Relay struct {
	*engine
}

// Stats is a snapshot of a relay's counters since NewRelay.
type Stats struct {
	// Batches is the number of batches marked.
	Batches int64
	// Claims is the number of claim statements run (empty ones included); Claimed is the
	// number of rows they claimed.
	Claims, Claimed int64
	// Published, Retried, Skipped, Dead, Rejected and Released count rows moved to sent,
	// failed (attempt used), failed (held back, attempt refunded), dead, rejected and pending.
	Published, Retried, Skipped, Dead, Rejected, Released int64
	// Deferred counts rows put back without using an attempt because Kafka was unavailable.
	Deferred int64
	// Reclaimed counts rows taken over from an expired lease.
	Reclaimed int64
	// LeaseRenewals counts lease extensions of batches in flight for over a third of the
	// lease (a slow broker, a queue of batches, a mark retried through a database outage).
	LeaseRenewals int64
	// ClaimErrors and MarkErrors count failed claim and mark statements (retried).
	ClaimErrors, MarkErrors int64
	// OrderBroken counts rows acknowledged by Kafka after an earlier row of their key failed
	// in the same flush (see BatchResult.OrderBroken); it should stay 0.
	OrderBroken int64
	// LeaseLost counts rows not produced because their batch's lease was lost or too close to
	// its end when their flush came (the relay was paused, or cut off from PostgreSQL): they
	// are released, or left to the relay that took them over.
	LeaseLost int64
	// MarksAbandoned counts batches whose mark PostgreSQL refused maxMarkRefusals times in a row: their
	// rows are left to their lease, which is no longer renewed.
	MarksAbandoned int64
	// Shares is the number of claim shares the relay holds now, of 64, and ShareMembers the
	// number of relays of its share group (relays publishing the same destinations) it counted
	// last: the relays of a group split the shares evenly, and one alone holds all 64. Both are
	// 0 for a PollOnly relay and while its share session is down (see "Several relays" in the
	// package doc).
	Shares, ShareMembers int64
	// ShareClaims counts the claims restricted to the relay's own shares (a part of Claims):
	// claims of a deep backlog by a relay that holds some, but not all, of its group's shares.
	ShareClaims int64
	// Vacuums counts the relay's own vacuums of the outbox table (see
	// RelayConfig.VacuumThreshold).
	Vacuums int64
}

// Stats returns a snapshot of the relay's counters.
func (r *Relay) Stats() Stats {
	s := &r.stats
	st := Stats{Batches: s.batches.Load(), Claims: s.claims.Load(), Claimed: s.claimed.Load(), Published: s.published.Load(),
		Retried: s.retried.Load(), Skipped: s.skipped.Load(), Dead: s.dead.Load(), Rejected: s.rejected.Load(),
		Released: s.released.Load(), Deferred: s.deferred.Load(), Reclaimed: s.reclaimed.Load(),
		ClaimErrors: s.claimErrors.Load(), MarkErrors: s.markErrors.Load(), OrderBroken: s.orderBroken.Load(),
		LeaseRenewals: s.leaseRenewals.Load(), LeaseLost: s.leaseLost.Load(), MarksAbandoned: s.marksAbandoned.Load(),
		ShareClaims: s.shareClaims.Load(), Vacuums: s.vacuums.Load()}
	if r.logEngine != nil {
		st.Published += r.logEngine.Published()
	}
	if r.shares != nil {
		st.Shares, st.ShareMembers = int64(r.shares.Shares().Count()), r.shares.Members()
	}
	return st
}

// NewRelay returns a relay that drains the outbox of cfg.Schema through pool and produces with
// client. The client must have been built with [ProducerOpts] (acks=all, idempotent, manual
// flushing); NewRelay rejects one that is not. The relay does not close pool or client.
func NewRelay(pool *pgxpool.Pool, client *kgo.Client, cfg RelayConfig) (*Relay, error) {
	cfg.setDefaults()
	var errs []error
	if pool == nil {
		errs = append(errs, errors.New("pool is nil"))
	}
	if err := cfg.validate(); err != nil {
		errs = append(errs, err)
	}
	if _, err := publish.CheckClient(client, cfg.BatchSize*cfg.MaxInFlightBatches, cfg.MaxRecordBytes); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new outbox relay: %w", err)
	}
	if cfg.Policy == StopTheLine {
		cfg.MaxInFlightBatches = 1 // a halt must leave nothing after the failed row in flight
	}
	cfg.ClaimConcurrency = min(cfg.ClaimConcurrency, cfg.MaxInFlightBatches)
	store, err := NewStore(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("new outbox relay: %w", err)
	}
	inst, err := metrics.New(cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("new outbox relay: create instruments: %w", err)
	}
	// A sample older than a few maintenance intervals is not exported either: the relay's
	// maintenance is stuck (a pass that cannot finish), and its last sample says nothing of now.
	if err := inst.ObserveGauges(maintain.GaugeFreshness * cfg.MaintenanceInterval); err != nil {
		return nil, fmt.Errorf("new outbox relay: observe gauges: %w", err)
	}
	eo := cfg.exactlyOnce()
	if eo != nil {
		if err := inst.ObserveTransactions(eo.Counters); err != nil {
			return nil, fmt.Errorf("new outbox relay: observe transactions: %w", err)
		}
	}
	r := &engine{
		pool: pool, cfg: cfg, eo: eo, store: store, claims: &claimsql.Store{Q: store.q}, inst: inst,
		log:  cfg.Logger.With("component", "outbox-relay", "schema", cfg.Schema),
		wake: make(chan struct{}, 1), backlog: make(chan struct{}, cfg.ClaimConcurrency),
		now: time.Now,
	}
	r.maint = maintain.New(maintain.Config{DB: pool, Outbox: adminOf(store).modes(), Log: cfg.Mode == ModeLog, LogSlot: cfg.LogSlot,
		Retention: cfg.Retention, RetentionBatch: cfg.RetentionBatch, Interval: cfg.MaintenanceInterval, Inst: inst, Logger: r.log})
	if r.pub, err = r.newPublisher(client); err != nil {
		return nil, fmt.Errorf("new outbox relay: %w", err)
	}
	if !cfg.PollOnly {
		r.shares = shares.New(ownConnConfig(pool, cfg.Schema), store.q, cfg.Destinations)
	}
	if cfg.Mode == ModeLog {
		if r.logEngine, err = r.newLogEngine(); err != nil {
			return nil, fmt.Errorf("new outbox relay: %w", err)
		}
		r.logStart = logstart.New(logstart.Config{DB: pool, Outbox: adminOf(store).modes(), Slot: cfg.LogSlot, Destinations: cfg.Destinations,
			Engine: r.logEngine, PollInterval: cfg.PollInterval, MeterProvider: cfg.MeterProvider, Logger: r.log,
			AfterModeRead: func() {
				if r.afterModeRead != nil {
					r.afterModeRead()
				}
			}})
	}
	return &Relay{r}, nil
}

// newPublisher returns the relay's publisher: it produces with client, whose options
// NewRelay checked.
func (r *engine) newPublisher(client *kgo.Client) (*publish.Publisher, error) {
	cfg := &r.cfg
	tp, mp := cfg.TracerProvider, cfg.MeterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return publish.New(publish.Config{
		Client: client, Buffered: cfg.BatchSize * cfg.MaxInFlightBatches, MaxRecordBytes: cfg.MaxRecordBytes,
		CloudEvents: cfg.CloudEvents, CloudEventsDestinations: cfg.CloudEventsDestinations,
		Tracer: tp.Tracer(tracing.ScopeName), Meter: mp.Meter(tracing.ScopeName),
		DeadLetter: r.deadLetter, Logger: r.log,
	})
}

// Run drains the outbox until ctx is cancelled, then shuts down gracefully: it stops claiming,
// waits up to ShutdownTimeout for in-flight produces, marks what finished, releases the rest
// back to pending (attempt refunded) and returns nil. Under StopTheLine it returns an error
// wrapping ErrHalted at the first failed row. A relay runs once at a time.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("outbox relay: already running")
	}
	defer r.running.Store(false)
	if r.logEngine != nil {
		return r.runLog(ctx)
	}
	return r.runClaim(ctx)
}

// runClaim is Run in ModeClaim (and, in ModeLog, the claim loop of keiro_outbox beside the
// slot: its open rows at the switch and requeued dead letters). Claimers, the producer and
// the lease renewal run as services beside the relay's background services (backgroundServices);
// the marker runs on the caller's goroutine, and every service stops with it.
func (r *engine) runClaim(ctx context.Context) error {
	p := r.newPipeline(ctx)
	defer p.close()
	produce := p.produceAll
	r.claims.Txn = ""
	if r.cfg.ExactlyOnce {
		// Exactly once (eosclaim.go): one transactional producer per run, its id in the claims.
		p.eos = r.newClaimEOS()
		r.claims.Txn = p.eos.cfg.TransactionalID
		produce = p.produceAllEOS
	}
	var bg service.Group
	bg.Go(p.stopCtx, r.backgroundServices()...)
	bg.Go(p.stopCtx, service.Func(p.claimAll), service.Func(produce))
	if p.eos != nil {
		bg.Go(p.stopCtx, service.Func(func(ctx context.Context) { r.recoverLost(ctx, p.eos) }))
	}
	renewCtx, stopRenewing := context.WithCancel(p.hardCtx)
	bg.Go(renewCtx, service.Func(r.renewLeases))
	err := p.markAll(ctx)
	stopRenewing()
	p.stop(nil)
	bg.Wait()
	return err
}

// backgroundServices are the relay's loops beside its pipeline: the LISTEN session (unless
// PollOnly), maintenance, the vacuum of the outbox table and the claim shares' balance.
func (r *engine) backgroundServices() []service.Service {
	var svcs []service.Service
	if !r.cfg.PollOnly {
		svcs = append(svcs, service.Func(r.listen))
	}
	svcs = append(svcs, service.Func(r.maint.Run), service.Func(func(ctx context.Context) {
		vacuum.Run(ctx, vacuum.Config{Pool: r.pool, ConnConfig: ownConnConfig(r.pool, r.cfg.Schema), Schema: r.cfg.Schema,
			Threshold: r.cfg.VacuumThreshold, Moved: func() int64 {
				return r.stats.published.Load() + r.stats.dead.Load() + r.stats.rejected.Load()
			}, Backlogged: r.backlogged.Load, Logger: r.log, Vacuums: &r.stats.vacuums})
	}))
	if r.shares != nil {
		svcs = append(svcs, service.Func(func(ctx context.Context) {
			r.shares.Run(ctx, min(r.cfg.PollInterval, shares.BalanceInterval), r.log, r.shareHook)
		}))
	}
	return svcs
}

// pipeline is one run of the claim loop: claimers → producer → marker, joined by channels
// bounded by the in-flight slots.
type pipeline struct {
	r *engine
	// stop ends claiming (ctx cancelled or a halt); hard ends the waits for produce and marks,
	// ShutdownTimeout after stop.
	stopCtx    context.Context
	stop       context.CancelCauseFunc
	hardCtx    context.Context
	hardCancel context.CancelFunc
	slots      chan struct{}
	claimed    chan *claimedBatch
	produced   chan *claimedBatch
	// eos is the run's exactly-once state; nil without ExactlyOnce.
	eos *claimEOS
}

// newPipeline returns the pipeline of a run under ctx, with its shutdown deadline armed.
func (r *engine) newPipeline(ctx context.Context) *pipeline {
	n := r.cfg.MaxInFlightBatches
	p := &pipeline{r: r, slots: make(chan struct{}, n), claimed: make(chan *claimedBatch, n), produced: make(chan *claimedBatch, n)}
	p.stopCtx, p.stop = context.WithCancelCause(ctx)
	p.hardCtx, p.hardCancel = context.WithCancel(context.WithoutCancel(ctx))
	go p.hardDeadline()
	return p
}

// hardDeadline cancels hard ShutdownTimeout after stop (or returns once hard ended).
func (p *pipeline) hardDeadline() {
	select {
	case <-p.stopCtx.Done():
	case <-p.hardCtx.Done():
		return
	}
	t := time.NewTimer(p.r.cfg.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-t.C:
		p.hardCancel()
	case <-p.hardCtx.Done():
	}
}

// close ends the pipeline's contexts.
func (p *pipeline) close() {
	p.stop(nil)
	p.hardCancel()
}

// claimAll runs ClaimConcurrency claimers, which share the in-flight slots, and closes
// claimed when the last one stopped.
func (p *pipeline) claimAll(ctx context.Context) {
	var claimers service.Group
	for i := range p.r.cfg.ClaimConcurrency {
		claimers.Go(ctx, service.Func(func(ctx context.Context) {
			p.r.claimLoop(ctx, p.hardCtx, i > 0, p.slots, p.claimed)
		}))
	}
	claimers.Wait()
	close(p.claimed)
}

// produceAll produces the claimed batches, as many at once as are waiting, until claimed is
// closed; after a stop it passes them on unproduced (their rows are released when marked).
func (p *pipeline) produceAll(ctx context.Context) {
	defer close(p.produced)
	for b := range p.claimed {
		group := []*claimedBatch{b}
	more:
		for {
			select {
			case nb, ok := <-p.claimed:
				if !ok {
					break more
				}
				group = append(group, nb)
			default:
				break more
			}
		}
		if p.stopCtx.Err() == nil {
			t0 := time.Now()
			p.r.produceBatches(p.stopCtx, p.hardCtx, p.r.pub.Client(), group)
			p.r.log.DebugContext(ctx, "produced", "batches", len(group), "took", time.Since(t0))
		}
		for _, b := range group {
			p.produced <- b
		}
	}
}

// markAll marks each produced batch, frees its slot and wakes the claimers, until the
// producer stopped. It returns the error of a StopTheLine halt, after which claiming stops.
func (p *pipeline) markAll(ctx context.Context) error {
	r := p.r
	var halted error
	for b := range p.produced {
		if b.noMark {
			// Under ExactlyOnce, the outcome of its transaction is unknown: its rows are left
			// to the recovery of its transactional id (eosclaim.go).
			r.flying.Delete(b)
			r.inFlight.Add(-1)
			<-p.slots
			r.signal()
			continue
		}
		res := r.markOutcome(p.hardCtx, b)
		if p.eos != nil {
			p.eos.markedEOS(b)
		}
		r.flying.Delete(b)
		if res.HaltedOn != nil && halted == nil {
			// Stop before the slot is free: a claim after the halt would only be released.
			halted = fmt.Errorf("%w on outbox row %s", ErrHalted, *res.HaltedOn)
			p.stop(halted)
		}
		r.inFlight.Add(-1)
		<-p.slots
		r.signal()
		if len(r.cfg.Destinations) > 0 && !r.cfg.PollOnly && res.Published+res.Dead+res.Rejected > 0 {
			// Rows that went terminal may have been the heads of keys whose next rows are for
			// destinations this relay does not publish: wake the relays that do.
			if err := r.store.Notify(p.hardCtx, r.pool); err != nil && p.hardCtx.Err() == nil {
				r.log.WarnContext(ctx, "could not wake the other relays after a batch", "err", err)
			}
		}
	}
	return halted
}

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
	// The replication session carries the process's name, as its pool's sessions and its own
	// do, so that pg_stat_replication tells which relay holds the slot.
	name := r.pool.Config().ConnConfig.RuntimeParams["application_name"]
	if name == "" {
		name = ApplicationName(r.cfg.Schema)
	}
	return r.cfg.LogEngine(conn, r.pub, logsource.Config{
		ApplicationName:     name,
		Schema:              r.cfg.Schema,
		Slot:                r.cfg.LogSlot,
		Destinations:        r.cfg.Destinations,
		MaxInFlightRecords:  inFlight,
		ShutdownTimeout:     r.cfg.ShutdownTimeout,
		UnknownTopicRetries: r.cfg.LogUnknownTopicRetries,
		ExactlyOnce:         r.eo,
		Logger:              r.log,
	})
}

// runLog is Run in ModeLog: switch the schema to log mode (so producers stop writing
// keiro_outbox), publish what is still open in keiro_outbox with the claim loop (the rows
// enqueued before the switch come first, which keeps each key's order across it), then
// follow the slot. The slot exists from the switch on and holds the rows written since.
//
// The claim loop keeps running beside the engine: keiro_outbox still holds the dead letters
// (the engine's rejections among them), and a requeued one (Requeue, `relay dead requeue`)
// is pending there again, for the claim loop to publish. It also runs the maintenance pass
// (retention, the backlog and dead gauges) and the relay's vacuum of keiro_outbox. A requeued
// dead letter is published after the later events of its key, as in claim mode. The claim
// loop stops when the schema is switched back to claim mode (checked every PollInterval).
func (r *engine) runLog(ctx context.Context) error {
	if err := r.logStart.Enter(ctx); err != nil {
		return fmt.Errorf("outbox relay: %w", err)
	}
	cctx, stopClaim := context.WithCancel(ctx)
	defer stopClaim()
	claimDone := make(chan error, 1)
	go func() { claimDone <- r.runClaim(cctx) }()
	if err := r.logStart.DrainClaimed(ctx, claimDone); err != nil || ctx.Err() != nil {
		stopClaim()
		if err == nil {
			err = <-claimDone
		}
		return err
	}
	unregister, err := r.logStart.SlotGauges()
	if err != nil {
		stopClaim()
		return errors.Join(fmt.Errorf("outbox relay: %w", err), <-claimDone)
	}
	defer func() { _ = unregister.Unregister() }()
	return r.logStart.Follow(ctx, stopClaim, claimDone)
}

// MaintenancePass runs one maintenance pass now if no other relay is running one: it deletes
// sent rows older than Retention (RetentionBatch per statement), in ModeLog the rows of
// keiro_outbox_log older than Retention that the slot confirmed, and samples the backlog,
// oldest-pending-age and dead gauges. Every statement runs only if it gets the maintenance
// lock; the pass stops at the first that does not (another relay is at it). Run calls it every
// MaintenanceInterval; it is exported for tests and operators.
//
// Only a relay whose latest pass sampled the gauges exports them: a pass that does not (another
// relay has the lock, or the pass failed) stops this relay's export of the outbox-wide gauges
// until it samples again, so no relay keeps exporting an old sample.
func (r *Relay) MaintenancePass(ctx context.Context) (MaintenanceResult, error) {
	return r.maint.Pass(ctx)
}

// The log-mode slot's gauges (the WAL guard), with the slot's name as attribute
// keiro.outbox.slot: MetricLogSlotRetained is the WAL the slot retains, MetricLogSlotSafeWAL
// the WAL that can still be written before it is in danger of invalidation (absent when
// max_slot_wal_keep_size is unlimited), MetricLogSlotActive 1 while a relay reads it, and
// MetricLogSlotLost 1 once PostgreSQL invalidated it (wal_status lost).
const (
	MetricLogSlotRetained = logstart.MetricLogSlotRetained
	MetricLogSlotSafeWAL  = logstart.MetricLogSlotSafeWAL
	MetricLogSlotActive   = logstart.MetricLogSlotActive
	MetricLogSlotLost     = logstart.MetricLogSlotLost
)

// MaintenanceResult reports one maintenance pass.
type MaintenanceResult = maintain.Result

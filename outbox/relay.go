package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/backoff"
	"github.com/keiro-go/keiro/outbox/internal/logsource"
	"github.com/keiro-go/keiro/outbox/internal/publish"
	"github.com/keiro-go/keiro/outbox/internal/shares"
	"github.com/keiro-go/keiro/outbox/internal/translog"
	"github.com/keiro-go/keiro/outbox/internal/vacuum"
	"github.com/keiro-go/keiro/tracing"
)

// ErrHalted is wrapped by the error Run returns when a StopTheLine relay halted on a failed row.
var ErrHalted = errors.New("outbox relay halted (stop-the-line)")

// Relay publishes outbox rows to Kafka: it claims batches, produces them with its franz-go
// client, and marks every row with its outcome. Any number of relays (in any number of
// processes) may drain one table. Create one with NewRelay and start it with Run.
type Relay struct {
	pool  *pgxpool.Pool
	cfg   RelayConfig
	store *Store
	inst  *instruments
	log   *slog.Logger
	// pub turns rows into records for both sources, the claim loop and the log engine.
	pub  *publish.Publisher
	wake chan struct{}
	// suspects are the rows produced alone next time (publish.Suspects), by outbox id.
	suspects publish.Suspects[envelope.UUID]
	// topics are the destinations this relay's client has published to. The first record
	// for any other topic is produced alone: franz-go holds records for a topic it has no
	// metadata for aside and hands them to their partitions one by one once the metadata
	// arrives; during a flush the first ones can go out (and fail) in one request while the
	// rest are still being handed over and go out in the next, so a failure could be followed
	// by a success of later records of the same key.
	topics sync.Map // topic name → struct{}
	// logEngine follows the slot in ModeLog (logrelay.go); nil in ModeClaim.
	logEngine logsource.Engine
	// ackHook, if set (benchmarks), is called with each acknowledged row's message id.
	ackHook func(messageID string)
	// sleepHook, if set (tests), runs before each try of the sleep lock.
	sleepHook func()
	// flushHook, if set (tests), runs before each flush's lease check.
	flushHook func()
	// afterModeRead, if set (tests), runs in ModeLog between the relay's read of the schema's
	// mode and the preparation of its slot.
	afterModeRead func()
	// now is the relay's clock (time.Now; tests inject one): leases are timed with its
	// monotonic reading, so a wall-clock step neither shortens nor stretches them.
	now          func() time.Time
	outageStreak atomic.Int64
	running      atomic.Bool
	// transitionLog rate-limits the log lines of retried, dead and rejected rows.
	transitionLog translog.Log
	// signals counts wake-ups (notifications, finished batches), so a claimer can tell that one
	// happened while its claim ran.
	signals atomic.Int64
	// listening is set while the LISTEN session is up: only then may the relay sleep under
	// the sleep lock (producers' notifications would otherwise go unheard).
	listening atomic.Bool
	// inFlight counts the claimed batches not yet marked; each wakes the first claimer when
	// marked. (An extra claimer's claim in progress is not counted: if it takes rows, their
	// batch will; if not, nothing will, and the first claimer must not wait on it.)
	inFlight atomic.Int64
	// backlogged is set while claims come back full; backlog wakes the extra claimers then.
	backlogged atomic.Bool
	backlog    chan struct{}
	// flying holds the batches claimed and not yet marked, for renewLeases.
	flying sync.Map // *batch → struct{}
	// lost holds the claims whose reply did not arrive: they may have committed, holding
	// their rows under a lease nobody renews. Each claim first releases them (lostclaim.go).
	lostMu sync.Mutex
	lost   []lostClaim
	// shares are the claim shares this relay prefers while the backlog is deep (internal/shares);
	// nil for a PollOnly relay. shareHook, if set (tests), runs before each balance step.
	shares    *shares.Set
	shareHook func(ctx context.Context)

	stats struct {
		claims, claimed, batches, published, retried, skipped, dead, rejected, released, reclaimed,
		deferred, claimErrors, markErrors, orderBroken, leaseRenewals, leaseLost, marksAbandoned, shareClaims, vacuums atomic.Int64
		// sharesDrained counts the claims of the relay's own shares that came back empty
		// (the relay then claimed from every share for a poll interval): for benchmarks.
		sharesDrained atomic.Int64
	}
}

// ownConnConfig is the configuration of a connection the relay opens beside pool (its LISTEN,
// claim-share and vacuum sessions): pool's, named with the relay's [ApplicationName], so the
// relay is seen in pg_stat_activity (and counted by the console) however pool is configured.
func ownConnConfig(pool *pgxpool.Pool, schema string) *pgx.ConnConfig {
	cc := pool.Config().ConnConfig.Copy()
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	cc.RuntimeParams["application_name"] = ApplicationName(schema)
	return cc
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
	inst, err := newInstruments(cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("new outbox relay: create instruments: %w", err)
	}
	// A sample older than a few maintenance intervals is not exported either: the relay's
	// maintenance is stuck (a pass that cannot finish), and its last sample says nothing of now.
	if err := inst.observeGauges(gaugeFreshness * cfg.MaintenanceInterval); err != nil {
		return nil, fmt.Errorf("new outbox relay: observe gauges: %w", err)
	}
	r := &Relay{
		pool: pool, cfg: cfg, store: store, inst: inst,
		log:  cfg.Logger.With("component", "outbox-relay", "schema", cfg.Schema),
		wake: make(chan struct{}, 1), backlog: make(chan struct{}, cfg.ClaimConcurrency),
		now: time.Now,
	}
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
	}
	return r, nil
}

// newPublisher returns the relay's publisher: it produces with client, whose options
// NewRelay checked.
func (r *Relay) newPublisher(client *kgo.Client) (*publish.Publisher, error) {
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

// batch is one claim travelling through the pipeline.
type batch struct {
	token envelope.UUID
	rows  []claimedRow

	mu      sync.Mutex
	results []produceResult // per row, written by produce callbacks
	closed  bool            // set when the producer stops waiting: late callbacks are ignored
	// leasedAt is when the batch's lease last started (its claim, or its last renewal), read
	// before the statement was sent, so never later than the database's start of the lease;
	// marking is set when its mark begins (rows the mark moves no longer count as renewed, so
	// a renewal then reports no lost lease); lost, once a renewal found rows taken over by
	// another relay.
	leasedAt      time.Time
	marking, lost bool
	// expired is set when a flush found the lease lost or too close to its end: the batch's
	// rows left are not produced.
	expired bool
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

// runClaim is Run in ModeClaim (and, in ModeLog, the claim loop of keiro_outbox beside the slot: its open rows at the switch and requeued dead letters).
func (r *Relay) runClaim(ctx context.Context) error {

	// stop ends claiming (ctx cancelled or halt); hard ends waiting for produce and marks.
	stopCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	hardCtx, hardCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hardCancel()
	go func() {
		select {
		case <-stopCtx.Done():
		case <-hardCtx.Done():
			return
		}
		t := time.NewTimer(r.cfg.ShutdownTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			hardCancel()
		case <-hardCtx.Done():
		}
	}()

	slots := make(chan struct{}, r.cfg.MaxInFlightBatches)
	claimed := make(chan *batch, r.cfg.MaxInFlightBatches)
	produced := make(chan *batch, r.cfg.MaxInFlightBatches)
	var wg sync.WaitGroup
	var haltErr atomic.Pointer[error]

	if !r.cfg.PollOnly {
		wg.Add(1)
		go func() { defer wg.Done(); r.listen(stopCtx) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); r.maintain(stopCtx) }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		vacuum.Run(stopCtx, vacuum.Config{Pool: r.pool, ConnConfig: ownConnConfig(r.pool, r.cfg.Schema), Schema: r.cfg.Schema,
			Threshold: r.cfg.VacuumThreshold, Moved: func() int64 {
				return r.stats.published.Load() + r.stats.dead.Load() + r.stats.rejected.Load()
			}, Backlogged: r.backlogged.Load, Logger: r.log, Vacuums: &r.stats.vacuums})
	}()
	if r.shares != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.shares.Run(stopCtx, min(r.cfg.PollInterval, shares.BalanceInterval), r.log, r.shareHook)
		}()
	}
	// Claimers share the in-flight slots; claimed closes when the last one stops.
	var claimers sync.WaitGroup
	for i := range r.cfg.ClaimConcurrency {
		claimers.Add(1)
		go func() {
			defer claimers.Done()
			r.claimLoop(stopCtx, hardCtx, i > 0, slots, claimed)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		claimers.Wait()
		close(claimed)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(produced)
		for b := range claimed {
			group := []*batch{b}
		more:
			for {
				select {
				case nb, ok := <-claimed:
					if !ok {
						break more
					}
					group = append(group, nb)
				default:
					break more
				}
			}
			if stopCtx.Err() == nil {
				t0 := time.Now()
				r.produce(stopCtx, hardCtx, group)
				r.log.DebugContext(ctx, "produced", "batches", len(group), "took", time.Since(t0))
			}
			for _, b := range group {
				produced <- b
			}
		}
	}()
	renewCtx, stopRenewing := context.WithCancel(hardCtx)
	wg.Add(1)
	go func() { defer wg.Done(); r.renewLeases(renewCtx) }()
	for b := range produced {
		res := r.markOutcome(hardCtx, b)
		r.flying.Delete(b)
		if res.HaltedOn != nil && haltErr.Load() == nil {
			// Stop before the slot is free: a claim after the halt would only be released.
			err := fmt.Errorf("%w on outbox row %s", ErrHalted, *res.HaltedOn)
			haltErr.Store(&err)
			stop(err)
		}
		r.inFlight.Add(-1)
		<-slots
		r.signal()
		if len(r.cfg.Destinations) > 0 && !r.cfg.PollOnly && res.Published+res.Dead+res.Rejected > 0 {
			// Rows that went terminal may have been the heads of keys whose next rows are for
			// destinations this relay does not publish: wake the relays that do.
			if err := r.store.Notify(hardCtx, r.pool); err != nil && hardCtx.Err() == nil {
				r.log.WarnContext(ctx, "could not wake the other relays after a batch", "err", err)
			}
		}
	}
	stopRenewing()
	stop(nil)
	wg.Wait()
	if e := haltErr.Load(); e != nil {
		return *e
	}
	return nil
}

// signal wakes the claim loop without blocking.
func (r *Relay) signal() {
	r.signals.Add(1)
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// ApplicationNamePrefix starts the PostgreSQL application_name of every relay's own session:
// "keiro-relay:SCHEMA@HOST/PID" ([ApplicationName]). The operator console counts the distinct
// names of a schema's relays among the database's sessions as the relays connected.
const ApplicationNamePrefix = "keiro-relay:"

// maxApplicationName is PostgreSQL's limit on application_name (NAMEDATALEN-1 bytes).
const maxApplicationName = 63

// ApplicationName is the application_name of a relay process publishing the outbox of schema:
// "keiro-relay:SCHEMA@HOST/PID", the schema cut to 32 bytes and the host shortened so that the
// whole fits PostgreSQL's 63 bytes. A relay sets it on its LISTEN session, the connection it
// opens for itself, whatever the pool's application_name; a PollOnly relay has no session of
// its own, and is seen as a relay only when its pool's connections carry this name (the relay
// binary sets it on its pool unless the database URL names one).
func ApplicationName(schema string) string {
	host, _ := os.Hostname()
	prefix := SchemaApplicationNamePrefix(schema)
	suffix := fmt.Sprintf("/%d", os.Getpid())
	if over := len(prefix) + len(host) + len(suffix) - maxApplicationName; over > 0 {
		host = host[:max(0, len(host)-over)]
	}
	return prefix + host + suffix
}

// SchemaApplicationNamePrefix is the start of the [ApplicationName] of every relay of schema,
// whatever its host and process: "keiro-relay:SCHEMA@", the schema cut to its first 32 bytes.
func SchemaApplicationNamePrefix(schema string) string {
	return ApplicationNamePrefix + schema[:min(len(schema), 32)] + "@"
}

// listenRetryBackoff spaces the reconnects of a relay's lost LISTEN connection; the relay polls
// meanwhile, so a reconnect is never urgent and the retries are at most 5s apart.
var listenRetryBackoff = Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2}

// listen holds a LISTEN connection and signals the claim loop on every notification; it
// reconnects with backoff when the connection dies. The connection carries the relay's
// [ApplicationName], so the relay is seen in pg_stat_activity (and counted by the console)
// however its pool is configured.
func (r *Relay) listen(ctx context.Context) {
	channel := pgx.Identifier{r.store.NotifyChannel()}.Sanitize()
	for attempt := 0; ; {
		err := func() error {
			conn, err := pgx.ConnectConfig(ctx, ownConnConfig(r.pool, r.cfg.Schema))
			if err != nil {
				return fmt.Errorf("connect listener: %w", err)
			}
			defer conn.Close(context.WithoutCancel(ctx))
			if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
				return fmt.Errorf("listen: %w", err)
			}
			attempt = 0
			r.log.DebugContext(ctx, "outbox listener connected", "channel", r.store.NotifyChannel(),
				"application_name", conn.Config().RuntimeParams["application_name"])
			r.listening.Store(true)
			defer r.listening.Store(false)
			r.signal() // notifications may have been missed while disconnected
			for {
				if _, err := conn.WaitForNotification(ctx); err != nil {
					return fmt.Errorf("wait for notification: %w", err)
				}
				r.signal()
			}
		}()
		if ctx.Err() != nil {
			return
		}
		attempt++
		d := listenRetryBackoff.Delay(attempt)
		r.log.WarnContext(ctx, "outbox listener lost; polling until it reconnects", "err", err, "retry_in", d)
		if backoff.Sleep(ctx, d) != nil {
			return
		}
	}
}

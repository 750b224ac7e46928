package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/tracing"
)

// ErrHalted is wrapped by the error Run returns when a StopTheLine relay halted on a failed row.
var ErrHalted = errors.New("outbox relay halted (stop-the-line)")

// Relay publishes outbox rows to Kafka: it claims batches, produces them with its franz-go
// client, and marks every row with its outcome. Any number of relays (in any number of
// processes) may drain one table. Create one with NewRelay and start it with Run.
type Relay struct {
	pool   *pgxpool.Pool
	client *kgo.Client
	cfg    RelayConfig
	store  *Store
	inst   *instruments
	tracer trace.Tracer
	log    *slog.Logger

	maxRecordBytes int
	wake           chan struct{}
	// suspects are rows that were refused with a record-level error while sharing a partition
	// with other records: they are produced alone next time, to learn whether they are the
	// poison or a bystander.
	suspects sync.Map // envelope.UUID → struct{}
	// topics are the destinations this relay's client has published to. The first record
	// for any other topic is produced alone: franz-go holds records for a topic it has no
	// metadata for aside and hands them to their partitions one by one once the metadata
	// arrives; during a flush the first ones can go out (and fail) in one request while the
	// rest are still being handed over and go out in the next, so a failure could be followed
	// by a success of later records of the same key.
	topics sync.Map // topic name → struct{}
	// ackHook, if set (benchmarks), is called with each acknowledged row's message id.
	ackHook func(messageID string)
	// sleepHook, if set (tests), runs before each try of the sleep lock.
	sleepHook    func()
	outageStreak atomic.Int64
	running      atomic.Bool
	// transitionLog rate-limits the log lines of retried, dead and rejected rows.
	transitionLog transitionLog
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

	stats struct {
		claims, claimed, batches, published, retried, skipped, dead, rejected, released, reclaimed,
		deferred, claimErrors, markErrors, orderBroken, leaseRenewals atomic.Int64
	}
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
}

// Stats returns a snapshot of the relay's counters.
func (r *Relay) Stats() Stats {
	s := &r.stats
	return Stats{Batches: s.batches.Load(), Claims: s.claims.Load(), Claimed: s.claimed.Load(), Published: s.published.Load(),
		Retried: s.retried.Load(), Skipped: s.skipped.Load(), Dead: s.dead.Load(), Rejected: s.rejected.Load(),
		Released: s.released.Load(), Deferred: s.deferred.Load(), Reclaimed: s.reclaimed.Load(),
		ClaimErrors: s.claimErrors.Load(), MarkErrors: s.markErrors.Load(), OrderBroken: s.orderBroken.Load(),
		LeaseRenewals: s.leaseRenewals.Load()}
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
	if client == nil {
		errs = append(errs, errors.New("client is nil"))
	}
	if err := cfg.validate(); err != nil {
		errs = append(errs, err)
	}
	maxRecord := cfg.MaxRecordBytes
	if client != nil {
		if acks, ok := client.OptValue(kgo.RequiredAcks).(kgo.Acks); !ok || acks != kgo.AllISRAcks() {
			errs = append(errs, errors.New("client: RequiredAcks must be AllISRAcks; build it with outbox.ProducerOpts()"))
		}
		if dis, _ := client.OptValue(kgo.DisableIdempotentWrite).(bool); dis {
			errs = append(errs, errors.New("client: idempotent writes are disabled; build it with outbox.ProducerOpts()"))
		}
		if manual, _ := client.OptValue(kgo.ManualFlushing).(bool); !manual {
			errs = append(errs, errors.New("client: ManualFlushing is required; build it with outbox.ProducerOpts()"))
		}
		if n, ok := client.OptValue(kgo.MaxBufferedRecords).(int64); ok && n < int64(cfg.BatchSize*cfg.MaxInFlightBatches) {
			errs = append(errs, fmt.Errorf("client: MaxBufferedRecords (%d) must be at least BatchSize × MaxInFlightBatches (%d)",
				n, cfg.BatchSize*cfg.MaxInFlightBatches))
		}
		if n, ok := client.OptValue(kgo.MaxBufferedBytes).(int64); ok && n > 0 {
			// Past the limit franz-go fails records before buffering them: every claim would
			// use attempts on rows it never sent.
			errs = append(errs, fmt.Errorf("client: MaxBufferedBytes (%d) must not be set; bound the buffer with MaxBufferedRecords", n))
		}
		if b, ok := client.OptValue(kgo.ProducerBatchMaxBytes).(int32); ok && (maxRecord == 0 || int(b) < maxRecord) {
			maxRecord = int(b)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new outbox relay: %w", err)
	}
	if maxRecord == 0 {
		maxRecord = 1_000_012 // franz-go's default ProducerBatchMaxBytes
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
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return &Relay{
		pool: pool, client: client, cfg: cfg, store: store, inst: inst,
		tracer: tp.Tracer(scope), log: cfg.Logger.With("component", "outbox-relay", "schema", cfg.Schema),
		maxRecordBytes: maxRecord, wake: make(chan struct{}, 1), backlog: make(chan struct{}, cfg.ClaimConcurrency),
	}, nil
}

// batch is one claim travelling through the pipeline.
type batch struct {
	token envelope.UUID
	rows  []claimedRow

	mu      sync.Mutex
	results []produceResult // per row, written by produce callbacks
	closed  bool            // set when the producer stops waiting: late callbacks are ignored
	// leasedAt is when the batch's lease last started (its claim, or its last renewal);
	// marking is set when its mark begins (rows the mark moves no longer count as renewed, so
	// a renewal then reports no lost lease); lost, once a renewal found rows taken over by
	// another relay.
	leasedAt      time.Time
	marking, lost bool
}

// tp names a topic partition.
type tp struct {
	topic     string
	partition int32
}

type produceResult struct {
	done      bool
	err       error
	partition int32
	offset    int64
	rejectMsg string // pre-produce rejection (too large)
	// shared: other records of the flush went to the same partition, so a record-level
	// refusal (MESSAGE_TOO_LARGE, ...) cannot be pinned on this record.
	shared bool
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
				r.log.Debug("produced", "batches", len(group), "took", time.Since(t0))
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
				r.log.Warn("could not wake the other relays after a batch", "err", err)
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

// renewLeases extends the lease of every batch in flight for over a third of the lease, so that
// no other relay takes over rows this one is still publishing (a slow or unreachable broker, a
// queue of batches behind a slow one, a mark retried through a database outage): a take-over
// would use an attempt — an outage could kill rows — and publish the rows twice. A relay that
// dies stops renewing, and its rows come back after at most one lease.
func (r *Relay) renewLeases(ctx context.Context) {
	t := time.NewTicker(r.cfg.Lease / 6)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.flying.Range(func(k, _ any) bool {
			b := k.(*batch)
			b.mu.Lock()
			due := time.Since(b.leasedAt) >= r.cfg.Lease/3 // marks too: one retried through an outage
			b.mu.Unlock()
			if due {
				r.renewLease(ctx, b)
			}
			return ctx.Err() == nil
		})
	}
}

// renewLease extends b's lease by one Lease from now.
func (r *Relay) renewLease(ctx context.Context, b *batch) {
	ids := make([][16]byte, 0, len(b.rows))
	for i := range b.rows {
		if !b.rows[i].dead {
			ids = append(ids, b.rows[i].id)
		}
	}
	if len(ids) == 0 {
		return
	}
	at := time.Now()
	actx, cancel := context.WithTimeout(ctx, r.cfg.Lease/3)
	n, err := r.store.renewLease(actx, r.pool, b.token, ids, r.cfg.Lease)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("could not extend the lease of a batch in flight; retrying", "err", err, "rows", len(ids))
		}
		return
	}
	r.stats.leaseRenewals.Add(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.leasedAt = at
	if lost := len(ids) - int(n); lost > 0 && !b.marking && !b.lost {
		// (Rows the mark moved while the renewal ran are not lost: marking is set then.)
		b.lost = true
		r.log.Warn("a batch in flight lost its lease: another relay may publish its rows too",
			"rows", lost, "lease", r.cfg.Lease)
	}
}

// signal wakes the claim loop without blocking.
func (r *Relay) signal() {
	r.signals.Add(1)
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// claimLoop claims batches while slots are free, waking on notifications, marks and polls.
// ClaimConcurrency of them run at once; the extra ones only while claims come back full.
//
// A claim is not cancelled when ctx (stop) is: cancelling it could lose the reply of a claim
// that committed, leaving its rows publishing, unmarked, until their lease expires (a halt or a
// shutdown would stall their keys for a lease). It runs under hard (cancelled at the shutdown
// deadline) and its batch always enters the pipeline, which releases it unproduced after a stop.
func (r *Relay) claimLoop(ctx, hard context.Context, extra bool, slots chan struct{}, out chan<- *batch) {
	poll := time.NewTimer(0)
	defer poll.Stop()
	// The first claimer of a listening relay sleeps under the sleep lock, so producers notify
	// only while it sleeps (sleeper, sleepLockAll in sql.go).
	var sl *sleeper
	if !extra && !r.cfg.PollOnly {
		sl = newSleeper(r.pool.Config().ConnConfig, &r.store.q, len(r.cfg.Destinations) > 0)
		defer sl.close()
	}
	var dbBackoff int
	var lastUnbounded time.Time
	var deepFull bool // the last full-backlog scan came back full
	for {
		// An extra claimer works only while the outbox is backlogged (the last claim was full):
		// in a steady trickle one claimer answers every notification and two would only race
		// for the same few rows.
		for extra && !r.backlogged.Load() {
			select {
			case <-r.backlog:
			case <-ctx.Done():
				return
			}
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		if ctx.Err() != nil { // both were ready: select chose the slot
			<-slots
			return
		}
		if !extra {
			// A wake-up that came before this claim is answered by it; leaving it buffered
			// would buy one more (possibly empty, with a deep backlog costly) claim after it.
			select {
			case <-r.wake:
			default:
			}
		}
		t0 := time.Now()
		signalsBefore := r.signals.Load()
		// A claim looks only as far as a full batch behind every other batch in flight: when
		// the keys near the front are all in flight (a backlog over few keys), an unbounded
		// claim walks the whole backlog to find nothing, and the first claimer did so after
		// every full claim (a drain over 100 keys ran at 2.8k msgs/s). The first claimer
		// still scans everything once per poll interval, so a row behind a blocked front
		// (keys in backoff) waits at most that long, and keeps doing so while those scans
		// come back full, so a long blocked front does not slow the rows behind it.
		budget := r.cfg.MaxInFlightBatches * r.cfg.BatchSize
		scanAll := !extra && (deepFull || time.Since(lastUnbounded) >= r.cfg.PollInterval)
		if scanAll {
			budget, lastUnbounded = 0, time.Now()
		}
		token, rows, err := r.store.claim(hard, r.pool, r.cfg.Policy, r.cfg.BatchSize, r.cfg.Lease, r.cfg.MaxAttempts, r.cfg.Destinations, budget)
		r.log.Debug("claimed", "rows", len(rows), "took", time.Since(t0), "err", err)
		r.stats.claims.Add(1)
		if err != nil {
			<-slots
			if ctx.Err() != nil {
				return
			}
			r.stats.claimErrors.Add(1)
			dbBackoff++
			d := Backoff{Initial: 50 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2}.delay(dbBackoff)
			r.log.Warn("claim failed; retrying", "err", err, "retry_in", d)
			if !sleepCtx(ctx, d) {
				return
			}
			continue
		}
		dbBackoff = 0
		if scanAll {
			deepFull = len(rows) == r.cfg.BatchSize
		}
		if full := len(rows) == r.cfg.BatchSize; full != r.backlogged.Load() {
			r.backlogged.Store(full)
			if full {
				for range r.cfg.ClaimConcurrency - 1 {
					select {
					case r.backlog <- struct{}{}:
					default:
					}
				}
			}
		}
		if len(rows) > 0 {
			b := &batch{token: token, rows: rows, results: make([]produceResult, len(rows)), leasedAt: t0}
			r.flying.Store(b, struct{}{}) // its lease is renewed from now on
			if sl != nil {
				r.wakeUp(ctx, sl) // busy: producers need not notify
			}
			r.stats.claimed.Add(int64(len(rows)))
			r.inst.batchSize.Record(ctx, int64(len(rows)))
			r.inFlight.Add(1)
			out <- b
			if len(rows) == r.cfg.BatchSize {
				continue // more is likely waiting
			}
		} else {
			<-slots
		}
		if extra {
			// Wake-ups and polls are the first claimer's: an extra claimer that took one would
			// only go back to waiting for a backlog, and the wake-up would be lost.
			if len(rows) == 0 {
				// Concurrent claims can all come back empty: each skips the rows the others
				// hold locked and drops the rows behind them. The first claimer may have come
				// back empty because of this claim and gone to sleep: have it look again.
				r.signal()
			}
			continue
		}
		if r.signals.Load() != signalsBefore {
			// A batch finished or rows arrived while this claim ran: its snapshot may predate
			// them, and the wake-up may have gone to a claimer that is now busy (or been
			// dropped, the channel holds one). Claim again rather than sleep until the poll.
			continue
		}
		switch r.prepareSleep(ctx, sl) {
		case sleepStop:
			return
		case sleepClaim:
			continue
		}
		// Wait for a notification, a finished batch or the poll interval.
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
		poll.Reset(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-poll.C:
		}
		if sl != nil {
			r.wakeUp(ctx, sl)
		}
	}
}

// sleepAction is what the first claimer does next when its last claim left it nothing to do.
type sleepAction int

const (
	sleepWait  sleepAction = iota // wait for a wake-up or the poll
	sleepClaim                    // claim again
	sleepStop                     // the relay is stopping
)

// sleepAfterInFlight is how long the first claimer waits for a batch in flight before it sleeps
// under the sleep lock anyway: a batch usually comes back within milliseconds and its mark
// wakes the claimer, which then claims the rows committed meanwhile (producers need not
// notify); one held up by a slow broker must not hold back other keys' new rows.
const sleepAfterInFlight = 20 * time.Millisecond

// prepareSleep readies the first claimer of a listening relay to sleep under the sleep lock
// (sleepLockAll in sql.go): it takes the lock, then has the claimer claim once more, since
// producers that committed before did not notify. While a producer that did not notify is
// still in its transaction the lock cannot be taken: it waits a little and has the claimer
// claim again. When another relay that publishes every destination sleeps under the lock,
// producers notify and that relay claims whatever this one could: this relay sleeps without
// it. A relay restricted to some destinations cannot count on another (it may cover other
// destinations) and keeps trying. Without the lock's session the relay polls.
func (r *Relay) prepareSleep(ctx context.Context, sl *sleeper) sleepAction {
	if sl == nil || sl.held || !r.listening.Load() {
		return sleepWait
	}
	if r.inFlight.Load() > 0 {
		alive, woken := waitWake(ctx, r.wake, min(sleepAfterInFlight, r.cfg.PollInterval))
		switch {
		case !alive:
			return sleepStop
		case woken || r.inFlight.Load() == 0:
			return sleepClaim
		}
	}
	if r.sleepHook != nil {
		r.sleepHook()
	}
	got, err := sl.try(ctx)
	if err == nil && sl.failing {
		sl.failing = false
		r.log.Info("sleep lock available again")
	}
	switch {
	case err != nil:
		if ctx.Err() != nil {
			return sleepStop
		}
		if !sl.failing {
			sl.failing = true
			r.log.Warn("sleep lock unavailable; polling until it is back (producers do not notify meanwhile)",
				"err", err, "poll_interval", r.cfg.PollInterval)
		}
		return sleepWait
	case got == tryTaken:
		return sleepClaim
	case got == tryRelay && !sl.filtered:
		return sleepWait
	}
	if alive, _ := waitWake(ctx, r.wake, sl.retryIn(r.cfg.PollInterval)); !alive {
		return sleepStop
	}
	return sleepClaim
}

// wakeUp releases the sleep lock, if held: producers stop notifying. The relay is working
// again, so its next failed try starts over at the shortest retry.
func (r *Relay) wakeUp(ctx context.Context, sl *sleeper) {
	sl.tries = 0
	if err := sl.release(ctx); err != nil && ctx.Err() == nil {
		r.log.Warn("sleep lock release failed; its session was closed", "err", err)
	}
}

// waitWake waits d, a wake-up or the end of ctx; it reports whether ctx is still live and
// whether a wake-up came.
func waitWake(ctx context.Context, wake <-chan struct{}, d time.Duration) (alive, woken bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true, false
	case <-wake:
		return true, true
	case <-ctx.Done():
		return false, false
	}
}

// sleepCtx waits d or until ctx is done; it reports whether d elapsed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// produce publishes the batches' rows in order, in as few flushes as it can: a suspect row
// and the first row for a topic the client has not published to yet (see Relay.topics) each
// get a flush of their own, after the rows before them were flushed; under StopTheLine every
// row does, so nothing after the first failure is sent. A row whose group failed
// in an earlier flush of this call is not produced (it is skipped or released when marked).
func (r *Relay) produce(stop, ctx context.Context, batches []*batch) {
	failed := map[string]bool{}
	send := func(refs []rowRef) {
		if stop.Err() != nil {
			return // stopping: no new flush; the rows are released unproduced
		}
		kept := refs[:0]
		for _, ref := range refs {
			if g := groupKey(r.cfg.Policy, &ref.b.rows[ref.i].event); g == "" || !failed[g] {
				kept = append(kept, ref)
			}
		}
		if len(kept) == 0 {
			return
		}
		r.flush(ctx, kept)
		for _, ref := range kept {
			row := &ref.b.rows[ref.i]
			ref.b.mu.Lock()
			res := ref.b.results[ref.i]
			ref.b.mu.Unlock()
			switch {
			case !res.done || res.rejectMsg != "":
			case res.err == nil:
				r.topics.Store(row.event.Destination, struct{}{})
			default:
				if class, _ := res.failureClass(); class != classPermanent {
					if g := groupKey(r.cfg.Policy, &row.event); g != "" {
						failed[g] = true
					}
				}
			}
		}
	}
	var pending []rowRef
	for _, b := range batches {
		for i := range b.rows {
			ref := rowRef{b, i}
			if b.rows[i].dead && r.cfg.Policy == StopTheLine {
				send(pending) // the rows before it; nothing after it (markOutcome halts on it)
				pending = pending[:0]
				failed[groupKey(StopTheLine, &b.rows[i].event)] = true
				continue
			}
			_, suspect := r.suspects.Load(b.rows[i].id)
			_, known := r.topics.Load(b.rows[i].event.Destination)
			// StopTheLine publishes row by row (keiro §1.3.5): one flush holds records for
			// several partitions, and a failure of one partition's request does not stop the
			// others, so rows after the failed one would reach Kafka.
			alone := suspect || !known || r.cfg.Policy == StopTheLine
			if alone && !b.rows[i].dead {
				send(pending)
				pending = pending[:0]
				send([]rowRef{ref})
				continue
			}
			pending = append(pending, ref)
		}
	}
	send(pending)
	for _, b := range batches {
		b.mu.Lock()
		b.closed = true
		b.mu.Unlock()
	}
}

// rowRef points at one row of a batch.
type rowRef struct {
	b *batch
	i int
}

// flush buffers every record of refs, flushes them, and waits for every outcome (or ctx).
// Buffering the whole set before the flush is what keeps per-key order: if Kafka fails a
// partition's request, franz-go fails every later buffered record of that partition.
func (r *Relay) flush(ctx context.Context, refs []rowRef) {
	var pending atomic.Int64
	pending.Store(1)
	allDone := make(chan struct{})
	finish := func() {
		if pending.Add(-1) == 0 {
			close(allDone)
		}
	}
	var headers []envelope.Header
	var mu sync.Mutex
	perPartition := map[tp]int{}
	var produced []rowRef
	for _, ref := range refs {
		b, i := ref.b, ref.i
		row := &b.rows[i]
		if row.dead {
			continue
		}
		e := &row.event
		rec := &kgo.Record{Topic: e.Destination, Value: e.Payload}
		if e.Key != nil {
			rec.Key = []byte(*e.Key)
		}
		spanCtx, span := r.tracer.Start(tracing.ContextWith(context.Background(), e.TraceContext),
			"send "+e.Destination, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
				attribute.String("messaging.system", "kafka"),
				attribute.String("messaging.operation.type", "send"),
				attribute.String("messaging.operation.name", "send"),
				attribute.String("messaging.destination.name", e.Destination),
				attribute.String("messaging.message.id", e.MessageID),
				attribute.Int("keiro.outbox.attempt", row.attempt),
			))
		if e.Key != nil {
			span.SetAttributes(attribute.String("messaging.kafka.message.key", *e.Key))
		}
		ev := *e
		if span.IsRecording() {
			if tc := tracing.FromContext(spanCtx); tc != nil {
				ev.TraceContext = tc
			}
		}
		headers = ev.AppendHeaders(headers[:0], r.encodeOptions(ev.Destination))
		rec.Headers = make([]kgo.RecordHeader, len(headers))
		for j, h := range headers {
			rec.Headers[j] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
		}
		if size := recordSize(rec); size > r.maxRecordBytes {
			msg := fmt.Sprintf("record of about %d bytes exceeds the %d-byte limit (MaxRecordBytes / ProducerBatchMaxBytes)", size, r.maxRecordBytes)
			b.results[i] = produceResult{done: true, rejectMsg: msg}
			span.SetAttributes(attribute.String("keiro.outbox.rejection_code", "message_too_large"))
			span.End()
			continue
		}
		pending.Add(1)
		produced = append(produced, ref)
		created := row.createdAt
		r.client.Produce(ctx, rec, func(rec *kgo.Record, err error) {
			if err == nil {
				if r.ackHook != nil {
					r.ackHook(e.MessageID)
				}
				r.inst.latency.Record(context.Background(), time.Since(created).Seconds())
				span.SetAttributes(
					attribute.String("messaging.destination.partition.id", strconv.Itoa(int(rec.Partition))),
					attribute.Int64("messaging.kafka.offset", rec.Offset))
			} else {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			span.End()
			mu.Lock()
			perPartition[tp{rec.Topic, rec.Partition}]++
			mu.Unlock()
			b.mu.Lock()
			if !b.closed {
				b.results[i] = produceResult{done: true, err: err, partition: rec.Partition, offset: rec.Offset}
			}
			b.mu.Unlock()
			finish()
		})
	}
	finish()
	if len(produced) == 0 {
		return
	}
	if err := r.client.Flush(ctx); err != nil && ctx.Err() == nil {
		r.log.Warn("flush failed", "err", err)
	}
	select {
	case <-allDone:
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	for _, ref := range produced {
		ref.b.mu.Lock()
		res := &ref.b.results[ref.i]
		if res.done && res.err != nil && perPartition[tp{ref.b.rows[ref.i].event.Destination, res.partition}] > 1 {
			res.shared = true
		}
		ref.b.mu.Unlock()
	}
}

// suspect reports a record Kafka refused for good in a request that held other records too:
// the refusal may concern another record of the request (a poison record fails its
// bystanders), so the row is retried alone before it is rejected.
func (res *produceResult) suspect() bool {
	if res.err == nil || !res.shared {
		return false
	}
	class, code := classify(res.err)
	return isSuspect(res.shared, class, code)
}

func isSuspect(shared bool, class errClass, code string) bool {
	return shared && class == classPermanent && recordLevel[code]
}

// failureClass is how the relay treats a failed record: its error's class, except that a
// suspect is transient (retried alone). produce and markOutcome must agree on it: a row that
// will be retried fails its group, so no later row of the group may go out after it.
func (res *produceResult) failureClass() (errClass, string) {
	class, code := classify(res.err)
	if isSuspect(res.shared, class, code) {
		class = classTransient
	}
	return class, code
}

// recordLevel are the rejection codes that concern one record (as opposed to its topic).
var recordLevel = map[string]bool{
	"message_too_large": true, "record_list_too_large": true, "invalid_record": true, "corrupt_message": true,
}

// groupKey returns the ordering group of a row under the policy ("" = a group of its own).
func groupKey(p Policy, e *envelope.Event) string {
	switch p {
	case StopTheLine:
		return "all"
	case PerSourceStream:
		return e.Source
	case BestEffort:
		return ""
	}
	if e.Key == nil {
		return ""
	}
	return e.Source + "\x00" + *e.Key
}

// markOutcome turns a batch's produce results into marks (keiro §1.3.5 step 4, with rejection
// and outage handling), writes them in one statement, and records metrics.
func (r *Relay) markOutcome(ctx context.Context, b *batch) BatchResult {
	b.mu.Lock()
	results := append([]produceResult(nil), b.results...)
	b.closed, b.marking = true, true
	b.mu.Unlock()

	res := BatchResult{Claimed: len(b.rows)}
	failedGroups := map[string]bool{}
	// failedKeys holds the keys with a row this flush did not get onto Kafka, to catch a later
	// row of the same key that did: Kafka would then hold the key out of order. franz-go fails
	// every later record of a partition after a failed one, so this should never happen; if a
	// broker or client ever breaks that, operators hear of it.
	failedKeys := map[string]bool{}
	marks := make([]mark, 0, len(b.rows))
	anyOK, anyOutage := false, false
	deadOnClaim := map[string]int{}
	for i := range b.rows {
		row := &b.rows[i]
		if row.reclaimed {
			res.Reclaimed++
		}
		if row.dead {
			deadOnClaim[row.event.Destination]++
			if r.cfg.Policy == StopTheLine && res.HaltedOn == nil {
				// Its last attempt's outcome is unknown (lease expired): review it before the rest.
				id := row.id.String()
				res.HaltedOn = &id
				failedGroups[groupKey(StopTheLine, &row.event)] = true
			}
			continue
		}
		pr := results[i]
		g := groupKey(r.cfg.Policy, &row.event)
		key := groupKey(PerKeyHeadOfLine, &row.event) // for the order-broken check, whatever the policy
		m := mark{id: row.id, dest: row.event.Destination}
		switch {
		case pr.rejectMsg != "":
			m.outcome, m.code, m.err = outcomeRejected, "message_too_large", pr.rejectMsg
		case pr.done && pr.err == nil:
			m.outcome, m.partition, m.offset = outcomeSent, pr.partition, pr.offset
			anyOK = true
			r.suspects.Delete(row.id)
			if key != "" && failedKeys[key] {
				res.OrderBroken++
				r.log.Error("a record reached Kafka after an earlier record of its key failed: the key is out of order on the topic",
					"outbox_id", row.id.String(), "message_id", row.event.MessageID, "destination", row.event.Destination,
					"partition", pr.partition, "offset", pr.offset)
			}
		case g != "" && failedGroups[g]:
			m.outcome, m.err = outcomeSkipped, skippedError
		case !pr.done:
			m.outcome = outcomeReleased // shutdown before an outcome: back to pending
		case errors.Is(pr.err, context.Canceled):
			// The shutdown deadline cancelled the produce (franz-go fails at once the records
			// still waiting for metadata or a producer id): the row is released like one
			// without an outcome, and the rest of its group is held back.
			m.outcome = outcomeReleased
			if g != "" {
				failedGroups[g] = true
			}
		default:
			class, code := pr.failureClass()
			if pr.suspect() {
				r.suspects.Store(row.id, struct{}{})
			} else {
				r.suspects.Delete(row.id)
			}
			switch class {
			case classPermanent:
				m.outcome, m.code, m.err = outcomeRejected, code, truncate(pr.err.Error())
			case classOutage:
				m.outcome, m.err = outcomeDeferred, truncate(pr.err.Error())
				anyOutage = true
			default:
				m.outcome, m.err = outcomeFailed, truncate(pr.err.Error())
				m.delay = r.cfg.Backoff.delay(row.attempt)
			}
			if m.outcome != outcomeRejected {
				if g != "" {
					failedGroups[g] = true
				}
				if r.cfg.Policy == StopTheLine && res.HaltedOn == nil {
					id := row.id.String()
					res.HaltedOn = &id
				}
			}
		}
		if m.outcome != outcomeSent && m.outcome != outcomeRejected && pr.done && key != "" {
			failedKeys[key] = true
		}
		marks = append(marks, m)
	}
	if res.OrderBroken > 0 {
		r.inst.orderBroken.Add(ctx, int64(res.OrderBroken))
		r.stats.orderBroken.Add(int64(res.OrderBroken))
	}
	if anyOK {
		r.outageStreak.Store(0)
	}
	if anyOutage {
		n := r.outageStreak.Add(1)
		d := r.cfg.Backoff.delay(int(n))
		for i := range marks {
			if marks[i].outcome == outcomeDeferred {
				marks[i].delay = d
			}
		}
		r.log.Warn("Kafka unavailable; rows deferred without using an attempt", "retry_in", d)
	}

	// Rows going back to failed are due after their delay: wake the claim loop then, rather
	// than leave them to the next poll.
	var retryIn time.Duration
	for _, m := range marks {
		if (m.outcome == outcomeFailed || m.outcome == outcomeDeferred) && m.delay > 0 && (retryIn == 0 || m.delay < retryIn) {
			retryIn = m.delay
		}
	}
	if retryIn > 0 {
		defer time.AfterFunc(retryIn, r.signal)
	}

	var t transitions
	t0 := time.Now()
	defer func() { r.log.Debug("marked", "rows", len(marks), "took", time.Since(t0)) }()
	for attempt := 1; ; attempt++ {
		// Each attempt gets its own deadline, so the marks of a shutdown still get one try
		// after the hard deadline passed.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		var err error
		t, err = r.store.markBatch(actx, r.pool, b.token, marks, r.cfg.MaxAttempts)
		cancel()
		if err == nil {
			break
		}
		r.stats.markErrors.Add(1)
		if ctx.Err() != nil {
			r.log.Error("marking outbox batch abandoned at shutdown; rows will be re-claimed after their lease", "err", err)
			break
		}
		d := Backoff{Initial: 50 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2}.delay(attempt)
		r.log.Warn("mark failed; retrying", "err", err, "retry_in", d)
		if !sleepCtx(ctx, d) {
			break
		}
	}
	r.logTransitions(ctx, b, marks, t.rows)
	res.Published, res.Retried, res.Skipped = t.sent, t.failed, t.skipped
	res.Dead, res.Rejected, res.Released = t.dead, t.rejected, t.released
	res.Retried += t.deferred
	for _, n := range deadOnClaim {
		res.Dead += n
	}
	r.record(ctx, b, t, deadOnClaim)
	s := &r.stats
	s.batches.Add(1)
	s.published.Add(int64(t.sent))
	s.retried.Add(int64(t.failed))
	s.deferred.Add(int64(t.deferred))
	s.skipped.Add(int64(t.skipped))
	s.dead.Add(int64(res.Dead))
	s.rejected.Add(int64(t.rejected))
	s.released.Add(int64(t.released))
	s.reclaimed.Add(int64(res.Reclaimed))
	if r.cfg.OnBatch != nil {
		r.cfg.OnBatch(res)
	}
	return res
}

// record adds a batch's real transitions to the metrics, per destination.
func (r *Relay) record(ctx context.Context, b *batch, t transitions, deadOnClaim map[string]int) {
	for dest, c := range t.byDest {
		attrs := destinationAttr(dest)
		if c.sent > 0 {
			r.inst.published.Add(ctx, int64(c.sent), attrs)
		}
		if c.retried > 0 {
			r.inst.retried.Add(ctx, int64(c.retried), attrs)
		}
		if c.rejected > 0 {
			r.inst.rejected.Add(ctx, int64(c.rejected), attrs)
		}
		if c.dead > 0 {
			r.inst.deadlettered.Add(ctx, int64(c.dead), attrs)
		}
	}
	for dest, n := range deadOnClaim {
		r.inst.deadlettered.Add(ctx, int64(n), destinationAttr(dest))
	}
	if n := countReclaimed(b); n > 0 {
		r.inst.reclaimed.Add(ctx, int64(n))
	}
}

func countReclaimed(b *batch) int {
	n := 0
	for i := range b.rows {
		if b.rows[i].reclaimed {
			n++
		}
	}
	return n
}

// truncate bounds an error text stored in last_error.
func truncate(s string) string {
	const max = 1024
	if len(s) <= max {
		return s
	}
	return s[:max]
}

// listen holds a LISTEN connection and signals the claim loop on every notification; it
// reconnects with backoff when the connection dies.
func (r *Relay) listen(ctx context.Context) {
	channel := pgx.Identifier{r.store.NotifyChannel()}.Sanitize()
	for attempt := 0; ; {
		err := func() error {
			conn, err := pgx.ConnectConfig(ctx, r.pool.Config().ConnConfig.Copy())
			if err != nil {
				return fmt.Errorf("connect listener: %w", err)
			}
			defer conn.Close(context.WithoutCancel(ctx))
			if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
				return fmt.Errorf("listen: %w", err)
			}
			attempt = 0
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
		d := Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2}.delay(attempt)
		r.log.Warn("outbox listener lost; polling until it reconnects", "err", err, "retry_in", d)
		if !sleepCtx(ctx, d) {
			return
		}
	}
}

package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/tracing"
)

// Sharded subscription defaults (keiro's ShardedWorkerOptions: a 30 s lease renewed every 10 s).
const (
	// DefaultShardLease is how long a worker holds a bucket without renewing it.
	DefaultShardLease = 30 * time.Second
	// DefaultShardRenewInterval is how often a worker renews its leases and rebalances.
	DefaultShardRenewInterval = 10 * time.Second
	// MaxShardBuckets bounds ShardedSubscriptionConfig.Buckets.
	MaxShardBuckets = 4096
)

// ShardedSubscriptionConfig configures a ShardedSubscription. Every worker of one subscription
// (every Run, in any process) must use the same Name, Category and Buckets.
type ShardedSubscriptionConfig struct {
	// Name identifies the subscription, its buckets and its dead letters. Required.
	Name string
	// Category restricts the subscription to one category's streams. Defaults to "" (the
	// whole log).
	Category string
	// Buckets is the number of buckets the subscription's streams are split into: an event's
	// bucket is a stable hash of its stream name modulo Buckets (see ShardedSubscription.Bucket),
	// so all events of a stream are in one bucket. It bounds the workers that can share the
	// work, and cannot change once the subscription's buckets exist. Required, 1 to
	// MaxShardBuckets.
	Buckets int
	// Lease is how long a worker holds a bucket without renewing it: after a worker dies, its
	// buckets move to the others within Lease and one PollInterval. A batch must finish within
	// Lease, or its checkpoint is not written and the batch is delivered again. Defaults to
	// DefaultShardLease.
	Lease time.Duration
	// RenewInterval is how often a worker renews its leases and rebalances; it must be shorter
	// than Lease (a third of it keeps a lease through two missed renewals). Defaults to
	// DefaultShardRenewInterval, or Lease/3 when Lease is set below it.
	RenewInterval time.Duration
	// BatchSize is the number of events of one bucket handled per transaction. Defaults to
	// DefaultBatchSize.
	BatchSize int
	// PollInterval is how often the log (and the buckets' leases) are checked when no
	// notification arrives. Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// DisableListen turns LISTEN/NOTIFY off: workers poll only, for new events and for
	// rebalancing. A sharded subscription holds no session lock, so it then runs behind
	// PgBouncer in transaction mode. Defaults to false.
	DisableListen bool
	// Retry bounds the deliveries of an event the handler fails on; see SubscriptionConfig.
	// A dead-lettered event's bucket moves past it; the other buckets are not held up.
	// Defaults to SubscriptionConfig's defaults.
	Retry RetryPolicy
	// AfterCommit, if set, is called after every committed transaction of a bucket with the
	// bucket and its checkpoint. It must not block for long. Defaults to nil.
	AfterCommit func(bucket int, checkpoint int64)
	// OnOwnershipChange, if set, is called with the buckets this worker holds (ascending)
	// whenever they change. It must not block for long. Defaults to nil.
	OnOwnershipChange func(owned []int)
	// MeterProvider provides the meter for keiro.projection.lag and the shard instruments.
	// Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Logger receives lifecycle messages. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c *ShardedSubscriptionConfig) applyDefaults() {
	if c.Lease == 0 {
		c.Lease = DefaultShardLease
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = min(DefaultShardRenewInterval, c.Lease/3)
	}
}

func (c *ShardedSubscriptionConfig) validate() error {
	var errs []error
	if c.Buckets < 1 || c.Buckets > MaxShardBuckets {
		errs = append(errs, fmt.Errorf("Buckets: %d is not between 1 and %d", c.Buckets, MaxShardBuckets))
	}
	if c.Lease <= 0 {
		errs = append(errs, fmt.Errorf("Lease: %v is not positive", c.Lease))
	}
	if c.RenewInterval <= 0 {
		errs = append(errs, fmt.Errorf("RenewInterval: %v is not positive", c.RenewInterval))
	} else if c.Lease > 0 && c.RenewInterval >= c.Lease {
		errs = append(errs, fmt.Errorf("RenewInterval: %v is not shorter than Lease (%v); a worker would lose its buckets between renewals", c.RenewInterval, c.Lease))
	}
	return errors.Join(errs...)
}

// ShardedSubscription is a subscription split into buckets by stream, so that several workers
// (Runs, in any processes) share its work. Each bucket is leased by one worker at a time and
// has its own checkpoint, written in the handler's transaction only while the worker's lease
// is unexpired. Workers join and leave at any time: the buckets are rebalanced to a fair share
// of the live workers, a worker sheds a bucket only between transactions (after its
// checkpoint is committed), and a dead worker's buckets are taken over when its leases expire.
//
// Guarantees: the events of one stream are handled in order, by one worker at a time; every
// event is handled, and its handler's transaction commits exactly once (the checkpoint is
// written in it), like Subscription's; the late-commit guard holds in every bucket. The events
// of different buckets are handled in no particular order relative to each other. See
// docs/architecture.md, "Sharded subscriptions".
type ShardedSubscription struct {
	sub     *Subscription
	cfg     ShardedSubscriptionConfig
	running atomic.Bool
	worker  atomic.Pointer[string]
	// skipLeave makes Run end without releasing its buckets (tests of a worker's death).
	skipLeave atomic.Bool
	ownedN    atomic.Int64

	owned                   metric.Int64ObservableGauge
	claimed, released, lost metric.Int64Counter
}

// NewShardedSubscription returns a ShardedSubscription that applies h to each event.
func NewShardedSubscription(store *Store, pool *pgxpool.Pool, cfg ShardedSubscriptionConfig, h Handler) (*ShardedSubscription, error) {
	if h == nil {
		return nil, fmt.Errorf("new sharded subscription %q: handler is nil", cfg.Name)
	}
	return newSharded(cfg, func(sc SubscriptionConfig) (*Subscription, error) {
		return NewSubscription(store, pool, sc, h)
	})
}

// NewShardedBatchSubscription returns a ShardedSubscription that applies h to each batch (the
// events of one bucket, in global-position order).
func NewShardedBatchSubscription(store *Store, pool *pgxpool.Pool, cfg ShardedSubscriptionConfig, h BatchHandler) (*ShardedSubscription, error) {
	return newSharded(cfg, func(sc SubscriptionConfig) (*Subscription, error) {
		return NewBatchSubscription(store, pool, sc, h)
	})
}

func newSharded(cfg ShardedSubscriptionConfig, build func(SubscriptionConfig) (*Subscription, error)) (*ShardedSubscription, error) {
	cfg.applyDefaults()
	sub, err := build(SubscriptionConfig{
		Name: cfg.Name, Category: cfg.Category, BatchSize: cfg.BatchSize, PollInterval: cfg.PollInterval,
		DisableListen: cfg.DisableListen, Retry: cfg.Retry, MeterProvider: cfg.MeterProvider, Logger: cfg.Logger,
	})
	verr := cfg.validate()
	if err != nil || verr != nil {
		if err != nil {
			return nil, fmt.Errorf("new sharded subscription %q: %w", cfg.Name, errors.Join(errors.Unwrap(err), verr))
		}
		return nil, fmt.Errorf("new sharded subscription %q: %w", cfg.Name, verr)
	}
	cfg.BatchSize, cfg.PollInterval, cfg.Retry = sub.cfg.BatchSize, sub.cfg.PollInterval, sub.cfg.Retry
	cfg.MeterProvider, cfg.Logger = sub.cfg.MeterProvider, sub.cfg.Logger
	s := &ShardedSubscription{sub: sub, cfg: cfg}
	meter := cfg.MeterProvider.Meter(instrumentationScope)
	var errs []error
	counter := func(name, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit("{bucket}"))
		if err != nil {
			errs = append(errs, fmt.Errorf("create %s: %w", name, err))
		}
		return c
	}
	s.claimed = counter("keiro.subscription.shards.claimed", "Buckets a worker of a sharded subscription took (free, released or expired).")
	s.released = counter("keiro.subscription.shards.released", "Buckets a worker of a sharded subscription gave up (rebalancing or stopping).")
	s.lost = counter("keiro.subscription.shards.lost", "Buckets a worker found it no longer held (its lease expired): its transaction was rolled back.")
	s.owned, err = meter.Int64ObservableGauge("keiro.subscription.shards.owned",
		metric.WithDescription("Buckets of a sharded subscription the worker holds."), metric.WithUnit("{bucket}"))
	if err != nil {
		errs = append(errs, fmt.Errorf("create keiro.subscription.shards.owned: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new sharded subscription %q: %w", cfg.Name, err)
	}
	return s, nil
}

// Name returns the subscription's name.
func (s *ShardedSubscription) Name() string { return s.cfg.Name }

// Worker returns the id of the worker the running Run joined the subscription as ("" when
// not running). Every Run joins as a new worker.
func (s *ShardedSubscription) Worker() string {
	if p := s.worker.Load(); p != nil {
		return *p
	}
	return ""
}

// Bucket returns the bucket of the events of stream: PostgreSQL's 64-bit hash of text
// (hashtextextended(stream, 0), the hash of hash partitioning, stable across versions)
// modulo Buckets, computed by the database, as the workers' reads compute it.
func (s *ShardedSubscription) Bucket(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, stream string) (int, error) {
	var b int
	if err := db.QueryRow(ctx, s.sub.store.q.shardBucket, stream, s.cfg.Buckets).Scan(&b); err != nil {
		return 0, fmt.Errorf("bucket of stream %s in sharded subscription %s: %w", stream, s.cfg.Name, err)
	}
	return b, nil
}

// ShardOwnership is one bucket of a sharded subscription as stored.
type ShardOwnership struct {
	// Bucket is the bucket's number, from 0 to Buckets−1.
	Bucket int
	// Owner is the worker holding or last holding the lease ("" once released).
	Owner string
	// LeaseExpiresAt is when the lease expires (zero once released).
	LeaseExpiresAt time.Time
	// Held reports that the lease is unexpired now (by the database's clock).
	Held bool
	// Checkpoint is the last global position whose effects in the bucket are committed.
	Checkpoint int64
}

// Ownership lists the subscription's buckets (none before a worker first ran).
func (s *ShardedSubscription) Ownership(ctx context.Context) ([]ShardOwnership, error) {
	rows, err := s.sub.pool.Query(ctx, s.sub.store.q.shardOwnership, s.cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("list buckets of sharded subscription %s: %w", s.cfg.Name, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ShardOwnership, error) {
		var (
			o       ShardOwnership
			owner   *[16]byte
			expires *time.Time
		)
		if err := r.Scan(&o.Bucket, &owner, &expires, &o.Checkpoint, &o.Held); err != nil {
			return o, err
		}
		if owner != nil {
			o.Owner = envelope.UUID(*owner).String()
		}
		if expires != nil {
			o.LeaseExpiresAt = *expires
		}
		return o, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list buckets of sharded subscription %s: %w", s.cfg.Name, err)
	}
	return out, nil
}

// Rebuild resets every bucket's checkpoint to 0 and runs reset (typically a TRUNCATE of the
// read model) in one transaction; the workers then rebuild the projection from the start of
// the log. A batch in flight either commits before the reset or notices it and starts over;
// both lock the bucket rows first, in bucket order, so they cannot deadlock.
func (s *ShardedSubscription) Rebuild(ctx context.Context, reset ResetFunc) error {
	err := pgx.BeginFunc(ctx, s.sub.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.sub.store.q.shardReset, s.cfg.Name, s.notifyPayload()); err != nil {
			return fmt.Errorf("reset checkpoints: %w", err)
		}
		if reset != nil {
			if err := reset(ctx, tx); err != nil {
				return fmt.Errorf("reset read model: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("rebuild sharded subscription %s: %w", s.cfg.Name, err)
	}
	return nil
}

// notifyPayload is the payload of the notifications that wake the subscription's workers to
// rebalance (on the store's channel).
func (s *ShardedSubscription) notifyPayload() string { return "keiro.shards:" + s.cfg.Name }

// Run joins the subscription as a new worker and handles the events of the buckets it holds
// until ctx is done (then it releases its buckets, so the other workers take them at once, and
// returns nil) or a handler or the database fails (then it returns the error; its buckets are
// released if the database is reachable, else they move when their leases expire). It creates
// the subscription's buckets on first use and returns an error if they exist with another
// count. When ctx ends, Run first finishes the transaction in flight (handlers' contexts are
// not cancelled, and a retry's backoff is waited out), so that no bucket is left mid-batch.
// Run must not be called twice at once on one ShardedSubscription; run one per worker.
func (s *ShardedSubscription) Run(ctx context.Context) (err error) {
	if !s.running.CompareAndSwap(false, true) {
		return fmt.Errorf("run sharded subscription %s: already running", s.cfg.Name)
	}
	defer s.running.Store(false)
	conn, err := s.sub.pool.Acquire(ctx)
	if err != nil {
		return s.sub.exit(ctx, fmt.Errorf("run sharded subscription %s: acquire connection: %w", s.cfg.Name, err))
	}
	clean := false
	defer func() {
		if !clean {
			// The session may still LISTEN: never return it to the pool.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = conn.Conn().Close(cctx)
			cancel()
		}
		conn.Release()
	}()
	var counts []int32
	// A worker creating the rows at the same time makes this statement wait for it and then
	// insert nothing, while its snapshot (taken before) does not see the rows: read again.
	for range 2 {
		if err := conn.QueryRow(ctx, s.sub.store.q.shardEnsure, s.cfg.Name, s.cfg.Buckets).Scan(&counts); err != nil {
			return s.sub.exit(ctx, fmt.Errorf("run sharded subscription %s: create buckets: %w", s.cfg.Name, err))
		}
		if len(counts) > 0 {
			break
		}
	}
	if len(counts) != 1 || int(counts[0]) != s.cfg.Buckets {
		return fmt.Errorf("run sharded subscription %s: %w", s.cfg.Name, &ShardCountError{Name: s.cfg.Name, Configured: s.cfg.Buckets, Found: counts})
	}
	if !s.cfg.DisableListen {
		if _, err := conn.Exec(ctx, `LISTEN "`+s.sub.store.channel+`"`); err != nil {
			return s.sub.exit(ctx, fmt.Errorf("run sharded subscription %s: listen: %w", s.cfg.Name, err))
		}
	}
	attrs := metric.WithAttributes(tracing.SubscriptionNameKey.String(s.cfg.Name))
	reg, err := s.sub.store.metricsMeter(s.cfg.MeterProvider).RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(s.sub.lag, max(0, s.sub.head.Load()-s.sub.position.Load()), attrs)
		o.ObserveInt64(s.owned, s.ownedN.Load(), attrs)
		return nil
	}, s.sub.lag, s.owned)
	if err != nil {
		return s.sub.exit(ctx, fmt.Errorf("run sharded subscription %s: register gauges: %w", s.cfg.Name, err))
	}
	defer func() { _ = reg.Unregister() }()

	w := newShardWorker(s, conn.Conn())
	id := w.id.String()
	s.worker.Store(&id)
	defer s.worker.Store(nil)
	s.cfg.Logger.DebugContext(ctx, "keiro: sharded subscription worker joined", "subscription", s.cfg.Name, "worker", id)
	runErr := w.run(ctx)
	// Leave: release the buckets (their checkpoints are committed: no transaction is open) so
	// that the others take them now rather than when the leases expire.
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if s.skipLeave.Load() {
		return s.sub.exit(ctx, runErr) // the connection is closed: the session ends as a dead worker's does
	}
	if err := w.leave(bg); err != nil {
		s.cfg.Logger.WarnContext(ctx, "keiro: sharded subscription worker could not release its buckets; they move when their leases expire",
			"subscription", s.cfg.Name, "worker", id, "error", err)
	} else if _, err := conn.Exec(bg, `UNLISTEN *`); err == nil && runErr == nil {
		clean = true
	}
	return s.sub.exit(ctx, runErr)
}

// ShardCountError reports that a sharded subscription's buckets exist with another count than
// the configured one: every worker of a subscription must agree on Buckets. To change it,
// drop the subscription's rows in keiro_subscription_shards (and rebuild its read model).
type ShardCountError struct {
	// Name is the subscription's name.
	Name string
	// Configured is ShardedSubscriptionConfig.Buckets.
	Configured int
	// Found lists the counts the stored buckets were created with.
	Found []int32
}

func (e *ShardCountError) Error() string {
	return fmt.Sprintf("the buckets of sharded subscription %s exist with count %v, not the configured %d; "+
		"every worker must use the same Buckets", e.Name, e.Found, e.Configured)
}

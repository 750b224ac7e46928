package events

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// SetBeforeAppend installs a test seam that runs before each append attempt.
func SetBeforeAppend[S, C, E any](r *Runner[S, C, E], fn func(ctx context.Context, stream string, attempt int)) {
	r.beforeAppend = fn
}

// CatchUpOnce returns a function that runs one catch-up pass of s on conn, keeping the
// worker's checkpoint and fences between calls.
func CatchUpOnce(s *Subscription, conn *pgx.Conn) func(ctx context.Context) error {
	w := newWorker(s, conn)
	loaded := false
	return func(ctx context.Context) error {
		if !loaded {
			if _, err := conn.Exec(ctx, s.store.q.subEnsure, s.cfg.Name); err != nil {
				return err
			}
			if err := w.loadPosition(ctx); err != nil {
				return err
			}
			loaded = true
		}
		return w.catchUp(ctx)
	}
}

// ProducerIdentityBytes exposes the canonical identity bytes.
var ProducerIdentityBytes = producerIdentityBytes

// SetProcessManagerBeforeAppend installs the before-append seam of pm's manager runner.
func SetProcessManagerBeforeAppend[S, I, E, C any](pm *ProcessManager[S, I, E, C], fn func(ctx context.Context, stream string, attempt int)) {
	pm.runner.beforeAppend = fn
}

// ShardPasses drives a sharded subscription's worker pass by pass on conn, as a Run would,
// with the lease statements at clock's time (nil: the database's clock).
type ShardPasses struct{ w *shardWorker }

// NewShardPasses creates the subscription's buckets if needed and returns a new worker of it.
func NewShardPasses(ctx context.Context, s *ShardedSubscription, conn *pgx.Conn, clock func() *time.Time) (*ShardPasses, error) {
	var counts []int32
	if err := conn.QueryRow(ctx, s.sub.store.q.shardEnsure, s.cfg.Name, s.cfg.Buckets).Scan(&counts); err != nil {
		return nil, err
	}
	w := newShardWorker(s, conn)
	w.passive = true
	if clock != nil {
		w.clock = clock
	}
	return &ShardPasses{w: w}, nil
}

// ID returns the worker's id.
func (p *ShardPasses) ID() string { return p.w.id.String() }

// Reconcile runs one rebalancing pass and returns the buckets held after it.
func (p *ShardPasses) Reconcile(ctx context.Context) ([]int, error) {
	if err := p.w.reconcile(ctx); err != nil {
		return nil, err
	}
	return p.Held(), nil
}

// Held returns the buckets the worker handles.
func (p *ShardPasses) Held() []int { return slices.Sorted(maps.Keys(p.w.lanes)) }

// CatchUp runs one catch-up pass, without rebalancing.
func (p *ShardPasses) CatchUp(ctx context.Context) error {
	return p.w.catchUp(ctx)
}

// Leave releases the worker's buckets and ends its membership.
func (p *ShardPasses) Leave(ctx context.Context) error { return p.w.leave(ctx) }

// Rebalance runs one rebalancing pass as the worker's loop does (a database failure is logged
// and the buckets held are kept) and returns the buckets held after it.
func (p *ShardPasses) Rebalance(ctx context.Context) ([]int, error) {
	if err := p.w.rebalance(ctx); err != nil {
		return nil, err
	}
	return p.Held(), nil
}

// FairShare exposes fairShare.
var FairShare = fairShare

// SkipLeave makes s's Runs end without releasing their buckets, as a worker that died does.
func SkipLeave(s *ShardedSubscription) { s.skipLeave.Store(true) }

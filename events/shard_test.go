package events_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/quick"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// shardBundle is one sharded-subscription test's setup: a store, a sink table the handlers
// record every delivery in (inside the handler's transaction, so a rolled-back delivery leaves
// no row), and a way to start workers.
type shardBundle struct {
	t     *testing.T
	db    *testenv.DB
	store *events.Store
	name  string
}

const shardSinkSQL = `CREATE TABLE shard_sink (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id   uuid   NOT NULL,
    stream     text   NOT NULL,
    version    bigint NOT NULL,
    position   bigint NOT NULL,
    worker_tag int    NOT NULL,
    bucket     int    NOT NULL)`

func setupShards(t *testing.T) *shardBundle {
	t.Helper()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(context.Background(), shardSinkSQL)
	require.NoError(t, err)
	return &shardBundle{t: t, db: db, store: newStore(t, db), name: "orders-shard"}
}

// sink returns a handler that records each event in shard_sink with tag.
func (b *shardBundle) sink(tag int, buckets int) events.Handler {
	return func(ctx context.Context, tx pgx.Tx, e events.RecordedEvent) error {
		_, err := tx.Exec(ctx, `INSERT INTO shard_sink (event_id, stream, version, position, worker_tag, bucket)
            VALUES ($1, $2, $3, $4, $5, ((hashtextextended($2, 0) % $6) + $6) % $6)`,
			[16]byte(e.ID), e.StreamName, e.StreamVersion, e.GlobalPosition, tag, buckets)
		return err
	}
}

func (b *shardBundle) cfg(buckets int) events.ShardedSubscriptionConfig {
	return events.ShardedSubscriptionConfig{Name: b.name, Category: "order", Buckets: buckets,
		Lease: 3 * time.Second, RenewInterval: 300 * time.Millisecond, PollInterval: 100 * time.Millisecond}
}

// shardRun is a running worker.
type shardRun struct {
	sub  *events.ShardedSubscription
	stop func()
	errc chan error
}

func (b *shardBundle) start(cfg events.ShardedSubscriptionConfig, h events.Handler) *shardRun {
	b.t.Helper()
	sub, err := events.NewShardedSubscription(b.store, b.db.Pool, cfg, h)
	require.NoError(b.t, err)
	return b.run(sub)
}

func (b *shardBundle) run(sub *events.ShardedSubscription) *shardRun {
	ctx, cancel := context.WithCancel(context.Background())
	r := &shardRun{sub: sub, errc: make(chan error, 1)}
	done := make(chan struct{})
	go func() { r.errc <- sub.Run(ctx); close(done) }()
	var once sync.Once
	r.stop = func() { once.Do(func() { cancel(); <-done }) }
	b.t.Cleanup(r.stop)
	return r
}

// seed appends perStream events to each of streams order-0 … order-(streams−1), interleaved.
func (b *shardBundle) seed(streams, perStream int) int {
	b.t.Helper()
	for v := range perStream {
		for s := range streams {
			_, err := appendTx(b.t, b.db, b.store, fmt.Sprintf("order-%d", s), events.Any, ev("Placed", fmt.Sprintf(`{"n":%d}`, v)))
			require.NoError(b.t, err)
		}
	}
	return streams * perStream
}

func (b *shardBundle) sinkCount() int {
	var n int
	require.NoError(b.t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM shard_sink`).Scan(&n))
	return n
}

func (b *shardBundle) waitSink(n int, timeout time.Duration, runs ...*shardRun) {
	b.t.Helper()
	testenv.WaitFor(b.t, timeout, fmt.Sprintf("%d events in the sink", n), func() bool {
		for _, r := range runs {
			select {
			case err := <-r.errc:
				b.t.Fatalf("a worker stopped: %v", err)
			default:
			}
		}
		return b.sinkCount() >= n
	})
}

// requireExactlyOnceInOrder checks that the sink holds every event of the category exactly
// once, and each stream's events in stream-version order.
func (b *shardBundle) requireExactlyOnceInOrder(total int) {
	b.t.Helper()
	ctx := context.Background()
	var dups, missing int
	require.NoError(b.t, b.db.Pool.QueryRow(ctx, `SELECT
        (SELECT count(*) FROM (SELECT event_id FROM shard_sink GROUP BY event_id HAVING count(*) > 1) d),
        (SELECT count(*) FROM `+b.db.Schema+`.keiro_events e WHERE e.category = 'order'
            AND NOT EXISTS (SELECT 1 FROM shard_sink s WHERE s.event_id = e.event_id))`).Scan(&dups, &missing))
	require.Zero(b.t, dups, "events delivered twice")
	require.Zero(b.t, missing, "events never delivered")
	require.Equal(b.t, total, b.sinkCount())
	rows, err := b.db.Pool.Query(ctx, `SELECT stream, array_agg(version ORDER BY seq) FROM shard_sink GROUP BY stream`)
	require.NoError(b.t, err)
	defer rows.Close()
	for rows.Next() {
		var stream string
		var versions []int64
		require.NoError(b.t, rows.Scan(&stream, &versions))
		require.True(b.t, slices.IsSorted(versions), "stream %s handled out of order: %v", stream, versions)
	}
	require.NoError(b.t, rows.Err())
}

// owners returns, per live owner, the number of buckets it holds, and how many buckets have
// no live owner.
func owners(t *testing.T, sub *events.ShardedSubscription) (map[string]int, int) {
	t.Helper()
	own, err := sub.Ownership(context.Background())
	require.NoError(t, err)
	out, free := map[string]int{}, 0
	for _, o := range own {
		if o.Held {
			out[o.Owner]++
		} else {
			free++
		}
	}
	return out, free
}

// waitShares waits until every bucket is held and the holders are exactly the workers of runs,
// each with its fair share (the counts, sorted descending, equal want).
func waitShares(t *testing.T, sub *events.ShardedSubscription, want []int, runs ...*shardRun) {
	t.Helper()
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("last seen: %s", last)
		}
	}()
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("bucket shares %v", want), func() bool {
		for _, r := range runs {
			select {
			case err := <-r.errc:
				t.Fatalf("a worker stopped: %v", err)
			default:
			}
		}
		got, free := owners(t, sub)
		last = fmt.Sprintf("holders %v, %d free", got, free)
		if free > 0 || len(got) != len(runs) {
			return false
		}
		for _, r := range runs {
			if _, ok := got[r.sub.Worker()]; !ok {
				return false
			}
		}
		counts := make([]int, 0, len(got))
		for _, n := range got {
			counts = append(counts, n)
		}
		sort.Sort(sort.Reverse(sort.IntSlice(counts)))
		return slices.Equal(counts, want)
	})
}

// keiro "Shard lease" / "validates sharded worker options before startup".
func TestShardLeaseValidatesOptions(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newStore(t, db)
	h := func(context.Context, pgx.Tx, events.RecordedEvent) error { return nil }
	ok := events.ShardedSubscriptionConfig{Name: "n", Buckets: 4}
	_, err := events.NewShardedSubscription(s, db.Pool, ok, h)
	require.NoError(t, err)
	for _, c := range []struct {
		mod  func(*events.ShardedSubscriptionConfig)
		want string
	}{
		{func(c *events.ShardedSubscriptionConfig) { c.Buckets = 0 }, "Buckets"},
		{func(c *events.ShardedSubscriptionConfig) { c.Buckets = events.MaxShardBuckets + 1 }, "Buckets"},
		{func(c *events.ShardedSubscriptionConfig) { c.Lease = -time.Second }, "Lease"},
		{func(c *events.ShardedSubscriptionConfig) { c.RenewInterval = -time.Second }, "RenewInterval"},
		{func(c *events.ShardedSubscriptionConfig) { c.Lease, c.RenewInterval = 10*time.Second, 10*time.Second }, "RenewInterval"},
		{func(c *events.ShardedSubscriptionConfig) { c.BatchSize = -1 }, "BatchSize"},
		{func(c *events.ShardedSubscriptionConfig) { c.Retry.MaxDeliveries = -1 }, "Retry.MaxDeliveries"},
		{func(c *events.ShardedSubscriptionConfig) { c.Name = "" }, "Name"},
	} {
		cfg := ok
		c.mod(&cfg)
		_, err := events.NewShardedSubscription(s, db.Pool, cfg, h)
		require.ErrorContains(t, err, c.want)
	}
	_, err = events.NewShardedSubscription(s, db.Pool, ok, nil)
	require.ErrorContains(t, err, "handler is nil")
}

// keiro "Shard lease" / "ensureShards rejects a shardCount mismatch".
func TestShardLeaseRejectsCountMismatch(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	r := b.start(b.cfg(4), b.sink(1, 4))
	waitShares(t, r.sub, []int{4}, r)
	r.stop()
	require.NoError(t, <-r.errc)
	six := b.cfg(6)
	sub, err := events.NewShardedSubscription(b.store, b.db.Pool, six, b.sink(1, 6))
	require.NoError(t, err)
	err = sub.Run(context.Background())
	var ce *events.ShardCountError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, 6, ce.Configured)
	require.Equal(t, []int32{4}, ce.Found)
}

// keiro "Sharded subscription single worker" / "one worker with N=4 buckets drains a seeded
// category exactly once".
func TestShardedSubscriptionSingleWorkerDrainsOnce(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	total := b.seed(8, 5)
	_, err := appendTx(t, b.db, b.store, "invoice-1", events.Any, ev("Raised", `{}`))
	require.NoError(t, err)
	r := b.start(b.cfg(4), b.sink(1, 4))
	b.waitSink(total, time.Minute, r)
	waitShares(t, r.sub, []int{4}, r)
	// Live: new appends arrive through NOTIFY.
	total += b.seed(3, 1)
	b.waitSink(total, time.Minute, r)
	b.requireExactlyOnceInOrder(total)
	for stream := range 8 {
		name := fmt.Sprintf("order-%d", stream)
		bucket, err := r.sub.Bucket(context.Background(), b.db.Pool, name)
		require.NoError(t, err)
		var stored int
		require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT min(bucket) FROM shard_sink WHERE stream = $1`, name).Scan(&stored))
		require.Equal(t, stored, bucket)
	}
	r.stop()
	require.NoError(t, <-r.errc)
	_, free := owners(t, r.sub)
	require.Equal(t, 4, free, "a stopped worker releases its buckets")
}

// keiro "Sharded subscription drain and failover" / "three workers drain disjointly, then
// re-home a killed worker's buckets" (the rebalancing half): shares follow joins and leaves.
func TestShardedSubscriptionRebalancesOnJoinAndLeave(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	cfg := b.cfg(8)
	a := b.start(cfg, b.sink(1, 8))
	waitShares(t, a.sub, []int{8}, a)
	c := b.start(cfg, b.sink(2, 8))
	waitShares(t, a.sub, []int{4, 4}, a, c)
	d := b.start(cfg, b.sink(3, 8))
	waitShares(t, a.sub, []int{3, 3, 2}, a, c, d)
	total := b.seed(12, 5)
	b.waitSink(total, time.Minute, a, c, d)
	b.requireExactlyOnceInOrder(total)
	// Disjoint under stable membership: each stream was handled by one worker, and the work
	// spread over all three.
	var maxPerStream, workers int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT
        (SELECT max(n) FROM (SELECT count(DISTINCT worker_tag) AS n FROM shard_sink GROUP BY stream) x),
        (SELECT count(DISTINCT worker_tag) FROM shard_sink)`).Scan(&maxPerStream, &workers))
	require.Equal(t, 1, maxPerStream)
	require.GreaterOrEqual(t, workers, 2)
	c.stop()
	require.NoError(t, <-c.errc)
	waitShares(t, a.sub, []int{4, 4}, a, d)
	d.stop()
	require.NoError(t, <-d.errc)
	waitShares(t, a.sub, []int{8}, a)
	total += b.seed(12, 1)
	b.waitSink(total, time.Minute, a)
	b.requireExactlyOnceInOrder(total)
}

// keiro "Sharded subscription ack coupling" / "loses no events when a bucket is shed
// mid-drain during rebalance".
func TestShardedSubscriptionShedsWithoutLossOrDuplicate(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	total := b.seed(24, 10)
	cfg := b.cfg(8)
	cfg.BatchSize = 3
	var commits testenv.Progress
	cfg.AfterCommit = func(int, int64) { commits.Add(1) }
	a := b.start(cfg, b.sink(1, 8))
	commits.Wait(t, 5, time.Minute, a.errc)
	c := b.start(cfg, b.sink(2, 8))
	commits.Wait(t, commits.Value()+5, time.Minute, a.errc)
	d := b.start(cfg, b.sink(3, 8))
	commits.Wait(t, commits.Value()+5, time.Minute, a.errc)
	c.stop()
	require.NoError(t, <-c.errc)
	b.waitSink(total, time.Minute, a, d)
	b.requireExactlyOnceInOrder(total)
	var workers int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT worker_tag) FROM shard_sink`).Scan(&workers))
	require.GreaterOrEqual(t, workers, 2)
}

// passes returns a pass-driven worker of sub on its own connection.
func (b *shardBundle) passes(sub *events.ShardedSubscription, clock func() *time.Time) *events.ShardPasses {
	b.t.Helper()
	ctx := context.Background()
	conn, err := b.db.Pool.Acquire(ctx)
	require.NoError(b.t, err)
	b.t.Cleanup(conn.Release)
	p, err := events.NewShardPasses(ctx, sub, conn.Conn(), clock)
	require.NoError(b.t, err)
	return p
}

func (b *shardBundle) newSub(cfg events.ShardedSubscriptionConfig, h events.Handler) *events.ShardedSubscription {
	b.t.Helper()
	sub, err := events.NewShardedSubscription(b.store, b.db.Pool, cfg, h)
	require.NoError(b.t, err)
	return sub
}

// leaseClock adapts the timers' settable clock to the lease statements' clock.
func leaseClock(c *clock) func() *time.Time {
	return func() *time.Time { t := c.Now(); return &t }
}

// keiro "Shard lease": "ensureShardRows populates N rows once (idempotent on re-run)", "worker
// A claims all N when free; B claims 0 while A holds valid leases", "B claims A's buckets
// after A's lease expires; A then renews nothing", "renewLease returns only still-held
// buckets", "releaseShards: relinquished buckets are immediately claimable". The lease
// statements run at explicit times standing in for the passage of time.
func TestShardLeaseClaimRenewExpireRelease(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	ctx := context.Background()
	cfg := b.cfg(4)
	cfg.Lease = 30 * time.Second
	sub := b.newSub(cfg, b.sink(1, 4))
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ca, cb := &clock{now: t0}, &clock{now: t0}

	pa := b.passes(sub, leaseClock(ca))
	pb := b.passes(sub, leaseClock(cb)) // ensuring twice is idempotent
	own, err := sub.Ownership(ctx)
	require.NoError(t, err)
	require.Len(t, own, 4)
	for i, o := range own {
		require.Equal(t, i, o.Bucket)
		require.Empty(t, o.Owner)
		require.False(t, o.Held)
	}

	held, err := pa.Reconcile(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{0, 1, 2, 3}, held, "a lone worker takes every bucket")
	held, err = pb.Reconcile(ctx)
	require.NoError(t, err)
	require.Empty(t, held, "B takes nothing while A's leases are valid")
	held, err = pa.Reconcile(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{0, 1}, held, "A renews its share once B is a member and sheds the highest buckets")
	held, err = pb.Reconcile(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{2, 3}, held, "B takes what A shed")

	// A stops renewing: at t0+60s its leases and its membership have expired; B takes every
	// bucket, and A's renewal then returns nothing (nor can A take any back).
	cb.Advance(60 * time.Second)
	held, err = pb.Reconcile(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{0, 1, 2, 3}, held)
	ca.Advance(61 * time.Second)
	held, err = pa.Reconcile(ctx)
	require.NoError(t, err)
	require.Empty(t, held)

	// Released buckets are free at once, though their leases had not expired.
	held, err = pb.Reconcile(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{0, 1}, held, "B sheds down to its share of two members")
	held, err = pa.Reconcile(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{2, 3}, held)
	require.NoError(t, pa.Leave(ctx))
	held, err = pb.Reconcile(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{0, 1, 2, 3}, held)
}

// keiro "Shard lease" / "fairShareTarget divides buckets evenly (ceil)": here the live members
// in worker-id order split the buckets exactly (the shares add up to Buckets), so no member
// is left without a bucket while another holds two more than it.
func TestShardLeaseFairShare(t *testing.T) {
	t.Parallel()
	shares := func(n, live int) []int {
		out := make([]int, live)
		for r := range live {
			out[r] = events.FairShare(n, live, r)
		}
		return out
	}
	require.Equal(t, []int{2, 2, 2}, shares(6, 3))
	require.Equal(t, []int{2, 2, 1, 1}, shares(6, 4))
	require.Equal(t, []int{3, 2, 2}, shares(7, 3))
	require.Equal(t, []int{1, 1, 1, 0}, shares(3, 4))
	require.Equal(t, 4, events.FairShare(4, 0, 0), "no live member: everything")
	f := func(n, live uint8) bool {
		total := 0
		for r := range int(live) {
			s := events.FairShare(int(n), int(live), r)
			if s < int(n)/int(live) || s > int(n)/int(live)+1 {
				return false
			}
			total += s
		}
		return live == 0 || total == int(n)
	}
	require.NoError(t, quick.Check(f, nil))
}

// A zombie cannot checkpoint: a worker whose lease runs out while its batch is in flight
// writes no checkpoint, and its handler's effects roll back with the batch; the worker stops
// handling the bucket. The expiry is written from inside the batch (its transaction holds the
// bucket's row), so the test needs no waiting.
func TestShardZombieCannotCheckpoint(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	ctx := context.Background()
	total := b.seed(2, 2)
	cfg := b.cfg(1)
	sink := b.sink(1, 1)
	expire := true
	sub := b.newSub(cfg, func(ctx context.Context, tx pgx.Tx, e events.RecordedEvent) error {
		if err := sink(ctx, tx, e); err != nil {
			return err
		}
		if expire {
			// The lease runs out while the handler works.
			_, err := tx.Exec(ctx, `UPDATE keiro_subscription_shards SET lease_expires_at = clock_timestamp() - interval '1 second'`)
			return err
		}
		return nil
	})
	p := b.passes(sub, nil)
	held, err := p.Reconcile(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{0}, held)
	require.NoError(t, p.CatchUp(ctx))
	require.Empty(t, p.Held(), "the worker stops handling the bucket whose lease it lost")
	require.Zero(t, b.sinkCount(), "the zombie's effects rolled back")
	own, err := sub.Ownership(ctx)
	require.NoError(t, err)
	require.Zero(t, own[0].Checkpoint, "the zombie wrote no checkpoint")

	// A lease that expired before the batch began: the batch does not start.
	expire = false
	held, err = p.Reconcile(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{0}, held)
	_, err = b.db.Pool.Exec(ctx, `UPDATE keiro_subscription_shards SET lease_expires_at = clock_timestamp() - interval '1 second'`)
	require.NoError(t, err)
	require.NoError(t, p.CatchUp(ctx))
	require.Empty(t, p.Held())
	require.Zero(t, b.sinkCount())

	// The worker is gone (its membership expired too); another one takes the expired bucket
	// and handles every event once.
	_, err = b.db.Pool.Exec(ctx, `UPDATE keiro_subscription_shard_members SET lease_expires_at = clock_timestamp() - interval '1 second'
        WHERE worker_id = $1`, mustUUID(t, p.ID()))
	require.NoError(t, err)
	p2 := b.passes(sub, nil)
	// Another worker takes the expired bucket and handles every event once.
	held, err = p2.Reconcile(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{0}, held)
	require.NoError(t, p2.CatchUp(ctx))
	b.requireExactlyOnceInOrder(total)
}

func mustUUID(t *testing.T, s string) [16]byte {
	t.Helper()
	u, err := envelope.ParseUUID(s)
	require.NoError(t, err)
	return [16]byte(u)
}

// keiro "Sharded subscription ack coupling" / "allows zombie overlap duplicates without losing
// an event": a worker whose handler hangs past its lease (a zombie) holds its batch's
// transaction open; when it resumes, its checkpoint write fails and its effects roll back, and
// the bucket's events are handled again — by whichever worker takes the bucket — and
// committed exactly once.
func TestShardedSubscriptionZombieOverlapLosesNothing(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	total := b.seed(1, 5)
	cfg := b.cfg(1)
	cfg.Lease, cfg.RenewInterval = 500*time.Millisecond, 100*time.Millisecond
	entered, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	deliveries := 0
	var once sync.Once
	sinkA, sinkB := b.sink(1, 1), b.sink(2, 1)
	count := func() { mu.Lock(); deliveries++; mu.Unlock() }
	a := b.start(cfg, func(ctx context.Context, tx pgx.Tx, e events.RecordedEvent) error {
		count()
		first := false
		once.Do(func() { first = true })
		if first {
			close(entered)
			<-release
		}
		return sinkA(ctx, tx, e)
	})
	<-entered
	testenv.WaitFor(t, 30*time.Second, "the hung worker's lease to expire", func() bool {
		own, err := a.sub.Ownership(context.Background())
		require.NoError(t, err)
		return len(own) == 1 && !own[0].Held
	})
	c := b.start(cfg, func(ctx context.Context, tx pgx.Tx, e events.RecordedEvent) error {
		count()
		return sinkB(ctx, tx, e)
	})
	close(release)
	b.waitSink(total, time.Minute, a, c)
	b.requireExactlyOnceInOrder(total)
	mu.Lock()
	require.Greater(t, deliveries, total, "the zombie's batch was delivered again")
	mu.Unlock()
}

// keiro "Sharded subscription drain and failover" / "three workers drain disjointly, then
// re-home a killed worker's buckets": a worker that dies (its session ends without releasing)
// keeps its buckets until its leases expire; then the survivors take them and drain them.
func TestShardedSubscriptionKilledWorkerBucketsTaken(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	cfg := b.cfg(6)
	cfg.Lease, cfg.RenewInterval = time.Second, 200*time.Millisecond
	a := b.start(cfg, b.sink(1, 6))
	c := b.start(cfg, b.sink(2, 6))
	d := b.start(cfg, b.sink(3, 6))
	waitShares(t, a.sub, []int{2, 2, 2}, a, c, d)
	total := b.seed(12, 3)
	b.waitSink(total, time.Minute, a, c, d)

	events.SkipLeave(a.sub)
	dead := a.sub.Worker()
	a.stop()
	require.NoError(t, <-a.errc)
	got, _ := owners(t, c.sub)
	require.Equal(t, 2, got[dead], "a dead worker's buckets stay leased to it")
	total += b.seed(12, 3)
	waitShares(t, c.sub, []int{3, 3}, c, d)
	b.waitSink(total, time.Minute, c, d)
	b.requireExactlyOnceInOrder(total)
}

// The late-commit guard holds per bucket: an append that commits late with a lower position
// than events already visible is not skipped by the bucket it belongs to, nor handled out of
// its stream's order, whichever worker holds that bucket.
func TestShardedSubscriptionLateCommitNotSkipped(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	ctx := context.Background()
	var mu sync.Mutex
	got := map[string][]int64{}
	record := func(tag string) events.Handler {
		return func(_ context.Context, _ pgx.Tx, e events.RecordedEvent) error {
			mu.Lock()
			got[tag] = append(got[tag], e.GlobalPosition)
			mu.Unlock()
			return nil
		}
	}
	cfg := b.cfg(2)
	s0, s1 := b.newSub(cfg, record("w0")), b.newSub(cfg, record("w1"))
	p0, p1 := b.passes(s0, nil), b.passes(s1, nil)
	for range 4 {
		_, err := p0.Reconcile(ctx)
		require.NoError(t, err)
		_, err = p1.Reconcile(ctx)
		require.NoError(t, err)
	}
	require.Len(t, p0.Held(), 1)
	require.Len(t, p1.Held(), 1)
	// Streams by bucket.
	stream := func(bucket, skip int) string {
		for i := 0; ; i++ {
			name := fmt.Sprintf("order-%d", i)
			bk, err := s0.Bucket(ctx, b.db.Pool, name)
			require.NoError(t, err)
			if bk == bucket {
				if skip == 0 {
					return name
				}
				skip--
			}
		}
	}
	b0 := p0.Held()[0]
	x, y, z := stream(b0, 0), stream(b0, 1), stream(1-b0, 0)

	// B takes its transaction id first; A appends x (lower position); B appends y (same
	// bucket) and z (the other), and commits first.
	txB, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer txB.Rollback(ctx)
	_, err = txB.Exec(ctx, "SELECT pg_current_xact_id()")
	require.NoError(t, err)
	txA, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer txA.Rollback(ctx)
	ra, err := b.store.AppendTx(ctx, txA, x, events.Any, ev("E", `{}`))
	require.NoError(t, err)
	ry, err := b.store.AppendTx(ctx, txB, y, events.Any, ev("E", `{}`))
	require.NoError(t, err)
	rz, err := b.store.AppendTx(ctx, txB, z, events.Any, ev("E", `{}`))
	require.NoError(t, err)
	require.NoError(t, txB.Commit(ctx))
	for range 3 {
		require.NoError(t, p0.CatchUp(ctx))
		require.NoError(t, p1.CatchUp(ctx))
	}
	mu.Lock()
	require.Empty(t, got, "positions %d and %d are visible but %d may still commit", ry.GlobalPosition, rz.GlobalPosition, ra.GlobalPosition)
	mu.Unlock()
	require.NoError(t, txA.Commit(ctx))
	for i := 0; ; i++ {
		require.Less(t, i, 10000)
		require.NoError(t, p0.CatchUp(ctx))
		require.NoError(t, p1.CatchUp(ctx))
		mu.Lock()
		n := len(got["w0"]) + len(got["w1"])
		mu.Unlock()
		if n == 3 {
			break
		}
	}
	require.Equal(t, []int64{ra.GlobalPosition, ry.GlobalPosition}, got["w0"])
	require.Equal(t, []int64{rz.GlobalPosition}, got["w1"])
}

// keiro "Sharded subscription ack coupling" / "dead-letters a poison event after bounded
// retries and keeps draining", and "Sharded subscription drain and failover" / "a handler
// exception is retried in place and drains": a failing event is delivered again in its bucket
// up to Retry.MaxDeliveries, then dead-lettered, and its bucket (and the others) go on; a
// transient failure is retried in place. A replay request reaches a worker of the group.
func TestShardedSubscriptionRetriesAndDeadLetters(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	ctx := context.Background()
	total := b.seed(4, 4)
	cfg := b.cfg(4)
	cfg.Retry = events.RetryPolicy{MaxDeliveries: 3, Backoff: keiro.Backoff{Initial: -1}}
	sink := b.sink(1, 4)
	var mu sync.Mutex
	poisonDeliveries, transient := 0, 0
	heal := false
	r := b.start(cfg, func(ctx context.Context, tx pgx.Tx, e events.RecordedEvent) error {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case e.StreamName == "order-1" && e.StreamVersion == 2 && !heal:
			poisonDeliveries++
			return errors.New("poison order")
		case e.StreamName == "order-2" && e.StreamVersion == 3 && transient == 0:
			transient++
			return errors.New("transient")
		}
		return sink(ctx, tx, e)
	})
	b.waitSink(total-1, time.Minute, r)
	var dead []events.DeadLetter
	testenv.WaitFor(t, time.Minute, "the dead letter", func() bool {
		var err error
		dead, err = b.store.ListDeadLetters(ctx, b.db.Pool, events.DeadLetterFilter{Subscription: b.name})
		require.NoError(t, err)
		return len(dead) == 1
	})
	require.Equal(t, "order-1", dead[0].StreamName)
	require.EqualValues(t, 2, dead[0].StreamVersion)
	require.Equal(t, events.ErrorClassMaxDeliveries, dead[0].ErrorClass)
	require.Equal(t, 3, dead[0].Attempts)
	mu.Lock()
	require.Equal(t, 3, poisonDeliveries)
	require.Equal(t, 1, transient)
	heal = true
	mu.Unlock()
	// The stream's later events were handled after the dead letter, in order.
	var versions []int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT array_agg(version ORDER BY seq) FROM shard_sink WHERE stream = 'order-1'`).Scan(&versions))
	require.Equal(t, []int64{1, 3, 4}, versions)

	n, err := b.store.RequestReplay(ctx, b.db.Pool, b.name)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	b.waitSink(total, time.Minute, r)
	dead, err = b.store.ListDeadLetters(ctx, b.db.Pool, events.DeadLetterFilter{Subscription: b.name})
	require.NoError(t, err)
	require.Equal(t, events.DeadLetterReplayed, dead[0].Status)
}

// Rebuild resets every bucket's checkpoint and the read model in one transaction; the
// running workers rebuild it from the start of the log.
func TestShardedSubscriptionRebuild(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	ctx := context.Background()
	total := b.seed(6, 3)
	cfg := b.cfg(4)
	a := b.start(cfg, b.sink(1, 4))
	c := b.start(cfg, b.sink(2, 4))
	b.waitSink(total, time.Minute, a, c)
	require.NoError(t, a.sub.Rebuild(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `TRUNCATE shard_sink`)
		return err
	}))
	b.waitSink(total, time.Minute, a, c)
	b.requireExactlyOnceInOrder(total)
}

// Every stream name, whatever its characters, has one stable bucket in [0, Buckets)
// (generated names, through the database's hash; TestShardedSubscriptionSingleWorkerDrainsOnce
// checks that the workers' reads assign the same one).
func TestShardBucketOfGeneratedStreams(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	ctx := context.Background()
	for _, n := range []int{1, 7, 16} {
		cfg := b.cfg(n)
		sub := b.newSub(cfg, b.sink(1, n))
		f := func(name string) bool {
			name = strings.ToValidUTF8(strings.ReplaceAll(name, "\x00", ""), "?")
			bk, err := sub.Bucket(ctx, b.db.Pool, name)
			if err != nil {
				t.Logf("%q: %v", name, err)
				return false
			}
			again, err := sub.Bucket(ctx, b.db.Pool, name)
			return err == nil && bk >= 0 && bk < n && again == bk
		}
		require.NoError(t, quick.Check(f, &quick.Config{MaxCount: 200}))
	}
}

// keiro "Shard lease" / "acquireOutcome keeps previous ownership on acquire failure": a
// rebalance that fails on the database (here its table is gone) keeps the buckets the worker
// held, and handles them on; the next one that succeeds replaces them.
func TestShardLeaseRebalanceFailureKeepsOwnership(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	ctx := context.Background()
	sub := b.newSub(b.cfg(4), b.sink(1, 4))
	p := b.passes(sub, nil)
	held, err := p.Reconcile(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{0, 1, 2, 3}, held)

	_, err = b.db.Pool.Exec(ctx, `ALTER TABLE `+b.db.Schema+`.keiro_subscription_shards RENAME TO keiro_subscription_shards_away`)
	require.NoError(t, err)
	_, err = p.Reconcile(ctx)
	require.Error(t, err, "the pass fails")
	held, err = p.Rebalance(ctx)
	require.NoError(t, err, "the worker's loop goes on")
	require.Equal(t, []int{0, 1, 2, 3}, held, "and keeps the buckets it held")
	_, err = b.db.Pool.Exec(ctx, `ALTER TABLE `+b.db.Schema+`.keiro_subscription_shards_away RENAME TO keiro_subscription_shards`)
	require.NoError(t, err)

	p2 := b.passes(sub, nil)
	held, err = p2.Reconcile(ctx)
	require.NoError(t, err)
	require.Empty(t, held, "the first worker's leases are still valid")
	held, err = p.Rebalance(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{0, 1}, held, "a successful pass replaces the buckets held")
}

// keiro "Sharded subscription drain and failover" / "a killed worker relinquishes its leases
// immediately": a worker that stops releases its buckets as it goes, so they are free at
// once although their leases (30 s) have not expired.
func TestShardedSubscriptionStoppedWorkerReleasesLeases(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	cfg := b.cfg(4)
	cfg.Lease, cfg.RenewInterval = 30*time.Second, 200*time.Millisecond
	r := b.start(cfg, b.sink(1, 4))
	waitShares(t, r.sub, []int{4}, r)
	r.stop()
	require.NoError(t, <-r.errc)
	own, err := r.sub.Ownership(context.Background())
	require.NoError(t, err)
	require.Len(t, own, 4)
	for _, o := range own {
		require.False(t, o.Held, "bucket %d", o.Bucket)
		require.Empty(t, o.Owner, "bucket %d", o.Bucket)
	}
}

// keiro "Sharded subscription ack coupling" / "redelivers a batch-tail event whose handler was
// killed mid-flight": a worker dies (its session is terminated) while its handler works on
// the last event of a batch. The batch's effects and its checkpoint are one transaction, so
// none of it commits; the worker that takes the bucket once the lease expires handles every
// event of the batch, each once.
func TestShardedSubscriptionRedeliversBatchKilledMidFlight(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	ctx := context.Background()
	total := b.seed(1, 5)
	cfg := b.cfg(1)
	cfg.Lease, cfg.RenewInterval, cfg.BatchSize = time.Second, 200*time.Millisecond, 10
	entered, release := make(chan int32, 1), make(chan struct{})
	sinkA := b.sink(1, 1)
	a := b.start(cfg, func(ctx context.Context, tx pgx.Tx, e events.RecordedEvent) error {
		if err := sinkA(ctx, tx, e); err != nil {
			return err
		}
		if e.StreamVersion == 5 {
			var pid int32
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			entered <- pid
			<-release
		}
		return nil
	})
	pid := <-entered
	var killed bool
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&killed))
	require.True(t, killed)
	close(release)
	require.Error(t, <-a.errc, "the worker's session is gone")
	require.Zero(t, b.sinkCount(), "none of the batch committed")

	c := b.start(cfg, b.sink(2, 1))
	b.waitSink(total, time.Minute, c)
	b.requireExactlyOnceInOrder(total)
	var fromA int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM shard_sink WHERE worker_tag = 1`).Scan(&fromA))
	require.Zero(t, fromA)
}

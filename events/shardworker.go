package events

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keiro-go/keiro/envelope"
)

// shardWorker is one Run of a sharded subscription: one member of its group, the lanes of the
// buckets it holds, and one late-commit guard for all of them (the guard bounds positions, not
// buckets).
//
// State of a bucket, as one worker sees it (docs/architecture.md, "Sharded subscriptions"):
// free (no owner, or an expired lease) → held (claim) → held (renew, every RenewInterval) →
// free (release: shed above the fair share between transactions, or on stopping) or lost (the
// lease expired: the next lock or checkpoint write finds it and the transaction rolls back).
type shardWorker struct {
	s    *ShardedSubscription
	conn *pgx.Conn
	id   envelope.UUID
	guard
	lanes map[int]*shardLane

	renewed time.Time // last reconcile
	live    int       // live members at the last reconcile
	quota   int       // this worker's fair share at the last reconcile
	due     bool      // reconcile before the next batch
	replay  bool
	// clock overrides the database's clock in lease statements (tests); nil in a Run.
	clock func() *time.Time
	// passive turns rebalancing off outside reconcile calls (tests driving passes).
	passive bool
	// stop is Run's context: its end stops the worker between transactions.
	stop context.Context
}

// shardLane is the lane of one bucket, and how far the worker has read the log for it: at ≥
// cp, where positions in (cp, at] hold no event of the bucket (so the checkpoint need not be
// written to move past them).
type shardLane struct {
	lane
	at int64
}

func newShardWorker(s *ShardedSubscription, conn *pgx.Conn) *shardWorker {
	return &shardWorker{s: s, conn: conn, id: envelope.NewUUIDv7(), lanes: map[int]*shardLane{}, due: true,
		clock: func() *time.Time { return nil }, stop: context.Background()}
}

// bucketRow is the checkpoint of one bucket: its row in keiro_subscription_shards, writable
// only under the worker's unexpired lease.
type bucketRow struct {
	w      *shardWorker
	bucket int
}

func (r bucketRow) lock(ctx context.Context, tx pgx.Tx) (int64, error) {
	var cp int64
	err := tx.QueryRow(ctx, r.w.s.sub.store.q.shardLock, r.w.s.cfg.Name, r.bucket, [16]byte(r.w.id)).Scan(&cp)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("bucket %d: %w", r.bucket, errLeaseLost)
	}
	if err != nil {
		return 0, fmt.Errorf("lock bucket %d: %w", r.bucket, err)
	}
	return cp, nil
}

func (r bucketRow) save(ctx context.Context, tx pgx.Tx, next int64) error {
	tag, err := tx.Exec(ctx, r.w.s.sub.store.q.shardSave, r.w.s.cfg.Name, r.bucket, [16]byte(r.w.id), next)
	if err != nil {
		return fmt.Errorf("save checkpoint of bucket %d: %w", r.bucket, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("save checkpoint of bucket %d: %w", r.bucket, errLeaseLost)
	}
	return nil
}

func (w *shardWorker) newLane(bucket int, cp int64) *shardLane {
	l := &shardLane{lane: lane{s: w.s.sub, conn: w.conn, cp: cp, row: bucketRow{w, bucket}, bucket: bucket}, at: cp}
	l.after = func(next int64) {
		l.at = max(l.at, next)
		w.positionChanged()
		w.s.sub.store.progressed()
		if w.s.cfg.AfterCommit != nil {
			w.s.cfg.AfterCommit(bucket, next)
		}
	}
	return l
}

// run is Run's loop: reconcile, catch up, wait.
//
// The statements run under work, which ctx's end does not cancel: when ctx ends, the worker
// finishes the transaction in flight (so that it leaves no bucket's batch half done) and
// stops before the next one.
func (w *shardWorker) run(ctx context.Context) error {
	w.stop = ctx
	work := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		if err := w.catchUp(work); err != nil {
			return err
		}
		if err := w.wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

// renewDue reports whether the leases are due for renewal.
func (w *shardWorker) renewDue() bool {
	if w.passive {
		return false
	}
	return w.due || time.Since(w.renewed) >= w.s.cfg.RenewInterval
}

// reconcile is one rebalancing pass, in one transaction: renew this worker's membership and
// unexpired leases, then shed the buckets above its fair share (highest first) or take free
// ones up to it. Membership, not ownership, decides the share, so a worker that just joined
// (and holds nothing) counts at once; the live members in worker-id order divide Buckets as
// evenly as possible, the first ones taking one more when it does not divide. Shedding only
// happens here, between transactions, so a shed bucket's checkpoint covers exactly the
// events whose effects committed.
func (w *shardWorker) reconcile(ctx context.Context) error {
	s := w.s
	q := s.sub.store.q
	lease := s.cfg.Lease.Microseconds()
	at := w.clock()
	var (
		joined            bool
		held              = map[int]int64{}
		shed              []int32
		claimed           int
		members           [][16]byte
		renewErr, claimEr error
	)
	err := pgx.BeginFunc(ctx, w.conn, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, q.shardJoin, s.cfg.Name, [16]byte(w.id), lease, at).Scan(&joined); err != nil {
			return fmt.Errorf("renew membership: %w", err)
		}
		rows, err := tx.Query(ctx, q.shardMembers, s.cfg.Name, at)
		if err != nil {
			return fmt.Errorf("read members: %w", err)
		}
		members, err = pgx.CollectRows(rows, pgx.RowTo[[16]byte])
		if err != nil {
			return fmt.Errorf("read members: %w", err)
		}
		rank := slices.Index(members, [16]byte(w.id))
		if rank < 0 {
			rank, members = len(members), append(members, [16]byte(w.id))
		}
		w.live = len(members)
		w.quota = fairShare(s.cfg.Buckets, len(members), rank)
		if renewErr = collectBuckets(tx.Query(ctx, q.shardRenew, s.cfg.Name, [16]byte(w.id), lease, at))(held); renewErr != nil {
			return fmt.Errorf("renew leases: %w", renewErr)
		}
		if excess := len(held) - w.quota; excess > 0 {
			owned := slices.Sorted(maps.Keys(held))
			for _, b := range owned[len(owned)-excess:] {
				shed = append(shed, int32(b))
			}
			rows, err := tx.Query(ctx, q.shardRelease, s.cfg.Name, [16]byte(w.id), shed)
			if err != nil {
				return fmt.Errorf("shed buckets: %w", err)
			}
			released, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			if err != nil {
				return fmt.Errorf("shed buckets: %w", err)
			}
			shed = released
			for _, b := range released {
				delete(held, int(b))
			}
		}
		if want := w.quota - len(held); want > 0 {
			before := len(held)
			if claimEr = collectBuckets(tx.Query(ctx, q.shardClaim, s.cfg.Name, [16]byte(w.id), want, lease, at))(held); claimEr != nil {
				return fmt.Errorf("claim buckets: %w", claimEr)
			}
			claimed = len(held) - before
		}
		if joined || len(shed) > 0 || claimed > 0 {
			if _, err := tx.Exec(ctx, q.shardNotify, s.notifyPayload()); err != nil {
				return fmt.Errorf("wake the other workers: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("rebalance: %w", err)
	}
	w.renewed, w.due = time.Now(), false
	if claimed > 0 {
		s.claimed.Add(ctx, int64(claimed), s.sub.nameAttr)
	}
	if len(shed) > 0 {
		s.released.Add(ctx, int64(len(shed)), s.sub.nameAttr)
		s.cfg.Logger.DebugContext(ctx, "keiro: sharded subscription worker shed buckets above its share",
			"subscription", s.cfg.Name, "worker", w.id.String(), "buckets", shed, "share", w.quota, "workers", w.live)
	}
	w.follow(ctx, held, true)
	return nil
}

// collectBuckets reads (bucket, checkpoint) rows into held.
func collectBuckets(rows pgx.Rows, err error) func(held map[int]int64) error {
	return func(held map[int]int64) error {
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				b  int32
				cp int64
			)
			if err := rows.Scan(&b, &cp); err != nil {
				return err
			}
			held[int(b)] = cp
		}
		return rows.Err()
	}
}

// follow brings the lanes in line with held (bucket → stored checkpoint): a lane for each held
// bucket, none for the others. A lane whose stored checkpoint moved follows it; with
// authoritative false (a read of the table, not a rebalance) only lost buckets are dropped.
func (w *shardWorker) follow(ctx context.Context, held map[int]int64, authoritative bool) {
	changed := false
	for b, l := range w.lanes {
		cp, ok := held[b]
		if !ok {
			delete(w.lanes, b)
			changed = true
			if !authoritative {
				w.lostBucket(ctx, b)
			}
			continue
		}
		if cp != l.cp {
			l.moved(ctx, cp)
			l.at = cp
		}
	}
	if authoritative {
		for b, cp := range held {
			if _, ok := w.lanes[b]; !ok {
				w.lanes[b] = w.newLane(b, cp)
				changed = true
			}
		}
	}
	if changed {
		w.ownershipChanged()
	}
}

func (w *shardWorker) lostBucket(ctx context.Context, b int) {
	w.s.lost.Add(ctx, 1, w.s.sub.nameAttr)
	w.s.cfg.Logger.WarnContext(ctx, "keiro: sharded subscription worker lost a bucket (its lease expired); another worker takes it over",
		"subscription", w.s.cfg.Name, "worker", w.id.String(), "bucket", b)
}

func (w *shardWorker) ownershipChanged() {
	w.s.ownedN.Store(int64(len(w.lanes)))
	w.positionChanged()
	if w.s.cfg.OnOwnershipChange != nil {
		w.s.cfg.OnOwnershipChange(slices.Sorted(maps.Keys(w.lanes)))
	}
}

// positionChanged sets the lag gauge's position to the lowest checkpoint of the held buckets.
func (w *shardWorker) positionChanged() {
	low := w.s.sub.head.Load()
	for _, l := range w.lanes {
		low = min(low, l.cp)
	}
	w.s.sub.position.Store(low)
}

// horizon reads the log's head, the guard's pending writers, the held buckets as stored and
// the group's state, and returns the newest final position (-1 if none yet).
func (w *shardWorker) horizon(ctx context.Context) (int64, error) {
	var (
		still           []string
		head            int64
		buckets         []int32
		cps             []int64
		live, claimable int64
		s               = w.s
		q               = s.sub.store.q
		held            = map[int]int64{}
	)
	if err := w.conn.QueryRow(ctx, q.shardHorizon, s.cfg.Name, w.pending(), [16]byte(w.id)).Scan(
		&still, &head, &w.replay, &buckets, &cps, &live, &claimable); err != nil {
		return 0, fmt.Errorf("read horizon: %w", err)
	}
	s.sub.head.Store(head)
	for i, b := range buckets {
		held[int(b)] = cps[i]
	}
	w.follow(ctx, held, false)
	if int(live) != w.live || (claimable > 0 && len(w.lanes) < w.quota) {
		w.due = true // a member joined or left, or a bucket is free
	}
	floor := head // with no bucket held, nothing to fence for
	for _, l := range w.lanes {
		floor = min(floor, l.at)
	}
	safe, err := w.advance(ctx, w.conn, q.fence, still, head, floor)
	if err != nil {
		return 0, err
	}
	return safe, nil
}

// catchUp handles the held buckets' events up to the newest final position, one page of the
// log at a time (the events of all held buckets, BatchSize per bucket held) and one
// transaction per bucket with events in the page, rebalancing between transactions when due.
func (w *shardWorker) catchUp(ctx context.Context) error {
	s := w.s
	for w.stop.Err() == nil {
		if w.renewDue() {
			if err := w.rebalance(ctx); err != nil {
				return err
			}
		}
		safe, err := w.horizon(ctx)
		if err != nil {
			return fmt.Errorf("run sharded subscription %s: %w", s.cfg.Name, err)
		}
		if w.renewDue() {
			// The horizon saw a member join or leave, or a bucket free: rebalance now, not
			// after the next wait, so a dead worker's buckets move within its lease and one
			// poll.
			if err := w.rebalance(ctx); err != nil {
				return err
			}
		}
		if w.replay && len(w.lanes) > 0 {
			l := w.lanes[slices.Min(slices.Collect(maps.Keys(w.lanes)))]
			if err := l.replayDeadLetters(ctx); err != nil {
				return err
			}
		}
		lanes := w.sortedLanes()
		from := safe
		for _, l := range lanes {
			from = min(from, l.at)
		}
		if len(lanes) == 0 || from >= safe {
			return nil
		}
		if err := w.page(ctx, lanes, from, safe); err != nil {
			return err
		}
	}
	return nil
}

// rebalance runs reconcile; a failed statement (a deadlock with a Rebuild, a serialization
// failure) keeps the buckets held so far and is retried on the next pass.
func (w *shardWorker) rebalance(ctx context.Context) error {
	err := w.reconcile(ctx)
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) && ctx.Err() == nil {
		w.s.cfg.Logger.WarnContext(ctx, "keiro: sharded subscription rebalance failed; retrying on the next pass",
			"subscription", w.s.cfg.Name, "worker", w.id.String(), "error", err)
		w.renewed, w.due = time.Now(), false
		return nil
	}
	if err != nil {
		return fmt.Errorf("run sharded subscription %s: %w", w.s.cfg.Name, err)
	}
	return nil
}

func (w *shardWorker) sortedLanes() []*shardLane {
	out := make([]*shardLane, 0, len(w.lanes))
	for _, b := range slices.Sorted(maps.Keys(w.lanes)) {
		out = append(out, w.lanes[b])
	}
	return out
}

// maxShardPage bounds the events a worker reads in one page (all its buckets together), unless
// BatchSize is larger.
const maxShardPage = 4096

// page reads the events of the held buckets in (from, safe] (up to BatchSize per bucket, at
// most maxShardPage in all) and
// hands each bucket's share to its lane. A short page means the range is exhausted, so every
// lane moves to safe; otherwise to the page's last position.
func (w *shardWorker) page(ctx context.Context, lanes []*shardLane, from, safe int64) error {
	s := w.s
	sub := s.sub
	buckets := make([]int32, len(lanes))
	for i, l := range lanes {
		buckets[i] = int32(l.bucket)
	}
	limit := min(sub.cfg.BatchSize*len(lanes), max(sub.cfg.BatchSize, maxShardPage))
	var (
		rows pgx.Rows
		err  error
	)
	if sub.cfg.Category == "" {
		rows, err = w.conn.Query(ctx, sub.store.q.shardReadAll, from, safe, limit, "", buckets, s.cfg.Buckets)
	} else {
		rows, err = w.conn.Query(ctx, sub.store.q.shardReadCategory, from, safe, limit, sub.cfg.Category, buckets, s.cfg.Buckets)
	}
	if err != nil {
		return fmt.Errorf("run sharded subscription %s: read log: %w", s.cfg.Name, err)
	}
	byBucket := map[int][]RecordedEvent{}
	n, last := 0, from
	for rows.Next() {
		var b int32
		e, err := scanRecorded(rows, &b)
		if err != nil {
			rows.Close()
			return fmt.Errorf("run sharded subscription %s: read log: %w", s.cfg.Name, err)
		}
		byBucket[int(b)] = append(byBucket[int(b)], e)
		n, last = n+1, e.GlobalPosition
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("run sharded subscription %s: read log: %w", s.cfg.Name, err)
	}
	next := safe
	if n == limit {
		next = last
	}
	for _, l := range lanes {
		if w.stop.Err() != nil {
			return nil
		}
		if w.lanes[l.bucket] != l {
			continue // shed or lost during this page
		}
		evs := byBucket[l.bucket]
		for len(evs) > 0 && evs[0].GlobalPosition <= l.at {
			evs = evs[1:]
		}
		if len(evs) == 0 {
			l.at = max(l.at, next)
			continue
		}
		if w.renewDue() {
			if err := w.rebalance(ctx); err != nil {
				return err
			}
			if w.lanes[l.bucket] != l {
				continue
			}
		}
		err := l.handle(ctx, evs, next)
		if errors.Is(err, errLeaseLost) {
			delete(w.lanes, l.bucket)
			w.lostBucket(ctx, l.bucket)
			w.ownershipChanged()
			w.due = true
			continue
		}
		if err != nil {
			return err
		}
		if l.cp == next || l.cp == evs[len(evs)-1].GlobalPosition {
			l.at = max(l.at, next)
		} else {
			l.at = l.cp // the checkpoint moved (Rebuild): read again from it
		}
	}
	return nil
}

// wait blocks until a notification, the poll interval (shorter while fences are pending),
// the next renewal, or ctx's end. A rebalancing notification of this subscription makes the
// next pass rebalance first.
func (w *shardWorker) wait(ctx context.Context) error {
	d := w.guard.wait(w.s.sub.cfg.PollInterval)
	d = min(d, max(time.Millisecond, w.s.cfg.RenewInterval-time.Since(w.renewed)))
	payloads, err := waitNotification(ctx, w.conn, d, !w.s.cfg.DisableListen)
	if err != nil {
		return fmt.Errorf("run sharded subscription %s: %w", w.s.cfg.Name, err)
	}
	if slices.Contains(payloads, w.s.notifyPayload()) {
		w.due = true
	}
	return nil
}

// leave releases every bucket this worker holds and ends its membership, waking the others.
// It needs no session state, so it runs on another of the pool's connections if the worker's
// own fails.
func (w *shardWorker) leave(ctx context.Context) error {
	err := w.leaveOn(ctx, w.conn)
	if err != nil {
		err = w.leaveOn(ctx, w.s.sub.pool)
	}
	return err
}

func (w *shardWorker) leaveOn(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}) error {
	s := w.s
	q := s.sub.store.q
	var released []int32
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, q.shardRelease, s.cfg.Name, [16]byte(w.id), nil)
		if err != nil {
			return err
		}
		if released, err = pgx.CollectRows(rows, pgx.RowTo[int32]); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, q.shardLeave, s.cfg.Name, [16]byte(w.id)); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, q.shardNotify, s.notifyPayload())
		return err
	})
	if err != nil {
		return fmt.Errorf("leave: %w", err)
	}
	if len(released) > 0 {
		s.released.Add(ctx, int64(len(released)), s.sub.nameAttr)
	}
	clear(w.lanes)
	w.ownershipChanged()
	return nil
}

// fairShare is the number of buckets of n the member at rank (0-based, in worker-id order) of
// live members holds: n/live, plus one for the first n%live members. The shares add up to n.
func fairShare(n, live, rank int) int {
	if live < 1 {
		return n
	}
	share := n / live
	if rank < n%live {
		share++
	}
	return share
}

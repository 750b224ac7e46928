package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/backoff"
	"github.com/keiro-go/keiro/outbox/internal/claimsql"
	"github.com/keiro-go/keiro/outbox/internal/shares"
	"github.com/keiro-go/keiro/outbox/internal/sleep"
)

// claimRetryBackoff spaces the claims of a relay whose last claim failed (PostgreSQL down or
// refusing): short at first, so a blip costs little, and at most 5s apart during an outage.
var claimRetryBackoff = keiro.Backoff{Initial: 50 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2}

// claimLoop claims batches while slots are free, waking on notifications, marks and polls.
// ClaimConcurrency of them run at once; the extra ones only while claims come back full.
//
// A claim is not cancelled when ctx (stop) is: cancelling it could lose the reply of a claim
// that committed, leaving its rows publishing, unmarked, until their lease expires (a halt or a
// shutdown would stall their keys for a lease). It runs under hard (cancelled at the shutdown
// deadline) and its batch always enters the pipeline, which releases it unproduced after a stop.
func (r *engine) claimLoop(ctx, hard context.Context, extra bool, slots chan struct{}, out chan<- *claimedBatch) {
	c := &claimer{r: r, hard: hard, extra: extra, slots: slots, out: out, poll: time.NewTimer(0)}
	defer c.poll.Stop()
	// The first claimer of a listening relay sleeps under the sleep lock, so producers notify
	// only while it sleeps (internal/sleep, sleepLockAll in internal/sqlq).
	if !extra && !r.cfg.PollOnly {
		c.sl = sleep.New(r.pool.Config().ConnConfig, r.store.q, len(r.cfg.Destinations) > 0, r.signal)
		defer c.sl.Close()
	}
	for c.takeSlot(ctx) && c.step(ctx) {
	}
}

// claimer is one claim loop's state.
type claimer struct {
	r     *engine
	hard  context.Context
	extra bool
	slots chan struct{}
	out   chan<- *claimedBatch
	poll  *time.Timer
	sl    *sleep.Sleeper // the first claimer's, unless PollOnly

	dbBackoff     int
	lastUnbounded time.Time
	deepFull      bool // the last full-backlog scan came back full
	// deepFrom is where the next full-backlog scan starts in key order (sqlClaimKeys): after
	// the keys the last one took, so scans do not walk again the keys in flight.
	deepFrom claimsql.KeyCursor
	// preferOwn: the last claim came back full, so the backlog is deep enough for the relays
	// to split; the next claim prefers this relay's claim shares (internal/shares), unless a claim of
	// them came back empty before ownDryUntil.
	preferOwn   bool
	ownDryUntil time.Time
}

// takeSlot waits for the claimer's turn: a backlog (an extra claimer) and a free in-flight
// slot. It reports false when the relay is stopping.
func (c *claimer) takeSlot(ctx context.Context) bool {
	r := c.r
	// An extra claimer works only while the outbox is backlogged (the last claim was full):
	// in a steady trickle one claimer answers every notification and two would only race
	// for the same few rows.
	for c.extra && !r.backlogged.Load() {
		select {
		case <-r.backlog:
		case <-ctx.Done():
			return false
		}
	}
	select {
	case c.slots <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	if ctx.Err() != nil { // both were ready: select chose the slot
		<-c.slots
		return false
	}
	if !c.extra {
		// A wake-up that came before this claim is answered by it; leaving it buffered
		// would buy one more (possibly empty, with a deep backlog costly) claim after it.
		select {
		case <-r.wake:
		default:
		}
	}
	return true
}

// step claims once with the slot taken, passes the batch on, and waits when there is nothing
// more to claim. It reports false when the relay is stopping.
func (c *claimer) step(ctx context.Context) bool {
	r := c.r
	t0 := r.now() // the lease starts no earlier than this
	signalsBefore := r.signals.Load()
	token, rows, scan, err := c.claim(ctx, t0)
	if err != nil {
		return c.claimFailed(ctx, err)
	}
	c.dbBackoff = 0
	c.note(rows, scan)
	if len(rows) > 0 {
		c.send(ctx, token, rows, t0)
		if len(rows) == r.cfg.BatchSize {
			return true // more is likely waiting
		}
	} else {
		<-c.slots
	}
	if c.extra {
		// Wake-ups and polls are the first claimer's: an extra claimer that took one would
		// only go back to waiting for a backlog, and the wake-up would be lost.
		if len(rows) == 0 {
			// Concurrent claims can all come back empty: each skips the rows the others
			// hold locked and drops the rows behind them. The first claimer may have come
			// back empty because of this claim and gone to sleep: have it look again.
			r.signal()
		}
		return true
	}
	if r.signals.Load() != signalsBefore {
		// A batch finished or rows arrived while this claim ran: its snapshot may predate
		// them, and the wake-up may have gone to a claimer that is now busy (or been
		// dropped, the channel holds one). Claim again rather than sleep until the poll.
		return true
	}
	return c.wait(ctx)
}

// claimScan is where a claim that scanned the whole backlog started (scanAll); zero for a claim
// bounded by its budget.
type claimScan struct {
	all  bool
	from claimsql.KeyCursor
}

// claim runs the next claim statement (more than one when the first finds nothing where it
// looked).
//
// A claim looks only as far as a full batch behind every other batch in flight: when the keys
// near the front are all in flight (a backlog over few keys), an unbounded claim walks the
// whole backlog to find nothing, and the first claimer did so after every full claim (a drain
// over 100 keys ran at 2.8k msgs/s). The first claimer still scans everything once per poll
// interval, so a row behind a blocked front (keys in backoff) waits at most that long, and
// keeps doing so while those scans come back full, so a long blocked front does not slow the
// rows behind it.
func (c *claimer) claim(ctx context.Context, t0 time.Time) (envelope.UUID, []claimsql.Row, claimScan, error) {
	r := c.r
	budget := r.cfg.MaxInFlightBatches * r.cfg.BatchSize
	mask := r.claimShares(c.preferOwn, c.ownDryUntil)
	sc := claimScan{all: !c.extra && (c.deepFull || time.Since(c.lastUnbounded) >= r.cfg.PollInterval)}
	if sc.all {
		sc.from, budget = c.deepFrom, 0
	}
	token, rows, err := r.claimBatch(c.hard, budget, mask, sc.from)
	if err == nil && len(rows) == 0 && sc.from != (claimsql.KeyCursor{}) {
		// The scan past the front ran off the end of the keys: start over at the first.
		r.stats.claims.Add(1)
		sc.from = claimsql.KeyCursor{}
		token, rows, err = r.claimBatch(c.hard, budget, mask, sc.from)
	}
	if err == nil && len(rows) == 0 && mask != shares.All {
		// Its own shares are drained: the rest of the backlog is anyone's (orphaned shares,
		// a dead relay's rows before the others take its shares, the tail of a drain).
		c.ownDryUntil = r.now().Add(r.cfg.PollInterval)
		r.stats.sharesDrained.Add(1)
		r.stats.claims.Add(1)
		token, rows, err = r.claimBatch(c.hard, budget, shares.All, sc.from)
	}
	if sc.all {
		// From the scan's end: a scan that took longer than the poll interval must not
		// make the next claim a full scan too.
		c.lastUnbounded = time.Now()
	}
	r.log.DebugContext(ctx, "claimed", "rows", len(rows), "took", r.now().Sub(t0), "err", err)
	r.stats.claims.Add(1)
	return token, rows, sc, err
}

// claimFailed frees the slot of a failed claim and waits before the next (claimRetryBackoff).
// It reports false when the relay is stopping.
func (c *claimer) claimFailed(ctx context.Context, err error) bool {
	r := c.r
	<-c.slots
	if ctx.Err() != nil {
		return false
	}
	r.stats.claimErrors.Add(1)
	c.dbBackoff++
	d := claimRetryBackoff.Delay(c.dbBackoff)
	r.log.WarnContext(ctx, "claim failed; retrying", "err", err, "retry_in", d)
	return backoff.Sleep(ctx, d) == nil
}

// note records what a claim of rows says of the backlog: whether the next claim prefers the
// relay's shares, where the next full scan starts, and whether the extra claimers work.
func (c *claimer) note(rows []claimsql.Row, sc claimScan) {
	r := c.r
	full := len(rows) == r.cfg.BatchSize
	c.preferOwn = full
	if sc.all {
		// The next scan past the front resumes after the keys this one took; one that
		// came back short ran off the end of the keys and the next starts over (at once,
		// if this one did not start at the first key).
		c.deepFull = full || sc.from != claimsql.KeyCursor{}
		c.deepFrom = claimsql.KeyCursor{}
		if full {
			c.deepFrom = claimsql.LastKey(rows)
		}
	}
	if full != r.backlogged.Load() {
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
}

// send passes a claimed batch on to the producer; its lease is renewed from now on.
func (c *claimer) send(ctx context.Context, token envelope.UUID, rows []claimsql.Row, t0 time.Time) {
	r := c.r
	b := &claimedBatch{token: token, rows: rows, results: make([]produceResult, len(rows)), leasedAt: t0}
	r.flying.Store(b, struct{}{})
	if c.sl != nil {
		r.wakeUp(ctx, c.sl) // busy: producers need not notify
	}
	r.stats.claimed.Add(int64(len(rows)))
	r.inst.BatchSize.Record(ctx, int64(len(rows)))
	r.inFlight.Add(1)
	c.out <- b
}

// wait waits for a notification, a finished batch or the poll interval, under the sleep lock
// when the first claimer can take it. It reports false when the relay is stopping.
func (c *claimer) wait(ctx context.Context) bool {
	r := c.r
	switch r.prepareSleep(ctx, c.sl) {
	case sleepStop:
		return false
	case sleepClaim:
		return true
	}
	if !c.poll.Stop() {
		select {
		case <-c.poll.C:
		default:
		}
	}
	c.poll.Reset(r.cfg.PollInterval)
	select {
	case <-ctx.Done():
		return false
	case <-r.wake:
	case <-c.poll.C:
	}
	if c.sl != nil {
		r.wakeUp(ctx, c.sl)
	}
	return true
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
// (sleepLockAll in internal/sqlq): it takes the lock, then has the claimer claim once more, since
// producers that committed before did not notify. While a producer that did not notify is
// still in its transaction the lock cannot be taken: it waits a little and has the claimer
// claim again. When another relay that publishes every destination sleeps under the lock,
// producers notify and that relay claims whatever this one could: this relay sleeps without
// it. A relay restricted to some destinations cannot count on another (it may cover other
// destinations) and keeps trying. Without the lock's session the relay claims and retries the
// lock with a short backoff (sleep.RetryMax) until a new session takes it.
func (r *engine) prepareSleep(ctx context.Context, sl *sleep.Sleeper) sleepAction {
	if sl == nil || sl.Held() || !r.listening.Load() {
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
	wasFailing := sl.Failing()
	got, err := sl.Try(ctx)
	if err == nil && wasFailing {
		r.log.InfoContext(ctx, "sleep lock available again")
	}
	switch {
	case err != nil:
		if ctx.Err() != nil {
			return sleepStop
		}
		if !wasFailing {
			r.log.WarnContext(ctx, "sleep lock unavailable; claiming and retrying it until it is back (producers do not notify meanwhile)",
				"err", err, "retry_max", min(sleep.RetryMax, r.cfg.PollInterval))
		}
		// A session that died (a terminated backend, a failover) usually comes back with the
		// next connection: retry soon rather than sleep a whole poll interval without the lock,
		// during which producers do not notify.
		if alive, _ := waitWake(ctx, r.wake, sl.RetryIn(r.cfg.PollInterval)); !alive {
			return sleepStop
		}
		return sleepClaim
	case got == sleep.Taken:
		return sleepClaim
	case got == sleep.Relay && !sl.Filtered():
		return sleepWait
	}
	if alive, _ := waitWake(ctx, r.wake, sl.RetryIn(r.cfg.PollInterval)); !alive {
		return sleepStop
	}
	return sleepClaim
}

// wakeUp releases the sleep lock, if held: producers stop notifying. The relay is working
// again, so its next failed try starts over at the shortest retry.
func (r *engine) wakeUp(ctx context.Context, sl *sleep.Sleeper) {
	if err := sl.Release(ctx); err != nil && ctx.Err() == nil {
		r.log.WarnContext(ctx, "sleep lock release failed; its session was closed", "err", err)
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

// claimShares is the restriction of the next claim: the relay's own shares while it prefers
// them (the backlog is deep, they were not found drained lately, it holds some but not all),
// else every share.
func (r *engine) claimShares(preferOwn bool, ownDryUntil time.Time) shares.Mask {
	if !preferOwn || r.shares == nil || r.now().Before(ownDryUntil) {
		return shares.All
	}
	if m := r.shares.Shares(); m != 0 {
		return m
	}
	return shares.All
}

// claim runs one claim on a connection of its own, first releasing the rows of earlier claims
// whose reply was lost. The claim token is made here, by the relay, so the relay knows which
// rows such a claim may hold: a claim that fails after it was sent is remembered with its
// token and its backend, and its rows are released as soon as the database answers again and
// that backend is gone (a live one could still commit it), instead of after a lease. mask
// restricts the claim to some claim shares (shares.All: none); the scan budget, counted over every
// share, is then scaled to look as deep into them, and a batch deeper. from is where a scan past the front starts
// in key order (claimsql.KeyCursor).
func (r *engine) claimBatch(ctx context.Context, budget int, mask shares.Mask, from claimsql.KeyCursor) (envelope.UUID, []claimsql.Row, error) {
	if r.claimHook != nil {
		r.claimHook()
	}
	r.releaseLostClaims(ctx)
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return envelope.UUID{}, nil, fmt.Errorf("claim outbox batch: %w", err)
	}
	defer conn.Release()
	pid := conn.Conn().PgConn().PID()
	if mask != shares.All {
		r.stats.shareClaims.Add(1)
		// With N relays N times the batches in flight sit at the front: the budget is scaled
		// so that the relay's own part of the rows scanned holds them and a batch more.
		if budget > 0 {
			budget = (budget + r.cfg.BatchSize) * shares.Count / max(mask.Count(), 1)
		}
	}
	sent := r.now()
	token, rows, err := r.claims.ClaimIn(ctx, conn, r.cfg.Policy, r.cfg.BatchSize, r.cfg.Lease, r.cfg.MaxAttempts,
		r.cfg.Destinations, budget, mask, from)
	if err != nil && mayHaveCommitted(err) {
		r.lostMu.Lock()
		r.lost = append(r.lost, lostClaim{token: token, pid: pid, at: sent})
		r.lostMu.Unlock()
	}
	return token, rows, err
}

// mayHaveCommitted reports whether a claim that failed with err may still have committed: not
// when nothing was sent, nor when PostgreSQL answered with an error (the transaction then
// rolled back); a broken connection, a FATAL or a cancelled wait leaves it unknown.
func mayHaveCommitted(err error) bool {
	if pgconn.SafeToRetry(err) {
		return false
	}
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) || pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC"
}

// releaseLostClaims releases the rows of the claims whose reply was lost. A claim is forgotten
// once its rows are released, or once its lease has run out (its rows are claimable again
// anyway); it is kept while its backend still runs or the release fails, and retried at the
// next claim.
func (r *engine) releaseLostClaims(ctx context.Context) {
	r.lostMu.Lock()
	lost := r.lost
	r.lost = nil
	r.lostMu.Unlock()
	var keep []lostClaim
	for _, c := range lost {
		if r.now().Sub(c.at) >= r.cfg.Lease {
			continue
		}
		alive, n, err := r.claims.ReleaseLostClaim(ctx, r.pool, c.token, c.pid)
		switch {
		case err != nil:
			r.log.DebugContext(ctx, "release of a lost claim's rows failed; retrying", "token", c.token, "err", err)
			keep = append(keep, c)
		case alive:
			keep = append(keep, c)
		case n > 0:
			r.stats.released.Add(n)
			r.log.WarnContext(ctx, "a claim committed but its reply was lost; released its rows", "token", c.token, "rows", n)
		}
	}
	if len(keep) > 0 {
		r.lostMu.Lock()
		r.lost = append(r.lost, keep...)
		r.lostMu.Unlock()
	}
}

// renewLeases extends the lease of every batch in flight for over a third of the lease, so that
// no other relay takes over rows this one is still publishing (a slow or unreachable broker, a
// queue of batches behind a slow one, a mark retried through a database outage): a take-over
// would use an attempt — an outage could kill rows — and publish the rows twice. A relay that
// dies stops renewing, and its rows come back after at most one lease.
func (r *engine) renewLeases(ctx context.Context) {
	t := time.NewTicker(r.cfg.Lease / 6)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if r.frozen.Load() {
			continue
		}
		r.flying.Range(func(k, _ any) bool {
			b := k.(*claimedBatch)
			b.mu.Lock()
			due := r.now().Sub(b.leasedAt) >= r.cfg.Lease/3 // marks too: one retried through an outage
			b.mu.Unlock()
			if due {
				r.extendLease(ctx, b)
			}
			return ctx.Err() == nil
		})
	}
}

// extendLease extends b's lease by one Lease from now.
func (r *engine) extendLease(ctx context.Context, b *claimedBatch) {
	ids := make([][16]byte, 0, len(b.rows))
	for i := range b.rows {
		if !b.rows[i].Dead {
			ids = append(ids, b.rows[i].ID)
		}
	}
	if len(ids) == 0 {
		return
	}
	at := r.now() // the renewed lease starts no earlier than this
	actx, cancel := context.WithTimeout(ctx, r.cfg.Lease/3)
	n, err := r.claims.RenewLease(actx, r.pool, b.token, ids, r.cfg.Lease)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			r.log.WarnContext(ctx, "could not extend the lease of a batch in flight; retrying", "err", err, "rows", len(ids))
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
		r.log.WarnContext(ctx, "a batch in flight lost its lease: another relay may publish its rows too",
			"rows", lost, "lease", r.cfg.Lease)
	}
}

// leaseMargin is the part of a lease a batch must still hold, by the relay's clock, for its rows
// to be flushed: a quarter. Renewals keep a batch's confirmed lease at most about half a lease
// old, so a healthy relay never comes near it; a relay that was paused (SIGSTOP, a long GC
// pause) or cut off from PostgreSQL past it has lost, or is about to lose, its
// rows to another relay, and publishing them could put an old copy after their key's later
// rows. The margin covers the time from the check to the records' arrival at the broker.
const leaseMargin = 4

// leaseHeld reports whether b still holds its lease with the margin, at now: no renewal found
// its rows taken over, and less than Lease - Lease/leaseMargin passed since the lease was last
// confirmed (the claim, or the last renewal). The caller holds b.mu.
func (r *engine) leaseHeld(b *claimedBatch, now time.Time) bool {
	return !b.lost && now.Sub(b.leasedAt) < r.cfg.Lease-r.cfg.Lease/leaseMargin
}

// listenRetryBackoff spaces the reconnects of a relay's lost LISTEN connection; the relay polls
// meanwhile, so a reconnect is never urgent and the retries are at most 5s apart.
var listenRetryBackoff = keiro.Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2}

// listen holds a LISTEN connection and signals the claim loop on every notification; it
// reconnects with backoff when the connection dies. The connection carries the relay's
// [ApplicationName], so the relay is seen in pg_stat_activity (and counted by the console)
// however its pool is configured.
func (r *engine) listen(ctx context.Context) {
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

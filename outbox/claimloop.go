package outbox

import (
	"context"
	"time"

	"github.com/keiro-go/keiro/internal/backoff"
	"github.com/keiro-go/keiro/outbox/internal/shares"
	"github.com/keiro-go/keiro/outbox/internal/sleep"
)

// claimRetryBackoff spaces the claims of a relay whose last claim failed (PostgreSQL down or
// refusing): short at first, so a blip costs little, and at most 5s apart during an outage.
var claimRetryBackoff = Backoff{Initial: 50 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2}

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
	// only while it sleeps (internal/sleep, sleepLockAll in internal/sqlq).
	var sl *sleep.Sleeper
	if !extra && !r.cfg.PollOnly {
		sl = sleep.New(r.pool.Config().ConnConfig, r.store.q, len(r.cfg.Destinations) > 0, r.signal)
		defer sl.Close()
	}
	var dbBackoff int
	var lastUnbounded time.Time
	var deepFull bool // the last full-backlog scan came back full
	// deepFrom is where the next full-backlog scan starts in key order (sqlClaimKeys): after
	// the keys the last one took, so scans do not walk again the keys in flight.
	var deepFrom keyCursor
	// preferOwn: the last claim came back full, so the backlog is deep enough for the relays
	// to split; the next claim prefers this relay's claim shares (internal/shares), unless a claim of
	// them came back empty before ownDryUntil.
	var preferOwn bool
	var ownDryUntil time.Time
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
		t0 := r.now() // the lease starts no earlier than this
		signalsBefore := r.signals.Load()
		// A claim looks only as far as a full batch behind every other batch in flight: when
		// the keys near the front are all in flight (a backlog over few keys), an unbounded
		// claim walks the whole backlog to find nothing, and the first claimer did so after
		// every full claim (a drain over 100 keys ran at 2.8k msgs/s). The first claimer
		// still scans everything once per poll interval, so a row behind a blocked front
		// (keys in backoff) waits at most that long, and keeps doing so while those scans
		// come back full, so a long blocked front does not slow the rows behind it.
		budget := r.cfg.MaxInFlightBatches * r.cfg.BatchSize
		mask := r.claimShares(preferOwn, ownDryUntil)
		scanAll := !extra && (deepFull || time.Since(lastUnbounded) >= r.cfg.PollInterval)
		from := keyCursor{}
		if scanAll {
			from = deepFrom
		}
		if scanAll {
			budget = 0
		}
		token, rows, err := r.claim(hard, budget, mask, from)
		if err == nil && len(rows) == 0 && from != (keyCursor{}) {
			// The scan past the front ran off the end of the keys: start over at the first.
			r.stats.claims.Add(1)
			from = keyCursor{}
			token, rows, err = r.claim(hard, budget, mask, from)
		}
		if err == nil && len(rows) == 0 && mask != shares.All {
			// Its own shares are drained: the rest of the backlog is anyone's (orphaned shares,
			// a dead relay's rows before the others take its shares, the tail of a drain).
			ownDryUntil = r.now().Add(r.cfg.PollInterval)
			r.stats.sharesDrained.Add(1)
			r.stats.claims.Add(1)
			token, rows, err = r.claim(hard, budget, shares.All, from)
		}
		if scanAll {
			// From the scan's end: a scan that took longer than the poll interval must not
			// make the next claim a full scan too.
			lastUnbounded = time.Now()
		}
		r.log.DebugContext(ctx, "claimed", "rows", len(rows), "took", r.now().Sub(t0), "err", err)
		r.stats.claims.Add(1)
		if err != nil {
			<-slots
			if ctx.Err() != nil {
				return
			}
			r.stats.claimErrors.Add(1)
			dbBackoff++
			d := claimRetryBackoff.Delay(dbBackoff)
			r.log.WarnContext(ctx, "claim failed; retrying", "err", err, "retry_in", d)
			if backoff.Sleep(ctx, d) != nil {
				return
			}
			continue
		}
		dbBackoff = 0
		preferOwn = len(rows) == r.cfg.BatchSize
		if scanAll {
			// The next scan past the front resumes after the keys this one took; one that
			// came back short ran off the end of the keys and the next starts over (at once,
			// if this one did not start at the first key).
			deepFull = len(rows) == r.cfg.BatchSize || from != keyCursor{}
			deepFrom = keyCursor{}
			if len(rows) == r.cfg.BatchSize {
				deepFrom = lastKey(rows)
			}
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
// (sleepLockAll in internal/sqlq): it takes the lock, then has the claimer claim once more, since
// producers that committed before did not notify. While a producer that did not notify is
// still in its transaction the lock cannot be taken: it waits a little and has the claimer
// claim again. When another relay that publishes every destination sleeps under the lock,
// producers notify and that relay claims whatever this one could: this relay sleeps without
// it. A relay restricted to some destinations cannot count on another (it may cover other
// destinations) and keeps trying. Without the lock's session the relay claims and retries the
// lock with a short backoff (sleep.RetryMax) until a new session takes it.
func (r *Relay) prepareSleep(ctx context.Context, sl *sleep.Sleeper) sleepAction {
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
func (r *Relay) wakeUp(ctx context.Context, sl *sleep.Sleeper) {
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
func (r *Relay) claimShares(preferOwn bool, ownDryUntil time.Time) shares.Mask {
	if !preferOwn || r.shares == nil || r.now().Before(ownDryUntil) {
		return shares.All
	}
	if m := r.shares.Shares(); m != 0 {
		return m
	}
	return shares.All
}

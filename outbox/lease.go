package outbox

import (
	"context"
	"time"
)

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
			due := r.now().Sub(b.leasedAt) >= r.cfg.Lease/3 // marks too: one retried through an outage
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
	at := r.now() // the renewed lease starts no earlier than this
	actx, cancel := context.WithTimeout(ctx, r.cfg.Lease/3)
	n, err := r.store.renewLease(actx, r.pool, b.token, ids, r.cfg.Lease)
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
func (r *Relay) leaseHeld(b *batch, now time.Time) bool {
	return !b.lost && now.Sub(b.leasedAt) < r.cfg.Lease-r.cfg.Lease/leaseMargin
}

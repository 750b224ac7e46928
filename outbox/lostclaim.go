package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/shares"
)

// lostClaim is a claim whose reply did not arrive (the connection broke, the backend was
// terminated): it may have committed, leaving its rows publishing under its token with a lease
// that nobody renews, and their keys stalled until it expires.
type lostClaim struct {
	token envelope.UUID
	pid   uint32    // the backend that ran it
	at    time.Time // when it was sent, on the relay's clock
}

// claim runs one claim on a connection of its own, first releasing the rows of earlier claims
// whose reply was lost. The claim token is made here, by the relay, so the relay knows which
// rows such a claim may hold: a claim that fails after it was sent is remembered with its
// token and its backend, and its rows are released as soon as the database answers again and
// that backend is gone (a live one could still commit it), instead of after a lease. mask
// restricts the claim to some claim shares (shares.All: none); the scan budget, counted over every
// share, is then scaled to look as deep into them, and a batch deeper. from is where a scan past the front starts
// in key order (keyCursor).
func (r *Relay) claim(ctx context.Context, budget int, mask shares.Mask, from keyCursor) (envelope.UUID, []claimedRow, error) {
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
	token, rows, err := r.store.claimIn(ctx, conn, r.cfg.Policy, r.cfg.BatchSize, r.cfg.Lease, r.cfg.MaxAttempts,
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
func (r *Relay) releaseLostClaims(ctx context.Context) {
	r.lostMu.Lock()
	lost := r.lost
	r.lost = nil
	r.lostMu.Unlock()
	var keep []lostClaim
	for _, c := range lost {
		if r.now().Sub(c.at) >= r.cfg.Lease {
			continue
		}
		alive, n, err := r.store.releaseLostClaim(ctx, r.pool, c.token, c.pid)
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

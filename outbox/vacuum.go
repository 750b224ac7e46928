package outbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// The relay's own vacuum of the outbox table (RelayConfig.VacuumThreshold).
//
// Every row the relay publishes leaves dead entries in the outbox's partial indexes
// (keiro_outbox_claim_idx and keiro_outbox_head_of_line_idx hold open rows only, and a sent
// row leaves them by an update), in front of its key's head, until a vacuum removes them. A
// claim's descent to a key's head steps over every dead entry in front of it, so while a deep
// backlog over few keys drains (10,000 rows a key after a broker outage), each claim costs more
// the further the drain got. Autovacuum comes at most once a minute and, with its default
// scale factor, after a fifth of the table has died: on a fresh million-row backlog the first
// minute drained at a fraction of its rate. The relay does not wait for it: once the table
// holds VacuumThreshold dead row versions, it vacuums the table itself.
//
// The check costs one catalog lookup, made only after the relay has moved a quarter of the
// threshold out of the backlog since its last check, so a quiet outbox is never looked at.
// VACUUM (SKIP_LOCKED) does nothing if another relay or autovacuum is vacuuming the table
// already; it blocks no reads or writes. A role that does not own the table cannot vacuum
// it: the relay says so once and leaves the table to autovacuum.

const (
	// DefaultVacuumThreshold is the number of dead row versions in the outbox table at which
	// the relay vacuums it (RelayConfig.VacuumThreshold).
	DefaultVacuumThreshold = 100_000
	// vacuumCheckInterval is how often the relay compares what it moved out of the backlog
	// since its last look with the threshold.
	vacuumCheckInterval = time.Second
	// vacuumRecheck is how long after a look that found too few dead rows the relay looks
	// again if it has moved any row meanwhile (the table's statistics lag by up to ~10 s).
	vacuumRecheck = 10 * time.Second
)

// sqlVacuumCheck reads the outbox table's dead row versions ($1 is its quoted name) and
// whether the relay's role may vacuum it (it owns the table, or is a member of its owner).
const sqlVacuumCheck = `
SELECT coalesce(pg_stat_get_dead_tuples(c.oid), 0), pg_has_role(c.relowner, 'USAGE')
FROM pg_class c WHERE c.oid = $1::regclass`

// vacuumLoop vacuums the outbox table whenever it holds VacuumThreshold dead row versions,
// looking only after the relay has moved rows out of the backlog (see above).
func (r *Relay) vacuumLoop(ctx context.Context) {
	threshold := r.cfg.VacuumThreshold
	if threshold < 0 {
		return
	}
	table := pgx.Identifier{r.cfg.Schema, "keiro_outbox"}.Sanitize()
	checkEvery := max(threshold/4, 1)
	moved := func() int64 {
		return r.stats.published.Load() + r.stats.dead.Load() + r.stats.rejected.Load()
	}
	last, lastAt := moved(), time.Now()
	t := time.NewTicker(vacuumCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := moved() - last
		if n < checkEvery && (n == 0 || time.Since(lastAt) < vacuumRecheck) {
			continue
		}
		last, lastAt = moved(), time.Now()
		var dead int64
		var allowed bool
		if err := r.pool.QueryRow(ctx, sqlVacuumCheck, table).Scan(&dead, &allowed); err != nil {
			if ctx.Err() == nil {
				r.log.DebugContext(ctx, "outbox vacuum check failed", "err", err)
			}
			continue
		}
		if !allowed {
			r.log.InfoContext(ctx, "the relay's role does not own the outbox table, so it leaves vacuuming it to autovacuum; "+
				"a deep backlog over few keys then drains slower until autovacuum runs (see VacuumThreshold)",
				"table", table)
			return
		}
		if dead < threshold {
			continue
		}
		start := time.Now()
		if err := r.vacuum(ctx, table); err != nil {
			if ctx.Err() == nil {
				r.log.WarnContext(ctx, "outbox vacuum failed", "table", table, "err", err)
			}
			continue
		}
		r.stats.vacuums.Add(1)
		r.log.DebugContext(ctx, "outbox vacuumed", "dead_before", dead, "took", time.Since(start))
	}
}

// vacuum vacuums table on a connection of its own, so a vacuum of a large table (about a second
// for a million rows) holds none of the pool's connections the claims and marks use. The
// toast table is left out: the relay's updates never touch a payload.
func (r *Relay) vacuum(ctx context.Context, table string) error {
	conn, err := pgx.ConnectConfig(ctx, ownConnConfig(r.pool, r.cfg.Schema))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON, PROCESS_TOAST FALSE) "+table)
	return err
}

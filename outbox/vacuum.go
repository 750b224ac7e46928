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
// minute drained at a fraction of its rate. The relay does not wait for it: while its claims
// come back full (the backlog is deep), once the table holds VacuumThreshold dead row versions,
// or as many rows inserted since its last vacuum (a fresh backlog), it vacuums the table
// itself, and refreshes its statistics in the same pass. In a trickle the table is left to
// autovacuum, whose cost a small backlog does not repay.
//
// The check costs one catalog lookup, made when a backlog starts and then only after the relay
// has moved a quarter of the threshold out of it since its last check. VACUUM (SKIP_LOCKED)
// does nothing if another relay or autovacuum is vacuuming the table already; it blocks no
// reads or writes. A role that does not own the table cannot vacuum it: the relay says so once
// and leaves the table to autovacuum.

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

// sqlVacuumCheck reads the outbox table's dead row versions and the rows inserted since its
// last vacuum ($1 is its quoted name), and whether the relay's role may vacuum it (it owns the
// table, or is a member of its owner).
const sqlVacuumCheck = `
SELECT coalesce(pg_stat_get_dead_tuples(c.oid), 0), coalesce(pg_stat_get_ins_since_vacuum(c.oid), 0),
    pg_has_role(c.relowner, 'USAGE')
FROM pg_class c WHERE c.oid = $1::regclass`

// vacuumLoop vacuums the outbox table while the backlog is deep (the relay's claims come back
// full) and the table holds VacuumThreshold dead row versions, or as many rows inserted since
// its last vacuum (a fresh backlog: its pages carry no hint bits and no visibility, so every
// claim's lookups visit the heap until a vacuum has passed). It looks at the table once when a
// backlog starts, then only after the relay has moved rows out of it (see above); in a trickle
// the table is autovacuum's.
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
	var checked bool // the table was looked at during this backlog
	var last int64
	var lastAt time.Time
	v := &vacuumer{r: r}
	defer v.close(ctx)
	t := time.NewTicker(vacuumCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !r.backlogged.Load() {
			checked = false
			continue
		}
		n := moved() - last
		if checked && n < checkEvery && (n == 0 || time.Since(lastAt) < vacuumRecheck) {
			continue
		}
		checked, last, lastAt = true, moved(), time.Now()
		var dead, inserted int64
		var allowed bool
		if err := r.pool.QueryRow(ctx, sqlVacuumCheck, table).Scan(&dead, &inserted, &allowed); err != nil {
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
		if dead < threshold && inserted < threshold {
			continue
		}
		start := time.Now()
		if err := v.vacuum(ctx, table); err != nil {
			if ctx.Err() == nil {
				r.log.WarnContext(ctx, "outbox vacuum failed", "table", table, "err", err)
			}
			continue
		}
		r.stats.vacuums.Add(1)
		r.log.DebugContext(ctx, "outbox vacuumed", "dead_before", dead, "inserted_before", inserted, "took", time.Since(start))
	}
}

// vacuumer runs the relay's vacuums on a session of its own, opened at the first and kept
// until the relay stops, so a vacuum of a large table (about a second for a million rows)
// holds none of the pool's connections the claims and marks use.
type vacuumer struct {
	r    *Relay
	conn *pgx.Conn
}

// vacuum vacuums table. The toast table is left out (the relay's updates never touch a
// payload); the statistics are refreshed in the same pass, so the claims' plans know the
// backlog's keys. A failed session is closed and the next vacuum opens another.
func (v *vacuumer) vacuum(ctx context.Context, table string) error {
	if v.conn == nil {
		conn, err := pgx.ConnectConfig(ctx, ownConnConfig(v.r.pool, v.r.cfg.Schema))
		if err != nil {
			return err
		}
		v.conn = conn
	}
	_, err := v.conn.Exec(ctx, "VACUUM (ANALYZE, SKIP_LOCKED, INDEX_CLEANUP ON, PROCESS_TOAST FALSE) "+table)
	if err != nil {
		v.close(ctx)
	}
	return err
}

// close closes the vacuum session, if open.
func (v *vacuumer) close(ctx context.Context) {
	if v.conn != nil {
		_ = v.conn.Close(context.WithoutCancel(ctx))
		v.conn = nil
	}
}

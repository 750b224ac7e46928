// Package vacuum is the relay's own vacuum of the outbox table (RelayConfig.VacuumThreshold).
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
package vacuum

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// checkInterval is how often the loop compares what the relay moved out of the backlog
	// since its last look with the threshold.
	checkInterval = time.Second
	// recheck is how long after a look that found too few dead rows the loop looks again if
	// the relay has moved any row meanwhile (the table's statistics lag by up to ~10 s).
	recheck = 10 * time.Second
)

// sqlCheck reads the outbox table's dead row versions and the rows inserted since its last
// vacuum ($1 is its quoted name), and whether the relay's role may vacuum it (it owns the
// table, or is a member of its owner).
const sqlCheck = `
SELECT coalesce(pg_stat_get_dead_tuples(c.oid), 0), coalesce(pg_stat_get_ins_since_vacuum(c.oid), 0),
    pg_has_role(c.relowner, 'USAGE')
FROM pg_class c WHERE c.oid = $1::regclass`

// Config is what the vacuum loop of one relay needs.
type Config struct {
	// Pool runs the checks.
	Pool *pgxpool.Pool
	// ConnConfig connects the vacuum's own session.
	ConnConfig *pgx.ConnConfig
	// Schema is the outbox's schema.
	Schema string
	// Threshold is the number of dead row versions (or of rows inserted since the last
	// vacuum) at which the table is vacuumed; negative disables the loop.
	Threshold int64
	// Moved returns the number of rows the relay has moved out of the backlog so far
	// (published, dead, rejected).
	Moved func() int64
	// Backlogged reports whether the relay's claims come back full (the backlog is deep).
	Backlogged func() bool
	// Logger receives the loop's lines.
	Logger *slog.Logger
	// Vacuums counts the vacuums done.
	Vacuums *atomic.Int64
}

// Run vacuums the outbox table while the backlog is deep and the table holds cfg.Threshold
// dead row versions, or as many rows inserted since its last vacuum (a fresh backlog: its
// pages carry no hint bits and no visibility, so every claim's lookups visit the heap until a
// vacuum has passed), until ctx ends. It looks at the table once when a backlog starts, then
// only after the relay has moved rows out of it (see the package doc); in a trickle the table
// is autovacuum's.
func Run(ctx context.Context, cfg Config) {
	threshold := cfg.Threshold
	if threshold < 0 {
		return
	}
	table := pgx.Identifier{cfg.Schema, "keiro_outbox"}.Sanitize()
	checkEvery := max(threshold/4, 1)
	var checked bool // the table was looked at during this backlog
	var last int64
	var lastAt time.Time
	s := &session{cc: cfg.ConnConfig}
	defer s.close(ctx)
	t := time.NewTicker(checkInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !cfg.Backlogged() {
			checked = false
			continue
		}
		n := cfg.Moved() - last
		if checked && n < checkEvery && (n == 0 || time.Since(lastAt) < recheck) {
			continue
		}
		checked, last, lastAt = true, cfg.Moved(), time.Now()
		var dead, inserted int64
		var allowed bool
		if err := cfg.Pool.QueryRow(ctx, sqlCheck, table).Scan(&dead, &inserted, &allowed); err != nil {
			if ctx.Err() == nil {
				cfg.Logger.DebugContext(ctx, "outbox vacuum check failed", "err", err)
			}
			continue
		}
		if !allowed {
			cfg.Logger.InfoContext(ctx, "the relay's role does not own the outbox table, so it leaves vacuuming it to autovacuum; "+
				"a deep backlog over few keys then drains slower until autovacuum runs (see VacuumThreshold)",
				"table", table)
			return
		}
		if dead < threshold && inserted < threshold {
			continue
		}
		start := time.Now()
		if err := s.vacuum(ctx, table); err != nil {
			if ctx.Err() == nil {
				cfg.Logger.WarnContext(ctx, "outbox vacuum failed", "table", table, "err", err)
			}
			continue
		}
		cfg.Vacuums.Add(1)
		cfg.Logger.DebugContext(ctx, "outbox vacuumed", "dead_before", dead, "inserted_before", inserted, "took", time.Since(start))
	}
}

// session is the vacuums' session of their own, opened at the first and kept until the relay
// stops, so a vacuum of a large table (about a second for a million rows) holds none of the
// pool's connections the claims and marks use.
type session struct {
	cc   *pgx.ConnConfig
	conn *pgx.Conn
}

// vacuum vacuums table. The toast table is left out (the relay's updates never touch a
// payload); the statistics are refreshed in the same pass, so the claims' plans know the
// backlog's keys. A failed session is closed and the next vacuum opens another.
func (s *session) vacuum(ctx context.Context, table string) error {
	if s.conn == nil {
		conn, err := pgx.ConnectConfig(ctx, s.cc.Copy())
		if err != nil {
			return err
		}
		s.conn = conn
	}
	_, err := s.conn.Exec(ctx, "VACUUM (ANALYZE, SKIP_LOCKED, INDEX_CLEANUP ON, PROCESS_TOAST FALSE) "+table)
	if err != nil {
		s.close(ctx)
	}
	return err
}

// close closes the session, if open.
func (s *session) close(ctx context.Context) {
	if s.conn != nil {
		_ = s.conn.Close(context.WithoutCancel(ctx))
		s.conn = nil
	}
}

package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// walAttribution counts the WAL a run's schema caused, where pg_current_wal_lsn deltas count
// the whole cluster's (on a shared server other work adds to them, and more to a slower
// contender). It reads the WAL records between two positions with pg_walinspect and keeps the
// transactions that touched a relation of the schema (their commit records too) and the
// records of no transaction on those relations (such as a vacuum's). Replication slots'
// confirmations write no WAL of their own, so a log-mode reader's share is what it writes
// through SQL.
type walAttribution struct {
	fn string // the schema-qualified pg_get_wal_records_info
}

// newWALAttribution installs pg_walinspect in schema (dropped with it) unless the database has
// it already; nil when the server does not offer it (the figures are then cluster-wide).
func newWALAttribution(ctx context.Context, conn *pgx.Conn, schema string) *walAttribution {
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_walinspect SCHEMA "+schema); err != nil {
		return nil
	}
	var ns string
	if err := conn.QueryRow(ctx, `SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pg_walinspect'`).Scan(&ns); err != nil {
		return nil
	}
	return &walAttribution{fn: ns + ".pg_get_wal_records_info"}
}

// bytes returns the WAL bytes between from and to that belong to schema's relations.
func (w *walAttribution) bytes(ctx context.Context, conn *pgx.Conn, schema string, from, to int64) (int64, error) {
	rows, err := conn.Query(ctx, `SELECT c.relfilenode FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relfilenode <> 0
		UNION SELECT t.relfilenode FROM pg_class c JOIN pg_class t ON t.oid = c.reltoastrelid WHERE c.relnamespace = $1::regnamespace`, schema)
	if err != nil {
		return 0, fmt.Errorf("list the schema's relations: %w", err)
	}
	nodes, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	if err != nil {
		return 0, fmt.Errorf("list the schema's relations: %w", err)
	}
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = fmt.Sprint(n)
	}
	// A block reference reads "blkref #0: rel <tablespace>/<database>/<relfilenode> …".
	pattern := `rel \d+/\d+/(` + strings.Join(ids, "|") + `)\y`
	var n int64
	err = conn.QueryRow(ctx, `WITH r AS (
			SELECT xid, record_length, block_ref FROM `+w.fn+`('0/0'::pg_lsn + $1::numeric, '0/0'::pg_lsn + $2::numeric)),
		ours AS (SELECT DISTINCT xid FROM r WHERE xid <> '0' AND block_ref ~ $3)
		SELECT coalesce(sum(record_length), 0)::bigint FROM r
		WHERE xid IN (SELECT xid FROM ours) OR (xid = '0' AND block_ref ~ $3)`, from, to, pattern).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("read the WAL with pg_walinspect: %w", err)
	}
	return n, nil
}

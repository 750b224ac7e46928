package testenv

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro"
)

// WALMeter counts the WAL a benchmark's timed part wrote for one schema, where a difference of
// pg_current_wal_lsn counts the whole cluster's (on a shared server other work adds to it, and
// more to a slower contender). It reads the WAL records between its two positions with
// pg_walinspect and keeps the transactions that touched a relation of the schema (their commit
// records too) and the records of no transaction on those relations (a vacuum's, a prune's).
// Replication slots' confirmations write no WAL, so a log-mode relay's share is what it writes
// through SQL.
//
// The WAL it reads must still be on the server when it stops: a drain can write more than
// max_wal_size, and a checkpoint would recycle the first segments. So the meter holds them with
// a temporary physical replication slot of its session, which PostgreSQL drops when the session
// ends, however the benchmark ends. Give it one session for its whole life (a *pgx.Conn or an
// acquired *pgxpool.Conn) whose role may create replication slots:
//
//	conn, err := db.Pool.Acquire(ctx)
//	defer conn.Release()
//	m, err := testenv.StartWAL(ctx, conn, db.Schema)
//	// ... the timed part ...
//	f, err := m.Stop(ctx, conn)
//	b.ReportMetric(f.PerMessage(n), "wal-B/msg")
type WALMeter struct {
	schema string
	// slot holds the WAL from the start on ("" when the meter could not create it).
	slot string
	// fn is the schema-qualified pg_get_wal_records_info, "" when the server has no
	// pg_walinspect (the figures are then the cluster's).
	fn   string
	from int64
}

// WALFigures are what a WALMeter measured between StartWAL and Stop.
type WALFigures struct {
	// Schema is the WAL bytes of the schema's transactions and relations; Cluster the whole
	// cluster's between the same positions.
	Schema, Cluster int64
	// Attributed is false when the server offers no pg_walinspect: Schema is then Cluster.
	Attributed bool
}

// PerMessage is Schema in bytes per message, for n messages.
func (f WALFigures) PerMessage(n int) float64 { return float64(f.Schema) / float64(max(n, 1)) }

// StartWAL starts counting schema's WAL. It installs pg_walinspect in schema (dropped with it)
// unless the database has it already; without it (PostgreSQL before 15, or a server that does
// not ship it) the meter counts the cluster's WAL and says so in WALFigures.Attributed.
func StartWAL(ctx context.Context, db keiro.DB, schema string) (*WALMeter, error) {
	if _, ok := db.(*pgxpool.Pool); ok {
		// Its temporary slot would live on one of the pool's sessions and the drop could run
		// on another, where PostgreSQL refuses it.
		return nil, errors.New("testenv: StartWAL needs one session (a *pgx.Conn or an acquired *pgxpool.Conn), not a pool")
	}
	m := &WALMeter{schema: schema}
	if _, err := db.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_walinspect SCHEMA "+pgx.Identifier{schema}.Sanitize()); err == nil {
		var ns string
		if err := db.QueryRow(ctx, `SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pg_walinspect'`).Scan(&ns); err == nil {
			m.fn = ns + ".pg_get_wal_records_info"
		}
	}
	slot := "keiro_walmeter_" + strings.ToLower(rand.Text()) // lower-case letters and digits, as slot names want
	if _, err := db.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, true, true)`, slot); err != nil {
		return nil, fmt.Errorf("hold the WAL to measure with a temporary replication slot: %w", err)
	}
	m.slot = slot
	var err error
	m.from, err = walPosition(ctx, db)
	return m, err
}

// Stop ends the count and returns it. db must be the session StartWAL was given.
func (m *WALMeter) Stop(ctx context.Context, db keiro.DB) (f WALFigures, err error) {
	defer func() {
		if _, derr := db.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, m.slot); derr != nil && err == nil {
			err = fmt.Errorf("drop the WAL meter's replication slot: %w", derr)
		}
	}()
	to, err := walPosition(ctx, db)
	if err != nil {
		return WALFigures{}, err
	}
	f = WALFigures{Schema: to - m.from, Cluster: to - m.from}
	if m.fn == "" {
		return f, nil
	}
	rows, err := db.Query(ctx, `SELECT c.relfilenode FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relfilenode <> 0
		UNION SELECT t.relfilenode FROM pg_class c JOIN pg_class t ON t.oid = c.reltoastrelid WHERE c.relnamespace = $1::regnamespace`, m.schema)
	if err != nil {
		return f, fmt.Errorf("list the schema's relations: %w", err)
	}
	nodes, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	if err != nil {
		return f, fmt.Errorf("list the schema's relations: %w", err)
	}
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = fmt.Sprint(n)
	}
	// A block reference reads "blkref #0: rel <tablespace>/<database>/<relfilenode> …".
	pattern := `rel \d+/\d+/(` + strings.Join(ids, "|") + `)\y`
	err = db.QueryRow(ctx, `WITH r AS (
			SELECT xid, record_length, block_ref FROM `+m.fn+`('0/0'::pg_lsn + $1::numeric, '0/0'::pg_lsn + $2::numeric)),
		ours AS (SELECT DISTINCT xid FROM r WHERE xid <> '0' AND block_ref ~ $3)
		SELECT coalesce(sum(record_length), 0)::bigint FROM r
		WHERE xid IN (SELECT xid FROM ours) OR (xid = '0' AND block_ref ~ $3)`, m.from, to, pattern).Scan(&f.Schema)
	if err != nil {
		return f, fmt.Errorf("read the WAL with pg_walinspect: %w", err)
	}
	f.Attributed = true
	return f, nil
}

// walPosition returns the cluster's WAL position in bytes: the flushed one, which is as far as
// pg_walinspect reads ("cannot accept future end LSN" past it) and holds every committed
// transaction's records (a commit waits for its flush).
func walPosition(ctx context.Context, db keiro.DB) (int64, error) {
	var v int64
	if err := db.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')::bigint`).Scan(&v); err != nil {
		return 0, fmt.Errorf("read the WAL position: %w", err)
	}
	return v, nil
}

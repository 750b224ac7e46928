package logmode

import (
	"strings"

	"github.com/keiro-go/keiro/outbox/internal/logslot"
)

// The engine's statements. They run on the replication connection (replication=database
// accepts plain SQL in the simple query protocol, which has no parameters): the names
// placed into them are validated identifiers (Config.validate), never quoted user text.

// sqlFindPublication finds the publication {{publication}} and reads its row filter of
// keiro_outbox_log ("" for none; the view's rowfilter column exists from PostgreSQL 15 on,
// hence to_jsonb).
const sqlFindPublication = `SELECT coalesce((SELECT to_jsonb(t) ->> 'rowfilter' FROM pg_catalog.pg_publication_tables t
        WHERE t.pubname = p.pubname AND t.schemaname = '{{schema}}' AND t.tablename = 'keiro_outbox_log'), '')
FROM pg_catalog.pg_publication p WHERE p.pubname = '{{publication}}'`

// sqlCreatePublication publishes keiro_outbox_log's inserts, and nothing else: retention's
// deletes are not events. {{filter}} is logslot.RowFilter of the engine's destinations.
const sqlCreatePublication = `CREATE PUBLICATION {{publication}} FOR TABLE {{schema}}.keiro_outbox_log{{filter}}
WITH (publish = 'insert')`

// sqlRowFilters tells whether the server has publication row filters (PostgreSQL 15).
const sqlRowFilters = `SELECT current_setting('server_version_num')::int >= 150000`

// sqlFindSlot reads the slot's plugin, confirmed position and active reader, if the slot
// exists.
const sqlFindSlot = `SELECT plugin, coalesce(confirmed_flush_lsn::text, ''), coalesce(active_pid, 0)::text,
    coalesce(wal_status, '')
FROM pg_catalog.pg_replication_slots WHERE slot_name = '{{slot}}' AND database = current_database()`

// statement fills a statement's placeholders.
func (e *Engine) statement(sql string) string {
	return strings.NewReplacer("{{schema}}", e.cfg.Schema, "{{slot}}", e.cfg.Slot,
		"{{publication}}", e.cfg.Publication, "{{filter}}", logslot.RowFilter(e.cfg.Destinations)).Replace(sql)
}

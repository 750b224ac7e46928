package logmode

import "strings"

// The engine's statements. They run on the replication connection (replication=database
// accepts plain SQL in the simple query protocol, which has no parameters): the names
// placed into them are validated identifiers (Config.validate), never quoted user text.

// sqlFindPublication finds the publication {{publication}}.
const sqlFindPublication = `SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = '{{publication}}'`

// sqlCreatePublication publishes keiro_outbox_log's inserts, and nothing else: retention's
// deletes are not events.
const sqlCreatePublication = `CREATE PUBLICATION {{publication}} FOR TABLE {{schema}}.keiro_outbox_log
WITH (publish = 'insert')`

// sqlFindSlot reads the slot's plugin, confirmed position and active reader, if the slot
// exists.
const sqlFindSlot = `SELECT plugin, coalesce(confirmed_flush_lsn::text, ''), coalesce(active_pid, 0)::text,
    coalesce(wal_status, '')
FROM pg_catalog.pg_replication_slots WHERE slot_name = '{{slot}}' AND database = current_database()`

// statement fills a statement's placeholders.
func (e *Engine) statement(sql string) string {
	return strings.NewReplacer("{{schema}}", e.cfg.Schema, "{{slot}}", e.cfg.Slot,
		"{{publication}}", e.cfg.Publication).Replace(sql)
}

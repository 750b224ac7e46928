package logslot

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/keiro-go/keiro/internal/pgtext"
)

// The one verification of log mode's replication objects, shared by the Store (at a relay's
// start, SetModeFor, PrepareLogSlot: pgx through a Querier) and the engine (at every session:
// simple-protocol SQL on its replication connection). Both run the same statements, read
// every column as text, and judge with the same functions.

// SQLPublication reads the publication {{publication}} as ParsePublication needs it, one row
// or none when it does not exist: whether it is FOR ALL TABLES, whether it publishes inserts
// only, how many tables it publishes, up to five of those other than
// {{schema}}.keiro_outbox_log (for the message), whether it publishes that table, and the
// table's row filter ("" for none; pg_publication_tables has rowfilter from PostgreSQL 15 on,
// hence to_jsonb). {{schema}} and {{publication}} are validated identifiers (a schema name, a
// slot name), substituted by Statement.
const SQLPublication = `SELECT p.puballtables::text,
    (p.pubinsert AND NOT p.pubupdate AND NOT p.pubdelete AND NOT p.pubtruncate)::text,
    (SELECT count(*) FROM pg_catalog.pg_publication_tables t WHERE t.pubname = p.pubname)::text,
    coalesce((SELECT string_agg(format('%I.%I', o.schemaname, o.tablename), ', ')
              FROM (SELECT t.schemaname, t.tablename FROM pg_catalog.pg_publication_tables t
                    WHERE t.pubname = p.pubname
                      AND NOT (t.schemaname = '{{schema}}' AND t.tablename = 'keiro_outbox_log')
                    ORDER BY 1, 2 LIMIT 5) o), ''),
    EXISTS (SELECT 1 FROM pg_catalog.pg_publication_tables t WHERE t.pubname = p.pubname
            AND t.schemaname = '{{schema}}' AND t.tablename = 'keiro_outbox_log')::text,
    coalesce((SELECT to_jsonb(t) ->> 'rowfilter' FROM pg_catalog.pg_publication_tables t
              WHERE t.pubname = p.pubname AND t.schemaname = '{{schema}}' AND t.tablename = 'keiro_outbox_log'), '')
FROM pg_catalog.pg_publication p WHERE p.pubname = '{{publication}}'`

// SQLSlot reads the replication slot {{slot}} as ParseSlot needs it, one row or none when no
// slot of that name exists in the cluster (slot names are the cluster's, not a database's):
// its type, plugin and database, the current database, its confirmed position and active
// reader, its wal_status, and why it was invalidated ("" if it was not; invalidation_reason
// from PostgreSQL 17, conflicting from 16, read through to_jsonb on any version).
const SQLSlot = `SELECT s.slot_type::text, coalesce(s.plugin::text, ''), coalesce(s.database::text, ''),
    current_database()::text, coalesce(s.confirmed_flush_lsn::text, ''), coalesce(s.active_pid, 0)::text,
    coalesce(s.wal_status, ''),
    coalesce(to_jsonb(s) ->> 'invalidation_reason',
             CASE WHEN to_jsonb(s) ->> 'conflicting' = 'true' THEN 'conflicting with recovery' END, '')
FROM pg_catalog.pg_replication_slots s WHERE s.slot_name = '{{slot}}'`

// SQLCreatePublication creates the publication {{publication}} of {{schema}}.keiro_outbox_log's
// inserts of the destinations {{filter}} (RowFilter), and nothing else: retention's deletes
// are not events.
const SQLCreatePublication = `CREATE PUBLICATION {{publication}} FOR TABLE {{schema}}.keiro_outbox_log{{filter}} WITH (publish = 'insert')`

// SQLRepointPublication makes the publication {{publication}} publish {{schema}}.keiro_outbox_log
// with the row filter {{filter}} (RowFilter), and nothing else; SQLPublishInsertOnly makes it
// publish inserts only. They repair a publication of the relay's own (CheckPublication's
// Repair).
const (
	SQLRepointPublication = `ALTER PUBLICATION {{publication}} SET TABLE {{schema}}.keiro_outbox_log{{filter}}`
	SQLPublishInsertOnly  = `ALTER PUBLICATION {{publication}} SET (publish = 'insert')`
)

// Statement fills the placeholders of one of this package's statements: schema and name (the
// slot, which is also the publication) must be validated identifiers, dests valid topics.
func Statement(sql, schema, name string, dests []string) string {
	return pgtext.Expand(sql, "schema", schema, "slot", name, "publication", name, "filter", RowFilter(dests))
}

// Publication is a publication as SQLPublication reads it.
type Publication struct {
	// Name is the publication's name.
	Name string
	// AllTables is set for a publication FOR ALL TABLES.
	AllTables bool
	// InsertOnly is set when it publishes inserts and no other operation.
	InsertOnly bool
	// Tables counts the tables it publishes; Others names up to five of them other than the
	// schema's keiro_outbox_log.
	Tables int
	Others string
	// Ours is set when it publishes the schema's keiro_outbox_log, with RowFilter ("" for
	// none).
	Ours      bool
	RowFilter string
}

// ParsePublication reads SQLPublication's row (its six columns as text) of the publication
// name.
func ParsePublication(name string, cols []string) (Publication, error) {
	if len(cols) != 6 {
		return Publication{}, fmt.Errorf("publication %s: %d columns, want 6", name, len(cols))
	}
	n, err := strconv.Atoi(cols[2])
	if err != nil {
		return Publication{}, fmt.Errorf("publication %s: table count %q: %w", name, cols[2], err)
	}
	return Publication{Name: name, AllTables: cols[0] == "true", InsertOnly: cols[1] == "true", Tables: n,
		Others: cols[3], Ours: cols[4] == "true", RowFilter: cols[5]}, nil
}

// Verdict is what a log-mode relay does with its publication.
type Verdict int

const (
	// Use: the publication is as expected.
	Use Verdict = iota
	// Create: it does not exist.
	Create
	// Repair: it is the relay's own (named after its slot, no other table) but does not
	// publish what it should: re-point it (SQLRepointPublication, SQLPublishInsertOnly).
	Repair
	// Refuse: it is not the relay's to change (other tables, FOR ALL TABLES), or publishes
	// another destination set: the relay refuses to start.
	Refuse
)

// CheckPublication is the rule of a log-mode slot's publication p (nil: missing) for the
// schema's keiro_outbox_log and the destination set dests (nil: every destination). It must
// publish exactly that table, inserts only, with exactly dests' row filter. The verdict
// Refuse and Repair come with the one line that says what is wrong. lost is set, with Repair,
// when the publication gives the slot none of the table's inserts (it publishes no table: the
// table was dropped, as by a DROP SCHEMA … CASCADE and a new migration; or no inserts): the
// slot did not decode the events committed while it was so, and a relay whose schema is in log
// mode must not confirm past them (MissedError).
func CheckPublication(p *Publication, schema string, dests []string) (v Verdict, lost bool, err error) {
	if p == nil {
		return Create, false, nil
	}
	table := schema + ".keiro_outbox_log"
	switch {
	case p.AllTables:
		return Refuse, false, fmt.Errorf("publication %s publishes every table of the database (FOR ALL TABLES), not %s alone: it is not a keiro publication; drop it (DROP PUBLICATION %s) once nothing uses it, or give the relay another slot (LogSlot, --log-slot)",
			p.Name, table, p.Name)
	case p.Tables > 0 && (!p.Ours || p.Tables > 1):
		return Refuse, false, fmt.Errorf("publication %s publishes other tables (%s) than %s: it is not the relay's to change; remove them (ALTER PUBLICATION %s SET TABLE %s), or give the relay another slot (LogSlot, --log-slot)",
			p.Name, p.Others, table, p.Name, table)
	case p.Tables == 0:
		return Repair, true, fmt.Errorf("publication %s publishes no table: %s was dropped after its creation (the schema dropped and migrated again?)", p.Name, table)
	}
	if got, want := ParseRowFilter(p.RowFilter), Normalize(dests); !slices.Equal(got, want) {
		return Refuse, false, fmt.Errorf("publication %s publishes %s, and this relay %s: choose another slot (LogSlot, --log-slot), or drop the slot and the publication %s",
			p.Name, Describe(got), Describe(want), p.Name)
	}
	if !p.InsertOnly {
		return Repair, false, fmt.Errorf("publication %s publishes other operations than the inserts of %s", p.Name, table)
	}
	return Use, false, nil
}

// MissedError is the refusal of a publication CheckPublication found lost (problem is its
// line) while the schema is in log mode: the events committed since were written to
// keiro_outbox_log and not decoded by the slot. It says how to recover: repair the publication
// with `relay mode prepare`, then republish those events with `relay mode recover`.
func MissedError(problem error, slot string, dests []string) error {
	prepare, recover := " --log-slot="+slot, ""
	if set := Normalize(dests); len(set) > 0 {
		recover = " --destinations=" + strings.Join(set, ",")
		prepare += recover
	}
	return fmt.Errorf("%w, while the schema is in log mode: the slot did not decode the events written since, and the relay does not confirm past them; repair the publication with `relay mode prepare%s`, republish those events with `relay mode recover --since=<when the table was created again>%s`, then start the relay again",
		problem, prepare, recover)
}

// Slot is a replication slot as SQLSlot reads it.
type Slot struct {
	// Name is the slot's name.
	Name string
	// Type is logical or physical; Plugin its output plugin; Database its database, and
	// Current the database the reader is connected to.
	Type, Plugin, Database, Current string
	// Confirmed is its confirmed_flush_lsn ("" while it is being created).
	Confirmed string
	// ActivePID is the backend reading it; 0 for none.
	ActivePID int
	// WALStatus is pg_replication_slots.wal_status; Invalidated why PostgreSQL invalidated it
	// ("" if it did not).
	WALStatus, Invalidated string
}

// ParseSlot reads SQLSlot's row (its eight columns as text) of the slot name.
func ParseSlot(name string, cols []string) (Slot, error) {
	if len(cols) != 8 {
		return Slot{}, fmt.Errorf("replication slot %s: %d columns, want 8", name, len(cols))
	}
	pid, err := strconv.Atoi(cols[5])
	if err != nil {
		return Slot{}, fmt.Errorf("replication slot %s: active_pid %q: %w", name, cols[5], err)
	}
	return Slot{Name: name, Type: cols[0], Plugin: cols[1], Database: cols[2], Current: cols[3],
		Confirmed: cols[4], ActivePID: pid, WALStatus: cols[6], Invalidated: cols[7]}, nil
}

// ErrSlotInvalidated marks CheckSlot's refusal of a slot PostgreSQL invalidated.
var ErrSlotInvalidated = errors.New("replication slot invalidated")

// CheckSlot is the rule of a log-mode relay's existing slot s: a logical slot of the current
// database, of the plugin pgoutput, not invalidated. It returns the one line that says what is
// wrong and what to do, or nil.
func CheckSlot(s *Slot) error {
	switch {
	case s.Type != "logical":
		return fmt.Errorf("replication slot %s is a %s slot, not a logical one: it is not a keiro slot; give the relay another slot (LogSlot, --log-slot), or drop it (pg_drop_replication_slot) once nothing uses it",
			s.Name, s.Type)
	case s.Database != s.Current:
		return fmt.Errorf("replication slot %s belongs to the database %s, not to %s (slot names are the server's): give the relay another slot (LogSlot, --log-slot), or drop it there once no relay of that database reads it",
			s.Name, s.Database, s.Current)
	case s.Plugin != "pgoutput":
		return fmt.Errorf("replication slot %s uses the plugin %s, not pgoutput: it is not a keiro slot; give the relay another slot (LogSlot, --log-slot), or drop it once nothing uses it",
			s.Name, s.Plugin)
	case s.WALStatus == "lost" || s.Invalidated != "":
		why := s.Invalidated
		if why == "" {
			why = "wal_status lost: PostgreSQL removed WAL it had not confirmed"
		}
		return fmt.Errorf("%w: replication slot %s was invalidated (%s); drop it, start the relay (which creates it again), and republish the events it had not confirmed with `relay mode recover --since=<its last confirmed time>`",
			ErrSlotInvalidated, s.Name, why)
	}
	return nil
}

// Describe names a destination set in a message: nil is every destination.
func Describe(set []string) string {
	if len(set) == 0 {
		return "every destination"
	}
	return "the destinations " + strings.Join(set, ", ")
}

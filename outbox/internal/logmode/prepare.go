package logmode

import (
	"context"
	"errors"
	"fmt"

	"github.com/keiro-go/keiro/internal/pgdb"
)

// DefaultSlot is the slot (and publication) name of a schema's log mode: "<schema>_keiro_log".
func DefaultSlot(schema string) string { return schema + "_keiro_log" }

// Prepare creates, if they do not exist, the publication of schema's keiro_outbox_log inserts
// and the logical replication slot (pgoutput) that decodes it, on an ordinary connection (the
// role needs the REPLICATION attribute, or to own the table and be superuser on managed
// services that grant it). A slot decodes only the transactions that commit after its
// creation: it must exist before the schema's mode becomes 'log', which is why the switch
// (outbox.Store.SetMode) calls Prepare first. slot "" is DefaultSlot; the publication has
// the slot's name.
func Prepare(ctx context.Context, db pgdb.DB, schema, slot string) error {
	cfg := Config{Schema: schema, Slot: slot}.withDefaults()
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("prepare log mode: %w", err)
	}
	e := &Engine{cfg: cfg}
	var found bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = $1)`,
		cfg.Publication).Scan(&found); err != nil {
		return fmt.Errorf("prepare log mode: find publication %s: %w", cfg.Publication, err)
	}
	if !found {
		if _, err := db.Exec(ctx, e.statement(sqlCreatePublication)); err != nil && !isDuplicate(err) {
			return fmt.Errorf("prepare log mode: create publication %s: %w", cfg.Publication, err)
		}
	}
	_, err := db.Exec(ctx, `SELECT pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput')
WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = $1)`, cfg.Slot)
	if err != nil && !isDuplicate(err) {
		if fatal(err) {
			err = errors.Join(err, errors.New("log mode needs wal_level = logical and a role with the REPLICATION attribute"))
		}
		return fmt.Errorf("prepare log mode: create replication slot %s: %w", cfg.Slot, err)
	}
	return nil
}

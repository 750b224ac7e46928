package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/keiro-go/keiro/outbox/internal/logmode"
)

// Mode is how a schema's outbox is published (docs/architecture.md, "Log mode").
type Mode string

const (
	// ModeClaim stores events in keiro_outbox, which relays claim and mark: works everywhere
	// (PgBouncer, no REPLICATION privilege, any wal_level). The default.
	ModeClaim Mode = "claim"
	// ModeLog stores events in the insert-only keiro_outbox_log, which a relay reads in commit
	// order through a logical replication slot: no per-row write after the insert. Needs
	// wal_level = logical and a role with the REPLICATION attribute.
	ModeLog Mode = "log"
)

// ParseMode parses "claim" or "log".
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeClaim, ModeLog:
		return m, nil
	}
	return "", fmt.Errorf("mode %q: want claim or log", s)
}

// DefaultLogSlot is the replication slot (and publication) of a schema's log mode when none is
// named: "<schema>_keiro_log".
func DefaultLogSlot(schema string) string { return logmode.DefaultSlot(schema) }

// Mode reads the schema's mode (migration 009's keiro_outbox_settings).
func (s *Store) Mode(ctx context.Context, q Querier) (Mode, error) {
	var m string
	if err := q.QueryRow(ctx, s.bind(sqlReadMode)).Scan(&m); err != nil {
		return "", fmt.Errorf("read outbox mode: %w", err)
	}
	return Mode(m), nil
}

// ModeChange is the result of [Store.SetMode].
type ModeChange struct {
	// From and To are the modes before and after.
	From, To Mode
	// LSN is the WAL position once the change committed: every event written in the old mode
	// is before it. After a switch from log back to claim, the log-mode relay has published
	// every event of keiro_outbox_log once its slot's confirmed_flush_lsn reaches LSN.
	LSN string
}

// SetMode switches the schema's mode for every producer at once, without a redeploy: the
// outbox's insert trigger routes each row by the mode it reads (EnqueueTx, EnqueueWithIDsTx,
// <schema>.enqueue and plain INSERTs alike write the same envelope in both modes). The change
// waits for the transactions writing the outbox and holds new writers back until it commits,
// so no transaction writes under both modes.
//
// Switching to ModeLog first creates the publication and the slot (slot "" is
// [DefaultLogSlot]) so that the slot decodes every event written after the switch; the role
// needs the REPLICATION attribute. Rows still pending in keiro_outbox are published by a relay
// in log mode before it follows the slot (RelayConfig.Mode). Switching back to ModeClaim
// leaves the slot: the log-mode relay publishes what it holds (until its confirmed position
// reaches the returned LSN); drop the slot once no relay runs in log mode (a slot nobody reads
// makes PostgreSQL keep WAL).
func (s *Store) SetMode(ctx context.Context, db Querier, mode Mode, slot string) (ModeChange, error) {
	if _, err := ParseMode(string(mode)); err != nil {
		return ModeChange{}, fmt.Errorf("set outbox mode: %w", err)
	}
	if mode == ModeLog {
		if err := logmode.Prepare(ctx, db, s.schema, slot); err != nil {
			return ModeChange{}, fmt.Errorf("set outbox mode: %w", err)
		}
	}
	var from string
	err := func() error {
		tx, err := db.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if err := tx.QueryRow(ctx, s.bind(sqlReadMode)).Scan(&from); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.bind(sqlSetMode), string(mode)); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}()
	if err != nil {
		return ModeChange{}, fmt.Errorf("set outbox mode %s: %w", mode, err)
	}
	var lsn string
	if err := db.QueryRow(ctx, `SELECT pg_catalog.pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		return ModeChange{}, errors.Join(fmt.Errorf("set outbox mode %s: read the WAL position", mode), err)
	}
	return ModeChange{From: Mode(from), To: mode, LSN: lsn}, nil
}

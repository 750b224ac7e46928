package outbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
func DefaultLogSlot(schema string) string { return schema + "_keiro_log" }

// slotName is what a slot or publication name may be: PostgreSQL's slot-name rule, so the
// name needs no quoting in the replication protocol.
var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// Mode reads the schema's mode (migration 009's keiro_outbox_settings).
func (s *Store) Mode(ctx context.Context, q Querier) (Mode, error) {
	var m string
	if err := q.QueryRow(ctx, s.q.ReadMode).Scan(&m); err != nil {
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
		if err := s.prepareLog(ctx, db, slot); err != nil {
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
		// The row lock serializes concurrent changes (relays started together with
		// --mode=log each switch the schema): the later ones read the mode the first set
		// and change nothing, so they take no fence.
		if err := tx.QueryRow(ctx, s.q.ReadModeForUpdate).Scan(&from); err != nil {
			return err
		}
		if Mode(from) == mode {
			return tx.Commit(ctx)
		}
		if _, err := tx.Exec(ctx, s.q.SetMode, string(mode)); err != nil {
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

// prepareLog creates, if they do not exist, the publication of keiro_outbox_log's inserts and
// the logical replication slot (pgoutput) of log mode, both named slot ("" is DefaultLogSlot).
// A slot decodes only the transactions that commit after its creation: it must exist before
// the mode becomes 'log'.
func (s *Store) prepareLog(ctx context.Context, db Querier, slot string) error {
	if slot == "" {
		slot = DefaultLogSlot(s.schema)
	}
	if !slotName.MatchString(slot) {
		return fmt.Errorf("slot %q: must be 1 to 63 lower case letters, digits or underscores", slot)
	}
	var found bool
	if err := db.QueryRow(ctx, s.q.FindPublication, slot).Scan(&found); err != nil {
		return fmt.Errorf("find publication %s: %w", slot, err)
	}
	if !found {
		stmt := strings.ReplaceAll(s.q.CreatePublication, "{{publication}}", slot)
		// Another relay creating it at the same moment: duplicate_object, or the catalog's
		// unique index (unique_violation on pg_publication_pubname_index).
		if _, err := db.Exec(ctx, stmt); err != nil && !isPgCode(err, "42710") && !isPgCode(err, "23505") {
			return fmt.Errorf("create publication %s: %w", slot, err)
		}
	}
	if _, err := db.Exec(ctx, s.q.CreateSlot, slot); err != nil && !isPgCode(err, "42710") {
		if isPgCode(err, "55000") || isPgCode(err, "42501") {
			err = errors.Join(err, errors.New("log mode needs wal_level = logical and a role with the REPLICATION attribute"))
		}
		return fmt.Errorf("create replication slot %s: %w", slot, err)
	}
	return nil
}

// isPgCode reports a PostgreSQL error of SQLSTATE code.
func isPgCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// SlotStatus is the state of a log-mode replication slot (pg_replication_slots): what the WAL
// guard watches.
type SlotStatus struct {
	// Slot is the slot's name; Exists is false when there is no such slot (the other fields
	// are then zero).
	Slot   string `json:"slot"`
	Exists bool   `json:"exists"`
	// ActivePID is the backend of the relay reading the slot; 0 when none does (every relay is
	// down, or on its way to take over).
	ActivePID int `json:"active_pid"`
	// ConfirmedFlushLSN is the position the relay confirmed: every event committed before it
	// was acknowledged by Kafka.
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn"`
	// RetainedBytes is the WAL PostgreSQL keeps for the slot (from its restart_lsn to the
	// current WAL position): it grows while the relay is down or slow.
	RetainedBytes int64 `json:"retained_bytes"`
	// WALStatus is reserved, extended, unreserved or lost (lost: PostgreSQL removed WAL the
	// slot needed, past max_slot_wal_keep_size; the slot is invalid).
	WALStatus string `json:"wal_status"`
	// SafeWALSize is how many more bytes of WAL can be written before the slot is in danger
	// of losing WAL; nil when max_slot_wal_keep_size is -1 (unlimited).
	SafeWALSize *int64 `json:"safe_wal_size"`
}

// LogSlotStatus reads the log-mode slot's state (slot "" is DefaultLogSlot).
func (s *Store) LogSlotStatus(ctx context.Context, q Querier, slot string) (SlotStatus, error) {
	if slot == "" {
		slot = DefaultLogSlot(s.schema)
	}
	st := SlotStatus{Slot: slot}
	err := q.QueryRow(ctx, s.q.SlotStatus, slot).Scan(&st.ActivePID, &st.ConfirmedFlushLSN, &st.RetainedBytes,
		&st.WALStatus, &st.SafeWALSize)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("read replication slot %s: %w", slot, err)
	}
	st.Exists = true
	return st, nil
}

// LogRecovery reports a Store.RecoverLog.
type LogRecovery struct {
	// Found counts the rows of keiro_outbox_log in the range.
	Found int64
	// Copied counts those copied into keiro_outbox to be published again; the others were
	// already there (a dead letter, a row from before a switch, an earlier recovery).
	Copied int64
}

// RecoverLog republishes the events of keiro_outbox_log written from since to before until:
// it copies them into keiro_outbox as failed rows due now, in the order they were written, and
// the claim loop (which a log-mode relay runs beside the slot) publishes them. It is the
// recovery of a slot that was lost (invalidated past max_slot_wal_keep_size, dropped, or not
// carried over by a failover) with events it had not confirmed: choose since at or before the
// last time the slot was known to confirm (its relay's last status, or the incident's start).
// Events that had reached Kafka are published again with the same message ids, which the
// inbox dedupes; per key they follow the order they were written in, not their commit order,
// and may come after the key's newer events from the new slot. Events already in keiro_outbox
// are skipped, so a second recovery of the same range copies nothing.
func (s *Store) RecoverLog(ctx context.Context, q Querier, since, until time.Time) (LogRecovery, error) {
	var r LogRecovery
	if !until.After(since) {
		return r, fmt.Errorf("recover keiro_outbox_log: until (%s) must be after since (%s)",
			until.Format(time.RFC3339), since.Format(time.RFC3339))
	}
	if err := q.QueryRow(ctx, s.q.RecoverLog, since, until).Scan(&r.Found, &r.Copied); err != nil {
		return r, fmt.Errorf("recover keiro_outbox_log: %w", err)
	}
	return r, nil
}

package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/outbox/internal/logslot"
	"github.com/keiro-go/keiro/outbox/internal/modes"
)

// Mode is how a schema's outbox is published (docs/architecture.md, "Log mode").
type Mode string

const (
	// ModeClaim stores events in keiro_outbox, which relays claim and mark: works everywhere
	// (PgBouncer, no REPLICATION privilege, any wal_level). The default.
	ModeClaim Mode = modes.Claim
	// ModeLog stores events in the insert-only keiro_outbox_log, which a relay reads in commit
	// order through a logical replication slot: no per-row write after the insert. Needs
	// wal_level = logical and a role with the REPLICATION attribute.
	ModeLog Mode = modes.Log
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
// named and the relay publishes every destination: "<schema>_keiro_log". It is
// LogSlotFor(schema, nil).
func DefaultLogSlot(schema string) string { return logslot.Name(schema, nil) }

// LogSlotFor is the replication slot (and publication) of a log-mode relay restricted to
// destinations (RelayConfig.Destinations) when LogSlot is not set: DefaultLogSlot(schema) for
// none, and "<schema>_keiro_log_<hash>" for a set, hash being 12 hexadecimal digits of the
// SHA-256 of the sorted, deduplicated destinations. Relays with the same set, in any order,
// share the slot (one reads it, the others wait on standby). The name is a valid slot name
// for a schema of at most 40 characters; set LogSlot for a longer one.
func LogSlotFor(schema string, destinations []string) string {
	return logslot.Name(schema, destinations)
}

// Mode reads the schema's mode (migration 009's keiro_outbox_settings).
func (a *Admin) Mode(ctx context.Context, q keiro.DB) (Mode, error) {
	m, err := a.modes().Mode(ctx, q)
	return Mode(m), err
}

// ModeChange is the result of [Admin.SetMode].
type ModeChange struct {
	// From and To are the modes before and after.
	From, To Mode
	// Slot is the log-mode slot the change prepared (To is ModeLog), and SlotCreated whether
	// the change created it. A slot created while the schema was already in log mode (From
	// ModeLog) decodes only the transactions that commit after its creation: the events of its
	// destinations written since the switch (Changed) are not in it, and Admin.RecoverLogFor
	// republishes them (a log-mode relay that read claim mode before its switch found the
	// schema switched by another does so itself).
	Slot        string
	SlotCreated bool
	// Changed is when the schema entered the mode From (keiro_outbox_settings.changed_at):
	// for a From of ModeLog, the switch to log mode.
	Changed time.Time
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
func (a *Admin) SetMode(ctx context.Context, db keiro.DB, mode Mode, slot string) (ModeChange, error) {
	return a.SetModeFor(ctx, db, mode, slot, nil)
}

// SetModeFor is SetMode for the relays restricted to destinations (RelayConfig.Destinations):
// switching to ModeLog prepares the slot of that set (slot "" is LogSlotFor(schema,
// destinations)), whose publication gives it only the rows of those destinations (a row
// filter: PostgreSQL 15 or later). It refuses a set that overlaps another log-mode slot of the
// schema (see Admin.LogSlots): two slots would publish the same events. With several
// destination groups, prepare every group's slot before the switch (PrepareLogSlot), so that
// each decodes every event of its destinations written after it.
func (a *Admin) SetModeFor(ctx context.Context, db keiro.DB, mode Mode, slot string, destinations []string) (ModeChange, error) {
	if _, err := ParseMode(string(mode)); err != nil {
		return ModeChange{}, fmt.Errorf("set outbox mode: %w", err)
	}
	c, err := a.modes().SetMode(ctx, db, string(mode), slot, destinations)
	return ModeChange{From: Mode(c.From), To: Mode(c.To), Slot: c.Slot, SlotCreated: c.SlotCreated, Changed: c.Changed, LSN: c.LSN}, err
}

// PrepareLogSlot creates, if they do not exist, the publication and the replication slot of a
// log-mode relay restricted to destinations (nil: every destination; slot "" is
// LogSlotFor(schema, destinations)), without changing the mode, and returns the slot's name
// and whether it created the slot. Run it for each destination group before the switch to log
// mode: a slot decodes only what commits after its creation. It refuses a set that overlaps
// another log-mode slot of the schema, and an existing publication or slot that is not the
// relay's (see PrepareLog).
func (a *Admin) PrepareLogSlot(ctx context.Context, db keiro.DB, slot string, destinations []string) (string, bool, error) {
	p, err := a.PrepareLog(ctx, db, slot, destinations)
	return p.Slot, p.SlotCreated, err
}

// LogPrepared reports a Admin.PrepareLog.
type LogPrepared struct {
	// Slot is the slot's name, and SlotCreated whether PrepareLog created it.
	Slot        string
	SlotCreated bool
	// PublicationRepaired is set when the slot's publication published none of
	// keiro_outbox_log's inserts (the table was dropped after its creation, as by a DROP
	// SCHEMA … CASCADE and a new migration) and was re-pointed at the table. In log mode the
	// events written meanwhile were not decoded by the slot: republish them with
	// Admin.RecoverLogFor (`relay mode recover`).
	PublicationRepaired bool
}

// PrepareLog is PrepareLogSlot with its full report. It verifies what exists (logslot's rule,
// the one the log-mode relay applies at every session): the slot must be a logical slot of
// this database, of the plugin pgoutput, not invalidated; the publication must publish
// exactly the schema's keiro_outbox_log, inserts only, with the row filter of destinations.
// It repairs the publication of its own that does not (named after the slot, no other
// table), and refuses, with the line that says what to do, a publication with other tables
// or FOR ALL TABLES, another destination set, or a slot of another kind, plugin or database.
func (a *Admin) PrepareLog(ctx context.Context, db keiro.DB, slot string, destinations []string) (LogPrepared, error) {
	p, err := a.prepareLog(ctx, db, slot, destinations, always)
	if err != nil {
		return p, fmt.Errorf("prepare the log-mode slot: %w", err)
	}
	return p, nil
}

// prepareLog creates, if they do not exist, the publication of keiro_outbox_log's inserts of
// destinations (a row filter; nil: every destination) and the logical replication slot
// (pgoutput) of log mode, both named slot ("" is LogSlotFor(schema, destinations)), and
// verifies them when they exist (logslot.CheckPublication, logslot.CheckSlot). A slot decodes
// only the transactions that commit after its creation: it must exist before the mode becomes
// 'log'. A publication that lost its table is repaired when repairLost reports true (before
// the switch, or an operator's PrepareLog; it is asked only then) and refused otherwise (logslot.MissedError: a relay's
// start in log mode must not confirm past the events its slot did not decode).
func (a *Admin) prepareLog(ctx context.Context, db keiro.DB, slot string, destinations []string, repairLost func() (bool, error)) (LogPrepared, error) {
	p, err := a.modes().PrepareLog(ctx, db, slot, destinations, repairLost)
	return LogPrepared(p), err
}

// modes is the implementation of the schema's mode and slots.
func (a *Admin) modes() modes.Schema {
	return modes.Schema{Name: a.schema, Q: a.q, SlotWait: a.slotWait}
}

// always is prepareLog's repairLost for an operator's repair (a relay's start in log mode
// refuses instead: internal/logstart).
func always() (bool, error) { return true, nil }

// ErrLogSlotOverlap reports a log-mode slot whose destinations overlap another slot's of the
// schema (a relay without Destinations overlaps every other): both would publish the same
// events. The relay refuses to start.
var ErrLogSlotOverlap = modes.ErrSlotOverlap

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
	// Destinations are the destinations the slot's publication gives it (its row filter);
	// empty for every destination. Only Admin.LogSlots fills it.
	Destinations []string `json:"destinations,omitempty"`
	// TransactionalID is the Kafka transactional id of the slot's relays with ExactlyOnce:
	// "keiro-relay-log.<system identifier>.<database>.<slot>". Each relay that takes the slot
	// over initializes it, which fences the one before.
	TransactionalID string `json:"transactional_id,omitempty"`
}

// LogSlots reads every log-mode slot of the schema: one per publication of its
// keiro_outbox_log (keiro names a slot after its publication), in name order, with the
// destinations the publication gives it. A publication whose slot does not exist is listed
// with Exists false. Retention of keiro_outbox_log deletes only what every existing one has
// confirmed.
func (a *Admin) LogSlots(ctx context.Context, q keiro.DB) ([]SlotStatus, error) {
	slots, err := a.modes().Slots(ctx, q)
	out := make([]SlotStatus, len(slots))
	for i, st := range slots {
		out[i] = SlotStatus(st)
	}
	if slots == nil {
		out = nil
	}
	return out, err
}

// LogSlotStatus reads the log-mode slot's state (slot "" is DefaultLogSlot).
func (a *Admin) LogSlotStatus(ctx context.Context, q keiro.DB, slot string) (SlotStatus, error) {
	if slot == "" {
		slot = DefaultLogSlot(a.schema)
	}
	st, err := a.modes().SlotStatus(ctx, q, slot)
	return SlotStatus(st), err
}

// LogRecovery reports a Admin.RecoverLog.
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
func (a *Admin) RecoverLog(ctx context.Context, q keiro.DB, since, until time.Time) (LogRecovery, error) {
	return a.RecoverLogFor(ctx, q, since, until, nil)
}

// RecoverLogFor is RecoverLog restricted to the events of destinations (nil: all): the
// recovery of a per-destination relay's slot (RelayConfig.Destinations), which republishes
// none of the other slots' events.
func (a *Admin) RecoverLogFor(ctx context.Context, q keiro.DB, since, until time.Time, destinations []string) (LogRecovery, error) {
	r, err := a.modes().Recover(ctx, q, since, until, destinations)
	return LogRecovery(r), err
}

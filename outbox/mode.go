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

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/logslot"
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
	// Slot is the log-mode slot the change prepared (To is ModeLog), and SlotCreated whether
	// the change created it. A slot created while the schema was already in log mode (From
	// ModeLog) decodes only the transactions that commit after its creation: the events of its
	// destinations written since the switch (Changed) are not in it, and Store.RecoverLogFor
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
func (s *Store) SetMode(ctx context.Context, db Querier, mode Mode, slot string) (ModeChange, error) {
	return s.SetModeFor(ctx, db, mode, slot, nil)
}

// SetModeFor is SetMode for the relays restricted to destinations (RelayConfig.Destinations):
// switching to ModeLog prepares the slot of that set (slot "" is LogSlotFor(schema,
// destinations)), whose publication gives it only the rows of those destinations (a row
// filter: PostgreSQL 15 or later). It refuses a set that overlaps another log-mode slot of the
// schema (see Store.LogSlots): two slots would publish the same events. With several
// destination groups, prepare every group's slot before the switch (PrepareLogSlot), so that
// each decodes every event of its destinations written after it.
func (s *Store) SetModeFor(ctx context.Context, db Querier, mode Mode, slot string, destinations []string) (ModeChange, error) {
	if _, err := ParseMode(string(mode)); err != nil {
		return ModeChange{}, fmt.Errorf("set outbox mode: %w", err)
	}
	var created bool
	if mode == ModeLog {
		// Before the switch a publication that lost its table is re-pointed (no event was
		// written to keiro_outbox_log meanwhile); in log mode it is refused: the events
		// written since were not decoded (PrepareLog repairs it, and says so).
		beforeSwitch := func() (bool, error) {
			cur, err := s.Mode(ctx, db)
			return cur != ModeLog, err
		}
		p, err := s.prepareLog(ctx, db, slot, destinations, beforeSwitch)
		if err != nil {
			return ModeChange{}, fmt.Errorf("set outbox mode: %w", err)
		}
		slot, created = p.Slot, p.SlotCreated
	} else {
		slot = ""
	}
	var from string
	var changed time.Time
	err := func() error {
		tx, err := db.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		// The row lock serializes concurrent changes (relays started together with
		// --mode=log each switch the schema): the later ones read the mode the first set
		// and change nothing, so they take no fence.
		if err := tx.QueryRow(ctx, s.q.ReadModeForUpdate).Scan(&from, &changed); err != nil {
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
	return ModeChange{From: Mode(from), To: mode, LSN: lsn, Slot: slot, SlotCreated: created, Changed: changed}, nil
}

// PrepareLogSlot creates, if they do not exist, the publication and the replication slot of a
// log-mode relay restricted to destinations (nil: every destination; slot "" is
// LogSlotFor(schema, destinations)), without changing the mode, and returns the slot's name
// and whether it created the slot. Run it for each destination group before the switch to log
// mode: a slot decodes only what commits after its creation. It refuses a set that overlaps
// another log-mode slot of the schema, and an existing publication or slot that is not the
// relay's (see PrepareLog).
func (s *Store) PrepareLogSlot(ctx context.Context, db Querier, slot string, destinations []string) (string, bool, error) {
	p, err := s.PrepareLog(ctx, db, slot, destinations)
	return p.Slot, p.SlotCreated, err
}

// LogPrepared reports a Store.PrepareLog.
type LogPrepared struct {
	// Slot is the slot's name, and SlotCreated whether PrepareLog created it.
	Slot        string
	SlotCreated bool
	// PublicationRepaired is set when the slot's publication published none of
	// keiro_outbox_log's inserts (the table was dropped after its creation, as by a DROP
	// SCHEMA … CASCADE and a new migration) and was re-pointed at the table. In log mode the
	// events written meanwhile were not decoded by the slot: republish them with
	// Store.RecoverLogFor (`relay mode recover`).
	PublicationRepaired bool
}

// PrepareLog is PrepareLogSlot with its full report. It verifies what exists (logslot's rule,
// the one the log-mode relay applies at every session): the slot must be a logical slot of
// this database, of the plugin pgoutput, not invalidated; the publication must publish
// exactly the schema's keiro_outbox_log, inserts only, with the row filter of destinations.
// It repairs the publication of its own that does not (named after the slot, no other
// table), and refuses, with the line that says what to do, a publication with other tables
// or FOR ALL TABLES, another destination set, or a slot of another kind, plugin or database.
func (s *Store) PrepareLog(ctx context.Context, db Querier, slot string, destinations []string) (LogPrepared, error) {
	p, err := s.prepareLog(ctx, db, slot, destinations, always)
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
func (s *Store) prepareLog(ctx context.Context, db Querier, slot string, destinations []string, repairLost func() (bool, error)) (LogPrepared, error) {
	dests := logslot.Normalize(destinations)
	if slot == "" {
		slot = LogSlotFor(s.schema, dests)
	}
	out := LogPrepared{Slot: slot}
	if err := s.checkLogTarget(ctx, db, slot, dests); err != nil {
		return out, err
	}
	pubCreated, repaired, err := s.preparePublication(ctx, db, slot, dests, repairLost)
	if err != nil {
		return out, err
	}
	out.PublicationRepaired = repaired
	out.SlotCreated, err = s.prepareSlot(ctx, db, slot, dests, pubCreated)
	return out, err
}

// checkLogTarget refuses a slot name or destinations log mode cannot use, destinations on a
// server without publication row filters, and destinations another slot publishes.
func (s *Store) checkLogTarget(ctx context.Context, db Querier, slot string, dests []string) error {
	if !slotName.MatchString(slot) {
		return fmt.Errorf("slot %q: must be 1 to 63 lower case letters, digits or underscores", slot)
	}
	for i, d := range dests {
		if err := envelope.ValidateTopic(d); err != nil {
			return fmt.Errorf("destinations[%d] %q %w", i, d, err)
		}
	}
	if len(dests) > 0 {
		var ok bool
		if err := db.QueryRow(ctx, s.q.RowFilters).Scan(&ok); err != nil {
			return fmt.Errorf("read the server version: %w", err)
		}
		if !ok {
			return errors.New("destinations in log mode need PostgreSQL 15 or later (publication row filters)")
		}
	}
	return s.checkOverlap(ctx, db, slot, dests)
}

// preparePublication creates slot's publication of dests, checks it, or repairs it
// (prepareLog); it reports whether it created it and whether it repaired a lost table.
func (s *Store) preparePublication(ctx context.Context, db Querier, slot string, dests []string, repairLost func() (bool, error)) (created, repaired bool, err error) {
	pub, err := s.findPublication(ctx, db, slot, dests)
	if err != nil {
		return false, false, err
	}
	switch v, lost, err := logslot.CheckPublication(pub, s.schema, dests); v {
	case logslot.Create:
		stmt := logslot.Statement(logslot.SQLCreatePublication, s.schema, slot, dests)
		// Another relay creating it at the same moment: duplicate_object, or the catalog's
		// unique index (unique_violation on pg_publication_pubname_index).
		_, err := db.Exec(ctx, stmt)
		if err != nil && !isPgCode(err, "42710") && !isPgCode(err, "23505") {
			return false, false, fmt.Errorf("create publication %s: %w", slot, err)
		}
		return err == nil, false, nil
	case logslot.Refuse:
		return false, false, err
	case logslot.Repair:
		if lost {
			ok, rerr := repairLost()
			if rerr != nil {
				return false, false, errors.Join(err, rerr)
			}
			if !ok {
				return false, false, logslot.MissedError(err, slot, dests)
			}
		}
		for _, stmt := range []string{logslot.SQLRepointPublication, logslot.SQLPublishInsertOnly} {
			if _, xerr := db.Exec(ctx, logslot.Statement(stmt, s.schema, slot, dests)); xerr != nil {
				return false, false, errors.Join(err, fmt.Errorf("repair publication %s: %w", slot, xerr))
			}
		}
		return false, lost, nil
	}
	return false, false, nil
}

// prepareSlot creates the replication slot, or checks the one that exists and waits until it
// is consistent; it reports whether it created it. A slot it created that overlaps another
// relay's, created at the same moment, is dropped again (with its publication when
// pubCreated).
func (s *Store) prepareSlot(ctx context.Context, db Querier, slot string, dests []string, pubCreated bool) (bool, error) {
	created, err := createSlot(ctx, db, s.q.CreateSlot, slot)
	if err != nil && !isPgCode(err, "42710") {
		if isPgCode(err, "55000") || isPgCode(err, "42501") {
			err = errors.Join(err, errors.New("log mode needs wal_level = logical and a role with the REPLICATION attribute"))
		}
		return false, fmt.Errorf("create replication slot %s: %w", slot, err)
	}
	if !created {
		if err := s.checkSlot(ctx, db, slot); err != nil {
			return false, err
		}
		return false, s.awaitConsistentSlot(ctx, db, slot)
	}
	// Two relays of overlapping sets starting at once both passed the first check: the
	// one that finds the other's slot now drops its own, so that one slot at most
	// publishes each destination (the other relay's next start sees this one's, or none).
	if err := s.checkOverlap(ctx, db, slot, dests); err != nil {
		if _, derr := db.Exec(ctx, s.q.DropSlot, slot); derr != nil {
			err = errors.Join(err, fmt.Errorf("drop the slot %s just created: %w", slot, derr))
		} else if pubCreated {
			if _, derr := db.Exec(ctx, strings.ReplaceAll(s.q.DropPublication, "{{publication}}", slot)); derr != nil {
				err = errors.Join(err, fmt.Errorf("drop the publication %s just created: %w", slot, derr))
			}
		}
		return false, err
	}
	return true, nil
}

// always and never are prepareLog's repairLost for an operator's repair and for a relay's
// start in log mode.
func always() (bool, error) { return true, nil }

func never() (bool, error) { return false, nil }

// findPublication reads the publication named slot (logslot.SQLPublication); nil when it does
// not exist.
func (s *Store) findPublication(ctx context.Context, q Querier, slot string, dests []string) (*logslot.Publication, error) {
	cols := make([]string, 6)
	dst := make([]any, len(cols))
	for i := range cols {
		dst[i] = &cols[i]
	}
	err := q.QueryRow(ctx, logslot.Statement(logslot.SQLPublication, s.schema, slot, dests)).Scan(dst...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("find publication %s: %w", slot, err)
	}
	p, err := logslot.ParsePublication(slot, cols)
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// checkSlot verifies the existing slot (logslot.SQLSlot, logslot.CheckSlot).
func (s *Store) checkSlot(ctx context.Context, q Querier, slot string) error {
	cols := make([]string, 8)
	dst := make([]any, len(cols))
	for i := range cols {
		dst[i] = &cols[i]
	}
	err := q.QueryRow(ctx, logslot.Statement(logslot.SQLSlot, s.schema, slot, nil)).Scan(dst...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // dropped meanwhile: awaitConsistentSlot says so
	}
	if err != nil {
		return fmt.Errorf("read replication slot %s: %w", slot, err)
	}
	st, err := logslot.ParseSlot(slot, cols)
	if err != nil {
		return err
	}
	return logslot.CheckSlot(&st)
}

// createSlot runs stmt (sqlq's CreateSlot) for slot, and reports whether it created the slot
// (its row) rather than found it.
func createSlot(ctx context.Context, db Querier, stmt, slot string) (bool, error) {
	rows, err := db.Query(ctx, stmt, slot)
	if err != nil {
		return false, err
	}
	created := rows.Next()
	rows.Close()
	return created, rows.Err()
}

// awaitConsistentSlot waits until slot, which another session created, has reached its
// consistent point (its confirmed_flush_lsn is set). A slot is listed as soon as its creation
// starts, and its creation waits for the transactions running then to end; it decodes only
// what commits after that point. A switch to log mode made before it would leave the events
// committed in between in keiro_outbox_log alone, so SetModeFor and a relay's start wait here.
func (s *Store) awaitConsistentSlot(ctx context.Context, db Querier, slot string) error {
	for {
		st, err := s.LogSlotStatus(ctx, db, slot)
		switch {
		case err != nil:
			return err
		case !st.Exists:
			return fmt.Errorf("replication slot %s: its creation by another session failed; try again", slot)
		case st.ConfirmedFlushLSN != "":
			return nil
		}
		if s.slotWait != nil {
			s.slotWait()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for replication slot %s, which another session is creating, to reach its consistent point: %w", slot, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// checkOverlap refuses a slot of dests (nil: every destination) when another existing
// log-mode slot of the schema publishes one of its destinations: both would publish it.
func (s *Store) checkOverlap(ctx context.Context, q Querier, slot string, dests []string) error {
	slots, err := s.LogSlots(ctx, q)
	if err != nil {
		return err
	}
	for _, o := range slots {
		if o.Slot == slot || !o.Exists {
			continue
		}
		if both := logslot.Overlap(dests, o.Destinations); len(both) > 0 {
			return fmt.Errorf("%w: slot %s would publish %s, and the slot %s of the schema already publishes %s: both would publish %s; give the relays disjoint Destinations, or drop the slot %s (and its publication) once no relay reads it",
				ErrLogSlotOverlap, slot, describeSet(dests), o.Slot, describeSet(o.Destinations), describeBoth(both), o.Slot)
		}
	}
	return nil
}

// ErrLogSlotOverlap reports a log-mode slot whose destinations overlap another slot's of the
// schema (a relay without Destinations overlaps every other): both would publish the same
// events. The relay refuses to start.
var ErrLogSlotOverlap = errors.New("log-mode slots overlap")

// describeSet names a destination set in a message: nil is every destination.
func describeSet(set []string) string {
	if len(set) == 0 {
		return "every destination"
	}
	return "the destinations " + strings.Join(set, ", ")
}

// describeBoth names the overlap of two sets.
func describeBoth(both []string) string {
	if len(both) == 1 && both[0] == "*" {
		return "every destination"
	}
	return strings.Join(both, ", ")
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
	// Destinations are the destinations the slot's publication gives it (its row filter);
	// empty for every destination. Only Store.LogSlots fills it.
	Destinations []string `json:"destinations,omitempty"`
}

// LogSlots reads every log-mode slot of the schema: one per publication of its
// keiro_outbox_log (keiro names a slot after its publication), in name order, with the
// destinations the publication gives it. A publication whose slot does not exist is listed
// with Exists false. Retention of keiro_outbox_log deletes only what every existing one has
// confirmed.
func (s *Store) LogSlots(ctx context.Context, q Querier) ([]SlotStatus, error) {
	for attempt := 1; ; attempt++ {
		out, err := s.logSlots(ctx, q)
		// pg_publication_tables fails with undefined_object when a publication it listed is
		// dropped before it reads that publication's tables (a relay dropping the slot it lost
		// an overlap race with): read again, outside a transaction, where that can succeed.
		var pgErr *pgconn.PgError
		if _, inTx := q.(pgx.Tx); err == nil || inTx || attempt == 5 ||
			!errors.As(err, &pgErr) || pgErr.Code != "42704" {
			return out, err
		}
	}
}

// logSlots is one read of LogSlots.
func (s *Store) logSlots(ctx context.Context, q Querier) ([]SlotStatus, error) {
	rows, err := q.Query(ctx, s.q.LogSlots)
	if err != nil {
		return nil, fmt.Errorf("read the log-mode slots: %w", err)
	}
	defer rows.Close()
	var out []SlotStatus
	for rows.Next() {
		var st SlotStatus
		var filter string
		if err := rows.Scan(&st.Slot, &filter, &st.Exists, &st.ActivePID, &st.ConfirmedFlushLSN, &st.RetainedBytes,
			&st.WALStatus, &st.SafeWALSize); err != nil {
			return nil, fmt.Errorf("read the log-mode slots: %w", err)
		}
		st.Destinations = logslot.ParseRowFilter(filter)
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the log-mode slots: %w", err)
	}
	return out, nil
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
	return s.RecoverLogFor(ctx, q, since, until, nil)
}

// RecoverLogFor is RecoverLog restricted to the events of destinations (nil: all): the
// recovery of a per-destination relay's slot (RelayConfig.Destinations), which republishes
// none of the other slots' events.
func (s *Store) RecoverLogFor(ctx context.Context, q Querier, since, until time.Time, destinations []string) (LogRecovery, error) {
	var r LogRecovery
	if !until.After(since) {
		return r, fmt.Errorf("recover keiro_outbox_log: until (%s) must be after since (%s)",
			until.Format(time.RFC3339), since.Format(time.RFC3339))
	}
	if err := q.QueryRow(ctx, s.q.RecoverLog, since, until, logslot.Normalize(destinations)).Scan(&r.Found, &r.Copied); err != nil {
		return r, fmt.Errorf("recover keiro_outbox_log: %w", err)
	}
	return r, nil
}

// Package modes is the implementation of a schema's outbox mode (claim or log) and of its
// log-mode slots: the switch, the preparation and checks of a slot and its publication, the
// slots' state and the recovery of keiro_outbox_log. The outbox package's Store methods are
// thin fronts over it, and the relay's log source calls it.
package modes

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/pgtext"
	"github.com/keiro-go/keiro/outbox/internal/exactlyonce"
	"github.com/keiro-go/keiro/outbox/internal/logslot"
	"github.com/keiro-go/keiro/outbox/internal/sqlq"
)

// Claim and Log are the modes, as keiro_outbox_settings stores them.
const (
	Claim = "claim"
	Log   = "log"
)

// Schema is one schema's outbox, for its mode and slots.
type Schema struct {
	// Name is the schema's name; Q its statements.
	Name string
	Q    *sqlq.Queries
	// SlotWait, if set (tests), runs each time awaitConsistentSlot finds the slot not yet
	// consistent.
	SlotWait func()
}

// Mode reads the schema's mode (migration 009's keiro_outbox_settings).
func (s Schema) Mode(ctx context.Context, q keiro.DB) (string, error) {
	var m string
	if err := q.QueryRow(ctx, s.Q.ReadMode).Scan(&m); err != nil {
		return "", fmt.Errorf("read outbox mode: %w", err)
	}
	return m, nil
}

// Change is the result of SetMode (outbox.ModeChange).
type Change struct {
	From, To    string
	Slot        string
	SlotCreated bool
	Changed     time.Time
	LSN         string
}

// Prepared reports a PrepareLog (outbox.LogPrepared).
type Prepared struct {
	Slot                string
	SlotCreated         bool
	PublicationRepaired bool
}

// SetMode switches the schema to mode (a valid one), for the relays of destinations: a switch
// to Log first prepares slot (outbox.Admin.SetModeFor).
func (s Schema) SetMode(ctx context.Context, db keiro.DB, mode string, slot string, destinations []string) (Change, error) {
	var created bool
	if mode == Log {
		// Before the switch a publication that lost its table is re-pointed (no event was
		// written to keiro_outbox_log meanwhile); in log mode it is refused: the events
		// written since were not decoded (PrepareLog repairs it, and says so).
		beforeSwitch := func() (bool, error) {
			cur, err := s.Mode(ctx, db)
			return cur != Log, err
		}
		p, err := s.PrepareLog(ctx, db, slot, destinations, beforeSwitch)
		if err != nil {
			return Change{}, fmt.Errorf("set outbox mode: %w", err)
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
		if err := tx.QueryRow(ctx, s.Q.ReadModeForUpdate).Scan(&from, &changed); err != nil {
			return err
		}
		if from == mode {
			return tx.Commit(ctx)
		}
		if _, err := tx.Exec(ctx, s.Q.SetMode, mode); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}()
	if err != nil {
		return Change{}, fmt.Errorf("set outbox mode %s: %w", mode, err)
	}
	var lsn string
	if err := db.QueryRow(ctx, `SELECT pg_catalog.pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		return Change{}, errors.Join(fmt.Errorf("set outbox mode %s: read the WAL position", mode), err)
	}
	return Change{From: from, To: mode, LSN: lsn, Slot: slot, SlotCreated: created, Changed: changed}, nil
}

// PrepareLog creates, if they do not exist, the publication of keiro_outbox_log's inserts of
// destinations (a row filter; nil: every destination) and the logical replication slot
// (pgoutput) of log mode, both named slot ("" is LogSlotFor(schema, destinations)), and
// verifies them when they exist (logslot.CheckPublication, logslot.CheckSlot). A slot decodes
// only the transactions that commit after its creation: it must exist before the mode becomes
// 'log'. A publication that lost its table is repaired when repairLost reports true (before
// the switch, or an operator's PrepareLog; it is asked only then) and refused otherwise (logslot.MissedError: a relay's
// start in log mode must not confirm past the events its slot did not decode).
func (s Schema) PrepareLog(ctx context.Context, db keiro.DB, slot string, destinations []string, repairLost func() (bool, error)) (Prepared, error) {
	dests := logslot.Normalize(destinations)
	if slot == "" {
		slot = logslot.Name(s.Name, dests)
	}
	out := Prepared{Slot: slot}
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
func (s Schema) checkLogTarget(ctx context.Context, db keiro.DB, slot string, dests []string) error {
	if !logslot.ValidName(slot) {
		return fmt.Errorf("slot %q: must be 1 to 63 lower case letters, digits or underscores", slot)
	}
	for i, d := range dests {
		if err := envelope.ValidateTopic(d); err != nil {
			return fmt.Errorf("destinations[%d] %q %w", i, d, err)
		}
	}
	if len(dests) > 0 {
		var ok bool
		if err := db.QueryRow(ctx, s.Q.RowFilters).Scan(&ok); err != nil {
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
func (s Schema) preparePublication(ctx context.Context, db keiro.DB, slot string, dests []string, repairLost func() (bool, error)) (created, repaired bool, err error) {
	pub, err := s.findPublication(ctx, db, slot, dests)
	if err != nil {
		return false, false, err
	}
	switch v, lost, err := logslot.CheckPublication(pub, s.Name, dests); v {
	case logslot.Create:
		stmt := logslot.Statement(logslot.SQLCreatePublication, s.Name, slot, dests)
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
			if _, xerr := db.Exec(ctx, logslot.Statement(stmt, s.Name, slot, dests)); xerr != nil {
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
func (s Schema) prepareSlot(ctx context.Context, db keiro.DB, slot string, dests []string, pubCreated bool) (bool, error) {
	created, err := createSlot(ctx, db, s.Q.CreateSlot, slot)
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
		if _, derr := db.Exec(ctx, s.Q.DropSlot, slot); derr != nil {
			err = errors.Join(err, fmt.Errorf("drop the slot %s just created: %w", slot, derr))
		} else if pubCreated {
			if _, derr := db.Exec(ctx, pgtext.Expand(s.Q.DropPublication, "publication", slot)); derr != nil {
				err = errors.Join(err, fmt.Errorf("drop the publication %s just created: %w", slot, derr))
			}
		}
		return false, err
	}
	return true, nil
}

// findPublication reads the publication named slot (logslot.SQLPublication); nil when it does
// not exist.
func (s Schema) findPublication(ctx context.Context, q keiro.DB, slot string, dests []string) (*logslot.Publication, error) {
	cols := make([]string, 6)
	dst := make([]any, len(cols))
	for i := range cols {
		dst[i] = &cols[i]
	}
	err := q.QueryRow(ctx, logslot.Statement(logslot.SQLPublication, s.Name, slot, dests)).Scan(dst...)
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
func (s Schema) checkSlot(ctx context.Context, q keiro.DB, slot string) error {
	cols := make([]string, 8)
	dst := make([]any, len(cols))
	for i := range cols {
		dst[i] = &cols[i]
	}
	err := q.QueryRow(ctx, logslot.Statement(logslot.SQLSlot, s.Name, slot, nil)).Scan(dst...)
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
func createSlot(ctx context.Context, db keiro.DB, stmt, slot string) (bool, error) {
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
func (s Schema) awaitConsistentSlot(ctx context.Context, db keiro.DB, slot string) error {
	for {
		st, err := s.SlotStatus(ctx, db, slot)
		switch {
		case err != nil:
			return err
		case !st.Exists:
			return fmt.Errorf("replication slot %s: its creation by another session failed; try again", slot)
		case st.ConfirmedFlushLSN != "":
			return nil
		}
		if s.SlotWait != nil {
			s.SlotWait()
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
func (s Schema) checkOverlap(ctx context.Context, q keiro.DB, slot string, dests []string) error {
	slots, err := s.Slots(ctx, q)
	if err != nil {
		return err
	}
	for _, o := range slots {
		if o.Slot == slot || !o.Exists {
			continue
		}
		if both := logslot.Overlap(dests, o.Destinations); len(both) > 0 {
			return fmt.Errorf("%w: slot %s would publish %s, and the slot %s of the schema already publishes %s: both would publish %s; give the relays disjoint Destinations, or drop the slot %s (and its publication) once no relay reads it",
				ErrSlotOverlap, slot, describeSet(dests), o.Slot, describeSet(o.Destinations), describeBoth(both), o.Slot)
		}
	}
	return nil
}

// ErrSlotOverlap reports a log-mode slot whose destinations overlap another slot's
// (outbox.ErrLogSlotOverlap).
var ErrSlotOverlap = errors.New("log-mode slots overlap")

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

// SlotStatus is the state of a log-mode replication slot (pg_replication_slots), with the
// fields of outbox.SlotStatus, which documents them.
type SlotStatus struct {
	Slot              string
	Exists            bool
	ActivePID         int
	ConfirmedFlushLSN string
	RetainedBytes     int64
	WALStatus         string
	SafeWALSize       *int64
	Destinations      []string
	TransactionalID   string
}

// Slots reads every log-mode slot of the schema (outbox.Admin.LogSlots).
func (s Schema) Slots(ctx context.Context, q keiro.DB) ([]SlotStatus, error) {
	var out []SlotStatus
	err := ReadPublications(q, func() (err error) {
		out, err = s.logSlots(ctx, q)
		return err
	})
	return out, err
}

// ReadPublications runs read, a statement over pg_publication_tables, again (at most five
// times) when it fails with undefined_object: the view fails so when a publication it listed
// is dropped before it reads that publication's tables (a relay dropping the slot it lost an
// overlap race with, another schema's relay dropping its own). Outside a transaction the next
// read can succeed; in one (q is a pgx.Tx) the error is returned at once.
func ReadPublications(q keiro.DB, read func() error) error {
	for attempt := 1; ; attempt++ {
		err := read()
		var pgErr *pgconn.PgError
		if _, inTx := q.(pgx.Tx); err == nil || inTx || attempt == 5 ||
			!errors.As(err, &pgErr) || pgErr.Code != "42704" {
			return err
		}
	}
}

// logSlots is one read of Slots.
func (s Schema) logSlots(ctx context.Context, q keiro.DB) ([]SlotStatus, error) {
	rows, err := q.Query(ctx, s.Q.LogSlots)
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
	if len(out) == 0 {
		return out, nil
	}
	sys, db, err := systemID(ctx, q)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].TransactionalID = exactlyonce.LogTransactionalID(sys, db, out[i].Slot)
	}
	return out, nil
}

// systemID reads the database system identifier (IDENTIFY_SYSTEM's systemid, which a
// physical standby shares with its primary) and the database's name: with the slot, they make
// the log engine's transactional id (exactlyonce.LogTransactionalID).
func systemID(ctx context.Context, q keiro.DB) (sys, db string, err error) {
	err = q.QueryRow(ctx, "SELECT system_identifier::text, current_database()::text FROM pg_control_system()").Scan(&sys, &db)
	if err != nil {
		return "", "", fmt.Errorf("read the database system identifier: %w", err)
	}
	return sys, db, nil
}

// SlotStatus reads the log-mode slot's state.
func (s Schema) SlotStatus(ctx context.Context, q keiro.DB, slot string) (SlotStatus, error) {
	st := SlotStatus{Slot: slot}
	err := q.QueryRow(ctx, s.Q.SlotStatus, slot).Scan(&st.ActivePID, &st.ConfirmedFlushLSN, &st.RetainedBytes,
		&st.WALStatus, &st.SafeWALSize)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("read replication slot %s: %w", slot, err)
	}
	st.Exists = true
	sys, db, err := systemID(ctx, q)
	if err != nil {
		return st, err
	}
	st.TransactionalID = exactlyonce.LogTransactionalID(sys, db, slot)
	return st, nil
}

// Recovery reports a Recover (outbox.LogRecovery).
type Recovery struct {
	Found, Copied int64
}

// Recover copies the events of destinations (nil: all) written in keiro_outbox_log from since
// to before until into keiro_outbox (outbox.Admin.RecoverLogFor).
func (s Schema) Recover(ctx context.Context, q keiro.DB, since, until time.Time, destinations []string) (Recovery, error) {
	var r Recovery
	if !until.After(since) {
		return r, fmt.Errorf("recover keiro_outbox_log: until (%s) must be after since (%s)",
			until.Format(time.RFC3339), since.Format(time.RFC3339))
	}
	if err := q.QueryRow(ctx, s.Q.RecoverLog, since, until, logslot.Normalize(destinations)).Scan(&r.Found, &r.Copied); err != nil {
		return r, fmt.Errorf("recover keiro_outbox_log: %w", err)
	}
	return r, nil
}

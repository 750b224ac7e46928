package events

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/keiro-go/keiro"
)

// ShadowHandler builds the handler that applies events to a rebuild's shadow tables: table maps
// a live table name, as given to RebuildShadow, to the quoted, schema-qualified name of its
// shadow, which the handler must write to instead.
type ShadowHandler func(table func(live string) string) BatchHandler

// shadowCatchUpLag is how far behind the live checkpoint the shadow may be when the swap
// transaction starts: the rest is applied inside it, while the live subscription waits.
const shadowCatchUpLag = 1000

// RebuildShadow rebuilds the read model held in tables (names as "schema.table" or "table")
// without ever showing readers a partial model, unlike Rebuild, which empties the live tables
// and lets the running instance refill them. It creates an empty shadow of each table
// (CREATE TABLE … (LIKE live INCLUDING ALL), named "<table>_shadow"), replays the log from the
// start into the shadows with the handler h builds, in batches, while the live subscription goes
// on updating the live tables; then, in one transaction that holds the subscription's
// checkpoint row (so its running instance waits), it applies the events up to that checkpoint to
// the shadows, drops the live tables and renames the shadows in their place. Readers see the old
// model, complete, until that transaction commits, and the new one, complete, after: a query
// that runs meanwhile waits for the swap's locks (the rename takes an ACCESS EXCLUSIVE lock), and
// queries already running delay the swap until they end. The checkpoint does not move.
//
// The shadows get the live tables' columns, defaults, constraints and indexes, not their
// grants, triggers or owners; their indexes keep the shadow-derived names. A table that views or
// foreign keys depend on cannot be dropped: the swap then fails and leaves the live model as it
// was. A failure at any point drops the shadows and changes nothing live.
func (s *Subscription) RebuildShadow(ctx context.Context, tables []string, h ShadowHandler) (err error) {
	if len(tables) == 0 || h == nil {
		return fmt.Errorf("rebuild subscription %s in shadow tables: give the read model's tables and a ShadowHandler", s.cfg.Name)
	}
	type pair struct{ schema, name, live, shadow string }
	pairs := make([]pair, len(tables))
	shadowOf := make(map[string]string, len(tables))
	for i, t := range tables {
		schema, name, err := splitTable(t)
		if err != nil {
			return fmt.Errorf("rebuild subscription %s in shadow tables: %w", s.cfg.Name, err)
		}
		sh := shadowName(name)
		p := pair{schema: schema, name: name, live: quoteTable(schema, name), shadow: quoteTable(schema, sh)}
		pairs[i] = p
		shadowOf[t] = p.shadow
	}
	table := func(live string) string {
		if sh, ok := shadowOf[live]; ok {
			return sh
		}
		panic(fmt.Sprintf("events: table %q is not one of the tables given to RebuildShadow", live))
	}
	apply := h(table)
	if apply == nil {
		return fmt.Errorf("rebuild subscription %s in shadow tables: the ShadowHandler returned nil", s.cfg.Name)
	}
	fail := func(err error) error {
		return fmt.Errorf("rebuild subscription %s in shadow tables: %w", s.cfg.Name, err)
	}
	dropShadows := func(q keiro.DB) error {
		for _, p := range pairs {
			if _, err := q.Exec(ctx, "DROP TABLE IF EXISTS "+p.shadow); err != nil {
				return fmt.Errorf("drop shadow %s: %w", p.shadow, err)
			}
		}
		return nil
	}
	if err := dropShadows(s.pool); err != nil {
		return fail(err)
	}
	defer func() {
		if err != nil {
			_ = dropShadows(s.pool) // after a successful swap the shadows no longer exist
		}
	}()
	for _, p := range pairs {
		if _, err := s.pool.Exec(ctx, "CREATE TABLE "+p.shadow+" (LIKE "+p.live+" INCLUDING ALL)"); err != nil {
			return fail(fmt.Errorf("create shadow of %s: %w", p.live, err))
		}
	}
	if _, err := s.pool.Exec(ctx, s.store.q.subEnsure, s.cfg.Name); err != nil {
		return fail(fmt.Errorf("create checkpoint: %w", err))
	}
	// replay applies (from, upTo] to the shadows, a batch per transaction on q (or in tx).
	replay := func(tx pgx.Tx, from, upTo int64) (int64, error) {
		for from < upTo {
			run := func(tx pgx.Tx) error {
				batch := make([]RecordedEvent, 0, s.cfg.BatchSize)
				for e, err := range s.store.readLogPage(ctx, tx, from, upTo, s.cfg.Category, s.cfg.BatchSize) {
					if err != nil {
						return err
					}
					batch = append(batch, e)
				}
				next := upTo
				if len(batch) == s.cfg.BatchSize {
					next = batch[len(batch)-1].GlobalPosition
				}
				if len(batch) > 0 {
					if err := apply(ctx, tx, batch); err != nil {
						return fmt.Errorf("handle positions %d..%d: %w", batch[0].GlobalPosition, batch[len(batch)-1].GlobalPosition, err)
					}
				}
				from = next
				return nil
			}
			var err error
			if tx != nil {
				err = run(tx)
			} else {
				err = pgx.BeginFunc(ctx, s.pool, run)
			}
			if err != nil {
				return from, err
			}
		}
		return from, nil
	}
	var done int64
	for {
		var live int64
		if err := s.pool.QueryRow(ctx, s.store.q.subPosition, s.cfg.Name).Scan(&live); err != nil {
			return fail(fmt.Errorf("read checkpoint: %w", err))
		}
		if live-done <= shadowCatchUpLag {
			break
		}
		if done, err = replay(nil, done, live); err != nil {
			return fail(err)
		}
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var live int64
		if err := tx.QueryRow(ctx, s.store.q.subLock, s.cfg.Name).Scan(&live); err != nil {
			return fmt.Errorf("lock checkpoint: %w", err)
		}
		if live < done {
			return errors.New("the checkpoint moved back during the rebuild (another Rebuild?); run it again")
		}
		if _, err := replay(tx, done, live); err != nil {
			return err
		}
		for _, p := range pairs {
			if _, err := tx.Exec(ctx, "DROP TABLE "+p.live); err != nil {
				return fmt.Errorf("drop %s for the swap (nothing changed): %w", p.live, err)
			}
			if _, err := tx.Exec(ctx, "ALTER TABLE "+p.shadow+" RENAME TO "+pgx.Identifier{p.name}.Sanitize()); err != nil {
				return fmt.Errorf("rename %s to %s: %w", p.shadow, p.live, err)
			}
		}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	s.cfg.Logger.InfoContext(ctx, "keiro: read model rebuilt in shadow tables and swapped", "subscription", s.cfg.Name, "tables", tables)
	return nil
}

// splitTable parses "schema.table" or "table".
func splitTable(t string) (schema, name string, err error) {
	parts := strings.Split(t, ".")
	if len(parts) > 2 {
		return "", "", fmt.Errorf("table %q: use \"schema.table\" or \"table\"", t)
	}
	for _, p := range parts {
		if p == "" {
			return "", "", fmt.Errorf("table %q: empty name part", t)
		}
	}
	if len(parts) == 2 {
		return parts[0], parts[1], nil
	}
	return "", parts[0], nil
}

// shadowName is name + "_shadow", shortened to PostgreSQL's 63-byte identifier limit.
func shadowName(name string) string {
	const suffix = "_shadow"
	if len(name)+len(suffix) > 63 {
		name = strings.ToValidUTF8(name[:63-len(suffix)], "")
	}
	return name + suffix
}

func quoteTable(schema, name string) string {
	if schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{schema, name}.Sanitize()
}

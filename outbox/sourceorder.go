package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// DeclarePerSourceOrder declares sources as ordered streams, on q (a pool, a connection or a
// transaction; in a transaction the declaration takes effect when it commits). From then on
// every row of such a source, whatever its key (null keys included) and whoever writes it
// (EnqueueTx, <schema>.enqueue or a plain INSERT), takes one transaction lock per source before
// it draws its seq, so the source's producers serialise and its seq order is its commit order:
// the order a relay with the PerSourceStream policy publishes. Without a declaration
// PerSourceStream claims in seq order but a transaction that commits late is published after
// later rows of its source. Producers of a declared source commit one at a time.
//
// A declaration waits for every transaction writing the outbox to end and holds new writers
// back until it commits (see docs/architecture.md, "Order at enqueue"), so declare a source
// before its producers start. Declaring a declared source does nothing and does not wait.
func (s *Store) DeclarePerSourceOrder(ctx context.Context, q Querier, sources ...string) error {
	if err := validSources(sources); err != nil {
		return fmt.Errorf("declare per-source order: %w", err)
	}
	declared, err := s.PerSourceOrdered(ctx, q)
	if err != nil {
		return fmt.Errorf("declare per-source order: %w", err)
	}
	var missing []string
	for _, src := range sources {
		if !slices.Contains(declared, src) && !slices.Contains(missing, src) {
			missing = append(missing, src)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if _, err := q.Exec(ctx, s.q.DeclareSource, missing); err != nil {
		return fmt.Errorf("declare per-source order of %q: %w", missing, err)
	}
	return nil
}

// RevokePerSourceOrder removes the per-source declaration of sources, on q: their rows are then
// ordered per (source, key) again, and rows without a key are unordered. Like a declaration,
// it waits for the outbox's running writers. Revoking an undeclared source does nothing.
func (s *Store) RevokePerSourceOrder(ctx context.Context, q Querier, sources ...string) error {
	if err := validSources(sources); err != nil {
		return fmt.Errorf("revoke per-source order: %w", err)
	}
	if _, err := q.Exec(ctx, s.q.RevokeSource, sources); err != nil {
		return fmt.Errorf("revoke per-source order of %q: %w", sources, err)
	}
	return nil
}

// PerSourceOrdered lists the sources declared with [Store.DeclarePerSourceOrder], sorted.
func (s *Store) PerSourceOrdered(ctx context.Context, q Querier) ([]string, error) {
	rows, err := q.Query(ctx, s.q.ListSources)
	if err != nil {
		return nil, fmt.Errorf("list per-source ordered sources: %w (is the schema migrated? run `relay migrate`)", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var src string
		if err := rows.Scan(&src); err != nil {
			return nil, fmt.Errorf("list per-source ordered sources: %w", err)
		}
		out = append(out, src)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list per-source ordered sources: %w", err)
	}
	return out, nil
}

func validSources(sources []string) error {
	if len(sources) == 0 {
		return errors.New("no source given")
	}
	for i, src := range sources {
		if src == "" {
			return fmt.Errorf("source %d is empty", i)
		}
	}
	return nil
}

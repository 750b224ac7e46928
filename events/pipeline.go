package events

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/keiro-go/keiro"
)

// batcher sends pipelined statements: *pgxpool.Pool, *pgx.Conn and pgx.Tx have it.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// hydrateOrCreate is the first attempt's hydration, pipelined with a speculative creation: the
// command is decided on Decider.Initial first (Decide is pure), and the stream's first page and
// an append of those events under NoStream go to the database in one round trip. If the stream
// did not exist the append went through (with the hooks, in the same transaction, when there are
// any) and created is the result: one round trip instead of two for commands on new streams.
// Otherwise the NoStream append wrote nothing and the page is folded into the state to decide
// on, as Load would (more pages are read if the stream is long). Without hooks the pair runs as
// one implicit transaction; with hooks it runs in a transaction that is returned open, for the
// real append and the hooks.
//
// A rejection or no-op on Initial proves nothing about the stream: the page is read alone.
func (r *Runner[S, C, E]) hydrateOrCreate(ctx context.Context, db keiro.DB, stream string, cmd C, o RunOptions) (created *Result, state S, version int64, open pgx.Tx, err error) {
	state = r.decider.Initial
	var st *appendStatement
	if emitted, derr := r.decider.Decide(state, cmd); derr == nil && len(emitted) > 0 {
		if data, err := r.encode(stream, emitted, o); err == nil {
			// A failure here is the regular path's to report.
			st, _ = r.store.prepareAppend(ctx, stream, NoStream, false, data)
		}
	}
	hooks := len(r.cfg.Hooks) > 0 || o.Hook != nil
	if st == nil {
		state, version, err = r.Load(ctx, db, stream)
		return nil, state, version, nil, err
	}
	var q interface {
		keiro.DB
		batcher
	}
	if hooks {
		tx, err := db.Begin(ctx)
		if err != nil {
			return nil, state, 0, nil, fmt.Errorf("command on %s: begin: %w", stream, err)
		}
		open, q = tx, tx
	} else {
		q = db.(interface {
			keiro.DB
			batcher
		})
	}
	fail := func(err error) (*Result, S, int64, pgx.Tx, error) {
		if open != nil {
			_ = open.Rollback(context.WithoutCancel(ctx))
		}
		return nil, r.decider.Initial, 0, nil, err
	}
	b := &pgx.Batch{}
	b.Queue(r.store.q.readStreamForward, stream, int64(0), r.store.cfg.PageSize)
	b.Queue(st.sql, st.args...)
	br := q.SendBatch(ctx, b)
	rows, err := br.Query()
	var page []RecordedEvent
	if err == nil {
		for rows.Next() {
			e, serr := scanRecorded(rows)
			if serr != nil {
				err = serr
				break
			}
			page = append(page, e)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		_ = br.Close()
		return fail(fmt.Errorf("hydrate %s: %w", stream, err))
	}
	var ar AppendResult
	rows, err = br.Query()
	if err == nil {
		ar, err = st.scan(rows)
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = r.store.appendError(stream, cerr)
	}
	if err != nil {
		return fail(err)
	}
	if len(ar.Events) > 0 {
		out := &Result{StreamVersion: ar.StreamVersion, GlobalPosition: ar.GlobalPosition, Events: ar.Events}
		if open != nil {
			if err := r.runHooks(ctx, open, *out, o.Hook); err != nil {
				return fail(fmt.Errorf("command on %s: %w", stream, err))
			}
			if err := open.Commit(ctx); err != nil {
				return fail(fmt.Errorf("command on %s: commit: %w", stream, err))
			}
		}
		if !r.store.cfg.DisableNotify {
			r.store.notifyAsync(db)
		}
		return out, state, 0, nil, nil
	}
	// The stream exists (or was created concurrently): hydrate for real.
	for _, e := range page {
		if state, version, err = r.evolve(stream, state, version, e); err != nil {
			return fail(err)
		}
	}
	if len(page) == r.store.cfg.PageSize {
		if state, version, err = r.foldFrom(ctx, q, stream, state, version); err != nil {
			return fail(err)
		}
	}
	return nil, state, version, open, nil
}

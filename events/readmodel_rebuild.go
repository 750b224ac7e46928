package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/envelope"
)

// AsyncProjection applies events to a registered read model from a subscription, at most once
// per idempotency key, and only while the model is live.
type AsyncProjection struct {
	// Name identifies the projection in the dedup table (keiro_projection_dedup). Required.
	Name string
	// ReadModel is the registered model the projection writes; its status fences the
	// projection. Required.
	ReadModel string
	// Apply writes one event to the model inside tx. Required.
	Apply func(ctx context.Context, tx pgx.Tx, e RecordedEvent) error
	// Key is the idempotency key of an event. Defaults to the event's id.
	Key func(e RecordedEvent) envelope.UUID
}

func (p AsyncProjection) key(e RecordedEvent) envelope.UUID {
	if p.Key != nil {
		return p.Key(e)
	}
	return e.ID
}

func (p AsyncProjection) validate() error {
	var errs []error
	if err := checkName("Name", p.Name); err != nil {
		errs = append(errs, err)
	}
	if err := checkName("ReadModel", p.ReadModel); err != nil {
		errs = append(errs, err)
	}
	if p.Apply == nil {
		errs = append(errs, errors.New("Apply: required"))
	}
	return errors.Join(errs...)
}

// AsyncOutcome is what an asynchronous application did.
type AsyncOutcome int

const (
	// AsyncApplied: the event was applied and its key recorded.
	AsyncApplied AsyncOutcome = iota + 1
	// AsyncDuplicate: the key was already recorded; nothing was applied.
	AsyncDuplicate
	// AsyncFenced: the model is not live (a rebuild is in progress) or not registered;
	// nothing was written. The caller must not move its checkpoint past the event.
	AsyncFenced
)

// String returns the outcome's name.
func (o AsyncOutcome) String() string {
	switch o {
	case AsyncApplied:
		return "applied"
	case AsyncDuplicate:
		return "duplicate"
	case AsyncFenced:
		return "fenced"
	}
	return fmt.Sprintf("AsyncOutcome(%d)", int(o))
}

// ApplyTx applies e with p inside tx if p's read model is live: it reads the model's status
// under a share lock held until tx ends (a rebuild that starts meanwhile waits for tx, and tx
// waits for a rebuild being started), records p's key for e, and applies e unless the key was
// already recorded. A model that is not live, or not registered, gives AsyncFenced and writes
// nothing. Everything commits or rolls back with tx.
func (r *ReadModels) ApplyTx(ctx context.Context, tx pgx.Tx, p AsyncProjection, e RecordedEvent) (AsyncOutcome, error) {
	if err := p.validate(); err != nil {
		return 0, fmt.Errorf("apply projection: %w", err)
	}
	var status string
	err := tx.QueryRow(ctx, r.store.q.rmFence, p.ReadModel).Scan(&status)
	if errors.Is(err, pgx.ErrNoRows) {
		return AsyncFenced, nil
	}
	if err != nil {
		return 0, fmt.Errorf("apply projection %s: read the status of read model %s: %w", p.Name, p.ReadModel, err)
	}
	if ReadModelStatus(status) != StatusLive {
		return AsyncFenced, nil
	}
	return r.ApplyUnfencedTx(ctx, tx, p, e)
}

// ApplyUnfencedTx applies e with p inside tx whatever the model's status, once per key: it is
// the replay path of a rebuild (between StartRebuild and FinishRebuild), and nothing else
// should call it.
func (r *ReadModels) ApplyUnfencedTx(ctx context.Context, tx pgx.Tx, p AsyncProjection, e RecordedEvent) (AsyncOutcome, error) {
	if err := p.validate(); err != nil {
		return 0, fmt.Errorf("apply projection: %w", err)
	}
	tag, err := tx.Exec(ctx, r.store.q.dedupInsert, p.Name, [16]byte(p.key(e)))
	if err != nil {
		return 0, fmt.Errorf("apply projection %s: record key of event %s: %w", p.Name, e.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return AsyncDuplicate, nil
	}
	if err := p.Apply(ctx, tx, e); err != nil {
		return 0, fmt.Errorf("apply projection %s to event %s (%s@%d): %w", p.Name, e.ID, e.StreamName, e.StreamVersion, err)
	}
	return AsyncApplied, nil
}

// Handler returns the subscription Handler that applies p with ApplyTx. While p's model is not
// live it fails the delivery with ErrReadModelFenced: the subscription rolls back, keeps its
// checkpoint before the event and delivers it again, without counting the delivery against
// RetryPolicy.MaxDeliveries, until a promotion reopens the model (the events the rebuild
// replayed are then duplicates).
func (r *ReadModels) Handler(p AsyncProjection) Handler {
	return func(ctx context.Context, tx pgx.Tx, e RecordedEvent) error {
		o, err := r.ApplyTx(ctx, tx, p, e)
		if err != nil {
			return err
		}
		if o == AsyncFenced {
			return fmt.Errorf("projection %s, read model %s: %w", p.Name, p.ReadModel, ErrReadModelFenced)
		}
		return nil
	}
}

// PruneDedup deletes the recorded keys of every projection applied before cutoff and returns
// how many it deleted. Those events can then be applied again if they are delivered again, so
// prune only beyond the subscriptions' redelivery window. A rebuild does not need it
// (StartRebuild deletes its projections' keys).
func (r *ReadModels) PruneDedup(ctx context.Context, cutoff time.Time) (int64, error) {
	tag, err := r.pool.Exec(ctx, r.store.q.dedupPrune, cutoff)
	if err != nil {
		return 0, fmt.Errorf("prune projection keys: %w", err)
	}
	return tag.RowsAffected(), nil
}

// StartRebuild takes m offline for a rebuild, in one transaction: it moves m's subscription
// checkpoint (every bucket of a sharded one) to replayFrom, sets the registry row to
// rebuilding with m's version and shape hash (which fences live appliers and refuses queries),
// empties m's table (TRUNCATE), and deletes the recorded keys of the named projections. The
// checkpoint is locked first, as a subscription's batch does, so a batch in flight finishes
// before, or notices the rewind after. Then replay the log from replayFrom with
// ApplyUnfencedTx, and call FinishRebuild (or AbandonRebuild).
func (r *ReadModels) StartRebuild(ctx context.Context, m ReadModel, projections []string, replayFrom int64) (ReadModelInfo, error) {
	if m.Name == "" || m.Table == "" {
		return ReadModelInfo{}, fmt.Errorf("start rebuild of read model %q: Name and Table are required", m.Name)
	}
	var info ReadModelInfo
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if m.Subscription != "" {
			if _, err := tx.Exec(ctx, r.store.q.subRewind, m.Subscription, replayFrom); err != nil {
				return fmt.Errorf("rewind subscription %s: %w", m.Subscription, err)
			}
		}
		var err error
		if info, err = r.transition(ctx, tx, m, StatusRebuilding); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "TRUNCATE TABLE "+m.QualifiedTable()); err != nil {
			return fmt.Errorf("empty %s: %w", m.QualifiedTable(), err)
		}
		if len(projections) > 0 {
			if _, err := tx.Exec(ctx, r.store.q.dedupDelete, projections); err != nil {
				return fmt.Errorf("delete the projections' keys: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return ReadModelInfo{}, fmt.Errorf("start rebuild of read model %s: %w", m.Name, err)
	}
	r.cfg.Logger.InfoContext(ctx, "keiro: read model rebuilding", "read_model", m.Name, "replay_from", replayFrom)
	return info, nil
}

// FinishRebuild promotes a rebuilt m to live (stamping last_built_at), in one transaction with
// its guard: when projections are named and the log reaches past replayFrom, at least one of
// them must have applied an event since StartRebuild, else the model stays rebuilding and the
// error is a *RebuildProducedNoAppliesError (a replay that applied nothing must not go live
// empty). An empty projections list (an inline-only model) skips the guard.
func (r *ReadModels) FinishRebuild(ctx context.Context, m ReadModel, projections []string, replayFrom int64) (ReadModelInfo, error) {
	var info ReadModelInfo
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		var head, applied int64
		if err := tx.QueryRow(ctx, r.store.q.head).Scan(&head); err != nil {
			return fmt.Errorf("read the head of the log: %w", err)
		}
		if len(projections) > 0 {
			if err := tx.QueryRow(ctx, r.store.q.dedupCount, projections).Scan(&applied); err != nil {
				return fmt.Errorf("count the projections' applications: %w", err)
			}
			if applied == 0 && head > replayFrom {
				return &RebuildProducedNoAppliesError{Name: m.Name, Head: head}
			}
		}
		var err error
		info, err = r.transition(ctx, tx, m, StatusLive)
		return err
	})
	var guard *RebuildProducedNoAppliesError
	if errors.As(err, &guard) {
		return ReadModelInfo{}, err
	}
	if err != nil {
		return ReadModelInfo{}, fmt.Errorf("finish rebuild of read model %s: %w", m.Name, err)
	}
	r.cfg.Logger.InfoContext(ctx, "keiro: read model live after rebuild", "read_model", m.Name)
	return info, nil
}

// Rebuild runs the whole offline rebuild of m from replayFrom: StartRebuild, a replay of the
// log (of m.Category, when set) up to its head through every projection with ApplyUnfencedTx,
// a page of events per transaction, then FinishRebuild. Live subscriptions applying the
// projections with Handler hold their events meanwhile; after the promotion they go on from
// replayFrom and find the replayed events already applied, and apply what committed after the
// replay read the head. If the replay fails the model stays rebuilding and the error is
// returned: run Rebuild again, or AbandonRebuild.
func (r *ReadModels) Rebuild(ctx context.Context, m ReadModel, projections []AsyncProjection, replayFrom int64) (ReadModelInfo, error) {
	names := make([]string, len(projections))
	for i, p := range projections {
		if err := p.validate(); err != nil {
			return ReadModelInfo{}, fmt.Errorf("rebuild read model %s: projection %d: %w", m.Name, i, err)
		}
		names[i] = p.Name
	}
	if _, err := r.StartRebuild(ctx, m, names, replayFrom); err != nil {
		return ReadModelInfo{}, err
	}
	head, err := r.head(ctx, m.Category)
	if err != nil {
		return ReadModelInfo{}, fmt.Errorf("rebuild read model %s: %w", m.Name, err)
	}
	for from := replayFrom; from < head; {
		err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			n := 0
			for e, err := range r.store.readLogPage(ctx, tx, from, head, m.Category, r.store.cfg.PageSize) {
				if err != nil {
					return err
				}
				for _, p := range projections {
					if _, err := r.ApplyUnfencedTx(ctx, tx, p, e); err != nil {
						return err
					}
				}
				from, n = e.GlobalPosition, n+1
			}
			if n < r.store.cfg.PageSize {
				from = head
			}
			return nil
		})
		if err != nil {
			return ReadModelInfo{}, fmt.Errorf("rebuild read model %s: replay after position %d (the model stays rebuilding): %w", m.Name, from, err)
		}
	}
	return r.FinishRebuild(ctx, m, names, replayFrom)
}

// AbandonRebuild sets m to abandoned: queries stay refused (rather than reading a partial
// table) and live appliers fenced until a new StartRebuild and FinishRebuild.
func (r *ReadModels) AbandonRebuild(ctx context.Context, m ReadModel) (ReadModelInfo, error) {
	return r.SetStatus(ctx, m, StatusAbandoned)
}

// SetStatus sets m's registry row to status with m's version and shape hash, creating it if
// needed; last_built_at is stamped only when status is live. It is the bare transition
// (keiro's rebuild, promote and abandonRebuild): no truncate, no checkpoint, no guard. Use
// StartRebuild and FinishRebuild for a rebuild.
func (r *ReadModels) SetStatus(ctx context.Context, m ReadModel, status ReadModelStatus) (ReadModelInfo, error) {
	var info ReadModelInfo
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		var err error
		info, err = r.transition(ctx, tx, m, status)
		return err
	})
	if err != nil {
		return ReadModelInfo{}, fmt.Errorf("set read model %s to %s: %w", m.Name, status, err)
	}
	return info, nil
}

func (r *ReadModels) transition(ctx context.Context, tx pgx.Tx, m ReadModel, status ReadModelStatus) (ReadModelInfo, error) {
	if err := checkName("Name", m.Name); err != nil {
		return ReadModelInfo{}, fmt.Errorf("transition: %w", err)
	}
	if err := checkName("status", string(status)); err != nil {
		return ReadModelInfo{}, fmt.Errorf("transition: %w", err)
	}
	info, err := scanReadModel(tx.QueryRow(ctx, r.store.q.rmTransition, m.Name, m.Version, m.ShapeHash, string(status)))
	if err != nil {
		return ReadModelInfo{}, fmt.Errorf("set registry status %s: %w", status, err)
	}
	return info, nil
}

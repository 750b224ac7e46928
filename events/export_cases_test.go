package events

import (
	"context"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
)

// WriteSnapshot writes a snapshot of state at version for stream with r's state version and
// encoder, through the statement the runner's post-commit write uses (keiro's writeSnapshotRow).
func WriteSnapshot[S, C, E any](ctx context.Context, r *Runner[S, C, E], db keiro.DB, stream string, version int64, state S) error {
	raw, err := r.cfg.EncodeSnapshot(state)
	if err != nil {
		return err
	}
	_, err = db.Exec(ctx, r.store.q.snapshotWrite, stream, version, r.cfg.SnapshotVersion, raw)
	return err
}

// BenignDuplicate is keiro's confirmBenignDuplicate: whether a dispatched command's failure err
// is the duplicate of id already stored in stream.
func BenignDuplicate(ctx context.Context, s *Store, db keiro.DB, stream string, id envelope.UUID, err error) bool {
	return s.benignDuplicate(ctx, db, stream, id, err)
}

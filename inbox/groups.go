package inbox

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/failure"
	"github.com/keiro-go/keiro/internal/failgroup"
)

// FailureGroups lists at most limit groups of the store consumer's failed rows (archived ones
// aside), largest first; a group's Where lists sources. It scans those rows: an operator's
// view, not a hot path.
func (s *Store) FailureGroups(ctx context.Context, db DB, limit int) ([]failure.Group, error) {
	return failgroup.Groups(ctx, db, "list inbox failure groups", s.sql.failureGroups, limit, s.cfg.Consumer)
}

// FailureGroupKeys lists the keys of at most limit rows of the group of class and message (as
// FailureGroups lists them), oldest failure first.
func (s *Store) FailureGroupKeys(ctx context.Context, db DB, class, message string, limit int) ([]Key, error) {
	return failgroup.Keys(ctx, db, "list the messages of an inbox failure group", s.sql.failureGroupKeys,
		func(r pgx.CollectableRow) (Key, error) {
			var k Key
			return k, r.Scan(&k.Source, &k.DedupeKey)
		}, class, message, limit, s.cfg.Consumer)
}

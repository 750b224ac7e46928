package events

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// SetBeforeAppend installs a test seam that runs before each append attempt.
func SetBeforeAppend[S, C, E any](r *Runner[S, C, E], fn func(ctx context.Context, stream string, attempt int)) {
	r.beforeAppend = fn
}

// CatchUpOnce returns a function that runs one catch-up pass of s on conn, keeping the
// worker's checkpoint and fences between calls.
func CatchUpOnce(s *Subscription, conn *pgx.Conn) func(ctx context.Context) error {
	w := newWorker(s, conn)
	loaded := false
	return func(ctx context.Context) error {
		if !loaded {
			if _, err := conn.Exec(ctx, s.store.q.subEnsure, s.cfg.Name); err != nil {
				return err
			}
			if err := w.loadPosition(ctx); err != nil {
				return err
			}
			loaded = true
		}
		return w.catchUp(ctx)
	}
}

// ProducerIdentityBytes exposes the canonical identity bytes.
var ProducerIdentityBytes = producerIdentityBytes

// SetProcessManagerBeforeAppend installs the before-append seam of pm's manager runner.
func SetProcessManagerBeforeAppend[S, I, E, C any](pm *ProcessManager[S, I, E, C], fn func(ctx context.Context, stream string, attempt int)) {
	pm.runner.beforeAppend = fn
}

package events

import "context"

// SetBeforeAppend installs a test seam that runs before each append attempt.
func SetBeforeAppend[S, C, E any](r *Runner[S, C, E], fn func(ctx context.Context, stream string, attempt int)) {
	r.beforeAppend = fn
}

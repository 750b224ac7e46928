package events_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/events"
)

// TestTimer_MaxAttemptsZeroIsNoCeiling pins keiro-go's reading of MaxAttempts 0. keiro's
// "dead-letters a timer that exceeds the attempt ceiling and never reclaims it" uses
// maxAttempts = Just 0, which makes a timer dead on its first claim without firing it; keiro's
// Nothing is no ceiling. A Go config cannot tell Just 0 from Nothing, and its zero value must be
// the safe one, so MaxAttempts 0 is no ceiling: a timer whose fire keeps failing is claimed
// again and again (here five times), never dead, and fires once the failure ends. The smallest
// ceiling is 1 (TestTimerAttemptCeiling: dead on the second claim, the first fire having run).
func TestTimer_MaxAttemptsZeroIsNoCeiling(t *testing.T) {
	t.Parallel()
	r := newTimerRig(t)
	ctx := context.Background()
	id := r.schedule(t, "counter-1", 0)
	w := r.worker(t, events.TimerWorkerConfig{MaxAttempts: 0})
	boom := errors.New("target unavailable")
	r.fail.Store(&boom)
	for attempt := int64(1); attempt <= 5; attempt++ {
		out, tm, err := w.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, events.TimerFireFailed, out, "attempt %d", attempt)
		require.Equal(t, attempt, tm.Attempts)
		requeued, err := r.store.RequeueStuckTimer(ctx, r.db.Pool, id)
		require.NoError(t, err)
		require.True(t, requeued)
	}
	r.fail.Store(nil)
	out, tm, err := w.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerFiredNow, out)
	require.Equal(t, int64(6), tm.Attempts)
	require.Equal(t, events.TimerFired, r.timer(t, id).Status)
	require.Equal(t, int64(6), r.fires.Load())
}

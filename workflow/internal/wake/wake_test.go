package wake_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/workflow/internal/wake"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// keiro Keiro.Wake: "returns WokenByTimeout when idle (no append)"
func TestWaitTimesOutWhenIdle(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	l, err := wake.Listen(context.Background(), db.Pool, "wake_idle")
	require.NoError(t, err)
	defer l.Close()
	r, err := l.Wait(context.Background(), 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, wake.ByTimeout, r)
}

// keiro Keiro.Wake: "returns WokenByNotify promptly after a real append"; one transaction's wakes wake once.
func TestWaitWokenByNotify(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	l, err := wake.Listen(ctx, db.Pool, "wake_notify")
	require.NoError(t, err)
	defer l.Close()
	// Three wakes in one transaction (PostgreSQL delivers them as one at commit).
	_, err = db.Pool.Exec(ctx, `SELECT pg_notify('wake_notify', ''), pg_notify('wake_notify', ''), pg_notify('wake_notify', '')`)
	require.NoError(t, err)
	// The fallback is far beyond the test's patience: only the notification can end the wait.
	r, err := l.Wait(ctx, time.Hour)
	require.NoError(t, err)
	require.Equal(t, wake.ByNotify, r)
	r, err = l.Wait(ctx, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, wake.ByTimeout, r, "one transaction's wakes wake once")
	require.Equal(t, "notify", wake.ByNotify.String())
}

// A cancelled caller ends the wait with its error.
func TestWaitEndsWithContext(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	l, err := wake.Listen(context.Background(), db.Pool, "wake_cancel")
	require.NoError(t, err)
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = l.Wait(ctx, time.Hour)
	require.ErrorIs(t, err, context.Canceled)
}

package backoff

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSleep(t *testing.T) {
	require.NoError(t, Sleep(context.Background(), time.Nanosecond))
	require.NoError(t, Sleep(context.Background(), 0))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, Sleep(ctx, time.Hour), context.Canceled, "a done context ends the wait at once")
	require.ErrorIs(t, Sleep(ctx, 0), context.Canceled)
}

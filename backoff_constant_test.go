package keiro

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestConstantBackoff: keiro's ConstantBackoff. Every retry's cap is d, however many retries;
// the delays keep equal jitter within [d/2, d]; a component's defaults do not change it; and a
// d of zero or less never waits, where a zero Backoff would take the defaults.
func TestConstantBackoff(t *testing.T) {
	def := Backoff{Initial: 5 * time.Millisecond, Max: time.Second, Multiplier: 2}
	b := ConstantBackoff(2 * time.Second).WithDefaults(def)
	require.Equal(t, Backoff{Initial: 2 * time.Second, Max: 2 * time.Second, Multiplier: 1}, b)
	require.NoError(t, b.Validate("Backoff"))
	for _, n := range []int{-1, 1, 2, 3, 10, 1000, math.MaxInt} {
		require.Equal(t, 2*time.Second, b.Cap(n), "retry %d", n)
		d := b.Delay(n)
		require.GreaterOrEqual(t, d, time.Second, "retry %d", n)
		require.LessOrEqual(t, d, 2*time.Second, "retry %d", n)
	}
	for _, d := range []time.Duration{0, -time.Second} {
		b := ConstantBackoff(d).WithDefaults(def)
		require.NoError(t, b.Validate("Backoff"))
		for n := 1; n <= 5; n++ {
			require.Zero(t, b.Delay(n), "ConstantBackoff(%s) retry %d", d, n)
		}
	}
}

package keiro

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCapGrowsAndIsCapped(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2}
	for n, want := range map[int]time.Duration{
		-3: 100 * time.Millisecond, 0: 100 * time.Millisecond, 1: 100 * time.Millisecond,
		2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 4: 800 * time.Millisecond,
		5: time.Second, 6: time.Second,
	} {
		require.Equal(t, want, b.Cap(n), "retry %d", n)
	}
	require.Equal(t, 150*time.Millisecond, Backoff{Initial: 100 * time.Millisecond, Max: time.Hour, Multiplier: 1.5}.Cap(2))
}

// A huge retry number saturates at Max: no overflow to a negative or zero delay, and no loop
// as long as the number.
func TestCapDoesNotOverflow(t *testing.T) {
	for _, b := range []Backoff{
		{Initial: time.Second, Max: 5 * time.Minute, Multiplier: 2},
		{Initial: time.Nanosecond, Max: time.Duration(math.MaxInt64), Multiplier: 10},
		{Initial: time.Millisecond, Max: time.Millisecond, Multiplier: 1},
	} {
		for _, n := range []int{63, 64, 1000, math.MaxInt32, math.MaxInt} {
			d := b.Cap(n)
			require.Equal(t, b.Max, d, "%+v retry %d", b, n)
			require.Positive(t, b.Delay(n), "%+v retry %d", b, n)
		}
	}
}

// Equal jitter: every delay lies in [d/2, d], and the two ends are reached.
func TestDelayJitterBounds(t *testing.T) {
	require.Equal(t, 500*time.Millisecond, jitter(time.Second, 0))
	require.Equal(t, 750*time.Millisecond, jitter(time.Second, 0.5))
	require.LessOrEqual(t, jitter(time.Second, math.Nextafter(1, 0)), time.Second)
	b := Backoff{Initial: 10 * time.Millisecond, Max: 80 * time.Millisecond, Multiplier: 2}
	for n := 1; n <= 6; n++ {
		c := b.Cap(n)
		for range 1000 {
			d := b.Delay(n)
			require.GreaterOrEqual(t, d, c/2, "retry %d", n)
			require.LessOrEqual(t, d, c, "retry %d", n)
		}
	}
}

func TestNegativeInitialMeansNoWait(t *testing.T) {
	b := Backoff{Initial: -1}.WithDefaults(Backoff{Initial: time.Second, Max: time.Minute})
	require.NoError(t, b.Validate("Backoff"))
	for _, n := range []int{1, 2, 100} {
		require.Zero(t, b.Delay(n))
	}
}

func TestWithDefaults(t *testing.T) {
	def := Backoff{Initial: time.Second, Max: time.Minute, Multiplier: 3}
	require.Equal(t, def, Backoff{}.WithDefaults(def))
	require.Equal(t, Backoff{Initial: time.Hour, Max: time.Hour, Multiplier: 3}, Backoff{Initial: time.Hour}.WithDefaults(def),
		"a default Max below a large Initial is raised to it")
	require.Equal(t, Backoff{Initial: time.Second, Max: time.Minute, Multiplier: DefaultMultiplier},
		Backoff{}.WithDefaults(Backoff{Initial: time.Second, Max: time.Minute}))
	require.Equal(t, Backoff{Initial: 2, Max: 3, Multiplier: 1.5}, Backoff{Initial: 2, Max: 3, Multiplier: 1.5}.WithDefaults(def))
}

func TestValidateNamesEveryField(t *testing.T) {
	err := Backoff{Initial: time.Second, Max: time.Millisecond, Multiplier: 0.5}.Validate("Retry")
	require.ErrorContains(t, err, "Retry.Max (1ms) must be at least Retry.Initial (1s)")
	require.ErrorContains(t, err, "Retry.Multiplier must be a finite number of at least 1, got 0.5")
	require.ErrorContains(t, Backoff{Initial: -1, Max: -1, Multiplier: 1}.Validate("B"), "B.Max must not be negative")
	require.ErrorContains(t, Backoff{Initial: 1, Max: 1, Multiplier: math.NaN()}.Validate("B"), "B.Multiplier")
	require.NoError(t, Backoff{Initial: 1, Max: 1, Multiplier: 1}.Validate("B"))
}

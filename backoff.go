package keiro

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Backoff is a capped exponential backoff with equal jitter: the delay before retry n
// (1-based) is d = min(Max, Initial × Multiplier^(n-1)), drawn uniformly from [d/2, d]. Equal
// jitter keeps at least half of the exponential growth (so a retry never comes right after a
// failure) while spreading the retries of components that failed together.
//
// The zero value of a field means the default of the component that uses it. A negative
// Initial means no wait at all (every delay is 0), where the component accepts it.
type Backoff struct {
	// Initial is the delay after the first failure.
	Initial time.Duration
	// Max caps the delay; at least Initial.
	Max time.Duration
	// Multiplier grows the delay per retry; at least 1.
	Multiplier float64
}

// DefaultMultiplier doubles the delay per retry, for components whose defaults do not name one.
const DefaultMultiplier = 2.0

// WithDefaults returns b with every zero field taken from def. A Max left to its default is
// raised to Initial, so that setting only a large Initial stays valid.
func (b Backoff) WithDefaults(def Backoff) Backoff {
	if b.Initial == 0 {
		b.Initial = def.Initial
	}
	if b.Max == 0 {
		b.Max = max(def.Max, b.Initial)
	}
	if b.Multiplier == 0 {
		b.Multiplier = def.Multiplier
	}
	if b.Multiplier == 0 {
		b.Multiplier = DefaultMultiplier
	}
	return b
}

// Validate reports every problem of a defaulted b, each naming its field under prefix (the
// config field holding b, such as "Retry" or "Backoff").
func (b Backoff) Validate(prefix string) error {
	var errs []error
	if b.Initial >= 0 && b.Max < b.Initial {
		errs = append(errs, fmt.Errorf("%s.Max (%s) must be at least %s.Initial (%s)", prefix, b.Max, prefix, b.Initial))
	}
	if b.Max < 0 {
		errs = append(errs, fmt.Errorf("%s.Max must not be negative, got %s", prefix, b.Max))
	}
	if b.Multiplier < 1 || math.IsNaN(b.Multiplier) || math.IsInf(b.Multiplier, 0) {
		errs = append(errs, fmt.Errorf("%s.Multiplier must be a finite number of at least 1, got %g", prefix, b.Multiplier))
	}
	return errors.Join(errs...)
}

// Cap returns the delay before retry n before jitter: min(Max, Initial × Multiplier^(n-1)). n
// below 1 counts as 1; any n, however large, gives at most Max (the exponent saturates rather
// than overflows). It is 0 when Initial is not positive.
func (b Backoff) Cap(n int) time.Duration {
	if b.Initial <= 0 {
		return 0
	}
	n = max(n, 1)
	d := float64(b.Initial) * math.Pow(max(b.Multiplier, 1), float64(n-1))
	if math.IsNaN(d) || d >= float64(b.Max) {
		return max(b.Max, 0)
	}
	return time.Duration(d)
}

// Delay returns the jittered delay before retry n (1-based): uniformly in [Cap(n)/2, Cap(n)].
func (b Backoff) Delay(n int) time.Duration {
	return jitter(b.Cap(n), rand.Float64())
}

// jitter places u ∈ [0, 1) in [d/2, d].
func jitter(d time.Duration, u float64) time.Duration {
	half := float64(d) / 2
	return time.Duration(half + u*half)
}

// ConstantBackoff returns a Backoff whose every retry waits d: Initial and Max d, Multiplier 1
// (keiro's ConstantBackoff, the default of keiro's outbox publisher). Like every keiro-go
// backoff it keeps equal jitter, so each delay lies in [d/2, d] where keiro waits exactly d: a
// fleet that failed together does not retry in lockstep. A d of zero or less retries at once
// (a negative Initial), rather than meaning "the component's default" as a zero Backoff does.
func ConstantBackoff(d time.Duration) Backoff {
	if d <= 0 {
		return Backoff{Initial: -1, Max: 0, Multiplier: 1}
	}
	return Backoff{Initial: d, Max: d, Multiplier: 1}
}

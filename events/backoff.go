package events

import "github.com/keiro-go/keiro/internal/backoff"

// Backoff is keiro's one retry delay, the same type as outbox.Backoff and inbox.Backoff: a
// capped exponential backoff with equal jitter, where the delay before retry n (1-based) is
// d = min(Max, Initial × Multiplier^(n-1)), drawn uniformly from [d/2, d]. A zero field takes
// the default of the config that holds it; a negative Initial means no wait.
type Backoff = backoff.Backoff

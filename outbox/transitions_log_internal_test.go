package outbox

import (
	"testing"
	"time"
)

// A storm of one kind is cut to the burst, then one line per second; the next line logged says
// how many were suppressed. Kinds have separate budgets.
func TestTransitionLogRateLimit(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	l := &transitionLog{now: func() time.Time { return now }}
	logged := 0
	for range 1000 {
		if ok, sup := l.allow(transitionDead); ok {
			logged++
			if sup != 0 {
				t.Fatalf("suppressed %d before the budget was spent", sup)
			}
		}
	}
	if logged != transitionLogBurst {
		t.Fatalf("logged %d of a storm of 1000, want the burst %d", logged, transitionLogBurst)
	}
	if ok, _ := l.allow(transitionRetried); !ok {
		t.Fatal("another kind shares the dead rows' budget")
	}
	now = now.Add(time.Second)
	ok, sup := l.allow(transitionDead)
	if !ok || sup != 1000-transitionLogBurst {
		t.Fatalf("after a second: ok=%v suppressed=%d, want true and %d", ok, sup, 1000-transitionLogBurst)
	}
	if ok, _ := l.allow(transitionDead); ok {
		t.Fatal("more than one line per second after the burst")
	}
	now = now.Add(time.Hour)
	for i := range transitionLogBurst {
		if ok, _ := l.allow(transitionDead); !ok {
			t.Fatalf("line %d of a new burst refused: the bucket refills to the burst", i)
		}
	}
}

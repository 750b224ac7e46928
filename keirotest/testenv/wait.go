package testenv

import (
	"sync"
	"testing"
	"time"
)

// WaitFor polls cond every 10ms until it reports true, and fails t with what (the condition the
// test waits for) when timeout passes first. Use it for state the test can only observe by
// asking (a row's status, a consumer group's offsets); where a component reports its work
// through a hook, count the reports with a Progress instead.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
	}
}

// Progress counts what a component reports through its hooks (a relay's batches, a consumer's
// commits, a subscription's checkpoints), so that a test waits for the reports instead of
// sleeping. The zero value is ready to use; it is safe for concurrent use.
type Progress struct {
	mu      sync.Mutex
	n       int64
	changed chan struct{} // closed and replaced whenever n changes
}

// Add adds d to the count and wakes the waiters.
func (p *Progress) Add(d int64) {
	p.mu.Lock()
	p.n += d
	p.wakeLocked()
	p.mu.Unlock()
}

// Set sets the count to n (a position, an offset) and wakes the waiters.
func (p *Progress) Set(n int64) {
	p.mu.Lock()
	p.n = n
	p.wakeLocked()
	p.mu.Unlock()
}

// Value returns the count.
func (p *Progress) Value() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// Wait blocks until the count is at least n, and fails t when timeout passes first, or when
// stop (if not nil) delivers the component's end (its Run's error) before.
func (p *Progress) Wait(t testing.TB, n int64, timeout time.Duration, stop <-chan error) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		cur, ch := p.n, p.chanLocked()
		p.mu.Unlock()
		if cur >= n {
			return
		}
		select {
		case <-ch:
		case err := <-stop:
			t.Fatalf("stopped at %d of %d: %v", cur, n, err)
		case <-deadline.C:
			t.Fatalf("timed out after %s at %d of %d", timeout, cur, n)
		}
	}
}

// Changed returns a channel that is closed at the next change of the count, for a test that
// waits on several things at once (a select). Take it before starting what changes the count.
func (p *Progress) Changed() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.chanLocked()
}

func (p *Progress) chanLocked() chan struct{} {
	if p.changed == nil {
		p.changed = make(chan struct{})
	}
	return p.changed
}

func (p *Progress) wakeLocked() {
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
}

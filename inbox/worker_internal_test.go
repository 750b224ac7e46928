package inbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBackoffDoesNotHoldUpAStop: a worker in backoff gives its concurrency slot up; if every
// slot is then taken by busy partitions, a revocation or shutdown must still stop the worker
// at once instead of waiting for a slot (which would outlast the shutdown and rebalance
// timeouts).
func TestBackoffDoesNotHoldUpAStop(t *testing.T) {
	t.Parallel()
	c := &Consumer{cfg: ConsumerConfig{Retry: Retry{Initial: time.Millisecond, Max: time.Millisecond}},
		sem: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &partitionWorker{c: c, quit: make(chan struct{}), ctx: ctx, cancel: cancel}
	require.True(t, w.acquire())
	slept := make(chan bool, 1)
	go func() { slept <- w.sleep(0) }()
	c.sem <- struct{}{} // a busy partition takes the slot the sleeping worker gave up
	w.stop(true)
	select {
	case ok := <-slept:
		require.False(t, ok, "a stopped worker reports that it is stopping")
	case <-time.After(5 * time.Second):
		t.Fatal("a worker waiting for a concurrency slot ignored its stop")
	}
	require.False(t, w.slot)
	<-c.sem
}

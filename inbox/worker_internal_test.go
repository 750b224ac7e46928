package inbox

import (
	"context"
	"testing"
	"time"

	"github.com/keiro-go/keiro"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestFinishingABatchWakesThePollLoop: a worker's buffer bounds count the batch in progress
// (inbox/internal/buffer tests the accounting), so taking a batch from a full buffer does not
// wake a poll loop that waits for room; finishing it does.
func TestFinishingABatchWakesThePollLoop(t *testing.T) {
	t.Parallel()
	c := &Consumer{cfg: ConsumerConfig{MaxBufferedRecords: 10, MaxBufferedBytes: 1 << 30}, room: make(chan struct{}, 1)}
	w := &partitionWorker{c: c, buf: newBuffer(&c.cfg)}
	recs := make([]*kgo.Record, 10)
	for i := range recs {
		recs[i] = &kgo.Record{Value: []byte("x"), Offset: int64(i)}
	}
	w.enqueue(recs)
	require.True(t, w.state().Full, "ten records fill the buffer")

	batch := w.take(6)
	require.Len(t, batch, 6)
	require.True(t, w.state().Full, "the records in progress still count")
	select {
	case <-c.room:
		t.Fatal("taking a batch made no room, yet the poll loop was woken")
	default:
	}

	w.finish(batch)
	require.False(t, w.state().Full, "a finished batch makes room")
	select {
	case <-c.room:
	default:
		t.Fatal("the poll loop was not woken when the batch finished")
	}
	require.False(t, w.idle())
	w.finish(w.take(10))
	require.True(t, w.idle())
}

// TestBackoffDoesNotHoldUpAStop: a worker in backoff gives its concurrency slot up; if every
// slot is then taken by busy partitions, a revocation or shutdown must still stop the worker
// at once instead of waiting for a slot (which would outlast the shutdown and rebalance
// timeouts).
func TestBackoffDoesNotHoldUpAStop(t *testing.T) {
	t.Parallel()
	c := &Consumer{cfg: ConsumerConfig{Retry: keiro.Backoff{Initial: time.Millisecond, Max: time.Millisecond}},
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

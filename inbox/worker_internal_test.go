package inbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestInProgressRecordsCountAgainstTheBuffer: a batch taken for processing still counts
// against MaxBufferedBytes and MaxBufferedRecords until it is finished, so a partition holds
// at most its bounds in all (buffered and in progress), not a full buffer plus a batch. A batch
// takes at most a quarter of MaxBufferedBytes.
func TestInProgressRecordsCountAgainstTheBuffer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cfg   ConsumerConfig
		value []byte
		batch int // records that take(6) returns
	}{
		// Ten records fill the bytes bound; a batch takes at most a quarter of it: two records.
		{"bytes", ConsumerConfig{MaxBufferedRecords: 1000, MaxBufferedBytes: 10 * recordBytes(&kgo.Record{Value: make([]byte, 410)})},
			make([]byte, 410), 2},
		{"records", ConsumerConfig{MaxBufferedRecords: 10, MaxBufferedBytes: 1 << 30}, []byte("x"), 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Consumer{cfg: tc.cfg, room: make(chan struct{}, 1)}
			w := &partitionWorker{c: c}
			recs := make([]*kgo.Record, 10)
			for i := range recs {
				recs[i] = &kgo.Record{Value: tc.value, Offset: int64(i)}
			}
			w.enqueue(recs, 10)
			full, empty, _ := w.state()
			require.True(t, full, "ten records fill the buffer")
			require.False(t, empty)

			batch := w.take(6)
			require.Len(t, batch, tc.batch)
			full, _, _ = w.state()
			require.True(t, full, "the records in progress still count")
			select {
			case <-c.room:
				t.Fatal("taking a batch made no room, yet the poll loop was woken")
			default:
			}

			w.finish(batch)
			full, _, _ = w.state()
			require.False(t, full, "a finished batch makes room")
			select {
			case <-c.room:
			default:
				t.Fatal("the poll loop was not woken when the batch finished")
			}
			for taken := len(batch); taken < len(recs); {
				rest := w.take(10)
				require.NotEmpty(t, rest)
				require.Equal(t, recs[taken].Offset, rest[0].Offset, "in offset order")
				taken += len(rest)
				w.finish(rest)
			}
			_, empty, _ = w.state()
			require.True(t, empty)
			require.Zero(t, w.held)
			require.Zero(t, w.heldBytes)
		})
	}
}

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

package pacing

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestTakeSize(t *testing.T) {
	t.Parallel()
	require.Equal(t, 50, TakeSize(50, 1000), "one batch")
	require.Equal(t, SingleChunk, TakeSize(1, 1000), "one at a time: a chunk")
	require.Equal(t, SingleChunk, TakeSize(0, 1000))
	require.Equal(t, 10, TakeSize(50, 10), "never more than CommitEvery")
	require.Equal(t, 10, TakeSize(1, 10))
}

// TestCommitsAreDueAfterEveryRecordsOrTheInterval: the pending offsets are due once every
// records are done or CommitInterval has passed since the last commit, on an injected clock; a
// partition that has not moved since is never due.
func TestCommitsAreDueAfterEveryRecordsOrTheInterval(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewCommits(10, start, func(int) time.Duration { return time.Second })
	require.False(t, c.Due(start, false))
	last, n := c.Flush(start)
	require.Nil(t, last, "nothing pending")
	require.Zero(t, n)

	c.Done(&kgo.Record{Topic: "billing", Partition: 2, Offset: 4, LeaderEpoch: 3, Value: []byte("large")}, 5)
	c.Done(&kgo.Record{Topic: "billing", Partition: 2, Offset: 8, LeaderEpoch: 3, Value: []byte("large")}, 4)
	c.Done(&kgo.Record{Topic: "billing", Partition: 2, Offset: 9}, 0)
	require.False(t, c.Due(start.Add(CommitInterval-time.Nanosecond), false), "9 of 10 records, within the interval")
	require.True(t, c.Due(start.Add(CommitInterval), false), "the interval has passed")
	c.Done(&kgo.Record{Topic: "billing", Partition: 2, Offset: 9, LeaderEpoch: 3, Value: []byte("large")}, 1)
	require.True(t, c.Due(start, false), "10 of 10 records")

	at := start.Add(time.Millisecond)
	last, n = c.Flush(at)
	require.Equal(t, 10, n)
	require.Equal(t, &kgo.Record{Topic: "billing", Partition: 2, Offset: 9, LeaderEpoch: 3}, last,
		"only what the offset commit needs is kept")
	require.False(t, c.Due(at.Add(CommitInterval), false), "nothing moved since the flush")
	last, n = c.Flush(at.Add(CommitInterval))
	require.Nil(t, last)
	require.Zero(t, n)

	// A transaction marker moves the partition without a record to count: the commit steps
	// over it.
	c.Done(&kgo.Record{Topic: "billing", Partition: 2, Offset: 10, LeaderEpoch: 3}, 0)
	require.False(t, c.Due(at.Add(CommitInterval-time.Nanosecond), false), "the flush started a new interval")
	require.True(t, c.Due(at.Add(CommitInterval), false))
	last, n = c.Flush(at.Add(CommitInterval))
	require.Equal(t, &kgo.Record{Topic: "billing", Partition: 2, Offset: 10, LeaderEpoch: 3}, last)
	require.Zero(t, n, "a marker is no record")
}

// TestCommitsAnIdleWorkersOffsetsAreDue: a worker whose buffer ran dry commits what it has at
// once, within the interval and below every records; with nothing pending it does not.
func TestCommitsAnIdleWorkersOffsetsAreDue(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewCommits(10, start, func(int) time.Duration { return time.Second })
	require.False(t, c.Due(start, true), "nothing pending")
	c.Done(&kgo.Record{Topic: "billing", Offset: 0}, 1)
	require.False(t, c.Due(start, false))
	require.True(t, c.Due(start, true))
}

// TestCommitsAFailedCommitIsRetriedAfterItsBackoff: a commit that failed stays pending, merged
// with what is done after it, and is due again (idle or not) only once the backoff after that
// many failures in a row has passed; a success starts the backoff over. The failed commit's
// records are counted once, by the commit that lands.
func TestCommitsAFailedCommitIsRetriedAfterItsBackoff(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var asked []int
	c := NewCommits(10, start, func(n int) time.Duration {
		asked = append(asked, n)
		return time.Duration(n) * time.Second
	})
	_, ok := c.RetryAt()
	require.False(t, ok, "nothing failed")

	c.Done(&kgo.Record{Topic: "billing", Partition: 1, Offset: 4}, 5)
	last, n := c.Flush(start)
	c.Failed(last, n, start)
	at, ok := c.RetryAt()
	require.True(t, ok)
	require.Equal(t, start.Add(time.Second), at, "the first failure's backoff")
	require.False(t, c.Due(start.Add(time.Second-time.Nanosecond), true), "idle, but within the backoff")
	require.False(t, c.Due(start.Add(time.Second-time.Nanosecond), false))

	c.Done(&kgo.Record{Topic: "billing", Partition: 1, Offset: 6}, 2)
	require.True(t, c.Due(start.Add(time.Second), true))
	last, n = c.Flush(start.Add(time.Second))
	require.Equal(t, &kgo.Record{Topic: "billing", Partition: 1, Offset: 6}, last, "the newer offset covers the failed one")
	require.Equal(t, 7, n, "the failed commit's records and the newer ones")
	c.Failed(last, n, start.Add(time.Second))
	at, ok = c.RetryAt()
	require.True(t, ok)
	require.Equal(t, start.Add(3*time.Second), at, "the second failure in a row backs off longer")

	// A stopping worker flushes regardless of the backoff.
	last, n = c.Flush(start.Add(time.Second))
	require.Equal(t, int64(6), last.Offset)
	require.Equal(t, 7, n)
	c.Committed()
	_, ok = c.RetryAt()
	require.False(t, ok, "committed")
	require.False(t, c.Due(start.Add(time.Hour), true), "nothing pending")

	c.Done(&kgo.Record{Topic: "billing", Partition: 1, Offset: 7}, 1)
	last, n = c.Flush(start.Add(time.Hour))
	c.Failed(last, n, start.Add(time.Hour))
	at, _ = c.RetryAt()
	require.Equal(t, start.Add(time.Hour+time.Second), at, "a success started the backoff over")
	require.Equal(t, []int{1, 2, 1}, asked)
}

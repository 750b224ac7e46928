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
	c := NewCommits(10, start)
	require.False(t, c.Due(start))
	last, n := c.Flush(start)
	require.Nil(t, last, "nothing pending")
	require.Zero(t, n)

	c.Done(&kgo.Record{Topic: "billing", Partition: 2, Offset: 4, LeaderEpoch: 3, Value: []byte("large")}, 5)
	c.Done(&kgo.Record{Topic: "billing", Partition: 2, Offset: 8, LeaderEpoch: 3, Value: []byte("large")}, 4)
	c.Done(&kgo.Record{Topic: "billing", Partition: 2, Offset: 9}, 0)
	require.False(t, c.Due(start.Add(CommitInterval-time.Nanosecond)), "9 of 10 records, within the interval")
	require.True(t, c.Due(start.Add(CommitInterval)), "the interval has passed")
	c.Done(&kgo.Record{Topic: "billing", Partition: 2, Offset: 9, LeaderEpoch: 3, Value: []byte("large")}, 1)
	require.True(t, c.Due(start), "10 of 10 records")

	at := start.Add(time.Millisecond)
	last, n = c.Flush(at)
	require.Equal(t, 10, n)
	require.Equal(t, &kgo.Record{Topic: "billing", Partition: 2, Offset: 9, LeaderEpoch: 3}, last,
		"only what the offset commit needs is kept")
	require.False(t, c.Due(at.Add(CommitInterval)), "nothing moved since the flush")
	last, n = c.Flush(at.Add(CommitInterval))
	require.Nil(t, last)
	require.Zero(t, n)

	// A transaction marker moves the partition without a record to count: the commit steps
	// over it.
	c.Done(&kgo.Record{Topic: "billing", Partition: 2, Offset: 10, LeaderEpoch: 3}, 0)
	require.False(t, c.Due(at.Add(CommitInterval-time.Nanosecond)), "the flush started a new interval")
	require.True(t, c.Due(at.Add(CommitInterval)))
	last, n = c.Flush(at.Add(CommitInterval))
	require.Equal(t, &kgo.Record{Topic: "billing", Partition: 2, Offset: 10, LeaderEpoch: 3}, last)
	require.Zero(t, n, "a marker is no record")
}

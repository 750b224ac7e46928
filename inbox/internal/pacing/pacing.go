// Package pacing decides how a partition's worker paces its work: how many buffered records
// it takes per turn, and when it commits the offsets of the records it is done with. Offsets
// are committed when the worker runs out of buffered records, after CommitEvery of them, or
// CommitInterval after the last commit, so that a commit's round trip to Kafka seldom holds up
// records that are waiting; the worker takes one batch per turn so that those bounds are
// checked between batches. A commit that failed stays pending and is retried after a backoff,
// whether or not more records come: a quiet partition's committed offset does not stay behind.
package pacing

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// SingleChunk is how many records a worker in one-at-a-time mode takes from its buffer per
// turn (each its own transaction).
const SingleChunk = 100

// CommitInterval bounds how long a busy worker keeps done records' offsets uncommitted.
const CommitInterval = 100 * time.Millisecond

// TakeSize returns how many buffered records a worker takes per turn: one batch of batchSize
// records, or in one-at-a-time mode (batchSize <= 1) a chunk of SingleChunk records, never
// more than commitEvery.
func TakeSize(batchSize, commitEvery int) int {
	n := batchSize
	if n <= 1 {
		n = SingleChunk
	}
	return min(n, commitEvery)
}

// Commits counts a partition's done records whose offsets are not committed yet. It is used
// by the worker's goroutine alone.
type Commits struct {
	every     int
	retry     func(n int) time.Duration
	last      *kgo.Record
	pending   int
	committed time.Time

	// failures counts the commits that failed in a row; retryAt is when the last of them is
	// to be tried again.
	failures int
	retryAt  time.Time
}

// NewCommits returns a count of done records that is due after every records (CommitEvery)
// or CommitInterval after now. retry is the backoff after the nth failed commit in a row
// (keiro.Backoff.Delay).
func NewCommits(every int, now time.Time, retry func(n int) time.Duration) *Commits {
	return &Commits{every: every, retry: retry, committed: now}
}

// Done records that the partition is done up to r, and that n more records were handled on
// the way. n may be 0: r is then a transaction's marker (a control record) that the commit
// steps over, so that the group's committed offset reaches the end of the partition. Only what
// the offset commit needs of r is kept: the record itself would keep its whole fetched batch's
// bytes alive until the next commit.
func (c *Commits) Done(r *kgo.Record, n int) {
	c.last = &kgo.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, LeaderEpoch: r.LeaderEpoch}
	c.pending += max(n, 0)
}

// Due reports that the pending offsets are to be committed at now: the worker's buffer has
// run dry (idle), every records are pending, or CommitInterval has passed since the last
// commit. After a failed commit nothing is due until its backoff has passed (RetryAt).
func (c *Commits) Due(now time.Time, idle bool) bool {
	if c.last == nil || now.Before(c.retryAt) {
		return false
	}
	return idle || c.pending >= c.every || now.Sub(c.committed) >= CommitInterval
}

// Failed puts back the commit Flush returned (last, covering n records) after it failed at
// now: it stays pending, merged into any that followed, and is due again once the backoff
// after this many failures in a row has passed.
func (c *Commits) Failed(last *kgo.Record, n int, now time.Time) {
	if c.last == nil {
		c.last = last
	}
	c.pending += max(n, 0)
	c.failures++
	c.retryAt = now.Add(c.retry(c.failures))
}

// Committed records that the commit Flush returned succeeded: the backoff starts over.
func (c *Commits) Committed() {
	c.failures, c.retryAt = 0, time.Time{}
}

// RetryAt is when a failed commit is to be tried again; ok is false when none waits.
func (c *Commits) RetryAt() (at time.Time, ok bool) {
	return c.retryAt, c.failures > 0 && c.last != nil
}

// Flush returns the record whose offset to commit past and how many handled records that
// commit covers, and starts the next interval at now. last = nil means the partition has not
// moved since the last flush (and the interval goes on). It ignores a failed commit's
// backoff: a worker that stops flushes what it has. The caller reports the commit's outcome
// with Committed or Failed.
func (c *Commits) Flush(now time.Time) (last *kgo.Record, n int) {
	if c.last == nil {
		return nil, 0
	}
	last, n = c.last, c.pending
	c.last, c.pending, c.committed = nil, 0, now
	return last, n
}

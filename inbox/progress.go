package inbox

import (
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// DefaultStuckAfter is how long a partition with records waiting may go without moving before
// PartitionProgress.StuckSince reports it stuck (the console's default).
const DefaultStuckAfter = time.Minute

// PartitionProgress is what a running Consumer knows of one partition it owns: the record in
// flight, the records fetched and waiting, its last offset commit, and when the partition last
// moved. It is the consumer's own view, read from memory without asking Kafka: the oldest
// waiting record is the oldest record fetched and not yet done, so records Kafka holds beyond
// what the consumer fetched are not in it (Kafka's lag, GroupLag, counts them).
type PartitionProgress struct {
	// Topic and Partition name the partition.
	Topic     string
	Partition int32
	// AssignedAt is when this member was assigned the partition.
	AssignedAt time.Time
	// Waiting counts the records fetched and not yet done (in the inbox or dead-lettered),
	// the record in flight included.
	Waiting int
	// InFlight is the offset of the record being processed (the first of an inbox batch), or
	// -1 when the partition's worker is between records.
	InFlight int64
	// InFlightSince is when the record in flight was started; zero when none is.
	InFlightSince time.Time
	// OldestWaiting is the Kafka timestamp of the oldest waiting record (the one in flight, or
	// the next one buffered): the age of the oldest unconsumed record is how long ago it was;
	// zero when nothing waits.
	OldestWaiting time.Time
	// Committed is the offset this member last committed (the next record to read), or -1
	// when it has committed none since the assignment.
	Committed int64
	// CommittedAt is when Committed was committed; zero when it is -1.
	CommittedAt time.Time
	// MovedAt is when the partition last moved: a record started or finished, or the
	// partition was assigned. A record retried again and again does not move it.
	MovedAt time.Time
	// DeadLetterBlockedSince is when the partition began waiting on a failing dead-letter
	// produce (the dead-letter topic missing, not writable, or Kafka unavailable); zero when
	// it is not waiting on one. DeadLetterError is the last failure.
	DeadLetterBlockedSince time.Time
	DeadLetterError        string
}

// StuckSince reports whether p is stuck at now: records wait and nothing moved for at least
// after. since is when it last moved (MovedAt).
func (p PartitionProgress) StuckSince(now time.Time, after time.Duration) (since time.Time, stuck bool) {
	if p.Waiting == 0 || now.Sub(p.MovedAt) < after {
		return time.Time{}, false
	}
	return p.MovedAt, true
}

// Progress returns the progress of each partition the consumer owns, sorted by topic and
// partition. It is safe to call while Run runs (from an admin handler); before Run, and after
// it returns, the list is empty.
func (c *Consumer) Progress() []PartitionProgress {
	c.mu.Lock()
	ws := make([]*partitionWorker, 0, len(c.workers))
	for _, w := range c.workers {
		ws = append(ws, w)
	}
	c.mu.Unlock()
	out := make([]PartitionProgress, 0, len(ws))
	for _, w := range ws {
		out = append(out, w.progress())
	}
	slices.SortFunc(out, func(a, b PartitionProgress) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(a.Partition - b.Partition)
	})
	return out
}

// tracker records a worker's progress for Consumer.Progress.
type tracker struct {
	mu            sync.Mutex
	assignedAt    time.Time
	inFlight      int64
	inFlightSince time.Time
	inFlightTS    time.Time
	committed     int64
	committedAt   time.Time
	movedAt       time.Time
	dlqSince      time.Time
	dlqErr        string
}

func newTracker(now time.Time) *tracker {
	return &tracker{assignedAt: now, movedAt: now, inFlight: -1, committed: -1}
}

// begin records that r is in flight; a record already in flight (retried) does not move the
// partition.
func (t *tracker) begin(r *kgo.Record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.inFlight == r.Offset {
		return
	}
	now := time.Now()
	t.inFlight, t.inFlightSince, t.inFlightTS, t.movedAt = r.Offset, now, r.Timestamp, now
}

// end records that the records in flight are done.
func (t *tracker) end() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.inFlight, t.inFlightSince, t.inFlightTS, t.movedAt = -1, time.Time{}, time.Time{}, time.Now()
}

// deadLetterBlocked records a failed dead-letter produce (err) of the record in flight, or
// with err nil that the partition no longer waits on one.
func (t *tracker) deadLetterBlocked(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err == nil {
		t.dlqSince, t.dlqErr = time.Time{}, ""
		return
	}
	if t.dlqSince.IsZero() {
		t.dlqSince = time.Now()
	}
	t.dlqErr = err.Error()
}

// committedTo records an offset commit.
func (t *tracker) committedTo(offset int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.committed, t.committedAt = offset, time.Now()
}

// progress is the worker's PartitionProgress.
func (w *partitionWorker) progress() PartitionProgress {
	w.mu.Lock()
	queued := w.buf.Len()
	held, _ := w.buf.Held()
	head := w.buf.Head()
	w.mu.Unlock()
	t := w.track
	t.mu.Lock()
	defer t.mu.Unlock()
	p := PartitionProgress{
		Topic: w.tp.topic, Partition: w.tp.partition, AssignedAt: t.assignedAt, Waiting: queued + held,
		InFlight: t.inFlight, InFlightSince: t.inFlightSince, Committed: t.committed, CommittedAt: t.committedAt,
		MovedAt: t.movedAt, DeadLetterBlockedSince: t.dlqSince, DeadLetterError: t.dlqErr,
	}
	switch {
	case t.inFlight >= 0:
		p.OldestWaiting = t.inFlightTS
	case head != nil:
		p.OldestWaiting = head.Timestamp
	}
	if p.Waiting == 0 {
		p.OldestWaiting = time.Time{}
	}
	return p
}

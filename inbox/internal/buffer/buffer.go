// Package buffer holds one partition's fetched records between the consumer's poll loop and
// the partition's worker, and accounts for them against the consumer's bounds
// (MaxBufferedRecords, MaxBufferedBytes): the records buffered and the records taken for
// processing and not yet finished both count, so a partition holds at most its bounds in all
// (plus one poll's worth). It also makes the back-pressure decisions over those counts (see
// Decide); acting on them, pausing and resuming the client's fetches, is its owner's.
//
// A Buffer is not safe for concurrent use: its owner locks around every call, and may keep
// the lock across a call and the client call it decides (a pause under the same lock as the
// decision, so that a concurrent finish cannot resume first).
package buffer

import (
	"slices"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Limits bound what one partition holds, buffered or in progress.
type Limits struct {
	// Records is the bound in records (MaxBufferedRecords).
	Records int
	// Bytes is the bound in bytes, as RecordBytes counts them (MaxBufferedBytes).
	Bytes int
}

// MaxBatchShare: a batch takes at most Limits.Bytes/MaxBatchShare bytes of records.
const MaxBatchShare = 4

// Buffer is one partition's records: buffered (pushed, not yet taken) and held (taken, not
// yet finished). The zero value is not usable; call New.
type Buffer struct {
	limits Limits
	queue  []*kgo.Record
	bytes  int // of the records in queue
	// held and heldBytes count the records taken from queue and not yet finished: a batch in
	// progress, with everything built from it, until its transaction has ended.
	held, heldBytes int
	paused          bool
}

// New returns an empty buffer bounded by l.
func New(l Limits) *Buffer { return &Buffer{limits: l} }

// Push appends fetched records, in offset order, to the buffer.
func (b *Buffer) Push(recs []*kgo.Record) {
	for _, r := range recs {
		b.bytes += RecordBytes(r)
	}
	b.queue = append(b.queue, recs...)
}

// Take removes up to n records from the head of the buffer, and no more than
// Limits.Bytes/MaxBatchShare bytes of them (at least one record): what a batch is turned into
// while it is processed (decoded events, the inbox rows' parameters, the connection's buffers)
// is a few times its bytes, so large records make smaller batches. The records still count
// against the bounds until Finish: taking a batch makes no room, finishing it does. Take
// returns nil when the buffer is empty or n < 1.
func (b *Buffer) Take(n int) []*kgo.Record {
	k, sum := 0, 0
	for k < min(n, len(b.queue)) {
		rb := RecordBytes(b.queue[k])
		if k > 0 && sum+rb > b.limits.Bytes/MaxBatchShare {
			break
		}
		k, sum = k+1, sum+rb
	}
	if k == 0 {
		return nil
	}
	// A copy, and the buffer's references cleared: the records are garbage once their batch
	// is finished, whatever the buffer's backing array still holds.
	recs := slices.Clone(b.queue[:k])
	clear(b.queue[:k])
	b.queue = b.queue[k:]
	b.bytes -= sum
	b.held += k
	b.heldBytes += sum
	if len(b.queue) == 0 {
		b.queue, b.bytes = nil, 0
	}
	return recs
}

// Finish releases recs, taken by Take, once their transactions have ended. resume reports
// that the buffer was paused and now holds no more than half its bounds: it is no longer
// paused, and its owner resumes the partition's fetches. room reports that the buffer is not
// full.
func (b *Buffer) Finish(recs []*kgo.Record) (resume, room bool) {
	sum := 0
	for _, r := range recs {
		sum += RecordBytes(r)
	}
	b.held -= len(recs)
	b.heldBytes -= sum
	if b.paused && len(b.queue)+b.held <= b.limits.Records/2 && b.bytes+b.heldBytes <= b.limits.Bytes/2 {
		b.paused, resume = false, true
	}
	return resume, !b.Full()
}

// Full reports that the partition holds Limits.Records records or Limits.Bytes bytes,
// buffered or in progress. A poll adds at most one fetch per partition, so a partition never
// holds more than that over its bounds.
func (b *Buffer) Full() bool {
	return len(b.queue)+b.held >= b.limits.Records || b.bytes+b.heldBytes >= b.limits.Bytes
}

// Len returns how many records are buffered, not counting those taken and not finished.
func (b *Buffer) Len() int { return len(b.queue) }

// Held returns the records taken and not yet finished, and their bytes.
func (b *Buffer) Held() (records, bytes int) { return b.held, b.heldBytes }

// Pause marks the buffer paused if it is full and not paused already, and reports whether it
// did: its owner then pauses the partition's fetches (Finish reports when to resume them).
func (b *Buffer) Pause() bool {
	if b.paused || !b.Full() {
		return false
	}
	b.paused = true
	return true
}

// Unpause clears the paused mark, reporting whether it was set: a worker that stops resumes
// its partition's fetches, or they would stay paused under the next assignment.
func (b *Buffer) Unpause() bool {
	was := b.paused
	b.paused = false
	return was
}

// State is what the poll loop reads of a buffer before it polls.
func (b *Buffer) State() State {
	return State{Full: b.Full(), Empty: len(b.queue) == 0, Paused: b.paused}
}

// RecordBytes is what a record counts for Limits.Bytes: what it takes in memory, its key,
// value and headers and the Go structures that hold them (the client's decoded form of the
// record, kmsg.Record, lives as long as the kgo.Record made from it). The structures matter
// for small records: a keiro record's 19 headers take about 1.8 KiB of them.
func RecordBytes(r *kgo.Record) int {
	n := recordOverhead + len(r.Key) + len(r.Value) + len(r.Headers)*headerOverhead
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// The Go structures of one record and of one of its headers.
const (
	recordOverhead = int(unsafe.Sizeof(kgo.Record{}) + unsafe.Sizeof(kmsg.Record{}))
	headerOverhead = int(unsafe.Sizeof(kgo.RecordHeader{}) + unsafe.Sizeof(kmsg.Header{}))
)

// Head is the oldest record not yet taken, or nil when none is buffered.
func (b *Buffer) Head() *kgo.Record {
	if len(b.queue) == 0 {
		return nil
	}
	return b.queue[0]
}

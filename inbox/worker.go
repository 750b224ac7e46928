package inbox

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox/internal/buffer"
	"github.com/keiro-go/keiro/inbox/internal/pacing"
	"github.com/keiro-go/keiro/internal/kafkaerr"
	"github.com/keiro-go/keiro/tracing"
)

// partitionWorker processes one assigned partition in offset order. This file holds its
// lifecycle, its buffer (inbox/internal/buffer), its turns and offset commits
// (inbox/internal/pacing) and its concurrency slot; process.go the path of its records through
// the inbox (decide.go, apply.go, settle.go), deadletter_produce.go how it dead-letters one.
type partitionWorker struct {
	c  *Consumer
	cl *kgo.Client
	tp topicPartition

	// mu guards buf, and is held across a pause or resume of the partition's fetches and
	// the buffer's decision to make it.
	mu  sync.Mutex
	buf *buffer.Buffer

	wake     chan struct{}
	quit     chan struct{}
	quitOnce sync.Once
	noCommit atomic.Bool
	done     chan struct{}
	ctx      context.Context
	cancel   context.CancelFunc

	// slot reports that the worker holds a concurrency slot (a token in Consumer.sem). Only
	// the worker's goroutine reads or writes it.
	slot bool
	// track records the partition's progress for Consumer.Progress (progress.go).
	track *tracker
}

func newPartitionWorker(c *Consumer, cl *kgo.Client, tp topicPartition) *partitionWorker {
	ctx, cancel := context.WithCancel(c.baseCtx)
	// A partition paused under a previous assignment would otherwise stay paused.
	cl.ResumeFetchPartitions(map[string][]int32{tp.topic: {tp.partition}})
	return &partitionWorker{
		c: c, cl: cl, tp: tp, buf: newBuffer(&c.cfg), wake: make(chan struct{}, 1), quit: make(chan struct{}),
		done: make(chan struct{}), ctx: ctx, cancel: cancel, track: newTracker(time.Now()),
	}
}

// partitions is the worker's partition as the client's pause and resume take it.
func (w *partitionWorker) partitions() map[string][]int32 {
	return map[string][]int32{w.tp.topic: {w.tp.partition}}
}

// newBuffer returns a partition's buffer, bounded by cfg's MaxBufferedRecords and
// MaxBufferedBytes.
func newBuffer(cfg *ConsumerConfig) *buffer.Buffer {
	return buffer.New(buffer.Limits{Records: cfg.MaxBufferedRecords, Bytes: cfg.MaxBufferedBytes})
}

// enqueue hands fetched records to the worker. A buffer that reaches MaxBufferedRecords or
// MaxBufferedBytes holds up the next poll (see awaitRoom in backpressure.go).
func (w *partitionWorker) enqueue(recs []*kgo.Record) {
	w.mu.Lock()
	w.buf.Push(recs)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// take removes up to n records from the head of the buffer, no more than a quarter of
// MaxBufferedBytes (buffer.Buffer.Take). They still count against the buffer's bounds until
// finish.
func (w *partitionWorker) take(n int) []*kgo.Record {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Take(n)
}

// finish releases recs, taken by take, once the worker is done with them (their
// transactions have ended): it resumes the partition's fetches once a paused partition holds
// no more than half its bounds, and wakes the poll loop if it waits for room.
func (w *partitionWorker) finish(recs []*kgo.Record) {
	w.mu.Lock()
	resumed, room := w.buf.Finish(recs)
	if resumed {
		w.cl.ResumeFetchPartitions(w.partitions())
	}
	w.mu.Unlock()
	if resumed {
		w.c.pressure(pressureResume, w.tp)
	}
	if len(recs) > 0 && room {
		w.c.signalRoom()
	}
}

// stop tells the worker to stop after the record in progress; commit=false (a lost
// partition) means it commits no more offsets.
func (w *partitionWorker) stop(commit bool) {
	if !commit {
		w.noCommit.Store(true)
	}
	w.quitOnce.Do(func() { close(w.quit) })
}

// quitting reports that stop was called.
func (w *partitionWorker) quitting() bool {
	select {
	case <-w.quit:
		return true
	default:
		return false
	}
}

// run is the worker's goroutine: it takes its buffered records a turn at a time until stopped.
func (w *partitionWorker) run() {
	defer close(w.done)
	defer w.cancel()
	defer func() {
		w.mu.Lock()
		if w.buf.Unpause() {
			w.cl.ResumeFetchPartitions(w.partitions())
		}
		w.mu.Unlock()
	}()
	// The worker takes one batch (BatchSize records; a chunk of records in one-at-a-time
	// mode) per turn and commits offsets between them, as inbox/internal/pacing decides.
	// A commit that fails stays pending and is retried after the Retry backoff: with the next
	// batch's, or on its own when the partition is quiet.
	commits := pacing.NewCommits(w.c.cfg.CommitEvery, time.Now(), w.c.cfg.Retry.Delay)
	flush := func() {
		last, n := commits.Flush(time.Now())
		if last == nil {
			return
		}
		if w.commit(last, n) {
			commits.Committed()
		} else {
			commits.Failed(last, n, time.Now())
		}
	}
	defer flush()
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		retry.Stop()
		var retryC <-chan time.Time
		if at, ok := commits.RetryAt(); ok {
			retry.Reset(time.Until(at))
			retryC = retry.C
		}
		select {
		case <-w.quit:
			return
		case <-retryC:
			if commits.Due(time.Now(), true) {
				flush()
			}
			continue
		case <-w.wake:
		}
		for !w.quitting() {
			recs := w.take(pacing.TakeSize(w.c.cfg.BatchSize, w.c.cfg.CommitEvery))
			if len(recs) == 0 {
				break
			}
			if !w.acquire() {
				return
			}
			n := w.processChunk(recs)
			w.release()
			w.track.end()
			if n > 0 {
				commits.Done(recs[n-1], handled(recs[:n]))
			}
			if n < len(recs) {
				return // abandoned while stopping
			}
			w.finish(recs)
			if commits.Due(time.Now(), w.idle()) {
				flush()
			}
		}
	}
}

// handled counts the records of recs that went through the inbox: all but transaction markers.
func handled(recs []*kgo.Record) int {
	n := 0
	for _, r := range recs {
		if !r.Attrs.IsControl() {
			n++
		}
	}
	return n
}

// idle reports that no record is buffered for the worker.
func (w *partitionWorker) idle() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Len() == 0
}

// sleep waits the backoff delay after n earlier retries (n+1 is the retry's number); false
// means the worker is stopping. It is called while the worker holds a concurrency slot, which
// it gives up while waiting so that a partition in backoff does not starve the others.
func (w *partitionWorker) sleep(n int) bool {
	return w.sleepFor(w.c.cfg.Retry.Delay(max(n, 0) + 1))
}

// sleepFor is sleep for d. Taking the slot back waits for quit and cancellation too, so a
// worker in backoff never holds up a revocation or a shutdown behind busy partitions.
func (w *partitionWorker) sleepFor(d time.Duration) bool {
	w.release()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.quit:
		return false
	case <-w.ctx.Done():
		return false
	}
	return w.acquire()
}

// acquire takes a concurrency slot; false means the worker is stopping.
func (w *partitionWorker) acquire() bool {
	select {
	case w.c.sem <- struct{}{}:
		w.slot = true
		return true
	case <-w.quit:
		return false
	case <-w.ctx.Done():
		return false
	}
}

// release gives the worker's concurrency slot back, if it holds one.
func (w *partitionWorker) release() {
	if w.slot {
		w.slot = false
		<-w.c.sem
	}
}

// commit commits the offset after last, unless the partition was lost, and reports whether the
// offset is settled: false means the commit failed and is to be retried. n counts the records
// it covers that went through the inbox; last may be a transaction's marker, which the commit
// steps over (n = 0 when nothing else is covered).
func (w *partitionWorker) commit(last *kgo.Record, n int) bool {
	if w.noCommit.Load() {
		return true // no longer this worker's to commit
	}
	ctx, cancel := context.WithTimeout(w.c.baseCtx, w.c.cfg.ShutdownTimeout)
	defer cancel()
	if err := w.c.offsets.Commit(ctx, w.cl, last); err != nil {
		w.c.commitFailures.Add(1)
		w.c.in.commitFailed(ctx, w.c.cfg.Group, last.Topic, last.Partition, kafkaerr.Code(err))
		w.c.log.WarnContext(ctx, "offset commit failed; it is retried after a backoff (if the partition moves to another consumer first, the records are redelivered and classify as duplicates)",
			"topic", last.Topic, "partition", last.Partition, "offset", last.Offset+1, "error", err)
		return false
	}
	w.c.committed.Add(int64(n))
	w.track.committedTo(last.Offset + 1)
	if w.c.cfg.OnCommitted != nil {
		w.c.cfg.OnCommitted(Commit{Topic: last.Topic, Partition: last.Partition, Offset: last.Offset + 1, Records: n})
	}
	return true
}

// logCtx is the worker's context carrying r's trace context (its traceparent header, read
// from the raw headers so that an undecodable record has it too): a line logged about r carries
// the trace_id of the event's trace, from the producing transaction on.
func (w *partitionWorker) logCtx(r *kgo.Record) context.Context {
	var tc envelope.TraceContext
	for _, h := range r.Headers {
		switch h.Key {
		case envelope.HeaderTraceparent:
			tc.Traceparent = string(h.Value)
		case envelope.HeaderTracestate:
			tc.Tracestate = string(h.Value)
		}
	}
	return tracing.ContextWith(w.ctx, &tc)
}

// warnRecord logs a warning about r, in its trace (logCtx), with its topic, partition and offset
// ahead of args.
func (w *partitionWorker) warnRecord(r *kgo.Record, msg string, args ...any) {
	w.c.log.WarnContext(w.logCtx(r), msg, append([]any{"topic", r.Topic, "partition", r.Partition, "offset", r.Offset}, args...)...)
}

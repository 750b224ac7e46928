package inbox

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox/internal/buffer"
	"github.com/keiro-go/keiro/inbox/internal/pacing"
	"github.com/keiro-go/keiro/tracing"
)

// partitionWorker processes one assigned partition in offset order.
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
}

func newPartitionWorker(c *Consumer, cl *kgo.Client, tp topicPartition) *partitionWorker {
	ctx, cancel := context.WithCancel(c.baseCtx)
	// A partition paused under a previous assignment would otherwise stay paused.
	cl.ResumeFetchPartitions(map[string][]int32{tp.topic: {tp.partition}})
	return &partitionWorker{
		c: c, cl: cl, tp: tp, buf: newBuffer(&c.cfg), wake: make(chan struct{}, 1), quit: make(chan struct{}),
		done: make(chan struct{}), ctx: ctx, cancel: cancel,
	}
}

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

func (w *partitionWorker) stop(commit bool) {
	if !commit {
		w.noCommit.Store(true)
	}
	w.quitOnce.Do(func() { close(w.quit) })
}

func (w *partitionWorker) quitting() bool {
	select {
	case <-w.quit:
		return true
	default:
		return false
	}
}

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
	commits := pacing.NewCommits(w.c.cfg.CommitEvery, time.Now())
	flush := func() {
		if last, n := commits.Flush(time.Now()); n > 0 {
			w.commit(last, n)
		}
	}
	defer flush()
	for {
		select {
		case <-w.quit:
			return
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
			if n > 0 {
				commits.Done(recs[n-1], n)
			}
			if n < len(recs) {
				return // abandoned while stopping
			}
			w.finish(recs)
			if commits.Due(time.Now()) || w.idle() {
				flush()
			}
		}
	}
}

// idle reports that no record is buffered for the worker.
func (w *partitionWorker) idle() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Len() == 0
}

// processChunk handles recs in order and returns how many, from the start, are done
// (committed to the inbox or dead-lettered), so that their offsets may be committed.
func (w *partitionWorker) processChunk(recs []*kgo.Record) int {
	if w.c.cfg.BatchSize <= 1 {
		for i, r := range recs {
			if i > 0 && w.quitting() {
				return i
			}
			d, bad, ok := w.prepare(r)
			switch {
			case !ok:
				return i
			case bad != nil:
				if !w.deadLetter(r, bad.reason, bad.err, 0) {
					return i
				}
			case !w.processOne(r, d):
				return i
			}
		}
		return len(recs)
	}
	for start := 0; start < len(recs); start += w.c.cfg.BatchSize {
		if start > 0 && w.quitting() {
			return start
		}
		end := min(start+w.c.cfg.BatchSize, len(recs))
		n := w.processBatch(recs[start:end])
		if n < end-start {
			return start + n
		}
	}
	return len(recs)
}

// badRecord is why a record goes to the dead-letter topic without reaching the inbox.
type badRecord struct {
	reason string
	err    error
}

// prepare decodes r. A non-nil bad means r must be dead-lettered (its caller does so in its
// turn, after the records before it); ok=false means the worker is stopping and r was
// abandoned.
func (w *partitionWorker) prepare(r *kgo.Record) (d Delivery, bad *badRecord, ok bool) {
	ev, err := envelope.Decode(toEnvelopeRecord(r))
	if err != nil {
		return d, &badRecord{ReasonDecode, err}, true
	}
	if dec := w.c.cfg.SchemaDecoder; dec != nil {
		for n := 0; ; n++ {
			err := dec(w.ctx, &ev)
			if err == nil {
				break
			}
			if IsPermanent(err) {
				return d, &badRecord{ReasonSchema, err}, true
			}
			w.c.log.WarnContext(w.logCtx(r), "schema decoding failed; retrying", "topic", r.Topic, "partition", r.Partition,
				"offset", r.Offset, "error", err)
			if !w.sleep(n) {
				return d, nil, false
			}
		}
	}
	d = Delivery{Event: ev, Kafka: &KafkaRef{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}}
	if _, err := w.c.store.DedupeKey(d); err != nil {
		return d, &badRecord{ReasonDedupe, err}, true
	}
	return d, nil, true
}

// processOne runs the inbox for one record until it is processed, a duplicate or
// dead-lettered. It returns false if the worker stopped first.
func (w *partitionWorker) processOne(r *kgo.Record, d Delivery) bool {
	return w.processOneAfter(r, d, &deferrals{})
}

// processOneAfter is processOne for a record whose earlier deferrals (in a batch) df counts.
func (w *partitionWorker) processOneAfter(r *kgo.Record, d Delivery, df *deferrals) bool {
	storageFailures := 0
	for {
		res, err := w.c.store.Process(w.ctx, w.c.pool, d, w.c.h)
		if err == nil && res.Outcome == Deferred {
			res, err = w.deferred(r, d, res, df)
		}
		if err != nil {
			if unstorable(err) {
				return w.deadLetter(r, ReasonUnstorable, err, 0)
			}
			w.c.storageErrors.Add(1)
			w.c.log.WarnContext(w.logCtx(r), "inbox storage error; retrying", "topic", r.Topic, "partition", r.Partition,
				"offset", r.Offset, "error", err)
			if !w.sleep(storageFailures) {
				return false
			}
			storageFailures++
			continue
		}
		storageFailures = 0
		if res.Outcome == Deferred {
			if !w.sleepFor(df.wait) {
				return false
			}
			continue
		}
		if ok, done := w.settle(r, &d, res); done {
			return ok
		}
		if !w.sleep(res.Attempts - 1) {
			return false
		}
	}
}

// deferrals counts one record's handler failures that used no attempt.
type deferrals struct {
	contention int // contention failures, bounded by MaxContentionRetries
	n          int // all deferrals in a row, for the backoff
	wait       time.Duration
}

// deferred acts on a Deferred result of d: contention within its bound and outages return it
// unchanged with df.wait set to the backoff before the retry; contention past its bound is
// recorded as an ordinary failed attempt, and the result of that is returned instead.
func (w *partitionWorker) deferred(r *kgo.Record, d Delivery, res Result, df *deferrals) (Result, error) {
	kind, after := deferral(res.Err)
	if kind == deferContention {
		df.contention++
		if df.contention > max(w.c.cfg.MaxContentionRetries, 0) {
			// Past its bound, contention counts as the message's failure, so a function that
			// always raises 40001 still ends in the dead-letter topic.
			return w.c.store.recordFailure(w.ctx, w.c.pool, &d, res.DedupeKey, res.Err)
		}
	}
	w.c.deferred.Add(1)
	df.wait = max(w.c.cfg.Retry.Delay(df.n+1), min(after, maxRetryAfter))
	df.n++
	what := "dependency outage"
	if kind == deferContention {
		what = "contention"
	}
	w.c.log.WarnContext(w.logCtx(r), "handler failed on "+what+"; retrying without using an attempt", "topic", r.Topic,
		"partition", r.Partition, "offset", r.Offset, "retry_in", df.wait, "error", res.Err)
	return res, nil
}

// maxRetryAfter caps the delay an outage asks for (an HTTP Retry-After).
const maxRetryAfter = 5 * time.Minute

// settle acts on the result of d (from r). done=false means a handler failure below the
// ceiling: retry.
func (w *partitionWorker) settle(r *kgo.Record, d *Delivery, res Result) (ok, done bool) {
	switch res.Outcome {
	case Processed:
		w.c.processed.Add(1)
		return true, true
	case Duplicate:
		w.c.duplicates.Add(1)
		return true, true
	case PreviouslyFailed:
		if res.DeadLettered {
			// A redelivery of a message already in the dead-letter topic: a duplicate.
			w.c.duplicates.Add(1)
			return true, true
		}
		// Poisoned by an earlier delivery whose dead-letter produce was not acknowledged.
		return w.deadLetterPoisoned(r, d, ReasonPoisoned, res), true
	case HandlerFailed:
		w.c.handlerFailures.Add(1)
		w.c.log.WarnContext(w.logCtx(r), "handler failed; retrying", "topic", r.Topic, "partition", r.Partition,
			"offset", r.Offset, "attempts", res.Attempts, "error", res.Err)
		return false, false
	case Poisoned:
		w.c.handlerFailures.Add(1)
		reason := ReasonPoisoned
		if IsPermanent(res.Err) {
			reason = ReasonPermanent
		}
		return w.deadLetterPoisoned(r, d, reason, res), true
	}
	return false, false // not reached: Deferred is handled before settle
}

// deadLetterPoisoned dead-letters the poisoned message d and marks its inbox row, so that a
// redelivery is a duplicate rather than a second dead letter. If the mark fails, a later
// redelivery dead-letters the message again (the dead-letter topic is at least once).
func (w *partitionWorker) deadLetterPoisoned(r *kgo.Record, d *Delivery, reason string, res Result) bool {
	if !w.deadLetter(r, reason, res.Err, res.Attempts) {
		return false
	}
	ctx, cancel := context.WithTimeout(w.c.baseCtx, w.c.cfg.ShutdownTimeout)
	defer cancel()
	if err := w.c.store.markDeadLettered(ctx, w.c.pool, d.Event.Source, res.DedupeKey); err != nil {
		w.c.log.WarnContext(ctx, "could not record the dead letter in the inbox; a redelivery will dead-letter the message again",
			"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "error", err)
	}
	return true
}

// processBatch runs recs through Store.ProcessBatch and settles each result in order. It
// returns how many records, from the start, are done. A record to dead-letter before the inbox
// (undecodable, ...) splits the batch: the records before it are processed first, so nothing
// is committed past a record that was not, and the dead-letter topic never gets a record
// ahead of the effects of earlier offsets.
func (w *partitionWorker) processBatch(recs []*kgo.Record) int {
	ds := make([]Delivery, 0, len(recs))
	idx := make([]int, 0, len(recs))
	for i, r := range recs {
		d, bad, ok := w.prepare(r)
		if !ok {
			if len(idx) > 0 {
				return idx[0] // prepared, not processed
			}
			return i
		}
		if bad == nil {
			ds = append(ds, d)
			idx = append(idx, i)
			continue
		}
		if n, all := w.runBatch(recs, ds, idx); !all {
			return n
		}
		ds, idx = ds[:0], idx[:0]
		if !w.deadLetter(r, bad.reason, bad.err, 0) {
			return i
		}
	}
	if n, all := w.runBatch(recs, ds, idx); !all {
		return n
	}
	return len(recs)
}

// runBatch processes the deliveries ds (of recs[idx[j]]) in inbox batches and settles each
// result in order. When a record fails, the records before it have committed; it is retried in
// place, under the rules of one record at a time, and the records after it wait, then form the
// next batch. all is false when the worker stopped first; n is then the index in recs of the
// first record not done.
func (w *partitionWorker) runBatch(recs []*kgo.Record, ds []Delivery, idx []int) (n int, all bool) {
next:
	for first := true; len(ds) > 0; first = false {
		if !first && w.quitting() {
			return idx[0], false
		}
		var results []Result
		for try := 0; ; try++ {
			var err error
			results, err = w.c.store.processBatch(w.ctx, w.c.pool, ds, w.c.h, w.c.cfg.BatchHandler, true)
			if err == nil {
				break
			}
			if unstorable(err) {
				// A record PostgreSQL cannot store fails the whole batch statement: one at a
				// time, the others are processed and that one is dead-lettered.
				for j := range ds {
					if !w.processOne(recs[idx[j]], ds[j]) {
						return idx[j], false
					}
				}
				return 0, true
			}
			w.c.storageErrors.Add(1)
			w.c.log.Warn("inbox storage error; retrying the batch", "topic", w.tp.topic, "partition", w.tp.partition, "error", err)
			if !w.sleep(try) {
				return idx[0], false
			}
		}
		for j, res := range results {
			r := recs[idx[j]]
			if res.Outcome == 0 {
				// Not attempted: an earlier record failed and was retried in place first.
				ds, idx = ds[j:], idx[j:]
				continue next
			}
			if res.Outcome == Deferred {
				// Contention or an outage: in place, under the rules of one record at a time.
				df := &deferrals{}
				rec, err := w.deferred(r, ds[j], res, df)
				if err != nil || rec.Outcome == Deferred {
					wait := df.wait
					if err != nil {
						w.c.storageErrors.Add(1)
						wait = w.c.cfg.Retry.Delay(1)
					}
					if !w.sleepFor(wait) || !w.processOneAfter(r, ds[j], df) {
						return idx[j], false
					}
					continue
				}
				res = rec // contention past its bound: an ordinary failed attempt
			}
			ok, done := w.settle(r, &ds[j], res)
			if !done {
				if !w.sleep(res.Attempts-1) || !w.processOne(r, ds[j]) {
					return idx[j], false
				}
				continue
			}
			if !ok {
				return idx[j], false
			}
		}
		return 0, true
	}
	return 0, true
}

// sleep waits the backoff delay after n earlier retries (n+1 is the retry's number); false means the worker is stopping. It is called while
// the worker holds a concurrency slot, which it gives up while waiting so that a partition in
// backoff does not starve the others.
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

const maxDLQErrorLen = 4 << 10

// deadLetter produces r to the dead-letter topic and waits for the acknowledgement, retrying
// failed produces; it never drops. false means the worker stopped first (r is not committed
// and will be redelivered).
func (w *partitionWorker) deadLetter(r *kgo.Record, reason string, cause error, attempts int) bool {
	errText := ""
	if cause != nil {
		errText = cause.Error()
		if len(errText) > maxDLQErrorLen {
			errText = errText[:maxDLQErrorLen]
		}
	}
	c := w.c
	topic := c.deadLetterTopic(r.Topic)
	for n := 0; ; n++ {
		headers := make([]kgo.RecordHeader, 0, len(r.Headers)+8)
		headers = append(headers, r.Headers...)
		headers = append(headers,
			kgo.RecordHeader{Key: HeaderDLQReason, Value: []byte(reason)},
			kgo.RecordHeader{Key: HeaderDLQError, Value: []byte(errText)},
			kgo.RecordHeader{Key: HeaderDLQAttempts, Value: []byte(strconv.Itoa(attempts))},
			kgo.RecordHeader{Key: HeaderDLQTopic, Value: []byte(r.Topic)},
			kgo.RecordHeader{Key: HeaderDLQPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
			kgo.RecordHeader{Key: HeaderDLQOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
			kgo.RecordHeader{Key: HeaderDLQConsumer, Value: []byte(c.cfg.Store.Consumer)},
			kgo.RecordHeader{Key: HeaderDLQAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
		)
		out := &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: headers}
		err := w.cl.ProduceSync(w.ctx, out).FirstErr()
		if err == nil {
			c.deadLettered.Add(1)
			c.in.deadlettered.Add(w.ctx, 1, c.in.messageAttrs(c.cfg.Store.Consumer, r.Topic))
			c.log.WarnContext(w.logCtx(r), "record dead-lettered", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
				"dead_letter_topic", topic, "reason", reason, "error", errText)
			if c.cfg.OnDeadLettered != nil {
				c.cfg.OnDeadLettered(r, reason)
			}
			return true
		}
		c.log.ErrorContext(w.logCtx(r), "dead-letter produce failed; retrying (the partition waits)", "dead_letter_topic", topic,
			"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "error", err)
		if !w.sleep(n) {
			return false
		}
	}
}

// commit commits the offset after last, unless the partition was lost.
func (w *partitionWorker) commit(last *kgo.Record, n int) {
	if w.noCommit.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(w.c.baseCtx, w.c.cfg.ShutdownTimeout)
	defer cancel()
	if err := w.cl.CommitRecords(ctx, last); err != nil {
		w.c.log.WarnContext(ctx, "offset commit failed; the records will be redelivered and classify as duplicates",
			"topic", last.Topic, "partition", last.Partition, "offset", last.Offset+1, "error", err)
		return
	}
	w.c.committed.Add(int64(n))
	if w.c.cfg.OnCommitted != nil {
		w.c.cfg.OnCommitted(Commit{Topic: last.Topic, Partition: last.Partition, Offset: last.Offset + 1, Records: n})
	}
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

func toEnvelopeRecord(r *kgo.Record) envelope.Record {
	hs := make([]envelope.Header, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = envelope.Header{Key: h.Key, Value: h.Value}
	}
	return envelope.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key,
		Value: r.Value, Headers: hs, Timestamp: r.Timestamp}
}

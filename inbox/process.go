package inbox

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
)

// A worker's records, one at a time or in inbox batches: decoded (prepare), run through the
// Store until each is processed, a duplicate or dead-lettered (processOne, runBatch), and
// settled into the consumer's counters, logs and dead letters (settle).

// processChunk handles recs in order and returns how many, from the start, are done
// (committed to the inbox or dead-lettered), so that their offsets may be committed.
func (w *partitionWorker) processChunk(recs []*kgo.Record) int {
	if w.c.cfg.BatchSize <= 1 {
		for i, r := range recs {
			if i > 0 && w.quitting() {
				return i
			}
			w.track.begin(r)
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
		w.track.begin(recs[start])
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

func toEnvelopeRecord(r *kgo.Record) envelope.Record {
	hs := make([]envelope.Header, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = envelope.Header{Key: h.Key, Value: h.Value}
	}
	return envelope.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key,
		Value: r.Value, Headers: hs, Timestamp: r.Timestamp}
}

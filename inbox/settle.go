package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// settleBatch settles the results of a batch transaction of ds (of recs, under the dedupe keys
// keys) in order: a record the batch left failed (HandlerFailed, Deferred) is retried alone, in
// place, before the records after it are settled. n counts the records settled; with ok=true
// and n below len(results), the transaction stopped at recs[n] (Outcome 0: not attempted),
// which starts the next one. ok=false means the worker stopped first.
func (w *partitionWorker) settleBatch(recs []*kgo.Record, ds []Delivery, keys []string, results []Result) (n int, ok bool) {
	for j, res := range results {
		switch res.Outcome {
		case 0:
			return j, true
		case HandlerFailed, Deferred:
			ok = w.untilSettled(recs[j], &ds[j], keys[j], res, nil)
		default:
			ok = w.settle(recs[j], &ds[j], res)
		}
		if !ok {
			return j, false
		}
	}
	return len(results), true
}

// untilSettled takes d (from r, under the dedupe key key), whose last run through the inbox
// gave res or the storage error err, until it is settled (processed, a duplicate or
// dead-lettered): a failure is retried alone through the transaction of Store.Process, after
// its backoff. false means the worker stopped first.
func (w *partitionWorker) untilSettled(r *kgo.Record, d *Delivery, key string, res Result, err error) bool {
	storageFailures := 0
	df := &deferrals{}
	for {
		if err == nil && res.Outcome == Deferred {
			res, err = w.deferred(r, *d, res, df)
		}
		var wait time.Duration
		switch {
		case err != nil && unstorable(err):
			return w.deadLetter(r, ReasonUnstorable, err, 0)
		case err != nil:
			w.c.storageErrors.Add(1)
			w.warnRecord(r, "inbox storage error; retrying", "error", err)
			wait = w.c.cfg.Retry.Delay(storageFailures + 1)
			storageFailures++
		case res.Outcome == Deferred:
			wait, storageFailures = df.wait, 0
		case res.Outcome == HandlerFailed:
			w.c.handlerFailures.Add(1)
			w.warnRecord(r, "handler failed; retrying", "attempts", res.Attempts, "error", res.Err)
			wait, storageFailures = w.c.cfg.Retry.Delay(max(res.Attempts-1, 0)+1), 0
		default:
			return w.settle(r, d, res)
		}
		if !w.sleepFor(wait) {
			return false
		}
		res, err = w.c.store.process(w.ctx, w.c.pool, *d, key, w.c.h, false)
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
	w.warnRecord(r, "handler failed on "+what+"; retrying without using an attempt", "retry_in", df.wait, "error", res.Err)
	return res, nil
}

// maxRetryAfter caps the delay an outage asks for (an HTTP Retry-After).
const maxRetryAfter = 5 * time.Minute

// settle acts on res, the final result of d (from r): it counts it and dead-letters a
// poisoned message. false means the worker stopped before the dead letter was acknowledged
// (r is not done and will be redelivered).
func (w *partitionWorker) settle(r *kgo.Record, d *Delivery, res Result) bool {
	switch res.Outcome {
	case Processed:
		w.c.processed.Add(1)
		return true
	case Duplicate:
		w.c.duplicates.Add(1)
		return true
	case PreviouslyFailed:
		if res.DeadLettered {
			// A redelivery of a message already in the dead-letter topic: a duplicate.
			w.c.duplicates.Add(1)
			return true
		}
		// Poisoned by an earlier delivery whose dead-letter produce was not acknowledged.
		return w.deadLetterPoisoned(r, d, ReasonPoisoned, res)
	case Poisoned:
		w.c.handlerFailures.Add(1)
		reason := ReasonPoisoned
		if IsPermanent(res.Err) {
			reason = ReasonPermanent
		}
		return w.deadLetterPoisoned(r, d, reason, res)
	}
	// HandlerFailed and Deferred are retried before they settle (untilSettled).
	panic(fmt.Sprintf("inbox: settle of a %v result", res.Outcome))
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

package inbox

import (
	"github.com/twmb/franz-go/pkg/kgo"
)

// apply runs ds, the deliveries of recs[:len(ds)], through the inbox until each is settled,
// and returns how many, from the start, are. With BatchSize above 1 they go in batch
// transactions: when a record fails one, the records before it have committed; it is retried
// alone, in place, and the records after it wait, then form the next batch. Otherwise each
// goes alone through Store.Process.
func (w *partitionWorker) apply(recs []*kgo.Record, ds []Delivery) int {
	if w.c.cfg.BatchSize <= 1 {
		return w.applyAlone(recs, ds)
	}
	done := 0
	for done < len(ds) {
		if done > 0 && w.quitting() {
			return done
		}
		results, ok := w.transact(ds[done:])
		if !ok {
			return done
		}
		if results == nil {
			// A record PostgreSQL cannot store fails the whole batch statement: one at a
			// time, the others are processed and that one is dead-lettered.
			return done + w.applyAlone(recs[done:], ds[done:])
		}
		n, ok := w.settleBatch(recs[done:], ds[done:], results)
		done += n
		if !ok {
			return done
		}
	}
	return done
}

// transact runs ds in one inbox batch transaction (Store.processBatch, stopping at the first
// failure) and returns one result per delivery, retrying storage errors with backoff. results
// is nil when PostgreSQL cannot store one of ds (unstorable); ok=false means the worker
// stopped first.
func (w *partitionWorker) transact(ds []Delivery) (results []Result, ok bool) {
	for try := 0; ; try++ {
		results, err := w.c.store.processBatch(w.ctx, w.c.pool, ds, w.c.h, w.c.cfg.BatchHandler, true)
		switch {
		case err == nil:
			return results, true
		case unstorable(err):
			return nil, true
		}
		w.c.storageErrors.Add(1)
		w.c.log.Warn("inbox storage error; retrying the batch", "topic", w.tp.topic, "partition", w.tp.partition, "error", err)
		if !w.sleep(try) {
			return nil, false
		}
	}
}

// applyAlone runs ds, the deliveries of recs[:len(ds)], one at a time through Store.Process,
// each until it is settled, and returns how many, from the start, are.
func (w *partitionWorker) applyAlone(recs []*kgo.Record, ds []Delivery) int {
	for i := range ds {
		res, err := w.c.store.Process(w.ctx, w.c.pool, ds[i], w.c.h)
		if !w.untilSettled(recs[i], &ds[i], res, err, &deferrals{}) {
			return i
		}
	}
	return len(ds)
}

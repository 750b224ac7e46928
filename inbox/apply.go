package inbox

import (
	"github.com/twmb/franz-go/pkg/kgo"
)

// apply runs p's deliveries (of recs[:len(p.ds)]) through the inbox until each is settled,
// and returns how many, from the start, are. With BatchSize above 1 they go in batch
// transactions: when a record fails one, the records before it have committed; it is retried
// alone, in place, and the records after it wait, then form the next batch. Otherwise each
// goes alone through Store.Process.
func (w *partitionWorker) apply(recs []*kgo.Record, p plan) int {
	ds, keys := p.ds, p.keys
	if w.c.cfg.BatchSize <= 1 {
		return w.applyAlone(recs, ds, keys)
	}
	done := 0
	for done < len(ds) {
		if done > 0 && w.quitting() {
			return done
		}
		results, ok := w.transact(ds[done:], keys[done:])
		if !ok {
			return done
		}
		if results == nil {
			// A record PostgreSQL cannot store fails the whole batch statement: one at a
			// time, the others are processed and that one is dead-lettered.
			return done + w.applyAlone(recs[done:], ds[done:], keys[done:])
		}
		n, ok := w.settleBatch(recs[done:], ds[done:], keys[done:], results)
		done += n
		if !ok {
			return done
		}
	}
	return done
}

// transact runs ds, under the dedupe keys keys, in one inbox batch transaction
// (Store.processBatch, stopping at the first failure) and returns one result per delivery,
// retrying storage errors with backoff. results is nil when PostgreSQL cannot store one of ds
// (unstorable); ok=false means the worker stopped first.
func (w *partitionWorker) transact(ds []Delivery, keys []string) (results []Result, ok bool) {
	for try := 0; ; try++ {
		res, err := w.c.store.processBatch(w.ctx, w.c.pool, ds, keys, w.c.h, w.c.cfg.BatchHandler, true)
		switch {
		case err == nil:
			return res, true
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

// applyAlone runs ds, the deliveries of recs[:len(ds)] under the dedupe keys keys, one at a
// time through the inbox transaction of Store.Process, each until it is settled, and returns
// how many, from the start, are.
func (w *partitionWorker) applyAlone(recs []*kgo.Record, ds []Delivery, keys []string) int {
	for i := range ds {
		res, err := w.c.store.process(w.ctx, w.c.pool, ds[i], keys[i], w.c.h, false)
		if !w.untilSettled(recs[i], &ds[i], keys[i], res, err) {
			return i
		}
	}
	return len(ds)
}

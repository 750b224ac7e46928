package inbox

import (
	"github.com/twmb/franz-go/pkg/kgo"
)

// A partition's records go through the inbox in one direction, batch by batch (BatchSize
// records; one at a time when BatchSize is 1):
//
//	take (worker.go)      the records at the head of the partition's buffer
//	decide (decide.go)    decode them into a plan: the deliveries for the inbox and their
//	                      dedupe keys, up to the first record to dead-letter as it is
//	                      (undecodable, ...)
//	apply (apply.go)      the plan's deliveries in one inbox transaction; a record that fails
//	                      it is retried alone, in place, and the records after it form the
//	                      next transaction
//	settle (settle.go)    each outcome counted; a poisoned message dead-lettered; then the
//	                      plan's record to dead-letter (deadletter_produce.go), and the next
//	                      plan
//	commit (worker.go)    the offsets of the records done
//
// Each step hands the next a value (a plan, the transaction's results) and returns how many
// records, from the start, are done, so that nothing is committed past a record that is not.

// processChunk handles recs in order, a batch at a time, and returns how many, from the start,
// are done (committed to the inbox or dead-lettered), so that their offsets may be committed.
func (w *partitionWorker) processChunk(recs []*kgo.Record) int {
	size := w.c.cfg.BatchSize
	for start := 0; start < len(recs); {
		if recs[start].Attrs.IsControl() {
			// A transaction's commit or abort marker: nothing to handle, and done at once;
			// the offset commit steps over it.
			start++
			continue
		}
		if start > 0 && w.quitting() {
			return start
		}
		end := start
		for end < len(recs) && end-start < size && !recs[end].Attrs.IsControl() {
			end++
		}
		w.track.begin(recs[start])
		if n := w.pipeline(recs[start:end]); n < end-start {
			return start + n
		}
		start = end
	}
	return len(recs)
}

// pipeline takes recs, one batch, plan by plan through decide, apply and settle, and
// returns how many, from the start, are done. A record to dead-letter before the inbox ends a
// plan: the records before it are in the inbox first, so the dead-letter topic never gets a
// record ahead of the effects of earlier offsets.
func (w *partitionWorker) pipeline(recs []*kgo.Record) int {
	done := 0
	p := plan{ds: make([]Delivery, 0, len(recs)), keys: make([]string, 0, len(recs))}
	for done < len(recs) {
		var ok bool
		if p, ok = w.decide(recs[done:], p); !ok {
			return done // decoded, not applied
		}
		n := w.apply(recs[done:], p)
		done += n
		if n < len(p.ds) {
			return done
		}
		if p.bad != nil {
			if !w.deadLetter(recs[done], p.bad.reason, p.bad.err, 0) {
				return done
			}
			done++
		}
	}
	return done
}

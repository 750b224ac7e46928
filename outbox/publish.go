package outbox

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/kafkaerr"
	"github.com/keiro-go/keiro/tracing"
)

// topicPartition names a topic partition.
type topicPartition struct {
	topic     string
	partition int32
}

// produce publishes the batches' rows in order, in as few flushes as it can: a suspect row
// and the first row for a topic the client has not published to yet (see engine.topics) each
// get a flush of their own, after the rows before them were flushed; under StopTheLine every
// row does, so nothing after the first failure is sent. A row whose group failed
// in an earlier flush of this call is not produced (it is skipped or released when marked).
//
// One flush never holds rows of one group for two destinations: Kafka orders a flush's
// records only within a partition, and a key's rows on two topics go to two partitions, led
// by brokers that answer independently. Had they shared a flush, a failure of the first
// topic's request with a success of the second's would put the key's later row on Kafka
// first. The later row waits for the next flush instead, which it joins only if the earlier
// one got through.
//
// cl is the client the records go through: the publisher's, or under ExactlyOnce the
// transactional producer's, with a transaction open.
func (r *engine) produceBatches(stop, ctx context.Context, cl *kgo.Client, batches []*claimedBatch) {
	failed := map[string]bool{}
	// A transactional client (ExactlyOnce) cannot commit once a record failed: the rest is not
	// produced (released when marked, no attempt used) rather than failed with it.
	transactional := cl != r.pub.Client()
	txnFailed := false
	send := func(refs []rowRef) {
		if stop.Err() != nil || txnFailed {
			return // stopping: no new flush; the rows are released unproduced
		}
		kept := refs[:0]
		for _, ref := range refs {
			if g := groupKey(r.cfg.Policy, &ref.b.rows[ref.i].Event); g == "" || !failed[g] {
				kept = append(kept, ref)
			}
		}
		kept = r.holdLeases(ctx, kept, failed)
		if len(kept) == 0 {
			return
		}
		r.flushRecords(ctx, cl, kept)
		for _, ref := range kept {
			row := &ref.b.rows[ref.i]
			ref.b.mu.Lock()
			res := ref.b.results[ref.i]
			ref.b.mu.Unlock()
			switch {
			case !res.done || res.rejectMsg != "":
			case res.err == nil:
				r.topics.Store(row.Event.Destination, struct{}{})
			default:
				txnFailed = transactional
				if class, _ := res.failureClass(); class != kafkaerr.Permanent {
					if g := groupKey(r.cfg.Policy, &row.Event); g != "" {
						failed[g] = true
					}
				}
			}
		}
	}
	var pending []rowRef
	dest := map[string]string{} // group → the destination of its rows in pending
	sendPending := func() {
		send(pending)
		pending = pending[:0]
		clear(dest)
	}
	for _, b := range batches {
		for i := range b.rows {
			ref := rowRef{b, i}
			row := &b.rows[i]
			if row.Dead && r.cfg.Policy == StopTheLine {
				sendPending() // the rows before it; nothing after it (markOutcome halts on it)
				failed[groupKey(StopTheLine, &row.Event)] = true
				continue
			}
			suspect := r.suspects.Has(row.ID)
			_, known := r.topics.Load(row.Event.Destination)
			// StopTheLine publishes row by row (keiro §1.3.5): one flush holds records for
			// several partitions, and a failure of one partition's request does not stop the
			// others, so rows after the failed one would reach Kafka.
			alone := suspect || !known || r.cfg.Policy == StopTheLine
			if alone && !row.Dead {
				sendPending()
				send([]rowRef{ref})
				continue
			}
			if g := groupKey(r.cfg.Policy, &row.Event); g != "" && !row.Dead {
				if d, ok := dest[g]; ok && d != row.Event.Destination {
					sendPending()
				}
				dest[g] = row.Event.Destination
			}
			pending = append(pending, ref)
		}
	}
	sendPending()
	for _, b := range batches {
		b.mu.Lock()
		b.closed = true
		b.mu.Unlock()
	}
}

// holdLeases returns the rows of refs that may be flushed now: their batch still holds its
// lease with the margin (leaseHeld). The rows of a batch that does not are left unproduced
// (released when marked: the mark is fenced, so it changes nothing if another relay took
// them over) and their groups fail, so no later row of theirs goes out in this call. Rows on
// their last attempt get their produce start recorded first (claimsql.Store.StartProduce), so that a
// lease expiry turns them dead only if they may have reached Kafka; a row the record does
// not find under the batch's token was taken over and is not produced either.
func (r *engine) holdLeases(ctx context.Context, refs []rowRef, failed map[string]bool) []rowRef {
	if r.flushHook != nil {
		r.flushHook()
	}
	lose := func(ref rowRef, why string) {
		b := ref.b
		b.results[ref.i] = produceResult{leaseLost: true}
		if g := groupKey(r.cfg.Policy, &b.rows[ref.i].Event); g != "" {
			failed[g] = true
		}
		r.stats.leaseLost.Add(1)
		if !b.expired {
			b.expired = true
			r.log.WarnContext(ctx, "a batch's lease was lost or about to expire before its produce; its rows are not published by this relay",
				"why", why, "lease", r.cfg.Lease, "confirmed_ago", r.now().Sub(b.leasedAt), "rows", len(b.rows))
		}
	}
	now := r.now()
	kept := refs[:0]
	var last map[*claimedBatch][][16]byte
	for _, ref := range refs {
		b := ref.b
		b.mu.Lock()
		held := r.leaseHeld(b, now)
		if !held {
			lose(ref, "lease")
		}
		b.mu.Unlock()
		if !held {
			continue
		}
		if row := &b.rows[ref.i]; row.Attempt >= r.cfg.MaxAttempts && !row.Started && !row.Dead {
			if last == nil {
				last = map[*claimedBatch][][16]byte{}
			}
			last[b] = append(last[b], row.ID)
		}
		kept = append(kept, ref)
	}
	if len(last) == 0 {
		return kept
	}
	moved := map[[16]byte]bool{}
	for b, ids := range last {
		actx, cancel := context.WithTimeout(ctx, r.cfg.Lease/leaseMargin)
		m, err := r.claims.StartProduce(actx, r.pool, b.token, ids)
		cancel()
		if err != nil {
			r.log.WarnContext(ctx, "could not record the produce start of rows on their last attempt; they are released", "err", err, "rows", len(ids))
			continue
		}
		for id := range m {
			moved[id] = true
		}
	}
	out := kept[:0]
	for _, ref := range kept {
		b, row := ref.b, &ref.b.rows[ref.i]
		if row.Attempt >= r.cfg.MaxAttempts && !row.Started && !row.Dead {
			if !moved[row.ID] {
				b.mu.Lock()
				lose(ref, "last attempt not recorded")
				b.mu.Unlock()
				continue
			}
			row.Started = true
		}
		out = append(out, ref)
	}
	return out
}

// rowRef points at one row of a batch.
type rowRef struct {
	b *claimedBatch
	i int
}

// flushRecords buffers every record of refs in cl, flushes them, and waits for every outcome
// (or ctx). Buffering the whole set before the flush is what keeps per-key order: if Kafka
// fails a partition's request, franz-go fails every later buffered record of that partition.
func (r *engine) flushRecords(ctx context.Context, cl *kgo.Client, refs []rowRef) {
	var pending atomic.Int64
	pending.Store(1)
	allDone := make(chan struct{})
	finish := func() {
		if pending.Add(-1) == 0 {
			close(allDone)
		}
	}
	var headers []envelope.Header
	var mu sync.Mutex
	perPartition := map[topicPartition]int{}
	var produced []rowRef
	for _, ref := range refs {
		b, i := ref.b, ref.i
		row := &b.rows[i]
		if row.Dead {
			continue
		}
		e := &row.Event
		if code, err := kafkaerr.CheckTopic(e.Destination); err != nil {
			b.results[i] = produceResult{done: true, rejectCode: code, rejectMsg: err.Error()}
			continue
		}
		rec := &kgo.Record{}
		if e.Key != nil {
			rec.Key = []byte(*e.Key)
		}
		send, tc := r.pub.StartSend(e, tracing.OutboxAttemptKey.Int(row.Attempt))
		ev := *e
		if tc != nil {
			ev.TraceContext = tc
		}
		headers = r.pub.Record(rec, &ev, headers)
		if _, err := r.pub.CheckSize(rec); err != nil {
			b.results[i] = produceResult{done: true, rejectCode: kafkaerr.CodeMessageTooLarge, rejectMsg: err.Error()}
			send.Rejected(kafkaerr.CodeMessageTooLarge)
			continue
		}
		pending.Add(1)
		produced = append(produced, ref)
		created := row.CreatedAt
		cl.Produce(ctx, rec, func(rec *kgo.Record, err error) {
			send.Done(rec, err, created)
			if err == nil && r.ackHook != nil {
				r.ackHook(e.MessageID)
			}
			mu.Lock()
			perPartition[topicPartition{rec.Topic, rec.Partition}]++
			mu.Unlock()
			b.mu.Lock()
			if !b.closed {
				b.results[i] = produceResult{done: true, err: err, partition: rec.Partition, offset: rec.Offset}
			}
			b.mu.Unlock()
			finish()
		})
	}
	finish()
	if len(produced) == 0 {
		return
	}
	if err := cl.Flush(ctx); err != nil && ctx.Err() == nil {
		r.log.WarnContext(ctx, "flush failed", "err", err)
	}
	select {
	case <-allDone:
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	for _, ref := range produced {
		ref.b.mu.Lock()
		res := &ref.b.results[ref.i]
		if res.done && res.err != nil && perPartition[topicPartition{ref.b.rows[ref.i].Event.Destination, res.partition}] > 1 {
			res.shared = true
		}
		ref.b.mu.Unlock()
	}
}

// groupKey returns the ordering group of a row under the policy ("" = a group of its own).
func groupKey(p Policy, e *envelope.Event) string {
	switch p {
	case StopTheLine:
		return "all"
	case PerSourceStream:
		return e.Source
	case BestEffort:
		return ""
	}
	if e.Key == nil {
		return ""
	}
	return e.Source + "\x00" + *e.Key
}

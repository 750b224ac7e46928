package outbox

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/backoff"
	"github.com/keiro-go/keiro/outbox/internal/exactlyonce"
)

// Exactly-once publication in claim mode (RelayConfig.ExactlyOnce).
//
// One goroutine, the pipeline's producer, owns the run's transactional producer: it produces
// the batches claimed into one Kafka transaction at a time, and commits it when no batch is
// waiting to be produced, when TransactionLinger passed since it began, or when it holds
// MaxRecords records; franz-go requires the flush and the end of a transaction to run with no
// produce beside them, which one owner guarantees. Each commit also writes a claims record to
// the offsets topic (exactlyonce.Claims): the claim tokens, and the rows (seqs) produced, of
// every batch whose records this transaction or an earlier one committed and whose mark has not
// landed yet. Only after the commit are the transaction's batches marked sent; a batch's token
// leaves the next claims record once its mark landed.
//
// A claim lost with its relay (a crash, or a freeze past its lease) leaves rows publishing
// under an expired lease with claim_txn set. An exactly-once relay does not re-claim them (the
// claim statement skips them): its recovery (recoverLost) fences their transactional id, which
// aborts the transaction it had open (a commit under way completes first) and makes the zombie
// unable to commit, reads the id's last committed claims record, and marks the rows it lists
// sent and releases the others, for a claim to publish them again.
//
// A transaction that cannot commit (a record failed, the commit failed, the producer was
// fenced) is aborted: its rows acknowledged in it are released (their records are invisible to
// read_committed readers), and a failed row takes its outcome as in at-least-once mode. A
// commit whose outcome is unknown is resolved by reading the claims record back after a new
// producer of the same id fenced the old one.

// claimEOS is one run's exactly-once state.
type claimEOS struct {
	cfg  exactlyonce.Config // defaulted, TransactionalID set
	opts []kgo.Opt          // the relay client's options, for the producer and the fences
	// prod is the transactional producer, touched by the pipeline's producer goroutine only;
	// nil once lost (fenced, or in an unknown state) until it is built again.
	prod *exactlyonce.Producer

	mu sync.Mutex
	// committed are the claims whose records committed and whose mark has not landed: token →
	// the seqs of the rows produced. Every claims record lists them.
	committed map[envelope.UUID][]int64
	// prev are the claims that the previous run of the same transactional id (a stable
	// InstanceID) left committed, read once this run's producer fenced it; prevKnown once read.
	prev      map[envelope.UUID][]int64
	prevKnown bool
	// unresolved are the claims of a transaction whose outcome could not be learnt: this
	// relay leaves their rows to the recovery of another relay.
	unresolved map[envelope.UUID]bool
}

// eosStats are the exactly-once counters of an engine, across its runs.
type eosStats struct {
	counters exactlyonce.Counters
	// recoveries counts the lost claims' transactional ids fenced and settled; recoveredSent
	// and recoveredReleased their rows marked sent and released.
	recoveries, recoveredSent, recoveredReleased atomic.Int64
	// txnID is the transactional id of the current (or last) run.
	txnID atomic.Pointer[string]
}

// ExactlyOnceStatus is the exactly-once state of a relay's claim loop (RelayConfig.ExactlyOnce),
// for status pages and metrics.
type ExactlyOnceStatus struct {
	// TransactionalID is the Kafka transactional id of the relay's current run (of its last
	// one once it stopped; "" before its first).
	TransactionalID string
	// Committed and Aborted count the Kafka transactions committed and aborted, Fenced the
	// times the relay found its producer fenced by a relay that took over its claims.
	Committed, Aborted, Fenced int64
	// Recoveries counts the transactional ids of lost claims (another relay's, or its own) the
	// relay settled; RecoveredSent and RecoveredReleased the rows it marked sent (their records
	// had committed) and released (they had not) there.
	Recoveries, RecoveredSent, RecoveredReleased int64
}

// ExactlyOnce returns the exactly-once state of the relay's claim loop, and false when the
// relay is not ExactlyOnce.
func (r *Relay) ExactlyOnce() (ExactlyOnceStatus, bool) {
	if !r.cfg.ExactlyOnce {
		return ExactlyOnceStatus{}, false
	}
	s := &r.eosStats
	st := ExactlyOnceStatus{Committed: s.counters.Committed(), Aborted: s.counters.Aborted(), Fenced: s.counters.Fenced(),
		Recoveries: s.recoveries.Load(), RecoveredSent: s.recoveredSent.Load(), RecoveredReleased: s.recoveredReleased.Load()}
	if id := s.txnID.Load(); id != nil {
		st.TransactionalID = *id
	}
	return st, true
}

// newClaimEOS returns the exactly-once state of a run: its transactional id names InstanceID,
// or a random instance.
func (r *engine) newClaimEOS() *claimEOS {
	cfg := r.cfg.exactlyOnce().WithDefaults()
	instance := r.cfg.InstanceID
	if instance == "" {
		instance = envelope.NewUUIDv7().String()
	}
	cfg.TransactionalID = exactlyonce.ClaimTransactionalID(r.cfg.Schema, instance)
	r.eosStats.txnID.Store(&cfg.TransactionalID)
	return &claimEOS{cfg: cfg, opts: slices.Clone(r.pub.Client().Opts()), committed: map[envelope.UUID][]int64{},
		unresolved: map[envelope.UUID]bool{}}
}

// eosRetryBackoff spaces the attempts to build the transactional producer, and to read its
// claims record back, while Kafka refuses.
var eosRetryBackoff = claimRetryBackoff

// produceAllEOS is produceAll under ExactlyOnce: it produces the claimed batches into the
// open transaction and ends it (endTransaction) when no batch is waiting, the linger passed,
// MaxRecords are in it, or a record failed. After a stop it ends the open transaction and
// passes the batches still coming on unproduced (released when marked).
func (p *pipeline) produceAllEOS(ctx context.Context) {
	r, x := p.r, p.eos
	defer close(p.produced)
	defer func() {
		if x.prod != nil {
			x.prod.Close(p.hardCtx)
		}
	}()
	p.producerReady(ctx) // fence the previous run of a stable id at once, and read what it left
	var txn []*claimedBatch
	var records int
	var opened time.Time
	for open := true; open || len(txn) > 0; {
		var group []*claimedBatch
		if len(txn) == 0 {
			b, ok := <-p.claimed
			if !ok {
				return
			}
			group = append(group, b)
		}
		group, open = takeWaiting(p.claimed, group)
		if len(group) == 0 {
			p.endTransaction(txn)
			txn, records = nil, 0
			continue
		}
		if p.stopCtx.Err() != nil || !p.producerReady(ctx) {
			for _, b := range group {
				p.produced <- b // unproduced: released when marked
			}
			continue
		}
		if len(txn) == 0 {
			if err := x.prod.Begin(); err != nil {
				p.lostProducer(err)
				for _, b := range group {
					p.produced <- b
				}
				continue
			}
			opened = time.Now()
		}
		t0 := time.Now()
		r.produceBatches(p.stopCtx, p.hardCtx, x.prod.Client(), group)
		r.log.DebugContext(ctx, "produced in a transaction", "batches", len(group), "took", time.Since(t0))
		txn = append(txn, group...)
		n, failed := producedIn(group)
		records += n
		if failed || records >= x.cfg.MaxRecords || time.Since(opened) >= x.cfg.Linger || !open {
			p.endTransaction(txn)
			txn, records = nil, 0
		}
	}
}

// takeWaiting appends to group the batches waiting in claimed, without blocking; open is false
// once claimed is closed.
func takeWaiting(claimed <-chan *claimedBatch, group []*claimedBatch) (_ []*claimedBatch, open bool) {
	for {
		select {
		case b, ok := <-claimed:
			if !ok {
				return group, false
			}
			group = append(group, b)
		default:
			return group, true
		}
	}
}

// producedIn counts the records the batches produced, and reports whether one failed (the
// transaction then cannot commit).
func producedIn(batches []*claimedBatch) (n int, failed bool) {
	for _, b := range batches {
		b.mu.Lock()
		for i := range b.results {
			res := &b.results[i]
			if res.done && res.rejectMsg == "" {
				n++
				failed = failed || res.err != nil
			}
		}
		b.mu.Unlock()
	}
	return n, failed
}

// producerReady builds the transactional producer if it has none; on failure it waits a
// backoff (or the stop) and reports false. The first producer of a run fences the previous
// run of its transactional id (a stable InstanceID) and reads the claims that run committed.
func (p *pipeline) producerReady(ctx context.Context) bool {
	r, x := p.r, p.eos
	for attempt := 1; x.prod == nil; attempt++ {
		if p.stopCtx.Err() != nil {
			return false
		}
		prod, err := exactlyonce.NewProducer(p.stopCtx, x.opts, x.cfg, &r.eosStats.counters)
		if err == nil {
			x.prod = prod
			break
		}
		d := eosRetryBackoff.Delay(attempt)
		r.log.WarnContext(ctx, "exactly once: could not start the transactional producer; retrying", "err", err,
			"transactional_id", x.cfg.TransactionalID, "retry_in", d)
		if backoff.Sleep(p.stopCtx, d) != nil {
			return false
		}
	}
	x.mu.Lock()
	known := x.prevKnown
	x.mu.Unlock()
	if !known {
		c, err := exactlyonce.ReadClaims(p.stopCtx, x.opts, x.cfg.OffsetsTopic, x.cfg.TransactionalID)
		if err == nil || errors.Is(err, exactlyonce.ErrNoRecord) {
			x.mu.Lock()
			x.prev, x.prevKnown = claimedRows(c), true
			x.mu.Unlock()
		} else {
			r.log.WarnContext(ctx, "exactly once: could not read the claims the previous run of this transactional id left; its lost rows are left to another relay",
				"err", err, "transactional_id", x.cfg.TransactionalID)
		}
	}
	return true
}

// lostProducer drops the producer after err: it was fenced (another relay took over this
// relay's claims, so this one is a zombie and must not commit), or is in a state only a new
// producer of the id clears (which fences this one's epoch, aborting what it had open).
func (p *pipeline) lostProducer(err error) {
	r, x := p.r, p.eos
	if exactlyonce.IsFenced(err) {
		r.log.WarnContext(p.stopCtx, "exactly once: fenced, another relay took over this relay's claims; its transaction is dropped and the producer rebuilt",
			"transactional_id", x.cfg.TransactionalID, "err", err)
	} else {
		r.log.WarnContext(p.stopCtx, "exactly once: the transactional producer failed; its transaction is dropped and the producer rebuilt",
			"transactional_id", x.cfg.TransactionalID, "err", err)
	}
	if x.prod != nil {
		x.prod.Close(p.hardCtx)
		x.prod = nil
	}
}

// endTransaction commits txn's batches' records with their claims record, or aborts them when
// a record failed, then passes the batches on to be marked: as produced when the transaction
// committed; with their records unpublished (released) when it did not.
func (p *pipeline) endTransaction(txn []*claimedBatch) {
	r, x := p.r, p.eos
	if len(txn) == 0 {
		return
	}
	if r.beforeCommit != nil {
		r.beforeCommit()
	}
	committed, known := false, true
	if _, failed := producedIn(txn); failed {
		if err := x.prod.Abort(p.hardCtx); err != nil {
			p.lostProducer(err)
		}
	} else {
		err := x.prod.Commit(p.hardCtx, x.claimsRecord(txn))
		switch {
		case err == nil:
			committed = true
		case errors.Is(err, exactlyonce.ErrUnknownOutcome):
			committed, known = p.resolve(txn)
		default:
			p.lostProducer(err)
		}
	}
	if committed && r.afterCommit != nil {
		r.afterCommit()
	}
	x.mu.Lock()
	for _, b := range txn {
		switch {
		case !known:
			x.unresolved[b.token] = true
			b.noMark = true
		case committed:
			x.committed[b.token] = sentSeqs(b)
		}
	}
	x.mu.Unlock()
	for _, b := range txn {
		if known && !committed {
			unpublish(b)
		}
		p.produced <- b
	}
}

// resolve learns whether txn, whose commit's outcome is unknown, committed: a new producer of
// the id fences the old one's epoch (nothing of it can commit after), then the id's last
// committed claims record tells. known is false when that could not be read before the
// shutdown deadline.
func (p *pipeline) resolve(txn []*claimedBatch) (committed, known bool) {
	r, x := p.r, p.eos
	if x.prod != nil {
		x.prod.Close(p.hardCtx)
		x.prod = nil
	}
	for attempt := 1; ; attempt++ {
		var err error
		if x.prod == nil {
			x.prod, err = exactlyonce.NewProducer(p.hardCtx, x.opts, x.cfg, &r.eosStats.counters)
		}
		if err == nil {
			var c exactlyonce.Claims
			c, err = exactlyonce.ReadClaims(p.hardCtx, x.opts, x.cfg.OffsetsTopic, x.cfg.TransactionalID)
			if err == nil || errors.Is(err, exactlyonce.ErrNoRecord) {
				committed = slices.Contains(c.Tokens, txn[0].token.String())
				r.log.WarnContext(p.stopCtx, "exactly once: a commit's outcome was unknown; read back from the claims record",
					"transactional_id", x.cfg.TransactionalID, "committed", committed)
				return committed, true
			}
		}
		d := eosRetryBackoff.Delay(attempt)
		r.log.WarnContext(p.stopCtx, "exactly once: could not learn a commit's outcome; retrying", "err", err, "retry_in", d)
		if backoff.Sleep(p.hardCtx, d) != nil {
			r.log.ErrorContext(p.stopCtx, "exactly once: a commit's outcome is unknown at shutdown; its rows are left to the recovery of another relay",
				"transactional_id", x.cfg.TransactionalID)
			return false, false
		}
	}
}

// claimsRecord is the claims record of a commit of txn: its batches and the batches committed
// before whose mark has not landed.
func (x *claimEOS) claimsRecord(txn []*claimedBatch) *kgo.Record {
	c := exactlyonce.Claims{Rows: map[string][]int64{}, At: time.Now()}
	add := func(tok envelope.UUID, seqs []int64) {
		s := tok.String()
		if _, ok := c.Rows[s]; !ok {
			c.Tokens = append(c.Tokens, s)
		}
		c.Rows[s] = seqs
	}
	x.mu.Lock()
	for tok, seqs := range x.committed {
		add(tok, seqs)
	}
	x.mu.Unlock()
	for _, b := range txn {
		add(b.token, sentSeqs(b))
	}
	return exactlyonce.ClaimsRecord(x.cfg.OffsetsTopic, x.cfg.TransactionalID, c)
}

// claimedRows are the rows a claims record lists, by claim token (a token that does not parse
// is not one of ours, and is left out).
func claimedRows(c exactlyonce.Claims) map[envelope.UUID][]int64 {
	out := make(map[envelope.UUID][]int64, len(c.Tokens))
	for _, s := range c.Tokens {
		tok, err := envelope.ParseUUID(s)
		if err != nil {
			continue
		}
		out[tok] = c.Rows[s]
	}
	return out
}

// sentSeqs are the seqs of b's rows acknowledged in their transaction.
func sentSeqs(b *claimedBatch) []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	seqs := []int64{}
	for i := range b.results {
		if res := &b.results[i]; res.done && res.err == nil && res.rejectMsg == "" {
			seqs = append(seqs, b.rows[i].Seq)
		}
	}
	return seqs
}

// unpublish turns b's results into those of a transaction that did not commit: a row
// acknowledged in it, or failed only because the transaction did (its producer fenced, the
// transaction aborted), was not published and is released; a row that failed on its own keeps
// its failure (an attempt used, or a rejection).
func unpublish(b *claimedBatch) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.results {
		res := &b.results[i]
		if res.done && res.rejectMsg == "" && (res.err == nil || transactionFailure(res.err)) {
			b.results[i] = produceResult{}
		}
	}
}

// transactionFailure reports an error of a record that says nothing of the record itself,
// only of its transaction.
func transactionFailure(err error) bool {
	return exactlyonce.IsFenced(err) || errors.Is(err, kerr.TransactionAbortable) ||
		errors.Is(err, kerr.InvalidTxnState) || errors.Is(err, kerr.OperationNotAttempted) ||
		errors.Is(err, kgo.ErrAborting)
}

// markedEOS forgets b's claim once its mark landed: the next claims record no longer lists it.
func (x *claimEOS) markedEOS(b *claimedBatch) {
	b.mu.Lock()
	landed := b.markLanded
	b.mu.Unlock()
	if landed {
		x.mu.Lock()
		delete(x.committed, b.token)
		x.mu.Unlock()
	}
}

// recoverEvery is how often an exactly-once relay looks for lost claims: half a lease, as their
// rows wait at least a lease anyway.
func recoverEvery(lease time.Duration) time.Duration { return lease / 2 }

// recoverLost settles, every recoverEvery, the rows of exactly-once claims lost with their
// relay (recoverOnce).
func (r *engine) recoverLost(ctx context.Context, x *claimEOS) {
	t := time.NewTicker(recoverEvery(r.cfg.Lease))
	defer t.Stop()
	for {
		r.recoverOnce(ctx, x)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// recoverOnce settles the rows publishing under an expired lease with claim_txn set. For
// another relay's transactional id: fence it (its open transaction is aborted, and it commits
// nothing more), read its last committed claims record, and mark the rows it lists sent and
// release the others (claimsql.Store.RecoverTxn). For this relay's own id (a mark that never
// landed, a previous run of a stable id): the same from what the relay knows, without a fence,
// leaving alone the claims it still has in flight.
func (r *engine) recoverOnce(ctx context.Context, x *claimEOS) {
	txns, err := r.claims.RecoverableTxns(ctx, r.pool)
	if err != nil {
		if ctx.Err() == nil {
			r.log.WarnContext(ctx, "exactly once: could not look for lost claims; retrying", "err", err)
		}
		return
	}
	for _, txn := range txns {
		var committed map[envelope.UUID][]int64
		var skip []envelope.UUID
		if txn == x.cfg.TransactionalID {
			var ok bool
			if committed, skip, ok = x.ownClaims(r); !ok {
				continue
			}
		} else {
			fctx, cancel := context.WithTimeout(ctx, x.cfg.TransactionTimeout+30*time.Second)
			err := exactlyonce.Fence(fctx, x.opts, txn)
			var c exactlyonce.Claims
			if err == nil {
				c, err = exactlyonce.ReadClaims(fctx, x.opts, x.cfg.OffsetsTopic, txn)
				if errors.Is(err, exactlyonce.ErrNoRecord) {
					err = nil
				}
			}
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					r.log.WarnContext(ctx, "exactly once: could not fence a lost claim's relay or read its claims; retrying", "transactional_id", txn, "err", err)
				}
				continue
			}
			committed = claimedRows(c)
		}
		if r.recoverHook != nil {
			r.recoverHook(txn)
		}
		rec, err := r.claims.RecoverTxn(ctx, r.pool, txn, committed, skip)
		if err != nil {
			if ctx.Err() == nil {
				r.log.WarnContext(ctx, "exactly once: could not settle a lost claim's rows; retrying", "transactional_id", txn, "err", err)
			}
			continue
		}
		s := &r.eosStats
		s.recoveries.Add(1)
		s.recoveredSent.Add(rec.Sent)
		s.recoveredReleased.Add(rec.Released)
		r.stats.released.Add(rec.Released)
		if rec.Sent+rec.Released > 0 {
			r.log.WarnContext(ctx, "exactly once: settled the rows of a lost claim: those its transactions committed are sent, the others released",
				"transactional_id", txn, "sent", rec.Sent, "released", rec.Released)
			r.signal()
		}
	}
}

// ownClaims is what the relay knows of its own transactional id's claims: the committed ones
// (unmarked, and the previous run's) and the ones to leave alone (in flight, or of a
// transaction whose outcome is unknown). ok is false while the previous run's are not known.
func (x *claimEOS) ownClaims(r *engine) (committed map[envelope.UUID][]int64, skip []envelope.UUID, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.prevKnown {
		return nil, nil, false
	}
	committed = make(map[envelope.UUID][]int64, len(x.committed)+len(x.prev))
	for tok, seqs := range x.prev {
		committed[tok] = seqs
	}
	for tok, seqs := range x.committed {
		committed[tok] = seqs
	}
	for tok := range x.unresolved {
		skip = append(skip, tok)
	}
	r.flying.Range(func(k, _ any) bool {
		skip = append(skip, k.(*claimedBatch).token)
		return true
	})
	return committed, skip, true
}
